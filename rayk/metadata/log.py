"""MetadataLog: the Controller's records and snapshots, durably (`__cluster_metadata-0`).

Like KRaft's metadata topic, each change the Controller makes is a small set of records
(`rayk/metadata/records.py`) appended as one v2 batch of a rayk Log, so a change is
all-or-nothing on disk: a torn batch fails its CRC and recovery drops it whole. Each
record's value is its `pack`ed bytes. `append` fsyncs before it returns,
because the Controller acts on a change (pushes it to brokers) only once it would
survive a crash.

Snapshots (`snapshot.py`), as KRaft takes them: once `max_bytes_between_snapshots` of
records were appended since the last snapshot, or `max_snapshot_interval_ms` after it
if any were, `snapshot_due` says so and the Controller hands `write_snapshot` its whole
image. Then:
1. the snapshot is written (atomically: a crash leaves no half of one under its name);
2. the log rolls, so its older segments end where a snapshot starts;
3. the segments wholly below the *previous* snapshot and every snapshot older than it
   are deleted.
The previous snapshot and the log from it on are kept so that a newest snapshot that
turns out unreadable has a fallback that loses nothing. A crash between any two steps
leaves a directory that `load` reads correctly.

`load` restores from the newest snapshot that reads back whole and whose records after
it are all in the log, and yields those records; a snapshot refused as corrupt is renamed
`<name>.corrupt` (kept for inspection, never read again) and the one before it is tried.
Without a usable snapshot the log is replayed from offset 0, which is how a cluster whose
metadata predates snapshots starts: its first snapshot is taken once it is due.

Not thread-safe; the Controller actor calls it from its event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rayk.errors import CorruptRecordError, KafkaStorageError
from rayk.metadata import snapshot
from rayk.metadata.records import MetadataRecord, pack, unpack
from rayk.metadata.snapshot import MetadataSnapshot
from rayk.storage import Log, LogConfig
from rayk.storage.records import SimpleRecord, build_batch, decode_record_tuples, iter_batches

logger = logging.getLogger(__name__)

TOPIC_PARTITION_DIR = "__cluster_metadata-0"
SNAPSHOT_EPOCH = 0  # rayk's Controller is a single writer: its log's leader epoch is always 0
_REPLAY_CHUNK_BYTES = 1 << 20
# Metadata must never expire by age or size: only snapshots make old segments deletable.
_METADATA_LOG_CONFIG = LogConfig(segment_bytes=64 << 20, retention_ms=-1, segment_index_bytes=1 << 20)


def _monotonic_ms() -> int:
    """The clock of `max_snapshot_interval_ms`: an elapsed time in this process, which a
    step of the wall clock must not move (an hour back held time-based snapshots off for
    an hour)."""
    return int(time.monotonic() * 1000)


ALL_COMMITTED = (1 << 63) - 1


class MetadataLog:
    """Owns the Controller's metadata Log (`__cluster_metadata-0` under its directory) and its
    snapshot files, and the counters that make a snapshot due. Opened at Controller start,
    `load`ed once, then appended to (fsynced) for every change. Not thread-safe: the
    Controller actor's event loop calls it."""

    def __init__(
        self,
        directory: str | Path,
        max_bytes_between_snapshots: int = 20 * 1024 * 1024,
        max_snapshot_interval_ms: int = 3_600_000,
        clock_ms: Callable[[], int] = _monotonic_ms,
    ) -> None:
        self.dir = Path(directory) / TOPIC_PARTITION_DIR
        # A single replica: all of it is committed (the Log cuts the HW to its LEO; so told,
        # it takes its producer state from the snapshot at the LEO, with no replay).
        self._log = Log(self.dir, _METADATA_LOG_CONFIG, high_watermark=ALL_COMMITTED)
        snapshot.delete_leftovers(self.dir)
        self._max_bytes_between_snapshots = max_bytes_between_snapshots
        self._max_snapshot_interval_ms = max_snapshot_interval_ms
        self._clock_ms = clock_ms
        self._snapshot_end_offset = 0  # end offset of the newest snapshot (0: none)
        self._bytes_since_snapshot = 0
        self._last_snapshot_ms = clock_ms()

    # ------------------------------------------------------------------ reading

    def load(self) -> tuple[MetadataSnapshot | None, Iterator[tuple[int, MetadataRecord]]]:
        """The newest usable snapshot (None if there is none) and an iterator over the
        records after it, with their offsets, oldest first."""
        chosen: MetadataSnapshot | None = None
        for end_offset, path in reversed(snapshot.snapshot_paths(self.dir)):
            if not self._log.log_start_offset <= end_offset <= self._log.log_end_offset:
                logger.warning("metadata snapshot %s is outside the log's offsets %d..%d; not used", path.name,
                               self._log.log_start_offset, self._log.log_end_offset)
                continue
            try:
                chosen = snapshot.read(path)
            except CorruptRecordError as e:
                logger.error("metadata snapshot %s is unreadable, kept as %s.corrupt: %s", path.name, path.name, e)
                path.rename(path.with_name(path.name + ".corrupt"))
                continue
            break
        start = 0 if chosen is None else chosen.end_offset
        if start < self._log.log_start_offset:
            raise KafkaStorageError(
                f"{self.dir}: the log starts at offset {self._log.log_start_offset} and no readable snapshot covers "
                "the records before it"
            )
        self._snapshot_end_offset = start
        self._bytes_since_snapshot = 0
        self._last_snapshot_ms = self._clock_ms()
        return chosen, self._replay(start)

    def _replay(self, start: int) -> Iterator[tuple[int, MetadataRecord]]:
        offset = start
        while offset < self._log.log_end_offset:
            result = self._log.read(offset, _REPLAY_CHUNK_BYTES)
            for batch in iter_batches(result.records):
                for record_offset, _timestamp, _key, value, _headers in decode_record_tuples(batch.data)[1]:
                    if record_offset >= start:
                        self._bytes_since_snapshot += len(value)
                        yield record_offset, unpack(value)
            offset = result.next_offset

    # ------------------------------------------------------------------ writing

    def append(self, records: list[MetadataRecord]) -> int:
        """Appends one change durably; returns the offset of its first record."""
        assert records, "a change has at least one record"
        values = [pack(r) for r in records]
        info = self._log.append_as_leader(build_batch([SimpleRecord(v) for v in values]), leader_epoch=0)
        self._log.flush()
        self._log.high_watermark = self._log.log_end_offset
        self._bytes_since_snapshot += sum(map(len, values))
        return info.first_offset

    def snapshot_due(self) -> bool:
        """Whether records were appended since the last snapshot and enough of them, or
        long enough ago, that the next one should be taken."""
        if self._log.log_end_offset == self._snapshot_end_offset:
            return False
        if self._bytes_since_snapshot >= self._max_bytes_between_snapshots:
            return True
        interval_ms = self._max_snapshot_interval_ms
        return interval_ms > 0 and self._clock_ms() - self._last_snapshot_ms >= interval_ms

    def write_snapshot(self, image: MetadataSnapshot) -> Path:
        """Writes `image` (the state as of everything appended) as the newest snapshot, then
        deletes what the one before it covers. Returns the snapshot's path."""
        assert image.end_offset == self._log.log_end_offset, (
            f"a snapshot is of the whole log: {image.end_offset} != {self._log.log_end_offset}"
        )
        assert image.epoch == SNAPSHOT_EPOCH
        path = snapshot.write(self.dir, image)
        self._log.roll()
        self._snapshot_end_offset = image.end_offset
        self._bytes_since_snapshot = 0
        self._last_snapshot_ms = self._clock_ms()
        self._delete_covered()
        return path

    def _delete_covered(self) -> None:
        """Keeps the two newest snapshots and the log from the older of them on."""
        kept = snapshot.snapshot_paths(self.dir)
        if len(kept) < 2:
            return
        previous_end = kept[-2][0]
        if previous_end > self._log.log_start_offset:
            self._log.maybe_increment_log_start_offset(previous_end)
        self._log.delete_expired_segments()
        for _end, path in kept[:-2]:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        self._log.close()
