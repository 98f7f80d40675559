"""Producer: batches records per partition and sends each batch to its leader replica
in one produce request over the data plane (Kafka's KafkaProducer; rayk/client/data_plane.py).

`send` serializes the record, picks its partition (explicit; Kafka's murmur2 of the key;
or the sticky partitioner for unkeyed records), appends it to that partition's open
batch in the RecordAccumulator and returns a Future (FutureRecordMetadata, resolving to
RecordMetadata(topic, partition, offset, timestamp)). The common case, bytes to a
partition whose open batch has room, is compiled (rayk.client.send_path, 28-35% more
records a second); every other record takes the Python path. A batch closes when it reaches
`batch_size` bytes or has waited `linger_ms`; the Sender thread then encodes it as one
Kafka v2 record batch (compressed if asked), so the broker only validates and appends
it, and sends it, at most `max_in_flight_requests_per_connection` per partition at a
time. Nothing polls: the Sender waits on the accumulator until a send, an answer or a
deadline wakes it (sender.py).

`send_batch` is the columnar form for what Ray users hold (arrays, Arrow tables, Dataset
blocks): one call queues many records, encoded from the columns' buffers by compiled code
straight into batches of up to `max_request_size` (rayk.client.columns), with keys
partitioned by the same murmur2, and one future (FutureSendBatch) for all of them.

Defaults are Kafka's since 3.0: `acks="all"` (the leader answers once every in-sync
replica has the batch) and idempotence, always on: the producer takes a producer id from
the Controller and stamps each batch with it, its epoch and the partition sequence of its
first record. The leader appends a partition's batches in sequence order even when Ray
delivers the calls out of order (it does, for async actors), and answers a retry of an
already appended batch with its original offsets instead of writing it twice. After
OUT_OF_ORDER_SEQUENCE_NUMBER (that batch fails) the producer bumps its epoch (KIP-360;
see IdempotenceManager). `identity` (rayk.client.idempotence.ProducerIdentity) makes the
producer continue a producer id that an earlier process used instead of taking a new
one; rayk.client.resumable_write, for retried write tasks, is what uses it.

Records wait in batches until acknowledged; together they may take `buffer_memory` bytes.
When they would take more, `send` blocks until acknowledgements free room, for at most
`max_block_ms`, then raises BufferExhaustedError (Kafka's buffer.memory and max.block.ms),
so a fast caller is paced by the cluster instead of growing an unbounded queue. `send`
also waits up to `max_block_ms` for the topic's metadata (a Controller being restarted
by Ray, say), then raises KafkaTimeoutError.

Timeouts bound everything (see Sender): each produce call gets `request_timeout_ms`,
after which it is cancelled and retried; retriable failures (NOT_LEADER_OR_FOLLOWER,
REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS, a dead leader actor...) are retried after
`retry_backoff_ms`; and every record is acknowledged or failed within
`delivery_timeout_ms` of its batch's creation (then with KafkaTimeoutError), so
`flush()` always returns. No Ray exception reaches the caller: errors are rayk's typed
KafkaError subclasses.

A Producer holds a thread, so it is not shipped between processes; pickling one (to use
it in a Ray task or actor) carries its settings and builds a fresh Producer there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rayk.client import calls
from rayk.client.accumulator import RecordAccumulator
from rayk.client.columns import RecordColumns, row_partitions
from rayk.client.idempotence import IdempotenceManager, ProducerIdentity
from rayk.client.metadata import MetadataCache
from rayk.client.partitioner import partition_for_key
from rayk.client.produce_future import BatchResult, FutureRecordMetadata, FutureSendBatch
from rayk.client.producer_config import (  # noqa: F401  (the defaults, acks_value: imported from here too)
    DEFAULT_BATCH_SIZE,
    DEFAULT_LINGER_MS,
    DEFAULTS,
    ProducerConfig,
    acks_value,
)
from rayk.client.send_path import RECORD_OVERHEAD_BYTES, SendMethod, SendPath
from rayk.client.sender import Sender
from rayk.client.serializers import serializer, to_bytes
from rayk.client.transactions import ConsumerGroupMetadata, TransactionManager
from rayk.client.types import OffsetAndMetadata, TopicPartition
from rayk.errors import InvalidTxnStateError, RecordTooLargeError


class Producer:
    """Sends records to a rayk cluster (kafka-python's KafkaProducer); make one with
    `cluster.producer(**settings)`. Use it from many threads; close it (or use it in a
    `with` block) to send what is queued. Settings, by kafka-python's names:

    - `acks` ("all"): 0 (no answer), 1 (the leader has it) or "all" / -1 (every in-sync
      replica has it); the producer is idempotent whatever `acks` is.
    - `linger_ms` (5 ms, Kafka's): how long a partition's batch waits for more records.
    - `batch_size` (1 MiB, bytes): a partition's batch closes at this size.
    - `compression_type` (None): "gzip", "snappy", "lz4" or "zstd" (the last three with
      `pip install 'rayk[compression]'`).
    - `key_serializer`, `value_serializer` (None: bytes as they are, str as UTF-8):
      "msgpack", "str", "bytes" or a callable returning bytes.
    - `max_in_flight_requests_per_connection` (5): batches in flight per partition.
    - `request_timeout_ms` (30,000 ms): one call to a leader, then it is retried.
    - `delivery_timeout_ms` (120,000 ms): from `send` to each record's outcome.
    - `retry_backoff_ms` (100 ms): the pause before a retry.
    - `max_request_size` (1 MiB, bytes): the largest batch, and so the largest record.
    - `buffer_memory` (32 MiB, bytes): what may wait for acknowledgement; `send` blocks
      beyond it for up to `max_block_ms` (60,000 ms), then BufferExhaustedError.
    - `metadata_max_age_ms` (300,000 ms): how often the partition counts are looked up.
    - `identity` (None): rayk's own, for writes that resume as the same producer id
      (rayk.client.resumable_write).
    - `transactional_id` (None): makes the producer transactional (Kafka's transactions,
      rayk.client.transactions): `init_transactions()` once, then
      `begin_transaction()`, `send...`, `send_offsets_to_transaction(...)` and
      `commit_transaction()` or `abort_transaction()`. While no transaction is open,
      `send` raises InvalidTxnStateError.
    - `transaction_timeout_ms` (60,000 ms): a transaction open longer is aborted by its
      coordinator (at most the brokers' transaction.max.timeout.ms).

    Errors are rayk's typed KafkaError subclasses (rayk.errors): `send` raises
    RecordTooLargeError, BufferExhaustedError or KafkaTimeoutError (metadata not found
    within `max_block_ms`); its future raises what failed the record (NotEnoughReplicasError,
    KafkaTimeoutError past `delivery_timeout_ms`, ...); `flush` and `close` raise
    KafkaTimeoutError past their timeout. Settings out of range raise InvalidClientConfigError
    (a ValueError; rayk.client.producer_config).
    """

    def __init__(
        self,
        cluster: Any,
        *,
        acks: str | int = DEFAULTS.acks,
        linger_ms: int = DEFAULTS.linger_ms,
        batch_size: int = DEFAULTS.batch_size,
        compression_type: str | None = DEFAULTS.compression_type,
        key_serializer: Any = DEFAULTS.key_serializer,
        value_serializer: Any = DEFAULTS.value_serializer,
        max_in_flight_requests_per_connection: int = DEFAULTS.max_in_flight_requests_per_connection,
        request_timeout_ms: int = DEFAULTS.request_timeout_ms,
        delivery_timeout_ms: int = DEFAULTS.delivery_timeout_ms,
        retry_backoff_ms: int = DEFAULTS.retry_backoff_ms,
        max_request_size: int = DEFAULTS.max_request_size,
        buffer_memory: int = DEFAULTS.buffer_memory,
        max_block_ms: int = DEFAULTS.max_block_ms,
        metadata_max_age_ms: int = DEFAULTS.metadata_max_age_ms,
        identity: ProducerIdentity | None = DEFAULTS.identity,
        transactional_id: str | None = DEFAULTS.transactional_id,
        transaction_timeout_ms: int = DEFAULTS.transaction_timeout_ms,
    ) -> None:
        config = ProducerConfig(
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
            metadata_max_age_ms=metadata_max_age_ms,
            identity=identity,
            transactional_id=transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
        )
        self._start(cluster, config)

    def _start(self, cluster: Any, config: ProducerConfig) -> None:
        """Builds the producer's parts from its checked config and starts its sender thread."""
        self._config = config
        self._cluster = cluster
        self._key_serializer = serializer(config.key_serializer)
        self._value_serializer = serializer(config.value_serializer)
        self._plain_keys = self._key_serializer is to_bytes  # bytes go as they are
        self._plain_values = self._value_serializer is to_bytes
        self._max_request_size = config.max_request_size
        self._max_record_bytes = config.max_record_bytes
        self._buffer_memory = config.buffer_memory
        self._max_block_ms = config.max_block_ms
        self._metadata = MetadataCache(
            cluster.controller, config.request_timeout_ms, config.retry_backoff_ms, config.metadata_max_age_ms
        )
        self._transactions = self._transaction_manager(config)
        self._idempotence = self._idempotence_manager(config)
        self._accumulator = RecordAccumulator(
            batch_size=min(config.batch_size, config.max_request_size),  # a batch is one produce call
            linger_ms=config.linger_ms,
            delivery_timeout_ms=config.delivery_timeout_ms,
            buffer_memory=config.buffer_memory,
            max_block_ms=config.max_block_ms,
            max_in_flight=config.max_in_flight_requests_per_connection,
            max_request_size=config.max_request_size,
        )
        self._sender = Sender(
            self._accumulator,
            self._metadata,
            self._idempotence,
            acks=config.acks_number,
            compression=config.compression,
            request_timeout_ms=config.request_timeout_ms,
            retry_backoff_ms=config.retry_backoff_ms,
            transactional_id=config.transactional_id,
            on_failure=None if self._transactions is None else self._transactions.record_failed,
        )
        # send()'s common case, compiled (rayk.client.send_path); a transaction's first
        # record of a partition adds it to the transaction, which is Python's.
        self._send_path = (
            None if SendPath is None or self._transactions is not None else SendPath(
                self._accumulator, self._metadata, self._plain_keys, self._plain_values, self._max_record_bytes
            )
        )  # fmt: skip
        self._closed = False
        self._sender.start()

    def _transaction_manager(self, config: ProducerConfig) -> TransactionManager | None:
        """The transactional producer's side of its transactions (None: not transactional)."""
        if config.transactional_id is None:
            return None
        return TransactionManager(
            self._cluster.controller, config.transactional_id, config.transaction_timeout_ms,
            config.request_timeout_ms, config.retry_backoff_ms,
        )  # fmt: skip

    def _idempotence_manager(self, config: ProducerConfig) -> IdempotenceManager:
        """Idempotence, always on: Ray may deliver a partition's batches out of order, and the
        leader puts them back in sequence order (and drops retried duplicates)."""
        if config.transactional_id is not None:
            return IdempotenceManager.transactional()  # its id comes with init_transactions()
        if config.identity is not None:  # continuing a producer id's sequences (a retried write task: resumable_write)
            return IdempotenceManager.pinned(config.identity)
        controller = self._cluster.controller

        def new_producer_id(timeout_ms: int = config.request_timeout_ms) -> int:
            return calls.call(
                lambda: controller.init_producer_id.remote(),
                time.monotonic() + timeout_ms / 1000,
                "InitProducerId",
                retry_backoff_ms=config.retry_backoff_ms,
            )

        return IdempotenceManager(new_producer_id(config.max_block_ms), new_producer_id)

    def __reduce__(self) -> tuple:
        return (_rebuild_producer, (self._cluster, self._config))

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: list[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: Callable[[FutureRecordMetadata], Any] | None = None,
    ) -> FutureRecordMetadata:
        """Queues one record; the future resolves to its RecordMetadata. `callback(future)`
        runs once the record is acknowledged or failed, as `future.add_done_callback(callback)`
        would run it (Kafka's send(record, callback)); given here, it is queued with the
        record, which costs less than adding it to the future afterwards.

        Blocks while the buffer is full (up to `max_block_ms`, then BufferExhaustedError)
        or the topic's metadata is not known yet (up to `max_block_ms`, then KafkaTimeoutError).
        """
        path = self._send_path
        if path is not None:  # bytes to a partition whose open batch has room: appended in C
            future = path(self, topic, value, key, headers, partition, timestamp_ms, callback)
            if future is not None:
                return future
        if self._closed:
            raise RuntimeError("the producer is closed")
        # The hot path: a plain tuple for the record, no call for bytes with no serializer.
        if key is not None and (key.__class__ is not bytes or not self._plain_keys):
            key = self._key_serializer(key)
        if value.__class__ is not bytes or not self._plain_values:
            value = self._value_serializer(value)
        size = RECORD_OVERHEAD_BYTES + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
        header_items: tuple[tuple[str, bytes | None], ...] = ()
        if headers:
            header_items = tuple(headers)
            size += sum(len(k) + len(v or b"") + 10 for k, v in header_items)
        if size > self._max_record_bytes:
            raise RecordTooLargeError(
                f"a {size}-byte record exceeds max_request_size = {self._max_request_size} bytes"
                f" or buffer_memory = {self._buffer_memory} bytes"
            )
        num_partitions = self._metadata.cached_partition_count(topic) or self._partition_count(topic)
        if partition is None:
            if key is not None:
                partition = partition_for_key(key, num_partitions)
        elif not 0 <= partition < num_partitions:
            raise ValueError(f"topic {topic!r} has partitions 0..{num_partitions - 1}, not {partition}")
        if self._transactions is not None:  # the partition joins the transaction before its records go
            if partition is None:
                partition = self._accumulator.sticky_partition(topic, num_partitions)
            self._transactions.add_partition(TopicPartition(topic, partition), self._max_block_ms)
        record = (value, key, header_items, timestamp_ms or time.time_ns() // 1_000_000)
        return self._accumulator.append(topic, partition, num_partitions, record, size, callback)

    if SendMethod is not None:
        # The same send, its first step compiled too: `producer.send(...)` runs no Python
        # frame for a record the path takes (rayk/client/_send.c, SendMethod).
        send = SendMethod(send)

    def send_batch(
        self,
        topic: str,
        values: Any,
        keys: Any = None,
        partition: Any = None,
        headers: Any = None,
        timestamps_ms: Any = None,
    ) -> FutureSendBatch:
        """Queues many records at once from columns; the future resolves to
        SendBatchMetadata (an offset range per batch; each record's partition and offset).

        `values` and `keys` hold bytes, str or None per record: a sequence, a numpy array
        (object, bytes or str dtype; or 2-D uint8, a row per value) or a pyarrow
        binary/string array. The producer's serializers are not applied. A keyed record
        goes where `send()` puts its key (murmur2); `partition` (one int, or one per record,
        -1 or null for "by key") overrides that; unkeyed records fill a batch for the
        sticky partition, then move on, as send() does. `headers` is a list of (str,
        bytes | None) pairs every record carries, or a pyarrow
        list<struct<key string, value binary>> column with a list per record.
        `timestamps_ms` is one create time per record (ints in ms, or datetimes); the
        default is now.

        Records are encoded here, into batches of up to `max_request_size`, with no Python
        object per record; batches of the same partition keep the call's order, after
        what `send()` queued before. A record too large for a batch is refused
        (RecordTooLargeError) before anything is queued. Blocks like `send` while the
        buffer is full; if that times out (BufferExhaustedError) the batches queued before
        it are still sent.
        """
        if self._closed:
            raise RuntimeError("the producer is closed")
        columns = RecordColumns.of(values, keys, headers, timestamps_ms)
        num_partitions = self._partition_count(topic)
        partitions = row_partitions(columns, partition, num_partitions, topic)
        max_body_bytes = self._max_record_bytes
        largest = columns.largest_record_bytes()
        if largest > max_body_bytes:  # refused before anything is queued
            raise RecordTooLargeError(
                f"a record of at least {largest} bytes exceeds max_request_size = {self._max_request_size} bytes"
                f" or buffer_memory = {self._buffer_memory} bytes"
            )
        now_ms = int(time.time() * 1000)
        parts: list[tuple[BatchResult, int, np.ndarray]] = []
        order = np.argsort(partitions, kind="stable")  # unkeyed (-1) rows first; each partition in the call's order
        groups = np.split(order, np.flatnonzero(np.diff(partitions[order])) + 1) if len(order) else []
        for rows in groups:
            fixed = int(partitions[rows[0]])
            for records, batch_rows in columns.batches(rows, now_ms, max_body_bytes):
                if len(records.body) > max_body_bytes:
                    raise RecordTooLargeError(
                        f"record {int(batch_rows[0])} takes {len(records.body)} bytes; max_request_size ="
                        f" {self._max_request_size}, buffer_memory = {self._buffer_memory}"
                    )
                target = fixed if fixed >= 0 else self._accumulator.sticky_partition(topic, num_partitions)
                if self._transactions is not None:
                    self._transactions.add_partition(TopicPartition(topic, target), self._max_block_ms)
                partitions[batch_rows] = target
                result = self._accumulator.append_encoded(TopicPartition(topic, target), num_partitions, records)
                parts.append((result, target, batch_rows))
        return FutureSendBatch(topic, partitions, parts)

    # ------------------------------------------------------------------ transactions

    def init_transactions(self, timeout_s: float | None = None) -> None:
        """Takes the transactional id's producer id and a new epoch from its transaction
        coordinator, which fences every older producer with the id (their open transaction
        is aborted). Call it once, before the first transaction; `timeout_s` defaults to
        `max_block_ms`."""
        self._txn().init(self._timeout_ms(timeout_s))
        self._new_epoch()

    def begin_transaction(self) -> None:
        """Starts a transaction: what `send` queues until `commit_transaction` is committed
        together, or not at all."""
        self._txn().begin()

    def send_offsets_to_transaction(
        self, offsets: dict[TopicPartition, int | OffsetAndMetadata], group_metadata: ConsumerGroupMetadata | str,
        timeout_s: float | None = None,
    ) -> None:
        """Commits a consumer group's offsets (the next offset to read, per partition, or an
        OffsetAndMetadata with the string to commit along) with the transaction: they
        become the group's committed offsets if and only if the transaction commits.
        `group_metadata` is `consumer.group_metadata()` (its member id
        and generation fence a zombie member's commit) or a group id."""
        group = ConsumerGroupMetadata(group_metadata) if isinstance(group_metadata, str) else group_metadata
        self._txn().send_offsets(offsets, group, self._timeout_ms(timeout_s))

    def commit_transaction(self, timeout_s: float | None = None) -> None:
        """Sends what is queued, then commits the transaction. If a record of it failed,
        raises that error instead: call `abort_transaction`."""
        self._end_transaction(True, timeout_s)

    def abort_transaction(self, timeout_s: float | None = None) -> None:
        """Sends what is queued, then aborts the transaction: read_committed consumers never
        see its records, and offsets sent with it are not committed."""
        self._end_transaction(False, timeout_s)

    def _end_transaction(self, commit: bool, timeout_s: float | None) -> None:
        txn = self._txn()
        timeout_ms = self._timeout_ms(timeout_s)
        epoch = (txn.producer_id, txn.epoch)
        txn.end(commit, lambda: self.flush(timeout_ms / 1000), lambda: self._idempotence.bump_needed, timeout_ms)
        if (txn.producer_id, txn.epoch) != epoch:
            self._new_epoch()

    def _new_epoch(self) -> None:
        txn = self._txn()
        with self._accumulator.lock:  # the sender stamps batches with the id and epoch
            self._idempotence.reset(txn.producer_id, txn.epoch)

    def _txn(self) -> TransactionManager:
        if self._transactions is None:
            raise InvalidTxnStateError("a transaction needs a producer made with a transactional_id")
        if self._closed:
            raise RuntimeError("the producer is closed")
        return self._transactions

    def _timeout_ms(self, timeout_s: float | None) -> int:
        return self._max_block_ms if timeout_s is None else max(int(timeout_s * 1000), 1)

    def _partition_count(self, topic: str) -> int:
        num_partitions = self._metadata.cached_partition_count(topic)
        if num_partitions is None:
            num_partitions = self._metadata.partition_count(topic, self._max_block_ms)
        return num_partitions

    def partitions_for(self, topic: str) -> set[int]:
        """The topic's partition ids as this producer knows them (kafka-python's
        partitions_for): a grown topic shows its new partitions once the metadata is
        refreshed, at the latest `metadata_max_age_ms` after the producer last looked.
        KafkaTimeoutError if the topic is not found within `max_block_ms`."""
        return set(range(self._metadata.cached_partition_count(topic) or self._partition_count(topic)))

    def flush(self, timeout_s: float | None = None, *, timeout: float | None = None) -> None:
        """Sends everything queued now and waits until each record is acknowledged or
        failed (at most delivery_timeout_ms); KafkaTimeoutError after `timeout_s`
        (kafka-python's `timeout`, also seconds)."""
        self._accumulator.await_all(_either_timeout_s(timeout_s, timeout))

    def close(self, timeout_s: float | None = None, *, timeout: float | None = None) -> None:
        """Flushes for up to `timeout_s` (kafka-python's `timeout`), then stops the sender
        thread. Records still unacknowledged then fail with KafkaTimeoutError, as with
        Kafka's close(timeout), so that nothing of this producer calls the cluster after
        close returns."""
        timeout_s = _either_timeout_s(timeout_s, timeout)
        if self._closed:
            return
        self._closed = True
        try:
            self.flush(timeout_s)
        finally:
            self._accumulator.close(abandon=True)
            self._sender.join(timeout_s=5)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _either_timeout_s(timeout_s: float | None, timeout: float | None) -> float | None:
    """rayk's `timeout_s` or kafka-python's `timeout` (seconds both), not both."""
    if timeout_s is not None and timeout is not None:
        raise TypeError("give timeout_s or timeout (kafka-python's name), not both")
    return timeout if timeout_s is None else timeout_s


def _rebuild_producer(cluster: Any, config: ProducerConfig) -> Producer:
    return Producer(cluster, **config.settings())
