"""AclControlManager alone: CreateAcls / DeleteAcls planned as records, replayed, imaged."""

from __future__ import annotations

from rayk.acls import ALLOW, DENY, LITERAL, PREFIXED, READ, TOPIC, WRITE, AclBinding, AclFilter
from rayk.errors import InvalidRequestError
from rayk.metadata.acl_control import AclControlManager
from rayk.metadata.records import AclRecord, RemoveAclRecord
from tests.metadata_helpers import replay_into

ALICE_READ = AclBinding(TOPIC, "orders", LITERAL, "User:alice", "*", READ, ALLOW)
BOB_WRITE = AclBinding(TOPIC, "ord", PREFIXED, "User:bob", "*", WRITE, DENY)


def test_created_bindings_are_one_record_each_and_a_repeat_or_an_existing_one_is_a_no_op():
    acl = AclControlManager()
    records, results = acl.plan_create_acls([ALICE_READ, BOB_WRITE, ALICE_READ])
    assert results == [None, None, None]
    assert records == [AclRecord.of(ALICE_READ), AclRecord.of(BOB_WRITE)]
    replay_into(acl, records, 7)
    assert list(acl.bindings) == [ALICE_READ, BOB_WRITE] and acl.version == 8
    assert acl.plan_create_acls([BOB_WRITE]) == ([], [None])


def test_a_binding_that_cannot_be_stored_is_refused_alone():
    acl = AclControlManager()
    bad = AclBinding(TOPIC, "orders", LITERAL, "alice", "*", READ, ALLOW)  # not a User: principal
    records, results = acl.plan_create_acls([bad, ALICE_READ])
    assert isinstance(results[0], InvalidRequestError) and results[1] is None
    assert records == [AclRecord.of(ALICE_READ)]


def test_delete_answers_per_filter_and_deletes_a_binding_two_filters_match_once():
    acl = AclControlManager()
    replay_into(acl, acl.plan_create_acls([ALICE_READ, BOB_WRITE])[0])
    records, matched = acl.plan_delete_acls([AclFilter(resource_type=TOPIC), AclFilter(principal="User:bob")])
    assert matched == [[ALICE_READ, BOB_WRITE], [BOB_WRITE]]
    assert records == [RemoveAclRecord.of(ALICE_READ), RemoveAclRecord.of(BOB_WRITE)]
    next_offset = replay_into(acl, records, 2)
    assert acl.bindings == {} and acl.version == next_offset - 1


def test_the_image_rebuilds_the_bindings_in_their_order():
    acl = AclControlManager()
    replay_into(acl, acl.plan_create_acls([BOB_WRITE, ALICE_READ])[0])
    again = AclControlManager()
    replay_into(again, acl.image_records())
    assert list(again.bindings) == [BOB_WRITE, ALICE_READ]
