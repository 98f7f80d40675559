"""The listener's native produce path on a 3-broker cluster, as Kafka clients meet it: an
idempotent acks=all producer keeps producing through the listeners while the leader
replica of a partition is killed (SIGKILL, by the pid in Ray's actor table) and Ray
restarts it. The listener's connection to that replica breaks, its frame in flight is
answered NOT_LEADER_OR_FOLLOWER, the client moves to the new leader, and once the replica
is back its listener connects to the restarted one again. Every record is delivered, and
read back once, in order per partition."""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray

import rayk
from rayk import native_paths
from rayk.internal_topics import OFFSETS_TOPIC
from rayk.net import native_produce
from tests.cluster_helpers import FAST_CONFIG, pid_of, shared_local_ray, wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.skipif(not native_produce.available(), reason="the native produce path is not built here")

TOPIC = "native-failover"
PARTITIONS = 3


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("native-produce"),
                   config={**FAST_CONFIG, "auto.leader.rebalance.enable": False}, namespace="native-produce")
    c.create_topic(TOPIC, num_partitions=PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
    yield c
    c.shutdown()


def produce(producer, start: int, count: int, errors: list) -> None:
    for i in range(start, start + count):
        producer.produce(TOPIC, value=b"%06d" % i, partition=i % PARTITIONS,
                         on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
        producer.poll(0)
        time.sleep(0.002)


def parks_produce_calls(cluster, topic: str, partition: int) -> tuple[bool, bool]:
    """(whether the leader's endpoint is open, whether it serves produce calls without a task)."""
    leader = cluster.leader(topic, partition)  # the leader replica's actor handle
    return ray.get(leader.__ray_call__.remote(lambda r: (r._endpoint is not None, r._parked_produce)))


def native_copy_runs(cluster, topic: str, partition: int) -> list[int]:
    """Per follower of the partition, the runs of its native copy loop (native_copy.py)."""
    described = cluster.describe_topic(topic)[partition]
    followers = [cluster.replica(topic, partition, b) for b in described["replicas"] if b != described["leader"]]
    return ray.get([f.__ray_call__.remote(lambda r: r._follower.native_copy_runs) for f in followers])


def test_a_kafka_producer_rides_through_a_leader_replicas_restart_on_the_native_path(cluster):
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                                         "enable.idempotence": True, "linger.ms": 0,
                                         "message.timeout.ms": 120_000})
    errors: list = []
    produce(producer, 0, 300, errors)
    assert producer.flush(60) == 0 and not errors
    assert parks_produce_calls(cluster, TOPIC, 0) == (True, native_paths.enabled("parked_produce"))
    # The followers copy on their native loops (each started at least once).
    assert all(runs >= 1 if native_paths.enabled("follower") else runs == 0 for runs in native_copy_runs(cluster, TOPIC, 0))
    leader = cluster.leader(TOPIC, 0)
    before = cluster.describe_topic(TOPIC)[0]
    os.kill(pid_of(leader), signal.SIGKILL)
    produce(producer, 300, 600, errors)
    assert producer.flush(120) == 0, "every record delivered"
    assert not errors, errors[:3]
    wait_until(lambda: len(cluster.describe_topic(TOPIC)[0]["isr"]) == 3, 60, "the restarted replica back in the ISR")
    assert cluster.describe_topic(TOPIC)[0]["leader_epoch"] > before["leader_epoch"]
    # Leadership back on the restarted replica (the preferred one): its broker's listener
    # reaches the restarted process anew.
    assert before["leader"] == before["replicas"][0]
    admin = cluster.admin()
    assert admin.elect_leaders([(TOPIC, 0)]) == {(TOPIC, 0): None}
    wait_until(lambda: cluster.describe_topic(TOPIC)[0]["leader"] == before["leader"], 30, "the preferred leader back")
    produce(producer, 900, 100, errors)
    assert producer.flush(60) == 0 and not errors
    assert parks_produce_calls(cluster, TOPIC, 0) == (True, native_paths.enabled("parked_produce"))  # the restarted one
    assert all(runs >= 1 if native_paths.enabled("follower") else runs == 0 for runs in native_copy_runs(cluster, TOPIC, 0))

    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "native-check",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    got: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < 1000 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            got[message.partition()].append(int(message.value()))
    consumer.close()
    for p in range(PARTITIONS):
        assert got[p] == list(range(p, 1000, PARTITIONS)), f"partition {p}: each record once, in order"


def test_an_internal_topics_leader_never_serves_clients_produce_calls_past_its_refusal(cluster):
    """__consumer_offsets' replicas answer clients' writes INVALID_TOPIC_EXCEPTION in their
    own produce_requests (CoordinatorReplica): the task-less produce path, which would
    append them, is off there, though their endpoints are open for their followers."""
    partitions = range(len(cluster.describe_topic(OFFSETS_TOPIC)))
    wait_until(lambda: any(parks_produce_calls(cluster, OFFSETS_TOPIC, p)[0] for p in partitions), 30,
               "an offsets partition's endpoint open")
    for p in partitions:
        assert not parks_produce_calls(cluster, OFFSETS_TOPIC, p)[1]
