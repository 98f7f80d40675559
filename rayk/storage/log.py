"""Log: one partition replica's log on disk, a directory of segments (Kafka's UnifiedLog).

The directory holds segments named by base offset (see `segment.py`) and the
`leader-epoch-checkpoint`. Offsets are contiguous from `log_start_offset` to
`log_end_offset` (LEO, the offset the next record gets). Only the last segment takes
appends; a new one is rolled when the next batch would not fit, when the segment's records
span more than `segment.ms`, when an index is full or an offset would overflow the
indexes' 32-bit relative encoding. A roll hands the segment it closes to a background
fsync (SegmentFlusher, as Kafka schedules one), and the recovery point moves past the
segment once that is done, so an append never waits for the disk; the OS page cache holds
the rest unless `flush.messages` / `flush.ms` ask for more.

Opening recovers (LogLoader, log_loader.py): segments from the one holding
`recovery_point` (default: the last segment) are re-read, each batch's CRC checked,
indexes rebuilt, and a torn or corrupt tail cut off together with every later segment;
the leader epoch cache is brought forward from the re-read batches.

The log owns its partition's producer state (`producer_state`, idempotent producers'
sequences, see `producer_state.py`): every append records each batch that carries a
producer id. It is persisted in producer snapshot files `<offset:020d>.snapshot` (see
`producer_snapshot.py`), written when a segment is rolled (named by the new segment's
base offset) and on close (at the LEO), as Kafka does. On open and on truncation,
snapshots above the LEO are deleted and the state is rebuilt from the newest valid
snapshot at or below the LEO plus the batch headers after it (from the log start if
there is none; producer_state_loader.py); a damaged snapshot is deleted and an older one
tried. Retention drops the snapshots and the producer batches below the new log start,
so the state always equals what the remaining log's batches say.

Transactions (KIP-98; the coordinator's side is coordinator/transaction/): the producer state also
tracks each producer's open transaction. A marker (a control batch, control_records.py)
ends it; an ABORT also goes into the active segment's transaction index (`.txnindex`,
transaction_index.py). `last_stable_offset` (LSO) is the HW, or the first offset of the
earliest transaction still open or whose marker is not below the HW, if that is lower;
a `read_committed` fetch reads below it and asks `aborted_transactions` for the aborted
ones of the range it read. `append_txn_marker` is how a leader writes a coordinator's
marker. Recovery rebuilds the transaction index of every re-read segment that holds a
marker (and of any segment whose index file is damaged) by replaying the producer state
up to it; the producer state is rebuilt from a snapshot at or below the HW, so that the
transactions whose markers are not yet below the HW are known to be unstable.

Compaction (cleanup.policy compact; the cleaning itself is `log_cleaner.py`): the log
keeps the cleaner's checkpoint, `cleaner_offset` (Kafka's first dirty offset: below it
the log is cleaned), and swaps cleaned segments in with Kafka's file protocol (see
`replace_segments`, segment_swap.py): the cleaned copy is written as `.cleaned` files,
renamed to `.swap` (the commit point), the segments it replaces are deleted, and the
`.swap` files take the segment names. Opening finishes an interrupted swap and deletes
`.cleaned` leftovers, so a crash at any step leaves either the old segments or the cleaned
one. A compacted log may skip offsets (between batches, and inside a batch whose records
were removed); it never repeats one. A compacted topic takes only records with a key
(INVALID_RECORD).

The high watermark (HW) is kept here for the replication layer, which owns its meaning;
the log only guarantees `log_start_offset <= HW <= LEO`. Retention (log_retention.py)
deletes whole segments and never one holding offsets at or above the HW.

The Log is Kafka's UnifiedLog over its LocalLog (local_log.py): the LocalLog holds the
segments (LogSegments), the LEO, the recovery point and the flushes, and does what only
touches segments (append a run of batches, roll, read, truncate, swap); the Log holds what
gives the offsets their meaning (log start, HW, LSO, the cleaner's offset), the producer
state and the leader epochs, validates what is appended (records.validate_batches,
log_validator.py) and keeps the invariants between them.

Thread-safe: every public method holds one lock, so appends, truncation, roll and
retention are serialised and reads see a consistent set of segments. The parts it is
composed of are not thread-safe: they run under that lock, called from the Log.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from rayk.errors import (
    FencedLeaderEpochError,
    InvalidFetchSizeError,
    KafkaStorageError,
    LogClosedError,
    OffsetOutOfRangeError,
    UnexpectedAppendOffsetError,
)
from rayk.storage import producer_snapshot
from rayk.storage.checkpoint import LeaderEpochCheckpointFile, write_atomically
from rayk.storage.control_records import EndTxnMarker, build_end_txn_marker, read_end_txn_marker
from rayk.storage.dir_lock import DirLock
from rayk.storage.file_slice import FileSlice
from rayk.storage.leader_epoch_cache import LeaderEpochCache
from rayk.storage.local_log import ClosedSegment, LocalLog
from rayk.storage.log_config import MAX_MESSAGE_BYTES_LIMIT, LogConfig
from rayk.storage.log_loader import LogLoader
from rayk.storage.log_retention import deletable_segment_count
from rayk.storage.log_validator import assign_offsets, require_keys
from rayk.storage.producer_state import BatchMetadata, ProducerStateManager, VerificationGuard
from rayk.storage.producer_state_loader import complete_txn, rebuild_producer_state
from rayk.storage.records import BatchHeader, TimestampType, validate_batches
from rayk.storage.segment import AppendWindow, LogSegment
from rayk.storage.segment_flusher import SegmentFlusher
from rayk.storage.segment_swap import new_cleaned_segment
from rayk.storage.transaction_index import AbortedTxn

logger = logging.getLogger(__name__)

__all__ = ["ClosedSegment", "Log", "LogAppendInfo", "ReadResult", "SegmentToCopy", "TimestampOffset"]


class LogAppendInfo(NamedTuple):
    """What an append did: offsets assigned, timestamps, and the log start after it."""

    first_offset: int
    last_offset: int
    max_timestamp_ms: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    record_count: int
    size_bytes: int
    duplicate: bool = False  # a producer's retry of a batch appended before: nothing was written
    # The batches as written, when they all went to the active segment (no roll between
    # them): what a read from `first_offset` right after the append returns, up to the LEO.
    records: bytes | bytearray | None = None

    @classmethod
    def of(
        cls, headers: list[BatchHeader], size_bytes: int, log_append_time_ms: int, log_start_offset: int
    ) -> LogAppendInfo:
        """What appending the batches of `headers` (`size_bytes` in all) did."""
        return cls(
            first_offset=headers[0].base_offset,
            last_offset=headers[-1].last_offset,
            max_timestamp_ms=max(h.max_timestamp for h in headers),
            log_append_time_ms=log_append_time_ms,
            log_start_offset=log_start_offset,
            record_count=sum(h.record_count for h in headers),
            size_bytes=size_bytes,
        )


    @classmethod
    def of_duplicate(cls, batch: BatchMetadata, log_start_offset: int) -> LogAppendInfo:
        """A retry of `batch`, appended before: its original offsets, nothing written."""
        return cls(batch.first_offset, batch.last_offset, batch.timestamp_ms, -1, log_start_offset, 0, 0, duplicate=True)


class SegmentToCopy(NamedTuple):
    """A closed segment that tiered storage copies (see `Log.segments_to_copy`)."""

    base_offset: int
    end_offset: int  # exclusive: the next segment's base
    max_timestamp_ms: int
    size_bytes: int
    files: dict[str, Path]  # kind (log, index, timeindex, txnindex, snapshot) -> file
    leader_epochs: tuple[tuple[int, int], ...]  # (epoch, first offset) of its batches


class ReadResult(NamedTuple):
    """Whole batches read from the log, with the log's bounds taken before the read."""

    records: bytes | FileSlice  # a FileSlice only when the read asked for one (slice_min_bytes)
    next_offset: int  # offset after the last batch returned; the start offset if none
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    """The answer to `Log.offset_for_timestamp`: the earliest record whose timestamp is >= the
    one asked for, as that record's timestamp (ms) and offset (ListOffsets by time)."""

    timestamp_ms: int
    offset: int


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Log:
    """One partition replica's log: its segments (LocalLog), the offsets that give them
    meaning (log start, HW, LSO, the cleaner's), the producer state and the leader epochs,
    all behind one lock. See the module docstring."""

    def __init__(
        self,
        dir_path: str | Path,
        config: LogConfig | None = None,
        *,
        recovery_point: int | None = None,
        log_start_offset: int | None = None,
        high_watermark: int | None = None,
        cleaner_offset: int | None = None,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        lock_wait_ms: int | None = None,
        on_storage_error: Callable[[OSError], None] | None = None,
    ) -> None:
        """`lock_wait_ms`: take the directory's `.lock` (see dir_lock.py), waiting up to this
        long for a dying previous owner; None (tools, tests) takes no lock.
        `on_storage_error`: told, from the background flush's thread, of an fsync of a
        rolled segment that failed (the log fails every append after it).
        `cleaner_offset`: the cleaner's checkpoint (None: nothing cleaned yet)."""
        self.dir_path = Path(dir_path)
        self.config = config or LogConfig()
        self._clock_ms = clock_ms
        self._lock = threading.RLock()
        self._external_writer: Callable[[], None] | None = None  # see set_external_writer
        self._closed = False
        self._cleaning_aborted = False
        self._flusher = SegmentFlusher(self.dir_path.name, self._rolled_segment_flushed, on_storage_error)
        self.dir_path.mkdir(parents=True, exist_ok=True)
        self._dir_lock = None if lock_wait_ms is None else DirLock(self.dir_path, lock_wait_ms)
        try:
            self._open(recovery_point, log_start_offset, high_watermark, cleaner_offset)
        except BaseException:
            self._release_dir_lock()
            raise

    def _open(
        self, recovery_point: int | None, log_start_offset: int | None, high_watermark: int | None, cleaner_offset: int | None
    ) -> None:
        self.leader_epoch_cache = LeaderEpochCache(
            LeaderEpochCheckpointFile(self.dir_path / LeaderEpochCheckpointFile.FILE_NAME)
        )
        self.producer_state = ProducerStateManager()
        loaded = LogLoader(self.dir_path, self.config, self.leader_epoch_cache).load(recovery_point, cleaner_offset or 0)
        self.truncated_on_recovery_bytes = loaded.truncated_bytes
        self._local = LocalLog(self.dir_path, self.config, loaded.segments, self._clock_ms, self._flusher)
        leo = self._local.log_end_offset
        self._log_start_offset = min(max(log_start_offset or 0, loaded.segments[0].base_offset), leo)
        hw = self._log_start_offset if high_watermark is None else high_watermark
        self._high_watermark = min(max(hw, self._log_start_offset), leo)
        self._cleaner_offset = min(max(cleaner_offset or 0, self._log_start_offset), leo)
        assert self._log_start_offset <= self._high_watermark <= leo and self._log_start_offset <= self._cleaner_offset
        self.leader_epoch_cache.truncate_from_end(leo)
        self.leader_epoch_cache.truncate_from_start(self._log_start_offset)
        self._rebuild_producer_state(loaded.txn_index_from)

    def _rebuild_producer_state(self, txn_index_from: int | None = None) -> None:
        """The producer state as the snapshots and batches say (producer_state_loader.py);
        segments from `txn_index_from` on have their transaction index written again."""
        rebuilt = rebuild_producer_state(self.dir_path, self._local.segments, self._log_start_offset,
                                         self._local.log_end_offset, self._high_watermark, txn_index_from)  # fmt: skip
        self.producer_state.replace_with(rebuilt)
        self.producer_state.on_high_watermark_updated(self._high_watermark)

    # ------------------------------------------------------------------ properties

    @property
    def log_end_offset(self) -> int:
        return self._local.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def recovery_point(self) -> int:
        """Offsets below this are known to be on disk (fsynced)."""
        return self._local.recovery_point

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        with self._lock:
            if not self._log_start_offset <= offset <= self._local.log_end_offset:
                raise ValueError(
                    f"high watermark {offset} outside [log start {self._log_start_offset}, LEO {self._local.log_end_offset}]"
                )
            self._high_watermark = offset
            self.producer_state.on_high_watermark_updated(offset)

    @property
    def last_stable_offset(self) -> int:
        """The LSO: a `read_committed` consumer reads below it (see the module docstring)."""
        with self._lock:
            return self._last_stable_offset()

    def _last_stable_offset(self) -> int:
        first_unstable = self.producer_state.first_unstable_offset()
        lso = self._high_watermark if first_unstable is None else min(first_unstable, self._high_watermark)
        return max(lso, self._log_start_offset)  # an open transaction retention cut into

    @property
    def cleaner_offset(self) -> int:
        """The log cleaner's checkpoint (Kafka's first dirty offset): below it the log is
        cleaned, from it on records may be superseded by later ones of the same key."""
        return self._cleaner_offset

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._local.segments.size_bytes

    @property
    def segment_base_offsets(self) -> list[int]:
        with self._lock:
            return list(self._local.segments.base_offsets)

    @property
    def latest_epoch(self) -> int:
        return self.leader_epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as answered to OffsetsForLeaderEpoch (see LeaderEpochCache)."""
        with self._lock:
            return self.leader_epoch_cache.end_offset_for(epoch, self._local.log_end_offset)

    def assign_leader_epoch(self, epoch: int) -> None:
        """This replica starts leading in `epoch` at the LEO (Kafka's maybeAssignEpochStartOffset
        in makeLeader), before any batch of the epoch is written: a follower asking where
        an older epoch ends learns it ends here, not at the next batch the leader takes."""
        with self._lock:
            self._check_open()
            if epoch < self.leader_epoch_cache.latest_epoch:
                raise FencedLeaderEpochError(f"leading in epoch {epoch} after epoch {self.leader_epoch_cache.latest_epoch}")
            self.leader_epoch_cache.assign(epoch, self._local.log_end_offset)

    # ------------------------------------------------------------------ append

    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        *,
        allow_transactional: bool = False,
        verification_guard: VerificationGuard | None = None,
    ) -> LogAppendInfo:
        """Validates a producer's batches, assigns them offsets from the LEO and appends them.

        Records are never re-encoded: only header fields are rewritten (log_validator.py).
        A rejected input leaves the log untouched. Control batches are refused (markers
        come through `append_txn_marker`), and transactional ones unless
        `allow_transactional` (the caller checked the transaction).

        Batches with a producer id are checked against the producer state under the lock,
        right before they are written (`validate_client_batches`: epoch, sequence,
        transaction state, and for a transaction's first batch here the
        `verification_guard` the caller took before verifying it). A retry of a remembered
        batch is not written: the answer carries its original offsets and `duplicate`.
        """
        if leader_epoch < 0:
            raise ValueError(f"leader epoch must be >= 0, got {leader_epoch}")
        max_batch_bytes = min(self.config.max_message_bytes, MAX_MESSAGE_BYTES_LIMIT)  # a stored config may exceed it
        headers = validate_batches(records, max_batch_bytes, leader_checks=True, allow_transactional=allow_transactional)
        if self.config.compacts:
            require_keys(records)
        with self._lock:
            self._check_open()
            self._stop_external_writer()  # before the LEO is read
            self._check_leader_epoch(leader_epoch, "append")
            if any(header.producer_id >= 0 for header in headers):
                duplicate = self.producer_state.validate_client_batches(headers, verification_guard)
                if duplicate is not None:
                    return LogAppendInfo.of_duplicate(duplicate, self._log_start_offset)
            now_ms = self._clock_ms()
            append_time_ms = now_ms if self.config.message_timestamp_type == TimestampType.LOG_APPEND_TIME else None
            data, assigned = assign_offsets(records, headers, self._local.log_end_offset, leader_epoch, append_time_ms)
            self._append(data, assigned, now_ms)
            self.leader_epoch_cache.assign(leader_epoch, assigned[0].base_offset)
            info = LogAppendInfo.of(assigned, len(data), -1 if append_time_ms is None else append_time_ms,
                                    self._log_start_offset)  # fmt: skip
            if self._local.segments.active.base_offset <= info.first_offset:  # one segment holds them all
                info = info._replace(records=data)
            return info

    def _check_leader_epoch(self, leader_epoch: int, what: str) -> None:
        """FENCED_LEADER_EPOCH for a write in an epoch older than the log's latest."""
        if leader_epoch < self.leader_epoch_cache.latest_epoch:
            latest = self.leader_epoch_cache.latest_epoch
            raise FencedLeaderEpochError(f"{what} in leader epoch {leader_epoch} after epoch {latest}")

    def verification_guard(self, producer_id: int) -> VerificationGuard:
        """The guard a leader takes before it verifies a transaction's first batch here with
        the transaction coordinator, to append it with (see producer_state.py)."""
        with self._lock:
            return self.producer_state.verification_guard(producer_id)

    def holds_verification(self, guard: VerificationGuard) -> bool:
        """Whether a marker voided `guard` since it was taken (see producer_state.py)."""
        with self._lock:
            return self.producer_state.holds_verification(guard)

    def append_as_follower(self, records: bytes | bytearray | memoryview,
                           written_at: tuple[int, int] | None = None) -> LogAppendInfo:
        """Appends batches copied from the leader; their offsets continue at the LEO, or
        after it when the leader's log was compacted (offsets only grow, as in Kafka).

        As in Kafka, a follower checks framing and CRCs but not the leader's size limit
        or record contents, which the leader validated.

        `written_at` (descriptor, position): the native copy loop (rayk/replication/native_copy.py)
        wrote these bytes there already, at the end of the active segment's file, having
        checked that they need no roll; the rest of the append (indexes, producer state,
        epochs, LEO) is done here. KAFKA_STORAGE_ERROR if that is not where the active
        segment ends, or they would need a roll after all (nothing is changed).
        """
        headers = validate_batches(records, None, leader_checks=False)
        with self._lock:
            self._check_open()
            if written_at is None:
                self._stop_external_writer()  # before the LEO is read
            expected = self._local.log_end_offset
            for header in headers:
                if header.base_offset < expected:
                    raise UnexpectedAppendOffsetError(
                        f"follower batch starts at offset {header.base_offset} but the log expects {expected} or later"
                    )
                expected = header.next_offset
            if written_at is not None:
                active = self._local.segments.active
                if (active.fd, active.size_bytes) != written_at:
                    raise KafkaStorageError(f"{self.dir_path}: {len(records)} bytes were written at {written_at}, "
                                            f"not at the end of the active segment ({active.fd}, {active.size_bytes})")
            self._append(records, headers, self._clock_ms(), written_at is not None)
            for header in headers:
                self.leader_epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
            return LogAppendInfo.of(headers, len(records), -1, self._log_start_offset)

    def set_external_writer(self, stop: Callable[[], None] | None) -> None:
        """While a follower's native copy loop writes at the end of the active segment's
        file (see `follower_append_window`), `stop` ends it and takes its writes in (None:
        it ended). Anything else that would change the active segment (an append of its
        own, a roll, a truncation, close, delete) calls it first."""
        with self._lock:
            self._external_writer = stop

    def _stop_external_writer(self) -> None:
        stop, self._external_writer = self._external_writer, None
        if stop is not None:
            stop()

    def follower_append_window(self) -> tuple[AppendWindow, int, int, int] | None:
        """(the active segment's AppendWindow, LEO, HW, latest leader epoch) for a follower's
        native copy loop to write at, which then reports with `append_as_follower(...,
        written_at=...)`; None when the segment's roll cannot be decided up front, or the
        log fsyncs by flush.messages / flush.ms (before the follower fetches again)."""
        with self._lock:
            self._check_open()
            if self.config.flush_messages is not None or self.config.flush_ms is not None:
                return None  # the fsyncs it asks for come before the next fetch: Python's loop
            window = self._local.segments.active.append_window()
            if window is None:
                return None
            return window, self._local.log_end_offset, self._high_watermark, self.leader_epoch_cache.latest_epoch

    def append_txn_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, leader_epoch: int
    ) -> LogAppendInfo:
        """Appends, as the leader, a transaction coordinator's COMMIT or ABORT marker for the
        producer (Kafka's appendAsLeader with origin COORDINATOR). INVALID_PRODUCER_EPOCH if
        the producer has written with a newer epoch, TRANSACTION_COORDINATOR_FENCED if a
        newer coordinator already wrote a marker for it."""
        with self._lock:
            self._check_open()
            self._stop_external_writer()  # before the LEO is read
            self._check_leader_epoch(leader_epoch, "marker")
            self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
            now_ms = self._clock_ms()
            marker = build_end_txn_marker(
                producer_id, producer_epoch, commit, coordinator_epoch, now_ms,
                base_offset=self._local.log_end_offset, partition_leader_epoch=leader_epoch,
            )  # fmt: skip
            header = BatchHeader.parse(marker)
            self._append(marker, [header], now_ms)
            self.leader_epoch_cache.assign(leader_epoch, header.base_offset)
            return LogAppendInfo.of([header], len(marker), -1, self._log_start_offset)

    def _append(self, data: bytes | bytearray | memoryview, headers: list[BatchHeader], now_ms: int,
                written: bool = False) -> None:
        """Writes batches whose offsets are assigned, a segment's worth at a time, rolling
        where one needs a new segment, and records their producers (lock held). `written`:
        the bytes are in the active segment's file already (see append_as_follower)."""
        local = self._local
        view = memoryview(data)
        markers: dict[int, EndTxnMarker | None] = {}  # base offset -> what a control batch says
        position = 0
        for header in headers:
            local.check_fits(header)
            if header.is_control and header.producer_id >= 0:  # read before anything is written
                markers[header.base_offset] = read_end_txn_marker(view[position : position + header.size_bytes])
            position += header.size_bytes
        if not written:
            self._stop_external_writer()
        position = 0
        producer_state = self.producer_state
        chunks = local.chunks(headers)
        if written and (len(chunks) != 1 or local.should_roll(chunks[0][0], chunks[0][1], now_ms)):
            raise KafkaStorageError(f"{self.dir_path}: {len(data)} bytes were written to the active segment that need a new one")
        for chunk, size in chunks:
            if local.should_roll(chunk, size, now_ms):
                self._roll(chunk[0].base_offset)  # past a compaction gap: the segment starts at the batch
            active = local.append(view[position : position + size], chunk, written)
            for header in chunk:
                if header.producer_id < 0:
                    continue
                if not header.is_control:
                    producer_state.record_batch(header)
                elif (marker := markers[header.base_offset]) is not None:
                    complete_txn(producer_state, header, marker, active)
            position += size
        local.maybe_flush(now_ms)

    # ------------------------------------------------------------------ read

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_batch: bool = True,
        slice_min_bytes: int | None = None,
    ) -> ReadResult:
        """Whole batches starting with the one that holds `start_offset`.

        At most `max_bytes`, except that the first batch is returned whatever its size when
        `min_one_batch` (so a consumer can always make progress). Batches reaching
        `max_offset` or beyond are left out (consumers pass the HW). Offsets outside
        [log start, LEO] raise OffsetOutOfRangeError; at the LEO the result is empty.
        With `slice_min_bytes`, batches of at least that many bytes come as a FileSlice of
        the segment's file, not read (for an answer sent by `sendfile`: file_slice.py).
        """
        if max_bytes < 0:
            raise InvalidFetchSizeError(f"max_bytes must be >= 0, got {max_bytes}")
        with self._lock:
            self._check_open()
            hw, start, leo = self._high_watermark, self._log_start_offset, self._local.log_end_offset
            if not start <= start_offset <= leo:
                raise OffsetOutOfRangeError(f"offset {start_offset} is outside the log's range [{start}, {leo}]")
            data, next_offset = self._local.read(start_offset, max_bytes, max_offset, min_one_batch, slice_min_bytes)
            return ReadResult(data, next_offset, hw, start, leo, self._last_stable_offset())

    def aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions that overlap [start_offset, upper_bound_offset): what a
        `read_committed` fetch that read that range returns beside its records."""
        with self._lock:
            self._check_open()
            return self._local.aborted_transactions(start_offset, upper_bound_offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> TimestampOffset | None:
        """The earliest record whose timestamp is >= `timestamp_ms`, or None if none is."""
        if timestamp_ms < 0:
            raise ValueError(f"timestamp must be >= 0, got {timestamp_ms}")
        with self._lock:
            self._check_open()
            found = self._local.offset_for_timestamp(timestamp_ms, self._log_start_offset)
            return None if found is None else TimestampOffset(*found)

    # ------------------------------------------------------------------ truncation, roll, flush

    def truncate_to(self, offset: int) -> None:
        """Removes every batch at or above `offset` (a follower diverged from its leader).

        Cuts at a batch boundary: if `offset` falls inside a batch, that batch goes too and
        the LEO becomes its base offset; if it falls in a gap compaction left, the LEO
        becomes `offset`. A target at or above the LEO leaves the batches alone, but still
        drops epoch entries that start at or past the LEO: a replica that led an epoch and
        appended nothing in it holds an entry (epoch, LEO) its new leader never had, and
        kept, it would make every later fetch look diverging (Kafka's UnifiedLog.truncateTo
        does the same, for the same case).
        """
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        with self._lock:
            self._check_open()
            self._stop_external_writer()
            if offset >= self._local.log_end_offset:
                self.leader_epoch_cache.truncate_from_end(self._local.log_end_offset)
                return
            if offset < self._log_start_offset:
                self._truncate_fully_and_start_at(offset)
                return
            self._local.truncate_to(offset)
            leo = self._local.log_end_offset
            self._high_watermark = min(self._high_watermark, leo)
            self._cleaner_offset = min(self._cleaner_offset, leo)
            self.leader_epoch_cache.truncate_from_end(leo)
            self._rebuild_producer_state()

    def truncate_fully_and_start_at(self, offset: int, producer_snapshot_bytes: bytes | None = None,
                                    leader_epochs: tuple[tuple[int, int], ...] = ()) -> None:  # fmt: skip
        """Deletes every segment and restarts the log empty at `offset` (a follower whose
        LEO fell below the leader's log start). A tiered log's follower passes the state of
        the remote copy that ends at `offset`: its producer snapshot (kept as this log's
        snapshot at `offset`, so the producers' sequences go on) and its leader epochs
        ((epoch, start offset), ascending; the one in force at `offset` starts there)."""
        with self._lock:
            self._check_open()
            self._stop_external_writer()
            self._truncate_fully_and_start_at(offset)
            if producer_snapshot_bytes is not None:
                path = self.dir_path / producer_snapshot.snapshot_file_name(offset)
                write_atomically(path, producer_snapshot_bytes)
                try:
                    self.producer_state.replace_with(producer_snapshot.read(self.dir_path, offset))
                except KafkaStorageError as e:  # a damaged remote object: not this disk's failure
                    logger.warning("%s: the remote producer snapshot at %d is unusable, starting without it: %s",
                                   self.dir_path, offset, e)  # fmt: skip
                    producer_snapshot.delete(self.dir_path, [offset])
                self.producer_state.on_high_watermark_updated(offset)
            in_force = [epoch for epoch, start in leader_epochs if start <= offset]
            if in_force:
                self.leader_epoch_cache.assign(in_force[-1], offset)

    def _truncate_fully_and_start_at(self, offset: int) -> None:
        self._local.truncate_fully_and_start_at(offset)
        self._log_start_offset = self._high_watermark = self._cleaner_offset = offset
        self.leader_epoch_cache.clear()
        producer_snapshot.delete(self.dir_path, producer_snapshot.snapshot_offsets(self.dir_path))
        self.producer_state.clear()

    def update_config(self, config: LogConfig) -> None:
        """Applies changed topic configs (Kafka's dynamic topic config): retention, roll,
        flush and validation settings take effect for the next append or retention check."""
        with self._lock:
            self._stop_external_writer()  # it writes by the old roll rules
            self.config = config
            self._local.update_config(config)

    def roll(self) -> None:
        """Starts a new segment at the LEO (nothing happens if the last one is empty)."""
        with self._lock:
            self._check_open()
            self._roll()

    def _roll(self, base: int | None = None) -> None:
        """Starts a new segment at `base` (default: the LEO; a follower copying past a
        compaction gap starts it at its first batch, so relative offsets stay int32)."""
        self._stop_external_writer()
        base = self._local.roll(base)
        if base is not None:
            # After the new segment exists: if this write fails the log is still consistent,
            # and reopening falls back to an older snapshot.
            producer_snapshot.write(self.dir_path, base, self.producer_state)

    def _rolled_segment_flushed(self, end_offset: int, truncations: int) -> None:
        """The flusher made a rolled segment durable (its thread)."""
        with self._lock:
            if not self._closed:  # else that history is gone
                self._local.segment_flushed(end_offset, truncations)

    def flush(self) -> None:
        """Fsyncs everything up to the LEO; the recovery point moves there."""
        with self._lock:
            self._check_open()
            self._local.flush()

    # ------------------------------------------------------------------ retention

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Moves the log start up to `offset` (Kafka's DeleteRecords on a leader, and a
        follower taking its leader's log start): records below it are no longer read, and
        the segments wholly below it go at the next retention check. OFFSET_OUT_OF_RANGE
        above the HW, since only committed records may be deleted. Returns whether it moved."""
        with self._lock:
            self._check_open()
            if offset > self._high_watermark:
                raise OffsetOutOfRangeError(
                    f"cannot move the log start offset to {offset}: above the high watermark {self._high_watermark}"
                )
            if offset <= self._log_start_offset:
                return False
            self._advance_log_start(offset)
            return True

    def _advance_log_start(self, offset: int) -> None:
        """The log start becomes `offset`; what the log keeps about records below it goes."""
        assert self._log_start_offset <= offset <= self._high_watermark, "the log start only grows, up to the HW"
        self._log_start_offset = offset
        self._cleaner_offset = max(self._cleaner_offset, offset)
        self.leader_epoch_cache.truncate_from_start(offset)
        self.producer_state.remove_batches_below(offset)
        producer_snapshot.delete(self.dir_path, [o for o in producer_snapshot.snapshot_offsets(self.dir_path) if o < offset])

    def delete_expired_segments(self, now_ms: int | None = None, copied_end_offset: int | None = None) -> int:
        """Deletes the oldest segments retention says (log_retention.py: those wholly below
        the log start, and with cleanup.policy delete those past `retention.ms` or beyond
        `retention.bytes`, never one holding offsets at or above the HW); returns how many.

        A tiered log (remote.storage.enable) is held to its local retention instead, and
        keeps every segment not wholly below `copied_end_offset`, the end of what its
        remote storage holds (None: unknown here, as on a follower: only the segments
        below the log start go, which follows the leader's)."""
        with self._lock:
            self._check_open()
            # Before anything is counted: what it wrote may keep the active segment (or move the HW).
            self._stop_external_writer()
            now_ms = self._clock_ms() if now_ms is None else now_ms
            segments = self._local.segments
            config, bound = self.config, self._high_watermark
            if config.remote_storage_enable:
                config = config.local_retention()
                bound = min(bound, self._log_start_offset if copied_end_offset is None else copied_end_offset)
            doomed = deletable_segment_count(segments, config, self._log_start_offset, bound,
                                             self._local.log_end_offset, now_ms)  # fmt: skip
            if doomed == 0:
                return 0
            if doomed == len(segments):
                self._roll()  # the log always keeps an active segment
            self._local.delete_oldest(doomed)
            self._advance_log_start(max(self._log_start_offset, segments[0].base_offset))
            assert self._log_start_offset <= self._high_watermark <= self._local.log_end_offset
            return doomed

    # ------------------------------------------------------------------ tiered storage (rayk/storage/remote/)

    def segments_to_copy(self, below_offset: int, from_offset: int) -> list[SegmentToCopy]:
        """The closed segments wholly below `below_offset` that end past `from_offset`,
        oldest first, with what a remote copy of each holds: its files, the producer
        snapshot at its end and its leader epochs. The files are read by the caller
        without the lock: a closed segment below the HW is only ever deleted by retention,
        which keeps it until its copy is confirmed, or by a full truncation (this replica
        became a follower that starts over), which the copy then fails on."""
        with self._lock:
            self._check_open()
            out = []
            epochs = self.leader_epoch_cache.entries
            for closed in self._local.closed_segments_below(below_offset):
                if closed.end_offset <= from_offset or closed.size_bytes == 0:
                    continue
                segment = closed.segment
                files = {"log": segment.log_path, "index": segment.offset_index.path,
                         "timeindex": segment.time_index.path}  # fmt: skip
                if segment.txn_index.path.exists():
                    files["txnindex"] = segment.txn_index.path
                snapshot = self.dir_path / producer_snapshot.snapshot_file_name(closed.end_offset)
                if snapshot.exists():  # written at the roll (a crash right before it may have lost it)
                    files["snapshot"] = snapshot
                # The epochs of its batches: the one in force at its base, and those begun in it.
                in_segment = [e for e in epochs if e.start_offset < closed.end_offset]
                first = max((i for i, e in enumerate(in_segment) if e.start_offset <= segment.base_offset), default=0)
                segment_epochs = tuple((e.epoch, max(e.start_offset, segment.base_offset)) for e in in_segment[first:])
                out.append(SegmentToCopy(segment.base_offset, closed.end_offset, closed.max_timestamp_ms,
                                         closed.size_bytes, files, segment_epochs))  # fmt: skip
            return out

    # ------------------------------------------------------------------ compaction (the cleaner's interface)

    def cleanable_segments(self, first_uncleanable_offset: int) -> tuple[list[ClosedSegment], int]:
        """The segments that lie wholly below `first_uncleanable_offset` (the active one
        never does), oldest first, and the truncation count to hand `replace_segments`.
        The cleaner reads them through `read_segment_bytes`; a truncation or retention
        that takes one meanwhile makes `replace_segments` refuse the clean."""
        with self._lock:
            self._check_open()
            return self._local.closed_segments_below(first_uncleanable_offset), self._local.truncations

    def read_segment_bytes(self, segment: LogSegment, position: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` of `segment`'s .log from `position`; raises LogClosedError if
        the segment is no longer part of the log (retention or truncation took it)."""
        with self._lock:
            self._check_open()
            if self._cleaning_aborted:
                raise LogClosedError(f"cleaning {self.dir_path} was aborted: the log is closing")
            return self._local.read_segment_bytes(segment, position, max_bytes)

    def producer_batch_offsets(self) -> set[tuple[int, int]]:
        """(producer id, first offset) of each batch the producer state remembers: batches
        the cleaner keeps, if only as an empty header, so the state survives a rebuild."""
        with self._lock:
            return self.producer_state.batch_offsets()

    def new_cleaned_segment(self, base_offset: int) -> LogSegment:
        """An empty `.cleaned` segment for the cleaner to write (a leftover one is replaced)."""
        with self._lock:
            self._check_open()
        return new_cleaned_segment(self.dir_path, base_offset, self.config)

    def replace_segments(self, cleaned: LogSegment, old: list[LogSegment], truncations: int) -> bool:
        """Swaps `cleaned` (a `.cleaned` segment, written and sealed) in for the consecutive
        segments `old`, with Kafka's crash-safe steps (segment_swap.py). Returns False, and
        deletes `cleaned`, if the log changed under the cleaner (truncated, retention took
        `old`, or closed): the clean is simply lost, never applied to other segments."""
        with self._lock:
            if self._closed or truncations != self._local.truncations or not self._local.replace_segments(cleaned, old):
                cleaned.delete()
                return False
            return True

    def advance_cleaner_offset(self, offset: int, truncations: int) -> bool:
        """The cleaner finished everything below `offset` (kept within [log start, LEO]),
        unless the log was truncated since it started (what it cleaned may be gone, and
        later records there are dirty): then nothing moves and False is returned."""
        with self._lock:
            if self._closed or truncations != self._local.truncations:
                return False
            leo = self._local.log_end_offset
            self._cleaner_offset = min(max(self._cleaner_offset, offset, self._log_start_offset), leo)
            return True

    def abort_cleaning(self) -> None:
        """A clean in progress stops at its next read (the replica is closing)."""
        self._cleaning_aborted = True

    # ------------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.dir_path} is closed")
        if self._flusher.error is not None:
            raise KafkaStorageError(f"log {self.dir_path}: fsync of a rolled segment failed: {self._flusher.error}")

    def close(self) -> None:
        """Flushes, writes a producer snapshot at the LEO, trims the indexes and closes
        every file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._stop_external_writer()
            self._local.flush()
            producer_snapshot.write(self.dir_path, self._local.log_end_offset, self.producer_state)
            self._local.close()
            self._closed = True
        self._flusher.close()  # outside the lock: its callback takes it
        self._release_dir_lock()

    def _release_dir_lock(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()

    def delete(self) -> None:
        """Closes the log and removes its directory (the topic was deleted)."""
        with self._lock:
            if not self._closed:
                self._stop_external_writer()
                self._local.close()
                self._closed = True
        self._flusher.close()
        with self._lock:
            shutil.rmtree(self.dir_path, ignore_errors=True)
            self._release_dir_lock()

    def __repr__(self) -> str:
        return (
            f"Log({str(self.dir_path)!r}, start={self._log_start_offset}, hw={self._high_watermark}, "
            f"leo={self._local.log_end_offset}, segments={len(self._local.segments)})"
        )
