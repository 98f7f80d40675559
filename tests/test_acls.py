"""The ACL model and the authorizer's decision (rayk/acls.py), as Kafka's StandardAuthorizer
takes it: super users, DENY over ALLOW, implied DESCRIBE, literal / wildcard / prefixed
resources, principal and host wildcards, allow.everyone.if.no.acl.found; filters as
DescribeAcls / DeleteAcls read them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayk.acls import (
    ALL, ALLOW, ALTER, ALTER_CONFIGS, ANY, CLUSTER, CLUSTER_NAME, CREATE, DELETE, DENY, DESCRIBE, DESCRIBE_CONFIGS,
    GROUP, LITERAL, MATCH, OPERATIONS, PREFIXED, READ, TOPIC, WRITE, AclBinding, AclFilter, Authorizer,
)
from rayk.errors import InvalidRequestError

ALICE, BOB = "User:alice", "User:bob"


def allow(principal: str, operation: int, name: str = "orders", pattern: int = LITERAL, resource: int = TOPIC,
          host: str = "*") -> AclBinding:
    return AclBinding(resource, name, pattern, principal, host, operation, ALLOW)


def deny(principal: str, operation: int, name: str = "orders", pattern: int = LITERAL, resource: int = TOPIC,
         host: str = "*") -> AclBinding:
    return AclBinding(resource, name, pattern, principal, host, operation, DENY)


def test_an_allow_grants_its_operation_and_the_describe_it_implies_and_nothing_else():
    a = Authorizer([allow(ALICE, READ)], frozenset())
    assert a.authorize(ALICE, "10.0.0.1", READ, TOPIC, "orders")
    assert a.authorize(ALICE, "10.0.0.1", DESCRIBE, TOPIC, "orders"), "READ implies DESCRIBE"
    assert not a.authorize(ALICE, "10.0.0.1", WRITE, TOPIC, "orders")
    assert not a.authorize(BOB, "10.0.0.1", READ, TOPIC, "orders")
    assert not a.authorize(ALICE, "10.0.0.1", READ, TOPIC, "payments"), "no ACL there: denied by default"
    assert not a.authorize(ALICE, "10.0.0.1", READ, GROUP, "orders"), "another resource type"
    configs = Authorizer([allow(ALICE, ALTER_CONFIGS)], frozenset())
    assert configs.authorize(ALICE, "h", DESCRIBE_CONFIGS, TOPIC, "orders")
    for implied_by in (WRITE, DELETE, ALTER):
        assert Authorizer([allow(ALICE, implied_by)], frozenset()).authorize(ALICE, "h", DESCRIBE, TOPIC, "orders")
    assert not Authorizer([allow(ALICE, CREATE)], frozenset()).authorize(ALICE, "h", DESCRIBE, TOPIC, "orders")


def test_deny_wins_and_matches_only_its_own_operation_or_all():
    a = Authorizer([allow("User:*", ALL), deny(ALICE, WRITE)], frozenset())
    assert not a.authorize(ALICE, "h", WRITE, TOPIC, "orders")
    assert a.authorize(ALICE, "h", READ, TOPIC, "orders")
    assert a.authorize(ALICE, "h", DESCRIBE, TOPIC, "orders"), "a DENY of WRITE does not deny DESCRIBE"
    assert a.authorize(BOB, "h", WRITE, TOPIC, "orders")
    everything = Authorizer([allow(ALICE, READ), deny(ALICE, ALL)], frozenset())
    assert not everything.authorize(ALICE, "h", READ, TOPIC, "orders")


def test_wildcards_prefixes_and_hosts():
    a = Authorizer([allow(ALICE, READ, "*"), allow(BOB, WRITE, "logs-", PREFIXED),
                    allow("User:carol", READ, host="10.0.0.7")], frozenset())
    assert a.authorize(ALICE, "h", READ, TOPIC, "anything")
    assert a.authorize(BOB, "h", WRITE, TOPIC, "logs-app")
    assert not a.authorize(BOB, "h", WRITE, TOPIC, "log")
    assert a.authorize("User:carol", "10.0.0.7", READ, TOPIC, "orders")
    assert not a.authorize("User:carol", "10.0.0.8", READ, TOPIC, "orders")


def test_super_users_and_allow_everyone_if_no_acl_found():
    a = Authorizer([deny(ALICE, ALL)], frozenset({ALICE}))
    assert a.authorize(ALICE, "h", WRITE, TOPIC, "orders"), "a super user passes every check, denials too"
    lenient = Authorizer([allow(ALICE, READ)], frozenset(), allow_everyone_if_no_acl_found=True)
    assert lenient.authorize(BOB, "h", WRITE, TOPIC, "payments"), "no ACL on the resource"
    assert not lenient.authorize(BOB, "h", READ, TOPIC, "orders"), "the resource has ACLs: they decide"
    assert not Authorizer([], frozenset()).authorize(BOB, "h", READ, TOPIC, "x")


def test_bindings_that_cannot_be_stored_are_invalid_requests():
    allow(ALICE, READ).check()
    AclBinding(CLUSTER, CLUSTER_NAME, LITERAL, ALICE, "*", ALTER, ALLOW).check()
    for bad in (AclBinding(ANY, "x", LITERAL, ALICE, "*", READ, ALLOW), AclBinding(TOPIC, "x", MATCH, ALICE, "*", READ, ALLOW),
                AclBinding(TOPIC, "x", LITERAL, "alice", "*", READ, ALLOW), AclBinding(TOPIC, "x", LITERAL, ALICE, "*", ANY, ALLOW),
                AclBinding(TOPIC, "x", LITERAL, ALICE, "*", READ, ANY), AclBinding(CLUSTER, "mine", LITERAL, ALICE, "*", ALTER, ALLOW),
                AclBinding(TOPIC, "", LITERAL, ALICE, "*", READ, ALLOW)):
        with pytest.raises(InvalidRequestError):
            bad.check()


def test_filters_match_as_describe_and_delete_read_them():
    literal, prefixed, wildcard = allow(ALICE, READ, "orders"), allow(BOB, WRITE, "ord", PREFIXED), allow(BOB, READ, "*")
    everything = [literal, prefixed, wildcard]
    assert [b for b in everything if AclFilter().matches(b)] == everything
    assert [b for b in everything if AclFilter(principal=BOB).matches(b)] == [prefixed, wildcard]
    assert [b for b in everything if AclFilter(TOPIC, "orders", LITERAL).matches(b)] == [literal]
    assert [b for b in everything if AclFilter(TOPIC, "orders", MATCH).matches(b)] == everything, "all that apply to orders"
    assert [b for b in everything if AclFilter(operation=WRITE).matches(b)] == [prefixed]


@given(st.sampled_from(sorted(OPERATIONS.values())), st.sampled_from(sorted(OPERATIONS.values())))
def test_an_allow_of_all_grants_every_operation_and_a_deny_of_all_denies_every_one(granted, asked):
    assert Authorizer([allow(ALICE, ALL)], frozenset()).authorize(ALICE, "h", asked, TOPIC, "orders")
    assert not Authorizer([allow(ALICE, granted), deny(ALICE, ALL)], frozenset()).authorize(ALICE, "h", asked, TOPIC, "orders")
    assert AclBinding.from_record(allow(ALICE, granted).to_record()) == allow(ALICE, granted)


def test_some_resource_of_a_type_as_kafka_decides_it_for_idempotent_producers():
    """Kafka's authorizeByResourceType: an ALLOW pattern that no DENY pattern covers."""
    def some(*bindings: AclBinding, everyone: bool = False) -> bool:
        return Authorizer(bindings, frozenset(), everyone).authorize_by_resource_type(ALICE, "h", WRITE, TOPIC)

    assert some(allow(ALICE, WRITE, "orders-", PREFIXED)), "a prefix counts though no such topic exists"
    assert not some(allow(ALICE, WRITE, "orders-", PREFIXED), deny(ALICE, WRITE, "ord", PREFIXED))
    assert some(allow(ALICE, WRITE, "orders"), deny(ALICE, WRITE, "payments"))
    assert not some(allow(ALICE, WRITE, "orders"), deny(ALICE, WRITE, "orders"))
    assert not some(allow(ALICE, WRITE, "*"), deny(ALICE, WRITE, "*"))
    assert not some(allow(ALICE, READ, "orders")), "another operation"
    assert some(everyone=True), "nothing said, and allow.everyone.if.no.acl.found"
    assert Authorizer([], frozenset({ALICE})).authorize_by_resource_type(ALICE, "h", WRITE, TOPIC)


def test_before_the_acls_are_loaded_only_super_users_pass_whatever_allow_everyone_says():
    from types import SimpleNamespace

    from rayk.config import BrokerConfig
    from rayk.net.broker_view import BrokerView

    config = BrokerConfig.from_properties({
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": True, "super.users": "User:admin"})
    view = BrokerView(0, None, config)

    def request(principal: str) -> SimpleNamespace:
        return SimpleNamespace(context=SimpleNamespace(principal=principal, client_host="10.0.0.1"))

    assert not view.authorized(request(ALICE), WRITE, TOPIC, "payments")
    assert view.authorized(request("User:admin"), WRITE, TOPIC, "payments")


def test_client_hosts_are_written_as_java_writes_them():
    from rayk.net.request_context import kafka_host

    assert kafka_host("::1") == "0:0:0:0:0:0:0:1"
    assert kafka_host("::ffff:10.0.0.1") == "10.0.0.1"
    assert kafka_host("fe80::1%eth0") == "fe80:0:0:0:0:0:0:1"
    assert kafka_host("10.1.2.3") == "10.1.2.3"
