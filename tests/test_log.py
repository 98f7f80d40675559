"""Behaviour of rayk.storage.Log: offsets, reads, rolls, recovery, truncation, retention."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayk.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidFetchSizeError,
    InvalidRecordError,
    LogClosedError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
    UnsupportedForMessageFormatError,
)
from rayk.storage import Log, LogConfig
from rayk.storage import log as log_module
from rayk.storage.records import MAGIC_POS, SimpleRecord, build_batch, iter_batches

DAY_MS = 24 * 3600 * 1000


def batch(n: int = 3, size: int = 10, ts: int | None = 1_000, tag: str = "v") -> bytes:
    return build_batch(
        [SimpleRecord(f"{tag}{i}".encode().ljust(size, b"."), key=b"k", timestamp_ms=ts) for i in range(n)]
    )


def offsets_in(data: bytes) -> list[int]:
    return [r.offset for b in iter_batches(data) for r in b.records()]


def values_in(data: bytes) -> list[bytes]:
    return [r.value for b in iter_batches(data) for r in b.records()]


def file_sizes(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(path.iterdir())}


class Clock:
    def __init__(self, now_ms: int = 10 * DAY_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


# ---------------------------------------------------------------------- append and offsets


def test_append_as_leader_assigns_contiguous_offsets_from_zero(tmp_path):
    log = Log(tmp_path)
    first = log.append_as_leader(batch(3), leader_epoch=0)
    second = log.append_as_leader(batch(2), leader_epoch=0)
    assert (first.first_offset, first.last_offset) == (0, 2)
    assert (second.first_offset, second.last_offset) == (3, 4)
    assert log.log_end_offset == 5


def test_append_as_leader_stamps_leader_epoch_in_every_batch(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(2), leader_epoch=7)
    log.high_watermark = log.log_end_offset
    [stored] = list(iter_batches(log.read(0, 1 << 20).records))
    assert stored.header.partition_leader_epoch == 7
    assert stored.is_valid()


def test_append_as_leader_accepts_several_batches_in_one_call(tmp_path):
    log = Log(tmp_path)
    info = log.append_as_leader(batch(2) + batch(3), leader_epoch=0)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 4, 5)
    log.high_watermark = 5
    assert offsets_in(log.read(0, 1 << 20).records) == [0, 1, 2, 3, 4]


def test_append_from_an_older_leader_epoch_is_fenced(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(), leader_epoch=3)
    with pytest.raises(FencedLeaderEpochError):
        log.append_as_leader(batch(), leader_epoch=2)
    assert log.log_end_offset == 3


def test_leader_epoch_cache_records_first_offset_of_each_epoch(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.append_as_leader(batch(3), leader_epoch=2)
    assert [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.entries] == [(0, 0), (2, 6)]
    assert log.end_offset_for_epoch(0) == (0, 6)
    assert log.end_offset_for_epoch(2) == (2, 9)


def test_append_as_follower_requires_offsets_at_or_past_the_leo(tmp_path):
    """Below the LEO is refused; past it is a gap the leader's compaction left (Kafka's rule)."""
    leader, follower = Log(tmp_path / "l"), Log(tmp_path / "f")
    leader.append_as_leader(batch(3), leader_epoch=1)
    leader.append_as_leader(batch(3), leader_epoch=1)
    leader.high_watermark = leader.log_end_offset
    data = leader.read(0, 1 << 20).records
    first_batch, second_batch = (bytes(b.data) for b in iter_batches(data))
    follower.append_as_follower(data)
    assert follower.log_end_offset == 6
    assert follower.latest_epoch == 1
    with pytest.raises(UnexpectedAppendOffsetError):
        follower.append_as_follower(second_batch)
    assert follower.log_end_offset == 6
    gapped = Log(tmp_path / "g")
    gapped.append_as_follower(second_batch)
    assert (gapped.log_end_offset, gapped.read(0, 1 << 20).records) == (6, second_batch)


def test_follower_copy_is_byte_identical_to_leader(tmp_path):
    leader, follower = Log(tmp_path / "l"), Log(tmp_path / "f")
    for _ in range(5):
        leader.append_as_leader(batch(4), leader_epoch=0)
    leader.high_watermark = leader.log_end_offset
    follower.append_as_follower(leader.read(0, 1 << 20).records)
    follower.high_watermark = follower.log_end_offset
    assert follower.read(0, 1 << 20).records == leader.read(0, 1 << 20).records


# ---------------------------------------------------------------------- validation


def test_oversized_batch_is_rejected_and_leaves_no_byte(tmp_path):
    log = Log(tmp_path, LogConfig(max_message_bytes=200))
    log.append_as_leader(batch(1), leader_epoch=0)
    before = file_sizes(tmp_path)
    with pytest.raises(RecordTooLargeError):
        log.append_as_leader(batch(10, size=100), leader_epoch=0)
    assert file_sizes(tmp_path) == before and log.log_end_offset == 1


def test_a_stored_max_message_bytes_above_the_frame_limit_loads_and_the_limit_holds(tmp_path, monkeypatch):
    """An older version stored max.message.bytes above what one data plane frame carries:
    the topic still loads (no INVALID_CONFIG on replay) and the log refuses larger batches."""
    stored = LogConfig.from_properties({"max.message.bytes": str(200 * 1024 * 1024)})
    monkeypatch.setattr(log_module, "MAX_MESSAGE_BYTES_LIMIT", 500)  # the frame limit, made small
    log = Log(tmp_path, stored)
    log.append_as_leader(batch(1), leader_epoch=0)
    with pytest.raises(RecordTooLargeError):
        log.append_as_leader(batch(10, size=100), leader_epoch=0)
    assert log.log_end_offset == 1


def test_batch_larger_than_a_segment_is_rejected(tmp_path):
    log = Log(tmp_path, LogConfig(segment_bytes=200))
    with pytest.raises(RecordBatchTooLargeError):
        log.append_as_leader(batch(10, size=100), leader_epoch=0)
    assert log.log_end_offset == 0


def test_flipped_byte_is_rejected_as_corrupt_and_log_stays_readable(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(3, tag="good"), leader_epoch=0)
    bad = bytearray(batch(3))
    bad[-5] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(bytes(bad), leader_epoch=0)
    log.high_watermark = log.log_end_offset
    assert log.log_end_offset == 3
    assert values_in(log.read(0, 1 << 20).records)[0].startswith(b"good0")


def test_wrong_magic_is_rejected_with_clear_error(tmp_path):
    log = Log(tmp_path)
    bad = bytearray(batch())
    bad[MAGIC_POS] = 1
    with pytest.raises(UnsupportedForMessageFormatError, match="magic 1"):
        log.append_as_leader(bytes(bad), leader_epoch=0)
    assert log.log_end_offset == 0


def test_truncated_batch_is_rejected_and_nothing_of_the_valid_prefix_is_appended(tmp_path):
    log = Log(tmp_path)
    data = batch(2) + batch(2)[:-7]
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(data, leader_epoch=0)
    assert log.log_end_offset == 0
    assert (tmp_path / "00000000000000000000.log").stat().st_size == 0


# ---------------------------------------------------------------------- read


def test_read_from_the_middle_of_a_batch_returns_that_whole_batch(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(5), leader_epoch=0)
    log.high_watermark = 5
    result = log.read(3, 1 << 20)
    assert offsets_in(result.records) == [0, 1, 2, 3, 4]
    assert result.next_offset == 5


def test_read_at_leo_is_empty_and_beyond_or_below_is_out_of_range(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    assert log.read(3, 100).records == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(4, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)


def test_read_below_log_start_after_retention_is_out_of_range(tmp_path):
    clock = Clock()
    log = Log(tmp_path, LogConfig(segment_bytes=300, retention_ms=DAY_MS), clock_ms=clock)
    for _ in range(4):
        log.append_as_leader(batch(2, ts=clock.now_ms), leader_epoch=0)
    log.high_watermark = log.log_end_offset
    clock.now_ms += 2 * DAY_MS
    assert log.delete_expired_segments() > 0
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)


def test_read_stops_below_max_offset(tmp_path):
    log = Log(tmp_path)
    for _ in range(4):
        log.append_as_leader(batch(2), leader_epoch=0)
    result = log.read(0, 1 << 20, max_offset=4)
    assert offsets_in(result.records) == [0, 1, 2, 3]
    assert result.next_offset == 4
    assert log.read(4, 1 << 20, max_offset=4).records == b""


def test_read_max_offset_inside_a_batch_excludes_that_batch(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.append_as_leader(batch(3), leader_epoch=0)
    assert offsets_in(log.read(0, 1 << 20, max_offset=5).records) == [0, 1, 2]


def test_read_respects_max_bytes_in_whole_batches(tmp_path):
    log = Log(tmp_path)
    one = batch(2)
    for _ in range(5):
        log.append_as_leader(one, leader_epoch=0)
    result = log.read(0, 2 * len(one) + len(one) // 2)
    assert len(result.records) == 2 * len(one)


def test_read_returns_first_batch_even_if_larger_than_max_bytes(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(5, size=100), leader_epoch=0)
    assert offsets_in(log.read(0, 10).records) == [0, 1, 2, 3, 4]
    assert log.read(0, 10, min_one_batch=False).records == b""


def test_read_with_negative_max_bytes_is_invalid_fetch_size(tmp_path):
    with pytest.raises(InvalidFetchSizeError):
        Log(tmp_path).read(0, -1)


def test_read_finds_every_offset_across_many_segments_via_sparse_index(tmp_path):
    log = Log(tmp_path, LogConfig(segment_bytes=2000, index_interval_bytes=150))
    for i in range(100):
        log.append_as_leader(batch(2, tag=f"b{i}-"), leader_epoch=0)
    assert len(log.segment_base_offsets) == 5
    for offset in range(0, 200, 7):
        result = log.read(offset, 1)
        first = next(iter_batches(result.records)).header
        assert first.base_offset <= offset <= first.last_offset
        assert first.base_offset == offset - offset % 2


# ---------------------------------------------------------------------- high watermark


def test_high_watermark_cannot_exceed_leo(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.high_watermark = 3
    with pytest.raises(ValueError):
        log.high_watermark = 4
    assert log.high_watermark == 3


def test_high_watermark_given_at_open_is_clamped_to_the_log(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.close()
    assert Log(tmp_path, high_watermark=99).high_watermark == 3
    assert Log(tmp_path, high_watermark=2).high_watermark == 2


# ---------------------------------------------------------------------- roll rules


def test_segment_rolls_when_next_batch_would_not_fit(tmp_path):
    one = batch(2)
    log = Log(tmp_path, LogConfig(segment_bytes=len(one) * 3))
    for _ in range(7):
        log.append_as_leader(one, leader_epoch=0)
    assert log.segment_base_offsets == [0, 6, 12]
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [
        "00000000000000000000.log",
        "00000000000000000006.log",
        "00000000000000000012.log",
    ]


def test_segment_rolls_when_its_records_span_more_than_segment_ms(tmp_path):
    log = Log(tmp_path, LogConfig(segment_ms=1000))
    log.append_as_leader(batch(1, ts=10_000), leader_epoch=0)
    log.append_as_leader(batch(1, ts=10_900), leader_epoch=0)
    assert log.segment_base_offsets == [0]
    log.append_as_leader(batch(1, ts=11_001), leader_epoch=0)
    assert log.segment_base_offsets == [0, 2]


def test_segment_rolls_when_its_index_is_full(tmp_path):
    # Room for two offset index entries; an entry is added after every batch.
    log = Log(tmp_path, LogConfig(segment_index_bytes=16, index_interval_bytes=0))
    for _ in range(6):
        log.append_as_leader(batch(1), leader_epoch=0)
    assert len(log.segment_base_offsets) > 1


def test_segment_rolls_when_relative_offset_would_overflow(tmp_path):
    # Contiguous offsets cannot reach 2^31 records in one segment on a test's disk, so ask
    # the active segment directly, as the log does before every append.
    log = Log(tmp_path)
    log.truncate_fully_and_start_at(5)
    log.append_as_leader(batch(1), leader_epoch=0)
    active = log._local.segments[-1]
    assert active.should_roll(100, 1_000, 5 + (1 << 31), now_ms=0)
    assert not active.should_roll(100, 1_000, 5 + (1 << 31) - 1, now_ms=0)


def test_roll_starts_a_new_segment_at_leo_and_is_a_noop_when_empty(tmp_path):
    log = Log(tmp_path)
    log.roll()
    assert log.segment_base_offsets == [0]
    log.append_as_leader(batch(3), leader_epoch=0)
    log.roll()
    log.roll()
    assert log.segment_base_offsets == [0, 3]


def test_rolled_segment_indexes_are_trimmed_to_their_entries(tmp_path):
    log = Log(tmp_path, LogConfig(index_interval_bytes=0))
    for _ in range(4):
        log.append_as_leader(batch(1), leader_epoch=0)
    log.roll()
    assert (tmp_path / "00000000000000000000.index").stat().st_size == 3 * 8
    assert (tmp_path / "00000000000000000004.index").stat().st_size == 10 * 1024 * 1024


# ---------------------------------------------------------------------- reopen and recovery


def test_reopen_after_close_keeps_every_record(tmp_path):
    config = LogConfig(segment_bytes=500, index_interval_bytes=100)
    log = Log(tmp_path, config)
    for i in range(30):
        log.append_as_leader(batch(2, tag=f"r{i}-"), leader_epoch=0)
    before = b"".join(_read_all(log))
    segments = log.segment_base_offsets
    log.close()
    reopened = Log(tmp_path, config)
    assert reopened.log_end_offset == 60
    assert reopened.segment_base_offsets == segments
    assert b"".join(_read_all(reopened)) == before


def _read_all(log: Log) -> list[bytes]:
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        out.append(result.records)
        offset = result.next_offset
    return out


def test_recovery_cuts_a_torn_tail_back_to_the_last_valid_batch(tmp_path):
    log = Log(tmp_path)
    for _ in range(3):
        log.append_as_leader(batch(2), leader_epoch=0)
    log.close()
    segment = tmp_path / "00000000000000000000.log"
    size = segment.stat().st_size
    with open(segment, "r+b") as f:
        f.truncate(size - 10)  # a crash tore the last batch
    recovered = Log(tmp_path)
    assert recovered.log_end_offset == 4
    assert recovered.truncated_on_recovery_bytes == len(batch(2)) - 10
    recovered.append_as_leader(batch(1), leader_epoch=0)
    assert recovered.log_end_offset == 5


def test_recovery_cuts_at_a_corrupt_batch_and_drops_later_segments(tmp_path):
    one = batch(2)
    log = Log(tmp_path, LogConfig(segment_bytes=len(one) * 3))
    for _ in range(9):
        log.append_as_leader(one, leader_epoch=0)
    log.close()
    assert sorted(p.name for p in tmp_path.glob("*.log"))[-1] == "00000000000000000012.log"
    middle = tmp_path / "00000000000000000006.log"
    with open(middle, "r+b") as f:
        f.seek(len(one) + 40)
        f.write(b"\xff\xff")
    recovered = Log(tmp_path, LogConfig(segment_bytes=len(one) * 3), recovery_point=0)
    assert recovered.log_end_offset == 8
    assert recovered.segment_base_offsets == [0, 6]
    assert not (tmp_path / "00000000000000000012.log").exists()


def test_missing_index_is_rebuilt_from_the_log(tmp_path):
    config = LogConfig(segment_bytes=1000, index_interval_bytes=50)
    log = Log(tmp_path, config)
    for _ in range(20):
        log.append_as_leader(batch(2), leader_epoch=0)
    log.close()
    first_index = tmp_path / "00000000000000000000.index"
    original = first_index.read_bytes()
    first_index.unlink()
    (tmp_path / "00000000000000000000.timeindex").unlink()
    reopened = Log(tmp_path, config)
    assert first_index.read_bytes() == original
    assert offsets_in(reopened.read(5, 1).records)[0] == 4


def test_corrupt_index_is_rebuilt_from_the_log(tmp_path):
    config = LogConfig(segment_bytes=1000, index_interval_bytes=50)
    log = Log(tmp_path, config)
    for _ in range(20):
        log.append_as_leader(batch(2), leader_epoch=0)
    log.close()
    first_index = tmp_path / "00000000000000000000.index"
    original = first_index.read_bytes()
    first_index.write_bytes(b"\x00" * len(original))  # entries that do not grow
    Log(tmp_path, config).close()
    assert first_index.read_bytes() == original


def test_index_files_without_a_log_file_are_removed_on_open(tmp_path):
    Log(tmp_path).close()
    stray = tmp_path / "00000000000000000042.index"
    stray.write_bytes(b"\x00" * 8)
    Log(tmp_path)
    assert not stray.exists()


def test_unclean_shutdown_with_preallocated_index_recovers(tmp_path):
    config = LogConfig(index_interval_bytes=50)
    log = Log(tmp_path, config)
    for _ in range(10):
        log.append_as_leader(batch(2), leader_epoch=0)
    # No close(): the index file stays preallocated with zeros past its entries.
    log._local.segments[-1].offset_index._file.flush()
    reopened = Log(tmp_path, config)
    assert reopened.log_end_offset == 20
    assert offsets_in(reopened.read(13, 1).records)[0] == 12


# ---------------------------------------------------------------------- truncation


def test_truncate_to_removes_offsets_at_and_above_target(tmp_path):
    log = Log(tmp_path, LogConfig(segment_bytes=400))
    for _ in range(10):
        log.append_as_leader(batch(2), leader_epoch=0)
    log.high_watermark = 20
    log.truncate_to(8)
    assert log.log_end_offset == 8
    assert log.high_watermark == 8
    assert max(log.segment_base_offsets) <= 8
    info = log.append_as_leader(batch(1), leader_epoch=1)
    assert info.first_offset == 8


def test_truncate_inside_a_batch_removes_that_batch(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.truncate_to(4)
    assert log.log_end_offset == 3


def test_truncate_above_leo_changes_nothing(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.truncate_to(10)
    assert log.log_end_offset == 3


def test_truncate_also_truncates_the_leader_epoch_cache(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.append_as_leader(batch(3), leader_epoch=1)
    log.truncate_to(3)
    assert log.latest_epoch == 0
    log.close()
    assert Log(tmp_path).latest_epoch == 0


def test_truncate_at_the_leo_drops_an_epoch_led_without_appending(tmp_path):
    """A replica that led epoch 1 and appended nothing holds (1, LEO). Its new leader never
    had epoch 1 and answers OffsetsForLeaderEpoch(1) with the end of epoch 0, the LEO: the
    truncation must still drop (1, LEO), or every later fetch looks diverging for good."""
    log = Log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.assign_leader_epoch(1)
    assert log.latest_epoch == 1
    log.truncate_to(3)
    assert (log.log_end_offset, log.latest_epoch) == (3, 0)
    assert [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.entries] == [(0, 0)]
    log.close()
    assert Log(tmp_path).latest_epoch == 0


def test_truncate_fully_and_start_at_restarts_an_empty_log(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (100, 100, 100)
    assert log.append_as_leader(batch(1), leader_epoch=0).first_offset == 100
    assert [p.name for p in tmp_path.glob("*.log")] == ["00000000000000000100.log"]


# ---------------------------------------------------------------------- retention


def test_time_retention_deletes_old_segments_up_to_the_high_watermark_only(tmp_path):
    clock = Clock()
    one = batch(2, ts=clock.now_ms)
    log = Log(tmp_path, LogConfig(segment_bytes=len(one) * 2, retention_ms=DAY_MS), clock_ms=clock)
    for _ in range(6):
        log.append_as_leader(batch(2, ts=clock.now_ms), leader_epoch=0)
    assert log.segment_base_offsets == [0, 4, 8]
    log.high_watermark = 5  # the second segment [4, 8) is not fully replicated
    clock.now_ms += 2 * DAY_MS
    assert log.delete_expired_segments() == 1
    assert log.segment_base_offsets == [4, 8]
    assert log.log_start_offset == 4


def test_time_retention_keeps_segments_younger_than_retention(tmp_path):
    clock = Clock()
    log = Log(tmp_path, LogConfig(segment_bytes=300, retention_ms=DAY_MS), clock_ms=clock)
    for _ in range(6):
        log.append_as_leader(batch(2, ts=clock.now_ms), leader_epoch=0)
    log.high_watermark = log.log_end_offset
    clock.now_ms += DAY_MS // 2
    assert log.delete_expired_segments() == 0


def test_size_retention_deletes_oldest_segments_beyond_retention_bytes(tmp_path):
    one = batch(2)
    log = Log(tmp_path, LogConfig(segment_bytes=len(one) * 2, retention_bytes=len(one) * 3, retention_ms=-1))
    for _ in range(6):
        log.append_as_leader(one, leader_epoch=0)
    log.high_watermark = log.log_end_offset
    assert log.delete_expired_segments() == 1
    assert log.size_bytes == len(one) * 4
    assert log.log_start_offset == 4


def test_retention_of_every_segment_rolls_a_fresh_active_one(tmp_path):
    clock = Clock()
    log = Log(tmp_path, LogConfig(retention_ms=DAY_MS), clock_ms=clock)
    log.append_as_leader(batch(2, ts=clock.now_ms), leader_epoch=0)
    log.high_watermark = 2
    clock.now_ms += 2 * DAY_MS
    assert log.delete_expired_segments() == 1
    assert (log.segment_base_offsets, log.log_start_offset, log.log_end_offset) == ([2], 2, 2)
    assert log.append_as_leader(batch(1), leader_epoch=0).first_offset == 2


def test_a_moved_log_start_hides_the_records_below_it_and_retention_deletes_their_segments(tmp_path):
    """DeleteRecords: the log start moves inside a segment; whole segments below it go at the
    next retention check even for a compacted log (Kafka's deleteLogStartOffsetBreachedSegments)."""
    one = batch(2)
    log = Log(tmp_path, LogConfig(segment_bytes=len(one) * 2, retention_ms=-1, cleanup_policy="compact"))
    for _ in range(6):
        log.append_as_leader(one, leader_epoch=0)
    assert log.segment_base_offsets == [0, 4, 8]
    log.high_watermark = 10
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(11)  # above the high watermark
    assert log.maybe_increment_log_start_offset(5) and not log.maybe_increment_log_start_offset(3)
    assert log.log_start_offset == 5
    with pytest.raises(OffsetOutOfRangeError):
        log.read(4, 1 << 20)
    assert log.delete_expired_segments() == 1
    assert (log.segment_base_offsets, log.log_start_offset) == ([4, 8], 5)
    log.close()
    again = Log(tmp_path, LogConfig(segment_bytes=len(one) * 2), log_start_offset=5, high_watermark=10)
    assert again.log_start_offset == 5


# ---------------------------------------------------------------------- timestamps


def test_offset_for_timestamp_finds_earliest_record_at_or_after(tmp_path):
    log = Log(tmp_path, LogConfig(segment_bytes=600, index_interval_bytes=100))
    for i in range(40):
        log.append_as_leader(
            build_batch([SimpleRecord(b"x", timestamp_ms=1000 + 10 * i), SimpleRecord(b"y", timestamp_ms=1005 + 10 * i)]),
            leader_epoch=0,
        )
    assert log.offset_for_timestamp(0).offset == 0
    assert log.offset_for_timestamp(1005).offset == 1
    assert log.offset_for_timestamp(1006).offset == 2
    found = log.offset_for_timestamp(1203)
    assert (found.offset, found.timestamp_ms) == (41, 1205)
    assert log.offset_for_timestamp(5000) is None


def test_offset_for_timestamp_survives_reopen(tmp_path):
    config = LogConfig(segment_bytes=600, index_interval_bytes=100)
    log = Log(tmp_path, config)
    for i in range(40):
        log.append_as_leader(batch(1, ts=1000 + i), leader_epoch=0)
    log.close()
    assert Log(tmp_path, config).offset_for_timestamp(1025).offset == 25


# ---------------------------------------------------------------------- flush and close


def test_flush_messages_fsyncs_and_moves_the_recovery_point(tmp_path):
    log = Log(tmp_path, LogConfig(flush_messages=4))
    log.append_as_leader(batch(3), leader_epoch=0)
    assert log.recovery_point == 0
    log.append_as_leader(batch(3), leader_epoch=0)
    assert log.recovery_point == 6


def test_operations_after_close_raise_log_closed(tmp_path):
    log = Log(tmp_path)
    log.close()
    log.close()
    with pytest.raises(LogClosedError):
        log.append_as_leader(batch(), leader_epoch=0)
    with pytest.raises(LogClosedError):
        log.read(0, 10)


def test_delete_removes_the_directory(tmp_path):
    log = Log(tmp_path / "t-0")
    log.append_as_leader(batch(), leader_epoch=0)
    log.delete()
    assert not (tmp_path / "t-0").exists()


def test_leader_epoch_checkpoint_is_written_in_kafka_format(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(batch(2), leader_epoch=0)
    log.append_as_leader(batch(2), leader_epoch=4)
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n2\n0 0\n4 2\n"


def test_log_append_time_config_stamps_broker_time(tmp_path):
    from rayk.storage.records import TimestampType

    clock = Clock(123_456)
    log = Log(tmp_path, LogConfig(message_timestamp_type=TimestampType.LOG_APPEND_TIME), clock_ms=clock)
    info = log.append_as_leader(batch(2, ts=5), leader_epoch=0)
    assert info.log_append_time_ms == 123_456
    records = [r for b in iter_batches(log.read(0, 1 << 20).records) for r in b.records()]
    assert {r.timestamp_ms for r in records} == {123_456}


def test_log_never_imports_ray():
    import subprocess
    import sys

    code = "import sys, rayk.storage, rayk.storage.records; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], env={**os.environ}).returncode == 0


def test_create_time_batch_whose_max_timestamp_lies_is_rejected(tmp_path):
    import struct

    from rayk.storage.records import CRC_POS, MAX_TIMESTAMP_POS, compute_crc

    log = Log(tmp_path)
    lying = bytearray(build_batch([SimpleRecord(b"a", timestamp_ms=1000), SimpleRecord(b"b", timestamp_ms=5000)]))
    struct.pack_into(">q", lying, MAX_TIMESTAMP_POS, 1000)  # hides the record at 5000 from the time index
    struct.pack_into(">I", lying, CRC_POS, compute_crc(lying))
    with pytest.raises(InvalidRecordError, match="maxTimestamp"):
        log.append_as_leader(bytes(lying), leader_epoch=0)
    assert log.log_end_offset == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 5), st.sampled_from([1, 40, 900, 5_000, 12_000])), min_size=1, max_size=40),
       st.sampled_from([0, 4096, 1 << 20]))
def test_every_offset_reads_from_its_own_batch_however_far_from_an_index_entry(tmp_path_factory, batches, interval):
    """translate_offset walks headers from an index entry in reads of OFFSET_SCAN_CHUNK_BYTES:
    batches smaller and larger than a read, an entry per batch, none at all."""
    log = Log(tmp_path_factory.mktemp("scan"), LogConfig(index_interval_bytes=interval, max_message_bytes=1 << 20))
    first_offsets = []
    for count, size in batches:
        first_offsets.append(log.append_as_leader(batch(count, size), leader_epoch=0).first_offset)
    for i, (count, _) in enumerate(batches):
        for offset in range(first_offsets[i], first_offsets[i] + count):
            assert offsets_in(log.read(offset, 1).records)[0] == first_offsets[i]  # the batch holding it, whole
    log.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gaps=st.lists(st.integers(0, 5), min_size=1, max_size=25),
    index_interval_bytes=st.integers(0, 600),
    max_bytes=st.integers(1, 3000),
    max_offset_back=st.integers(0, 30),
)
def test_a_sliced_read_of_a_compacted_log_names_the_bytes_a_read_returns(
    tmp_path_factory, gaps, index_interval_bytes, max_bytes, max_offset_back
):
    """Offsets a compaction removed (gaps between batches) do not move where a sliced read
    (what a data plane answer sends by sendfile) ends, nor the offset after it."""
    from rayk.storage.file_slice import FileSlice

    log = Log(tmp_path_factory.mktemp("log"), LogConfig(index_interval_bytes=index_interval_bytes))
    offset = 0
    for i, gap in enumerate(gaps):
        offset += gap
        log.append_as_follower(build_batch([SimpleRecord(b"v" * (20 + 7 * i))] * (1 + i % 3), base_offset=offset))
        offset = log.log_end_offset
    max_offset = max(0, log.log_end_offset - max_offset_back)
    for start in range(log.log_end_offset):
        read = log.read(start, max_bytes, max_offset=max_offset)
        sliced = log.read(start, max_bytes, max_offset=max_offset, slice_min_bytes=1)
        assert sliced.next_offset == read.next_offset
        if isinstance(sliced.records, FileSlice):
            assert sliced.records.read() == read.records
            sliced.records.close()
        else:
            assert sliced.records == read.records == b""
    log.close()


def test_a_sliced_read_with_no_descriptor_to_spare_reads_the_batches_instead(tmp_path, monkeypatch):
    """EMFILE from the slice's dup is not a failed disk: the read returns the bytes."""
    from rayk.storage import file_slice

    log = Log(tmp_path)
    for _ in range(5):
        log.append_as_leader(batch(20), leader_epoch=0)
    expected = log.read(0, 1 << 20)

    def no_descriptors(fd):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(file_slice.os, "dup", no_descriptors)
    sliced = log.read(0, 1 << 20, slice_min_bytes=1)
    assert (sliced.records, sliced.next_offset) == (expected.records, expected.next_offset)
    log.close()
