"""MetadataLog: the Controller's records, durably, in a rayk Log (`__cluster_metadata-0`).

Like KRaft's metadata topic, each change the Controller makes is a small set of records
(see `cluster_metadata.py`) appended as one v2 batch, so a change is all-or-nothing on
disk: a torn batch fails its CRC and recovery drops it whole. Each record's value is the
record dict in msgpack. `append` fsyncs before it returns, because the Controller acts
on a change (pushes it to brokers) only once it would survive a crash. `replay` yields
every record with its offset, oldest first, to rebuild the state after a restart.

Not thread-safe; the Controller actor calls it from its event loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgpack

from rayk.storage import Log, LogConfig
from rayk.storage.records import SimpleRecord, build_batch, decode_records, iter_batches

TOPIC_PARTITION_DIR = "__cluster_metadata-0"
_REPLAY_CHUNK_BYTES = 1 << 20
# Metadata is small and must never expire: no retention, modest segments.
_METADATA_LOG_CONFIG = LogConfig(segment_bytes=64 << 20, retention_ms=-1, segment_index_bytes=1 << 20)


class MetadataLog:
    def __init__(self, directory: str | Path) -> None:
        self._log = Log(Path(directory) / TOPIC_PARTITION_DIR, _METADATA_LOG_CONFIG)

    def replay(self) -> Iterator[tuple[int, dict]]:
        offset = self._log.log_start_offset
        while offset < self._log.log_end_offset:
            result = self._log.read(offset, _REPLAY_CHUNK_BYTES)
            for batch in iter_batches(result.records):
                for record in decode_records(batch.data):
                    yield record.offset, msgpack.unpackb(record.value)
            offset = result.next_offset

    def append(self, records: list[dict]) -> int:
        """Appends one change durably; returns the offset of its first record."""
        assert records, "a change has at least one record"
        batch = build_batch([SimpleRecord(msgpack.packb(r)) for r in records])
        info = self._log.append_as_leader(batch, leader_epoch=0)
        self._log.flush()
        self._log.high_watermark = self._log.log_end_offset  # a single replica: all of it is committed
        return info.first_offset

    def close(self) -> None:
        self._log.close()
