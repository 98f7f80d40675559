"""KIP-848's group state (rayk.coordinator.group.consumer_protocol_group): a state machine of clients
that join, leave, die, heartbeat, read or lose their answers, and rejoin when fenced,
against one group. Whatever happens, no partition has two owners, a live client consumes
only what the coordinator counts as its own, and once nothing changes every member holds
its part of the target; the epoch rules answer Kafka's errors; a record of the group rebuilds it as it was; a
static member comes back to its partitions; a regex subscribes to the topics it matches,
those created later too."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rayk.coordinator.group.consumer_protocol_group import ClassicMembership, ConsumerProtocolGroup, GroupState
from rayk.coordinator.group.consumer_group_records import consumer_group_key, consumer_group_value
from rayk.coordinator.group.group_records import decode_record
from rayk.coordinator.group.member_reconciliation import MemberState
from rayk.errors import (
    FencedMemberEpochError,
    InvalidRegularExpressionError,
    InvalidRequestError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)

COUNTS = {"t": 4, "u": 2}
SESSION_MS = 45_000
NAMES = [f"c{i}" for i in range(4)]


class Client:
    def __init__(self, topics: list[str]) -> None:
        self.topics = topics
        self.member_id = str(uuid.uuid4())  # made by the client, as Kafka's clients do (KIP-1082)
        self.epoch = 0
        self.consuming: frozenset = frozenset()
        self.answer = None  # a heartbeat answer not read yet


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.group = ConsumerProtocolGroup("g", SESSION_MS)
        self.clients: dict[str, Client] = {}
        self.now_ms = 0
        self.last_group_epoch = 0

    def _send(self, name: str) -> None:
        client = self.clients[name]
        try:
            answer = self.group.heartbeat(client.member_id, client.epoch, self.now_ms, COUNTS,
                                          subscribed_topics=client.topics, owned=client.consuming)  # fmt: skip
        except (FencedMemberEpochError, UnknownMemberIdError):
            client.epoch, client.consuming = 0, frozenset()  # gives everything up, rejoins next time
            return
        client.answer = answer

    @rule(name=st.sampled_from(NAMES), topics=st.sampled_from([["t"], ["u"], ["t", "u"]]))
    def start(self, name, topics):
        if name not in self.clients:
            self.clients[name] = Client(topics)
            self._send(name)

    @precondition(lambda self: any(c.answer is None for c in self.clients.values()))
    @rule(data=st.data())
    def heartbeat(self, data):
        name = data.draw(st.sampled_from(sorted(n for n, c in self.clients.items() if c.answer is None)))
        self.now_ms += 1_000
        self._send(name)

    @precondition(lambda self: any(c.answer is not None for c in self.clients.values()))
    @rule(data=st.data(), lost=st.booleans())
    def read_answer(self, data, lost):
        name = data.draw(st.sampled_from(sorted(n for n, c in self.clients.items() if c.answer is not None)))
        client = self.clients[name]
        answer, client.answer = client.answer, None
        if lost:
            return  # it heartbeats next with the epoch it had (a lost join: joins again, same id)
        assert answer.member_id == client.member_id
        client.epoch, client.consuming = answer.member_epoch, answer.assignment

    @precondition(lambda self: any(c.epoch > 0 and c.answer is None for c in self.clients.values()))
    @rule(data=st.data(), dies=st.booleans())
    def stop(self, data, dies):
        """A client leaves (epoch -1), or dies: its member is removed after the session
        timeout, with every member as silent as long (their clients died too)."""
        name = data.draw(st.sampled_from(sorted(n for n, c in self.clients.items() if c.epoch > 0 and c.answer is None)))
        client = self.clients.pop(name)
        if dies:
            self.now_ms += SESSION_MS + 1
            expired = set(self.group.expire(self.now_ms))
            assert client.member_id in expired and client.member_id not in self.group.members
            self.clients = {n: c for n, c in self.clients.items() if c.member_id not in expired}
        else:
            assert self.group.heartbeat(client.member_id, -1, self.now_ms, COUNTS).member_epoch == -1

    @invariant()
    def no_partition_has_two_owners(self):
        seen: dict = {}
        for member in self.group.members.values():
            for tp in member.assignment.owned:
                assert tp not in seen, f"{tp} owned by {seen[tp]} and {member.member_id}"
                seen[tp] = member.member_id

    @invariant()
    def a_client_consumes_only_what_the_coordinator_counts_as_its_own(self):
        for client in self.clients.values():
            if client.consuming:
                assert client.consuming <= self.group.members[client.member_id].assignment.owned

    @invariant()
    def a_new_coordinator_rebuilds_the_group_from_its_record(self):
        snapshot = self.group.snapshot()
        replayed = decode_record(consumer_group_key("g"), consumer_group_value(snapshot))
        assert ConsumerProtocolGroup.restore(replayed, SESSION_MS, self.now_ms).snapshot() == snapshot

    @invariant()
    def the_group_epoch_only_grows_and_the_target_follows_it(self):
        assert self.group.group_epoch >= self.last_group_epoch and self.group.target_epoch <= self.group.group_epoch
        self.last_group_epoch = self.group.group_epoch

    def teardown(self):
        for name, client in self.clients.items():
            if client.answer is not None:
                self.read_answer_of(name)
        for _ in range(5):
            for name in sorted(self.clients):
                self.now_ms += 100
                self._send(name)
                self.read_answer_of(name)
        for name, client in self.clients.items():
            member = self.group.members[client.member_id]
            assert member.assignment.state is MemberState.STABLE and client.epoch == self.group.group_epoch
            assert client.consuming == self.group.target[client.member_id], name

    def read_answer_of(self, name):
        client = self.clients[name]
        answer, client.answer = client.answer, None
        if answer is not None:
            client.epoch, client.consuming = answer.member_epoch, answer.assignment


GroupMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_members_never_share_a_partition_and_reach_the_target = GroupMachine.TestCase


def test_the_epoch_rules_answer_kafkas_errors():
    group = ConsumerProtocolGroup("g", SESSION_MS)
    a = group.heartbeat("", 0, 0, COUNTS, subscribed_topics=["t"])
    assert a.member_id and a.member_epoch == 1 and a.assignment == {("t", p) for p in range(4)}
    with pytest.raises(UnknownMemberIdError):
        group.heartbeat("nobody", 1, 1, COUNTS)
    with pytest.raises(FencedMemberEpochError):
        group.heartbeat(a.member_id, 7, 1, COUNTS, owned=a.assignment)
    with pytest.raises(InvalidRequestError):
        group.heartbeat("new", 0, 1, COUNTS)  # a join names its topics
    with pytest.raises(UnsupportedAssignorError):
        group.heartbeat(a.member_id, 1, 1, COUNTS, assignor="sticky")
    b = group.heartbeat("b", 0, 2, COUNTS, subscribed_topics=["t"])
    assert b.assignment == frozenset(), "its partitions are a's until a revokes them"
    a2 = group.heartbeat(a.member_id, 1, 3, COUNTS, owned=a.assignment)
    assert a2.member_epoch == 1 and len(a2.assignment) == 2, "a keeps two, revokes two, in its epoch"
    a3 = group.heartbeat(a.member_id, 1, 4, COUNTS, owned=a2.assignment)
    assert a3.member_epoch == group.group_epoch == 2
    assert len(group.heartbeat("b", 2, 5, COUNTS, owned=[]).assignment) == 2, "released: b gets them"
    grown = group.heartbeat(a.member_id, 2, 6, {**COUNTS, "t": 6}, owned=a3.assignment)
    assert grown.member_epoch == 3 and group.group_epoch == 3, "new partitions are a group change"


def test_only_the_epoch_just_before_the_member_s_own_is_taken_for_a_lost_answer():
    group = ConsumerProtocolGroup("g", SESSION_MS)
    a = group.heartbeat("a", 0, 0, COUNTS, subscribed_topics=["t"])
    assert a.member_epoch == 1
    mine = a.assignment
    for now_ms, counts in ((1, {**COUNTS, "t": 5}), (2, {**COUNTS, "t": 6})):  # two group changes: epochs 2, 3
        answer = group.heartbeat("a", group.members["a"].assignment.member_epoch, now_ms, counts, owned=mine)
    assert answer.member_epoch == 3 and group.members["a"].assignment.previous_member_epoch == 2
    # Its answer of epoch 3 lost: epoch 2 is accepted while it owns nothing it was not given.
    assert group.heartbeat("a", 2, 3, {**COUNTS, "t": 6}, owned=mine).member_epoch == 3
    with pytest.raises(FencedMemberEpochError):
        group.heartbeat("a", 1, 4, {**COUNTS, "t": 6}, owned=mine)  # older than the one before: rejoin
    with pytest.raises(FencedMemberEpochError):
        group.heartbeat("a", 2, 5, {**COUNTS, "t": 6}, owned=[*mine, ("u", 0)])  # owns what is not its own


def test_a_member_asking_with_nothing_reported_is_answered_where_it_stands():
    """A member told to revoke whose answer was lost asks again reporting nothing (librdkafka
    after a timed-out heartbeat): the answer holds the same epoch and assignment, which the
    wire sends again (consumer_group_apis.py), and so for the member the partitions are then
    released to."""
    group = ConsumerProtocolGroup("g", SESSION_MS)
    a = group.heartbeat("a", 0, 0, COUNTS, subscribed_topics=["t"])
    b = group.heartbeat("b", 0, 1, COUNTS, subscribed_topics=["t"])
    assert b.assignment == frozenset()
    told = group.heartbeat("a", 1, 2, COUNTS, owned=a.assignment)
    assert told.member_epoch == 1 and len(told.assignment) == 2 < len(a.assignment)
    again = group.heartbeat("a", 1, 3, COUNTS)  # the answer above lost; nothing reported
    assert (again.member_epoch, again.assignment) == (1, told.assignment)
    assert group.heartbeat("b", 2, 4, COUNTS).assignment == frozenset(), "still held by a"
    done = group.heartbeat("a", 1, 5, COUNTS, owned=told.assignment)
    assert done.member_epoch == 2
    released = group.heartbeat("b", 2, 6, COUNTS)
    assert released.assignment == a.assignment - told.assignment
    again = group.heartbeat("b", 2, 7, COUNTS)  # that answer lost too
    assert (again.member_epoch, again.assignment) == (2, released.assignment)


def test_a_group_record_written_before_previous_epochs_were_kept_reads_with_none():
    import msgpack

    group = ConsumerProtocolGroup("g", SESSION_MS)
    group.heartbeat("a", 0, 0, COUNTS, subscribed_topics=["t"])
    value = msgpack.unpackb(consumer_group_value(group.snapshot()))
    for member in value["members"]:
        del member["previous_member_epoch"]
    record = decode_record(consumer_group_key("g"), msgpack.packb(value))
    assert [m.previous_member_epoch for m in record.members] == [-1]
    restored = ConsumerProtocolGroup.restore(record, SESSION_MS, 1)
    assert restored.heartbeat("a", 1, 2, COUNTS, owned=[("t", p) for p in range(4)]).member_epoch == 1


def test_a_static_member_away_keeps_its_partitions_for_the_member_that_takes_its_instance_id_over():
    group = ConsumerProtocolGroup("g", SESSION_MS)
    a = group.heartbeat("a", 0, 0, COUNTS, subscribed_topics=["t"], instance_id="i-a")
    b = group.heartbeat("b", 0, 1, COUNTS, subscribed_topics=["t"], instance_id="i-b")
    a = group.heartbeat("a", a.member_epoch, 2, COUNTS, owned=a.assignment)
    a = group.heartbeat("a", a.member_epoch, 3, COUNTS, owned=a.assignment)
    b = group.heartbeat("b", b.member_epoch, 4, COUNTS, owned=[])
    assert len(a.assignment) == len(b.assignment) == 2 and group.state is GroupState.STABLE
    epoch = group.group_epoch
    with pytest.raises(UnreleasedInstanceIdError):
        group.heartbeat("a2", 0, 5, COUNTS, subscribed_topics=["t"], instance_id="i-a")  # a has not left
    assert group.heartbeat("a", -2, 6, COUNTS, instance_id="i-a").member_epoch == -2
    assert group.members["a"].away and group.members["a"].assignment.assigned == a.assignment, "kept while away"
    assert group.heartbeat("b", b.member_epoch, 7, COUNTS, owned=b.assignment).assignment == b.assignment
    back = group.heartbeat("a2", 0, 8, COUNTS, subscribed_topics=["t"], owned=[], instance_id="i-a")
    assert (back.member_epoch, back.assignment) == (a.member_epoch, a.assignment), "its place, epoch and partitions"
    assert "a" not in group.members and group.group_epoch == epoch, "no group change: nothing moved"
    assert group.heartbeat("a2", -2, 9, COUNTS, instance_id="i-a").member_epoch == -2
    later_ms = 9 + SESSION_MS + 1
    group.heartbeat("b", b.member_epoch, later_ms - 1, COUNTS, owned=b.assignment)
    assert group.expire(later_ms) == ["a2"], "away past its session: gone, its partitions free"
    assert group.heartbeat("b", b.member_epoch, later_ms, COUNTS, owned=b.assignment).assignment == {
        ("t", p) for p in range(4)}


def test_a_regex_subscribes_to_the_topics_it_matches_those_created_later_too_but_no_internal_one():
    group = ConsumerProtocolGroup("g", SESSION_MS)
    counts = {"orders-eu": 2, "orders-us": 1, "payments": 1, "__consumer_offsets": 3}
    a = group.heartbeat("a", 0, 0, counts, subscribed_regex="orders-.*|__.*")
    assert a.assignment == {("orders-eu", 0), ("orders-eu", 1), ("orders-us", 0)}
    grown = group.heartbeat("a", a.member_epoch, 1, {**counts, "orders-asia": 1}, owned=a.assignment)
    assert ("orders-asia", 0) in grown.assignment and grown.member_epoch == a.member_epoch + 1, "a new topic matched"
    both = group.heartbeat("a", grown.member_epoch, 2, {**counts, "orders-asia": 1}, subscribed_topics=["payments"],
                           owned=grown.assignment)
    assert ("payments", 0) in both.assignment and ("orders-us", 0) in both.assignment, "names and regex together"
    for refused in ("orders-(", "orders-(?!us).*", r"(orders)-\1"):  # RE2, as Kafka's RE2/J: no lookaround, no backreference
        with pytest.raises(InvalidRegularExpressionError):
            group.heartbeat("a", both.member_epoch, 3, counts, subscribed_regex=refused)
    assert group.members["a"].subscribed_regex == "orders-.*|__.*", "a refused regex changes nothing"
    group.heartbeat("a", both.member_epoch, 4, {**counts, "orders-asia": 1}, subscribed_regex=r"orders-\p{L}{2}",
                    owned=both.assignment)  # (a Unicode class: RE2's, not Python's re)
    assert group.members["a"].subscribed_regex == r"orders-\p{L}{2}"
    assert group.subscribed_topics() == {"orders-eu", "orders-us", "payments"}, "two letters: not orders-asia"


def test_a_classic_static_member_that_restarts_takes_its_place_and_consumer_heartbeats_cannot_name_it():
    """A classic member never says it leaves: its restarted process (a new member id, the
    same instance id) takes its place and partitions, as in a classic group; a
    ConsumerGroupHeartbeat naming a classic member is UNKNOWN_MEMBER_ID."""
    group = ConsumerProtocolGroup("g", SESSION_MS)
    classic = ClassicMembership(10_000, (("range", b""),))
    first = group.classic_join("c-1", 0, COUNTS, ["t"], [], 60_000, classic, instance_id="i")
    assert len(first.assignment) == 4
    again = group.classic_join("c-2", 1, COUNTS, ["t"], [], 60_000, classic, instance_id="i")
    assert (again.member_epoch, again.assignment) == (first.member_epoch, first.assignment) and "c-1" not in group.members
    with pytest.raises(UnknownMemberIdError):
        group.heartbeat("c-2", again.member_epoch, 2, COUNTS)
    with pytest.raises(UnknownMemberIdError):
        group.heartbeat("c-2", -1, 2, COUNTS)
