"""What a `read_committed` consumer keeps of a fetched range (Kafka's CompletedFetch with
isolation.level=read_committed).

A read_committed fetch returns the batches below the LSO and the aborted transactions
that overlap them, each as (producer id, first offset). Walking the batches in order,
an aborted transaction becomes active for its producer once a batch reaches its first
offset; while it is active, that producer's transactional batches are dropped; its ABORT
marker ends it. Control batches (the markers) are never returned to the application.

Pure: batches in, batches out, nothing decoded but the markers' type.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from rayk.storage.control_records import read_end_txn_marker
from rayk.storage.records import RecordBatch, iter_batches


def committed_batches(records: bytes | bytearray | memoryview, aborted: Iterable[tuple[int, int]]) -> Iterator[RecordBatch]:
    """The batches of `records` a read_committed consumer sees, given the fetch's aborted
    transactions as (producer id, first offset)."""
    pending = sorted((first_offset, producer_id) for producer_id, first_offset in aborted)
    heapq.heapify(pending)
    aborting: set[int] = set()
    for batch in iter_batches(records):
        header = batch.header
        if header.producer_id >= 0:
            while pending and pending[0][0] <= header.last_offset:
                aborting.add(heapq.heappop(pending)[1])
        if header.is_control:
            if header.producer_id in aborting:
                marker = read_end_txn_marker(batch.data)
                if marker is not None and not marker.commit:
                    aborting.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in aborting:
            continue
        yield batch
