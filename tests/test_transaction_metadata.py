"""The transaction coordinator's state machine per transactional id: Kafka's states and
transitions, fencing, retries (KIP-360), TV2's epoch bump at every end (KIP-890), epoch
exhaustion, timeouts and expiration; and a state machine test of producers racing on
one transactional id."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rayk.coordinator.transaction import transaction_metadata as tm
from rayk.coordinator.transaction.transaction_metadata import S, TV1, TV2, TransactionMetadata
from rayk.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    KafkaError,
    ProducerFencedError,
)

A, B = ("orders", 0), ("orders", 1)


def initialized(epoch: int = 0, pid: int = 7) -> TransactionMetadata:
    md, fenced = tm.init_producer_id(tm.new_metadata("tx", pid, 60_000, 0), 60_000, None, 1, new_producer_id=99)
    assert not fenced and md.producer_epoch == 0
    return md if epoch == 0 else TransactionMetadata("tx", pid, epoch, 60_000, S.EMPTY)


def test_kafkas_state_ids_names_and_previous_states():
    assert [(s.id, s.display_name) for s in S] == [
        (0, "Empty"), (1, "Ongoing"), (2, "PrepareCommit"), (3, "PrepareAbort"), (4, "CompleteCommit"),
        (5, "CompleteAbort"), (6, "Dead"), (7, "PrepareEpochFence"),
    ]  # fmt: skip
    assert S.from_id(3) is S.PREPARE_ABORT
    assert tm.VALID_PREVIOUS[S.COMPLETE_COMMIT] == {S.PREPARE_COMMIT}
    assert tm.VALID_PREVIOUS[S.PREPARE_COMMIT] == {S.ONGOING}
    with pytest.raises(ValueError):
        S.from_id(8)


def test_a_transaction_goes_ongoing_prepare_complete_and_a_retried_end_succeeds():
    md = initialized()
    md = tm.add_partitions(md, 7, 0, frozenset({A}), now_ms=10)
    assert (md.state, md.partitions, md.txn_start_timestamp_ms) == (S.ONGOING, {A}, 10)
    assert tm.add_partitions(md, 7, 0, frozenset({A}), now_ms=11) is None, "nothing new: nothing to write"
    md = tm.add_partitions(md, 7, 0, frozenset({B}), now_ms=12)
    assert md.partitions == {A, B} and md.txn_start_timestamp_ms == 10
    md = tm.end_transaction(md, 7, 0, commit=True, now_ms=13)
    assert md.state is S.PREPARE_COMMIT and md.producer_epoch == 0, "TV1 keeps its epoch"
    with pytest.raises(ConcurrentTransactionsError):
        tm.end_transaction(md, 7, 0, commit=True, now_ms=14)
    with pytest.raises(ConcurrentTransactionsError):
        tm.add_partitions(md, 7, 0, frozenset({A}), now_ms=14)
    with pytest.raises(InvalidTxnStateError):
        tm.end_transaction(md, 7, 0, commit=False, now_ms=14)
    md = tm.complete(md, now_ms=15)
    assert (md.state, md.partitions) == (S.COMPLETE_COMMIT, frozenset())
    assert tm.end_transaction(md, 7, 0, commit=True, now_ms=16) is None, "a retry whose answer was lost"
    with pytest.raises(InvalidTxnStateError):
        tm.end_transaction(md, 7, 0, commit=False, now_ms=16)
    assert tm.add_partitions(md, 7, 0, frozenset({B}), now_ms=17).txn_start_timestamp_ms == 17


def test_ending_nothing_is_an_invalid_state_and_strangers_are_told_apart_from_zombies():
    md = initialized()
    with pytest.raises(InvalidTxnStateError):
        tm.end_transaction(md, 7, 0, commit=True, now_ms=1)
    with pytest.raises(InvalidProducerIdMappingError):
        tm.add_partitions(md, 8, 0, frozenset({A}), now_ms=1)
    with pytest.raises(ProducerFencedError):
        tm.add_partitions(md, 7, 1, frozenset({A}), now_ms=1)


def test_a_new_instance_fences_the_open_transaction_with_a_bumped_epoch_and_retries():
    zombie = tm.add_partitions(initialized(), 7, 0, frozenset({A}), now_ms=5)
    md, aborts_first = tm.init_producer_id(zombie, 60_000, None, 6, new_producer_id=99)
    assert aborts_first and (md.state, md.producer_epoch, md.partitions) == (S.PREPARE_ABORT, 1, {A})
    with pytest.raises(ConcurrentTransactionsError):
        tm.init_producer_id(md, 60_000, None, 7, new_producer_id=99)  # the client retries until the abort is done
    with pytest.raises(ProducerFencedError):
        tm.end_transaction(md, 7, 0, commit=True, now_ms=7)  # the zombie can end nothing
    md = tm.complete(md, now_ms=8)
    md, aborts_first = tm.init_producer_id(md, 30_000, None, 9, new_producer_id=99)
    assert not aborts_first and (md.state, md.producer_epoch, md.txn_timeout_ms) == (S.EMPTY, 2, 30_000)
    with pytest.raises(ProducerFencedError):
        tm.add_partitions(md, 7, 0, frozenset({A}), now_ms=10)


def test_kip_360_a_producer_keeps_its_id_unless_another_instance_took_it():
    md = initialized()
    bumped, _ = tm.init_producer_id(md, 60_000, (7, 0), 2, new_producer_id=99)
    assert (bumped.producer_epoch, bumped.last_producer_epoch) == (1, 0)
    again, _ = tm.init_producer_id(bumped, 60_000, (7, 0), 3, new_producer_id=99)
    assert again.producer_epoch == 1, "a retry whose answer was lost gets the same epoch"
    with pytest.raises(ProducerFencedError):
        tm.init_producer_id(initialized(epoch=5), 60_000, (7, 3), 3, new_producer_id=99)
    with pytest.raises(ProducerFencedError):
        tm.init_producer_id(md, 60_000, (8, 0), 3, new_producer_id=99)
    other, _ = tm.init_producer_id(bumped, 60_000, None, 4, new_producer_id=99)
    assert (other.producer_epoch, other.last_producer_epoch) == (2, -1), "no retry can come back past a new instance"


def test_exhausted_epochs_rotate_to_a_new_producer_id():
    md = initialized(epoch=tm.MAX_PRODUCER_EPOCH - 1)
    rotated, _ = tm.init_producer_id(md, 60_000, None, 1, new_producer_id=99)
    assert (rotated.producer_id, rotated.producer_epoch, rotated.previous_producer_id) == (99, 0, 7)
    # KIP-360: a producer that asks with its exhausted id and epoch, and retries.
    continued, _ = tm.init_producer_id(md, 60_000, (7, tm.MAX_PRODUCER_EPOCH - 1), 1, new_producer_id=99)
    assert (continued.producer_id, continued.last_producer_epoch) == (99, tm.MAX_PRODUCER_EPOCH - 1)
    retried, _ = tm.init_producer_id(continued, 60_000, (7, tm.MAX_PRODUCER_EPOCH - 1), 2, new_producer_id=100)
    assert (retried.producer_id, retried.producer_epoch) == (99, 0), "the rotation's retry: the same id and epoch"


def test_tv2_bumps_the_epoch_at_every_end_and_its_retries_carry_the_old_one():
    md = tm.add_partitions(initialized(), 7, 0, frozenset({A}), now_ms=1, client_transaction_version=TV2)
    md = tm.end_transaction(md, 7, 0, commit=True, now_ms=2, client_transaction_version=TV2)
    assert (md.state, md.producer_epoch, md.last_producer_epoch) == (S.PREPARE_COMMIT, 1, 0)
    with pytest.raises(ConcurrentTransactionsError):
        tm.end_transaction(md, 7, 0, commit=True, now_ms=3, client_transaction_version=TV2)
    md = tm.complete(md, now_ms=4)
    assert tm.end_transaction(md, 7, 0, commit=True, now_ms=5, client_transaction_version=TV2) is None
    with pytest.raises(InvalidTxnStateError):
        tm.end_transaction(md, 7, 1, commit=True, now_ms=5, client_transaction_version=TV2)
    aborted = tm.end_transaction(md, 7, 1, commit=False, now_ms=5, client_transaction_version=TV2)
    assert (aborted.state, aborted.producer_epoch, aborted.txn_start_timestamp_ms) == (S.PREPARE_ABORT, 2, 5), (
        "KIP-890: a client unsure whether a transaction is open may abort")


def test_tv2_moves_to_its_next_producer_id_when_the_bump_takes_the_last_epoch():
    md = tm.add_partitions(initialized(epoch=tm.MAX_PRODUCER_EPOCH - 1), 7, tm.MAX_PRODUCER_EPOCH - 1, frozenset({A}),
                           now_ms=1, client_transaction_version=TV2)  # fmt: skip
    with pytest.raises(ValueError, match="next producer id"):
        tm.end_transaction(md, 7, md.producer_epoch, True, 2, TV2)
    md = tm.end_transaction(md, 7, md.producer_epoch, True, 2, TV2, next_producer_id=99)
    assert md.producer_epoch == tm.MAX_PRODUCER_EPOCH and md.next_producer_id == 99
    md = tm.complete(md, now_ms=3)
    assert (md.producer_id, md.producer_epoch, md.previous_producer_id, md.next_producer_id) == (99, 0, 7, -1)


def test_timeouts_and_expiration():
    md = tm.add_partitions(initialized(), 7, 0, frozenset({A}), now_ms=1_000)
    assert [tm.remaining_timeout_ms(md, now) for now in (1_000, 31_000, 61_001)] == [60_000, 30_000, 0]
    assert tm.remaining_timeout_ms(md, 1_000 - 3_600_000) == 60_000, "a start ahead of this clock: never past the timeout"
    assert not tm.expired(md, 10**12, 1000), "an open transaction never expires"
    idle = tm.complete(tm.end_transaction(md, 7, 0, False, 2_000), 3_000)
    assert tm.expired(idle, 3_000 + 7 * 86_400_000 + 1, 7 * 86_400_000) and not tm.expired(idle, 4_000, 7 * 86_400_000)


# ---------------------------------------------------------------------- producers racing on one id


class RacingProducers(RuleBasedStateMachine):
    """Instances of one transactional producer call the APIs in any order (each knows the
    producer id and epoch its last InitProducerId gave it; TV1 or TV2 at random). Whatever
    happens: only the newest instance changes anything, epochs never go back for a producer
    id, every transition is one Kafka allows, and a transaction ends the way it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.md = tm.new_metadata("tx", 1, 60_000, 0)
        self.next_pid = 2
        self.now = 0
        self.instances: list[tuple[int, int]] = []  # (producer id, epoch) per instance, as last told
        self.newest: int | None = None
        self.tv = TV1

    def _apply(self, new: TransactionMetadata | None) -> None:
        if new is None:
            return
        assert self.md.state in tm.VALID_PREVIOUS[new.state]
        if new.producer_id == self.md.producer_id:
            assert new.producer_epoch >= self.md.producer_epoch, "an epoch never goes back"
        self.md = new

    @rule(tv=st.sampled_from([TV1, TV2]))
    def a_new_instance_starts(self, tv: int) -> None:
        self.now += 1
        try:
            new, aborts_first = tm.init_producer_id(self.md, 60_000, None, self.now, self.next_pid)
        except ConcurrentTransactionsError:
            return
        self.next_pid += 1
        self._apply(new)
        if aborts_first:
            self._apply(tm.complete(self.md, self.now))  # the markers are written; the client retries
            self.newest = None  # every instance is fenced now
            return
        self.instances.append((new.producer_id, new.producer_epoch))
        self.newest, self.tv = len(self.instances) - 1, tv

    @rule(data=st.data(), partition=st.sampled_from([A, B]))
    def an_instance_adds_a_partition(self, data: st.DataObject, partition: tuple[str, int]) -> None:
        if not self.instances:
            return
        i = data.draw(st.integers(0, len(self.instances) - 1))
        self.now += 1
        try:
            self._apply(tm.add_partitions(self.md, *self.instances[i], frozenset({partition}), self.now, self.tv))
        except KafkaError:
            assert i != self.newest or self.md.state in tm.PREPARE_STATES
            return
        assert i == self.newest, "a fenced instance added a partition"

    @rule(data=st.data(), commit=st.booleans())
    def an_instance_ends_its_transaction(self, data: st.DataObject, commit: bool) -> None:
        if not self.instances:
            return
        i = data.draw(st.integers(0, len(self.instances) - 1))
        self.now += 1
        before = self.md
        try:
            new = tm.end_transaction(self.md, *self.instances[i], commit, self.now, self.tv, next_producer_id=self.next_pid)
        except KafkaError:
            return
        if new is None:
            return
        assert i == self.newest and before.state in (S.ONGOING, *tm.IDLE_STATES), "only the newest instance ends"
        assert new.state is (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT)
        self._apply(new)
        self._apply(tm.complete(self.md, self.now))
        assert self.md.state is (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
        self.instances[i] = (self.md.producer_id, self.md.producer_epoch)  # the answer carries the epoch (TV2)

    @invariant()
    def idle_states_hold_no_partitions(self) -> None:
        assert self.md.state is S.ONGOING or not self.md.partitions


RacingProducers.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRacingProducers = RacingProducers.TestCase


# ---------------------------------------------------------------------- __transaction_state records

from rayk.coordinator.transaction.transaction_records import (  # noqa: E402
    MalformedTransactionRecordError,
    decode_record,
    record_key,
    record_value,
)

written_states = st.sampled_from([s for s in S if s not in (S.DEAD, S.PREPARE_EPOCH_FENCE)])
epochs = st.integers(-1, tm.MAX_PRODUCER_EPOCH)
int64 = st.integers(-1, 2**63 - 1)


@st.composite
def metadata(draw) -> TransactionMetadata:
    state = draw(written_states)
    partitions = frozenset() if state in tm.IDLE_STATES else draw(
        st.frozensets(st.tuples(st.text(min_size=1, max_size=10), st.integers(0, 2**31 - 1)), max_size=5))
    return TransactionMetadata(
        draw(st.text(max_size=20)), draw(int64), draw(epochs), draw(st.integers(1, 2**31 - 1)), state, partitions,
        draw(epochs), draw(int64), draw(int64), draw(int64), draw(int64), draw(st.sampled_from([TV1, TV2])),
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(metadata())
def test_every_written_metadata_reads_back_exactly(md):
    assert decode_record(record_key(md.transactional_id), record_value(md)) == (md.transactional_id, md)
    assert decode_record(record_key(md.transactional_id), None) == (md.transactional_id, None), "a tombstone"


@settings(max_examples=300, deadline=None)
@given(metadata(), st.data())
def test_any_damage_is_the_exact_metadata_or_a_malformed_record(md, data):
    import msgpack

    value = record_value(md)
    fields = msgpack.unpackb(value)
    name = data.draw(st.sampled_from(sorted(fields)))
    fields[name] = data.draw(st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=5),
                                       st.just([["t", "x"]])))
    try:
        _, decoded = decode_record(record_key(md.transactional_id), msgpack.packb(fields))
    except MalformedTransactionRecordError:
        return
    assert isinstance(decoded, TransactionMetadata)
    assert decoded.state not in (S.DEAD, S.PREPARE_EPOCH_FENCE)
    assert decoded.state is S.ONGOING or decoded.state in tm.PREPARE_STATES or not decoded.partitions


@pytest.mark.parametrize("key, value", [
    (b"\xc1", None), (record_key("t")[:-1], None), (__import__("msgpack").packb(["group", "t"]), None),
    (record_key("t"), b"\x92"), (record_key("t"), __import__("msgpack").packb({"version": 2})),
])
def test_records_the_coordinator_cannot_have_written_are_malformed(key, value):
    with pytest.raises(MalformedTransactionRecordError):
        decode_record(key, value)
