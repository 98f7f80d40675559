"""The log side of transactions: open transactions in the producer state, markers, the
aborted-transaction index (`.txnindex`), the last stable offset, and what a read_committed
reader sees, through appends, followers, truncation, snapshots, recovery and compaction.
The state machine at the end checks all of it against a reference model."""

from __future__ import annotations

import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rayk.errors import InvalidProducerEpochError, InvalidRecordError, TransactionCoordinatorFencedError
from rayk.storage import Log, LogConfig
from rayk.storage.control_records import build_end_txn_marker
from rayk.storage.log_cleaner import clean
from rayk.storage.read_committed import committed_batches
from rayk.storage.records import BatchHeader, SimpleRecord, build_batch
from rayk.storage.transaction_index import AbortedTxn

NOW_MS = int(time.time() * 1000)  # markers take the wall clock: no time-based roll between


def txn_batch(pid: int, seq: int, values: list[bytes], epoch: int = 0, keys: list[bytes] | None = None) -> bytes:
    keys = keys or [None] * len(values)
    return build_batch([SimpleRecord(v, k, (), NOW_MS) for v, k in zip(values, keys)], producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq, is_transactional=True)  # fmt: skip


def append_txn(log: Log, records: bytes):
    """A transactional batch as a leader appends it once the coordinator verified it (KIP-890)."""
    producer_id = BatchHeader.parse(records).producer_id
    return log.append_as_leader(records, 0, allow_transactional=True, verification_guard=log.verification_guard(producer_id))


def plain(values: list[bytes], keys: list[bytes] | None = None) -> bytes:
    keys = keys or [None] * len(values)
    return build_batch([SimpleRecord(v, k, (), NOW_MS) for v, k in zip(values, keys)])


def committed_values(log: Log, start_offset: int = 0) -> list[bytes]:
    """What a read_committed consumer reads from `start_offset` (a fetch at a time)."""
    values, offset = [], start_offset
    while True:
        result = log.read(offset, 1 << 20, max_offset=log.last_stable_offset)
        if result.next_offset == offset:
            return values
        aborted = [(t.producer_id, t.first_offset) for t in log.aborted_transactions(offset, result.next_offset)]
        values += [r.value for b in committed_batches(result.records, aborted) for r in b.records()]
        offset = result.next_offset


def test_an_open_transaction_holds_the_lso_until_its_marker_is_below_the_hw(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(plain([b"p0"]), 0)
    append_txn(log, txn_batch(7, 0, [b"t0", b"t1"]))  # offsets 1-2
    log.append_as_leader(plain([b"p3"]), 0)
    log.high_watermark = 4
    assert log.last_stable_offset == 1, "stops at the open transaction's first offset"
    assert committed_values(log) == [b"p0"]
    log.append_txn_marker(7, 0, commit=True, coordinator_epoch=0, leader_epoch=0)  # offset 4
    log.high_watermark = 4
    assert log.last_stable_offset == 1, "the marker is not below the HW yet: the outcome may still be truncated"
    log.high_watermark = 5
    assert log.last_stable_offset == 5
    assert committed_values(log) == [b"p0", b"t0", b"t1", b"p3"]
    assert not list(tmp_path.glob("*.txnindex")), "a commit is not indexed"


def test_an_abort_is_indexed_in_the_markers_segment_as_kafka_writes_it(tmp_path):
    log = Log(tmp_path)
    append_txn(log, txn_batch(7, 0, [b"a0"]))  # 0
    append_txn(log, txn_batch(8, 0, [b"b1"]))  # 1
    log.roll()
    append_txn(log, txn_batch(7, 1, [b"a2"]))  # 2
    log.append_txn_marker(7, 0, commit=False, coordinator_epoch=3, leader_epoch=0)  # 3
    log.append_as_leader(plain([b"p4"]), 0)  # 4
    log.append_txn_marker(8, 0, commit=True, coordinator_epoch=3, leader_epoch=0)  # 5
    log.high_watermark = 6
    # One entry, in the segment holding the abort marker; its LSO is producer 8's open transaction.
    assert (tmp_path / f"{2:020d}.txnindex").read_bytes() == struct.pack(">hqqqq", 0, 7, 0, 3, 1)
    assert not (tmp_path / f"{0:020d}.txnindex").exists()
    assert log.aborted_transactions(0, 6) == [AbortedTxn(7, 0, 3, 1)], "found from the earlier segment"
    assert log.aborted_transactions(4, 6) == [], "the range starts after the marker"
    assert committed_values(log) == [b"b1", b"p4"]


def test_markers_from_a_fenced_coordinator_or_producer_epoch_are_refused_and_change_nothing(tmp_path):
    log = Log(tmp_path)
    append_txn(log, txn_batch(7, 0, [b"a"], epoch=2))
    log.append_txn_marker(7, 2, commit=True, coordinator_epoch=5, leader_epoch=0)
    append_txn(log, txn_batch(7, 1, [b"b"], epoch=2))
    with pytest.raises(TransactionCoordinatorFencedError):
        log.append_txn_marker(7, 2, commit=False, coordinator_epoch=4, leader_epoch=0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_txn_marker(7, 1, commit=False, coordinator_epoch=5, leader_epoch=0)
    assert log.log_end_offset == 3
    log.append_txn_marker(7, 3, commit=False, coordinator_epoch=5, leader_epoch=0)  # KIP-890: the next epoch ends it
    assert log.aborted_transactions(0, 4) == [AbortedTxn(7, 2, 3, 4)]


def test_a_leader_takes_no_producer_control_batch_and_no_unvouched_transaction(tmp_path):
    log = Log(tmp_path)
    with pytest.raises(InvalidRecordError, match="control"):
        log.append_as_leader(build_end_txn_marker(7, 0, True, 0, NOW_MS), 0)
    with pytest.raises(InvalidRecordError, match="transactional"):
        log.append_as_leader(txn_batch(7, 0, [b"a"]), 0)
    assert log.log_end_offset == 0


def copy_to_follower(leader: Log, follower: Log) -> None:
    offset = follower.log_end_offset
    while offset < leader.log_end_offset:
        result = leader.read(offset, 1 << 20)
        follower.append_as_follower(result.records)
        offset = result.next_offset


def test_a_follower_builds_the_same_index_and_lso_from_the_leaders_batches(tmp_path):
    leader, follower = Log(tmp_path / "leader"), Log(tmp_path / "follower")
    append_txn(leader, txn_batch(7, 0, [b"a"]))
    append_txn(leader, txn_batch(8, 0, [b"b"]))
    leader.append_txn_marker(7, 0, commit=False, coordinator_epoch=0, leader_epoch=0)
    copy_to_follower(leader, follower)
    for log in (leader, follower):
        log.high_watermark = 3
    assert follower.last_stable_offset == leader.last_stable_offset == 1
    assert (tmp_path / "follower" / f"{0:020d}.txnindex").read_bytes() == (
        tmp_path / "leader" / f"{0:020d}.txnindex").read_bytes()  # fmt: skip


def test_truncating_away_a_marker_reopens_its_transaction(tmp_path):
    log = Log(tmp_path)
    append_txn(log, txn_batch(7, 0, [b"a"]))
    log.append_txn_marker(7, 0, commit=False, coordinator_epoch=0, leader_epoch=0)
    log.truncate_to(1)
    log.high_watermark = 1
    assert log.last_stable_offset == 0 and log.aborted_transactions(0, 1) == []
    assert (tmp_path / f"{0:020d}.txnindex").stat().st_size == 0


def test_an_open_transaction_survives_a_clean_restart_through_the_snapshot(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(plain([b"p"]), 0)
    append_txn(log, txn_batch(7, 0, [b"a"]))
    log.high_watermark = 2
    log.close()
    again = Log(tmp_path, high_watermark=2)
    assert again.last_stable_offset == 1
    again.append_txn_marker(7, 0, commit=False, coordinator_epoch=0, leader_epoch=0)
    again.high_watermark = 3
    assert again.aborted_transactions(0, 3) == [AbortedTxn(7, 1, 2, 3)] and committed_values(again) == [b"p"]


@pytest.mark.parametrize("damage", ["deleted", "torn"])
def test_recovery_rebuilds_a_lost_or_damaged_index_of_any_segment(tmp_path, damage):
    log = Log(tmp_path)
    append_txn(log, txn_batch(7, 0, [b"a"]))
    log.append_txn_marker(7, 0, commit=False, coordinator_epoch=0, leader_epoch=0)
    log.roll()
    log.append_as_leader(plain([b"p"]), 0)
    log.high_watermark = 3
    log.close()
    index = tmp_path / f"{0:020d}.txnindex"
    written = index.read_bytes()
    if damage == "deleted":
        index.unlink()
        again = Log(tmp_path, high_watermark=3, recovery_point=0)  # a crash: everything re-read
    else:
        index.write_bytes(written + b"\x00\x01")
        again = Log(tmp_path, high_watermark=3)  # a clean open: only the damage makes it re-read
    assert index.read_bytes() == written
    assert committed_values(again) == [b"p"]


def test_compaction_keeps_aborted_records_from_superseding_and_carries_the_index(tmp_path):
    log = Log(tmp_path, LogConfig(cleanup_policy="compact", segment_bytes=1 << 20))
    log.append_as_leader(plain([b"committed"], [b"k"]), 0)
    append_txn(log, txn_batch(7, 0, [b"aborted"], keys=[b"k"]))
    log.append_txn_marker(7, 0, commit=False, coordinator_epoch=0, leader_epoch=0)
    log.append_as_leader(plain([b"other"], [b"j"]), 0)
    log.roll()
    log.append_as_leader(plain([b"tail"], [b"t"]), 0)
    log.high_watermark = log.log_end_offset
    assert clean(log, NOW_MS).completed
    assert committed_values(log) == [b"committed", b"other", b"tail"]
    assert log.aborted_transactions(0, 5) == [AbortedTxn(7, 1, 2, 3)]


# ---------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Batch:
    base_offset: int
    count: int
    pid: int  # -1: a plain batch
    kind: str  # "data", "commit" or "abort"
    values: tuple[bytes, ...]


class TransactionsMachine(RuleBasedStateMachine):
    """Transactional and plain batches, commits and aborts of three producers, HW moves,
    rolls, follower-style truncation, clean restarts and crashes (snapshots or indexes
    lost, any recovery point); the log's LSO and read_committed view always equal the
    model's."""

    PRODUCERS = (1, 2, 3)

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="rayk-txn-model-"))
        self.batches: list[Batch] = []
        self.hw = 0
        self.counter = 0
        self.sequences = dict.fromkeys(self.PRODUCERS, 0)

    @initialize(segment_bytes=st.integers(150, 2000))
    def open_log(self, segment_bytes: int) -> None:
        self.config = LogConfig(segment_bytes=segment_bytes)
        self.log = Log(self.dir, self.config)

    def teardown(self) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def leo(self) -> int:
        return self.batches[-1].base_offset + self.batches[-1].count if self.batches else 0

    def _values(self, count: int) -> tuple[bytes, ...]:
        self.counter += 1
        return tuple(b"v%d-%d" % (self.counter, i) for i in range(count))

    # ------------------------------------------------------------------ the model's answers

    def _txns(self) -> tuple[dict[int, int], list[tuple[int, int, int, bool]]]:
        """Open transactions (pid -> first offset) and completed ones (pid, first, last, aborted)."""
        open_txns: dict[int, int] = {}
        completed = []
        for b in self.batches:
            if b.pid < 0:
                continue
            if b.kind == "data":
                open_txns.setdefault(b.pid, b.base_offset)
            else:
                first = open_txns.pop(b.pid, b.base_offset)
                completed.append((b.pid, first, b.base_offset, b.kind == "abort"))
        return open_txns, completed

    def model_lso(self) -> int:
        open_txns, completed = self._txns()
        unstable = [*open_txns.values(), *(first for _, first, last, _ in completed if last >= self.hw)]
        return min([self.hw, *unstable])

    def model_view(self) -> list[bytes]:
        lso = self.model_lso()
        _, completed = self._txns()
        aborted = [(pid, first, last) for pid, first, last, is_aborted in completed if is_aborted]
        out = []
        for b in self.batches:
            if b.kind != "data" or b.base_offset + b.count > lso:
                continue
            if b.pid >= 0 and any(pid == b.pid and first <= b.base_offset <= last for pid, first, last in aborted):
                continue
            out += b.values
        return out

    # ------------------------------------------------------------------ rules

    @rule(count=st.integers(1, 3))
    def append_plain(self, count: int) -> None:
        values = self._values(count)
        info = self.log.append_as_leader(plain(list(values)), 0)
        self.batches.append(Batch(info.first_offset, count, -1, "data", values))

    @rule(pid=st.sampled_from(PRODUCERS), count=st.integers(1, 3))
    def append_transactional(self, pid: int, count: int) -> None:
        values = self._values(count)
        info = append_txn(self.log, txn_batch(pid, self.sequences[pid], list(values)))
        self.sequences[pid] += count
        self.batches.append(Batch(info.first_offset, count, pid, "data", values))

    @rule(pid=st.sampled_from(PRODUCERS), commit=st.booleans())
    def end_transaction(self, pid: int, commit: bool) -> None:
        info = self.log.append_txn_marker(pid, 0, commit, coordinator_epoch=0, leader_epoch=0)
        self.batches.append(Batch(info.first_offset, 1, pid, "commit" if commit else "abort", ()))

    @precondition(lambda self: self.leo > self.hw)
    @rule(data=st.data())
    def advance_hw(self, data: st.DataObject) -> None:
        """Followers fetch whole batches, so the HW moves to a batch's end."""
        ends = [b.base_offset + b.count for b in self.batches if b.base_offset >= self.hw]
        self.hw = data.draw(st.sampled_from(ends))
        self.log.high_watermark = self.hw

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @precondition(lambda self: self.leo > self.hw)
    @rule(data=st.data())
    def truncate_above_the_hw(self, data: st.DataObject) -> None:
        """A follower cuts its uncommitted tail (at a batch boundary)."""
        keep = data.draw(st.sampled_from([i for i, b in enumerate(self.batches) if b.base_offset >= self.hw]))
        self.log.truncate_to(self.batches[keep].base_offset)
        del self.batches[keep:]
        for pid in self.PRODUCERS:  # a producer's sequence continues after what remains
            self.sequences[pid] = sum(b.count for b in self.batches if b.pid == pid and b.kind == "data")

    @rule()
    def clean_restart(self) -> None:
        self.log.close()
        self.log = Log(self.dir, self.config, high_watermark=self.hw, recovery_point=self.leo)

    @rule(lose_snapshots=st.booleans(), lose_indexes=st.booleans(), recover_from=st.floats(0, 1))
    def crash(self, lose_snapshots: bool, lose_indexes: bool, recover_from: float) -> None:
        """Everything was flushed; the process died without closing; files may be lost."""
        self.log.flush()
        bases = self.log.segment_base_offsets
        self.log = None  # type: ignore[assignment]
        point = int(self.leo * recover_from)  # recovery re-reads from the segment holding it
        first_reread = max(b for b in bases if b <= point)
        for path in self.dir.glob("*.snapshot") if lose_snapshots else ():
            path.unlink()
        # Below the recovery point everything was fsynced, so only what recovery re-reads
        # can be lost (as in Kafka, an index file missing there reads as no abort).
        for path in self.dir.glob("*.txnindex") if lose_indexes else ():
            if int(path.name[:20]) >= first_reread:
                path.unlink()
        self.log = Log(self.dir, self.config, high_watermark=self.hw, recovery_point=point)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def lso_and_read_committed_view_match_the_model(self) -> None:
        assert self.log.log_end_offset == self.leo
        assert self.log.last_stable_offset == self.model_lso()
        assert committed_values(self.log) == self.model_view()

    @invariant()
    def the_index_holds_exactly_the_aborted_transactions(self) -> None:
        _, completed = self._txns()
        expected = [(pid, first, last) for pid, first, last, aborted in completed if aborted]
        found = [(t.producer_id, t.first_offset, t.last_offset) for t in self.log.aborted_transactions(0, self.leo + 1)]
        assert found == expected


TransactionsMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestTransactions = TransactionsMachine.TestCase
