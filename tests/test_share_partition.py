"""A share-partition's delivery state (rayk.replication.share.share_partition, KIP-932): a state machine
of members that acquire, accept, release, reject, die (their locks expire) or leave, over
a log that grows. Whatever happens, no record is held by two members at once, an accepted
record is never handed out again, no record is delivered more than the delivery limit,
SPSO only moves forward past records that are done, and the durable state rebuilds the
partition as a new leader would see it. Once every member is gone, each record is either
accepted, archived, or handed out again."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rayk.replication.share.share_partition import AcknowledgeType, RecordState, SharePartition
from rayk.errors import InvalidRecordStateError

LIMIT = 3
LOCK_MS = 1_000
MEMBERS = ["a", "b", "c"]
BATCH = 6  # the largest log batch the machine's leader takes whole


class SharePartitionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.partition = SharePartition(0, delivery_count_limit=LIMIT, lock_duration_ms=LOCK_MS, max_in_flight=8)
        self.log_end = 0
        self.now_ms = 0
        self.held: dict[str, set[int]] = {m: set() for m in MEMBERS}  # what each member was handed, unsettled
        self.accepted: set[int] = set()
        self.deliveries: dict[int, int] = {}
        self.last_start = 0

    @rule(n=st.integers(1, 5))
    def produce(self, n):
        self.log_end += n

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 6))
    def acquire(self, member, max_records):
        got = self.partition.acquire(member, max_records, self.log_end, self.now_ms)
        assert sum(len(r.offsets) for r in got) <= max_records
        self._handed(member, got)

    @rule(member=st.sampled_from(MEMBERS), size=st.integers(1, BATCH))
    def acquire_a_whole_batch(self, member, size):
        """A leader takes a whole log batch of new records, past max_records, while SPEO is in the window."""
        end = min(self.log_end, self.partition.end_offset + size)
        got = self.partition.acquire_batch(member, end, self.now_ms)
        inside = self.partition.end_offset - self.partition.start_offset < self.partition.max_in_flight
        if got is not None:
            assert got.first_offset == self.partition.end_offset - len(got.offsets) and got.last_offset == end - 1
            self._handed(member, [got])
        else:
            assert end <= self.partition.end_offset or not inside

    def _handed(self, member, got):
        for r in got:
            for offset in r.offsets:
                assert offset < self.log_end and offset not in self.accepted, r
                assert all(offset not in held for held in self.held.values()), f"{offset} held twice"
                self.deliveries[offset] = self.deliveries.get(offset, 0) + 1
                assert r.delivery_count == self.deliveries[offset] <= LIMIT
                self.held[member].add(offset)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), kind=st.sampled_from(list(AcknowledgeType)))
    def acknowledge(self, data, kind):
        member = data.draw(st.sampled_from(sorted(m for m in MEMBERS if self.held[m])))
        offsets = data.draw(st.lists(st.sampled_from(sorted(self.held[member])), min_size=1, unique=True))
        self.partition.acknowledge(member, offsets, kind)
        self.held[member] -= set(offsets)
        if kind is AcknowledgeType.ACCEPT:
            self.accepted |= set(offsets)

    @rule(member=st.sampled_from(MEMBERS), offset=st.integers(0, 30))
    def acknowledge_what_it_does_not_hold(self, member, offset):
        if offset in self.held[member]:
            return
        with pytest.raises(InvalidRecordStateError):
            self.partition.acknowledge(member, [offset], AcknowledgeType.ACCEPT)

    @rule(member=st.sampled_from(MEMBERS))
    def leave(self, member):
        assert self.partition.release_member(member) == len(self.held[member])
        self.held[member].clear()

    @rule()
    def locks_expire(self):
        """Every member stops for longer than the lock duration (each may have died)."""
        self.now_ms += LOCK_MS
        assert self.partition.expire_locks(self.now_ms) == sum(map(len, self.held.values()))
        for held in self.held.values():
            held.clear()

    @invariant()
    def spso_only_moves_forward_past_records_that_are_done(self):
        p = self.partition
        assert self.last_start <= p.start_offset <= p.end_offset <= self.log_end
        assert p.end_offset - p.start_offset <= p.max_in_flight + BATCH - 1  # (a whole batch may reach past it)
        assert all(a.last + 1 == b.first for a, b in zip(p.runs, p.runs[1:])), "runs cover the window in order"
        self.last_start = p.start_offset
        for offset in range(p.start_offset):
            assert offset in self.accepted or self.deliveries.get(offset, 0) >= 1, offset
        if p.start_offset < p.end_offset:
            assert p.in_flight[p.start_offset].state not in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)

    @invariant()
    def the_partition_holds_for_each_member_what_it_was_handed(self):
        for member, held in self.held.items():
            assert held == {o for o, r in self.partition.in_flight.items()
                            if r.state is RecordState.ACQUIRED and r.member_id == member}

    @invariant()
    def the_durable_state_rebuilds_the_partition_as_a_new_leader_sees_it(self):
        """Acquired records come back available, with the deliveries made, or archived
        if that was their last one; SPSO then moves past what is done."""
        p = self.partition
        restored = SharePartition.restore(p.snapshot(), delivery_count_limit=LIMIT, lock_duration_ms=LOCK_MS, max_in_flight=8)
        expected = {}
        for offset, record in p.in_flight.items():
            state = record.state
            if state is RecordState.ACQUIRED:
                state = RecordState.ARCHIVED if record.delivery_count >= LIMIT else RecordState.AVAILABLE
            expected[offset] = (state, record.delivery_count)
        assert restored.end_offset == p.end_offset and restored.start_offset >= p.start_offset
        for offset in range(p.start_offset, restored.start_offset):
            assert expected[offset][0] in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED), offset
        assert {o: (r.state, r.delivery_count) for o, r in restored.in_flight.items()} == {
            o: v for o, v in expected.items() if o >= restored.start_offset}
        assert SharePartition.restore(restored.snapshot(), delivery_count_limit=LIMIT).snapshot() == restored.snapshot()

    def teardown(self):
        """With everyone gone, what is not done is handed out again, up to its limit."""
        self.now_ms += LOCK_MS
        self.partition.expire_locks(self.now_ms)
        again = {o for r in self.partition.acquire("z", 10_000, self.log_end, self.now_ms) for o in r.offsets}
        for offset in range(self.partition.start_offset, self.partition.end_offset):
            record = self.partition.in_flight[offset]
            assert offset in again or record.state is RecordState.ARCHIVED or offset in self.accepted


SharePartitionMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_members_never_share_a_record_and_accepted_records_never_come_back = SharePartitionMachine.TestCase


def test_a_poison_record_is_archived_at_the_delivery_limit_and_the_window_moves_past_it():
    partition = SharePartition(10, delivery_count_limit=2, lock_duration_ms=100)
    first = partition.acquire("a", 2, log_end_offset=12, now_ms=0)
    assert [(r.first_offset, r.last_offset, r.delivery_count) for r in first] == [(10, 11, 1)]
    partition.acknowledge("a", [11], AcknowledgeType.ACCEPT)
    assert partition.start_offset == 10, "11 is done, 10 is not: SPSO waits for it"
    partition.acknowledge("a", [10], AcknowledgeType.RELEASE)
    assert [(r.first_offset, r.last_offset, r.delivery_count) for r in partition.acquire("b", 5, 12, 0)] == [(10, 10, 2)]
    assert partition.expire_locks(100) == 1, "b died: its lock expires"
    assert partition.start_offset == 12 and not partition.in_flight, "10 is archived at its limit: SPSO moves past it"
    assert partition.acquire("c", 5, 12, 200) == []
    with pytest.raises(InvalidRecordStateError):
        partition.acknowledge("c", [10], AcknowledgeType.ACCEPT)
