"""BrokerLogManager: a broker's logs, as Kafka's LogManager keeps them, when every log lives
in its own replica process.

Owns the broker data directory's log side: the offset checkpoints (`LogDirCheckpoints`:
recovery points, log start offsets, high watermarks, cleaner offsets) and the
`<topic>-<partition>` directories. What it does, each on the ReplicaManager's timers:
- `checkpoint`, every `replica.high.watermark.checkpoint.interval.ms`: writes the offsets
  the replicas last published on the broker's board (replica_board.py: shared memory,
  no call), and keeps each log's size for the LogSize gauge (`record_log_sizes`);
- `enforce_retention`, every `log.retention.check.interval.ms`: each replica applies its
  `retention.ms` / `retention.bytes`;
- `clean_logs`, every `log.cleaner.backoff.ms` if `log.cleaner.enable`: the filthiest
  compacted log is cleaned, then the next, one at a time (so
  `log.cleaner.io.max.bytes.per.second` is the broker's), as Kafka's CleanerThread.
It also prepares a partition's directory for a new replica (`prepare_dir`: the
`partition.metadata` naming its topic id, records of an older topic of that name gone),
deletes one (`delete_partition_dir`), and at registration deletes the stray directories
of topics deleted or re-created while the broker was away (`delete_strays`).

It reads the ReplicaManager's table of replicas (their handles, board slots and topic
configs) and never changes it. Checkpoint writes and directory deletions run one at a
time under one lock, the writes in a thread (fsyncs stay off the event loop), so a
partition deleted meanwhile is never written back. Not thread-safe otherwise: the
ReplicaManager's event loop calls it.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rayk import metrics
from rayk.config import BrokerConfig, log_config_of
from rayk.replication.replica_board import BoardSlot, ReplicaBoard
from rayk.storage import partition_metadata
from rayk.storage.log_cleaner import CleanableState
from rayk.storage.log_dir_checkpoints import LogDirCheckpoints, PartitionOffsets
from rayk.storage.log_manager import partition_dir_name

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class HostedReplica(Protocol):
    """What this reads of a ReplicaManager's replica."""

    handle: Any  # None while its process is dead
    slot: BoardSlot | None
    assignment: Any  # its PartitionAssignment: `.configs` are its topic's


class BrokerLogManager:
    """The broker directory's checkpoints and partition directories; retention and cleaning."""

    def __init__(self, broker_id: int, directory: Path, board: ReplicaBoard, replicas: Mapping[TopicPartition, HostedReplica],
                 config: BrokerConfig) -> None:
        self.broker_id = broker_id
        self.dir = directory
        self._board = board
        self._replicas = replicas
        self._config = config
        self._checkpoints = LogDirCheckpoints(directory)
        self._lock = asyncio.Lock()  # checkpoint writes and directory deletions, one at a time
        self._log_sizes: dict[TopicPartition, int] = {}  # bytes, as of the last checkpoint
        # Partitions whose directory a replica was given and not released (never strays): a
        # replica's directory is prepared before its process exists and is in `replicas`.
        self._given: set[TopicPartition] = set()

    def offsets(self, tp: TopicPartition) -> PartitionOffsets:
        """The partition's checkpointed offsets, for its replica to reopen its log with."""
        return self._checkpoints.offsets(tp)

    # ------------------------------------------------------------------ checkpoints

    async def checkpoint(self) -> None:
        """Writes the offsets the replicas last published on the board. Under the lock, so
        that a partition deleted meanwhile (its replica is forgotten before its directory
        goes) is not written back."""
        async with self._lock:
            published = {
                tp: p for tp, r in self._replicas.items()
                if r.handle is not None and r.slot is not None and (p := self._board.read(r.slot)) is not None
            }  # fmt: skip
            self._log_sizes = {tp: p.size_bytes for tp, p in published.items()}
            await asyncio.to_thread(self._checkpoints.write, {tp: p.offsets for tp, p in published.items()})

    async def write_checkpoints(self, offsets: dict[TopicPartition, PartitionOffsets]) -> None:
        """Writes the offsets of closed replicas (a stop, a clean shutdown)."""
        async with self._lock:
            # Three fsyncs: off the event loop, so heartbeats and pushes are not held up by the disk.
            await asyncio.to_thread(self._checkpoints.write, offsets)

    @property
    def log_sizes(self) -> dict[TopicPartition, int]:
        """Each hosted replica's log size in bytes as of the last checkpoint."""
        return {tp: size for tp, size in self._log_sizes.items() if tp in self._replicas}

    def record_log_sizes(self) -> None:
        """Each hosted replica's log size as of the last checkpoint (Kafka's LogSize gauge)."""
        for (topic, partition), size_bytes in self._log_sizes.items():
            if (topic, partition) in self._replicas:
                metrics.record_log_size(self.broker_id, topic, partition, size_bytes)

    # ------------------------------------------------------------------ partition directories

    async def prepare_dir(self, tp: TopicPartition, topic_id: str) -> Path:
        """The partition's directory for a new replica of topic `topic_id`: one left by a
        deleted topic that had the same name is deleted first."""
        self._given.add(tp)  # before any await: from now on it is not a stray (delete_strays)
        log_dir = self.dir / partition_dir_name(*tp)
        if partition_metadata.read(log_dir) not in (None, topic_id):
            await self.delete_partition_dir(tp)  # records of a deleted topic that had the same name
        partition_metadata.write(log_dir, topic_id)
        return log_dir

    def release_dir(self, tp: TopicPartition) -> None:
        """The partition's replica stops here: its directory may be a stray again."""
        self._given.discard(tp)

    async def delete_partition_dir(self, tp: TopicPartition) -> None:
        async with self._lock:
            self._remove_dir(tp)

    def _remove_dir(self, tp: TopicPartition) -> None:
        shutil.rmtree(self.dir / partition_dir_name(*tp), ignore_errors=True)
        self._checkpoints.remove(tp)

    async def delete_strays(self, assigned: dict[TopicPartition, str]) -> None:
        """Removes partition directories of topics deleted (or re-created) while we were away:
        those the registration's `assigned` (partition -> topic id) does not name with their
        topic id and that no replica of this broker holds (or is being started on)."""
        for path in self.dir.iterdir():
            if not path.is_dir() or (topic_id := partition_metadata.read(path)) is None:
                continue
            topic, _, partition = path.name.rpartition("-")
            if not partition.isdigit():
                continue
            tp = (topic, int(partition))
            if assigned.get(tp) == topic_id:
                continue
            async with self._lock:
                # Decided under the lock, after its wait: a push may have given the
                # directory to a new replica meanwhile (its process starting on it).
                if tp in self._replicas or tp in self._given:
                    continue
                logger.info("broker %d: deleting stray partition directory %s", self.broker_id, path)
                self._remove_dir(tp)

    # ------------------------------------------------------------------ retention and compaction

    async def enforce_retention(self) -> None:
        handles = [r.handle for r in self._replicas.values() if r.handle is not None]
        await asyncio.gather(*(h.enforce_retention.remote() for h in handles), return_exceptions=True)

    async def clean_logs(self) -> None:
        """Cleans compacted logs, filthiest first, until none needs it (Kafka's
        CleanerThread with grabFilthiestCompactedLog); a log cleaned already this round
        waits for the next, so a log written faster than it is cleaned cannot starve the rest."""
        c = self._config
        cleaned: set[TopicPartition] = set()
        while True:
            items = [
                (tp, r.handle)
                for tp, r in self._replicas.items()
                if r.handle is not None and tp not in cleaned and log_config_of(r.assignment.configs).compacts
            ]
            states = await asyncio.gather(*(h.cleanable_state.remote() for _, h in items), return_exceptions=True)
            candidates = [
                (state.max_lag_passed, state.dirty_ratio, tp, handle)
                for (tp, handle), state in zip(items, states)
                if isinstance(state, CleanableState)
                and tp in self._replicas  # not stopped meanwhile
                and state.needs_cleaning(log_config_of(self._replicas[tp].assignment.configs).min_cleanable_dirty_ratio)
            ]
            if not candidates:
                return
            _lagging, _ratio, tp, handle = max(candidates, key=lambda c: c[:2])
            cleaned.add(tp)
            try:
                result = await handle.clean_log.remote(
                    float(c.log_cleaner_io_max_bytes_per_second), c.log_cleaner_dedupe_buffer_size
                )
            except Exception as e:  # a dead replica is the supervisor's; the others still get cleaned
                logger.warning("broker %d: cleaning %s-%d failed: %s", self.broker_id, *tp, e)
                continue
            if result is not None:
                logger.info(
                    "broker %d: cleaned %s-%d up to offset %d: %d records removed, %d bytes read, %d written",
                    self.broker_id, *tp, result.end_offset, result.records_removed, result.bytes_read, result.bytes_written,
                )
