"""Ray Data's own Kafka connector (`ray.data.read_kafka` / `Dataset.write_kafka`, which run
confluent-kafka inside Ray tasks) against rayk's listener."""

from __future__ import annotations

import json

import pytest
import ray

import rayk
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
    cluster.create_topic("clicks", partitions=3, replication_factor=1)
    rows = [{"user": f"u{i % 4}", "n": i} for i in range(200)]
    ray.data.from_items(rows).write_kafka("clicks", bootstrap, key_field="user")
    read = ray.data.read_kafka("clicks", bootstrap_servers=bootstrap).take_all()
    assert sorted(json.loads(r["value"])["n"] for r in read) == list(range(200))
    partitions_of = {}
    for r in read:
        partitions_of.setdefault(r["key"], set()).add(r["partition"])
    assert len(partitions_of) == 4 and all(len(p) == 1 for p in partitions_of.values()), "keyed: one partition per key"
    assert sum(p["high_watermark"] for p in cluster.describe_topic("clicks")) == 200
