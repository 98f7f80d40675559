"""Spark on Ray (RayDP) and rayk topics: DataFrames in and out.

    spark = rayk.spark.session("clicks", executors=2)
    df = rayk.spark.read_topic(spark, "clicks")                  # Spark's Kafka source schema
    rayk.spark.write_topic(df.selectExpr("key", "upper(value) AS value"), "shouted")
    rayk.spark.stop()

`session` starts Spark on the current Ray cluster with what RayDP needs on Java 17 (the
`--add-opens` flags for driver, executors and RayDP's app master), with this
interpreter as the executors' Python, so Python UDFs find the same packages, and with
their Python workers forked from rayk.spark_daemon, which has imported pyarrow, Ray and
rayk already (Spark ends a worker idle for a minute; the next one then starts ~1 s sooner).

`read_topic` returns a DataFrame with the schema of Spark's own Kafka source (key binary,
value binary, topic string, partition int, offset long, timestamp timestamp, timestampType
int, headers array<struct<key string, value binary>>) over a snapshot of the topic: the
offsets are fixed when it is called (see rayk.client.offset_ranges). `write_topic` writes
a DataFrame with a `value` column (binary or string) and optional `key`, `partition`,
`headers`, `timestamp` columns, and raises if any record was not acknowledged.

Spark's own Kafka source and sink (`spark.read.format("kafka")`, `df.write.format("kafka")`,
`readStream` / `writeStream`) work against the brokers' Kafka listeners too: `session(...,
kafka_connector=True)` adds the `spark-sql-kafka-0-10` connector (Spark fetches it from
Maven Central with Ivy into ~/.ivy2 on first use), and `kafka_options(cluster, ...)` gives
the options that point it at the cluster:

    spark = rayk.spark.session("clicks", kafka_connector=True)
    df = spark.read.format("kafka").options(**rayk.spark.kafka_options(subscribe="clicks")).load()

`stream_topic` runs a function on each micro-batch of a topic, Structured Streaming's
foreachBatch shape (its Python source API needs Spark 4; RayDP pins 3.5): each batch is
a DataFrame of the records that arrived since the last one, and the stream's progress is
a consumer group's committed offsets, committed after the function returns (see
rayk.client.micro_batches). With `exactly_once=True` the function returns the DataFrame to
write to `sink_topic`, and each batch's output and offsets are one transaction
(rayk.client.batch_transactions).

Data moves between the Spark tasks and the partition actors directly: each Spark
task's Python worker connects to Ray once (Spark reuses its Python workers) and fetches
its offset range from the leader replica, a fetch at a time with the next one on its
way, decoded straight into Arrow batches that go to Spark whole (mapInArrow), or
produces its rows with a Producer (Spark's Arrow batches go to `Producer.send_batch`
whole). Neither direction makes a Python object per row. In
benchmarks/spark_bench.py this read path was 1.6-1.75x as fast as going through a Ray
Dataset and RayDP's `to_spark` (the other way to do it), and the write path 1.4x as fast
as `ray.data.from_spark` + a Ray Data sink.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray

from rayk import data as rayk_data
from rayk.child_stderr import filtered_stderr
from rayk.ray_settings import ray_system_config_in_env
from rayk.client.batch_transactions import DEFAULT_TRANSACTION_TIMEOUT_MS
from rayk.client.micro_batches import MicroBatches
from rayk.client.offset_ranges import OffsetRange, OffsetSpec, plan_read_ranges, split_for_tasks
from rayk.client.remote_slices import RemotePlanner, RemoteSlice
from rayk.client.resumable_write import reserve_task_producer_ids, write_task
from rayk.errors import InvalidConfigurationError
from rayk.spark_daemon import holds_no_python

# PySpark and RayDP come with rayk's `spark` extra, not with rayk itself (the broker, the
# Python client and rayk.data never load them). Looked up, not imported: this module
# imports them where it uses them.
_MISSING = [name for name in ("pyspark", "raydp") if importlib.util.find_spec(name) is None]
if _MISSING:
    raise ImportError(
        f"rayk.spark needs {' and '.join(_MISSING)}, which rayk installs with its `spark` extra: "
        "pip install 'rayk[spark]'",
        name=_MISSING[0],
    )

logger = logging.getLogger(__name__)

JAVA_17_OPENS = (
    "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio",
    "java.math", "java.text", "java.util", "java.util.concurrent", "java.util.concurrent.atomic",
    "jdk.internal.ref", "sun.nio.ch", "sun.nio.cs", "sun.security.action", "sun.util.calendar",
)  # fmt: skip
LOG4J2_CONFIG = Path(__file__).with_name("spark_log4j2.properties")  # errors only, on stderr
JAVA_17_OPTIONS = " ".join(
    [f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in JAVA_17_OPENS]
    + ["-Djdk.reflect.useDirectMethodHandle=false", "-Dio.netty.tryReflectionSetAccessible=true"]
)
LOG_OPTIONS = f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}"
JAVA_OPTION_KEYS = (
    "spark.driver.extraJavaOptions",
    "spark.executor.extraJavaOptions",
    "spark.ray.raydp_app_master.extraJavaOptions",
)


# Spark's Kafka connector for the pinned pyspark (3.5.7, Scala 2.12). It brings kafka-clients
# 3.4.1 and commons-pool2; the other jars it depends on ship with pyspark in the same versions,
# so Ivy neither fetches them (hadoop-client-api and -runtime alone are 48 MB, which every
# executor would copy from the driver) nor puts a second copy on the classpath.
KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.7"
KAFKA_CONNECTOR_EXCLUDES = (
    "org.apache.hadoop:hadoop-client-api", "org.apache.hadoop:hadoop-client-runtime",
    "org.xerial.snappy:snappy-java", "org.lz4:lz4-java", "org.slf4j:slf4j-api",
    "com.google.code.findbugs:jsr305", "commons-logging:commons-logging",
)  # fmt: skip


def _append_list(configs: dict[str, str], key: str, items: tuple[str, ...] | list[str]) -> None:
    """Adds items to a comma-separated Spark config list, after what the caller gave."""
    given = [x for x in configs.get(key, "").split(",") if x.strip()]
    configs[key] = ",".join(given + [x for x in items if x not in given])


def session_configs(configs: dict[str, str] | None = None, kafka_connector: bool = False) -> dict[str, str]:
    """RayDP's Spark configs with the Java 17 flags, this interpreter as executor Python
    and rayk's Python daemon; Java options the caller gives are kept, after rayk's. With
    `kafka_connector`, Spark's Kafka connector is added to `spark.jars.packages` (and what
    pyspark ships already to `spark.jars.excludes`)."""
    out = {
        # RayDP passes these to its JVMs as -Dlog4j2.configurationFile, after our options.
        "spark.ray.log4j.config.file.name": str(LOG4J2_CONFIG),
        "spark.log4j.config.file.name": str(LOG4J2_CONFIG),
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        # Python workers forked with rayk's imports done (rayk/spark_daemon.py).
        "spark.python.daemon.module": "rayk.spark_daemon",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
    }
    out.update(configs or {})
    for key in JAVA_OPTION_KEYS:
        out[key] = f"{JAVA_17_OPTIONS} {LOG_OPTIONS} {out.get(key, '')}".strip()
    if kafka_connector:
        _append_list(out, "spark.jars.packages", [KAFKA_CONNECTOR])
        _append_list(out, "spark.jars.excludes", KAFKA_CONNECTOR_EXCLUDES)
    return out


def session(
    app_name: str = "rayk",
    executors: int = 1,
    executor_cores: int = 1,
    executor_memory: str = "1g",
    configs: dict[str, str] | None = None,
    *,
    kafka_connector: bool = False,
) -> Any:
    """Starts Spark on Ray (raydp.init_spark) ready for Java 17; returns the SparkSession.
    Connects to Ray first (`ray.init()`) if this process has not. `kafka_connector=True`
    adds Spark's own Kafka source and sink (`format("kafka")`, see `kafka_options`): Spark
    resolves the connector with Ivy when the session starts, from Maven Central the first
    time (into ~/.ivy2; the executors get the jars from the driver)."""
    import raydp

    if not ray.is_initialized():
        with ray_system_config_in_env():  # a Ray started here runs brokers at a server's priority
            ray.init()
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' Python workers
    # The driver JVM's Ray core library logs INFO lines ("GcsClient has no Cluster ID set")
    # to the terminal unless told otherwise; warnings and errors still show. Only while it
    # starts: left in this process's environment, the variable made every Ray process it
    # started later (a `rayk` command, say) print Ray's "Set ray log level" notice.
    quieted = "RAY_BACKEND_LOG_LEVEL" not in os.environ
    if quieted:
        os.environ["RAY_BACKEND_LOG_LEVEL"] = "warning"
    try:
        with filtered_stderr():  # the driver JVM starts here, and inherits the filter (child_stderr.py)
            spark = raydp.init_spark(
                app_name, executors, executor_cores, executor_memory,
                configs=session_configs(configs, kafka_connector=kafka_connector),
            )
    finally:
        if quieted:
            del os.environ["RAY_BACKEND_LOG_LEVEL"]
    _drop_java_only_includes(spark.sparkContext)
    return spark


def _drop_java_only_includes(sc: Any) -> None:
    """Takes the jars without Python in them off the files Spark's Python workers put on
    `sys.path` for every task. Spark lists the jars of `spark.jars.packages` (the Kafka
    connector's) there, and PySpark's worker calls `importlib.invalidate_caches()` before
    each task, on which Python 3.11's zip importers read their archive's whole directory
    again (rayk/spark_daemon.py drops Spark's own jar the same way)."""
    from pyspark import SparkFiles

    root = Path(SparkFiles.getRootDirectory())
    sc._python_includes[:] = [name for name in sc._python_includes if not holds_no_python(str(root / name))]


def stop() -> None:
    """Stops the Spark session started by `session` (Ray keeps running)."""
    import raydp

    raydp.stop_spark()


def kafka_options(cluster: Any = None, **options: Any) -> dict[str, str]:
    """Options for Spark's Kafka source and sink (`format("kafka")`, in a session started
    with `kafka_connector=True`) against this cluster's Kafka listeners:
    `kafka.bootstrap.servers` and the given ones (`subscribe=...`, `topic=...`, ...; a
    dict for keys with dots, e.g. `**{"kafka.acks": "all"}`), as strings."""
    cluster = rayk_data.cluster_or_connect(cluster)
    servers = cluster.bootstrap_servers
    if not servers:
        raise InvalidConfigurationError("the cluster runs no Kafka listener (its `listeners` config is empty)")
    return {"kafka.bootstrap.servers": servers, **{k: _option(v) for k, v in options.items()}}


def _option(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def spark_schema() -> Any:
    """The StructType of Spark's Kafka source."""
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType,
    )  # fmt: skip

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )


def _worker_cluster(address: str, namespace: str) -> Any:
    """The rayk cluster, from inside a Spark executor's Python worker: it connects to Ray
    once (Spark reuses its Python workers) and calls the partition actors directly."""
    import rayk

    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # Ray 2.60 with an explicit address
        ray.init(address=address, namespace=namespace, log_to_driver=False)
    return rayk.connect(namespace=namespace)


def _ray_address() -> str:
    if not ray.is_initialized():
        with ray_system_config_in_env():
            ray.init()
    return ray.get_runtime_context().gcs_address


def read_topic(
    spark: Any,
    topic: str,
    starting_offsets: OffsetSpec = "earliest",
    ending_offsets: OffsetSpec = "latest",
    *,
    starting_timestamp: int | None = None,
    cluster: Any = None,
    records_per_task: int = rayk_data.RECORDS_PER_TASK,
    bytes_per_task: int = rayk_data.BYTES_PER_TASK,
    isolation_level: str = "read_uncommitted",
) -> Any:
    """The topic's records in the given bounds, as of now, as a DataFrame: one Spark
    partition per topic partition (split evenly into at most `records_per_task` records and
    about `bytes_per_task` bytes each, 64 MiB: a Spark split's size), each read by
    its Spark task straight from the partition's leader replica and handed to Spark as
    Arrow batches (mapInArrow): no Python object per row. `isolation_level`
    "read_committed" reads as Kafka's read_committed consumers (Spark's Kafka source's
    kafka.isolation.level): up to the last stable offset, without aborted transactions."""
    cluster = rayk_data.cluster_or_connect(cluster)
    ranges = plan_read_ranges(
        cluster, topic, starting_offsets, ending_offsets, starting_timestamp, records_per_task, bytes_per_task,
        isolation_level,
    )
    return _read_ranges(spark, cluster, ranges)


def _read_ranges(spark: Any, cluster: Any, ranges: list[OffsetRange]) -> Any:
    """A DataFrame of these ranges' records, a Spark partition per range, and for a tiered
    topic one per remote segment of a range, which its task reads straight from the store
    (rayk.client.remote_slices), as rayk.data's read tasks do."""
    schema = spark_schema()
    if not ranges:
        return spark.createDataFrame([], schema)
    planner = RemotePlanner.for_topic(cluster, ranges[0].topic)
    pieces: list[OffsetRange | RemoteSlice] = (
        list(ranges) if planner is None else [piece for r in ranges for piece in planner.split(r)])
    address, namespace = _ray_address(), cluster.namespace

    def read(range_ids: Any) -> Any:
        import pyarrow as pa

        worker_cluster = _worker_cluster(address, namespace)
        for ids in range_ids:
            for i in ids.column(0).to_pylist():
                # A table per fetch, so Spark takes one while the next is on its way.
                piece = pieces[i]
                tables = [rayk_data.read_range(worker_cluster, piece)] if isinstance(piece, RemoteSlice) else \
                    rayk_data.iter_range(worker_cluster, piece)
                for table in tables:
                    # Spark's TimestampType travels as microseconds in Arrow.
                    stamps = table.column("timestamp").cast(pa.timestamp("us", tz="UTC"))
                    yield from table.set_column(5, "timestamp", stamps).to_batches()

    return spark.range(0, len(pieces), 1, len(pieces)).mapInArrow(read, schema)


def write_topic(df: Any, topic: str, acks: str | int = "all", *, cluster: Any = None, **producer_settings: Any) -> int:
    """Produces every row of `df` to `topic` from the Spark tasks (one Producer per task,
    Spark's Arrow batches handed to `Producer.send_batch` as they are, via mapInArrow);
    returns how many records were written. Fails the job if any record is not acknowledged.

    A task that Spark retries writes nothing twice: every attempt of a task writes as the
    same producer id and resumes after the records the attempts before it wrote
    (rayk.client.resumable_write). That needs `df` to be deterministic, as Spark's own
    retries do: each attempt of a task gets the same rows in the same order."""
    columns = set(df.columns)
    if "value" not in columns:
        raise InvalidConfigurationError(f"write_topic needs a 'value' column; the DataFrame has {df.columns}")
    cluster = rayk_data.cluster_or_connect(cluster)
    cluster.describe_topic(topic)  # UNKNOWN_TOPIC_OR_PARTITION before any task runs
    address, namespace = _ray_address(), cluster.namespace
    wanted = [c for c in ("key", "value", "partition", "headers", "timestamp") if c in columns]
    settings = {"acks": acks, **producer_settings}
    first_producer_id = reserve_task_producer_ids(cluster)

    def write(batches: Any) -> Any:
        import pyarrow as pa
        from pyspark import TaskContext

        tables = (pa.Table.from_batches([batch]) for batch in batches)
        task_index = TaskContext.get().partitionId()  # the same in every attempt of the task
        written = write_task(_worker_cluster(address, namespace), topic, tables, settings, first_producer_id, task_index)
        yield pa.RecordBatch.from_pydict({"written": pa.array([written], pa.int64())})

    # One row per task, summed here: a sum in Spark would add a shuffle and a second stage.
    return sum(row.written for row in df.select(*wanted).mapInArrow(write, "written long").collect())


class TopicStreamQuery:
    """A running `stream_topic` (the part of Spark's StreamingQuery that applies): its
    micro-batches run one after the other on a thread of their own."""

    def __init__(self, spark: Any, cluster: Any, batches: MicroBatches, process_batch: Callable[[Any, int], Any],
                 task_size: tuple[int, int], sink_topic: str | None = None) -> None:  # fmt: skip
        self._spark, self._cluster, self._batches = spark, cluster, batches
        self._process_batch, self._task_size, self._sink_topic = process_batch, task_size, sink_topic
        self._error: BaseException | None = None
        self.last_progress: dict[str, Any] | None = None
        self._thread = threading.Thread(target=self._run, name=f"rayk-stream-{batches.group_id}-{batches.topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (ranges := self._batches.next_batch()) is not None:
                batch_id, started_s = self._batches.batch_id, time.monotonic()
                parts = split_for_tasks(self._cluster, ranges, *self._task_size)
                output = self._process_batch(_read_ranges(self._spark, self._cluster, parts), batch_id)
                if self._batches.transactions is not None:
                    self._write_in_transaction(output, batch_id)
                self._batches.commit(ranges)
                self.last_progress = {
                    "batch_id": batch_id,
                    "num_input_rows": sum(r.size for r in ranges),
                    "duration_ms": int((time.monotonic() - started_s) * 1000),
                    "end_offsets": {r.partition: r.end for r in ranges},
                }
        except BaseException as e:  # process_batch's or the stream's own: the stream stops, uncommitted
            logger.exception("stream %s/%s stopped", self._batches.group_id, self._batches.topic)
            self._error = e
        finally:
            self._batches.close()

    def _write_in_transaction(self, output: Any, batch_id: int) -> None:
        """An exactly_once batch's output (what process_batch returned, None for nothing)
        to the sink topic in the batch's transaction: collected here as Arrow batches and
        sent by the stream's transactional producer."""
        if output is None:
            return
        if not hasattr(output, "_collect_as_arrow"):
            raise InvalidConfigurationError(
                f"an exactly_once stream's process_batch returns the DataFrame to write (or None); batch {batch_id} "
                f"returned {type(output).__name__}"
            )
        if "value" not in output.columns:
            raise InvalidConfigurationError(f"the DataFrame to write needs a 'value' column; it has {output.columns}")
        wanted = [c for c in ("key", "value", "partition", "headers", "timestamp") if c in output.columns]
        transactions = self._batches.transactions
        assert transactions is not None and self._sink_topic is not None
        # _collect_as_arrow is what toPandas uses in pyspark 3.5 (Spark 4's public toArrow).
        for batch in output.select(*wanted)._collect_as_arrow():
            transactions.write(self._sink_topic, pa.Table.from_batches([batch]))

    @property
    def is_active(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stops the stream: a batch being processed finishes and is committed, no new one
        starts. Waits up to `timeout_s` (None: as long as it takes) for it to end."""
        self._batches.stop()
        if threading.current_thread() is not self._thread:  # else called by process_batch: it ends after it
            self._thread.join(timeout_s)

    def exception(self) -> BaseException | None:
        """What stopped the stream, if anything raised (process_batch's exception)."""
        return self._error

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Waits for the stream to end; True if it has. Raises what stopped it, if
        anything raised (Spark's awaitTermination)."""
        self._thread.join(timeout_s)
        if self._error is not None:
            raise self._error
        return not self._thread.is_alive()


def stream_topic(
    spark: Any,
    topic: str,
    group_id: str,
    process_batch: Callable[[Any, int], Any],
    trigger_ms: int = 1000,
    max_records_per_batch: int | None = None,
    *,
    starting_offsets: OffsetSpec = "latest",
    fail_on_data_loss: bool = True,
    cluster: Any = None,
    records_per_task: int = rayk_data.RECORDS_PER_TASK,
    bytes_per_task: int = rayk_data.BYTES_PER_TASK,
    isolation_level: str | None = None,
    exactly_once: bool = False,
    sink_topic: str | None = None,
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
) -> TopicStreamQuery:
    """Runs `process_batch(df, batch_id)` on each micro-batch of `topic` (Structured
    Streaming's foreachBatch shape): `df` holds the records that arrived since the last
    batch, with Spark's Kafka schema, planned every `trigger_ms`. The group's offsets are
    committed after `process_batch` returns; if it raises, the stream stops without
    committing, and the next stream of the group hands the same batch out again, with the
    same `batch_id` (see rayk.client.micro_batches); `isolation_level` as in read_topic
    (default read_uncommitted; read_committed for an exactly_once stream). Returns at
    once; the query's `stop()` ends the stream.

    With `exactly_once=True`, `process_batch` returns the DataFrame to write to
    `sink_topic` (a `value` column; `key`, `partition`, `headers`, `timestamp`
    optional), or None: it is written through the stream's transactional producer, in
    one transaction with the batch's offsets (rayk.client.batch_transactions), so that
    read_committed readers of the sink see each input record's output once, across
    failures of the stream, its driver and the brokers."""
    cluster = rayk_data.cluster_or_connect(cluster)
    if records_per_task < 1 or bytes_per_task < 1:
        raise InvalidConfigurationError("records_per_task and bytes_per_task must be >= 1")
    if exactly_once != (sink_topic is not None):
        raise InvalidConfigurationError("an exactly_once stream needs a sink_topic, and only it takes one")
    if sink_topic is not None:
        cluster.describe_topic(sink_topic)  # UNKNOWN_TOPIC_OR_PARTITION before the stream starts
    batches = MicroBatches(
        cluster, topic, group_id, trigger_ms=trigger_ms, max_records_per_batch=max_records_per_batch,
        starting_offsets=starting_offsets, fail_on_data_loss=fail_on_data_loss, isolation_level=isolation_level,
        exactly_once=exactly_once, transaction_timeout_ms=transaction_timeout_ms,
    )  # fmt: skip
    return TopicStreamQuery(spark, cluster, batches, process_batch, (records_per_task, bytes_per_task), sink_topic)
