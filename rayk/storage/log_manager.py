"""LogManager: every partition log in one broker's data directory (Kafka's LogManager).

The directory holds one `<topic>-<partition>` directory per log and three checkpoint
files in Kafka's format (see `checkpoint.py`):
`recovery-point-offset-checkpoint` (offsets below which each log is known to be on disk),
`log-start-offset-checkpoint` and `replication-offset-checkpoint` (high watermarks).
Opening a log passes it the checkpointed recovery point, log start and HW, so recovery
re-reads only what might be torn and the HW survives restarts. `checkpoint()` rewrites
all three files (atomically), and the cleaner's fourth, `cleaner-offset-checkpoint`, as it
was (nothing here cleans); `close()` flushes every log first, so after a clean
shutdown the recovery points equal the log end offsets.

The directory also holds Kafka's clean-shutdown marker (`.kafka_cleanshutdown`, see
`clean_shutdown.py`): the constructor consumes it before anything else happens
(`had_clean_shutdown` says whether it was there), and `close()` writes it as its very
last step, so a crash at any point in between reads as an unclean shutdown.

Logs are opened lazily by `get_or_create`, because a log's config (segment size,
retention, ...) comes from the cluster's metadata, which the caller has and this does not.
Thread-safe (one lock around the table of logs); each Log has its own lock.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from rayk.errors import UnknownTopicOrPartitionError
from rayk.storage import clean_shutdown
from rayk.storage.clean_shutdown import NO_BROKER_EPOCH, CleanShutdown
from rayk.storage.log import Log
from rayk.storage.log_dir_checkpoints import LogDirCheckpoints, PartitionOffsets
from rayk.storage.log_config import LogConfig

TopicPartition = tuple[str, int]

# Kafka's legal topic names; the partition directory is `<topic>-<partition>`.
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_PARTITION_DIR = re.compile(r"^(?P<topic>[a-zA-Z0-9._-]+)-(?P<partition>\d+)$")


def is_legal_topic_name(topic: str) -> bool:
    return bool(_LEGAL_TOPIC.match(topic)) and topic not in (".", "..")


def partition_dir_name(topic: str, partition: int) -> str:
    if not is_legal_topic_name(topic):
        raise ValueError(f"illegal topic name {topic!r}: use 1-249 of [a-zA-Z0-9._-]")
    if partition < 0:
        raise ValueError(f"partition must be >= 0, got {partition}")
    return f"{topic}-{partition}"


class LogManager:
    """Owns the open Logs of one data directory, its checkpoints and its clean-shutdown marker,
    all in one process: constructed at start (consuming the marker), `close` at shutdown.
    The broker does not use it (each of its logs lives in its own replica process, managed by
    server/replica_manager.py and broker_log_manager.py); tests do. Thread-safe."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # First, before any log is touched: from here on a crash must read as unclean.
        self.clean_shutdown: CleanShutdown | None = clean_shutdown.consume(self.data_dir)
        self._checkpoints = LogDirCheckpoints(self.data_dir)
        self._logs: dict[TopicPartition, Log] = {}
        self._lock = threading.Lock()

    @property
    def had_clean_shutdown(self) -> bool:
        """Whether the previous run left the clean-shutdown marker (KIP-966)."""
        return self.clean_shutdown is not None

    def partitions_on_disk(self) -> list[TopicPartition]:
        """Every partition that has a directory here, opened or not."""
        found = []
        for path in self.data_dir.iterdir():
            match = _PARTITION_DIR.match(path.name)
            if match and path.is_dir():
                found.append((match["topic"], int(match["partition"])))
        return sorted(found)

    def get_or_create(self, topic: str, partition: int, config: LogConfig | None = None) -> Log:
        """The open log of a partition, opening (and recovering) or creating it if needed."""
        key = (topic, partition)
        with self._lock:
            log = self._logs.get(key)
            if log is None:
                offsets = self._checkpoints.offsets(key)
                log = Log(
                    self.data_dir / partition_dir_name(topic, partition),
                    config,
                    # A log the checkpoint does not name (it was created after the last
                    # checkpoint, then the process crashed) is recovered from its first
                    # segment, as Kafka's LogManager defaults a missing recovery point to 0:
                    # Log's own default, the last segment, would trust unflushed segments.
                    recovery_point=offsets.recovery_point if offsets.recovery_point is not None else 0,
                    log_start_offset=offsets.log_start_offset,
                    high_watermark=offsets.high_watermark,
                )
                self._logs[key] = log
            return log

    def get(self, topic: str, partition: int) -> Log:
        with self._lock:
            log = self._logs.get((topic, partition))
        if log is None:
            raise UnknownTopicOrPartitionError(f"no log for {topic}-{partition} on {self.data_dir}")
        return log

    @property
    def logs(self) -> dict[TopicPartition, Log]:
        with self._lock:
            return dict(self._logs)

    def delete(self, topic: str, partition: int) -> None:
        """Deletes a partition's log and directory (its topic was deleted or reassigned)."""
        with self._lock:
            log = self._logs.pop((topic, partition), None)
            self._checkpoints.remove((topic, partition))
        if log is None:  # opened only to be deleted: whatever is committed, nothing is replayed
            log = Log(self.data_dir / partition_dir_name(topic, partition), high_watermark=(1 << 63) - 1)
        log.delete()
        self.checkpoint()

    def checkpoint(self) -> None:
        """Writes the recovery points, log start offsets and high watermarks of every log."""
        with self._lock:
            self._checkpoints.write(
                {
                    key: PartitionOffsets(log.recovery_point, log.log_start_offset, log.high_watermark)
                    for key, log in self._logs.items()
                }
            )

    def flush_and_checkpoint(self) -> None:
        """Flushes every log, then checkpoints: the recovery points reach the LEOs."""
        for log in self.logs.values():
            log.flush()
        self.checkpoint()

    def close(self, broker_epoch: int = NO_BROKER_EPOCH) -> None:
        """Clean shutdown: flush, write the checkpoints, close every log, and last write
        the clean-shutdown marker with `broker_epoch` (-1 if unknown)."""
        for log in self.logs.values():
            log.flush()
        self.checkpoint()
        with self._lock:
            for log in self._logs.values():
                log.close()
            self._logs.clear()
        clean_shutdown.write(self.data_dir, broker_epoch)
