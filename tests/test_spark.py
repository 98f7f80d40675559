"""Spark on Ray (RayDP) reading and writing topics (rayk.spark)."""

from __future__ import annotations

import datetime
import itertools

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
