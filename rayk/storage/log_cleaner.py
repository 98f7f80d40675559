"""Log compaction of one `Log` (Kafka's LogCleaner / Cleaner, for cleanup.policy compact).

A compacted log keeps, for every key, at least its latest record. The cleaner works on
the log's cleanable part, which ends at the first uncleanable offset (Kafka's
LogCleanerManager.cleanableOffsets): the active segment's base, the high watermark (only
committed records, so every replica compacts the same history), and the first segment
holding a record younger than `min.compaction.lag.ms`, and the last stable offset (no
open transaction is cleaned, as in Kafka). Within it, below the log's
`cleaner_offset` (the cleaner's checkpoint) the log is clean; from it on it is dirty.

`cleanable_state` measures a log: it is worth cleaning when its dirty bytes are at least
`min.cleanable.dirty.ratio` of the cleanable bytes, or when its oldest dirty record is
older than `max.compaction.lag.ms`. `clean` then does what Kafka's Cleaner.doClean does:
1. Builds the offset map, key -> latest offset, over whole dirty segments, oldest first,
   until `dedupe_buffer_bytes` (Kafka's log.cleaner.dedupe.buffer.size) would overflow:
   the map's end is where this clean stops (at least one segment is always mapped).
2. Copies every segment from the log start to the map's end, in groups that fit in one
   segment, into `.cleaned` segments, keeping a record unless the map holds a later
   offset for its key, or it is a tombstone (null value) whose batch's delete horizon has
   passed. Batches keep their offset ranges (records keep their offsets); control batches
   stay whole; a batch the producer state remembers stays, emptied if need be, so
   idempotent producers' sequences survive (records.filter_batch).
3. Swaps each group in (Log.replace_segments: `.cleaned` -> `.swap` -> segment names,
   crash-safe) and moves the log's cleaner offset to the map's end.
Bytes read and written pass a `Throttler` (log.cleaner.io.max.bytes.per.second).

Tombstones live by the delete horizon of KIP-534, as in Kafka since 3.1 (read in
core/src/main/scala/kafka/log/LogCleaner.scala: cleanInto's RecordFilter(currentTime,
deleteRetentionMs) and shouldRetainRecord; clients/.../record/MemoryRecords.filterTo). The
first clean that keeps a batch holding a tombstone, dirty or not, rewrites it with the
horizon = the clean's `now_ms` + `delete.retention.ms` in its baseTimestamp and attributes
bit 6 (records.py has the bytes; the records keep their timestamps). A tombstone is dropped
only from a batch with a horizon, once `now_ms` >= it (Kafka keeps it while currentTime <
deleteHorizonMs). So a consumer has `delete.retention.ms` from the first clean that kept
a tombstone to read it, whatever its CreateTime says (a record's own timestamp may be a
month old on arrival) and however often segments are merged (Kafka's older rule, on the
segment's modification time, restarted with every merge). A follower copies the leader's
batches, horizons and all. Nothing schedules a clean for a horizon's passing: as in Kafka,
the tombstone goes at the first clean after it, which new dirty records bring about.
Transactions: control and transactional batches are copied whole, and the segments'
aborted-transaction indexes go with them into the cleaned segment (Log.replace_segments).
Records of aborted transactions never enter the offset map, so they cannot supersede a
committed record of the same key. Kafka also drops aborted records and, after
`delete.retention.ms`, markers; rayk keeps both (read_committed consumers still skip the
aborted ones), which costs space, never correctness.

The cleaner runs beside appends and reads: it reads closed segments through the log, and
a truncation or retention that changes them first makes the swap refuse the clean, which
is then lost and done again later. Not thread-safe for one log: one clean at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rayk.storage.log import ClosedSegment, Log
from rayk.storage.log_config import NO_LIMIT_MS
from rayk.storage.records import (
    HEADER_SIZE_BYTES,
    LENGTH_POS,
    LOG_OVERHEAD_BYTES,
    NO_TIMESTAMP,
    BatchHeader,
    RecordBatch,
    decode_record_tuples,
    filter_batch,
    iter_batches,
)
from rayk.storage.segment import LogSegment

logger = logging.getLogger(__name__)

DEDUPE_BUFFER_BYTES = 128 * 1024 * 1024  # Kafka's log.cleaner.dedupe.buffer.size
MAP_ENTRY_OVERHEAD_BYTES = 100  # a dict slot, a bytes object and an int, beside the key's bytes
READ_CHUNK_BYTES = 1 << 20
MAX_RELATIVE_OFFSET = (1 << 31) - 1  # the indexes store offsets relative to the base as int32


class Throttler:
    """Holds a byte rate (Kafka's Throttler): `acquire(n)` sleeps once the bytes counted
    since the start run ahead of `max_bytes_per_second`."""

    def __init__(
        self,
        max_bytes_per_second: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_bytes_per_second <= 0:
            raise ValueError(f"max_bytes_per_second must be > 0, got {max_bytes_per_second}")
        self.max_bytes_per_second = max_bytes_per_second
        self._clock, self._sleep = clock, sleep
        self._start = clock()
        self._bytes = 0

    def acquire(self, n_bytes: int) -> None:
        self._bytes += n_bytes
        ahead_s = self._bytes / self.max_bytes_per_second - (self._clock() - self._start)
        if ahead_s > 0:
            self._sleep(ahead_s)


UNTHROTTLED = float("inf")


@dataclass(frozen=True, slots=True)
class CleanableState:
    """How dirty a log is (Kafka's LogToClean)."""

    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    dirty_bytes: int
    max_lag_passed: bool  # the oldest dirty record is older than max.compaction.lag.ms

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0

    def needs_cleaning(self, min_cleanable_dirty_ratio: float) -> bool:
        return self.dirty_bytes > 0 and (self.max_lag_passed or self.dirty_ratio >= min_cleanable_dirty_ratio)


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What one `clean` of a log did: the offsets it covered, the bytes it read and wrote, and
    how many records it dropped; `completed` is False when the log changed under it."""

    first_offset: int  # the log start when the clean began
    end_offset: int  # the new cleaner offset: everything below it was cleaned
    bytes_read: int
    bytes_written: int
    records_removed: int
    completed: bool  # False: the log changed under the cleaner, nothing was swapped in after that


def first_uncleanable_offset(log: Log, now_ms: int) -> int:
    """min(active segment base, LSO, base of the first segment with a record younger than
    min.compaction.lag.ms)."""
    return _cleanable(log, now_ms)[1]


def _cleanable(log: Log, now_ms: int) -> tuple[list[ClosedSegment], int, int]:
    """The segments wholly below the first uncleanable offset, that offset, and the log's
    truncation count, from one look at the log."""
    limit = log.last_stable_offset  # <= the HW
    segments, truncations = log.cleanable_segments(limit)
    lag_ms = log.config.min_compaction_lag_ms
    if lag_ms > 0:
        for i, closed in enumerate(segments):
            if closed.max_timestamp_ms > now_ms - lag_ms:
                return segments[:i], min(limit, closed.segment.base_offset), truncations
    return segments, limit, truncations


def cleanable_state(log: Log, now_ms: int) -> CleanableState:
    segments, uncleanable, _ = _cleanable(log, now_ms)
    first_dirty = log.cleaner_offset
    clean = [c for c in segments if c.end_offset <= first_dirty]
    dirty = [c for c in segments if c.end_offset > first_dirty]
    max_lag_ms = log.config.max_compaction_lag_ms
    max_lag_passed = False
    if dirty and max_lag_ms < NO_LIMIT_MS:
        first_timestamp_ms = dirty[0].first_batch_timestamp_ms
        max_lag_passed = first_timestamp_ms != NO_TIMESTAMP and first_timestamp_ms < now_ms - max_lag_ms
    return CleanableState(
        first_dirty, uncleanable, sum(c.size_bytes for c in clean), sum(c.size_bytes for c in dirty), max_lag_passed
    )


def clean(
    log: Log,
    now_ms: int,
    *,
    dedupe_buffer_bytes: int = DEDUPE_BUFFER_BYTES,
    throttler: Throttler | None = None,
) -> CleanResult | None:
    """Cleans `log` from its start to as far as one offset map reaches (see the module
    docstring). Returns None when there is nothing dirty to clean."""
    throttler = throttler or Throttler(UNTHROTTLED)
    segments, _, truncations = _cleanable(log, now_ms)
    first_dirty = log.cleaner_offset
    dirty = [c for c in segments if c.end_offset > first_dirty]
    if not dirty:
        return None
    first_offset = segments[0].segment.base_offset
    stats = _Stats()
    latest_offsets, map_end = _build_offset_map(log, dirty, dedupe_buffer_bytes, throttler, stats)
    record_filter = _RecordFilter(latest_offsets, now_ms, log.config.delete_retention_ms)
    protected_batches = log.producer_batch_offsets()
    for group in _groups([c for c in segments if c.end_offset <= map_end], log):
        cleaned = log.new_cleaned_segment(group[0].segment.base_offset)
        try:
            for closed in group:
                _copy_retained(log, closed.segment, cleaned, record_filter, protected_batches, throttler, stats)
            cleaned.set_last_modified_ms(max(c.last_modified_ms for c in group))
            cleaned.on_roll()
        except BaseException:
            cleaned.delete()
            raise
        if not log.replace_segments(cleaned, [c.segment for c in group], truncations):
            logger.info("%s: the log changed during cleaning; the clean is dropped", log.dir_path)
            return CleanResult(first_offset, log.cleaner_offset, stats.read, stats.written, stats.removed, False)
    completed = log.advance_cleaner_offset(map_end, truncations)
    return CleanResult(first_offset, log.cleaner_offset, stats.read, stats.written, stats.removed, completed)


@dataclass(frozen=True, slots=True)
class _RecordFilter:
    """Which records of a batch a clean keeps (Kafka's Cleaner.shouldRetainRecord, magic 2),
    and the delete horizon it gives a batch that keeps a tombstone and has none."""

    latest_offsets: dict[bytes, int]  # key -> its latest offset up to the map's end
    now_ms: int
    delete_retention_ms: int

    @property
    def new_delete_horizon_ms(self) -> int:
        return self.now_ms + self.delete_retention_ms

    def retain_in(self, header: BatchHeader) -> Callable[[int, int, bytes | None, bool], bool]:
        """`filter_batch`'s test for the records of the batch with this header."""
        horizon_ms = header.delete_horizon_ms
        drops_tombstones = horizon_ms is not None and self.now_ms >= horizon_ms
        latest_offsets = self.latest_offsets

        def retain(offset: int, _timestamp_ms: int, key: bytes | None, is_tombstone: bool) -> bool:
            if key is not None and latest_offsets.get(key, offset) > offset:
                return False  # a later record of the key supersedes it
            return not (is_tombstone and drops_tombstones)

        return retain


@dataclass(slots=True)
class _Stats:
    read: int = 0
    written: int = 0
    removed: int = 0


def _segment_batches(log: Log, segment: LogSegment, throttler: Throttler, stats: _Stats) -> Iterator[RecordBatch]:
    """The segment's batches in order, read through the log a chunk at a time."""
    position = 0
    while position < segment.size_bytes:
        chunk = log.read_segment_bytes(segment, position, READ_CHUNK_BYTES)
        if len(chunk) < HEADER_SIZE_BYTES:
            return
        consumed = 0
        for batch in iter_batches(chunk):
            yield batch
            consumed += batch.header.size_bytes
        if consumed == 0:  # a batch larger than the chunk: read exactly it
            size = int.from_bytes(chunk[LENGTH_POS : LENGTH_POS + 4], "big", signed=True) + LOG_OVERHEAD_BYTES
            chunk = log.read_segment_bytes(segment, position, size)
            yield from iter_batches(chunk)
            consumed = size
        throttler.acquire(consumed)
        stats.read += consumed
        position += consumed


def _build_offset_map(
    log: Log, dirty: list[ClosedSegment], budget_bytes: int, throttler: Throttler, stats: _Stats
) -> tuple[dict[bytes, int], int]:
    """key -> latest offset over whole dirty segments until the budget would overflow;
    returns the map and the end of the last segment mapped."""
    latest: dict[bytes, int] = {}
    used_bytes = 0
    map_end = dirty[0].end_offset
    aborted = _AbortedBatches(log, dirty[0].segment.base_offset, dirty[-1].end_offset)
    for i, closed in enumerate(dirty):
        segment_map: dict[bytes, int] = {}
        for batch in _segment_batches(log, closed.segment, throttler, stats):
            if batch.header.is_control or aborted.holds(batch.header):
                continue
            for offset, _timestamp, key, _value, _headers in decode_record_tuples(batch.data)[1]:
                if key is not None:
                    segment_map[key] = offset
        added = sum(len(k) + MAP_ENTRY_OVERHEAD_BYTES for k in segment_map if k not in latest)
        if i > 0 and used_bytes + added > budget_bytes:
            break  # this segment waits for the next clean
        latest.update(segment_map)
        used_bytes += added
        map_end = closed.end_offset
    return latest, map_end


class _AbortedBatches:
    """Which transactional batches of an offset range belong to aborted transactions."""

    def __init__(self, log: Log, start_offset: int, end_offset: int) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        for txn in log.aborted_transactions(start_offset, end_offset):
            self._ranges.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))

    def holds(self, header: BatchHeader) -> bool:
        if not header.is_transactional:
            return False
        return any(first <= header.base_offset <= last for first, last in self._ranges.get(header.producer_id, ()))


def _groups(segments: list[ClosedSegment], log: Log) -> Iterator[list[ClosedSegment]]:
    """Consecutive segments whose cleaned copy fits one segment (Kafka's groupSegmentsBySize):
    their bytes within segment.bytes, their index files within segment.index.bytes, and
    their offsets relative to the first within int32."""
    config = log.config
    group: list[ClosedSegment] = []
    size = offset_index_bytes = time_index_bytes = 0
    for closed in segments:
        if group and (
            size + closed.size_bytes > config.segment_bytes
            or offset_index_bytes + closed.offset_index_bytes > config.segment_index_bytes
            or time_index_bytes + closed.time_index_bytes > config.segment_index_bytes
            or closed.end_offset - 1 - group[0].segment.base_offset > MAX_RELATIVE_OFFSET
        ):
            yield group
            group, size, offset_index_bytes, time_index_bytes = [], 0, 0, 0
        group.append(closed)
        size += closed.size_bytes
        offset_index_bytes += closed.offset_index_bytes
        time_index_bytes += closed.time_index_bytes
    if group:
        yield group


def _copy_retained(
    log: Log,
    source: LogSegment,
    cleaned: LogSegment,
    record_filter: _RecordFilter,
    protected_batches: set[tuple[int, int]],
    throttler: Throttler,
    stats: _Stats,
) -> None:
    for batch in _segment_batches(log, source, throttler, stats):
        header = batch.header
        if header.is_control or header.is_transactional:
            kept: bytes | None = bytes(batch.data)
        else:
            protected = header.producer_id >= 0 and (header.producer_id, header.base_offset) in protected_batches
            kept = filter_batch(
                batch.data, record_filter.retain_in(header), protected, record_filter.new_delete_horizon_ms
            )
        if kept is None:
            stats.removed += header.record_count
            continue
        kept_header = next(iter_batches(kept)).header
        stats.removed += header.record_count - kept_header.record_count
        cleaned.append(kept, [kept_header])
        throttler.acquire(len(kept))
        stats.written += len(kept)
