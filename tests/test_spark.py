"""Spark on Ray (RayDP) reading and writing topics (rayk.spark)."""

from __future__ import annotations

import datetime
import itertools
import time

import pytest
import ray

import rayk
from rayk import spark as rayk_spark
from rayk.errors import InvalidConfigurationError
from tests.cluster_helpers import FAST_CONFIG, release_shared_local_ray, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("delete_topics_after_test")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    release_shared_local_ray()  # a Ray of its own: what it starts dies with it
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("spark"), config=FAST_CONFIG, namespace="spark")
    yield c
    c.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def spark(cluster):
    session = rayk_spark.session("rayk-tests", executors=1, executor_cores=1, executor_memory="1g")
    yield session
    rayk_spark.stop()


_topics = itertools.count()


def new_topic(cluster, partitions=2) -> str:
    name = f"s{next(_topics)}"
    cluster.create_topic(name, partitions=partitions, replication_factor=3)
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


def test_a_transformed_dataframe_goes_to_another_topic(cluster, spark):
    source, target = new_topic(cluster), new_topic(cluster, partitions=1)
    strings = spark.createDataFrame([(f"user-{i % 3}", f"click {i}") for i in range(60)], "key string, value string")
    assert rayk_spark.write_topic(strings, source, cluster=cluster) == 60
    counts = (
        rayk_spark.read_topic(spark, source, cluster=cluster)
        .selectExpr("CAST(key AS STRING) AS user")
        .groupBy("user")
        .count()
        .selectExpr("CAST(user AS BINARY) AS key", "CAST(CAST(count AS STRING) AS BINARY) AS value")
    )
    assert rayk_spark.write_topic(counts, target, cluster=cluster) == 3
    got = {bytes(r.key): bytes(r.value) for r in rayk_spark.read_topic(spark, target, cluster=cluster).collect()}
    assert got == {b"user-0": b"20", b"user-1": b"20", b"user-2": b"20"}


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
    empty = rayk_spark.read_topic(spark, new_topic(cluster), cluster=cluster)
    assert empty.count() == 0 and empty.schema == rayk_spark.spark_schema()
    with pytest.raises(InvalidConfigurationError):
        rayk_spark.write_topic(spark.createDataFrame([(1,)], "payload int"), topic, cluster=cluster)


def test_reads_and_writes_with_a_dead_follower_and_unacknowledged_writes_fail(cluster, spark):
    topic = new_topic(cluster, partitions=1)
    strict = new_topic(cluster, partitions=1)
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
