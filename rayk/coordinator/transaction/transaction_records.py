"""The records of `__transaction_state`: one per transactional id, its TransactionMetadata
after each transition (Kafka's TransactionLogKey and TransactionLogValue), as the
transaction coordinator writes them and a new coordinator replays them.

Keys and values are msgpack, as `__consumer_offsets`' are (group_records.py):
- key ["txn", transactional id];
- value {"version": 1, "producer_id", "producer_epoch", "last_producer_epoch",
  "previous_producer_id", "next_producer_id", "txn_timeout_ms", "state" (Kafka's state
  id), "partitions" ([[topic, partition], ...], sorted), "txn_start_timestamp_ms",
  "txn_last_update_timestamp_ms", "client_transaction_version"}: Kafka's value fields,
  with the last epoch that Kafka keeps only in memory, so a retry of InitProducerId
  (KIP-360) or of a TV2 EndTxn is recognised after a coordinator moves;
- a null value (a tombstone): the id expired, and compaction removes it.

`decode_record` reads a record back and raises MalformedTransactionRecordError (a
ValueError) for anything the coordinator could not have written: a newer version, a
missing or extra field, a field of the wrong type, a state that is never written (Dead,
PrepareEpochFence) or partitions outside a transaction. A load skips such a record.
"""

from __future__ import annotations

from typing import Any

import msgpack

from rayk.coordinator.transaction.transaction_metadata import (
    IDLE_STATES,
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    TransactionMetadata,
    TxnState,
)

KEY_KIND = "txn"
VERSION = 1
_INT_FIELDS = ("producer_id", "producer_epoch", "last_producer_epoch", "previous_producer_id", "next_producer_id",
               "txn_timeout_ms", "state", "txn_start_timestamp_ms", "txn_last_update_timestamp_ms",
               "client_transaction_version")  # fmt: skip
_FIELDS = frozenset({"version", "partitions", *_INT_FIELDS})
_NEVER_WRITTEN = frozenset({TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE})


class MalformedTransactionRecordError(ValueError):
    """A `__transaction_state` record that is none of the coordinator's records."""


def record_key(transactional_id: str) -> bytes:
    return msgpack.packb([KEY_KIND, transactional_id])


def record_value(md: TransactionMetadata) -> bytes:
    assert md.state not in _NEVER_WRITTEN, f"{md.state.display_name} is never written"
    return msgpack.packb({
        "version": VERSION,
        "producer_id": md.producer_id,
        "producer_epoch": md.producer_epoch,
        "last_producer_epoch": md.last_producer_epoch,
        "previous_producer_id": md.previous_producer_id,
        "next_producer_id": md.next_producer_id,
        "txn_timeout_ms": md.txn_timeout_ms,
        "state": md.state.id,
        "partitions": sorted([topic, partition] for topic, partition in md.partitions),
        "txn_start_timestamp_ms": md.txn_start_timestamp_ms,
        "txn_last_update_timestamp_ms": md.txn_last_update_timestamp_ms,
        "client_transaction_version": md.client_transaction_version,
    })


def decode_record(key: bytes, value: bytes | None) -> tuple[str, TransactionMetadata | None]:
    """(transactional id, its metadata; None for a tombstone)."""
    fields = _unpack(key, "key")
    if not (isinstance(fields, list) and len(fields) == 2 and fields[0] == KEY_KIND and isinstance(fields[1], str)):
        raise MalformedTransactionRecordError(f"a transaction key is [{KEY_KIND!r}, transactional id], not {fields!r:.80}")
    transactional_id = fields[1]
    if value is None:
        return transactional_id, None
    meta = _unpack(value, "value")
    if not isinstance(meta, dict) or set(meta) != _FIELDS:
        raise MalformedTransactionRecordError(f"a transaction value has the fields {sorted(_FIELDS)}: {meta!r:.80}")
    if meta["version"] != VERSION:
        raise MalformedTransactionRecordError(f"transaction value version {meta['version']!r} (rayk reads {VERSION})")
    if not all(isinstance(meta[name], int) and not isinstance(meta[name], bool) for name in _INT_FIELDS):
        raise MalformedTransactionRecordError(f"a transaction value's numbers: {meta!r:.80}")
    partitions = meta["partitions"]
    if not (isinstance(partitions, list) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], int) for p in partitions
    )):
        raise MalformedTransactionRecordError(f"a transaction's partitions are [[topic, partition], ...]: {partitions!r:.80}")
    try:
        state = TxnState.from_id(meta["state"])
    except ValueError as e:
        raise MalformedTransactionRecordError(str(e)) from None
    if state in _NEVER_WRITTEN or (state in IDLE_STATES and partitions):
        raise MalformedTransactionRecordError(f"{state.display_name} with partitions {partitions!r:.80} is never written")
    if not all(NO_PRODUCER_EPOCH <= meta[name] <= MAX_PRODUCER_EPOCH for name in ("producer_epoch", "last_producer_epoch")):
        raise MalformedTransactionRecordError(f"{transactional_id!r}: a producer epoch out of int16 range: {meta!r:.80}")
    return transactional_id, TransactionMetadata(
        transactional_id, meta["producer_id"], meta["producer_epoch"], meta["txn_timeout_ms"], state,
        frozenset((topic, partition) for topic, partition in partitions), meta["last_producer_epoch"],
        meta["previous_producer_id"], meta["next_producer_id"], meta["txn_start_timestamp_ms"],
        meta["txn_last_update_timestamp_ms"], meta["client_transaction_version"],
    )  # fmt: skip


def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data)
    except (ValueError, msgpack.UnpackException) as e:
        raise MalformedTransactionRecordError(f"the {what} is not msgpack ({e}): {data!r:.80}") from None
