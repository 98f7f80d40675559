"""What a coordinator replays from its internal topic's partition (coordinator_replica.py).

The log holds the coordinator's own records, and in `__consumer_offsets` also the offsets
that transactional producers committed (TxnOffsetCommit): transactional batches of their
producer id, pending until the producer's transaction marker, a COMMIT that makes them the
group's offsets or an ABORT that drops them (Kafka's GroupMetadataManager replays its log
the same way). `read_coordinator_log` turns the log into that stream, oldest first:

- `(offset, key, value)`: a record the coordinator wrote;
- `TxnRecords(producer_id, records)`: a transactional batch's records, as (offset, key, value);
- `TxnMarker(producer_id, commit)`: the end of that producer's transaction.

A batch that does not decode is skipped with an error logged: its records are unreadable to
any coordinator.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from rayk.errors import KafkaError
from rayk.storage.control_records import read_end_txn_marker
from rayk.storage.log import Log
from rayk.storage.records import iter_batches

logger = logging.getLogger(__name__)

LOAD_CHUNK_BYTES = 1 << 20
Record = tuple[int, bytes | None, bytes | None]  # offset, key, value


@dataclass(frozen=True, slots=True)
class TxnRecords:
    """A transactional batch in the coordinator's log: its producer's records, as (offset, key,
    value), pending until a TxnMarker of that producer commits or drops them."""

    producer_id: int
    records: list[Record]


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """The end of a producer's transaction in the coordinator's log: COMMIT makes its pending
    TxnRecords count, ABORT drops them."""

    producer_id: int
    commit: bool


LogEntry = Record | TxnRecords | TxnMarker


def read_coordinator_log(log: Log, source: str) -> list[LogEntry]:
    """The log from its start to its end as LogEntries; `source` names it in errors."""
    return list(_entries(log, source))


def _entries(log: Log, source: str) -> Iterator[LogEntry]:
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, LOAD_CHUNK_BYTES)
        for batch in iter_batches(result.records):
            header = batch.header
            try:
                if header.is_control:
                    marker = read_end_txn_marker(batch.data)
                    if marker is not None:
                        yield TxnMarker(header.producer_id, marker.commit)
                    continue
                records = [(r.offset, r.key, r.value) for r in batch.records()]
            except KafkaError as e:
                logger.error("%s offset %d: skipped a batch that does not decode: %s", source, header.base_offset, e)
                continue
            if header.is_transactional:
                yield TxnRecords(header.producer_id, records)
            else:
                yield from records
        offset = result.next_offset
