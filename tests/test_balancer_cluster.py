"""The balancer on a real cluster (rayk.start on the shared local Ray), issue 67's case: a
fourth broker joins three holding 12 partitions x RF 3 while an idempotent acks=all
producer and a consumer group run; it comes to hold its share of the replicas and of the
leaders (how fast: benchmarks/balance_bench.py), and every acknowledged record is read
back exactly once, from the logs and by the group. And a cluster with
auto.balance.enable=false leaves the new broker empty."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import ray

import rayk
from tests.cluster_helpers import FAST_CONFIG, balanced, placement, shared_local_ray, start_new_broker, wait_until
from tests.faults.harness import Traffic, healthy, lost_and_duplicated, read_partition

TOPIC = "balanced"
PARTITIONS = 12
# How long the new broker may take to hold its share here. Issue 67's figure, a minute, is a
# performance claim and lives in benchmarks/balance_bench.py (which prints it); this bound
# only says the balancer finishes under traffic on a machine as busy as CI's, where new
# replica processes start slowly and a reassignment waits for its replica to join the ISR.
SHARE_S = 180
SEND_RATE_PER_S = 400  # enough to keep every partition busy, little enough for 2 shared cores
# rayk's own clients only (one process fewer per broker), and the fault tests' session
# timeout: a broker fenced by a busy machine holds the balancer up until it is back.
CONFIG = {**FAST_CONFIG, "listeners": "", "broker.session.timeout.ms": 8000}


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


class GroupReader(threading.Thread):
    """A consumer group member reading the topic from its beginning, counting each value."""

    def __init__(self, cluster: Any) -> None:
        super().__init__(daemon=True)
        self.consumer = cluster.consumer(TOPIC, group_id="readers", auto_offset_reset="earliest")
        self.seen: Counter = Counter()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for records in self.consumer.poll(timeout_ms=200).values():
                self.seen.update(r.value for r in records)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        self.consumer.close()


@pytest.mark.chaos  # 3-4 minutes on 2 busy cores, in `make chaos`; make test keeps a broker added under
# traffic (test_broker_lifecycle), the balancer's moves (test_balancer_controller) and its planner
def test_a_new_broker_takes_its_share_under_traffic_and_nothing_is_lost(tmp_path):
    cluster = rayk.start(brokers=3, data_dir=tmp_path, config=CONFIG, namespace="balancer-join")
    traffic = reader = None
    try:
        cluster.create_topic(TOPIC, num_partitions=PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
        traffic = Traffic(cluster, TOPIC, rate_per_s=SEND_RATE_PER_S, partitions=PARTITIONS)
        reader = GroupReader(cluster)
        reader.start()
        wait_until(lambda: traffic.acked_count() >= 500 and sum(reader.seen.values()) >= 100, 120, "traffic")

        started = time.monotonic()
        start_new_broker(cluster, 3)

        try:
            wait_until(lambda: balanced(cluster, 4), SHARE_S, "broker 3 to hold its share of replicas and leaders")
        except AssertionError:
            print("not settled:", placement(cluster), ray.get(cluster.controller.balancer_status.remote()), cluster.brokers())
            raise
        took_s = time.monotonic() - started
        replicas, leaders, _ = placement(cluster)
        mine = [p for p in cluster.describe_topic(TOPIC) if 3 in p["replicas"]]
        print(f"broker 3 took its share in {took_s:.1f} s: replicas {dict(replicas)}, leaders {dict(leaders)}; "
              f"{len(mine)} of {TOPIC}'s replicas, leading {sum(p['leader'] == 3 for p in mine)}")
        assert len(mine) >= PARTITIONS * 3 // 4 and sum(p["leader"] == 3 for p in mine) >= PARTITIONS // 4

        acked_at_share = traffic.acked_count()
        wait_until(lambda: traffic.acked_count() >= acked_at_share + 200, 60, "writes going on after the move")
        traffic.stop()
        wait_until(lambda: healthy(cluster, TOPIC), 90, "every partition led, with its full ISR")
        stored = {p: read_partition(cluster, p, TOPIC) for p in range(PARTITIONS)}
        lost, duplicated = lost_and_duplicated(traffic, stored)
        assert not lost and not duplicated, f"{len(lost)} lost, {len(duplicated)} stored twice"
        acked = set(traffic.acked)
        wait_until(lambda: acked <= set(reader.seen), 60, "the group to read every acknowledged record")
        assert not [v for v, n in reader.seen.items() if n > 1], "the group read a record twice"
    finally:
        for stop in ([reader.stop] if reader else []) + ([traffic.abandon] if traffic else []):
            try:
                stop()
            except Exception:
                pass  # stopped already, or a test that failed: what it had in flight does not matter
        cluster.shutdown()


def test_with_auto_balance_off_a_new_broker_stays_empty(tmp_path):
    config = {**CONFIG, "auto.balance.enable": "false", "balancer.interval.ms": 500}
    cluster = rayk.start(brokers=3, data_dir=tmp_path, config=config, namespace="balancer-off")
    try:
        cluster.create_topic(TOPIC, num_partitions=3, replication_factor=3)
        start_new_broker(cluster, 3)
        wait_until(lambda: any(b["broker_id"] == 3 and not b["fenced"] for b in cluster.brokers()), 60, "broker 3")
        time.sleep(3)  # several maintenance ticks and balancer intervals
        replicas, _, _ = placement(cluster)
        assert replicas[3] == 0 and ray.get(cluster.controller.balancer_status.remote())["enabled"] is False
    finally:
        cluster.shutdown()
