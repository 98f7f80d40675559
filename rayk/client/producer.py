"""Producer: batches records per partition and sends each batch to its leader replica
in one actor call (Kafka's RecordAccumulator + Sender, over Ray instead of sockets).

`send` serializes the record, picks its partition (explicit; Kafka's murmur2 of the key;
or the sticky partitioner for unkeyed records), appends it to that partition's open
batch and returns a Future. A batch closes when it reaches `batch_size` bytes or has
waited `linger_ms`; it is then encoded on this side as one Kafka v2 record batch
(compressed if asked), so the broker only validates and appends it. A background sender
thread submits closed batches, at most `max_in_flight_requests_per_connection` per
partition at a time, and completes the batch's records' futures (FutureRecordMetadata,
resolving to RecordMetadata(topic, partition, offset, timestamp)) when the leader answers;
nothing polls (completion comes through the ObjectRef's future callback).

The producer is idempotent, as Kafka's is by default: it takes a producer id from the
Controller and stamps each batch with it and the per-partition sequence number of its
first record. The leader appends a partition's batches in sequence order even when Ray
delivers the calls out of order (it does, for async actors), and answers a retry of an
already appended batch with its original offsets instead of writing it twice.

Records wait in batches until acknowledged; together they may take `buffer_memory` bytes.
When they would take more, `send` blocks until acknowledgements free room, for at most
`max_block_ms`, then raises BufferExhaustedError (Kafka's buffer.memory and max.block.ms),
so a fast caller is paced by the cluster instead of growing an unbounded queue.

Retriable failures (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS, a
dead leader actor...) refresh the metadata and resend the batch ahead of that
partition's queue after `retry_backoff_ms`, until `delivery_timeout_ms`.

A Producer holds a thread, so it is not shipped between processes; pickling one (to use
it in a Ray task or actor) carries its settings and builds a fresh Producer there.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from rayk.client.metadata import MetadataCache
from rayk.client.partitioner import StickyPartitioner, partition_for_key
from rayk.client.serializers import serializer
from rayk.client.produce_future import BatchResult, FutureRecordMetadata
from rayk.client.types import TopicPartition
from rayk.errors import BufferExhaustedError, KafkaError, KafkaTimeoutError, RecordTooLargeError
from rayk.storage.compression import CompressionType
from rayk.storage.records import HEADER_SIZE_BYTES, SimpleRecord, build_batch

logger = logging.getLogger(__name__)

RECORD_OVERHEAD_BYTES = 21  # varint lengths, attributes and deltas of one record, at most


def acks_value(acks: str | int) -> int:
    if acks in ("all", -1, "-1"):
        return -1
    if acks in (0, 1, "0", "1"):
        return int(acks)
    raise ValueError(f"acks must be 0, 1 or 'all' (-1), got {acks!r}")


@dataclass(slots=True)
class _Batch:
    tp: TopicPartition
    created_s: float
    num_partitions: int
    result: BatchResult
    records: list[SimpleRecord] = field(default_factory=list)
    size_bytes: int = HEADER_SIZE_BYTES
    attempts: int = 0
    encoded: bytes | None = None
    deadline_s: float = 0.0
    base_sequence: int = -1


class Producer:
    def __init__(
        self,
        cluster: Any,
        *,
        acks: str | int = 1,
        linger_ms: int = 5,
        batch_size: int = 16384,
        compression_type: str | None = None,
        key_serializer: Any = None,
        value_serializer: Any = None,
        max_in_flight_requests_per_connection: int = 5,
        request_timeout_ms: int = 30_000,
        delivery_timeout_ms: int = 120_000,
        retry_backoff_ms: int = 100,
        max_request_size: int = 1_048_576,
        buffer_memory: int = 33_554_432,
        max_block_ms: int = 60_000,
    ) -> None:
        self._settings = dict(
            acks=acks,
            linger_ms=linger_ms,
            batch_size=batch_size,
            compression_type=compression_type,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
            max_in_flight_requests_per_connection=max_in_flight_requests_per_connection,
            request_timeout_ms=request_timeout_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            max_request_size=max_request_size,
            buffer_memory=buffer_memory,
            max_block_ms=max_block_ms,
        )
        if min(max_in_flight_requests_per_connection, batch_size, buffer_memory) < 1:
            raise ValueError("max_in_flight_requests_per_connection, batch_size and buffer_memory must be >= 1")
        if linger_ms < 0 or max_block_ms < 0:
            raise ValueError("linger_ms and max_block_ms must be >= 0")
        self._cluster = cluster
        self._acks = acks_value(acks)
        self._linger_s = linger_ms / 1000
        self._batch_size = batch_size
        self._compression = CompressionType.from_name(compression_type or "none")
        self._key_serializer = serializer(key_serializer)
        self._value_serializer = serializer(value_serializer)
        self._max_in_flight = max_in_flight_requests_per_connection
        self._request_timeout_ms = request_timeout_ms
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._max_request_size = max_request_size
        self._buffer_memory = buffer_memory
        self._max_block_s = max_block_ms / 1000
        self._metadata = MetadataCache(cluster.controller)
        # Idempotence, always on: Ray may deliver a partition's batches out of order, and the
        # leader puts them back in sequence order (and drops retried duplicates).
        self._producer_id = ray.get(cluster.controller.init_producer_id.remote())
        self._next_sequence: collections.Counter[TopicPartition] = collections.Counter()
        self._partitioner = StickyPartitioner()
        # One lock, three conditions: the sender thread waits on `_lock` (work to do), `send`
        # on `_space` (buffer room), `flush` on `_done` (nothing unacknowledged). Separate
        # conditions make sure a notify meant for the sender never wakes a user thread instead.
        self._lock = threading.Condition()
        self._space = threading.Condition(self._lock)
        self._done = threading.Condition(self._lock)
        self._open: dict[TopicPartition, _Batch] = {}
        self._ready: dict[TopicPartition, collections.deque[_Batch]] = collections.defaultdict(collections.deque)
        self._in_flight: collections.Counter[TopicPartition] = collections.Counter()
        self._blocked_until_s: dict[TopicPartition, float] = {}
        self._completions: collections.deque[tuple[_Batch, concurrent.futures.Future]] = collections.deque()
        self._unfinished = 0  # records sent and not yet acknowledged or failed
        self._buffered_bytes = 0  # their size, bounded by buffer_memory
        self._flushing = 0
        self._closed = False
        self._sender = threading.Thread(target=self._run, name="rayk-producer-sender", daemon=True)
        self._sender.start()

    def __reduce__(self) -> tuple:
        return (_rebuild_producer, (self._cluster, self._settings))

    # ------------------------------------------------------------------ the user's side

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: list[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Queues one record; the future resolves to its RecordMetadata.

        Blocks while the buffer is full (up to `max_block_ms`, then BufferExhaustedError).
        """
        if self._closed:
            raise RuntimeError("the producer is closed")
        key_bytes = self._key_serializer(key)
        value_bytes = self._value_serializer(value)
        record = SimpleRecord(value_bytes, key_bytes, tuple(headers or ()), timestamp_ms or int(time.time() * 1000))
        size = RECORD_OVERHEAD_BYTES + len(key_bytes or b"") + len(value_bytes or b"")
        if headers:
            size += sum(len(k) + len(v or b"") + 10 for k, v in record.headers)
        if size + HEADER_SIZE_BYTES > min(self._max_request_size, self._buffer_memory):
            raise RecordTooLargeError(
                f"a {size}-byte record exceeds max_request_size = {self._max_request_size} bytes"
                f" or buffer_memory = {self._buffer_memory} bytes"
            )
        num_partitions = self._metadata.partition_count(topic)
        if partition is None and key_bytes is not None:
            partition = partition_for_key(key_bytes, num_partitions)
        elif partition is not None and not 0 <= partition < num_partitions:
            raise ValueError(f"topic {topic!r} has partitions 0..{num_partitions - 1}, not {partition}")
        with self._lock:
            self._wait_for_room(size)
            if partition is None:
                partition = self._partitioner.partition(topic, num_partitions)
            tp = TopicPartition(topic, partition)
            batch = self._open.get(tp)
            if batch is not None and batch.size_bytes + size > self._batch_size and batch.records:
                self._close_batch(batch)
                batch = None
            if batch is None:
                batch = self._open[tp] = _Batch(tp, time.monotonic(), num_partitions, BatchResult(topic, partition))
                self._lock.notify()  # the sender learns the new batch's linger deadline
            future = FutureRecordMetadata(batch.result, len(batch.records), record.timestamp_ms)
            batch.records.append(record)
            batch.size_bytes += size
            self._unfinished += 1
            self._buffered_bytes += size
            if batch.size_bytes >= self._batch_size:
                self._close_batch(batch)
                self._lock.notify()
        return future

    def _wait_for_room(self, size: int) -> None:
        """Blocks until `size` more bytes fit in buffer_memory (lock held)."""
        if self._buffered_bytes + size <= self._buffer_memory:
            return
        deadline = time.monotonic() + self._max_block_s
        self._lock.notify()  # the sender may be lingering on open batches that would free room
        while self._buffered_bytes + size > self._buffer_memory:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                raise BufferExhaustedError(
                    f"{self._buffered_bytes} bytes of records still wait for acknowledgement after"
                    f" max_block_ms = {int(self._max_block_s * 1000)}; buffer_memory = {self._buffer_memory}"
                    if not self._closed
                    else "the producer was closed while send() waited for buffer room"
                )
            self._space.wait(remaining)

    def _close_batch(self, batch: _Batch) -> None:
        """Moves an open batch to its partition's send queue (lock held)."""
        del self._open[batch.tp]
        batch.deadline_s = time.monotonic() + self._delivery_timeout_s
        batch.base_sequence = self._next_sequence[batch.tp]
        self._next_sequence[batch.tp] += len(batch.records)
        self._ready[batch.tp].append(batch)
        self._partitioner.on_new_batch(batch.tp.topic, batch.tp.partition, batch.num_partitions)

    def flush(self, timeout_s: float | None = None) -> None:
        """Sends everything queued now and waits until each record is acknowledged or failed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            self._flushing += 1
            self._lock.notify()
            try:
                while self._unfinished:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise KafkaTimeoutError(f"flush: {self._unfinished} records still unacknowledged after {timeout_s} s")
                    self._done.wait(remaining)
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Flushes, then stops the sender thread."""
        if self._closed:
            return
        try:
            self.flush(timeout_s)
        finally:
            with self._lock:
                self._closed = True
                self._lock.notify_all()
                self._space.notify_all()
            self._sender.join(timeout=5)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the sender thread

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed and not self._unfinished:
                    return
                now = time.monotonic()
                for batch in list(self._open.values()):
                    if self._flushing or self._closed or (
                        now - batch.created_s >= self._linger_s and self._can_send_now(batch.tp)
                    ):
                        self._close_batch(batch)
                completions = list(self._completions)
                self._completions.clear()
            for batch, result in completions:
                self._complete(batch, result)
            with self._lock:
                sendable = self._take_sendable(time.monotonic())
                if not sendable and not self._completions:
                    self._lock.wait(self._wait_s(time.monotonic()))
            for batch in sendable:
                self._submit(batch)

    def _can_send_now(self, tp: TopicPartition) -> bool:
        """Whether a batch closed now would go out at once. If not, a lingering batch stays
        open and keeps filling (Kafka's accumulator does the same), instead of queueing
        behind the in-flight ones as a small batch."""
        return not self._ready.get(tp) and self._in_flight[tp] < self._max_in_flight

    def _take_sendable(self, now: float) -> list[_Batch]:
        out = []
        for tp, queue in self._ready.items():
            if self._blocked_until_s.get(tp, 0) > now:
                continue
            while queue and self._in_flight[tp] < self._max_in_flight:
                out.append(queue.popleft())
                self._in_flight[tp] += 1
        return out

    def _wait_s(self, now: float) -> float | None:
        # A lingering batch whose partition is busy waits for a completion, which notifies.
        deadlines = [b.created_s + self._linger_s for b in self._open.values() if self._can_send_now(b.tp)]
        deadlines += [t for tp, t in self._blocked_until_s.items() if self._ready.get(tp)]
        if not deadlines:
            return None if not self._closed else 0.05
        return max(0.0, min(deadlines) - now)

    def _submit(self, batch: _Batch) -> None:
        batch.attempts += 1
        try:
            if batch.encoded is None:
                batch.encoded = build_batch(
                    batch.records,
                    compression=self._compression,
                    producer_id=self._producer_id,
                    producer_epoch=0,
                    base_sequence=batch.base_sequence,
                )
            leader = self._metadata.leader(batch.tp.topic, batch.tp.partition)
            ref = leader.produce.remote(batch.encoded, self._acks, self._request_timeout_ms)
        except Exception as e:
            future: concurrent.futures.Future = concurrent.futures.Future()
            future.set_exception(e)
            self._on_done(batch, future)
            return
        if self._acks == 0:  # fire and forget: Kafka answers nothing, offsets are unknown
            self._resolve(batch, -1, -1)
            with self._lock:
                self._in_flight[batch.tp] -= 1
                self._lock.notify_all()
            return
        ref.future().add_done_callback(lambda f: self._on_done(batch, f))

    def _on_done(self, batch: _Batch, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._completions.append((batch, future))
            self._lock.notify_all()

    def _complete(self, batch: _Batch, future: concurrent.futures.Future) -> None:
        try:
            result = future.result()
            error = result.error
        except (KafkaError, RayError) as e:
            error = e
        with self._lock:
            self._in_flight[batch.tp] -= 1
        if error is None:
            self._resolve(batch, result.base_offset, result.log_append_time_ms)
            return
        retriable = isinstance(error, RayActorError) or getattr(error, "retriable", False)
        if retriable and time.monotonic() < batch.deadline_s:
            logger.debug("retrying %s after %s", batch.tp, error)
            self._metadata.invalidate(batch.tp.topic)
            with self._lock:
                self._ready[batch.tp].appendleft(batch)
                self._blocked_until_s[batch.tp] = time.monotonic() + self._retry_backoff_s
            return
        self._fail(batch, error if isinstance(error, KafkaError) else KafkaError(f"produce to {batch.tp} failed: {error}"))

    def _resolve(self, batch: _Batch, base_offset: int, log_append_time_ms: int) -> None:
        batch.result.complete(base_offset, log_append_time_ms)
        self._finished(batch)

    def _fail(self, batch: _Batch, error: Exception) -> None:
        batch.result.fail(error)
        self._finished(batch)

    def _finished(self, batch: _Batch) -> None:
        with self._lock:
            self._unfinished -= len(batch.records)
            self._buffered_bytes -= batch.size_bytes - HEADER_SIZE_BYTES
            assert self._unfinished >= 0 and self._buffered_bytes >= 0, (self._unfinished, self._buffered_bytes)
            self._lock.notify()
            self._space.notify_all()
            if not self._unfinished:
                self._done.notify_all()


def _rebuild_producer(cluster: Any, settings: dict) -> Producer:
    return Producer(cluster, **settings)
