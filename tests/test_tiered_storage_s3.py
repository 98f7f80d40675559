"""Tiered storage against a real S3 API (tests/s3_server.py, on 127.0.0.1): the same history
readable from offset 0 by rayk's consumer and by Ray Data straight from the bucket, and a
restart of the S3 server in the middle of copying: copying fails while it is down, produce
and fetch go on, and it catches up when the server is back, with nothing lost."""

from __future__ import annotations

import time

import pytest
import ray

import rayk
import rayk.data
from rayk.client.remote_slices import RemoteSlice
from tests.cluster_helpers import FAST_CONFIG, NO_LISTENERS, shared_local_ray, wait_until
from tests.s3_server import S3Server
from tests.test_tiered_storage import LOCAL_RETENTION_BYTES, RECORDS, SEGMENT_BYTES, TOPIC_CONFIG, consumed_values, \
    produce, tiered_down, values


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3):
    shared_local_ray()
    config = {**FAST_CONFIG, **NO_LISTENERS, **s3.settings("tiered"), "auto.leader.rebalance.enable": False,
              "remote.log.manager.task.interval.ms": 300}  # fmt: skip
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("tiered-s3"), config=config, namespace="tiered-s3")
    yield c
    c.shutdown()


def test_the_history_is_read_from_the_bucket_by_the_consumer_and_by_ray_data(cluster):
    cluster.create_topic("s3history", num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    produce(cluster, "s3history", values(0, RECORDS))
    tiered_down(cluster, "s3history", [0, 1, 2])
    assert consumed_values(cluster, "s3history", RECORDS) == values(0, RECORDS)
    source = rayk.data.TopicDatasource("s3history", cluster=cluster)
    assert sum(isinstance(task[0], RemoteSlice) for task in source.tasks) > 3
    rows = rayk.data.read_topic("s3history", cluster=cluster).take_all()
    assert [bytes(r["value"]) for r in sorted(rows, key=lambda r: r["offset"])] == values(0, RECORDS)


def test_a_restart_of_the_s3_server_mid_copy_holds_copying_back_and_loses_nothing(cluster, s3):
    cluster.create_topic("s3restart", num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    produce(cluster, "s3restart", values(0, RECORDS // 4))
    leader = cluster.leader("s3restart", 0)
    wait_until(lambda: ray.get(leader.remote_segments.remote()), 60, "a first copied segment")
    s3.stop()  # mid-copy: the leader's task keeps finding segments to copy
    produce(cluster, "s3restart", values(RECORDS // 4, RECORDS * 3 // 4))  # produce goes on
    time.sleep(2)
    start, _end, size = ray.get(leader.log_size.remote())
    assert size > LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES  # nothing uncopied was deleted
    s3.start()
    tiered_down(cluster, "s3restart", [0, 1, 2])
    assert consumed_values(cluster, "s3restart", RECORDS) == values(0, RECORDS)
