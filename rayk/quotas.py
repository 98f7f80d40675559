"""Client quotas in Kafka's model: which limit applies to a client, and the filters that
DescribeClientQuotas matches entities with.

A quota is set on an entity: a user, a client id, or a (user, client id) pair, where
either may be the *default* one, which applies to every user (client id) that has no
quota of its own. The keys are Kafka's: `producer_byte_rate` and `consumer_byte_rate`
(bytes per second) and `request_percentage` (percent of one thread's time: 100 is one
thread busy all the time).

`QuotaConfig.resolve` finds the limit of one (user, client id) and key the way Kafka's
ClientQuotaManager does, taking the first of these that has the key:

    1. /users/<user>/clients/<client-id>      5. /users/<default>/clients/<default>
    2. /users/<user>/clients/<default>        6. /users/<default>
    3. /users/<user>                          7. /clients/<client-id>
    4. /users/<default>/clients/<client-id>   8. /clients/<default>

It also names who shares the limit (`QuotaKey`): the entity that matched, with its
defaults replaced by the client's own names. A quota on /users/alice is shared by every
client of alice; a default quota on /users/<default> is every user's own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rayk.errors import InvalidRequestError

USER, CLIENT_ID, IP = "user", "client-id", "ip"
PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE = "producer_byte_rate", "consumer_byte_rate", "request_percentage"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
_WHOLE_NUMBER_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)  # Kafka's LONG quota configs
# DescribeClientQuotas' match types.
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2


class _Default:
    """The default entity of a type (the wire's null name)."""

    _instance: _Default | None = None

    def __new__(cls) -> _Default:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DEFAULT"

    def __reduce__(self) -> str:
        return "DEFAULT"  # one instance in every process (pickled by name)


DEFAULT = _Default()
Name = str | _Default


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """What a quota is set on: a user, a client id, or both; either may be DEFAULT. A field
    left None is not part of the entity."""

    user: Name | None = None
    client_id: Name | None = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise InvalidRequestError("a quota entity names a user, a client id or both")
        for name in (self.user, self.client_id):
            if not (name is None or name is DEFAULT or isinstance(name, str)):
                raise InvalidRequestError(f"a quota entity's name is a str or DEFAULT, got {name!r}")
            if name == "":
                raise InvalidRequestError("an empty quota entity name (the default entity is DEFAULT, null on the wire)")

    @classmethod
    def from_wire(cls, parts: Iterable[tuple[str, str | None]]) -> QuotaEntity:
        """From (entity type, name or None for the default) pairs, as the wire carries them;
        INVALID_REQUEST for a type rayk does not keep quotas for, or one named twice."""
        found: dict[str, Name] = {}
        for entity_type, name in parts:
            if entity_type not in (USER, CLIENT_ID):
                detail = " (connection_creation_rate is not enforced by rayk)" if entity_type == IP else ""
                raise InvalidRequestError(f"quota entity type {entity_type!r} is not one of user, client-id{detail}")
            if entity_type in found:
                raise InvalidRequestError(f"quota entity type {entity_type!r} given twice")
            found[entity_type] = DEFAULT if name is None else name
        return cls(found.get(USER), found.get(CLIENT_ID))

    def to_wire(self) -> list[tuple[str, str | None]]:
        parts = [(USER, self.user), (CLIENT_ID, self.client_id)]
        return [(t, None if n is DEFAULT else n) for t, n in parts if n is not None]  # type: ignore[misc]

    def to_record(self) -> list[list[Any]]:
        return [list(p) for p in self.to_wire()]

    @classmethod
    def from_record(cls, parts: list[list[Any]]) -> QuotaEntity:
        return cls.from_wire((t, n) for t, n in parts)

    def __str__(self) -> str:
        """As kafka-configs prints it: `user 'alice', client-id <default>`."""
        def name(n: Name) -> str:
            return "<default>" if n is DEFAULT else repr(n)
        parts = [f"user {name(self.user)}" if self.user is not None else "",
                 f"client-id {name(self.client_id)}" if self.client_id is not None else ""]
        return ", ".join(p for p in parts if p)


def check_quota_key(key: str) -> None:
    """INVALID_REQUEST for a key rayk keeps no quota under."""
    if key not in QUOTA_KEYS:
        detail = " (controller_mutation_rate is not enforced by rayk)" if key == "controller_mutation_rate" else ""
        raise InvalidRequestError(f"unknown quota key {key!r}: rayk keeps {', '.join(QUOTA_KEYS)}{detail}")


def check_quota_value(key: str, value: float) -> None:
    """INVALID_REQUEST unless `value` may be stored under `key`, as Kafka checks them."""
    check_quota_key(key)
    try:
        positive = not isinstance(value, bool) and math.isfinite(value) and value > 0
    except (TypeError, OverflowError):  # not a number, or an int too large for a float
        positive = False
    if not positive:
        raise InvalidRequestError(f"{key} must be a positive number, got {value!r}")
    if key in _WHOLE_NUMBER_KEYS and value != int(value):
        raise InvalidRequestError(f"{key} is a whole number of bytes per second, got {value!r}")


@dataclass(frozen=True, slots=True)
class QuotaFilterComponent:
    """One component of a DescribeClientQuotas filter: entities whose `entity_type` is
    the name `match` (MATCH_EXACT), the default (MATCH_DEFAULT), or any (MATCH_ANY)."""

    entity_type: str
    match_type: int
    match: str | None = None

    def check(self) -> None:
        if self.entity_type not in (USER, CLIENT_ID):
            raise InvalidRequestError(f"quota entity type {self.entity_type!r} is not one of user, client-id")
        if self.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY):
            raise InvalidRequestError(f"quota filter match type {self.match_type} is not 0 (exact), 1 (default) or 2 (any)")
        if (self.match_type == MATCH_EXACT) != (self.match is not None):
            raise InvalidRequestError("a quota filter names an entity exactly when its match type is 0 (exact)")

    def matches(self, name: Name | None) -> bool:
        if name is None:
            return False
        if self.match_type == MATCH_EXACT:
            return name == self.match
        if self.match_type == MATCH_DEFAULT:
            return name is DEFAULT
        return True


def filter_entities(entities: Iterable[QuotaEntity], components: list[QuotaFilterComponent], strict: bool) -> list[QuotaEntity]:
    """The entities every component matches (strict: and that have no other type), as
    DescribeClientQuotas selects them; INVALID_REQUEST for a bad filter."""
    for c in components:
        c.check()
    if len({c.entity_type for c in components}) != len(components):
        raise InvalidRequestError("a quota filter names an entity type twice")
    wanted_types = {c.entity_type for c in components}

    def selected(e: QuotaEntity) -> bool:
        names = {USER: e.user, CLIENT_ID: e.client_id}
        if strict and {t for t, n in names.items() if n is not None} != wanted_types:
            return False
        return all(c.matches(names[c.entity_type]) for c in components)

    return [e for e in entities if selected(e)]


@dataclass(frozen=True, slots=True)
class QuotaKey:
    """Who shares one limit: the matched entity with its defaults made the client's names
    ("" for a type the entity does not have), as Kafka's quota metric tags."""

    user: str
    client_id: str


# Kafka's order: (user part, client-id part), where "name" is the client's own, "default"
# the default entity, and None an entity without that type.
_PRECEDENCE: tuple[tuple[str | None, str | None], ...] = (
    ("name", "name"), ("name", "default"), ("name", None),
    ("default", "name"), ("default", "default"), ("default", None),
    (None, "name"), (None, "default"),
)


class QuotaConfig:
    """Every quota that is set, by entity; resolves the limit that applies to a client."""

    def __init__(self, entries: Mapping[QuotaEntity, Mapping[str, float]] = ()) -> None:
        self.entries: dict[QuotaEntity, dict[str, float]] = {e: dict(v) for e, v in dict(entries).items() if v}
        self.keys_set = frozenset(k for values in self.entries.values() for k in values)
        # Looked up by (user, client id) parts: a client's own names need not make a valid
        # entity (a client without a client id has "").
        self._by_parts = {(e.user, e.client_id): values for e, values in self.entries.items()}

    def resolve(self, user: str, client_id: str, key: str) -> tuple[float, QuotaKey] | None:
        """(limit, who shares it) for a client of `user` with `client_id`, or None if no
        quota of `key` applies to it."""
        if key not in self.keys_set:
            return None
        for user_part, client_part in _PRECEDENCE:
            limit = self._by_parts.get((_pick(user_part, user), _pick(client_part, client_id)), {}).get(key)
            if limit is not None:
                return limit, QuotaKey(user if user_part else "", client_id if client_part else "")
        return None


def _pick(part: str | None, own: str) -> Name | None:
    return None if part is None else (DEFAULT if part == "default" else own)
