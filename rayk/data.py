"""Topics as Ray Datasets: `read_topic`, `stream_topic` and `write_topic`.

`read_topic(topic)` plans the offset ranges once (a consistent snapshot up to each
partition's high watermark; see rayk.client.offset_ranges), then reads every range in a
Ray task placed on the node of that partition's leader (soft node affinity: locality when
it can, anywhere when that node is busy or gone), splitting a partition evenly into tasks
of at most `records_per_task` records and about `bytes_per_task` bytes (64 MiB, by the
partition's average record size on disk), so that each block is 16-128 MiB as Ray Data
wants its blocks. Each task fetches the range from the leader replica in
`fetch_max_bytes` chunks (following a leader that moves), decodes them with compiled code
straight into Arrow buffers, no Python object per record (rayk.client.arrow_batches), and
returns one Arrow table with the columns of Spark's Kafka source:

    key binary, value binary, topic string, partition int32, offset int64,
    timestamp timestamp[ms], timestampType int32, headers list<struct<key string, value binary>>

The Dataset is built from those tables (`ray.data.from_arrow_refs`); the tasks start when
`read_topic` is called, which is what makes the snapshot hold: offsets are fixed then.

`stream_topic(topic, group_id)` reads the topic as a stream of Datasets, one per
micro-batch of the records that arrived since the last one, read the same way; the
stream's progress is the group's committed offsets (rayk.client.micro_batches), committed
when the loop asks for the next batch.

`write_topic(ds, topic)` is a Ray Data Datasink: each write task produces its blocks with
one idempotent Producer (columns `value`, and optionally `key`, `partition`, `headers`,
`timestamp`), one `Producer.send_batch` per block (the Arrow columns are encoded as
record batches with no Python object per row), flushes, and fails if any record was not
acknowledged, which fails the whole `write_topic` call. A task that Ray retries (its
worker died) writes nothing twice: it resumes after what the attempt before wrote
(rayk.client.resumable_write). It returns the number of records
written. Small blocks are bundled into write tasks of at least ROWS_PER_WRITE_TASK rows:
each task pays for a Producer of its own, and `from_items` of 200 rows is 200 blocks:
written one task per block, they took 7.8 s instead of 0.45 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayk.client import calls
from rayk.client.arrow_batches import SCHEMA, records_table
from rayk.client.data_plane import DataPlaneSession
from rayk.client.metadata import MetadataCache
from rayk.client.micro_batches import MicroBatches
from rayk.client.offset_ranges import OffsetRange, OffsetSpec, plan_read_ranges, split_for_tasks
from rayk.client.resumable_write import reserve_task_producer_ids, write_task
from rayk.dataplane.frames import FetchRequest
from rayk.errors import InvalidConfigurationError, KafkaError, KafkaTimeoutError
from rayk.storage.records import end_offset_of

ROWS_PER_WRITE_TASK = 10_000
FETCH_MAX_BYTES = 8 * 1024 * 1024
RECORDS_PER_TASK = 1_000_000
BYTES_PER_TASK = 64 << 20  # a read task's block: Ray Data's blocks go up to 128 MiB, Spark's splits 128 MiB
READ_RETRY_BACKOFF_MS = 100
READ_RETRY_TIMEOUT_MS = 60_000


def cluster_or_connect(cluster: Any) -> Any:
    if cluster is not None:
        return cluster
    import rayk

    return rayk.connect()


# ---------------------------------------------------------------------------- reading


def read_range(cluster: Any, r: OffsetRange, fetch_max_bytes: int = FETCH_MAX_BYTES) -> pa.Table:
    """The records of one offset range as an Arrow table of SCHEMA (in this process),
    fetched from the partition's leader over the data plane and decoded by compiled code
    (arrow_batches)."""
    metadata = MetadataCache(cluster.controller)
    data_plane = DataPlaneSession(f"read of {r.topic}-{r.partition}")
    try:
        return _read_range(metadata, data_plane, r, fetch_max_bytes)
    finally:
        data_plane.close()


def _read_range(metadata: MetadataCache, data_plane: DataPlaneSession, r: OffsetRange, fetch_max_bytes: int) -> pa.Table:
    tables = []
    offset = r.start
    deadline = time.monotonic() + READ_RETRY_TIMEOUT_MS / 1000
    while offset < r.end:
        try:
            leader = metadata.leader(r.topic, r.partition)
            request = FetchRequest(offset, fetch_max_bytes, min_bytes=1, max_wait_ms=0)
            result = calls.get(data_plane.fetch(leader, request), deadline, f"fetch {r.topic}-{r.partition}")
            error = result.error
        except KafkaError as e:  # the leader moved, died or did not answer (by `deadline`)
            error = e
        if error is None:
            if result.records:
                table = records_table(result.records, r.topic, r.partition, offset, r.end)
                if table.num_rows:
                    tables.append(table)
                offset = max(offset, min(end_offset_of(result.records), r.end))
                deadline = time.monotonic() + READ_RETRY_TIMEOUT_MS / 1000
                continue
        elif isinstance(error, KafkaError) and not error.retriable:
            raise error
        if time.monotonic() > deadline:  # a leader gone for good, or a log truncated below `end`
            raise KafkaTimeoutError(f"{r.topic}-{r.partition}: stuck at offset {offset} of [{r.start}, {r.end}): {error}")
        metadata.invalidate(r.topic)
        time.sleep(READ_RETRY_BACKOFF_MS / 1000)
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


@ray.remote(max_retries=3)
def _read_range_task(cluster: Any, r: OffsetRange, fetch_max_bytes: int) -> pa.Table:
    return read_range(cluster, r, fetch_max_bytes)


def read_topic(
    topic: str,
    starting_offsets: OffsetSpec = "earliest",
    ending_offsets: OffsetSpec = "latest",
    *,
    starting_timestamp: int | None = None,
    cluster: Any = None,
    records_per_task: int = RECORDS_PER_TASK,
    bytes_per_task: int = BYTES_PER_TASK,
    fetch_max_bytes: int = FETCH_MAX_BYTES,
) -> ray.data.Dataset:
    """A Dataset of the topic's records in the given offsets, as of now (see the module
    docstring). `cluster` defaults to `rayk.connect()`."""
    if fetch_max_bytes < 1:
        raise InvalidConfigurationError("fetch_max_bytes must be >= 1")
    cluster = cluster_or_connect(cluster)
    ranges = plan_read_ranges(
        cluster, topic, starting_offsets, ending_offsets, starting_timestamp, records_per_task, bytes_per_task
    )
    return read_ranges(cluster, ranges, fetch_max_bytes)


def read_ranges(cluster: Any, ranges: list[OffsetRange], fetch_max_bytes: int = FETCH_MAX_BYTES) -> ray.data.Dataset:
    """A Dataset of these ranges' records, each range read by a task started now on the
    node of its partition's leader."""
    if not ranges:
        return ray.data.from_arrow(SCHEMA.empty_table())
    on_leader = leader_node_affinity(cluster)
    refs = [_read_range_task.options(**on_leader(r)).remote(cluster, r, fetch_max_bytes) for r in ranges]
    return ray.data.from_arrow_refs(refs)


class TopicStream:
    """A topic's micro-batches as Datasets (`stream_topic`); iterate over it in a `with`
    block (or call `close()`: it holds a consumer). Asking for a batch's successor commits
    the batch (the loop body that processed it has returned); `stop()` ends the iteration
    at its next step, after committing the last batch, so call it and let the loop come
    round rather than `break`. Leaving the loop otherwise (`break`, an exception) commits
    nothing: the stream next started for the group hands that batch out again, with the
    same `batch_id`."""

    def __init__(self, cluster: Any, topic: str, group_id: str, records_per_task: int, bytes_per_task: int,
                 fetch_max_bytes: int, **batch_settings: Any) -> None:  # fmt: skip
        if records_per_task < 1 or bytes_per_task < 1 or fetch_max_bytes < 1:
            raise InvalidConfigurationError("records_per_task, bytes_per_task and fetch_max_bytes must be >= 1")
        self._cluster = cluster
        self._task_size = (records_per_task, bytes_per_task)
        self._fetch_max_bytes = fetch_max_bytes
        self._batches = MicroBatches(cluster, topic, group_id, **batch_settings)
        self._handed_out: list[OffsetRange] | None = None
        self.batch_id = -1  # the id of the batch last handed out

    def __iter__(self) -> TopicStream:
        return self

    def __next__(self) -> ray.data.Dataset:
        if self._handed_out is not None:
            self._batches.commit(self._handed_out)
            self._handed_out = None
        batch_id = self._batches.batch_id
        ranges = self._batches.next_batch()
        if ranges is None:
            self.close()
            raise StopIteration
        self._handed_out, self.batch_id = ranges, batch_id
        return read_ranges(self._cluster, split_for_tasks(self._cluster, ranges, *self._task_size), self._fetch_max_bytes)

    def stop(self) -> None:
        """Ends the iteration at its next step (from any thread; a wait for the next
        trigger ends at once)."""
        self._batches.stop()

    def close(self) -> None:
        """Ends the stream without committing a batch handed out."""
        self._handed_out = None
        self._batches.close()

    def __enter__(self) -> TopicStream:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def stream_topic(
    topic: str,
    group_id: str,
    *,
    trigger_ms: int = 1000,
    max_records_per_batch: int | None = None,
    starting_offsets: OffsetSpec = "latest",
    fail_on_data_loss: bool = True,
    cluster: Any = None,
    records_per_task: int = RECORDS_PER_TASK,
    bytes_per_task: int = BYTES_PER_TASK,
    fetch_max_bytes: int = FETCH_MAX_BYTES,
) -> TopicStream:
    """The topic as a stream of Datasets, one per micro-batch: the records that arrived
    since the last one, planned every `trigger_ms`, with the group's committed offsets as
    the stream's progress (see TopicStream and rayk.client.micro_batches)::

        with rayk.data.stream_topic("events", "etl") as stream:
            for ds in stream:
                ds.write_parquet(f"/out/{stream.batch_id}", mode="overwrite")  # a replay replaces
    """
    return TopicStream(
        cluster_or_connect(cluster), topic, group_id, records_per_task, bytes_per_task, fetch_max_bytes,
        trigger_ms=trigger_ms, max_records_per_batch=max_records_per_batch,
        starting_offsets=starting_offsets, fail_on_data_loss=fail_on_data_loss,
    )  # fmt: skip


def leader_node_affinity(cluster: Any) -> Callable[[OffsetRange], dict[str, Any]]:
    """Task options that run the read of a range on the node of its partition's leader
    (soft: anywhere when that node is busy or gone)."""
    nodes = {b["broker_id"]: b["node_id"] for b in cluster.brokers()}

    def options(r: OffsetRange) -> dict[str, Any]:
        node_id = nodes.get(r.leader)
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=True)} if node_id else {}

    return options


# ---------------------------------------------------------------------------- writing


class TopicDatasink(ray.data.Datasink):
    """Produces a Dataset's rows to a topic (see the module docstring)."""

    def __init__(self, cluster: Any, topic: str, **producer_settings: Any) -> None:
        self._cluster, self._topic = cluster, topic
        self._settings = producer_settings
        self.written = 0

    @property
    def min_rows_per_write(self) -> int:
        return ROWS_PER_WRITE_TASK

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        if schema is not None and "value" not in schema.names:
            raise InvalidConfigurationError(f"write_topic needs a 'value' column; the dataset has {schema.names}")
        self._first_producer_id = reserve_task_producer_ids(self._cluster)

    def write(self, blocks: Iterable[Any], ctx: Any) -> int:
        """One write task: a retry of it (Ray re-runs a task whose worker died) resumes
        after what the attempt before wrote (rayk.client.resumable_write)."""
        tables = (block if isinstance(block, pa.Table) else pa.Table.from_pandas(block) for block in blocks)
        return write_task(self._cluster, self._topic, tables, self._settings, self._first_producer_id, ctx.task_idx)

    def on_write_complete(self, write_result: Any) -> None:
        self.written = sum(write_result.write_returns)


def write_topic(ds: ray.data.Dataset, topic: str, *, acks: str | int = "all", cluster: Any = None,
                **producer_settings: Any) -> int:
    """Produces every row of `ds` to `topic`; returns how many records were written.
    Raises if any record is not acknowledged. `cluster` defaults to `rayk.connect()`."""
    cluster = cluster_or_connect(cluster)
    cluster.describe_topic(topic)  # UNKNOWN_TOPIC_OR_PARTITION before any task runs
    sink = TopicDatasink(cluster, topic, acks=acks, **producer_settings)
    ds.write_datasink(sink)
    return sink.written
