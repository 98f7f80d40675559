"""Node faults on a Ray cluster of a head and broker nodes, under continuous acks=all
idempotent production: a broker's node is removed and a replacement node takes the
broker (with its disk), or no node comes and the Controller moves the broker's replicas
to a live broker after broker.replacement.delay.ms (KIP-455 reassignment)."""

from __future__ import annotations

import time

import pytest

from tests.cluster_helpers import BROKER_RESOURCE, shared_broker_node_cluster, wait_until
from tests.faults.harness import (
    PARTITIONS,
    TOPIC,
    Traffic,
    broker_node,
    check,
    run_until_acked,
    start_rayk,
)

RUNS_ON = "broker nodes"  # shared_broker_node_cluster: tests/conftest.py runs these modules first


@pytest.fixture(scope="module")
def ray_cluster():
    return shared_broker_node_cluster()


@pytest.mark.chaos  # ~55 s, in `make chaos`; make test keeps the lost node without a replacement (below)
def test_a_lost_node_comes_back_as_a_replacement_node_with_the_brokers_disk(ray_cluster, tmp_path):
    c = start_rayk(tmp_path)
    try:
        c.create_topic(TOPIC, num_partitions=PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
        traffic = Traffic(c)
        run_until_acked(traffic, 2_000)
        lost = c.describe_topic(TOPIC)[0]["leader"]
        ray_cluster.remove_node(broker_node(ray_cluster, c, lost))
        t0 = time.monotonic()  # after the fault (see wait_resumed)
        resume_s = traffic.wait_resumed(t0)
        assert next(b for b in c.brokers() if b["broker_id"] == lost)["fenced"]
        replacement = ray_cluster.add_node(num_cpus=1, resources={BROKER_RESOURCE: 1})
        c.restart_broker(lost, node_id=replacement.node_id)
        run_until_acked(traffic, 1_000)
        check(c, traffic, "node loss, then a replacement node", resume_s)
        assert not next(b for b in c.brokers() if b["broker_id"] == lost)["fenced"]
    finally:
        c.shutdown()


def test_a_lost_node_with_no_replacement_has_its_replicas_moved_to_a_live_broker(ray_cluster, tmp_path):
    ray_cluster.add_node(num_cpus=1, resources={BROKER_RESOURCE: 1})  # room for a fourth broker
    ray_cluster.wait_for_nodes()
    c = start_rayk(tmp_path, brokers=4, config={"broker.replacement.delay.ms": 2_000})
    try:
        c.create_topic(TOPIC, num_partitions=PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
        traffic = Traffic(c)
        run_until_acked(traffic, 2_000)
        lost = c.describe_topic(TOPIC)[0]["leader"]
        ray_cluster.remove_node(broker_node(ray_cluster, c, lost))
        t0 = time.monotonic()  # after the fault (see wait_resumed)
        resume_s = traffic.wait_resumed(t0)
        wait_until(
            lambda: all(lost not in p["replicas"] for p in c.describe_topic(TOPIC)), 60, "its replicas to move"
        )
        run_until_acked(traffic, 1_000)
        check(c, traffic, "node loss, no replacement: replicas moved", resume_s)
        for p in c.describe_topic(TOPIC):
            assert len(p["replicas"]) == 3 and lost not in p["isr"]
    finally:
        c.shutdown()
