"""Log compaction (log_cleaner.py and the Log's swap): a hypothesis model, crash cuts during
a clean, tombstones, the offset map's budget, producer state, and the compacted topic's
rules (keys required, no time retention)."""

from __future__ import annotations

import contextlib

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from rayk.errors import InvalidRecordError, LogClosedError
from rayk.storage import Log, LogConfig
from rayk.storage.log_cleaner import Throttler, clean, cleanable_state
from rayk.storage.records import (
    SimpleRecord,
    build_batch,
    decode_batches_columns,
    decode_records,
    filter_batch,
    iter_batches,
)
from rayk.storage.segment import LogSegment

NOW_MS = 1_700_000_000_000
KEYS = [b"k%d" % i for i in range(6)]
LATER_MS = NOW_MS + 10**9  # far past any tombstone's delete horizon


def read_all(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record, read as a consumer would, checking that the
    offsets only grow."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        if not result.records:
            break
        for batch in iter_batches(result.records):
            out += [(r.offset, r.key, r.value) for r in decode_records(batch.data)]
        offset = result.next_offset
    offsets = [o for o, _k, _v in out]
    assert offsets == sorted(set(offsets)), "offsets strictly increase"
    return out


def append(log: Log, records: list[tuple[bytes, bytes | None]], compression: str | None = None, **kwargs) -> None:
    batch = build_batch([SimpleRecord(v, k, (), NOW_MS) for k, v in records], compression=compression, **kwargs)
    log.append_as_leader(batch, 0)


MAX_BATCH_BYTES = 256


class CompactionMachine(RuleBasedStateMachine):
    """Appends keyed records and tombstones, rolls, moves the HW, advances the cleaner's
    clock, cleans (sometimes with a tiny offset map) and reopens; the model is every record
    ever appended, all stamped NOW_MS, and each tombstone's delete horizon. After a clean:
    each key's latest record is unchanged (or, a tombstone, gone with every older record
    of its key), records at or above the cleaned end are untouched, keys are unique below
    it, every record left is one appended at its offset, and a tombstone that is its key's
    latest below the cleaned end is there until `delete.retention.ms` after the first clean
    that kept it, then gone (KIP-534), however old its CreateTime is by then."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="rayk-compaction-"))
        self.appended: dict[int, tuple[bytes, bytes | None]] = {}
        self.abandoned: list[Log] = []  # "crashed" Logs: their files stay open until teardown
        self.now_ms = NOW_MS  # the cleaner's clock
        self.horizon_ms: dict[int, int] = {}  # tombstone offset -> its batch's delete horizon

    # The largest batch `append` makes is ~230 bytes (five records of 20-byte values, gzip's
    # framing around incompressible ones): smaller segments would refuse it (RECORD_LIST_TOO_LARGE).
    @initialize(segment_bytes=st.integers(MAX_BATCH_BYTES, 1500), delete_retention_ms=st.sampled_from([0, 1000, 10**12]))
    def open_log(self, segment_bytes: int, delete_retention_ms: int) -> None:
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            index_interval_bytes=64,
            cleanup_policy="compact",
            delete_retention_ms=delete_retention_ms,
        )
        self.log = Log(self.dir, self.config)

    @rule(
        records=st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(max_size=20))), min_size=1, max_size=5),
        compression=st.sampled_from([None, "gzip"]),
    )
    def append(self, records, compression) -> None:
        base = self.log.log_end_offset
        append(self.log, records, compression)
        for i, record in enumerate(records):
            self.appended[base + i] = record

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(fraction=st.floats(0, 1))
    def move_high_watermark(self, fraction: float) -> None:
        hw = self.log.high_watermark
        self.log.high_watermark = hw + int((self.log.log_end_offset - hw) * fraction)

    @rule(ms=st.sampled_from([1, 400, 999, 1000, 5000]))
    def advance_clock(self, ms: int) -> None:
        self.now_ms += ms

    @rule(small_map=st.booleans())
    def clean(self, small_map: bool) -> None:
        before = read_all(self.log)
        result = clean(self.log, self.now_ms, dedupe_buffer_bytes=1 if small_map else 1 << 20)
        after = read_all(self.log)
        if result is None:
            assert after == before
            return
        assert result.completed
        end = result.end_offset
        assert self.log.cleaner_offset == end
        assert [r for r in after if r[0] >= end] == [r for r in before if r[0] >= end], "the dirty rest is untouched"
        keys_below = [k for o, k, _v in after if o < end]
        assert len(keys_below) == len(set(keys_below)), "one record per key below the cleaned end"
        self.check_tombstones(before, after, end)

    def check_tombstones(self, before: list, after: list, end: int) -> None:
        present_before = {o for o, _k, _v in before}
        present_after = {o for o, _k, _v in after}
        latest_below_end = {k: o for o, (k, _v) in sorted(self.appended.items()) if o < end}
        for offset, (key, value) in self.appended.items():
            if value is not None or offset >= end or offset not in present_before:
                continue
            if latest_below_end[key] > offset:
                continue  # superseded: gone whatever its horizon
            if offset not in self.horizon_ms:  # the first clean to keep it sets its horizon
                self.horizon_ms[offset] = self.now_ms + self.config.delete_retention_ms
                assert offset in present_after, "the first clean that reaches a tombstone keeps it"
            elif self.now_ms < self.horizon_ms[offset]:
                assert offset in present_after, "a tombstone lives until its delete horizon"
            else:
                assert offset not in present_after, "a tombstone goes at the first clean past its delete horizon"

    @rule()
    def reopen_after_crash(self) -> None:
        """Abandon the Log without closing it, and re-read every segment from scratch."""
        self.abandoned.append(self.log)
        self.log = Log(self.dir, self.config, recovery_point=0, high_watermark=self.log.high_watermark,
                       cleaner_offset=self.log.cleaner_offset)

    @invariant()
    def holds_the_latest_of_every_key(self) -> None:
        if not hasattr(self, "log"):
            return
        present = read_all(self.log)
        for offset, key, value in present:
            assert self.appended[offset] == (key, value), "a record left is the one appended at its offset"
        for key in KEYS:
            offsets = [o for o, (k, _v) in self.appended.items() if k == key]
            if not offsets:
                continue
            latest = max(offsets)
            kept = [o for o, k, _v in present if k == key]
            if self.appended[latest][1] is not None or latest >= self.log.cleaner_offset:
                assert latest in kept, f"the latest record of {key!r} is kept"
            else:
                assert kept in ([], [latest]), "a deleted key never shows an older value"

    def teardown(self) -> None:
        import shutil

        # Every Log of the example, crashed ones included, gives back its files and mmaps
        # (each holds a few per segment: over a suite, leaked ones ran out of descriptors).
        for log in [*self.abandoned, *([self.log] if hasattr(self, "log") else [])]:
            with contextlib.suppress(Exception):  # a crashed one's segments may be gone
                log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


CompactionMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestCompaction = CompactionMachine.TestCase


def filled_log(path: Path, roll_every: int = 0, **config) -> Log:
    """40 records over three keys and a tombstone; with `roll_every`, segments of that many
    batches and room for several in one (so a clean merges them into groups)."""
    segment_bytes = 4000 if roll_every else 400
    log = Log(path, LogConfig(segment_bytes=segment_bytes, cleanup_policy="compact", **config))
    for i in range(40):
        append(log, [(KEYS[i % 3], b"v%d" % i)], compression="gzip" if i % 2 else None)
        if roll_every and i % roll_every == roll_every - 1:
            log.roll()
    append(log, [(KEYS[1], None)])  # a tombstone
    log.roll()
    log.high_watermark = log.log_end_offset
    return log


# The steps of Log.replace_segments that touch files: .cleaned -> .swap renames, the old
# segments' deletions, .swap -> segment-name renames. A crash before any of them leaves
# the old segments; after the first, the cleaned segment.
@pytest.mark.parametrize("roll_every", [0, 4])  # one segment per group; groups of several
@pytest.mark.parametrize("crash_at", range(12))
def test_a_crash_at_any_step_of_a_swap_loses_nothing(tmp_path, monkeypatch, crash_at, roll_every):
    log = filled_log(tmp_path, roll_every)
    before = read_all(log)
    latest = {k: (o, v) for o, k, v in before}
    calls = {"n": 0}

    class Crash(BaseException):
        pass

    def counting(original):
        def step(self, *args):
            calls["n"] += 1
            if calls["n"] > crash_at:
                raise Crash
            return original(self, *args)

        return step

    monkeypatch.setattr(LogSegment, "rename_files", counting(LogSegment.rename_files))
    monkeypatch.setattr(LogSegment, "delete", counting(LogSegment.delete))
    crashed = False
    try:
        clean(log, NOW_MS)
    except Crash:
        crashed = True
    monkeypatch.undo()
    reopened = Log(tmp_path, log.config, recovery_point=0, high_watermark=log.log_end_offset)
    after = read_all(reopened)
    assert {k: (o, v) for o, k, v in after} == latest, "every key's latest record survives"
    assert set(after) <= set(before), "nothing appears that was not appended"
    assert not [p for p in os.listdir(tmp_path) if p.endswith((".cleaned", ".swap"))]
    if crashed and crash_at >= 1:  # past the commit point: the first group is cleaned
        first_key_records = [r for r in after if r[0] < reopened.segment_base_offsets[1]]
        assert len({k for _o, k, _v in first_key_records}) == len(first_key_records)
    assert clean(reopened, NOW_MS).completed, "the next clean finishes the job"
    assert {k: (o, v) for o, k, v in read_all(reopened)} == latest
    reopened.close()


def test_a_follower_copies_a_compacted_log_across_its_gaps(tmp_path):
    leader = filled_log(tmp_path / "leader", roll_every=4)
    clean(leader, NOW_MS)
    follower = Log(tmp_path / "follower", leader.config)
    while follower.log_end_offset < leader.log_end_offset:
        result = leader.read(follower.log_end_offset, 300)
        follower.append_as_follower(result.records)
    assert read_all(follower) == read_all(leader)
    assert follower.log_end_offset == leader.log_end_offset


def test_truncating_into_a_gap_puts_the_leo_there_and_reads_past_it_progress(tmp_path):
    log = filled_log(tmp_path)
    clean(log, NOW_MS)
    kept = [o for o, _k, _v in read_all(log)]  # [38, 39, 40]
    gap = kept[0] - 1
    log.truncate_to(gap)
    assert log.log_end_offset == gap, "the LEO is the target, not the last batch before the gap"
    assert log.cleaner_offset <= gap
    result = log.read(0, 1 << 20)
    assert (result.records, result.next_offset) == (b"", gap), "nothing left below the LEO: the reader moves on"
    append(log, [(KEYS[0], b"after")])
    assert read_all(log) == [(gap, KEYS[0], b"after")]


def test_a_clean_that_a_truncation_overtook_does_not_move_the_cleaner_offset(tmp_path):
    log = filled_log(tmp_path)
    _segments, truncations = log.cleanable_segments(log.high_watermark)
    log.truncate_to(30)
    assert not log.advance_cleaner_offset(30, truncations)
    assert log.cleaner_offset == 0


def test_an_epoch_whose_first_batches_were_compacted_keeps_its_start_after_recovery(tmp_path):
    log = Log(tmp_path, LogConfig(cleanup_policy="compact", segment_bytes=400))

    def put(key, value, epoch):
        log.append_as_leader(build_batch([SimpleRecord(value, key, (), NOW_MS)]), epoch)

    put(KEYS[0], b"a", 0)
    put(KEYS[1], b"b", 1)  # epoch 1 starts at offset 1
    put(KEYS[2], b"c", 1)
    log.roll()
    put(KEYS[1], b"d", 1)  # supersedes offset 1, the first of epoch 1
    put(KEYS[0], b"e", 1)  # supersedes offset 0
    log.roll()
    log.high_watermark = log.log_end_offset
    clean(log, NOW_MS)
    assert [o for o, _k, _v in read_all(log)] == [2, 3, 4]
    before = log.end_offset_for_epoch(0)
    reopened = Log(tmp_path, log.config, recovery_point=0, cleaner_offset=log.cleaner_offset)
    assert reopened.end_offset_for_epoch(0) == before == (0, 1), "epoch 0 still ends where epoch 1 began"


def test_closing_aborts_a_clean_at_its_next_read(tmp_path):
    log = filled_log(tmp_path)
    log.abort_cleaning()
    with pytest.raises(LogClosedError):
        clean(log, NOW_MS)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".cleaned")]
    assert log.cleaner_offset == 0


def make_dirty(log: Log, key: bytes = KEYS[0]) -> None:
    """A new closed, committed segment, so that the next clean runs (and copies the log)."""
    append(log, [(key, b"newer")])
    log.roll()
    log.high_watermark = log.log_end_offset


def test_tombstones_outlive_one_clean_then_go_after_delete_retention(tmp_path):
    log = filled_log(tmp_path, delete_retention_ms=60_000)
    clean(log, LATER_MS)
    assert (40, KEYS[1], None) in read_all(log), "the first clean keeps the tombstone, however old"
    make_dirty(log)
    clean(log, LATER_MS + 59_999)
    assert (40, KEYS[1], None) in read_all(log), "kept for delete.retention.ms after the first clean"
    make_dirty(log, KEYS[2])
    clean(log, LATER_MS + 60_000)
    keys = [k for _o, k, _v in read_all(log)]
    assert KEYS[1] not in keys, "the tombstone and every older record of its key are gone"


DAY_MS = 86_400_000


def test_a_tombstone_with_an_old_create_time_lives_delete_retention_ms_from_the_first_clean_that_kept_it(tmp_path):
    log = Log(tmp_path, LogConfig(segment_bytes=400, cleanup_policy="compact", delete_retention_ms=DAY_MS))
    append(log, [(KEYS[0], b"v")])
    tombstone_ms = NOW_MS - 30 * DAY_MS  # a producer's clock, or a replayed record: a month old
    log.append_as_leader(build_batch([SimpleRecord(None, KEYS[0], (), tombstone_ms)]), 0)
    log.roll()
    log.high_watermark = log.log_end_offset
    first_clean_ms = NOW_MS
    clean(log, first_clean_ms)
    for now_ms in (first_clean_ms + 1, first_clean_ms + DAY_MS // 2, first_clean_ms + DAY_MS - 1):
        make_dirty(log, KEYS[1])
        clean(log, now_ms)
        assert (1, KEYS[0], None) in read_all(log), f"a consumer has until the horizon to see it ({now_ms - first_clean_ms} ms)"
    make_dirty(log, KEYS[1])
    clean(log, first_clean_ms + DAY_MS)
    assert KEYS[0] not in [k for _o, k, _v in read_all(log)], "at the horizon it goes, with the value it deleted"


def test_the_first_clean_writes_the_delete_horizon_into_the_tombstones_batch(tmp_path):
    log = Log(tmp_path, LogConfig(segment_bytes=400, cleanup_policy="compact", delete_retention_ms=DAY_MS))
    append(log, [(KEYS[0], b"v")])
    old_ms = NOW_MS - 30 * DAY_MS
    tombstones = [SimpleRecord(b"kept", KEYS[1], (), old_ms + 9), SimpleRecord(None, KEYS[0], (), old_ms)]
    log.append_as_leader(build_batch(tombstones, compression="gzip"), 0)
    log.roll()
    log.high_watermark = log.log_end_offset
    clean(log, NOW_MS)

    (batch,) = list(iter_batches(log.read(1, 1 << 20).records))
    header = batch.header
    assert header.attributes & 0x40, "the delete horizon flag (Kafka's DELETE_HORIZON_FLAG_MASK)"
    assert header.base_timestamp == header.delete_horizon_ms == NOW_MS + DAY_MS
    assert header.max_timestamp == old_ms + 9, "maxTimestamp is still the records' largest"
    assert batch.is_valid(), "the CRC covers the new attributes and baseTimestamp"
    assert [(r.offset, r.timestamp_ms) for r in decode_records(batch.data)] == [(1, old_ms + 9), (2, old_ms)]
    (closed,) = log.cleanable_segments(log.high_watermark)[0]
    assert closed.max_timestamp_ms == closed.first_batch_timestamp_ms == old_ms + 9, "the segment's times are records'"
    found = log.offset_for_timestamp(old_ms + 1)
    assert (found.timestamp_ms, found.offset) == (old_ms + 9, 1), "the time index knows the records' times"
    assert log.offset_for_timestamp(NOW_MS + 1) is None, "nothing in the log is as late as the horizon"

    make_dirty(log, KEYS[2])
    clean(log, NOW_MS + 1000)
    again = next(iter_batches(log.read(1, 1 << 20).records))
    assert bytes(again.data) == bytes(batch.data), "a later clean keeps the first one's horizon"

    reopened = Log(tmp_path, log.config, recovery_point=0, high_watermark=log.high_watermark,
                   cleaner_offset=log.cleaner_offset)  # recovery re-reads every batch and checks its CRC
    assert reopened.truncated_on_recovery_bytes == 0
    assert (2, KEYS[0], None) in read_all(reopened)
    recovered = next(iter_batches(reopened.read(1, 1 << 20).records))
    assert recovered.header.delete_horizon_ms == NOW_MS + DAY_MS
    reopened.close()


def test_a_small_offset_map_cleans_in_several_passes(tmp_path):
    log = filled_log(tmp_path)
    ends = []
    while (result := clean(log, NOW_MS, dedupe_buffer_bytes=1)) is not None:
        ends.append(result.end_offset)
    assert len(ends) > 2 and ends == sorted(ends)
    assert cleanable_state(log, NOW_MS).dirty_bytes == 0
    assert len(read_all(log)) <= 4  # three keys and the tombstone


def test_cleanable_state_measures_the_dirty_ratio_and_the_lags(tmp_path):
    log = filled_log(tmp_path)
    state = cleanable_state(log, NOW_MS)
    assert state.clean_bytes == 0 and state.dirty_bytes == log.size_bytes and state.needs_cleaning(0.5)
    clean(log, NOW_MS)
    state = cleanable_state(log, NOW_MS)
    assert state.dirty_bytes == 0 and not state.needs_cleaning(0.0)
    lagging = Log(tmp_path / "lag", LogConfig(cleanup_policy="compact", min_compaction_lag_ms=1000, max_compaction_lag_ms=5000))
    append(lagging, [(KEYS[0], b"a")])
    lagging.roll()
    lagging.high_watermark = lagging.log_end_offset
    assert cleanable_state(lagging, NOW_MS + 500).dirty_bytes == 0, "younger than min.compaction.lag.ms"
    young = cleanable_state(lagging, NOW_MS + 2000)
    assert young.dirty_bytes > 0 and not young.max_lag_passed and young.needs_cleaning(0.5)
    assert cleanable_state(lagging, NOW_MS + 6000).max_lag_passed
    assert not cleanable_state(lagging, NOW_MS + 2000).needs_cleaning(1.1)
    assert cleanable_state(lagging, NOW_MS + 6000).needs_cleaning(1.1), "max.compaction.lag.ms forces a clean"


def test_the_high_watermark_bounds_the_clean(tmp_path):
    log = filled_log(tmp_path)
    log.high_watermark = 10
    result = clean(log, NOW_MS)
    assert result.end_offset <= 10
    assert [r for r in read_all(log) if r[0] >= 10] == [(o, KEYS[o % 3], b"v%d" % o) for o in range(10, 40)] + [
        (40, KEYS[1], None)
    ]


def test_idempotent_producer_state_survives_cleaning(tmp_path):
    log = Log(tmp_path, LogConfig(segment_bytes=300, cleanup_policy="compact"))
    for seq in range(8):
        append(log, [(KEYS[0], b"x%d" % seq)], producer_id=7, producer_epoch=0, base_sequence=seq)
    append(log, [(KEYS[0], b"last")])
    log.roll()
    log.high_watermark = log.log_end_offset
    state_before = {pid: list(e.batches) for pid, e in log.producer_state.producers.items()}
    clean(log, NOW_MS)
    assert read_all(log) == [(8, KEYS[0], b"last")]
    for snapshot in tmp_path.glob("*.snapshot"):
        snapshot.unlink()  # rebuild the state from the batches alone
    log.close()
    for snapshot in tmp_path.glob("*.snapshot"):
        snapshot.unlink()
    reopened = Log(tmp_path, log.config, high_watermark=log.log_end_offset)
    assert {pid: list(e.batches) for pid, e in reopened.producer_state.producers.items()} == state_before


def test_a_thinned_batch_decodes_with_its_offsets(tmp_path):
    batch = build_batch([SimpleRecord(b"v%d" % i, KEYS[i], (), NOW_MS + i) for i in range(5)], compression="gzip",
                        base_offset=100)
    thinned = filter_batch(batch, lambda offset, _ts, _key, _tomb: offset in (101, 103), keep_empty=False)
    header = next(iter_batches(thinned)).header
    assert (header.base_offset, header.last_offset_delta, header.record_count) == (100, 4, 2)
    assert header.max_timestamp == NOW_MS + 3
    assert [(r.offset, r.value, r.timestamp_ms) for r in decode_records(thinned)] == [
        (101, b"v1", NOW_MS + 1), (103, b"v3", NOW_MS + 3)
    ]
    _headers, columns = decode_batches_columns([thinned])
    assert columns[0] == (101).to_bytes(8, "little") + (103).to_bytes(8, "little")
    assert filter_batch(batch, lambda *_: True, keep_empty=False) == batch
    assert filter_batch(batch, lambda *_: False, keep_empty=False) is None
    empty = next(iter_batches(filter_batch(batch, lambda *_: False, keep_empty=True))).header
    assert (empty.base_offset, empty.last_offset_delta, empty.record_count) == (100, 4, 0)


def test_a_compacted_topic_refuses_records_without_a_key_and_keeps_old_segments(tmp_path):
    log = Log(tmp_path, LogConfig(cleanup_policy="compact", retention_ms=1, segment_bytes=200))
    with pytest.raises(InvalidRecordError, match="key"):
        append(log, [(None, b"v")])
    assert log.log_end_offset == 0
    for i in range(10):
        append(log, [(KEYS[i % 2], b"v")])
    log.high_watermark = log.log_end_offset
    assert log.delete_expired_segments(NOW_MS + 10**9) == 0, "compact only: no time retention"
    log.update_config(LogConfig(cleanup_policy="compact,delete", retention_ms=1, segment_bytes=200))
    assert log.delete_expired_segments(NOW_MS + 10**9) > 0, "compact,delete: retention too"


def test_a_log_with_an_empty_cleanup_policy_keeps_every_record_and_takes_keyless_ones(tmp_path):
    """cleanup.policy "" (neither): retention deletes nothing, however old, and the log is
    not compacted, so records need no key."""
    log = Log(tmp_path, LogConfig(cleanup_policy="", retention_ms=1, retention_bytes=1, segment_bytes=200))
    for i in range(10):
        append(log, [(None if i % 2 else KEYS[0], b"v")])
    log.high_watermark = log.log_end_offset
    assert len(log.segment_base_offsets) > 1 and log.delete_expired_segments(LATER_MS) == 0
    assert [offset for offset, _, _ in read_all(log)] == list(range(10))
    assert not log.config.compacts


def test_the_records_without_a_key_are_named_by_their_index_in_the_batch(tmp_path):
    """KIP-467: a batch of 100 records, 10 without a key, is refused naming those 10, so
    that a client fails them and may send the other 90 again; nothing is written."""
    log = Log(tmp_path, LogConfig(cleanup_policy="compact"))
    keyless = set(range(3, 100, 10))
    with pytest.raises(InvalidRecordError) as refused:
        append(log, [(None if i in keyless else KEYS[i % 6], b"v%d" % i) for i in range(100)], compression="lz4")
    assert [e.batch_index for e in refused.value.record_errors] == sorted(keyless)
    assert all("without a key" in e.message for e in refused.value.record_errors)
    assert "10 of the 100 records" in str(refused.value)
    assert log.log_end_offset == 0


def test_the_records_without_a_key_are_named_within_the_first_batch_that_has_any(tmp_path):
    """Indexes count within a batch, as Kafka's do: a request's later batch is named alone."""
    log = Log(tmp_path, LogConfig(cleanup_policy="compact"))
    first = build_batch([SimpleRecord(b"v", KEYS[0], (), NOW_MS)] * 3)
    second = build_batch([SimpleRecord(b"v", None if i in (1, 4) else KEYS[1], (), NOW_MS) for i in range(5)])
    with pytest.raises(InvalidRecordError) as refused:
        log.append_as_leader(first + second + second, 0)
    assert [e.batch_index for e in refused.value.record_errors] == [1, 4]
    assert log.log_end_offset == 0


def test_throttler_holds_the_rate():
    now = [0.0]
    slept = []
    throttler = Throttler(1000, clock=lambda: now[0], sleep=lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    for _ in range(10):
        throttler.acquire(500)
    assert now[0] == pytest.approx(5.0)
    assert sum(slept) == pytest.approx(5.0)
