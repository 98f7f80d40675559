"""LogSegment: one .log file of whole record batches plus its .index and .timeindex,
and the .txnindex of the aborted transactions whose markers it holds.

Files `<base offset:020d>.log|.index|.timeindex|.txnindex` in the partition directory.
The .log holds v2 batches back to back, offsets contiguous from the base offset; the
indexes are sparse (an entry each time more than `index_interval_bytes` were appended
since the last) and are rebuilt from the .log whenever they cannot be trusted. The
.txnindex (see transaction_index.py) exists only once the segment has an entry; the Log
writes it, since what it says depends on the transactions open before the segment.

Lifecycle: the active (last) segment is appended to and its indexes are preallocated and
writable; `on_roll()` fsyncs it and trims its indexes (`seal()` trims them and leaves
the fsync to a background flush), after which it is read-only unless
a truncation makes it active again. `recover()` re-reads every batch, checks each CRC,
rebuilds both indexes, cuts the file after the last valid batch and reports each valid
batch's header to an optional callback.

The segment speaks absolute offsets; the relative encoding stays inside the indexes. It
knows nothing of retention, replication or the other segments. Not thread-safe: the
owning `Log` serialises calls.
"""

from __future__ import annotations

import bisect
import mmap
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from rayk.errors import KafkaError
from rayk.storage.log_config import LogConfig
from rayk.storage.offset_index import MAX_RELATIVE_OFFSET, OffsetIndex
from rayk.storage.records import (
    HEADER_SIZE_BYTES,
    NO_TIMESTAMP,
    BatchHeader,
    check_batch_at,
    decode_records,
)
from rayk.storage.time_index import TimeIndex
from rayk.storage.transaction_index import SUFFIX as TXN_INDEX_SUFFIX
from rayk.storage.transaction_index import TransactionIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
HEADER_SCAN_CHUNK_BYTES = 64 * 1024  # read size when only batch headers are wanted
# Read size when walking from an index entry to a batch near it (one holding an offset,
# the last one): at the default index.interval.bytes (4096) it is in the first read.
OFFSET_SCAN_CHUNK_BYTES = 8 * 1024
# The newest batches whose locations a segment keeps from its appends: followers and
# consumers fetch at or near the end of the log, and find their batch there without the
# scan from an index entry (~25 headers at the default index.interval.bytes and 100 B
# records). Kafka's fetches at the tail also start from positions it kept (the LEO's and
# the HW's LogOffsetMetadata).
RECENT_BATCHES = 256
_MAX_INT64 = (1 << 63) - 1


def segment_file_name(base_offset: int, suffix: str) -> str:
    """Kafka names segment files by their base offset padded to 20 digits."""
    return f"{base_offset:020d}{suffix}"


class BatchLocation(NamedTuple):
    """Where a batch starts in the .log file, with its header."""

    position: int
    header: BatchHeader


class AppendWindow(NamedTuple):
    """The end of an active segment and how far it may grow without a roll (see
    LogSegment.append_window): bytes up to `segment_bytes`, batches whose max timestamp is
    at most `max_timestamp_ms` and last offset at most `max_last_offset`, `max_batches` of them."""

    fd: int
    position: int
    segment_bytes: int
    max_timestamp_ms: int
    max_batches: int
    max_last_offset: int


class LogSegment:
    """Owns one segment's .log file descriptor, its three indexes and a cache of its last
    batches' positions. Active (appended to, indexes writable) until the Log rolls it, then
    read-only; `recover` rebuilds it after a crash. Not thread-safe: the Log serialises calls."""

    def __init__(self, dir_path: Path, base_offset: int, config: LogConfig, active: bool, file_suffix: str = "") -> None:
        """`file_suffix` is appended to the four file names: the log cleaner writes a
        segment as `.cleaned` files and swaps it in through `.swap` (see `rename_files`)."""
        self.base_offset = base_offset
        self._config = config
        self.file_suffix = file_suffix
        self.log_path = dir_path / segment_file_name(base_offset, LOG_SUFFIX + file_suffix)
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        index_path = dir_path / segment_file_name(base_offset, INDEX_SUFFIX + file_suffix)
        time_index_path = dir_path / segment_file_name(base_offset, TIME_INDEX_SUFFIX + file_suffix)
        self.indexes_were_missing = not (index_path.exists() and time_index_path.exists())
        self.offset_index = OffsetIndex(index_path, base_offset, config.segment_index_bytes, writable=active)
        self.time_index = TimeIndex(time_index_path, base_offset, config.segment_index_bytes, writable=active)
        self.txn_index = TransactionIndex(dir_path / segment_file_name(base_offset, TXN_INDEX_SUFFIX + file_suffix))
        self.created_ms = int(time.time() * 1000)
        self._bytes_since_last_index_entry = 0
        self.max_timestamp_ms = NO_TIMESTAMP
        self._offset_of_max_timestamp = base_offset
        self._first_batch_timestamp_ms: int | None = None
        self._next_offset: int | None = None  # cached end of the segment; None: not read yet
        # The last appended batches (at most 2 x RECENT_BATCHES, the newest RECENT_BATCHES
        # after a trim), in order and up to the end of the file, their last offsets and
        # where each ends (plain ints, so bisect needs no key function).
        self._recent: list[BatchLocation] = []
        self._recent_last_offsets: list[int] = []
        self._recent_ends: list[int] = []

    # ------------------------------------------------------------------ properties

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def fd(self) -> int:
        """The .log's descriptor (a FileSlice takes a duplicate of it)."""
        return self._fd

    @property
    def is_empty(self) -> bool:
        return self._size == 0

    def next_offset(self) -> int:
        """The offset after this segment's last batch (its base offset if empty)."""
        if self._next_offset is None:
            last = self._last_batch()
            self._next_offset = self.base_offset if last is None else last.header.next_offset
        return self._next_offset

    @property
    def last_modified_ms(self) -> int:
        return int(os.fstat(self._fd).st_mtime * 1000)

    # ------------------------------------------------------------------ append

    def update_config(self, config: LogConfig) -> None:
        """New roll and index-interval settings (index files keep their preallocated size)."""
        self._config = config

    def should_roll(self, batch_bytes: int, max_timestamp_ms: int, last_offset: int, now_ms: int) -> bool:
        """Kafka's roll rules: full, too old, an index full, or an offset not relative-able."""
        if self._size == 0:
            return False
        if self._size > self._config.segment_bytes - batch_bytes:
            return True
        first_ts = self.first_batch_timestamp_ms()
        waited_ms = max_timestamp_ms - first_ts if first_ts >= 0 else now_ms - self.created_ms
        return (
            waited_ms > self._config.roll_ms
            or self.offset_index.is_full
            or self.time_index.is_full
            or not self.offset_index.can_append_offset(last_offset)
        )

    def append(self, data: bytes | bytearray | memoryview, headers: list[BatchHeader], written: bool = False) -> None:
        """Appends whole, validated batches whose offsets continue this segment; with
        `written`, they are at the end of the file already (a follower's native copy loop
        wrote them) and only the indexes and the cache of positions take them in."""
        view = memoryview(data)
        # >=: a segment written by the log cleaner skips the offsets of removed batches.
        assert headers and headers[0].base_offset >= self.next_offset(), "batches must continue the segment"
        position = self._size
        done = len(view) if written else 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], position + done)
        recent, recent_last_offsets, recent_ends = self._recent, self._recent_last_offsets, self._recent_ends
        for header in headers:
            self._index_batch(header, position)
            recent.append(BatchLocation(position, header))
            recent_last_offsets.append(header.last_offset)
            position += header.size_bytes
            recent_ends.append(position)
        if len(recent) > 2 * RECENT_BATCHES:
            del recent[:-RECENT_BATCHES], recent_last_offsets[:-RECENT_BATCHES], recent_ends[:-RECENT_BATCHES]
        self._size = position
        self._next_offset = headers[-1].next_offset

    def append_window(self) -> AppendWindow | None:
        """What may be written at the end of this (active) segment without a roll, for a
        writer that appends first and tells `append(..., written=True)` after (a follower's
        native copy loop); None if the roll rules cannot be decided up front (an empty
        segment, or one whose first batch has no timestamp: they go by the clock)."""
        first_ts = self.first_batch_timestamp_ms()
        if self._size == 0 or first_ts < 0:
            return None
        entries_left = min(self.offset_index.entries_left, self.time_index.entries_left)
        return AppendWindow(
            fd=self._fd,
            position=self._size,
            segment_bytes=self._config.segment_bytes,
            max_timestamp_ms=min(first_ts + self._config.roll_ms, _MAX_INT64),
            # An index takes at most an entry per batch: one short of full, nothing needs a roll.
            max_batches=max(entries_left - 1, 0),
            max_last_offset=self.base_offset + MAX_RELATIVE_OFFSET,
        )

    def _index_batch(self, header: BatchHeader, position: int) -> None:
        if self._first_batch_timestamp_ms is None:
            self._first_batch_timestamp_ms = header.max_timestamp
        if header.max_timestamp > self.max_timestamp_ms:
            self.max_timestamp_ms = header.max_timestamp
            self._offset_of_max_timestamp = header.last_offset
        if self._bytes_since_last_index_entry > self._config.index_interval_bytes:
            self.offset_index.append(header.last_offset, position)
            self.time_index.maybe_append(self.max_timestamp_ms, self._offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += header.size_bytes

    # ------------------------------------------------------------------ read

    def _read_header(self, position: int) -> BatchHeader | None:
        raw = os.pread(self._fd, HEADER_SIZE_BYTES, position)
        return BatchHeader.parse(raw) if len(raw) == HEADER_SIZE_BYTES else None

    def _batches_from(self, position: int, chunk_bytes: int = HEADER_SCAN_CHUNK_BYTES) -> Iterator[BatchLocation]:
        """Each batch from `position` (a batch boundary) to the end of the segment, reading
        `chunk_bytes` at a time and decoding only the headers: one read for the batches
        between two index entries, not one per batch. Stops at a header that is cut short
        or declares less than a header's size."""
        while position < self._size:
            chunk = os.pread(self._fd, min(chunk_bytes, self._size - position), position)
            consumed = 0
            while len(chunk) - consumed >= HEADER_SIZE_BYTES:
                header = BatchHeader.parse(chunk, consumed)
                if header.size_bytes < HEADER_SIZE_BYTES:
                    return
                yield BatchLocation(position + consumed, header)
                consumed += header.size_bytes
            if consumed == 0:
                return  # fewer than a header's bytes left: the segment ends here
            position += consumed

    def translate_offset(self, offset: int) -> BatchLocation | None:
        """The first batch whose last offset is >= `offset`, or None if there is none."""
        recent = self._recent
        if recent and offset >= recent[0].header.base_offset:
            i = bisect.bisect_left(self._recent_last_offsets, offset)
            return recent[i] if i < len(recent) else None
        for location in self._batches_from(self.offset_index.lookup(offset)[1], OFFSET_SCAN_CHUNK_BYTES):
            if location.header.last_offset >= offset:
                return location
        return None

    def _kept_extent(self, position: int, limit: int) -> tuple[int, int] | None:
        """(end, offset after it) of the last whole batch between `position` (a batch's
        start) and `limit`, from the kept locations alone, when they reach back to
        `position` and at least its batch fits; None otherwise (walk the file). The kept
        batches run to the end of the file, so none is missed between them."""
        recent = self._recent
        if not recent or position < recent[0].position:
            return None
        i = bisect.bisect_right(self._recent_ends, limit) - 1
        if i < 0 or recent[i].position < position:
            return None
        return self._recent_ends[i], recent[i].header.next_offset

    def read(
        self, start_offset: int, max_bytes: int, max_offset: int | None, min_one_batch: bool
    ) -> tuple[bytes, int] | None:
        """Whole batches from the one holding `start_offset`: at most `max_bytes` of them
        (but the first batch whatever its size when `min_one_batch`), and only batches that
        end below `max_offset`. Returns (bytes, offset after the last batch returned), or
        None when this segment holds nothing at or after `start_offset`.
        """
        location = self.translate_offset(start_offset)
        if location is None:
            return None
        first = location.header
        if max_offset is not None and first.last_offset >= max_offset:
            return b"", start_offset
        if first.size_bytes > max_bytes:
            if not min_one_batch:
                return b"", start_offset
            return os.pread(self._fd, first.size_bytes, location.position), first.next_offset
        if self._recent and location.position >= self._recent[0].position:  # the tail: no header walk
            limit = min(self._size, location.position + max_bytes)
            if max_offset is not None and (stop := self.translate_offset(max_offset)) is not None:
                limit = min(limit, stop.position)
            kept = self._kept_extent(location.position, limit)
            if kept is not None:
                return os.pread(self._fd, kept[0] - location.position, location.position), kept[1]
        chunk = os.pread(self._fd, min(max_bytes, self._size - location.position), location.position)
        # Keep only whole batches below max_offset: walk the headers inside the chunk.
        end, next_offset = 0, start_offset
        while len(chunk) - end >= HEADER_SIZE_BYTES:
            header = BatchHeader.parse(chunk, end)
            if end + header.size_bytes > len(chunk):
                break
            if max_offset is not None and header.last_offset >= max_offset:
                break
            end += header.size_bytes
            next_offset = header.next_offset
        return (chunk[:end] if end < len(chunk) else chunk), next_offset

    def locate(
        self, start_offset: int, max_bytes: int, max_offset: int | None, min_one_batch: bool
    ) -> tuple[int, int, int] | None:
        """Where `read` with the same arguments would read, without reading the batches:
        (position, size in bytes, offset after the last batch), or None when this segment
        holds nothing at or after `start_offset`. It finds the last whole batch within
        `max_bytes` from the offset index (by position) and the batch headers after that
        entry, as Kafka's LogSegment.read finds its slice, so a large read costs a few
        header reads, not its bytes."""
        location = self.translate_offset(start_offset)
        if location is None:
            return None
        first, position = location.header, location.position
        if max_offset is not None and first.last_offset >= max_offset:
            return position, 0, start_offset
        if first.size_bytes > max_bytes:
            return (position, first.size_bytes, first.next_offset) if min_one_batch else (position, 0, start_offset)
        limit = min(self._size, position + max_bytes)
        if max_offset is not None:
            stop = self.translate_offset(max_offset)  # batches before it all end below max_offset
            if stop is not None:
                limit = min(limit, stop.position)
        kept = self._kept_extent(position, limit)
        if kept is not None:  # the tail, where followers and consumers read: no header walk
            return position, kept[0] - position, kept[1]
        # Walk the headers from the last batch start known to be at or below the limit: a
        # kept location whose batch fits, or an index entry (where the walk starts again
        # from the entry before if the batch there does not fit, to learn where the last
        # one that does ends).
        start = max(position, self.offset_index.position_at_or_below(limit))
        i = bisect.bisect_right(self._recent_ends, limit) - 1
        if i >= 0:
            start = max(start, self._recent[i].position)
        while True:
            end, next_offset = position, start_offset
            for batch in self._batches_from(start, OFFSET_SCAN_CHUNK_BYTES):
                if batch.position + batch.header.size_bytes > limit:
                    break
                end, next_offset = batch.position + batch.header.size_bytes, batch.header.next_offset
            if end > position or start == position:
                return position, end - position, next_offset
            start = max(position, self.offset_index.position_at_or_below(start - 1))

    def read_bytes(self, position: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` of the .log from `position` (the log cleaner's sequential read)."""
        return os.pread(self._fd, max(0, min(max_bytes, self._size - position)), position)

    def batch_locations(self, start_offset: int) -> Iterator[BatchLocation]:
        """Where each batch whose last offset is >= `start_offset` starts, with its header,
        in order. Reads `HEADER_SCAN_CHUNK_BYTES` at a time and decodes only the headers
        (to rebuild state that lives in them, such as producer sequences; `read_batch`
        reads a whole one, such as a transaction marker)."""
        location = self.translate_offset(start_offset)
        if location is not None:
            yield from self._batches_from(location.position)

    def read_batch(self, location: BatchLocation) -> bytes:
        """The whole batch at `location`."""
        return os.pread(self._fd, location.header.size_bytes, location.position)

    def find_offset_by_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the earliest record with timestamp >= target, or None."""
        if self.max_timestamp_ms < timestamp_ms:
            return None
        offset_hint = self.time_index.lookup(timestamp_ms)[1]
        for batch in self._batches_from(self.offset_index.lookup(offset_hint)[1], OFFSET_SCAN_CHUNK_BYTES):
            if batch.header.max_timestamp >= timestamp_ms:
                for record in decode_records(os.pread(self._fd, batch.header.size_bytes, batch.position)):
                    if record.timestamp_ms >= timestamp_ms:
                        return record.timestamp_ms, record.offset
        return None

    def first_batch_timestamp_ms(self) -> int:
        if self._first_batch_timestamp_ms is None:
            header = self._read_header(0) if self._size else None
            if header is None:
                return NO_TIMESTAMP
            self._first_batch_timestamp_ms = header.max_timestamp
        return self._first_batch_timestamp_ms

    def _last_batch(self) -> BatchLocation | None:
        last: BatchLocation | None = None
        start = self.offset_index.lookup(1 << 62)[1] if self.offset_index.entries else 0
        for last in self._batches_from(start, OFFSET_SCAN_CHUNK_BYTES):
            pass
        return last

    # ------------------------------------------------------------------ load, recovery, truncation

    def load(self) -> str | None:
        """Loads a segment written by a clean run; returns why its indexes cannot be
        trusted (the caller then calls `recover`), or None."""
        if self.indexes_were_missing:
            return "index files are missing"
        problem = self.offset_index.sanity_check() or self.time_index.sanity_check()
        if problem:
            return problem
        if self.offset_index.entries and self.offset_index.lookup(1 << 62)[1] >= self._size:
            return "offset index points past the end of the log"
        self._reload_max_timestamp()
        return None

    def _reload_max_timestamp(self) -> None:
        # The last time index entry bounds everything before its batch; batches after
        # it are few (less than an index interval), so read their headers for the exact max.
        timestamp, offset = self.time_index.last_entry
        self.max_timestamp_ms, self._offset_of_max_timestamp = timestamp, offset
        after_entry = self._batches_from(self.offset_index.lookup(offset)[1], OFFSET_SCAN_CHUNK_BYTES)
        for header in (batch.header for batch in after_entry):
            if header.max_timestamp > self.max_timestamp_ms:
                self.max_timestamp_ms, self._offset_of_max_timestamp = header.max_timestamp, header.last_offset
        self._first_batch_timestamp_ms = None
        self._next_offset = None

    def recover(self, on_batch: Callable[[BatchHeader], None] | None = None) -> int:
        """Re-reads every batch, rebuilds the indexes and cuts the file after the last
        sound batch (whole, CRC valid, offsets above the previous batch's: compaction
        leaves gaps, never overlaps). Returns the bytes cut.
        `on_batch` is called with each sound batch's header, in order, so the log can
        rebuild what lives in headers (the leader epoch cache, as Kafka's LogSegment.recover
        does). Leaves the indexes writable; the log trims them if this is not the last segment."""
        self.make_active()
        self.offset_index.reset()
        self.time_index.reset()
        self._bytes_since_last_index_entry = 0
        self.max_timestamp_ms, self._offset_of_max_timestamp = NO_TIMESTAMP, self.base_offset
        self._first_batch_timestamp_ms = None
        valid_bytes = 0
        expected_offset = self.base_offset
        if self._size:
            with mmap.mmap(self._fd, self._size, access=mmap.ACCESS_READ) as mapped:
                view = memoryview(mapped)
                try:
                    while valid_bytes < self._size:
                        try:
                            header = check_batch_at(view, valid_bytes)
                        except KafkaError:
                            break
                        if header.base_offset < expected_offset:  # gaps: compaction removed batches
                            break
                        self._index_batch(header, valid_bytes)
                        if on_batch is not None:
                            on_batch(header)
                        valid_bytes += header.size_bytes
                        expected_offset = header.next_offset
                finally:
                    view.release()
        truncated = self._size - valid_bytes
        if truncated:
            os.ftruncate(self._fd, valid_bytes)
            self._size = valid_bytes
        self._forget_recent()
        self._next_offset = expected_offset
        return truncated

    def truncate_to(self, offset: int) -> int:
        """Removes the batch holding `offset` and every later one; returns bytes removed."""
        location = self.translate_offset(offset)
        if location is None:
            return 0
        self.offset_index.truncate_to(location.header.base_offset)
        self.time_index.truncate_to(location.header.base_offset)
        self.txn_index.truncate_to(location.header.base_offset)
        removed = self._size - location.position
        os.ftruncate(self._fd, location.position)
        self._size = location.position
        self._forget_recent()
        self._bytes_since_last_index_entry = 0
        self._reload_max_timestamp()
        return removed

    def _forget_recent(self) -> None:
        """The file changed other than by an append (the kept locations may be gone), or
        the segment stopped being active."""
        self._recent, self._recent_last_offsets, self._recent_ends = [], [], []

    # ------------------------------------------------------------------ lifecycle

    def make_active(self) -> None:
        """Reopens the indexes for appends (after a truncation made this the last segment)."""
        self.offset_index.make_writable()
        self.time_index.make_writable()

    def flush(self) -> None:
        os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def on_roll(self) -> None:
        """The segment stops being active: make it durable and its indexes compact."""
        self.flush()
        self.offset_index.trim()
        self.time_index.trim()
        self._forget_recent()  # only the active segment keeps them: the tail is there

    def seal(self) -> list[int]:
        """The segment stops being active: its indexes are cut to their entries, and the
        fsync is left to the caller, who gets duplicates of the files' descriptors to
        fsync and close (a background flush; see segment_flusher.py)."""
        self.offset_index.trim(sync=False)
        self.time_index.trim(sync=False)
        self._forget_recent()  # only the active segment keeps them: the tail is there
        txn_index_fd = self.txn_index.dup_fd()
        return [os.dup(self._fd), self.offset_index.dup_fd(), self.time_index.dup_fd(), *(
            () if txn_index_fd is None else (txn_index_fd,))]

    def close(self) -> None:
        if self._fd < 0:
            return
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()
        os.close(self._fd)
        self._fd = -1

    def rename_files(self, file_suffix: str) -> None:
        """Renames the files to carry `file_suffix` instead of the current one (the
        cleaner's `.cleaned` -> `.swap` -> "" steps); open descriptors stay valid."""
        for index in (self.offset_index, self.time_index, self.txn_index):
            index.rename_to(_with_suffix(index.path, self.file_suffix, file_suffix))
        target = _with_suffix(self.log_path, self.file_suffix, file_suffix)
        os.replace(self.log_path, target)
        self.log_path, self.file_suffix = target, file_suffix

    def set_last_modified_ms(self, ms: int) -> None:
        """Sets the .log's modification time: a cleaned segment keeps its source's, which
        retention and the tombstone horizon go by, as in Kafka."""
        os.utime(self._fd, ns=(ms * 1_000_000, ms * 1_000_000))

    def delete(self) -> None:
        self.offset_index.delete()
        self.time_index.delete()
        self.txn_index.delete()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.log_path.unlink(missing_ok=True)


def _with_suffix(path: Path, old_suffix: str, new_suffix: str) -> Path:
    name = path.name[: len(path.name) - len(old_suffix)] if old_suffix else path.name
    return path.with_name(name + new_suffix)
