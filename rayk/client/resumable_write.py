"""Resumable write tasks: a write task that Spark or Ray retries writes no record twice.

A job that writes a topic from many tasks (rayk.spark.write_topic, rayk.data.write_topic)
reserves a block of producer ids (`reserve_task_producer_ids`), and task i writes as
producer `first + i`, in every attempt. An attempt first asks each partition's leader how
far that producer's committed batches go (PartitionReplica.producer_sequence); then it
drops, per partition, that many of the rows it would send there, and sends the rest
continuing the producer's sequences (a pinned Producer, IdempotenceManager.pinned).
Sequences count a producer's records per partition, so "the first n rows this task sends
to partition p" are the records with sequences 0..n-1, however an earlier attempt cut
them into batches.

That holds when the task is deterministic: each attempt reads the same rows in the same
order (the retry contract of Spark and Ray) and places each row on the same partition.
Rows with a key or a partition column do. Unkeyed rows, which a Producer spreads with the
timing-dependent sticky partitioner, are placed here by a rule of their own
(`TaskRows`): runs of `STICKY_RUN_BYTES` go to one partition, then to the next, starting
from the task's index.

An earlier attempt that is still running (an executor that lost contact, a speculative
copy) sends the same records under the same sequences. The leaders' sequence checks let
one copy of each into the log; the attempt that comes second gets
OUT_OF_ORDER_SEQUENCE_NUMBER and fails, and the task's next attempt resumes again.
(Kafka would fence it with a transactional id; a task's write is not a transaction, so
its sequences are what let one copy in.)

Limits: a partition remembers a producer while the log holds one of its batches, so
retention that deletes all of a task's batches to a partition while the job runs makes a
retry write them again; and a task writes at most 2**31 - 1 records to one partition
(sequences are int32).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayk.client import calls
from rayk.client.columns import RecordColumns, row_partitions
from rayk.client.idempotence import ProducerIdentity
from rayk.client.metadata import MetadataCache
from rayk.client.producer import DEFAULT_BATCH_SIZE, RECORD_OVERHEAD_BYTES
from rayk.client.types import TopicPartition
from rayk.errors import InvalidConfigurationError, KafkaError

TASK_PRODUCER_IDS = 1 << 16  # producer ids a write job reserves: tasks 0..65535
STICKY_RUN_BYTES = DEFAULT_BATCH_SIZE  # unkeyed rows: this many bytes to a partition, then the next
RESUME_TIMEOUT_MS = 60_000  # for the leaders to say (and commit) how far a producer got


def reserve_task_producer_ids(cluster: Any) -> int:
    """The first of `TASK_PRODUCER_IDS` producer ids reserved for one write job's tasks
    (within the cluster's default_api_timeout_ms; a retry after a lost answer reserves
    another block, leaving the first unused, which is harmless)."""
    return cluster.api_calls(
        lambda: cluster.controller.allocate_producer_ids.remote(TASK_PRODUCER_IDS), "AllocateProducerIds"
    )


def task_producer_id(first_producer_id: int, task_index: int) -> int:
    if not 0 <= task_index < TASK_PRODUCER_IDS:
        raise InvalidConfigurationError(
            f"a write job has at most {TASK_PRODUCER_IDS} tasks (this is task {task_index}); write fewer, larger partitions"
        )
    return first_producer_id + task_index


def resume_point(cluster: Any, topic: str, producer_id: int, timeout_ms: int = RESUME_TIMEOUT_MS) -> ProducerIdentity:
    """`producer_id`'s next sequence on every partition of `topic`, from the leaders, as
    far as its batches are committed (0 where it wrote nothing)."""
    deadline_s = time.monotonic() + timeout_ms / 1000
    metadata = MetadataCache(cluster.controller, timeout_ms)
    num_partitions = metadata.partition_count(topic, timeout_ms)

    def ask(partition: int) -> tuple[int, int]:
        return calls.call(
            lambda: metadata.leader(topic, partition, _ms_left(deadline_s)).producer_sequence.remote(
                producer_id, _ms_left(deadline_s)
            ),
            deadline_s,
            f"how far producer {producer_id} got on {topic}-{partition}",
            on_retriable=lambda _: metadata.invalidate(topic, partition),
        )

    next_sequences, epochs = {}, set()
    for partition in range(num_partitions):
        epoch, sequence = ask(partition)
        next_sequences[TopicPartition(topic, partition)] = sequence
        if epoch >= 0:
            epochs.add(epoch)
    if len(epochs) > 1:  # a pinned producer never bumps, so another writer used this id
        raise KafkaError(f"producer {producer_id} has epochs {sorted(epochs)} on {topic}: it is not this task's")
    return ProducerIdentity(producer_id, epochs.pop() if epochs else 0, next_sequences)


def _ms_left(deadline_s: float) -> int:
    return max(1, int((deadline_s - time.monotonic()) * 1000))


class TaskRows:
    """Places a write task's rows on partitions the same way in every attempt, and drops
    the rows that an earlier attempt wrote: the first `already_written[p]` rows placed on
    each partition p."""

    def __init__(self, topic: str, num_partitions: int, task_index: int, already_written: dict[int, int]) -> None:
        self._topic, self._num_partitions = topic, num_partitions
        self._to_skip = np.zeros(num_partitions, dtype=np.int64)
        for partition, count in already_written.items():
            self._to_skip[partition] = count
        self._first_partition = task_index % num_partitions
        self._unkeyed_bytes = 0  # bytes of the unkeyed rows placed so far
        self.skipped = 0

    def place(self, table: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """(the rows of `table` still to send, the partition of each)."""
        check_table(table)
        names = table.column_names
        columns = RecordColumns.of(table.column("value"), table.column("key") if "key" in names else None)
        chosen = table.column("partition") if "partition" in names else None
        partitions = row_partitions(columns, chosen, self._num_partitions, self._topic).astype(np.int32, copy=False)
        unkeyed = np.flatnonzero(partitions < 0)
        if len(unkeyed):
            partitions[unkeyed] = self._unkeyed_partitions(columns.values, unkeyed)
        if not self._to_skip.any():
            return table, partitions
        keep = np.ones(len(partitions), dtype=bool)
        for partition in np.flatnonzero(self._to_skip):
            rows = np.flatnonzero(partitions == partition)[: self._to_skip[partition]]
            keep[rows] = False
            self._to_skip[partition] -= len(rows)
        self.skipped += int(len(keep) - keep.sum())
        return table.filter(pa.array(keep)), partitions[keep]

    def _unkeyed_partitions(self, values: pa.Array, rows: np.ndarray) -> np.ndarray:
        sizes = pc.binary_length(values.take(pa.array(rows))).fill_null(0).to_numpy(zero_copy_only=False)
        sizes = sizes.astype(np.int64) + RECORD_OVERHEAD_BYTES
        before = self._unkeyed_bytes + np.cumsum(sizes) - sizes
        self._unkeyed_bytes += int(sizes.sum())
        return (self._first_partition + before // STICKY_RUN_BYTES) % self._num_partitions


def write_task(
    cluster: Any,
    topic: str,
    tables: Iterable[pa.Table],
    producer_settings: dict[str, Any],
    first_producer_id: int,
    task_index: int,
) -> int:
    """Writes one task's tables as producer `first_producer_id + task_index`, resuming
    after what earlier attempts of the task wrote; returns how many rows the task holds
    (written now or before). Raises KafkaError if any record was not acknowledged."""
    identity = resume_point(cluster, topic, task_producer_id(first_producer_id, task_index))
    rows = TaskRows(topic, len(identity.next_sequences), task_index,
                    {tp.partition: s for tp, s in identity.next_sequences.items()})  # fmt: skip
    producer = cluster.producer(identity=identity, **producer_settings)
    futures, total = [], 0
    try:
        for table in tables:
            total += table.num_rows
            remaining, partitions = rows.place(table)
            if remaining.num_rows:
                futures.append(send_table(producer, topic, remaining, partitions))
        producer.flush()
    finally:
        producer.close()
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        raise KafkaError(f"{len(failed)} of {len(futures)} blocks were not all written to {topic}: {failed[0]}") from failed[0]
    return total


def check_table(table: pa.Table) -> None:
    """InvalidConfigurationError unless the table has a `value` column, and `key` and
    `value` are binary or string."""
    names = table.column_names
    if "value" not in names:
        raise InvalidConfigurationError(f"write_topic needs a 'value' column; the block has {names}")
    for name in ("key", "value"):
        if name in names and not _is_bytes_like(table.column(name).type):
            raise InvalidConfigurationError(f"column {name!r} must be binary or string, not {table.column(name).type}")


def send_table(producer: Any, topic: str, table: pa.Table, partitions: np.ndarray | None = None) -> Any:
    """`Producer.send_batch` of an Arrow table with a `value` column and optionally `key`,
    `partition` (null: by key), `headers` and `timestamp` (null: now) columns;
    `partitions`, one per row, overrides the partition column."""
    check_table(table)
    names = table.column_names
    if partitions is None and "partition" in names:
        partitions = table.column("partition")
    return producer.send_batch(
        topic,
        table.column("value"),
        keys=table.column("key") if "key" in names else None,
        partition=partitions,
        headers=table.column("headers") if "headers" in names else None,
        timestamps_ms=_timestamps_ms(table.column("timestamp")) if "timestamp" in names else None,
    )


def _is_bytes_like(kind: pa.DataType) -> bool:
    return any(
        test(kind)
        for test in (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_string, pa.types.is_large_string, pa.types.is_null)
    )


def _timestamps_ms(column: pa.ChunkedArray) -> pa.Array:
    """Epoch ms as int64 (a timestamp column floored to ms); nulls become now."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())
    return column.fill_null(int(time.time() * 1000)).combine_chunks()
