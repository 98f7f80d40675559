"""KIP-848's member reconciliation (rayk.coordinator.group.member_reconciliation) in a model group:
members join and leave (each change a new group epoch and a new uniform target
assignment) and heartbeat in any order, reporting what they own, and read each answer
whenever they get to it. Whatever the order, no partition is ever owned by two members, a
client consumes only what the coordinator counts as its own (so two clients never consume
one partition), and once the group stops changing every member reaches its target."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rayk.coordinator.group.member_reconciliation import NOT_OWNED, MemberAssignment, MemberState, reconcile
from rayk.coordinator.group.server_assignors import uniform_assign

PARTITIONS = {"t": 6, "u": 3}
NAMES = [f"m{i}" for i in range(5)]


class Group:
    """The coordinator's side: members' states, the group epoch and its target."""

    def __init__(self) -> None:
        self.epoch = 0
        self.members: dict[str, MemberAssignment] = {}
        self.subscriptions: dict[str, list[str]] = {}
        self.target: dict[str, frozenset] = {}

    def change(self) -> None:
        self.epoch += 1
        current = {m: a.assigned for m, a in self.members.items()}
        self.target = uniform_assign(self.subscriptions, PARTITIONS, current)

    def owner_epoch(self, member_id: str):
        def epoch(tp) -> int:
            for other, a in self.members.items():
                if other != member_id and tp in a.owned:
                    return a.member_epoch
            return NOT_OWNED
        return epoch

    def heartbeat(self, member_id: str, owned) -> MemberAssignment:
        member = reconcile(self.members[member_id], self.epoch, self.target[member_id], self.owner_epoch(member_id), owned)
        self.members[member_id] = member
        return member


class Reconciliation(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.group = Group()
        self.consuming: dict[str, frozenset] = {}  # each client's partitions, as it knows them
        self.answers: dict[str, MemberAssignment] = {}  # a heartbeat's answer the client has not read yet

    @rule(name=st.sampled_from(NAMES), topics=st.sampled_from([["t"], ["u"], ["t", "u"]]))
    def join(self, name, topics):
        if name in self.group.members:
            return
        self.group.members[name] = MemberAssignment(member_epoch=0)
        self.group.subscriptions[name] = topics
        self.consuming[name] = frozenset()
        self.group.change()

    @precondition(lambda self: self.group.members)
    @rule(data=st.data())
    def leave(self, data):
        name = data.draw(st.sampled_from(sorted(self.group.members)))
        del self.group.members[name], self.group.subscriptions[name], self.consuming[name]  # stops consuming, then leaves
        self.answers.pop(name, None)
        self.group.change()

    @precondition(lambda self: set(self.group.members) - set(self.answers))
    @rule(data=st.data(), silent=st.booleans())
    def heartbeat(self, data, silent):
        """A member's heartbeat (one in flight at a time, as Kafka's client sends them): it
        reports what it consumes, or (`silent`) leaves the owned partitions out."""
        name = data.draw(st.sampled_from(sorted(set(self.group.members) - set(self.answers))))
        self.answers[name] = self.group.heartbeat(name, None if silent else self.consuming[name])

    @precondition(lambda self: self.answers)
    @rule(data=st.data())
    def read_answer(self, data):
        """The client reads its answer, later: it stops consuming what is no longer assigned
        to it and starts on what is."""
        name = data.draw(st.sampled_from(sorted(self.answers)))
        self.consuming[name] = self.answers.pop(name).assigned

    @invariant()
    def no_partition_has_two_owners(self):
        seen: dict = {}
        for name, a in self.group.members.items():
            for tp in a.owned:
                assert tp not in seen, f"{tp} owned by {seen[tp]} and {name}"
                seen[tp] = name

    @invariant()
    def a_client_consumes_only_what_the_coordinator_counts_as_its_own(self):
        for name, partitions in self.consuming.items():
            assert partitions <= self.group.members[name].owned, (name, partitions, self.group.members[name])

    def teardown(self):
        """Once nothing changes, heartbeats in turn bring every member to its target."""
        group = self.group
        for name, answer in list(self.answers.items()):
            self.consuming[name] = answer.assigned
        self.answers.clear()
        for _ in range(4):
            for name in sorted(group.members):
                self.heartbeat_of(name)
        for name, a in group.members.items():
            assert (a.state, a.member_epoch, a.assigned) == (MemberState.STABLE, group.epoch, group.target[name]), name

    def heartbeat_of(self, name):
        member = self.group.heartbeat(name, self.consuming[name])
        self.consuming[name] = member.assigned
        self.no_partition_has_two_owners()


Reconciliation.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_no_partition_has_two_owners_and_every_member_reaches_its_target = Reconciliation.TestCase


def test_a_partition_moves_only_once_its_owner_revoked_it():
    owned_by_a = frozenset({("t", 0), ("t", 1)})
    a = MemberAssignment(member_epoch=1, assigned=owned_by_a)
    a = reconcile(a, 2, {("t", 0)}, lambda tp: NOT_OWNED, owned_by_a)
    assert (a.state, a.member_epoch, a.pending_revocation) == (MemberState.UNREVOKED_PARTITIONS, 1, {("t", 1)})
    b = reconcile(MemberAssignment(member_epoch=0), 2, {("t", 1)}, lambda tp: 1 if tp in a.owned else NOT_OWNED, [])
    assert (b.state, b.member_epoch, b.assigned) == (MemberState.UNRELEASED_PARTITIONS, 2, frozenset())
    assert reconcile(a, 2, {("t", 0)}, lambda tp: NOT_OWNED, None) is a, "a heartbeat without owned partitions revoked nothing"
    a = reconcile(a, 2, {("t", 0)}, lambda tp: NOT_OWNED, {("t", 0)})
    assert (a.state, a.member_epoch, a.assigned) == (MemberState.STABLE, 2, {("t", 0)})
    b = reconcile(b, 2, {("t", 1)}, lambda tp: 2 if tp in a.owned else NOT_OWNED, [])
    assert (b.state, b.assigned) == (MemberState.STABLE, {("t", 1)})
