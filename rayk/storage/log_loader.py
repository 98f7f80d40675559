"""LogLoader: opens a partition directory's segments and recovers them (Kafka's LogLoader).

In order:
1. A cleaner's swap that a crash interrupted is finished or discarded
   (segment_swap.finish_interrupted_swaps), and index files whose `.log` is gone (a crash
   mid-delete) are deleted.
2. Every `<base>.log` is opened as a segment. With none, the log starts empty at 0.
3. Segments before the one holding `recovery_point` (default: the last segment) are
   loaded as they are, unless an index is missing or fails its sanity check: then it is
   rebuilt from the `.log`.
4. From that segment on, every batch is re-read, its CRC checked and the indexes rebuilt
   (LogSegment.recover). A torn or corrupt tail is cut off, and every later segment is
   deleted with it (nothing after an invalid byte is trusted; nothing before it is lost);
   so is every segment after one whose next segment starts inside it.
5. The leader epoch cache is brought forward from the re-read batches' partition leader
   epochs (LeaderEpochCache.recover), so a `leader-epoch-checkpoint` lost or left stale
   by a crash is repaired; epochs of segments not re-read come only from the checkpoint,
   as in Kafka.

What it returns says from which segment on the transaction indexes must be rebuilt
(one was damaged, or a re-read segment holds a marker): the producer state's replay
(producer_state_loader.py) writes them. Runs once, in the Log's constructor, before
anything else can reach the log.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

from rayk.storage.checkpoint import EpochEntry
from rayk.storage.leader_epoch_cache import LeaderEpochCache
from rayk.storage.log_config import LogConfig
from rayk.storage.log_segments import SEGMENT_FILE, LogSegments
from rayk.storage.records import BatchHeader
from rayk.storage.segment import LOG_SUFFIX, LogSegment
from rayk.storage.segment_swap import finish_interrupted_swaps

logger = logging.getLogger(__name__)


class LoadedSegments(NamedTuple):
    """What the loader found: the segments (the last one active), the bytes recovery cut
    off, and the base offset from which the transaction indexes must be rebuilt (None:
    none must)."""

    segments: LogSegments
    truncated_bytes: int
    txn_index_from: int | None


class _RecoveryScan:
    """What recovery notes of each re-read batch: where the partition leader epoch changes
    (the epochs to bring the cache forward with), and whether the segment being re-read
    holds a transaction marker."""

    def __init__(self) -> None:
        self.epochs: list[EpochEntry] = []  # (epoch, first offset) where the re-read batches' epoch changes
        self.marker_seen = False

    def __call__(self, header: BatchHeader) -> None:
        epoch = header.partition_leader_epoch
        if epoch >= 0 and (not self.epochs or self.epochs[-1].epoch != epoch):
            self.epochs.append(EpochEntry(epoch, header.base_offset))
        self.marker_seen = self.marker_seen or header.is_control


class LogLoader:
    """Opens and recovers one partition directory's segments; see the module docstring."""

    def __init__(self, dir_path: Path, config: LogConfig, leader_epoch_cache: LeaderEpochCache) -> None:
        self._dir_path = dir_path
        self._config = config
        self._leader_epoch_cache = leader_epoch_cache

    def load(self, recovery_point: int | None, cleaner_offset: int) -> LoadedSegments:
        """The recovered segments; `recovery_point` None re-reads the last segment only.
        `cleaner_offset`: below it the log was compacted (the epoch cache knows)."""
        finish_interrupted_swaps(self._dir_path, self._config)
        segments = self._open_segments()
        if not segments:
            segments.add(LogSegment(self._dir_path, 0, self._config, active=True))
            return LoadedSegments(segments, 0, None)
        first_to_recover = len(segments) - 1
        if recovery_point is not None:
            first_to_recover = min(first_to_recover, segments.floor_index(recovery_point))
        rescanned_from = segments[first_to_recover].base_offset
        scan = _RecoveryScan()
        txn_index_from = self._load_recovered(segments[:first_to_recover], scan)
        truncated_bytes, txn_index_from = self._recover(segments, first_to_recover, scan, txn_index_from)
        segments.active.make_active()
        segments.active.flush()
        # A checkpoint lost or left stale by a crash is brought forward from the batches;
        # the Log then cuts it at the (possibly truncated) LEO.
        self._leader_epoch_cache.recover(rescanned_from, scan.epochs, compacted_below_offset=cleaner_offset)
        return LoadedSegments(segments, truncated_bytes, txn_index_from)

    def _open_segments(self) -> LogSegments:
        """Every `.log` of the directory as a segment, in base offset order; index files
        whose `.log` is gone are deleted."""
        bases: set[int] = set()
        for path in self._dir_path.iterdir():
            match = SEGMENT_FILE.match(path.name)
            if match is None:
                continue
            if match.group(2) == "log":
                bases.add(int(match.group(1)))
            elif not path.with_suffix(LOG_SUFFIX).exists():
                path.unlink()  # an index whose .log is gone (a crash mid-delete) is garbage
        segments = LogSegments()
        for base in sorted(bases):
            segments.add(LogSegment(self._dir_path, base, self._config, active=False))
        return segments

    def _load_recovered(self, segments: list[LogSegment], scan: _RecoveryScan) -> int | None:
        """Step 3, for the segments below the recovery point: loaded as they are, a
        missing or insane index rebuilt. Returns the first whose transaction index is
        damaged (None: none is)."""
        txn_index_from: int | None = None
        for segment in segments:
            if segment.load() is not None:
                segment.recover(scan)  # index missing or insane: rebuild it from the .log
                segment.on_roll()
            if segment.txn_index.problem is not None and txn_index_from is None:
                logger.warning("%s: rebuilding the transaction index of segment %d: %s",
                               self._dir_path, segment.base_offset, segment.txn_index.problem)  # fmt: skip
                txn_index_from = segment.base_offset
        return txn_index_from

    def _recover(self, segments: LogSegments, first: int, scan: _RecoveryScan, txn_index_from: int | None) -> tuple[int, int | None]:
        """Step 4, from segment `first` on; returns the bytes cut off and where the
        transaction indexes must be rebuilt from."""
        truncated_bytes = 0
        for i in range(first, len(segments)):
            segment = segments[i]
            scan.marker_seen = False
            truncated = segment.recover(scan)
            if scan.marker_seen or segment.txn_index.problem is not None:
                txn_index_from = segment.base_offset if txn_index_from is None else txn_index_from
            elif txn_index_from is None:
                segment.txn_index.reset()  # no marker: no aborted transaction ends here
            truncated_bytes += truncated
            following = segments[i + 1:]
            # A gap is compaction's doing; an overlap means the next segment cannot be trusted.
            broken_chain = bool(following) and following[0].base_offset < segment.next_offset()
            if truncated or broken_chain:
                # Nothing after an invalid byte can be trusted: drop every later segment.
                for later in segments.remove_from(i + 1):
                    truncated_bytes += later.size_bytes
                    later.delete()
                break
            if following:
                segment.on_roll()
        return truncated_bytes, txn_index_from
