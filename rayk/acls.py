"""ACLs in Kafka's model, and the decision an authorizer takes (Kafka's StandardAuthorizer).

An ACL binding says that a principal (`User:alice`, or `User:*` for everyone) from a host
(an IP address, or `*`) is allowed or denied an operation on resources: of one type
(topic, group, cluster, transactional id), named literally (`orders`, or `*` for every
one) or by prefix (`orders-`). The codes are Kafka's, as the wire carries them.

`Authorizer.authorize` decides one (principal, host, operation, resource) as Kafka does:
- a super user (`super.users`) may do anything;
- a matching DENY wins over any ALLOW;
- an ALLOW of the operation, or of ALL, or of one that implies it, allows: READ, WRITE,
  DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS;
- with no ACL on the resource at all, `allow.everyone.if.no.acl.found` decides (default
  false);
- otherwise the answer is no.
A DENY matches only its own operation or ALL (a DENY of READ does not deny DESCRIBE).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import astuple, dataclass

from rayk.errors import InvalidRequestError

# Resource types, pattern types, operations and permission types: Kafka's codes.
ANY = 1
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = 2, 3, 4, 5
RESOURCE_TYPES = {"topic": TOPIC, "group": GROUP, "cluster": CLUSTER, "transactional-id": TRANSACTIONAL_ID}
MATCH, LITERAL, PREFIXED = 2, 3, 4
PATTERN_TYPES = {"literal": LITERAL, "prefixed": PREFIXED}
ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 2, 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12
OPERATIONS = {"all": ALL, "read": READ, "write": WRITE, "create": CREATE, "delete": DELETE, "alter": ALTER,
              "describe": DESCRIBE, "cluster-action": CLUSTER_ACTION, "describe-configs": DESCRIBE_CONFIGS,
              "alter-configs": ALTER_CONFIGS, "idempotent-write": IDEMPOTENT_WRITE}
DENY, ALLOW = 2, 3
# What each resource type's ACLs can name (Kafka's AclEntry.supportedOperations): the
# operations KIP-430's authorized-operations answers report on.
SUPPORTED_OPERATIONS = {
    TOPIC: (READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    GROUP: (READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    CLUSTER: (CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE),
    TRANSACTIONAL_ID: (DESCRIBE, WRITE),
}
PERMISSIONS = {"deny": DENY, "allow": ALLOW}
CLUSTER_NAME = "kafka-cluster"  # the one cluster resource's name
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
_IMPLIES_DESCRIBE = (READ, WRITE, DELETE, ALTER)


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: `principal` from `host` is ALLOWed or DENYed `operation` on the resources
    `resource_type` / `resource_name` match (literally, `*`, or by prefix per `pattern_type`),
    all in Kafka's codes. Immutable; `check` says whether it may be stored."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    def check(self) -> None:
        """INVALID_REQUEST unless it can be stored: concrete codes, a `User:` principal,
        and the cluster resource named kafka-cluster."""
        if self.resource_type not in RESOURCE_TYPES.values():
            raise InvalidRequestError(f"ACL resource type {self.resource_type} is not one of {sorted(RESOURCE_TYPES.values())}")
        if self.pattern_type not in PATTERN_TYPES.values():
            raise InvalidRequestError(f"ACL pattern type must be literal (3) or prefixed (4), got {self.pattern_type}")
        if self.operation not in OPERATIONS.values():
            raise InvalidRequestError(f"ACL operation {self.operation} is not a concrete operation")
        if self.permission_type not in PERMISSIONS.values():
            raise InvalidRequestError(f"ACL permission must be deny (2) or allow (3), got {self.permission_type}")
        if not self.principal.startswith("User:") or len(self.principal) == len("User:"):
            raise InvalidRequestError(f"ACL principal {self.principal!r}: expected User:<name> or User:*")
        if not self.resource_name or not self.host:
            raise InvalidRequestError("an ACL needs a resource name and a host (* for any)")
        if self.resource_type == CLUSTER and (self.resource_name, self.pattern_type) != (CLUSTER_NAME, LITERAL):
            raise InvalidRequestError(f"the cluster resource is the literal {CLUSTER_NAME!r}")

    def to_record(self) -> dict:
        return dict(zip(_FIELDS, astuple(self)))

    @classmethod
    def from_record(cls, record: dict) -> AclBinding:
        return cls(*(record[f] for f in _FIELDS))

    def grants(self, operation: int) -> bool:
        """Whether this ACL covers `operation` (a DENY only its own, or ALL)."""
        if self.operation in (ALL, operation):
            return True
        if self.permission_type == DENY:
            return False
        return (operation == DESCRIBE and self.operation in _IMPLIES_DESCRIBE) or (
            operation == DESCRIBE_CONFIGS and self.operation == ALTER_CONFIGS)

    def covers(self, resource_type: int, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)


_FIELDS = ("resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission_type")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's AclBindingFilter: None (or ANY) matches every value; pattern type MATCH
    matches the bindings that would apply to the named resource (literal, wildcard or
    prefix), ANY every pattern type."""

    resource_type: int = ANY
    resource_name: str | None = None
    pattern_type: int = ANY
    principal: str | None = None
    host: str | None = None
    operation: int = ANY
    permission_type: int = ANY

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ANY and b.resource_type != self.resource_type:
            return False
        if self.pattern_type == MATCH:
            if self.resource_name is not None and not b.covers(b.resource_type, self.resource_name):
                return False
        else:
            if self.pattern_type != ANY and b.pattern_type != self.pattern_type:
                return False
            if self.resource_name is not None and b.resource_name != self.resource_name:
                return False
        return ((self.principal is None or b.principal == self.principal)
                and (self.host is None or b.host == self.host)
                and self.operation in (ANY, b.operation)
                and self.permission_type in (ANY, b.permission_type))


class Authorizer:
    """One immutable set of bindings; decisions are remembered (a listener asks the same
    ones for every request), up to MAX_REMEMBERED."""

    MAX_REMEMBERED = 100_000

    def __init__(self, bindings: Iterable[AclBinding], super_users: frozenset[str],
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.bindings = tuple(bindings)
        self.super_users = super_users
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._decided: dict[tuple, bool] = {}

    def authorize(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        if principal in self.super_users:
            return True
        key = (principal, host, operation, resource_type, name)
        decided = self._decided.get(key)
        if decided is None:
            if len(self._decided) >= self.MAX_REMEMBERED:
                self._decided.clear()
            decided = self._decided[key] = self._decide(principal, host, operation, resource_type, name)
        return decided

    def _decide(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        on_resource = [b for b in self.bindings if b.covers(resource_type, name)]
        if not on_resource:
            return self.allow_everyone_if_no_acl_found
        mine = [b for b in on_resource if b.principal in (principal, WILDCARD_PRINCIPAL) and b.host in (host, WILDCARD)
                and b.grants(operation)]
        return not any(b.permission_type == DENY for b in mine) and any(b.permission_type == ALLOW for b in mine)

    def authorize_by_resource_type(self, principal: str, host: str, operation: int, resource_type: int) -> bool:
        """Whether the principal may do `operation` on *some* resource of the type (Kafka's
        Authorizer.authorizeByResourceType, KIP-679: an idempotent producer needs WRITE on
        some topic): an ALLOW pattern of its own, literal or prefixed, that no DENY pattern
        covers. Existing resources do not matter, only the patterns."""
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True  # super users, and allow.everyone.if.no.acl.found with nothing said
        mine = [b for b in self.bindings if b.resource_type == resource_type and b.operation in (operation, ALL)
                and b.principal in (principal, WILDCARD_PRINCIPAL) and b.host in (host, WILDCARD)]
        deny_literal = {b.resource_name for b in mine if b.permission_type == DENY and b.pattern_type == LITERAL}
        deny_prefixed = [b.resource_name for b in mine if b.permission_type == DENY and b.pattern_type == PREFIXED]
        if WILDCARD in deny_literal:
            return False
        for b in (b for b in mine if b.permission_type == ALLOW):
            if b.pattern_type == LITERAL and b.resource_name == WILDCARD:
                return True
            if b.pattern_type == LITERAL and b.resource_name in deny_literal:
                continue
            if not any(b.resource_name.startswith(prefix) for prefix in deny_prefixed):
                return True
        return False
