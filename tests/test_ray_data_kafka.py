"""Ray Data's own Kafka connector (`ray.data.read_kafka` / `Dataset.write_kafka`, which run
confluent-kafka inside Ray tasks) against rayk's listener."""

from __future__ import annotations

import json

import pytest
import ray

import rayk
from rayk import data as rayk_data
from tests.cluster_helpers import FAST_CONFIG, shared_local_ray


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = rayk.start(brokers=1, data_dir=tmp_path_factory.mktemp("ray-data-kafka"), config=FAST_CONFIG, namespace="rdk")
    yield c
    c.shutdown()


def test_ray_data_write_kafka_then_read_kafka(cluster):
    bootstrap = cluster.bootstrap_servers
    cluster.create_topic("clicks", num_partitions=3, replication_factor=1)
    rows = [{"user": f"u{i % 4}", "n": i} for i in range(200)]
    ray.data.from_items(rows).write_kafka("clicks", bootstrap, key_field="user")
    read = ray.data.read_kafka("clicks", bootstrap_servers=bootstrap).take_all()
    assert sorted(json.loads(r["value"])["n"] for r in read) == list(range(200))
    partitions_of = {}
    for r in read:
        partitions_of.setdefault(r["key"], set()).add(r["partition"])
    assert len(partitions_of) == 4 and all(len(p) == 1 for p in partitions_of.values()), "keyed: one partition per key"
    assert sum(p["high_watermark"] for p in cluster.describe_topic("clicks")) == 200


def test_rayk_read_topic_with_schema_ray_has_the_columns_of_read_kafka(cluster):
    cluster.create_topic("mixed", num_partitions=2, replication_factor=1)
    with cluster.producer() as producer:
        producer.send("mixed", b"v0", key=b"k0", partition=0, headers=[("trace", b"t0")])
        producer.send("mixed", b"v1", partition=1, timestamp_ms=1_700_000_000_000)
        producer.send("mixed", None, key=b"k2", partition=1, headers=[("trace", b"t2"), ("user", b"u")])
    theirs = ray.data.read_kafka("mixed", bootstrap_servers=cluster.bootstrap_servers)
    ours = rayk_data.read_topic("mixed", cluster=cluster, schema="ray")
    assert ours.schema().base_schema == theirs.schema().base_schema, "the same names and Arrow types, in order"
    ours = ours.materialize()
    assert ours.schema().base_schema == rayk_data.RAY_SCHEMA, "the blocks' too"

    def by_offset(rows):
        return sorted(rows, key=lambda r: (r["partition"], r["offset"]))

    pairs = list(zip(by_offset(ours.take_all()), by_offset(theirs.take_all()), strict=True))
    assert len(pairs) == 3
    for mine, ray_row in pairs:
        assert {k: v for k, v in mine.items() if k != "headers"} == {k: v for k, v in ray_row.items() if k != "headers"}
        # read_kafka's blocks hold headers as a struct of the block's header keys (not the map it declares)
        assert dict(mine["headers"]) == {k: v for k, v in ray_row["headers"].items() if v is not None}
