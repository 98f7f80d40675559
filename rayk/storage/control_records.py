"""Transaction markers: the control batches that end a transaction in a partition's log
(Kafka's EndTransactionMarker and ControlRecordType, format as Kafka writes it).

A transaction coordinator ends a transaction by having each partition leader append one
control batch: attributes with the control and transactional bits, the producer's id and
epoch, no sequence (-1), and one record whose

    key   = version int16 (0) | type int16 (0 ABORT, 1 COMMIT)
    value = version int16 (0) | coordinatorEpoch int32

(big-endian). The log reads the marker back to complete the producer's transaction (see
producer_state.py) and, for an abort, to index it (see transaction_index.py). Other
control types (Kafka's KRaft logs use LEADER_CHANGE and snapshot markers) are not
transaction markers: `read_end_txn_marker` returns None for them.

Pure functions over bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rayk.errors import CorruptRecordError
from rayk.storage.records import NO_SEQUENCE, SimpleRecord, build_batch, decode_record_tuples

ABORT, COMMIT = 0, 1  # Kafka's ControlRecordType ids
CURRENT_VERSION = 0
_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    """What one COMMIT or ABORT control record says: the transaction's outcome, and the epoch
    of the coordinator that wrote it (a partition refuses markers from an older one)."""

    commit: bool
    coordinator_epoch: int


def build_end_txn_marker(
    producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timestamp_ms: int,
    *, base_offset: int = 0, partition_leader_epoch: int = -1,
) -> bytes:
    """One control batch holding a COMMIT or ABORT marker for the producer's transaction."""
    if producer_id < 0 or producer_epoch < 0:
        raise ValueError(f"a transaction marker needs a producer id and epoch, got {producer_id}/{producer_epoch}")
    if coordinator_epoch < 0:
        raise ValueError(f"coordinator epoch must be >= 0, got {coordinator_epoch}")
    record = SimpleRecord(
        _VALUE.pack(CURRENT_VERSION, coordinator_epoch), _KEY.pack(CURRENT_VERSION, COMMIT if commit else ABORT),
        (), timestamp_ms,
    )
    return build_batch(
        [record], base_offset=base_offset, partition_leader_epoch=partition_leader_epoch, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=NO_SEQUENCE, is_transactional=True, is_control=True,
    )  # fmt: skip


def read_end_txn_marker(batch: bytes | bytearray | memoryview) -> EndTxnMarker | None:
    """The marker a whole control batch holds; None if it holds another control type.
    CorruptRecordError if its record is not a control record at all."""
    header, records = decode_record_tuples(batch)
    if not header.is_control:
        raise ValueError(f"the batch at offset {header.base_offset} is not a control batch")
    if len(records) != 1:
        raise CorruptRecordError(f"control batch at offset {header.base_offset} holds {len(records)} records, not 1")
    _offset, _timestamp, key, value, _headers = records[0]
    if key is None or len(key) < _KEY.size:
        raise CorruptRecordError(f"control record at offset {header.base_offset} has no version and type in its key")
    _version, control_type = _KEY.unpack_from(key)
    if control_type not in (ABORT, COMMIT):
        return None
    if value is None or len(value) < _VALUE.size:  # later versions may add fields after these
        raise CorruptRecordError(f"transaction marker at offset {header.base_offset} has no coordinator epoch")
    _value_version, coordinator_epoch = _VALUE.unpack_from(value)
    return EndTxnMarker(control_type == COMMIT, coordinator_epoch)
