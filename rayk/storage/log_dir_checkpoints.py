"""LogDirCheckpoints: the offset checkpoints of one broker data directory.

Kafka keeps, per log directory, `recovery-point-offset-checkpoint` (offsets below which
each log is known to be on disk), `log-start-offset-checkpoint`,
`replication-offset-checkpoint` (high watermarks) and `cleaner-offset-checkpoint` (where
each compacted log's dirty part starts). This class reads them once at
startup, hands each partition its `PartitionOffsets`, and rewrites all four together
(each atomically, see `checkpoint.py`). Partitions not passed to `write` keep their last
checkpointed offsets, because a log that is not open (yet) must not lose its recovery
point; `remove` forgets a deleted partition.

Not thread-safe; the owner (LogManager or a ReplicaManager actor) serialises calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rayk.storage.checkpoint import OffsetCheckpointFile

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """What a log needs to reopen quickly and keep its high watermark (None: unknown)."""

    recovery_point: int | None = None
    log_start_offset: int | None = None
    high_watermark: int | None = None
    cleaner_offset: int | None = None


class LogDirCheckpoints:
    """The four offset checkpoint files of one data directory, read once when constructed and
    held in memory, one table per file; `offsets` serves a partition's, `write` merges and
    rewrites all four atomically. Not thread-safe: its owner serialises calls."""

    def __init__(self, data_dir: str | Path) -> None:
        data_dir = Path(data_dir)
        self._files = (
            OffsetCheckpointFile(data_dir / OffsetCheckpointFile.RECOVERY_POINT),
            OffsetCheckpointFile(data_dir / OffsetCheckpointFile.LOG_START_OFFSET),
            OffsetCheckpointFile(data_dir / OffsetCheckpointFile.HIGH_WATERMARK),
            OffsetCheckpointFile(data_dir / OffsetCheckpointFile.CLEANER_OFFSET),
        )
        self._tables: tuple[dict[TopicPartition, int], ...] = tuple(f.read() for f in self._files)

    def offsets(self, tp: TopicPartition) -> PartitionOffsets:
        return PartitionOffsets(*(table.get(tp) for table in self._tables))

    def write(self, offsets: Mapping[TopicPartition, PartitionOffsets]) -> None:
        """Records `offsets` over the last checkpoint and rewrites the files."""
        tables = tuple(dict(t) for t in self._tables)
        for tp, po in offsets.items():
            for table, value in zip(tables, (po.recovery_point, po.log_start_offset, po.high_watermark, po.cleaner_offset)):
                if value is not None:
                    table[tp] = value
        for file, table in zip(self._files, tables):
            file.write(table)
        self._tables = tables

    def remove(self, tp: TopicPartition) -> None:
        """Forgets a deleted partition (written out by the next `write`)."""
        for table in self._tables:
            table.pop(tp, None)
