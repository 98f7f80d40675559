"""LogDirCheckpoints: the offset checkpoints of one broker data directory.

Kafka keeps, per log directory, `recovery-point-offset-checkpoint` (offsets below which
each log is known to be on disk), `log-start-offset-checkpoint`,
`replication-offset-checkpoint` (high watermarks) and `cleaner-offset-checkpoint` (where
each compacted log's dirty part starts). This class reads them once at
startup, hands each partition its `PartitionOffsets`, and rewrites them (each atomically,
see `checkpoint.py`): all four on its first `write`, then only those whose offsets changed
since it wrote them. A broker checkpoints every `replica.high.watermark.checkpoint.interval.ms`
whether anything moved or not, and a file rewritten with what it holds is a write and an
fsync for nothing (an idle broker's steady work, and its disk's; a disk that fails while
nothing changes is found by the next write or read that needs it, a replica's or a
checkpoint's). Partitions not passed to `write` keep their last checkpointed offsets,
because a log that is not open (yet) must not lose its recovery point; `remove` forgets a
deleted partition.

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
    rewrites, atomically, each file whose table changed (every file the first time). Not
    thread-safe: its owner serialises calls."""

    def __init__(self, data_dir: str | Path) -> None:
        data_dir = Path(data_dir)
        self._files = (
            OffsetCheckpointFile(data_dir / OffsetCheckpointFile.RECOVERY_POINT),
            OffsetCheckpointFile(data_dir / OffsetCheckpointFile.LOG_START_OFFSET),
            OffsetCheckpointFile(data_dir / OffsetCheckpointFile.HIGH_WATERMARK),
            OffsetCheckpointFile(data_dir / OffsetCheckpointFile.CLEANER_OFFSET),
        )
        self._tables: tuple[dict[TopicPartition, int], ...] = tuple(f.read() for f in self._files)
        # What each file holds as this object last wrote it (None: not written yet, so the
        # first `write` writes it, whatever was read: a missing file is created then).
        self._written: list[dict[TopicPartition, int] | None] = [None] * len(self._files)

    def offsets(self, tp: TopicPartition) -> PartitionOffsets:
        return PartitionOffsets(*(table.get(tp) for table in self._tables))

    def write(self, offsets: Mapping[TopicPartition, PartitionOffsets]) -> None:
        """Records `offsets` over the last checkpoint and rewrites the files that change
        (KafkaStorageError if the disk fails one: those before it are written)."""
        tables = tuple(dict(t) for t in self._tables)
        for tp, po in offsets.items():
            for table, value in zip(tables, (po.recovery_point, po.log_start_offset, po.high_watermark, po.cleaner_offset)):
                if value is not None:
                    table[tp] = value
        for i, (file, table) in enumerate(zip(self._files, tables)):
            if table != self._written[i]:
                file.write(table)
                self._written[i] = dict(table)  # a copy: `remove` edits the tables in place
        self._tables = tables

    def remove(self, tp: TopicPartition) -> None:
        """Forgets a deleted partition (written out by the next `write`)."""
        for table in self._tables:
            table.pop(tp, None)
