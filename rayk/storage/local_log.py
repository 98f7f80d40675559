"""LocalLog: a partition's segments on local disk and the offsets only they decide
(Kafka's LocalLog, beneath its UnifiedLog).

It holds the LogSegments, the log end offset (LEO: the offset the next batch gets), the
recovery point (offsets below it are fsynced) and the flush policy's counters, and does
what touches segments only: appending a chunk of batches to the active segment, rolling
a new one (the segment it closes goes to the SegmentFlusher, which moves the recovery
point once it is durable), reading whole batches, finding aborted transactions and
timestamps, truncating, flushing, and swapping a cleaned segment in
(segment_swap.py). `truncations` counts the rewrites of offsets below the LEO
(truncations), so that work started before one (a background flush, a clean) can tell
that the history it saw is gone.

What the offsets mean for replication and clients (log start, high watermark, last
stable offset), the producer state, the leader epochs, validation and retention are the
Log's. Not thread-safe: every call is made under the owning Log's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rayk.errors import KafkaStorageError, LogClosedError, RecordBatchTooLargeError
from rayk.storage.file_slice import FileSlice
from rayk.storage.log_config import LogConfig
from rayk.storage.log_segments import LogSegments
from rayk.storage.records import BatchHeader
from rayk.storage.segment import LOG_SUFFIX, LogSegment
from rayk.storage.segment_flusher import SegmentFlusher
from rayk.storage.segment_swap import swap_in
from rayk.storage.transaction_index import AbortedTxn


@dataclass(frozen=True, slots=True)
class ClosedSegment:
    """A closed segment as the log cleaner sees it, its figures read under the log's lock
    (the cleaner's thread never touches a segment's descriptors but through the log)."""

    segment: LogSegment
    end_offset: int  # the next segment's base offset
    size_bytes: int
    max_timestamp_ms: int
    first_batch_timestamp_ms: int
    last_modified_ms: int
    offset_index_bytes: int
    time_index_bytes: int


class LocalLog:
    """A partition's segments with their LEO, recovery point and flushes; see the module
    docstring. Guarded by the owning Log's lock."""

    def __init__(self, dir_path: Path, config: LogConfig, segments: LogSegments, clock_ms: Callable[[], int],
                 flusher: SegmentFlusher) -> None:  # fmt: skip
        self.dir_path = dir_path
        self.config = config
        self.segments = segments
        self._clock_ms = clock_ms
        self._flusher = flusher
        self.log_end_offset = segments.active.next_offset()
        self.recovery_point = self.log_end_offset  # what the loader re-read is as durable as it is
        self.truncations = 0  # bumped when offsets below the LEO are rewritten
        self._unflushed_records = 0
        self._last_flush_ms = clock_ms()

    def update_config(self, config: LogConfig) -> None:
        self.config = config
        for segment in self.segments:
            segment.update_config(config)

    # ------------------------------------------------------------------ append, roll, flush

    def check_fits(self, header: BatchHeader) -> None:
        """RECORD_BATCH_TOO_LARGE for a batch no segment could hold (checked before anything
        of an append is written)."""
        if header.size_bytes > self.config.segment_bytes:
            raise RecordBatchTooLargeError(
                f"batch of {header.size_bytes} bytes can never fit in a segment of segment.bytes = {self.config.segment_bytes}"
            )

    def chunks(self, headers: list[BatchHeader]) -> list[tuple[list[BatchHeader], int]]:
        """The batches (each checked by `check_fits`) in runs that fit in one segment each
        (a run goes in one write), with each run's bytes."""
        segment_bytes = self.config.segment_bytes
        out = []
        start = 0
        while start < len(headers):
            end, size = start, 0
            while end < len(headers) and size + headers[end].size_bytes <= segment_bytes:
                size += headers[end].size_bytes
                end += 1
            assert end > start, "every batch fits in a segment"
            out.append((headers[start:end], size))
            start = end
        return out

    def should_roll(self, chunk: list[BatchHeader], size_bytes: int, now_ms: int) -> bool:
        """Whether `chunk` needs a new segment (see LogSegment.should_roll)."""
        max_timestamp = max(h.max_timestamp for h in chunk)
        return self.segments.active.should_roll(size_bytes, max_timestamp, chunk[-1].last_offset, now_ms)

    def append(self, data: memoryview, chunk: list[BatchHeader], written: bool = False) -> LogSegment:
        """Writes one run of batches (`data`, from `chunks`) to the active segment (`written`:
        found there already, see Log.append_as_follower), and returns that segment."""
        assert chunk[-1].next_offset > self.log_end_offset, "offsets only grow"
        active = self.segments.active
        active.append(data, chunk, written)
        self.log_end_offset = chunk[-1].next_offset
        self._unflushed_records += sum(h.record_count for h in chunk)
        return active

    def roll(self, base: int | None = None) -> int | None:
        """Starts a new segment at `base` (default: the LEO) and hands the one it closes to
        the flusher; returns the new base, None if the active segment is empty (nothing
        happens)."""
        active = self.segments.active
        if active.is_empty:
            return None
        self._flusher.submit(active.seal(), self.log_end_offset, self.truncations)
        base = self.log_end_offset if base is None else base
        assert base >= self.log_end_offset, "offsets only grow"
        if (self.dir_path / f"{base:020d}{LOG_SUFFIX}").exists():
            raise KafkaStorageError(f"cannot roll: segment {base:020d}{LOG_SUFFIX} already exists in {self.dir_path}")
        self.segments.add(LogSegment(self.dir_path, base, self.config, active=True))
        return base

    def segment_flushed(self, end_offset: int, truncations: int) -> None:
        """The flusher made a rolled segment durable up to `end_offset`; the recovery point
        follows, unless a truncation rewrote that history since."""
        if truncations == self.truncations:
            self.recovery_point = max(self.recovery_point, min(end_offset, self.log_end_offset))

    def maybe_flush(self, now_ms: int) -> None:
        """Flushes if `flush.messages` records or `flush.ms` passed since the last flush."""
        flush_messages, flush_ms = self.config.flush_messages, self.config.flush_ms
        if (flush_messages is not None and self._unflushed_records >= flush_messages) or (
            flush_ms is not None and now_ms - self._last_flush_ms >= flush_ms
        ):
            self.flush()

    def flush(self) -> None:
        """Fsyncs everything up to the LEO; the recovery point moves there."""
        for segment in self.segments.from_offset(self.recovery_point):
            segment.flush()
        self.recovery_point = self.log_end_offset
        self._unflushed_records = 0
        self._last_flush_ms = self._clock_ms()

    # ------------------------------------------------------------------ read

    def read(
        self, start_offset: int, max_bytes: int, max_offset: int | None, min_one_batch: bool,
        slice_min_bytes: int | None = None,
    ) -> tuple[bytes | FileSlice, int]:
        """Whole batches from the one holding `start_offset` (in [first base, LEO]) and the
        offset after them (see Log.read); as a FileSlice of the segment's file instead of
        bytes when `slice_min_bytes` is given and they are at least that many."""
        if start_offset >= self.log_end_offset or (max_offset is not None and start_offset >= max_offset):
            return b"", start_offset
        for segment in self.segments.from_offset(start_offset):
            if slice_min_bytes is not None and min(max_bytes, segment.size_bytes) >= slice_min_bytes:
                located = segment.locate(start_offset, max_bytes, max_offset, min_one_batch)
                if located is None:
                    continue
                position, size_bytes, next_offset = located
                if size_bytes < slice_min_bytes:
                    return segment.read_bytes(position, size_bytes), next_offset
                try:
                    found = FileSlice(
                        segment.fd, position, size_bytes, next_offset, self.truncations, self._truncations
                    )
                except OSError:  # no descriptor to spare (EMFILE): read them
                    return segment.read_bytes(position, size_bytes), next_offset
                return found, next_offset
            found = segment.read(start_offset, max_bytes, max_offset, min_one_batch)
            if found is not None:
                return found
        return b"", self.log_end_offset  # no batch at or after start_offset: the rest was compacted away

    def _truncations(self) -> int:
        return self.truncations

    def aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions whose ranges overlap [start_offset, upper_bound_offset)."""
        found: list[AbortedTxn] = []
        for segment in self.segments.from_offset(start_offset):
            txns, complete = segment.txn_index.collect(start_offset, upper_bound_offset)
            found += txns
            if complete:
                break
        return found

    def offset_for_timestamp(self, timestamp_ms: int, log_start_offset: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the earliest record at or after `log_start_offset` whose
        timestamp is >= `timestamp_ms`."""
        for segment in self.segments:
            found = segment.find_offset_by_timestamp(timestamp_ms)
            if found is not None and found[1] >= log_start_offset:
                return found
        return None

    # ------------------------------------------------------------------ truncation

    def truncate_to(self, offset: int) -> None:
        """Removes every batch at or above `offset` (at least the first segment's base,
        below the LEO), cutting at a batch boundary (see Log.truncate_to)."""
        assert self.segments[0].base_offset <= offset < self.log_end_offset
        self.truncations += 1
        for segment in self.segments.remove_from(self.segments.floor_index(offset) + 1):
            segment.delete()
        last = self.segments.active
        cut = last.translate_offset(offset)  # the first batch that goes, if one does
        last.truncate_to(offset)
        last.make_active()
        self.log_end_offset = min(offset, cut.header.base_offset) if cut is not None else offset
        assert self.log_end_offset >= last.next_offset(), "the LEO is at or past the last batch"
        self.recovery_point = min(self.recovery_point, self.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Deletes every segment; the log restarts empty at `offset`."""
        self.truncations += 1
        for segment in self.segments.remove_from(0):
            segment.delete()
        self.segments.add(LogSegment(self.dir_path, offset, self.config, active=True))
        self.log_end_offset = self.recovery_point = offset

    def delete_oldest(self, count: int) -> None:
        """Deletes the `count` oldest segments, never the active one."""
        assert count < len(self.segments), "the log always keeps an active segment"
        for segment in self.segments.remove_first(count):
            segment.delete()

    # ------------------------------------------------------------------ the cleaner's segments

    def closed_segments_below(self, limit: int) -> list[ClosedSegment]:
        """The segments that lie wholly below `limit` (never the active one), oldest first."""
        limit = min(limit, self.segments.active.base_offset)
        out = []
        for segment, end in zip(self.segments, self.segments.base_offsets[1:]):
            if end > limit:
                break
            out.append(
                ClosedSegment(
                    segment, end, segment.size_bytes, segment.max_timestamp_ms, segment.first_batch_timestamp_ms(),
                    segment.last_modified_ms, segment.offset_index.size_bytes, segment.time_index.size_bytes,
                )
            )  # fmt: skip
        return out

    def read_segment_bytes(self, segment: LogSegment, position: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` of `segment`'s .log from `position`; LogClosedError if it is no
        longer one of the log's (retention or truncation took it)."""
        if not self.segments.holds(segment):
            raise LogClosedError(f"segment {segment.base_offset} of {self.dir_path} was removed")
        return segment.read_bytes(position, max_bytes)

    def replace_segments(self, cleaned: LogSegment, old: list[LogSegment]) -> bool:
        """Swaps `cleaned` in for the consecutive closed segments `old` (segment_swap.py);
        False, changing nothing, if they are no longer the log's."""
        first = self.segments.floor_index(old[0].base_offset)
        current = self.segments[first:first + len(old)]
        if (
            len(current) != len(old)
            or any(a is not b for a, b in zip(current, old))
            or first + len(old) >= len(self.segments)  # never the active segment
        ):
            return False
        assert cleaned.base_offset == old[0].base_offset, "a cleaned segment takes its first source's name"
        assert cleaned.next_offset() <= self.segments[first + len(old)].base_offset, "cleaning keeps offsets"
        swap_in(self.dir_path, cleaned, old)
        self.segments.replace(first, len(old), cleaned)
        return True

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
