"""Spark on Ray (RayDP) reading and writing topics (rayk.spark)."""

from __future__ import annotations

import datetime
import importlib.util
import itertools
import os
import signal
import threading
import time
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

import rayk
from rayk import spark as rayk_spark
from rayk.errors import InvalidConfigurationError, RecordTooLargeError
from rayk.spark_daemon import FIRST_TASK_MODULES, holds_no_python
from tests import readme
from tests.cluster_helpers import FAST_CONFIG, pid_of, release_shared_local_ray, wait_until

LOG_LEVEL_SET_BY_THE_USER = "RAY_BACKEND_LOG_LEVEL" in os.environ  # before any session of this module
RUNS_ON = "own Ray"  # a Ray of its own: tests/conftest.py runs this module before those sharing the local one

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("delete_topics_after_test")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    release_shared_local_ray()  # a Ray of its own: what it starts dies with it
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    store = tmp_path_factory.mktemp("spark-remote-store")  # for the tiered topic's test
    config = {**FAST_CONFIG, "remote.log.storage.system.enable": True, "remote.log.storage.uri": f"file://{store}",
              "remote.log.manager.task.interval.ms": 300}  # fmt: skip
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("spark"), config=config, namespace="spark")
    yield c
    c.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def spark(cluster):
    # With Spark's own Kafka connector (format("kafka")): one session serves both paths.
    # A task is tried twice, not Spark's 4 times: the retry test needs one retry, and a
    # write that must fail (NOT_ENOUGH_REPLICAS) fails in half the time. A shuffle makes 2
    # partitions, not 200: the tests' aggregations are small, and there is one core.
    session = rayk_spark.session(
        "rayk-tests", executors=1, executor_cores=1, executor_memory="1g", kafka_connector=True,
        configs={"spark.task.maxFailures": "2", "spark.sql.shuffle.partitions": "2"},
    )
    yield session
    rayk_spark.stop()


_topics = itertools.count()


def new_topic(cluster, partitions=2, replication_factor=1) -> str:
    """RF 1 unless the test is about replication (each replica is a process to start)."""
    name = f"s{next(_topics)}"
    cluster.create_topic(name, num_partitions=partitions, replication_factor=replication_factor)
    return name


def test_the_dataframe_has_spark_kafka_source_schema_and_round_trips(cluster, spark):
    topic = new_topic(cluster)
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    source = spark.createDataFrame(
        [
            (b"k0", b"v0", 0, [("h", b"x")], when),
            (None, b"v1", 1, [], when),
            (b"k2", None, 1, [("a", None)], when),
        ],
        "key binary, value binary, partition int, headers array<struct<key string, value binary>>, timestamp timestamp",
    )
    assert rayk_spark.write_topic(source, topic, cluster=cluster) == 3
    df = rayk_spark.read_topic(spark, topic, cluster=cluster)
    assert df.schema == rayk_spark.spark_schema()
    rows = sorted(df.collect(), key=lambda r: (r.partition, r.offset))
    assert [(r.partition, r.offset) for r in rows] == [(0, 0), (1, 0), (1, 1)]
    assert {(r.key and bytes(r.key), r.value and bytes(r.value)) for r in rows} == {
        (b"k0", b"v0"), (None, b"v1"), (b"k2", None),
    }
    assert {r.topic for r in rows} == {topic} and {r.timestampType for r in rows} == {0}
    assert {r.timestamp.replace(tzinfo=datetime.timezone.utc) for r in rows} == {when}
    by_key = {r.key and bytes(r.key): [(h.key, h.value and bytes(h.value)) for h in r.headers] for r in rows}
    assert by_key == {b"k0": [("h", b"x")], None: [], b"k2": [("a", None)]}


def test_the_session_leaves_ray_s_log_level_out_of_this_process_s_environment(spark):
    """Set only while the driver JVM starts (rayk.spark.session): left behind, it made every
    Ray process started later from this one (a `rayk` command) print Ray's notice of it."""
    if LOG_LEVEL_SET_BY_THE_USER:
        pytest.skip("RAY_BACKEND_LOG_LEVEL is set in the environment the tests run in; the session keeps it")
    assert "RAY_BACKEND_LOG_LEVEL" not in os.environ


def test_python_workers_are_forked_from_rayk_s_daemon_with_its_imports_done(spark):
    """A worker Spark starts after ending an idle one (a minute) does not import pyarrow,
    Ray and rayk again on its first rayk task, nor what Ray's serializers and PySpark's
    Arrow types import on a first task; PySpark's `importlib.invalidate_caches()`
    before each task finds no zip importer of Spark's jar to read again, its `gc.collect()`
    after each skips what the daemon imported, and the task's socket acknowledges at once
    (rayk/spark_daemon.py)."""

    def probe(_):
        import gc
        import os
        import sys

        main = sys.modules["__main__"]
        jars = [entry for entry in [*sys.path, *sys.path_importer_cache] if ".jar" in entry]
        spark_set_one = ".jar" in os.environ.get("PYTHONPATH", "")
        frozen = gc.get_freeze_count() > 10_000  # the daemon's imports, out of every task's gc.collect()
        task_runner = sys.modules["pyspark.daemon"].worker.__qualname__
        # A module the daemon imported is frozen with its heap; one a worker imported is not.
        tracked = {id(o) for o in gc.get_objects()}
        imported_here = [m for m in ("pyarrow", "ray", "rayk.spark", *FIRST_TASK_MODULES)
                         if m not in sys.modules or id(sys.modules[m]) in tracked]
        yield (getattr(main.__spec__, "name", None), imported_here, jars, spark_set_one, frozen, task_runner)

    found = set(map(repr, spark.sparkContext.parallelize([0, 1], 2).mapPartitions(probe).collect()))
    assert found == {repr(("rayk.spark_daemon", [], [], True, True, "_acking_at_once.<locals>.run"))}


def test_only_jars_without_python_are_taken_off_the_workers_path(tmp_path):
    def archive(name, *entries):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            for entry in entries:
                z.writestr(entry, b"")
        return str(path)

    assert holds_no_python(archive("connector.jar", "org/apache/A.class", "META-INF/MANIFEST.MF"))
    assert holds_no_python(archive("NATIVE.JAR", "linux/libzstd-jni.so"))  # zipimport loads no .so
    assert not holds_no_python(archive("with-python.jar", "org/A.class", "pkg/__init__.py"))
    assert not holds_no_python(archive("compiled.jar", "pkg/mod.pyc"))
    assert not holds_no_python(archive("deps.zip", "org/A.class"))  # only jars
    assert not holds_no_python(str(tmp_path / "missing.jar"))
    (tmp_path / "broken.jar").write_bytes(b"not a zip")
    assert not holds_no_python(str(tmp_path / "broken.jar"))


def test_offsets_timestamps_and_an_empty_topic(cluster, spark):
    topic = new_topic(cluster)
    rows = [(b"%d" % i, i % 2, datetime.datetime.fromtimestamp(1_000 + i, datetime.timezone.utc)) for i in range(40)]
    df = spark.createDataFrame(rows, "value binary, partition int, timestamp timestamp")
    rayk_spark.write_topic(df, topic, cluster=cluster)
    ranged = rayk_spark.read_topic(spark, topic, f'{{"{topic}":{{"0":5,"1":-2}}}}', f'{{"{topic}":{{"0":8,"1":2}}}}',
                                   cluster=cluster)
    assert sorted((r.partition, r.offset) for r in ranged.collect()) == [(0, 5), (0, 6), (0, 7), (1, 0), (1, 1)]
    late = rayk_spark.read_topic(spark, topic, starting_timestamp=(1_000 + 30) * 1000, cluster=cluster)
    assert sorted(int(r.value) for r in late.collect()) == list(range(30, 40))
    empty_topic = new_topic(cluster)
    assert rayk_spark.write_topic(spark.createDataFrame([], "value binary"), empty_topic, cluster=cluster) == 0
    empty = rayk_spark.read_topic(spark, empty_topic, cluster=cluster)
    assert empty.count() == 0 and empty.schema == rayk_spark.spark_schema()
    with pytest.raises(InvalidConfigurationError):
        rayk_spark.write_topic(spark.createDataFrame([(1,)], "payload int"), topic, cluster=cluster)


def test_a_read_committed_dataframe_leaves_out_aborted_and_open_transactions(cluster, spark):
    """isolation_level="read_committed" (the Kafka source's kafka.isolation.level): the
    DataFrame ends at the last stable offset and leaves out what aborted transactions
    wrote; read_uncommitted has all of it, control records never."""
    topic = new_topic(cluster, partitions=1)
    producer = cluster.producer(transactional_id=f"spark-{topic}")
    producer.init_transactions()
    for commit, values in ((True, [b"c0", b"c1"]), (False, [b"a0"]), (True, [b"c2"]), (None, [b"open"])):
        producer.begin_transaction()
        producer.send_batch(topic, values)
        producer.flush()
        if commit is True:
            producer.commit_transaction()
        elif commit is False:
            producer.abort_transaction()
    wait_until(lambda: cluster.describe_topic(topic)[0]["high_watermark"] == 8, 30, "the markers and the open record")

    def values(isolation_level: str) -> list[bytes]:
        df = rayk_spark.read_topic(spark, topic, cluster=cluster, isolation_level=isolation_level)
        return [bytes(r.value) for r in df.orderBy("offset").collect()]

    assert values("read_committed") == [b"c0", b"c1", b"c2"]
    assert values("read_uncommitted") == [b"c0", b"c1", b"a0", b"c2", b"open"]
    producer.abort_transaction()
    producer.close()


@pytest.mark.chaos  # ~20 s, in `make chaos`; make test keeps the same faults under Ray Data (test_data.py:
# a dead follower, writes that are not acknowledged), whose write path rayk.spark shares
def test_reads_and_writes_with_a_dead_follower_and_unacknowledged_writes_fail(cluster, spark):
    topic = new_topic(cluster, partitions=1, replication_factor=3)
    strict = new_topic(cluster, partitions=1, replication_factor=3)
    cluster.admin().alter_topic_configs(strict, {"min.insync.replicas": "3"})
    state = cluster.describe_topic(topic)[0]
    follower = next(b for b in state["replicas"] if b != state["leader"])
    ray.kill(cluster.broker(follower))
    try:
        wait_until(lambda: follower not in cluster.describe_topic(topic)[0]["isr"], 30, "the ISR to shrink")
        df = spark.createDataFrame([(b"%d" % i,) for i in range(30)], "value binary")
        assert rayk_spark.write_topic(df, topic, cluster=cluster) == 30
        assert sorted(int(r.value) for r in rayk_spark.read_topic(spark, topic, cluster=cluster).collect()) == list(
            range(30)
        )
        with pytest.raises(Exception, match="NOT_ENOUGH_REPLICAS"):  # the Spark job fails
            rayk_spark.write_topic(df, strict, cluster=cluster, delivery_timeout_ms=1500, request_timeout_ms=1000)
    finally:
        cluster.restart_broker(follower)


def test_a_stream_runs_micro_batches_through_spark_commits_after_each_and_stops_uncommitted_on_an_error(cluster, spark):
    source, sink = new_topic(cluster), new_topic(cluster, partitions=1)

    def produce(values):
        with cluster.producer(linger_ms=1) as producer:
            for i, value in enumerate(values):
                producer.send(source, value, partition=i % 2)

    def committed():
        with cluster.consumer(group_id="stream", enable_auto_commit=False) as consumer:
            return [consumer.committed((source, p)) for p in (0, 1)]

    batches = []

    def copy_to_sink(df, batch_id):
        assert df.schema == rayk_spark.spark_schema()
        batches.append((batch_id, sorted((r.partition, r.offset) for r in df.collect())))
        rayk_spark.write_topic(df.select("value"), sink, cluster=cluster)

    def processed():
        return sorted(o for _, offsets in batches for o in offsets)

    produce([b"a%d" % i for i in range(10)])
    query = rayk_spark.stream_topic(spark, source, "stream", copy_to_sink, trigger_ms=100, starting_offsets="earliest",
                                    cluster=cluster)  # fmt: skip
    def processed_now(count):
        assert query.exception() is None, query.exception()
        return len(processed()) == count

    wait_until(lambda: processed_now(10), 60, "the first micro-batch")
    produce([b"b%d" % i for i in range(4)])
    wait_until(lambda: processed_now(14), 60, "the records sent after the first batch")
    query.stop()
    assert not query.is_active and query.exception() is None
    assert [batch_id for batch_id, _ in batches] == list(range(len(batches)))
    assert processed() == [(p, o) for p in (0, 1) for o in range(7)], "each record once, in the batch after it came"
    assert committed() == [7, 7]
    assert sorted(r.value for r in rayk_spark.read_topic(spark, sink, cluster=cluster).collect()) == sorted(
        [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(4)]
    )

    failed_ids = []

    def fail(df, batch_id):
        failed_ids.append(batch_id)
        raise ValueError("the sink is down")

    produce([b"c%d" % i for i in range(3)])
    failing = rayk_spark.stream_topic(spark, source, "stream", fail, trigger_ms=100, cluster=cluster)
    with pytest.raises(ValueError, match="the sink is down"):
        failing.await_termination(60)
    assert not failing.is_active and isinstance(failing.exception(), ValueError)
    assert failed_ids == [len(batches)] and committed() == [7, 7], "a failed batch is not committed"

    restarted = rayk_spark.stream_topic(spark, source, "stream", copy_to_sink, trigger_ms=100, cluster=cluster)
    wait_until(lambda: len(processed()) == 17, 60, "the failed batch, processed again")
    restarted.stop()
    assert batches[-1] == (failed_ids[0], [(0, 7), (0, 8), (1, 7)]), "the failed batch again, under its id"
    assert committed() == [9, 8]


@pytest.mark.chaos  # ~24 s, in `make chaos`; make test keeps resumable writes (test_resumable_write) and a stream's commits
def test_a_stream_with_write_topic_as_sink_writes_no_record_twice_when_spark_retries_a_write_task(
    cluster, spark, tmp_path
):
    """Attempt 0 of one write task dies after its producer wrote part of the micro-batch;
    Spark runs the task again, and the retry resumes after what attempt 0 wrote."""
    source, sink = new_topic(cluster), new_topic(cluster)
    # 1 KB rows: between two Python workers Spark buffers 64 KiB on each side
    # (spark.buffer.size), so the write task sees its first rows ~4 batches of 50 later
    rows = [b"r%04d" % i + b"." * 1000 for i in range(2000)]
    with cluster.producer() as producer:
        producer.send_batch(source, rows, partition=[i % 2 for i in range(2000)])
    address, namespace = rayk_spark._ray_address(), cluster.namespace
    marker = tmp_path / "attempt-0-saw"

    def die_once_after_the_sink_has_records(batches):
        from pyspark import TaskContext

        task = TaskContext.get()
        for i, batch in enumerate(batches):
            yield batch
            if i == 12 and task.attemptNumber() == 0 and task.partitionId() == 0:
                worker_cluster = rayk_spark._worker_cluster(address, namespace)
                deadline = time.monotonic() + 30
                while (written := sum(d["high_watermark"] for d in worker_cluster.describe_topic(sink))) == 0:
                    assert time.monotonic() < deadline, "the write task wrote nothing"
                    time.sleep(0.05)
                marker.write_text(str(written))
                raise RuntimeError("the executor was lost")

    batch_ids = []

    def copy_to_sink(df, batch_id):
        batch_ids.append(batch_id)
        flaky = df.select("value").mapInArrow(die_once_after_the_sink_has_records, "value binary")
        assert rayk_spark.write_topic(flaky, sink, cluster=cluster) == 2000

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")  # the write sees batches before the failure
    try:
        query = rayk_spark.stream_topic(spark, source, "retried", copy_to_sink, trigger_ms=100,
                                        starting_offsets="earliest", cluster=cluster)  # fmt: skip
        wait_until(lambda: query.exception() is not None or query.last_progress is not None, 120, "the micro-batch")
        query.stop()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert query.exception() is None, query.exception()
    assert batch_ids == [0] and int(marker.read_text()) > 0, "attempt 0 had written records before it died"
    values = [r.value for r in rayk_spark.read_topic(spark, sink, cluster=cluster).collect()]
    assert sorted(values) == rows, "each record once"


# ------------------------------------------------------- Spark's own Kafka connector (format "kafka")

UTC = datetime.timezone.utc


def consume_all(cluster, topic, timeout_s=60):
    """Every record of the topic up to its high watermarks now, read by rayk's own
    consumer from the beginning, in (partition, offset) order."""
    ends = {p["partition"]: p["high_watermark"] for p in cluster.describe_topic(topic)}
    got = []
    with cluster.consumer(auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        consumer.assign([(topic, p) for p in ends])
        deadline = time.monotonic() + timeout_s
        while len(got) < sum(ends.values()):
            assert time.monotonic() < deadline, f"{len(got)} of {sum(ends.values())} records of {topic}"
            got += [r for records in consumer.poll(200).values() for r in records]
    return sorted(got, key=lambda r: (r.partition, r.offset))


@pytest.mark.chaos  # ~24 s, in `make chaos`; make test keeps exactly-once streams on Ray Data (test_data.py), whose transactions it shares
def test_an_exactly_once_stream_aborts_a_batch_whose_output_failed_midway_and_writes_each_record_once(cluster, spark):
    """exactly_once=True: process_batch returns the batch's output, written to sink_topic in
    one transaction with the batch's offsets. Here the first stream's output fails after
    part of it was written (a record too large): that batch is aborted, the stream stops
    uncommitted, and the next stream writes it again; read_committed readers see each
    output record once."""
    source, sink = new_topic(cluster), new_topic(cluster)
    inputs = [b"e%d" % i for i in range(12)]
    with cluster.producer() as producer:
        producer.send_batch(source, inputs, partition=[i % 2 for i in range(12)])
    settings = dict(trigger_ms=100, starting_offsets="earliest", cluster=cluster, exactly_once=True, sink_topic=sink)

    def too_large_in_partition_1(df, batch_id):  # partition 0's output goes first, then this fails
        return df.selectExpr("IF(partition = 1, CAST(repeat(CAST(value AS STRING), 1000000) AS BINARY), value) AS value")

    failing = rayk_spark.stream_topic(spark, source, "eos", too_large_in_partition_1, **settings)
    with pytest.raises(RecordTooLargeError):
        failing.await_termination(60)

    def values(isolation_level):
        df = rayk_spark.read_topic(spark, sink, cluster=cluster, isolation_level=isolation_level)
        return sorted(r.value for r in df.collect())

    assert values("read_committed") == [] and len(values("read_uncommitted")) == 6, "partition 0's output, aborted"
    query = rayk_spark.stream_topic(spark, source, "eos", lambda df, batch_id: df.select("key", "value"), **settings)
    wait_until(lambda: query.exception() is None and len(values("read_committed")) == 12, 60, "the batch written again")
    query.stop()
    assert values("read_committed") == sorted(inputs)
    with cluster.consumer(group_id="eos", enable_auto_commit=False) as consumer:
        assert [consumer.committed((source, p)) for p in (0, 1)] == [6, 6]
    with pytest.raises(InvalidConfigurationError, match="sink_topic"):
        rayk_spark.stream_topic(spark, source, "eos", lambda df, batch_id: None, cluster=cluster, exactly_once=True)
    wrong = rayk_spark.stream_topic(spark, source, "eos-wrong", lambda df, batch_id: 42, **settings)
    with pytest.raises(InvalidConfigurationError, match="returns the DataFrame"):
        wrong.await_termination(60)


def test_spark_kafka_source_reads_what_a_rayk_producer_wrote_in_json_offset_bounds(cluster, spark):
    topic = new_topic(cluster)
    sent = []
    with cluster.producer(acks="all") as producer:
        for i in range(12):
            key = None if i == 3 else b"k%d" % i
            headers = [("n", b"%d" % i), ("empty", None)] if i % 3 else []
            # Spark's source gives a record without headers null, not [] (rayk.spark.read_topic: [])
            sent.append((i % 2, key, b"v%d" % i, headers or None, 1_700_000_000_000 + i))
            producer.send(topic, b"v%d" % i, key=key, headers=headers, partition=i % 2, timestamp_ms=sent[-1][-1])
    df = (
        spark.read.format("kafka")
        .options(**rayk_spark.kafka_options(cluster, subscribe=topic, includeHeaders=True))
        .option("startingOffsets", f'{{"{topic}":{{"0":1,"1":-2}}}}')
        .option("endingOffsets", f'{{"{topic}":{{"0":5,"1":-1}}}}')
        .load()
    )
    assert df.schema == rayk_spark.spark_schema(), "Spark's Kafka schema, with headers"
    rows = sorted(df.collect(), key=lambda r: (r.partition, r.offset))
    # partition 0 holds sends 0, 2, 4, ... at offsets 0, 1, 2, ...; offsets 1-4 of it, and all of partition 1
    expected = [(p, o, *rest) for p in (0, 1) for o, (_, *rest) in enumerate(x for x in sent if x[0] == p)]
    expected = [e for e in expected if e[0] == 1 or 1 <= e[1] < 5]
    got = [
        (r.partition, r.offset, r.key and bytes(r.key), bytes(r.value),
         r.headers and [(h.key, h.value and bytes(h.value)) for h in r.headers],
         int(r.timestamp.replace(tzinfo=UTC).timestamp() * 1000))
        for r in rows
    ]  # fmt: skip
    assert got == expected
    assert {r.topic for r in rows} == {topic} and {r.timestampType for r in rows} == {0}


def test_a_tiered_topic_s_history_reads_from_offset_0_with_rayk_spark_and_spark_s_kafka_source(cluster, spark):
    """rayk.spark reads the remote segments straight from the store (a Spark task each);
    Spark's own Kafka source reads them through the listener, not knowing they are remote."""
    from rayk.client.offset_ranges import OffsetRange
    from rayk.client.remote_slices import RemotePlanner
    from tests.test_tiered_storage import RECORDS, TOPIC_CONFIG, produce, tiered_down, values

    cluster.create_topic("tiered-spark", num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    produce(cluster, "tiered-spark", values(0, RECORDS))
    tiered_down(cluster, "tiered-spark", [0, 1, 2])
    planner = RemotePlanner.for_topic(cluster, "tiered-spark")
    assert planner is not None and len(planner.split(OffsetRange("tiered-spark", 0, 0, RECORDS, 0))) > 2
    ours = rayk_spark.read_topic(spark, "tiered-spark", cluster=cluster).orderBy("offset").collect()
    assert [bytes(r.value) for r in ours] == values(0, RECORDS) and [r.offset for r in ours] == list(range(RECORDS))
    theirs = (spark.read.format("kafka").options(**rayk_spark.kafka_options(cluster, subscribe="tiered-spark"))
              .option("startingOffsets", "earliest").load().orderBy("offset").collect())  # fmt: skip
    assert [bytes(r.value) for r in theirs] == values(0, RECORDS)


def test_spark_kafka_sink_writes_what_rayk_consumer_reads_back(cluster, spark):
    topic = new_topic(cluster)
    df = spark.createDataFrame(
        [(b"k%d" % i if i != 4 else None, b"v%d" % i, [("h", b"%d" % i)] if i % 2 else [], i % 2) for i in range(10)],
        "key binary, value binary, headers array<struct<key string, value binary>>, partition int",
    )
    df.write.format("kafka").options(**rayk_spark.kafka_options(cluster, topic=topic)).save()
    got = consume_all(cluster, topic)
    assert [(r.partition, r.offset) for r in got] == [(p, o) for p in (0, 1) for o in range(5)]
    by_value = lambda record: record[1]  # noqa: E731
    assert sorted(((r.key, r.value, list(r.headers), r.partition) for r in got), key=by_value) == sorted(
        ((b"k%d" % i if i != 4 else None, b"v%d" % i, [("h", b"%d" % i)] if i % 2 else [], i % 2) for i in range(10)),
        key=by_value,
    )


class Traffic:
    """A rayk producer (acks=all) sending unique values to both partitions of a topic,
    a few every 20 ms, until stopped; `sent` is what it sent, all acknowledged on `stop`."""

    def __init__(self, cluster, topic):
        self.sent: list[bytes] = []
        self._stop = threading.Event()
        self._producer = cluster.producer(acks="all", linger_ms=5)
        self._topic = topic
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            while not self._stop.is_set():
                for _ in range(8):
                    i = len(self.sent)
                    self.sent.append(b"%06d" % i)
                    self._producer.send(self._topic, self.sent[-1], key=b"k%d" % (i % 5), partition=i % 2)
                time.sleep(0.02)
        except BaseException as e:  # reported by stop()
            self._error = e

    def halt(self) -> None:
        """Stops sending (a failed test's cleanup); `stop` also waits for the acknowledgements."""
        self._stop.set()

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(30)
        self._producer.flush(120)
        self._producer.close()
        assert self._error is None, self._error
        return self.sent


def start_queries(spark, cluster, source, sink, work):
    """Spark's Kafka source into two sinks, each a query with its own checkpoint: Spark's
    Kafka sink (topic `sink`) and Spark's Parquet file sink (`work / "parquet"`)."""
    def stream():
        return (
            spark.readStream.format("kafka")
            .options(**rayk_spark.kafka_options(cluster, subscribe=source, startingOffsets="earliest"))
            .load()
        )

    to_topic = (
        stream().selectExpr("key", "value").writeStream.format("kafka")
        .options(**rayk_spark.kafka_options(cluster, topic=sink))
        .option("checkpointLocation", str(work / "checkpoint-topic"))
        .trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    to_files = (
        stream().selectExpr("partition", "offset", "value").writeStream.format("parquet")
        .option("path", str(work / "parquet"))
        .option("checkpointLocation", str(work / "checkpoint-parquet"))
        .trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    return to_topic, to_files


def rows_in(query) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


def wait_for_rows(queries, more_than, what):
    def progressed():
        for q in queries:
            assert q.exception() is None, q.exception()
        return all(rows_in(q) > more_than for q in queries)

    try:
        wait_until(progressed, 120, what)
    except AssertionError as e:  # what each query was doing
        raise AssertionError(f"{e}: rows {[rows_in(q) for q in queries]}, status {[q.status for q in queries]}") from None


def check_outputs(spark, cluster, sink, work, sent):
    """Every sent record is in the Parquet output exactly once, and in the sink topic at
    least once."""
    files = spark.read.parquet(str(work / "parquet")).collect()  # the file sink's log: committed files only
    assert sorted(bytes(r.value) for r in files) == sorted(sent), "each record exactly once in the files"
    per_partition = {p: sorted(r.offset for r in files if r.partition == p) for p in (0, 1)}
    assert per_partition == {p: list(range(len(sent[p::2]))) for p in (0, 1)}, "no offset skipped"
    copied = [r.value for r in consume_all(cluster, sink)]
    assert set(copied) == set(sent), "each record at least once in the topic"
    return len(copied) - len(set(copied))


README_DATASETS = "import ray, rayk\nfrom rayk import data as rayk_data, spark as rayk_spark"
README_STREAMS = 'rayk.connect().create_topic("events-copy"'
README_EXACTLY_ONCE = "def enrich(df, batch_id):"
README_CONNECTOR = "rayk_spark.stop()                                    # the session above"


@pytest.fixture
def readme_setting(cluster, spark, tmp_path, monkeypatch):
    """What the README's Spark examples expect to find: `rayk.connect()` is this module's
    cluster, `rayk_spark.session` its session (a second one would not fit on 2 cores) and
    `rayk_spark.stop` leaves it to the fixture; "events" holds 20 records on 2 partitions,
    partition 0 has its offset 5, and two values are empty (the filter's)."""
    monkeypatch.setattr(rayk, "connect", lambda *args, **kwargs: cluster)
    monkeypatch.setattr(rayk_spark, "session", lambda *args, **kwargs: spark)
    monkeypatch.setattr(rayk_spark, "stop", lambda: None)
    monkeypatch.chdir(tmp_path)
    cluster.create_topic("events", num_partitions=2, replication_factor=1)
    with cluster.producer(acks="all") as producer:
        for i in range(20):
            producer.send("events", b"" if i in (3, 4) else b"click %d" % i, key=b"u%d" % (i % 4), partition=i % 2)
    return {"__name__": "readme"}


def test_the_readme_s_spark_examples_run_as_written(cluster, spark, readme_setting, tmp_path):
    namespace = readme_setting
    for name in ("events-clean", "shouted", "events-copy"):
        assert name not in cluster.list_topics()
    readme.run(README_DATASETS, namespace)
    assert sum(p.high_watermark for p in cluster.describe_topic("events-clean")) == 18, "the two empty values dropped"
    shouted = consume_all(cluster, "shouted")
    expected = [b"CLICK %d" % i for i in range(20) if i not in (3, 4)] + [b""] * 2  # upper() of every value
    assert sorted(bytes(r.value) for r in shouted) == sorted(expected)

    # The streams' block: Spark's stream is started and stopped, then Ray Data's runs (from
    # "latest") on a thread until a batch of new records is written and `stop()` ends it.
    done = threading.Event()
    errors: list[BaseException] = []

    def run_streams():
        try:
            readme.run(README_STREAMS, namespace, {"/tmp/events/": f"{tmp_path}/events/"})
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)
        finally:
            done.set()

    threading.Thread(target=run_streams, daemon=True).start()
    wait_until(lambda: "stream" in namespace or done.is_set(), 60, "the Ray Data stream to start")
    with cluster.producer(acks="all") as producer:
        for i in range(6):
            producer.send("events", b"late %d" % i, partition=i % 2)

    def written() -> list[bytes]:  # by the batches so far (one, or more if a trigger fell among the sends)
        try:
            tables = [pq.read_table(batch) for batch in tmp_path.glob("events/*/")]
        except (OSError, pa.ArrowInvalid):  # a file being written
            return []
        return [v for t in tables if "value" in t.column_names for v in t.column("value").to_pylist()]

    wait_until(lambda: len(written()) == 6 or done.is_set(), 60, "the new records written by the micro-batches")
    namespace["stream"].stop()
    assert done.wait(60) and not errors, errors
    assert sorted(written()) == [b"late %d" % i for i in range(6)]

    def committed_copies() -> int:
        return len(rayk_spark.read_topic(spark, "events-copy", cluster=cluster, isolation_level="read_committed").collect())

    copies_before, ends = committed_copies(), {p.partition: p.high_watermark for p in cluster.describe_topic("events")}
    readme.run(README_EXACTLY_ONCE, namespace)  # Ray Data's stream copies every record in its first batch
    # (commit_transaction returns once the commit is decided: its markers, and so the copies
    # for read_committed readers, follow)
    wait_until(lambda: committed_copies() == copies_before + sum(ends.values()), 30, "the copies committed")
    with cluster.consumer(group_id="etl-eos-ray", enable_auto_commit=False) as consumer:
        assert {p: consumer.committed(("events", p)) for p in ends} == ends

    readme.run(README_CONNECTOR, namespace, {"/data/events": f"{tmp_path}/connector/events"})
    assert namespace["df"].count() == 13 - 5 + 13, "offsets 5.. of partition 0, all of partition 1"
    assert len(consume_all(cluster, "shouted")) == 20 + 21
    query = namespace["query"]  # from "latest", Spark's default for streams
    try:
        query.processAllAvailable()
        with cluster.producer(acks="all") as producer:
            for i in range(4):
                producer.send("events", b"streamed %d" % i)
        query.processAllAvailable()
    finally:
        query.stop()
    streamed = spark.read.parquet(f"{tmp_path}/connector/events").collect()
    assert sorted(bytes(r.value) for r in streamed) == [b"streamed %d" % i for i in range(4)]


def test_make_demo_s_spark_pipeline_counts_every_click_once(cluster, spark, capsys):
    """`make demo`'s second half, examples/spark_pipeline.py, on this module's session and
    cluster with fewer events and partitions: 2 and 1, whose 9 replica processes start in a
    third of the time of the demo's 27 (its first half, `rayk demo`, runs in tests/test_cli.py)."""
    path = Path(__file__).resolve().parent.parent / "examples" / "spark_pipeline.py"
    spec = importlib.util.spec_from_file_location("spark_pipeline", path)
    pipeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipeline)
    pipeline.run_pipeline(spark, cluster, "clicks", "clicks-per-user", events=2000, users=5, stream_events=1000,
                          source_partitions=2, target_partitions=1)
    said = capsys.readouterr().out
    assert "pipeline check passed" in said and "stream check passed" in said


# In `make chaos`: what rayk's part in a resume is, reading from the checkpoint's per-partition
# offsets, test_spark_kafka_source_reads_what_a_rayk_producer_wrote_in_json_offset_bounds checks.
@pytest.mark.chaos
def test_a_structured_streaming_query_stopped_mid_stream_resumes_from_its_checkpoint(cluster, spark, tmp_path):
    source, sink = new_topic(cluster), new_topic(cluster, partitions=1)
    traffic = Traffic(cluster, source)
    queries = start_queries(spark, cluster, source, sink, tmp_path)
    try:
        wait_for_rows(queries, 0, "both queries to process records")
    finally:
        for q in queries:
            q.stop()  # mid-stream: the records keep coming
    stopped_at = len(traffic.sent)
    queries = start_queries(spark, cluster, source, sink, tmp_path)  # the same checkpoints
    try:
        wait_until(lambda: len(traffic.sent) > stopped_at + 200, 30, "more records")
        sent = traffic.stop()
        for q in queries:
            q.processAllAvailable()
    finally:
        traffic.halt()
        for q in queries:
            q.stop()
    assert len(sent) > stopped_at
    duplicates = check_outputs(spark, cluster, sink, tmp_path, sent)
    print(f"\n{len(sent)} records, {duplicates} written twice to the topic across the restart")


# Last in the module: it kills a broker (and waits for its replicas to rejoin before it ends).
@pytest.mark.chaos  # in `make chaos`, where the suite's 25-minute budget does not bind
def test_a_structured_streaming_query_skips_nothing_when_a_broker_is_killed(cluster, spark, tmp_path):
    source = new_topic(cluster, replication_factor=3)
    sink = new_topic(cluster, partitions=1, replication_factor=3)
    for topic in (source, sink):
        cluster.admin().alter_topic_configs(topic, {"min.insync.replicas": "2"})
    leader = cluster.describe_topic(source)[0]["leader"]
    traffic = Traffic(cluster, source)
    queries = start_queries(spark, cluster, source, sink, tmp_path)
    try:
        wait_for_rows(queries, 0, "both queries to process records")
        before = [rows_in(q) for q in queries]
        pid = pid_of(cluster.broker(leader))
        os.kill(pid, signal.SIGKILL)  # the leader of partition 0 and its replicas; Ray starts it again
        wait_until(lambda: pid_of(cluster.broker(leader)) not in (0, pid), 60, "Ray to restart the broker")
        wait_for_rows(queries, max(before) + 400, "the queries to go on after the kill")
        sent = traffic.stop()
        for q in queries:
            q.processAllAvailable()
            assert q.isActive, "the query ran on through the kill"
    finally:
        traffic.halt()
        for q in queries:
            q.stop()
    check_outputs(spark, cluster, sink, tmp_path, sent)

    def healed():
        return all(len(p["isr"]) == 3 for t in (source, sink) for p in cluster.describe_topic(t))

    try:
        wait_until(healed, 120, "the killed broker's replicas to rejoin the ISR")
    except AssertionError as e:
        raise AssertionError(f"{e}: {[cluster.describe_topic(t) for t in (source, sink)]}") from None
