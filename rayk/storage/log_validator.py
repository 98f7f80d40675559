"""What a leader does to a producer's batches before they are appended (Kafka's
LogValidator): a compacted topic's records need keys (`require_keys`), and each batch is
given its offsets and leader epoch, and with LogAppendTime the broker's time
(`assign_offsets`). The framing, CRC and size checks are records.validate_batches'.

Records are never re-encoded: only baseOffset and partitionLeaderEpoch are rewritten in a
header (outside the CRC); with LogAppendTime also maxTimestamp and the timestamp-type bit,
and then the CRC. Plain functions on bytes: the Log calls `assign_offsets` under its
lock, at the LEO.
"""

from __future__ import annotations

from rayk.errors import InvalidRecordError, RecordError
from rayk.storage.records import (
    BatchHeader,
    decode_record_tuples,
    iter_batches,
    set_base_offset_and_epoch,
    set_log_append_time,
)

_KEYLESS_RECORD = "a compacted topic cannot accept a record without a key"


def assign_offsets(
    records: bytes | bytearray | memoryview, headers: list[BatchHeader], base_offset: int, leader_epoch: int,
    log_append_time_ms: int | None,
) -> tuple[bytearray, list[BatchHeader]]:
    """A copy of `records` (validated batches, described by `headers`) whose batches
    start at `base_offset` and carry `leader_epoch` (and `log_append_time_ms`, unless
    None), with the headers as rewritten."""
    data = bytearray(records)
    assigned: list[BatchHeader] = []
    offset, position = base_offset, 0
    for header in headers:
        set_base_offset_and_epoch(data, position, offset, leader_epoch)
        if log_append_time_ms is not None:
            set_log_append_time(data, position, header.size_bytes, log_append_time_ms)
        assigned.append(BatchHeader.parse(data, position))
        offset += header.record_count
        position += header.size_bytes
    assert position == len(data), "the headers describe every byte of the batches"
    return data, assigned


def require_keys(records: bytes | bytearray | memoryview) -> None:
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
