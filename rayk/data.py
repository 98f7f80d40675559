"""Topics as Ray Datasets: `read_topic` and `stream_topic` over a Ray Data Datasource
(`TopicDatasource`), `write_topic` over a Datasink (`TopicDatasink`).

`read_topic(topic)` is lazy, as Ray's own `ray.data.read_kafka` is: it returns
`ray.data.read_datasource(TopicDatasource(...))`, and no record is read until the Dataset
executes. What it reads is fixed when it is called, though: the datasource's constructor
plans the offset ranges then (a consistent snapshot up to each partition's high
watermark; see rayk.client.offset_ranges), so every execution of the Dataset (`count()`,
then `take_all()`, ...) reads the same records, whatever was appended in between. A
partition is split evenly into read tasks of at most `records_per_task` records and about
`bytes_per_task` bytes (64 MiB, by the partition's average record size on disk), so that
each block is 16-128 MiB as Ray Data wants its blocks; `override_num_blocks=n` cuts the
snapshot into n tasks of (nearly) equal numbers of offsets instead, a task reading the
end of one partition and the start of the next when n is smaller than the number of
partitions. Ray Data is given the number of tasks as the read's parallelism, so that it
makes a block of each task's tables (left to pick a parallelism, it cuts them into
several). Each task fetches its ranges from the leader replicas in `fetch_max_bytes`
chunks (following a leader that moves), decodes them with compiled code straight into
Arrow buffers, no Python object per record (rayk.client.arrow_batches), and yields one
Arrow table per range, with the columns of Spark's Kafka source (`schema="spark"`, the
default):

    key binary, value binary, topic string, partition int32, offset int64,
    timestamp timestamp[ms, UTC], timestampType int32, headers list<struct<key string, value binary>>

or, with `schema="ray"`, those of Ray's `read_kafka` (RAY_SCHEMA, the schema it declares),
converted by renames and casts, keys, values and headers not copied:

    offset int64, key binary, value binary, topic string, partition int32,
    timestamp int64 (ms), timestamp_type int32 (1 CreateTime, 2 LogAppendTime), headers map<string, binary>

The tasks' sizes on disk are the datasource's in-memory size estimate; their row counts
are left unknown (None), since a compacted partition holds fewer records than offsets and
Ray Data answers `count()` from known row counts without reading.

Placement: each read task runs on the node of its partition's leader (soft node affinity:
elsewhere if that node is gone), and fetches from it over the data plane. Ray Data (2.60)
gives every read task of a Dataset the same Ray options (a Read operator has one
`ray_remote_args`, and no hook per task), so the tasks are read per node, each read with
that node's affinity, and the reads joined with `union` (lazy: nothing runs until the
Dataset does). `ray_remote_args` (num_cpus, memory, resources, runtime_env, ...) go to
every read task; a `scheduling_strategy` or `label_selector` there, or a `concurrency`
(the most read tasks at a time, which would count per node), makes it one read placed by
Ray Data instead.

`stream_topic(topic, group_id)` reads the topic as a stream of Datasets, one per
micro-batch of the records that arrived since the last one, each a TopicDatasource of
the batch's ranges (fixed when the batch is planned); the stream's progress is the
group's committed offsets (rayk.client.micro_batches), committed when the loop asks for
the next batch. With `exactly_once=True`, `stream.write_topic(ds, topic)` in the loop
writes a batch's output in one transaction with its offsets
(rayk.client.batch_transactions).

`TopicDatasink(topic)` produces a Dataset's rows to a topic, `ds.write_datasink(sink)`,
after which `sink.written` is the number of records written; `write_topic(ds, topic)`
does both. Each write task produces its blocks with one idempotent Producer (columns
`value`, and optionally `key`, `partition`, `headers`, `timestamp`), one
`Producer.send_batch` per block (the Arrow columns are encoded as record batches with no
Python object per row), flushes, and fails if any record was not acknowledged, which
fails the whole write. A task that Ray retries (its worker died) writes nothing twice:
it resumes after what the attempt before wrote (rayk.client.resumable_write). Small
blocks are bundled into write tasks of at least ROWS_PER_WRITE_TASK rows (the sink's
`min_rows_per_write`): each task pays for a Producer of its own, and `from_items` of 200
rows is 200 blocks: written one task per block, they took 7.8 s instead of 0.45 s.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask
from ray.util.annotations import RayDeprecationWarning
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayk.client import calls
from rayk.client.arrow_batches import SCHEMA, records_table
from rayk.client.data_plane import DataPlaneSession
from rayk.client.batch_transactions import DEFAULT_TRANSACTION_TIMEOUT_MS
from rayk.client.metadata import MetadataCache
from rayk.client.micro_batches import MicroBatches
from rayk.client.offset_ranges import OffsetRange, OffsetSpec, log_sizes, plan_read_ranges, split_for_tasks
from rayk.client.remote_slices import RemotePlanner, RemoteSlice
from rayk.client.resumable_write import reserve_task_producer_ids, write_task
from rayk.dataplane.frames import READ_COMMITTED, READ_UNCOMMITTED, FetchRequest
from rayk.errors import InvalidConfigurationError, InvalidTxnStateError, KafkaError, KafkaTimeoutError
from rayk.storage.read_committed import committed_batches
from rayk.storage.records import end_offset_of

ROWS_PER_WRITE_TASK = 10_000
FETCH_MAX_BYTES = 8 * 1024 * 1024
RECORDS_PER_TASK = 1_000_000
BYTES_PER_TASK = 64 << 20  # a read task's block: Ray Data's blocks go up to 128 MiB, Spark's splits 128 MiB
READ_RETRY_BACKOFF_MS = 100
READ_RETRY_TIMEOUT_MS = 60_000

# The columns of ray.data.read_kafka: the schema it declares (KAFKA_MSG_SCHEMA in
# ray/data/_internal/datasource/kafka_datasource.py, Ray 2.60).
RAY_SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("timestamp", pa.int64()),  # ms
        ("timestamp_type", pa.int32()),  # confluent-kafka's: 1 CreateTime, 2 LogAppendTime
        ("headers", pa.map_(pa.string(), pa.binary())),
    ]
)
SCHEMAS = {"spark": SCHEMA, "ray": RAY_SCHEMA}
# The Ray options that ray.data.read_datasource takes as parameters of their own (2.60
# deprecates passing them in its ray_remote_args).
NAMED_REMOTE_ARGS = ("num_cpus", "num_gpus", "memory", "label_selector", "fallback_strategy", "max_calls", "resources",
                     "accelerator_type", "runtime_env")  # fmt: skip
# The others, the soft affinity to a leader's node above all (`scheduling_strategy`, with
# Ray's spill when that node is busy: `leader_node_affinity`), have no parameter of their
# own in Ray 2.60, so rayk passes them in ray_remote_args. Ray warns of that at every
# multi-node read, naming rayk's call: nothing a user did or can change, so not shown.
# (Ray 2.64 drops ray_remote_args; its removal fails test_cluster_failover's read.)
warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated", category=RayDeprecationWarning,
                        module=r"rayk\.data$")


def cluster_or_connect(cluster: Any) -> Any:
    if cluster is not None:
        return cluster
    import rayk

    return rayk.connect()


# ---------------------------------------------------------------------------- reading


def read_range(cluster: Any, r: OffsetRange | RemoteSlice, fetch_max_bytes: int = FETCH_MAX_BYTES) -> pa.Table:
    """The records of one offset range as an Arrow table of SCHEMA (in this process),
    fetched from the partition's leader over the data plane, or for a tiered topic's
    remote slice from the store with no broker involved, and decoded by compiled code
    (arrow_batches)."""
    if isinstance(r, RemoteSlice):
        return records_table(r.read(), r.topic, r.partition, r.start, r.end)
    tables = list(iter_range(cluster, r, fetch_max_bytes))
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


def iter_range(cluster: Any, r: OffsetRange, fetch_max_bytes: int = FETCH_MAX_BYTES) -> Iterator[pa.Table]:
    """The records of one offset range as Arrow tables of SCHEMA, a table per fetch of up
    to `fetch_max_bytes`, in offset order, as read_range reads them. The next fetch is sent
    before a table is decoded and handed out, so the leader reads and sends it while this
    process decodes and the caller uses the table (a Spark task's writes to its JVM)."""
    metadata = MetadataCache(cluster.controller)
    data_plane = DataPlaneSession(f"read of {r.topic}-{r.partition}")
    try:
        yield from _fetched_tables(metadata, data_plane, r, fetch_max_bytes)
    finally:
        data_plane.close()


def _fetched_tables(
    metadata: MetadataCache, data_plane: DataPlaneSession, r: OffsetRange, fetch_max_bytes: int
) -> Iterator[pa.Table]:
    isolation = READ_COMMITTED if r.read_committed else READ_UNCOMMITTED

    def fetch_at(offset: int, leader: Any) -> Any:
        request = FetchRequest(offset, fetch_max_bytes, min_bytes=1, max_wait_ms=0, isolation_level=isolation)
        return data_plane.fetch(leader, request)

    offset = r.start
    ahead: tuple[int, Any] | None = None  # (offset, answer) of the fetch sent one ahead
    deadline = time.monotonic() + READ_RETRY_TIMEOUT_MS / 1000
    while offset < r.end:
        try:
            leader = metadata.leader(r.topic, r.partition)
            answer = ahead[1] if ahead is not None and ahead[0] == offset else fetch_at(offset, leader)
            ahead = None
            result = calls.get(answer, deadline, f"fetch {r.topic}-{r.partition}")
            error = result.error
        except KafkaError as e:  # the leader moved, died or did not answer (by `deadline`)
            error = e
        if error is None:
            if result.records:
                next_offset = max(offset, min(end_offset_of(result.records), r.end))
                if next_offset < r.end:
                    ahead = (next_offset, fetch_at(next_offset, leader))
                kept = result.records
                if result.aborted_transactions:  # (read_committed) what aborted transactions wrote is dropped
                    kept = b"".join(batch.data for batch in committed_batches(kept, result.aborted_transactions))
                table = records_table(kept, r.topic, r.partition, offset, r.end)
                offset = next_offset
                if table.num_rows:
                    yield table
                # From here: the caller's time with the table is not the next fetch's.
                deadline = time.monotonic() + READ_RETRY_TIMEOUT_MS / 1000
                continue
        elif isinstance(error, KafkaError) and not error.retriable:
            raise error
        if time.monotonic() > deadline:  # a leader gone for good, or a log truncated below `end`
            raise KafkaTimeoutError(f"{r.topic}-{r.partition}: stuck at offset {offset} of [{r.start}, {r.end}): {error}")
        metadata.invalidate(r.topic)
        time.sleep(READ_RETRY_BACKOFF_MS / 1000)


def ray_columns(table: pa.Table) -> pa.Table:
    """A table of SCHEMA in the columns of Ray's read_kafka (RAY_SCHEMA), by renames and
    casts: keys, values and headers are not copied (a record's headers become its map's
    entries, in order, a repeated key repeated as Kafka keeps it)."""
    headers = [pa.MapArray.from_arrays(lists.offsets, *lists.values.flatten()) for lists in table.column("headers").chunks]
    return pa.table(
        [
            table.column("offset"),
            table.column("key"),
            table.column("value"),
            table.column("topic"),
            table.column("partition"),
            table.column("timestamp").cast(pa.int64()),
            pc.add(table.column("timestampType"), pa.scalar(1, pa.int32())),  # Kafka's 0 CreateTime is confluent's 1
            pa.chunked_array(headers, RAY_SCHEMA.field("headers").type),
        ],
        schema=RAY_SCHEMA,
    )


def _read_function(cluster: Any, ranges: list[OffsetRange], fetch_max_bytes: int,
                  schema: str) -> Callable[[], Iterator[pa.Table]]:  # fmt: skip
    """A ReadTask's read function: it yields a table per range (Ray Data joins small ones
    into one block), an empty one if there is no range."""
    convert = ray_columns if schema == "ray" else (lambda table: table)

    def read_topic_ranges() -> Iterator[pa.Table]:
        if not ranges:
            yield convert(SCHEMA.empty_table())
        for r in ranges:
            yield convert(read_range(cluster, r, fetch_max_bytes))

    return read_topic_ranges


class TopicDatasource(Datasource):
    """A topic's records in the offset ranges planned when it is made, as Ray Data reads
    them: a ReadTask per planned task (`tasks`; see the module docstring). `read_topic`
    makes one and documents the arguments (`num_blocks` is its `override_num_blocks`).
    Read one yourself with `ray.data.read_datasource(source,
    override_num_blocks=len(source.tasks))`: without that Ray Data picks a parallelism of
    its own and cuts each task's table into that many blocks. `cluster` defaults to
    `rayk.connect()`."""

    def __init__(
        self,
        topic: str,
        starting_offsets: OffsetSpec = "earliest",
        ending_offsets: OffsetSpec = "latest",
        *,
        starting_timestamp: int | None = None,
        cluster: Any = None,
        records_per_task: int = RECORDS_PER_TASK,
        bytes_per_task: int = BYTES_PER_TASK,
        fetch_max_bytes: int = FETCH_MAX_BYTES,
        schema: str = "spark",
        num_blocks: int | None = None,
        isolation_level: str = "read_uncommitted",
        from_store: bool = True,
    ) -> None:
        _check_read_settings(fetch_max_bytes, schema, num_blocks)
        cluster = cluster_or_connect(cluster)
        ranges = plan_read_ranges(
            cluster, topic, starting_offsets, ending_offsets, starting_timestamp, records_per_task, bytes_per_task,
            isolation_level,
        )
        self._setup(cluster, ranges, fetch_max_bytes, schema, num_blocks, from_store)

    @classmethod
    def of_ranges(cls, cluster: Any, ranges: list[OffsetRange], *, fetch_max_bytes: int = FETCH_MAX_BYTES,
                  schema: str = "spark", num_blocks: int | None = None) -> TopicDatasource:  # fmt: skip
        """A datasource of ranges planned already (a stream's micro-batch, split for tasks)."""
        _check_read_settings(fetch_max_bytes, schema, num_blocks)
        source = cls.__new__(cls)
        source._setup(cluster, ranges, fetch_max_bytes, schema, num_blocks)
        return source

    def _setup(self, cluster: Any, ranges: list[OffsetRange], fetch_max_bytes: int, schema: str,
               num_blocks: int | None, from_store: bool = True) -> None:  # fmt: skip
        super().__init__()
        self._cluster, self._fetch_max_bytes, self._schema = cluster, fetch_max_bytes, schema
        tasks: list[list[Any]] = (cut_into_tasks(ranges, num_blocks) if num_blocks else [[r] for r in ranges]) or [[]]
        planner = RemotePlanner.for_topic(cluster, ranges[0].topic) if ranges and from_store else None
        self.tasks = tasks if planner is None else planner.split_tasks(tasks)  # tiered: history from the store
        self._bytes_per_record = _bytes_per_record(cluster, ranges)

    @property
    def output_schema(self) -> pa.Schema:
        return SCHEMAS[self._schema]

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:  # fmt: skip
        """A ReadTask per planned task, whatever `parallelism`: the tasks were fixed when the
        read was planned."""
        return [
            ReadTask(
                _read_function(self._cluster, ranges, self._fetch_max_bytes, self._schema),
                BlockMetadata(num_rows=None if ranges else 0, size_bytes=self._size_bytes(ranges), exec_stats=None),
                schema=self.output_schema,
                per_task_row_limit=per_task_row_limit,
            )
            for ranges in self.tasks
        ]

    def estimate_inmemory_data_size(self) -> int | None:
        """The size of the planned ranges on disk (None if a leader could not say)."""
        sizes = [self._size_bytes(ranges) for ranges in self.tasks]
        return None if None in sizes else sum(sizes)

    def _size_bytes(self, ranges: list[OffsetRange]) -> int | None:
        if self._bytes_per_record is None:
            return None
        return round(sum(r.size * self._bytes_per_record[r.partition] for r in ranges))

    def by_leader_node(self) -> list[tuple[dict[str, Any], TopicDatasource]]:
        """The tasks grouped by where they should run: (Ray options, a datasource of those
        tasks) per node that leads the largest range of a task, with soft affinity to that
        node. One group without options on a one-node cluster, and for tasks whose leader's
        node is not known."""
        if len(self.tasks) < 2 or sum(node["Alive"] for node in ray.nodes()) < 2:
            return [({}, self)]
        on_leader = leader_node_affinity(self._cluster)
        groups: dict[str | None, tuple[dict[str, Any], list[list[OffsetRange]]]] = {}
        for ranges in self.tasks:
            options = on_leader(max(ranges, key=lambda r: r.size)) if ranges else {}
            node_id = options["scheduling_strategy"].node_id if options else None
            groups.setdefault(node_id, (options, []))[1].append(ranges)
        return [(options, self._of_tasks(tasks)) for options, tasks in groups.values()]

    def _of_tasks(self, tasks: list[list[OffsetRange]]) -> TopicDatasource:
        """This datasource with only `tasks` (some of its own)."""
        part = copy.copy(self)
        part.tasks = tasks
        return part


def cut_into_tasks(ranges: list[OffsetRange], tasks: int) -> list[list[OffsetRange]]:
    """The offsets of `ranges`, in order, cut into `tasks` runs of (nearly) equal length
    (fewer if there are fewer offsets): each run the pieces of the ranges it covers."""
    total = sum(r.size for r in ranges)
    runs: dict[int, list[OffsetRange]] = {}
    position = 0  # of the next offset, counted through all the ranges
    for r in ranges:
        start = r.start
        while start < r.end:
            run = position * tasks // total
            next_run_position = -(-(run + 1) * total // tasks)
            end = min(r.end, start + next_run_position - position)
            runs.setdefault(run, []).append(dataclasses.replace(r, start=start, end=end))  # read_committed kept
            position += end - start
            start = end
    return list(runs.values())


def _bytes_per_record(cluster: Any, ranges: list[OffsetRange]) -> dict[int, float] | None:
    """Per partition of `ranges`, the average size of its records on disk (its leader's
    log bytes over its offsets); None if a leader cannot say."""
    partitions = list({r.partition: r for r in ranges}.values())
    sizes = log_sizes(cluster, partitions) if partitions else []
    if sizes is None:
        return None
    return {r.partition: size / max(1, end - start) for r, (start, end, size) in zip(partitions, sizes)}


def _check_read_settings(fetch_max_bytes: int, schema: str, num_blocks: int | None) -> None:
    if fetch_max_bytes < 1:
        raise InvalidConfigurationError("fetch_max_bytes must be >= 1")
    if schema not in SCHEMAS:
        raise InvalidConfigurationError(f"schema must be one of {', '.join(map(repr, SCHEMAS))}, got {schema!r}")
    if num_blocks is not None and not _is_count(num_blocks):
        raise InvalidConfigurationError(f"override_num_blocks must be an int >= 1 or None, got {num_blocks!r}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


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
    schema: str = "spark",
    override_num_blocks: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
    concurrency: int | None = None,
    isolation_level: str = "read_uncommitted",
    from_store: bool = True,
) -> ray.data.Dataset:
    """A lazy Dataset of the topic's records in the given offsets, as of this call (see
    the module docstring). `schema` is "spark" (Spark's Kafka source's columns) or "ray"
    (Ray's read_kafka's); `override_num_blocks` the number of read tasks, instead of
    tasks of `records_per_task` records and about `bytes_per_task` bytes;
    `ray_remote_args` Ray options for every read task; `concurrency` the most read tasks
    at a time; `isolation_level` "read_committed" reads what committed transactions wrote
    (and records written outside transactions), up to the last stable offset, as Kafka's
    read_committed consumers. For a tiered topic (remote.storage.enable), the part of the
    range in remote storage is read by tasks straight from the store, one task per remote
    segment, with no broker involved (rayk.client.remote_slices); `from_store=False` reads
    it through the leaders instead (for tasks that cannot reach the store). `cluster`
    defaults to `rayk.connect()`."""
    _check_task_options(ray_remote_args, concurrency)
    source = TopicDatasource(
        topic, starting_offsets, ending_offsets, starting_timestamp=starting_timestamp, cluster=cluster,
        records_per_task=records_per_task, bytes_per_task=bytes_per_task, fetch_max_bytes=fetch_max_bytes,
        schema=schema, num_blocks=override_num_blocks, isolation_level=isolation_level, from_store=from_store,
    )  # fmt: skip
    return _dataset(source, ray_remote_args, concurrency)


def _check_task_options(ray_remote_args: dict[str, Any] | None, concurrency: int | None) -> None:
    if ray_remote_args is not None and not isinstance(ray_remote_args, dict):
        raise InvalidConfigurationError(f"ray_remote_args must be a dict of Ray task options, got {ray_remote_args!r}")
    if concurrency is not None and not _is_count(concurrency):
        raise InvalidConfigurationError(f"concurrency must be an int >= 1 or None, got {concurrency!r}")


def _dataset(source: TopicDatasource, ray_remote_args: dict[str, Any] | None = None,
             concurrency: int | None = None) -> ray.data.Dataset:  # fmt: skip
    """`source` as a Dataset of a block per task: Ray Data is given their number as the
    read's parallelism (left to pick one, it cuts each task's table into several blocks).
    Each task runs on the node of its leader (soft affinity): Ray Data 2.60 takes one set
    of options for all the tasks of a read, so the tasks are read per node and the reads
    joined (`union`, lazy as a read). Not when the caller places the tasks
    (`scheduling_strategy`, `label_selector`) or bounds their `concurrency`, which would
    then count per node."""
    remote_args = dict(ray_remote_args or {})
    named = {name: remote_args.pop(name) for name in NAMED_REMOTE_ARGS if name in remote_args}
    placed_by_caller = "scheduling_strategy" in remote_args or "label_selector" in remote_args
    parts = [({}, source)] if placed_by_caller or concurrency is not None else source.by_leader_node()
    reads = [
        ray.data.read_datasource(
            part, override_num_blocks=len(part.tasks), concurrency=concurrency,
            ray_remote_args={**remote_args, **options} or None, **named,
        )
        for options, part in parts
    ]  # fmt: skip
    return reads[0].union(*reads[1:]) if len(reads) > 1 else reads[0]


class TopicStream:
    """A topic's micro-batches as Datasets (`stream_topic`); iterate over it in a `with`
    block (or call `close()`: it holds a consumer). Asking for a batch's successor commits
    the batch (the loop body that processed it has returned); `stop()` ends the iteration
    at its next step, after committing the last batch, so call it and let the loop come
    round rather than `break`. Leaving the loop otherwise (`break`, an exception) commits
    nothing: the stream next started for the group hands that batch out again, with the
    same `batch_id`. A batch's Dataset is lazy (a TopicDatasource of its ranges): it reads
    when the loop body executes it, the same records however often.

    With `exactly_once=True`, `write_topic(ds, topic)` in the loop body writes to a rayk
    topic in the batch's transaction, which commits with the batch's offsets when the
    next batch is asked for, and is aborted if the loop is left otherwise
    (rayk.client.batch_transactions)."""

    def __init__(self, cluster: Any, topic: str, group_id: str, records_per_task: int, bytes_per_task: int,
                 fetch_max_bytes: int, schema: str = "spark", **batch_settings: Any) -> None:  # fmt: skip
        if records_per_task < 1 or bytes_per_task < 1 or fetch_max_bytes < 1:
            raise InvalidConfigurationError("records_per_task, bytes_per_task and fetch_max_bytes must be >= 1")
        _check_read_settings(fetch_max_bytes, schema, None)
        self._cluster = cluster
        self._task_size = (records_per_task, bytes_per_task)
        self._fetch_max_bytes, self._schema = fetch_max_bytes, schema
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
        parts = split_for_tasks(self._cluster, ranges, *self._task_size)
        return _dataset(
            TopicDatasource.of_ranges(self._cluster, parts, fetch_max_bytes=self._fetch_max_bytes, schema=self._schema)
        )

    def write_topic(self, ds: ray.data.Dataset, topic: str) -> int:
        """Writes `ds`'s rows (a `value` column; `key`, `partition`, `headers`,
        `timestamp` optional, as write_topic) to `topic`; returns how many. In an
        exactly_once stream they join the batch's transaction: its blocks come to this
        process and go out through the stream's transactional producer, and readers with
        read_committed see them once the batch commits. Otherwise it is `write_topic`."""
        transactions = self._batches.transactions
        if transactions is None:
            return write_topic(ds, topic, cluster=self._cluster)
        if self._handed_out is None:
            raise InvalidTxnStateError("write_topic writes a batch's output: call it in the loop body")
        self._cluster.describe_topic(topic)  # UNKNOWN_TOPIC_OR_PARTITION before anything is read
        return sum(transactions.write(topic, table) for table in ds.iter_batches(batch_format="pyarrow", batch_size=None))

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
    schema: str = "spark",
    isolation_level: str | None = None,
    exactly_once: bool = False,
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
) -> TopicStream:
    """The topic as a stream of Datasets, one per micro-batch: the records that arrived
    since the last one, planned every `trigger_ms`, with the group's committed offsets as
    the stream's progress (see TopicStream and rayk.client.micro_batches); `schema` and
    `isolation_level` as in read_topic (default read_uncommitted, or read_committed for
    an exactly_once stream)::

        with rayk.data.stream_topic("events", "etl") as stream:
            for ds in stream:
                ds.write_parquet(f"/out/{stream.batch_id}", mode="overwrite")  # a replay replaces

    With `exactly_once=True`, what the loop body writes with `stream.write_topic` and the
    batch's offsets are one transaction (at most `transaction_timeout_ms` long)::

        with rayk.data.stream_topic("events", "etl", exactly_once=True) as stream:
            for ds in stream:
                stream.write_topic(ds.map_batches(enrich), "enriched")
    """
    return TopicStream(
        cluster_or_connect(cluster), topic, group_id, records_per_task, bytes_per_task, fetch_max_bytes, schema,
        trigger_ms=trigger_ms, max_records_per_batch=max_records_per_batch,
        starting_offsets=starting_offsets, fail_on_data_loss=fail_on_data_loss, isolation_level=isolation_level,
        exactly_once=exactly_once, transaction_timeout_ms=transaction_timeout_ms,
    )  # fmt: skip


def leader_node_affinity(cluster: Any) -> Callable[[OffsetRange], dict[str, Any]]:
    """Task options that run the read of a range on the node of its partition's leader
    (soft: elsewhere when that node is gone, and when it has no CPU free: a read fetches
    over the data plane from anywhere, the leader's node only saves the copy across the
    network. Ray's soft affinity alone waits for the node's resources indefinitely, and
    a stream's reads then waited for good behind a worker lease Ray lost across a
    flapping link, which held that node's one CPU)."""
    nodes = {b["broker_id"]: b["node_id"] for b in cluster.brokers()}

    def options(r: OffsetRange) -> dict[str, Any]:
        node_id = nodes.get(r.leader)
        if not node_id:
            return {}
        # `_spill_on_unavailable` is Ray's (private, as Ray Serve uses it): spill when busy.
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=True, _spill_on_unavailable=True)}

    return options


# ---------------------------------------------------------------------------- writing


class TopicDatasink(ray.data.Datasink):
    """Produces a Dataset's rows to a topic: `ds.write_datasink(TopicDatasink("events"))`,
    after which `written` is the number of records written (see the module docstring).
    `cluster` defaults to `rayk.connect()`; `acks` and the other settings are the
    Producer's. UNKNOWN_TOPIC_OR_PARTITION here, before any task runs."""

    def __init__(self, topic: str, *, cluster: Any = None, acks: str | int = "all", **producer_settings: Any) -> None:
        self._cluster, self._topic = cluster_or_connect(cluster), topic
        self._cluster.describe_topic(topic)
        self._settings = {"acks": acks, **producer_settings}
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
    """Produces every row of `ds` to `topic` (a TopicDatasink); returns how many records
    were written. Raises if any record is not acknowledged. `cluster` defaults to
    `rayk.connect()`."""
    sink = TopicDatasink(topic, cluster=cluster, acks=acks, **producer_settings)
    ds.write_datasink(sink)
    return sink.written
