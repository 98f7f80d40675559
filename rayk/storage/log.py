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

Opening recovers: segments from the one holding `recovery_point` (default: the last
segment) are re-read, each batch's CRC checked, indexes rebuilt, and a torn or corrupt
tail cut off together with every later segment. Earlier segments are loaded as they
are unless an index is missing or fails its sanity check, in which case it is rebuilt.
The leader epoch cache is brought forward from the re-read batches' partition leader
epochs (see `LeaderEpochCache.recover`), so a `leader-epoch-checkpoint` lost or left
stale by a crash is repaired; epochs of segments that were not re-read come only from
the checkpoint, as in Kafka.

The log owns its partition's producer state (`producer_state`, idempotent producers'
sequences, see `producer_state.py`): every append records each batch that carries a
producer id. It is persisted in producer snapshot files `<offset:020d>.snapshot` (see
`producer_snapshot.py`), written when a segment is rolled (named by the new segment's
base offset) and on close (at the LEO), as Kafka does. On open and on truncation,
snapshots above the LEO are deleted and the state is rebuilt from the newest valid
snapshot at or below the LEO plus the batch headers after it (from the log start if
there is none); a damaged snapshot is deleted and an older one tried. Retention drops
the snapshots and the producer batches below the new log start, so the state always
equals what the remaining log's batches say.

Transactions (KIP-98; the coordinator's side is not built yet): the producer state also
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
`replace_segments`): the cleaned copy is written as `.cleaned` files, renamed to `.swap`
(the commit point), the segments it replaces are deleted, and the `.swap` files take the
segment names. Opening finishes an interrupted swap and deletes `.cleaned` leftovers, so
a crash at any step leaves either the old segments or the cleaned one. A compacted log
may skip offsets (between batches, and inside a batch whose records were removed); it
never repeats one. A compacted topic takes only records with a key (INVALID_RECORD).

The high watermark (HW) is kept here for the replication layer, which owns its meaning;
the log only guarantees `log_start_offset <= HW <= LEO`. Retention deletes whole segments
and never one holding offsets at or above the HW.

Thread-safe: every public method holds one lock, so appends, truncation, roll and
retention are serialised and reads see a consistent set of segments.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from rayk.errors import (
    FencedLeaderEpochError,
    KafkaError,
    InvalidFetchSizeError,
    InvalidProducerEpochError,
    InvalidRecordError,
    KafkaStorageError,
    LogClosedError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    RecordError,
    TransactionCoordinatorFencedError,
    UnexpectedAppendOffsetError,
)
from rayk.storage import producer_snapshot
from rayk.storage.control_records import EndTxnMarker, build_end_txn_marker, read_end_txn_marker
from rayk.storage.checkpoint import EpochEntry, LeaderEpochCheckpointFile
from rayk.storage.dir_lock import DirLock
from rayk.storage.leader_epoch_cache import LeaderEpochCache
from rayk.storage.log_config import MAX_MESSAGE_BYTES_LIMIT, LogConfig
from rayk.storage.producer_state import ProducerStateManager, VerificationGuard
from rayk.storage.records import (
    BatchHeader,
    TimestampType,
    decode_record_tuples,
    iter_batches,
    set_base_offset_and_epoch,
    set_log_append_time,
    validate_batches,
)
from rayk.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LogSegment
from rayk.storage.segment_flusher import SegmentFlusher
from rayk.storage.transaction_index import AbortedTxn

logger = logging.getLogger(__name__)

_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)$")
CLEANED_SUFFIX = ".cleaned"  # a segment the cleaner is writing
SWAP_SUFFIX = ".swap"  # a cleaned segment committed to replace the segments it covers
_TEMPORARY_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)\.(cleaned|swap)$")


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


class ReadResult(NamedTuple):
    """Whole batches read from the log, with the log's bounds taken before the read."""

    records: bytes
    next_offset: int  # offset after the last batch returned; the start offset if none
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int


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


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    timestamp_ms: int
    offset: int


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Log:
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
    ) -> None:
        """`lock_wait_ms`: take the directory's `.lock` (see dir_lock.py), waiting up to this
        long for a dying previous owner; None (tools, tests) takes no lock.
        `cleaner_offset`: the cleaner's checkpoint (None: nothing cleaned yet)."""
        self.dir_path = Path(dir_path)
        self.config = config or LogConfig()
        self._clock_ms = clock_ms
        self._lock = threading.RLock()
        self._closed = False
        self._cleaning_aborted = False
        self._truncations = 0  # bumped when offsets below the LEO are rewritten
        self._flusher = SegmentFlusher(self.dir_path.name, self._rolled_segment_flushed)
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
        clock_ms = self._clock_ms
        self.leader_epoch_cache = LeaderEpochCache(
            LeaderEpochCheckpointFile(self.dir_path / LeaderEpochCheckpointFile.FILE_NAME)
        )
        self.producer_state = ProducerStateManager()
        self._segments: list[LogSegment] = []
        self._base_offsets: list[int] = []
        self.truncated_on_recovery_bytes = 0
        txn_index_from = self._load(recovery_point, cleaner_offset or 0)
        self._log_end_offset = self._segments[-1].next_offset()
        first_base = self._segments[0].base_offset
        self._log_start_offset = min(max(log_start_offset or 0, first_base), self._log_end_offset)
        hw = self._log_start_offset if high_watermark is None else high_watermark
        self._high_watermark = min(max(hw, self._log_start_offset), self._log_end_offset)
        self._cleaner_offset = min(max(cleaner_offset or 0, self._log_start_offset), self._log_end_offset)
        self._recovery_point = self._log_end_offset
        self._unflushed_records = 0
        self._last_flush_ms = clock_ms()
        self.leader_epoch_cache.truncate_from_end(self._log_end_offset)
        self.leader_epoch_cache.truncate_from_start(self._log_start_offset)
        self._rebuild_producer_state(txn_index_from)

    # ------------------------------------------------------------------ loading

    def _finish_interrupted_cleaning(self) -> None:
        """Kafka's swap recovery: a `.swap` segment was committed, so the segments it covers
        (base offsets in [its base, its next offset)) go and it takes the segment names;
        `.cleaned` files, and `.swap` indexes without their `.log.swap`, are an unfinished
        clean and go. Nothing before a `.swap` rename is visible: the old segments stand."""
        swaps = []
        for path in self.dir_path.iterdir():
            match = _TEMPORARY_FILE.match(path.name)
            if match is None:
                continue
            if match.group(3) == "swap" and match.group(2) == "log":
                swaps.append(int(match.group(1)))
            elif match.group(3) == "cleaned" or not (self.dir_path / f"{match.group(1)}{LOG_SUFFIX}{SWAP_SUFFIX}").exists():
                path.unlink()
        for base in sorted(swaps):
            swap = LogSegment(self.dir_path, base, self.config, active=False, file_suffix=SWAP_SUFFIX)
            if swap.load() is not None:
                swap.recover()
                swap.on_roll()
            end = swap.next_offset()
            for path in self.dir_path.iterdir():
                match = _SEGMENT_FILE.match(path.name)
                if match is not None and base <= int(match.group(1)) < max(end, base + 1):
                    path.unlink()
            swap.rename_files("")
            swap.close()
            logger.warning("%s: finished an interrupted clean: segment %d swapped in", self.dir_path, base)

    def _load(self, recovery_point: int | None, cleaner_offset: int) -> int | None:
        """Opens and recovers the segments; returns the base offset from which their
        transaction indexes must be rebuilt (None: none must)."""
        self._finish_interrupted_cleaning()
        bases: set[int] = set()
        for path in self.dir_path.iterdir():
            match = _SEGMENT_FILE.match(path.name)
            if match is None:
                continue
            if match.group(2) == "log":
                bases.add(int(match.group(1)))
            elif not path.with_suffix(LOG_SUFFIX).exists():
                path.unlink()  # an index whose .log is gone (a crash mid-delete) is garbage
        for base in sorted(bases):
            self._add_segment(LogSegment(self.dir_path, base, self.config, active=False))
        if not self._segments:
            self._add_segment(LogSegment(self.dir_path, 0, self.config, active=True))
            return None
        first_to_recover = len(self._segments) - 1
        if recovery_point is not None:
            first_to_recover = min(first_to_recover, max(bisect.bisect_right(self._base_offsets, recovery_point) - 1, 0))
        rescanned_from = self._segments[first_to_recover].base_offset
        epochs_found: list[EpochEntry] = []  # (epoch, first offset) where the re-read batches' epoch changes
        txn_index_from: int | None = None  # the first segment whose transaction index is rebuilt
        marker_seen = False

        def note_epoch(header: BatchHeader) -> None:
            nonlocal marker_seen
            epoch = header.partition_leader_epoch
            if epoch >= 0 and (not epochs_found or epochs_found[-1].epoch != epoch):
                epochs_found.append(EpochEntry(epoch, header.base_offset))
            marker_seen = marker_seen or header.is_control

        for segment in self._segments[:first_to_recover]:
            if segment.load() is not None:
                segment.recover(note_epoch)  # index missing or insane: rebuild it from the .log
                segment.on_roll()
            if segment.txn_index.problem is not None and txn_index_from is None:
                logger.warning("%s: rebuilding the transaction index of segment %d: %s",
                               self.dir_path, segment.base_offset, segment.txn_index.problem)  # fmt: skip
                txn_index_from = segment.base_offset
        for i in range(first_to_recover, len(self._segments)):
            segment = self._segments[i]
            marker_seen = False
            truncated = segment.recover(note_epoch)
            if marker_seen or segment.txn_index.problem is not None:
                txn_index_from = segment.base_offset if txn_index_from is None else txn_index_from
            elif txn_index_from is None:
                segment.txn_index.reset()  # no marker: no aborted transaction ends here
            self.truncated_on_recovery_bytes += truncated
            following = self._segments[i + 1 :]
            # A gap is compaction's doing; an overlap means the next segment cannot be trusted.
            broken_chain = bool(following) and following[0].base_offset < segment.next_offset()
            if truncated or broken_chain:
                # Nothing after an invalid byte can be trusted: drop every later segment.
                for later in following:
                    self.truncated_on_recovery_bytes += later.size_bytes
                    later.delete()
                del self._segments[i + 1 :], self._base_offsets[i + 1 :]
                break
            if following:
                segment.on_roll()
        self._segments[-1].make_active()
        self._segments[-1].flush()
        # A checkpoint lost or left stale by a crash is brought forward from the batches;
        # the constructor then cuts it at the (possibly truncated) LEO.
        self.leader_epoch_cache.recover(rescanned_from, epochs_found, compacted_below_offset=cleaner_offset)
        return txn_index_from

    def _rebuild_producer_state(self, txn_index_from: int | None = None) -> None:
        """Producer state from the newest valid snapshot in [log start, min(LEO, HW)] plus
        the batches after it (Kafka's UnifiedLog.loadProducerState); starting at or below
        the HW, the replay sees every marker the HW has not passed. Snapshots outside
        [log start, LEO], damaged ones, and strays below the one loaded that are not a
        segment's base are deleted. Segments from `txn_index_from` on have their
        transaction index written again by the replay (the snapshot is then taken at or
        below it)."""
        start, leo = self._log_start_offset, self._log_end_offset
        limit = min(leo, self._high_watermark if txn_index_from is None else min(self._high_watermark, txn_index_from))
        offsets = producer_snapshot.snapshot_offsets(self.dir_path)
        doomed = [o for o in offsets if not start <= o <= leo]
        loaded, replay_from = ProducerStateManager(), start
        for offset in reversed([o for o in offsets if start <= o <= limit]):
            try:
                state = producer_snapshot.read(self.dir_path, offset)
                if any(b.last_offset >= offset for e in state.producers.values() for b in e.batches):
                    raise KafkaStorageError(f"producer snapshot at {offset} holds batches at or above {offset}")
            except KafkaStorageError as e:
                logger.warning("%s: ignoring producer snapshot %d: %s", self.dir_path, offset, e)
                producer_snapshot.delete(self.dir_path, [offset])
                continue
            loaded, replay_from = state, offset
            break
        segment_bases = set(self._base_offsets)
        doomed += [o for o in offsets if o < replay_from and o >= start and o not in segment_bases]
        producer_snapshot.delete(self.dir_path, doomed)
        loaded.remove_batches_below(start)
        if replay_from < leo:
            first = max(bisect.bisect_right(self._base_offsets, replay_from) - 1, 0)
            for segment in self._segments[first:]:
                indexed = txn_index_from is not None and segment.base_offset >= txn_index_from
                if indexed:
                    segment.txn_index.reset()
                for location in segment.batch_locations(replay_from):
                    header = location.header
                    if header.producer_id < 0:
                        continue
                    if not header.is_control:
                        loaded.record_batch(header)
                        continue
                    try:
                        marker = read_end_txn_marker(segment.read_batch(location))
                    except KafkaError as e:  # CRC-valid but not a control record: not a marker
                        logger.warning("%s: control batch at %d: %s", self.dir_path, header.base_offset, e)
                        continue
                    if marker is not None:
                        self._complete_txn(loaded, header, marker, segment if indexed else None)
        self.producer_state.replace_with(loaded)
        self.producer_state.on_high_watermark_updated(self._high_watermark)

    def _complete_txn(
        self, state: ProducerStateManager, header: BatchHeader, marker: EndTxnMarker, segment: LogSegment | None
    ) -> None:
        """A marker ends its producer's transaction; an abort is indexed in `segment`."""
        txn = state.complete_txn(header, marker.commit, marker.coordinator_epoch)
        if txn.is_aborted and segment is not None:
            segment.txn_index.append(
                AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, state.last_stable_offset_after(txn))
            )

    def _add_segment(self, segment: LogSegment) -> None:
        assert not self._base_offsets or segment.base_offset > self._base_offsets[-1]
        self._segments.append(segment)
        self._base_offsets.append(segment.base_offset)

    # ------------------------------------------------------------------ properties

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def recovery_point(self) -> int:
        """Offsets below this are known to be on disk (fsynced)."""
        return self._recovery_point

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        with self._lock:
            if not self._log_start_offset <= offset <= self._log_end_offset:
                raise ValueError(
                    f"high watermark {offset} outside [log start {self._log_start_offset}, LEO {self._log_end_offset}]"
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
            return sum(segment.size_bytes for segment in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        with self._lock:
            return list(self._base_offsets)

    @property
    def latest_epoch(self) -> int:
        return self.leader_epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as answered to OffsetsForLeaderEpoch (see LeaderEpochCache)."""
        with self._lock:
            return self.leader_epoch_cache.end_offset_for(epoch, self._log_end_offset)

    def assign_leader_epoch(self, epoch: int) -> None:
        """This replica starts leading in `epoch` at the LEO (Kafka's maybeAssignEpochStartOffset
        in makeLeader), before any batch of the epoch is written: a follower asking where
        an older epoch ends learns it ends here, not at the next batch the leader takes."""
        with self._lock:
            self._check_open()
            if epoch < self.leader_epoch_cache.latest_epoch:
                raise FencedLeaderEpochError(f"leading in epoch {epoch} after epoch {self.leader_epoch_cache.latest_epoch}")
            self.leader_epoch_cache.assign(epoch, self._log_end_offset)

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

        Only baseOffset and partitionLeaderEpoch are rewritten in each header (outside the
        CRC); with LogAppendTime also maxTimestamp and the timestamp-type bit, and the CRC.
        Records are never re-encoded. A rejected input leaves the log untouched. Control
        batches are refused (markers come through `append_txn_marker`), and transactional
        ones unless `allow_transactional` (the caller checked the transaction).

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
            _require_keys(records)
        with self._lock:
            self._check_open()
            if leader_epoch < self.leader_epoch_cache.latest_epoch:
                raise FencedLeaderEpochError(
                    f"append in leader epoch {leader_epoch} after epoch {self.leader_epoch_cache.latest_epoch}"
                )
            if any(header.producer_id >= 0 for header in headers):
                duplicate = self.producer_state.validate_client_batches(headers, verification_guard)
                if duplicate is not None:
                    return LogAppendInfo(
                        duplicate.first_offset, duplicate.last_offset, duplicate.timestamp_ms, -1,
                        self._log_start_offset, 0, 0, duplicate=True,
                    )  # fmt: skip
            now_ms = self._clock_ms()
            log_append_time = self.config.message_timestamp_type == TimestampType.LOG_APPEND_TIME
            data = bytearray(records)
            assigned: list[BatchHeader] = []
            offset, position = self._log_end_offset, 0
            for header in headers:
                set_base_offset_and_epoch(data, position, offset, leader_epoch)
                if log_append_time:
                    set_log_append_time(data, position, header.size_bytes, now_ms)
                assigned.append(BatchHeader.parse(data, position))
                offset += header.record_count
                position += header.size_bytes
            self._append(data, assigned, now_ms)
            self.leader_epoch_cache.assign(leader_epoch, assigned[0].base_offset)
            return self._append_info(assigned, len(data), now_ms if log_append_time else -1)

    def verification_guard(self, producer_id: int) -> VerificationGuard:
        """The guard a leader takes before it verifies a transaction's first batch here with
        the transaction coordinator, to append it with (see producer_state.py)."""
        with self._lock:
            return self.producer_state.verification_guard(producer_id)

    def holds_verification(self, guard: VerificationGuard) -> bool:
        """Whether a marker voided `guard` since it was taken (see producer_state.py)."""
        with self._lock:
            return self.producer_state.holds_verification(guard)

    def append_as_follower(self, records: bytes | bytearray | memoryview) -> LogAppendInfo:
        """Appends batches copied from the leader; their offsets continue at the LEO, or
        after it when the leader's log was compacted (offsets only grow, as in Kafka).

        As in Kafka, a follower checks framing and CRCs but not the leader's size limit
        or record contents, which the leader validated.
        """
        headers = validate_batches(records, None, leader_checks=False)
        with self._lock:
            self._check_open()
            expected = self._log_end_offset
            for header in headers:
                if header.base_offset < expected:
                    raise UnexpectedAppendOffsetError(
                        f"follower batch starts at offset {header.base_offset} but the log expects {expected} or later"
                    )
                expected = header.next_offset
            self._append(records, headers, self._clock_ms())
            for header in headers:
                self.leader_epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
            return self._append_info(headers, len(records), -1)

    def append_txn_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, leader_epoch: int
    ) -> LogAppendInfo:
        """Appends, as the leader, a transaction coordinator's COMMIT or ABORT marker for the
        producer (Kafka's appendAsLeader with origin COORDINATOR). INVALID_PRODUCER_EPOCH if
        the producer has written with a newer epoch, TRANSACTION_COORDINATOR_FENCED if a
        newer coordinator already wrote a marker for it."""
        with self._lock:
            self._check_open()
            if leader_epoch < self.leader_epoch_cache.latest_epoch:
                raise FencedLeaderEpochError(
                    f"marker in leader epoch {leader_epoch} after epoch {self.leader_epoch_cache.latest_epoch}"
                )
            entry = self.producer_state.producers.get(producer_id)
            if entry is not None and producer_epoch < entry.epoch:
                raise InvalidProducerEpochError(
                    f"marker of producer {producer_id} in epoch {producer_epoch}, which has written in epoch {entry.epoch}"
                )
            if entry is not None and coordinator_epoch < entry.coordinator_epoch:
                raise TransactionCoordinatorFencedError(
                    f"marker of producer {producer_id} from coordinator epoch {coordinator_epoch}, after one from "
                    f"epoch {entry.coordinator_epoch}"
                )
            now_ms = self._clock_ms()
            marker = build_end_txn_marker(
                producer_id, producer_epoch, commit, coordinator_epoch, now_ms,
                base_offset=self._log_end_offset, partition_leader_epoch=leader_epoch,
            )  # fmt: skip
            header = BatchHeader.parse(marker)
            self._append(marker, [header], now_ms)
            self.leader_epoch_cache.assign(leader_epoch, header.base_offset)
            return self._append_info([header], len(marker), -1)

    def _append_info(self, headers: list[BatchHeader], size_bytes: int, log_append_time_ms: int) -> LogAppendInfo:
        return LogAppendInfo(
            first_offset=headers[0].base_offset,
            last_offset=headers[-1].last_offset,
            max_timestamp_ms=max(h.max_timestamp for h in headers),
            log_append_time_ms=log_append_time_ms,
            log_start_offset=self._log_start_offset,
            record_count=sum(h.record_count for h in headers),
            size_bytes=size_bytes,
        )

    def _append(self, data: bytes | bytearray | memoryview, headers: list[BatchHeader], now_ms: int) -> None:
        segment_bytes = self.config.segment_bytes
        view = memoryview(data)
        markers: dict[int, EndTxnMarker | None] = {}  # base offset -> what a control batch says
        position = 0
        for header in headers:
            if header.size_bytes > segment_bytes:
                raise RecordBatchTooLargeError(
                    f"batch of {header.size_bytes} bytes can never fit in a segment of segment.bytes = {segment_bytes}"
                )
            if header.is_control and header.producer_id >= 0:  # read before anything is written
                markers[header.base_offset] = read_end_txn_marker(view[position : position + header.size_bytes])
            position += header.size_bytes
        start = 0  # index into headers of the next chunk
        position = 0
        while start < len(headers):
            # As many batches as fit in one segment go in one write.
            end, size = start, 0
            while end < len(headers) and size + headers[end].size_bytes <= segment_bytes:
                size += headers[end].size_bytes
                end += 1
            chunk = headers[start:end]
            max_timestamp = max(h.max_timestamp for h in chunk)
            if self._segments[-1].should_roll(size, max_timestamp, chunk[-1].last_offset, now_ms):
                self._roll(chunk[0].base_offset)  # past a compaction gap: the segment starts at the batch
            active = self._segments[-1]
            active.append(view[position : position + size], chunk)
            producer_state = self.producer_state
            for header in chunk:
                if header.producer_id < 0:
                    continue
                if not header.is_control:
                    producer_state.record_batch(header)
                elif (marker := markers[header.base_offset]) is not None:
                    self._complete_txn(producer_state, header, marker, active)
            assert chunk[-1].next_offset > self._log_end_offset, "offsets only grow"
            self._log_end_offset = chunk[-1].next_offset
            self._unflushed_records += sum(h.record_count for h in chunk)
            start, position = end, position + size
        self._maybe_flush(now_ms)

    def _maybe_flush(self, now_ms: int) -> None:
        flush_messages, flush_ms = self.config.flush_messages, self.config.flush_ms
        if (flush_messages is not None and self._unflushed_records >= flush_messages) or (
            flush_ms is not None and now_ms - self._last_flush_ms >= flush_ms
        ):
            self._flush()

    # ------------------------------------------------------------------ read

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> ReadResult:
        """Whole batches starting with the one that holds `start_offset`.

        At most `max_bytes`, except that the first batch is returned whatever its size when
        `min_one_batch` (so a consumer can always make progress). Batches reaching
        `max_offset` or beyond are left out (consumers pass the HW). Offsets outside
        [log start, LEO] raise OffsetOutOfRangeError; at the LEO the result is empty.
        """
        if max_bytes < 0:
            raise InvalidFetchSizeError(f"max_bytes must be >= 0, got {max_bytes}")
        with self._lock:
            self._check_open()
            hw, start, leo = self._high_watermark, self._log_start_offset, self._log_end_offset
            if not start <= start_offset <= leo:
                raise OffsetOutOfRangeError(f"offset {start_offset} is outside the log's range [{start}, {leo}]")
            data, next_offset = b"", start_offset
            if start_offset < leo and (max_offset is None or start_offset < max_offset):
                i = bisect.bisect_right(self._base_offsets, start_offset) - 1
                for segment in self._segments[i:]:
                    found = segment.read(start_offset, max_bytes, max_offset, min_one_batch)
                    if found is not None:
                        data, next_offset = found
                        break
                else:  # no batch at or after start_offset: the rest up to the LEO was compacted away
                    next_offset = leo
            return ReadResult(data, next_offset, hw, start, leo, self._last_stable_offset())

    def aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions that overlap [start_offset, upper_bound_offset): what a
        `read_committed` fetch that read that range returns beside its records."""
        with self._lock:
            self._check_open()
            found: list[AbortedTxn] = []
            first = max(bisect.bisect_right(self._base_offsets, start_offset) - 1, 0)
            for segment in self._segments[first:]:
                txns, complete = segment.txn_index.collect(start_offset, upper_bound_offset)
                found += txns
                if complete:
                    break
            return found

    def offset_for_timestamp(self, timestamp_ms: int) -> TimestampOffset | None:
        """The earliest record whose timestamp is >= `timestamp_ms`, or None if none is."""
        if timestamp_ms < 0:
            raise ValueError(f"timestamp must be >= 0, got {timestamp_ms}")
        with self._lock:
            self._check_open()
            for segment in self._segments:
                found = segment.find_offset_by_timestamp(timestamp_ms)
                if found is not None and found[1] >= self._log_start_offset:
                    return TimestampOffset(*found)
            return None

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
            if offset >= self._log_end_offset:
                self.leader_epoch_cache.truncate_from_end(self._log_end_offset)
                return
            if offset < self._log_start_offset:
                self._truncate_fully_and_start_at(offset)
                return
            self._truncations += 1
            keep = bisect.bisect_right(self._base_offsets, offset)
            for segment in self._segments[keep:]:
                segment.delete()
            del self._segments[keep:], self._base_offsets[keep:]
            last = self._segments[-1]
            cut = last.translate_offset(offset)  # the first batch that goes, if one does
            last.truncate_to(offset)
            last.make_active()
            self._log_end_offset = min(offset, cut.header.base_offset) if cut is not None else offset
            assert self._log_end_offset >= last.next_offset(), "the LEO is at or past the last batch"
            self._high_watermark = min(self._high_watermark, self._log_end_offset)
            self._cleaner_offset = min(self._cleaner_offset, self._log_end_offset)
            self._recovery_point = min(self._recovery_point, self._log_end_offset)
            self.leader_epoch_cache.truncate_from_end(self._log_end_offset)
            self._rebuild_producer_state()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Deletes every segment and restarts the log empty at `offset` (a follower whose
        LEO fell below the leader's log start)."""
        with self._lock:
            self._check_open()
            self._truncate_fully_and_start_at(offset)

    def _truncate_fully_and_start_at(self, offset: int) -> None:
        self._truncations += 1
        for segment in self._segments:
            segment.delete()
        self._segments.clear()
        self._base_offsets.clear()
        self._add_segment(LogSegment(self.dir_path, offset, self.config, active=True))
        self._log_end_offset = self._log_start_offset = self._high_watermark = self._recovery_point = offset
        self._cleaner_offset = offset
        self.leader_epoch_cache.clear()
        producer_snapshot.delete(self.dir_path, producer_snapshot.snapshot_offsets(self.dir_path))
        self.producer_state.clear()

    def update_config(self, config: LogConfig) -> None:
        """Applies changed topic configs (Kafka's dynamic topic config): retention, roll,
        flush and validation settings take effect for the next append or retention check."""
        with self._lock:
            self.config = config
            for segment in self._segments:
                segment.update_config(config)

    def roll(self) -> None:
        """Starts a new segment at the LEO (nothing happens if the last one is empty)."""
        with self._lock:
            self._check_open()
            self._roll()

    def _roll(self, base: int | None = None) -> None:
        """Starts a new segment at `base` (default: the LEO; a follower copying past a
        compaction gap starts it at its first batch, so relative offsets stay int32)."""
        active = self._segments[-1]
        if active.is_empty:
            return
        self._flusher.submit(active.seal(), self._log_end_offset, self._truncations)
        base = self._log_end_offset if base is None else base
        assert base >= self._log_end_offset, "offsets only grow"
        if (self.dir_path / f"{base:020d}{LOG_SUFFIX}").exists():
            raise KafkaStorageError(f"cannot roll: segment {base:020d}{LOG_SUFFIX} already exists in {self.dir_path}")
        self._add_segment(LogSegment(self.dir_path, base, self.config, active=True))
        # After the new segment exists: if this write fails the log is still consistent,
        # and reopening falls back to an older snapshot.
        producer_snapshot.write(self.dir_path, base, self.producer_state)

    def _rolled_segment_flushed(self, end_offset: int, truncations: int) -> None:
        """The flusher made a rolled segment durable (its thread)."""
        with self._lock:
            if not self._closed and truncations == self._truncations:  # else that history is gone
                self._recovery_point = max(self._recovery_point, min(end_offset, self._log_end_offset))

    def flush(self) -> None:
        """Fsyncs everything up to the LEO; the recovery point moves there."""
        with self._lock:
            self._check_open()
            self._flush()

    def _flush(self) -> None:
        first = max(bisect.bisect_right(self._base_offsets, self._recovery_point) - 1, 0)
        for segment in self._segments[first:]:
            segment.flush()
        self._recovery_point = self._log_end_offset
        self._unflushed_records = 0
        self._last_flush_ms = self._clock_ms()

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

    def delete_expired_segments(self, now_ms: int | None = None) -> int:
        """Deletes whole segments wholly below the log start offset (moved by DeleteRecords),
        and with cleanup.policy delete those past `retention.ms` or beyond `retention.bytes`,
        oldest first, never one that holds offsets at or above the HW. Returns how many went.
        A compact-only log keeps every key's latest record above its log start."""
        with self._lock:
            self._check_open()
            now_ms = self._clock_ms() if now_ms is None else now_ms
            retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
            excess_bytes = sum(s.size_bytes for s in self._segments) - retention_bytes
            doomed = 0
            for i, segment in enumerate(self._segments):
                upper = self._segments[i + 1].base_offset if i + 1 < len(self._segments) else self._log_end_offset
                if (segment.is_empty and i == len(self._segments) - 1) or upper > self._high_watermark:
                    break
                if upper <= self._log_start_offset and i + 1 < len(self._segments):
                    excess_bytes -= segment.size_bytes
                    doomed += 1
                    continue
                if not self.config.deletes:
                    break
                newest_ms = segment.max_timestamp_ms if segment.max_timestamp_ms >= 0 else segment.last_modified_ms
                expired = retention_ms >= 0 and now_ms - newest_ms > retention_ms
                oversize = retention_bytes >= 0 and excess_bytes - segment.size_bytes >= 0
                if not (expired or oversize):
                    break
                excess_bytes -= segment.size_bytes
                doomed += 1
            if doomed == 0:
                return 0
            if doomed == len(self._segments):
                self._roll()  # the log always keeps an active segment
            for segment in self._segments[:doomed]:
                segment.delete()
            del self._segments[:doomed], self._base_offsets[:doomed]
            self._advance_log_start(max(self._log_start_offset, self._segments[0].base_offset))
            assert self._log_start_offset <= self._high_watermark <= self._log_end_offset
            return doomed

    # ------------------------------------------------------------------ compaction

    def cleanable_segments(self, first_uncleanable_offset: int) -> tuple[list[ClosedSegment], int]:
        """The segments that lie wholly below `first_uncleanable_offset` (the active one
        never does), oldest first, and the truncation count to hand `replace_segments`.
        The cleaner reads them through `read_segment_bytes`; a truncation or retention
        that takes one meanwhile makes `replace_segments` refuse the clean."""
        with self._lock:
            self._check_open()
            limit = min(first_uncleanable_offset, self._segments[-1].base_offset)
            out = []
            for segment, end in zip(self._segments, self._base_offsets[1:]):
                if end > limit:
                    break
                out.append(
                    ClosedSegment(
                        segment, end, segment.size_bytes, segment.max_timestamp_ms, segment.first_batch_timestamp_ms(),
                        segment.last_modified_ms, segment.offset_index.size_bytes, segment.time_index.size_bytes,
                    )
                )  # fmt: skip
            return out, self._truncations

    def read_segment_bytes(self, segment: LogSegment, position: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` of `segment`'s .log from `position`; raises LogClosedError if
        the segment is no longer part of the log (retention or truncation took it)."""
        with self._lock:
            self._check_open()
            if self._cleaning_aborted:
                raise LogClosedError(f"cleaning {self.dir_path} was aborted: the log is closing")
            if not any(s is segment for s in self._segments):
                raise LogClosedError(f"segment {segment.base_offset} of {self.dir_path} was removed")
            return segment.read_bytes(position, max_bytes)

    def producer_batch_offsets(self) -> set[tuple[int, int]]:
        """(producer id, first offset) of each batch the producer state remembers: batches
        the cleaner keeps, if only as an empty header, so the state survives a rebuild."""
        with self._lock:
            return {
                (producer_id, batch.first_offset)
                for producer_id, entry in self.producer_state.producers.items()
                for batch in entry.batches
            }

    def new_cleaned_segment(self, base_offset: int) -> LogSegment:
        """An empty `.cleaned` segment for the cleaner to write (a leftover one is replaced)."""
        with self._lock:
            self._check_open()
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            (self.dir_path / f"{base_offset:020d}{suffix}{CLEANED_SUFFIX}").unlink(missing_ok=True)
        return LogSegment(self.dir_path, base_offset, self.config, active=True, file_suffix=CLEANED_SUFFIX)

    def replace_segments(self, cleaned: LogSegment, old: list[LogSegment], truncations: int) -> bool:
        """Swaps `cleaned` (a `.cleaned` segment, written and sealed) in for the consecutive
        segments `old`, with Kafka's crash-safe steps: rename to `.swap` (the commit point),
        delete `old`, rename the `.swap` files to segment names. Returns False, and deletes
        `cleaned`, if the log changed under the cleaner (truncated, retention took `old`,
        or closed): the clean is simply lost, never applied to other segments."""
        with self._lock:
            first = bisect.bisect_left(self._base_offsets, old[0].base_offset)
            current = self._segments[first : first + len(old)]
            if (
                self._closed
                or truncations != self._truncations
                or len(current) != len(old)
                or any(a is not b for a, b in zip(current, old))
                or first + len(old) >= len(self._segments)  # never the active segment
            ):
                cleaned.delete()
                return False
            assert cleaned.base_offset == old[0].base_offset, "a cleaned segment takes its first source's name"
            assert cleaned.next_offset() <= self._segments[first + len(old)].base_offset, "cleaning keeps offsets"
            for segment in old:  # the cleaner keeps transactional batches and markers whole
                for txn in segment.txn_index.entries:
                    cleaned.txn_index.append(txn)
            cleaned.flush()
            cleaned.rename_files(SWAP_SUFFIX)
            _fsync_dir(self.dir_path)
            for segment in old:
                segment.delete()
            cleaned.rename_files("")
            _fsync_dir(self.dir_path)
            self._segments[first : first + len(old)] = [cleaned]
            self._base_offsets[first : first + len(old)] = [cleaned.base_offset]
            return True

    def advance_cleaner_offset(self, offset: int, truncations: int) -> bool:
        """The cleaner finished everything below `offset` (kept within [log start, LEO]),
        unless the log was truncated since it started (what it cleaned may be gone, and
        later records there are dirty): then nothing moves and False is returned."""
        with self._lock:
            if self._closed or truncations != self._truncations:
                return False
            self._cleaner_offset = min(max(self._cleaner_offset, offset, self._log_start_offset), self._log_end_offset)
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
            self._flush()
            producer_snapshot.write(self.dir_path, self._log_end_offset, self.producer_state)
            for segment in self._segments:
                segment.close()
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
                for segment in self._segments:
                    segment.close()
                self._closed = True
        self._flusher.close()
        with self._lock:
            shutil.rmtree(self.dir_path, ignore_errors=True)
            self._release_dir_lock()

    def __repr__(self) -> str:
        return (
            f"Log({str(self.dir_path)!r}, start={self._log_start_offset}, hw={self._high_watermark}, "
            f"leo={self._log_end_offset}, segments={len(self._segments)})"
        )


def _require_keys(records: bytes | bytearray | memoryview) -> None:
    """Kafka's LogValidator for compacted topics: every record needs a key. The records
    without one are named by their index in their batch (KIP-467's record errors), those
    of the first batch that has any, as Kafka refuses a request at its first such batch."""
    for number, batch in enumerate(iter_batches(records)):
        _header, decoded = decode_record_tuples(batch.data)
        keyless = [index for index, (_offset, _timestamp, key, _value, _headers) in enumerate(decoded) if key is None]
        if keyless:
            shown = ", ".join(map(str, keyless[:3])) + (", ..." if len(keyless) > 3 else "")
            raise InvalidRecordError(
                f"{len(keyless)} of the {len(decoded)} records of batch {number} have no key (batch indexes {shown}):"
                f" {_KEYLESS_RECORD}",
                record_errors=(RecordError(index, _KEYLESS_RECORD) for index in keyless),
            )


_KEYLESS_RECORD = "a compacted topic cannot accept a record without a key"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
