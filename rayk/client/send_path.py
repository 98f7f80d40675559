"""SendPath: Producer.send's common case, a record of bytes appended to its partition's
open batch, with no Python frame (rayk/client/_send.c, whose top comment gives the
contract).

py-spy on a driver sending 1 M records put ~60% of its thread in `Producer.send` and
`RecordAccumulator.append`. The compiled path does their work for the records that need
no decision: the partition is known, its open batch has room, nothing waits. For any
other record it returns None having changed nothing, and `send` goes the Python way.
`send_path_reference` is the same in Python, the reference the tests hold the compiled
one to; where no C compiler was found at install, `SendPath` is None and every record
goes the Python way.

`SendMethod` (also in _send.c) is `Producer.send` itself where the module is built: it
binds send()'s arguments in C, offers them to the producer's `_send_path`, and calls the
Python send for everything else, so a record the path takes runs no Python frame at all.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from rayk.client.accumulator import RecordAccumulator
from rayk.client.partitioner import partition_for_key
from rayk.client.produce_future import FutureRecordMetadata

RECORD_OVERHEAD_BYTES = 21  # varint lengths, attributes and deltas of one record, at most


def send_path_reference(
    accumulator: RecordAccumulator, metadata: Any, plain_keys: bool, plain_values: bool, max_record_bytes: int
) -> Callable[..., FutureRecordMetadata | None]:
    """The compiled SendPath in Python: same arguments, same appends, same None."""

    def path(producer: Any, topic: Any, value: Any, key: Any, headers: Any, partition: Any, timestamp_ms: Any,
             callback: Any) -> FutureRecordMetadata | None:  # fmt: skip
        if not plain_values or type(value) is not bytes or headers is not None or type(topic) is not str:
            return None
        if key is not None and (not plain_keys or type(key) is not bytes):
            return None
        if producer._closed is not False:
            return None
        size = RECORD_OVERHEAD_BYTES + len(value) + (len(key) if key is not None else 0)
        if size > max_record_bytes:
            return None
        known = metadata._topics.get(topic)
        num_partitions = len(known) if isinstance(known, dict) else 0
        if num_partitions < 1:
            return None
        if partition is not None:
            if type(partition) is not int or not 0 <= partition < num_partitions:
                return None
        elif key is not None:
            partition = partition_for_key(key, num_partitions)
        if timestamp_ms is None or (type(timestamp_ms) is int and timestamp_ms == 0):
            timestamp_ms = time.time_ns() // 1_000_000
        elif type(timestamp_ms) is not int:
            return None
        acc = accumulator
        if not acc._mutex.acquire(False):
            return None
        try:
            if acc._failure is not None or acc.closed is not False:
                return None
            if acc._buffered_bytes + size > acc._buffer_memory:
                return None
            if partition is None:
                partition = acc._partitioner._sticky_by_topic.get(topic)
                if type(partition) is not int or not 0 <= partition < num_partitions:
                    return None
            batch = acc._open.get((topic, partition))
            if batch is None or batch.size_bytes + size >= acc._batch_size:
                return None
            index = batch.record_count
            batch.records.append((value, key, (), timestamp_ms))
            if callback is not None:
                batch.result._record_callbacks.extend((callback, index, timestamp_ms))
            batch.record_count = index + 1
            batch.size_bytes += size
            acc.unfinished += 1
            acc._buffered_bytes += size
        finally:
            acc._mutex.release()
        return FutureRecordMetadata(batch.result, index, timestamp_ms)

    return path


try:
    from rayk.client._send import SendMethod, SendPath  # built from _send.c by pip install
except ImportError:  # installed where no C compiler was found: send() runs in Python
    logging.getLogger(__name__).warning(
        "rayk.client._send is not built (no C compiler at install time?); the producer's send() runs in Python"
    )
    SendPath = SendMethod = None
