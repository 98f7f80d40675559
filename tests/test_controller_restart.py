"""Clients across a Controller restart: its process is SIGKILLed, Ray restarts it
(max_restarts=-1) and it restores its metadata (here snapshotted every few KiB of records,
so restarts load snapshots), then hears from the brokers again at their next heartbeats.
Meanwhile producers keep sending and client calls keep working:
no Ray exception reaches the caller, nothing acknowledged is lost or written twice."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import ray

import rayk
from rayk.client import TopicPartition
from rayk.errors import KafkaError, TopicAlreadyExistsError
from tests.cluster_helpers import FAST_CONFIG, NO_LISTENERS, is_dead, pid_of, shared_local_ray, wait_until

PARTITIONS = 3


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


# Snapshots every 4 KiB of metadata records: a few changes each, so every restart below
# restores a snapshot and replays only what followed it.
CONFIG = {**FAST_CONFIG, **NO_LISTENERS}  # these tests speak no Kafka protocol
SNAPSHOTTING_CONFIG = {**CONFIG, "metadata.log.max.record.bytes.between.snapshots": 4096}


@pytest.fixture
def cluster(tmp_path):
    c = rayk.start(brokers=3, data_dir=tmp_path, config=SNAPSHOTTING_CONFIG, namespace="controller-restart")
    yield c
    c.shutdown()


def kill_controller(cluster) -> None:
    pid = ray._private.state.actors(cluster.controller._actor_id.hex())["Pid"]
    os.kill(pid, signal.SIGKILL)


class Sender(threading.Thread):
    """Sends without pause until stopped; records anything send() raises."""

    def __init__(self, producer, topic):
        super().__init__(daemon=True)
        self.producer, self.topic = producer, topic
        self.sent: list[tuple[bytes, object]] = []
        self.raised: list[BaseException] = []
        self.longest_send_s = 0.0
        self._halt = threading.Event()

    def run(self):
        i = 0
        while not self._halt.is_set():
            value = b"%08d" % i
            started = time.monotonic()
            try:
                self.sent.append((value, self.producer.send(self.topic, value=value, key=value)))
            except BaseException as e:  # what the test forbids
                self.raised.append(e)
                return
            self.longest_send_s = max(self.longest_send_s, time.monotonic() - started)
            i += 1

    def stop(self):
        self._halt.set()
        self.join(timeout=120)


def read_back(cluster, topic: str) -> dict[tuple[int, int], bytes]:
    consumer = cluster.consumer()
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning()
    end = consumer.end_offsets(partitions)
    stored: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + 120
    while any(consumer.position(tp) < end[tp] for tp in partitions):
        assert time.monotonic() < deadline, "could not read the topic back"
        for tp, records in consumer.poll(timeout_ms=500).items():
            stored.update({(tp.partition, r.offset): r.value for r in records})
    consumer.close()
    return stored


def test_an_idempotent_producer_rides_through_a_controller_restart(cluster):
    cluster.create_topic("events", num_partitions=PARTITIONS, replication_factor=3)
    cluster.consumer(group_id="warm-up").committed(TopicPartition("events", 0))  # creates __consumer_offsets
    producer = cluster.producer()  # idempotent, acks=all: the defaults
    sender = Sender(producer, "events")
    sender.start()
    time.sleep(1)
    killed_at = time.monotonic()
    kill_controller(cluster)

    # Meanwhile, new clients whose every call goes to the restarting Controller first.
    late_producer = cluster.producer()
    late = [late_producer.send("events", value=b"late-%d" % i) for i in range(100)]
    consumer = cluster.consumer(group_id="during-restart", auto_offset_reset="earliest")
    tp = TopicPartition("events", 0)
    assert consumer.partitions_for_topic("events") == set(range(PARTITIONS))
    consumer.assign([tp])
    assert consumer.end_offsets([tp])[tp] >= 0
    assert consumer.beginning_offsets([tp]) == {tp: 0}
    assert consumer.position(tp) == 0
    consumer.commit({tp: 1})
    assert consumer.committed(tp) == 1
    entry_points_s = time.monotonic() - killed_at
    consumer.close()

    time.sleep(max(0.0, 5 - (time.monotonic() - killed_at)))  # keep sending through the restart
    sender.stop()
    assert not sender.raised, f"send() raised {sender.raised[0]!r}"
    producer.flush()
    late_producer.flush()
    acked = [(value, future.get()) for value, future in sender.sent]
    acked += [(b"late-%d" % i, f.get()) for i, f in enumerate(late)]
    producer.close()
    late_producer.close()

    stored = read_back(cluster, "events")
    values = list(stored.values())
    assert len(values) == len(set(values)), "no record is written twice"
    for value, meta in acked:
        assert stored.get((meta.partition, meta.offset)) == value, f"{value!r} is not at its acknowledged offset"
    print(f"\n{len(acked)} records acknowledged; the calls of fresh clients took {entry_points_s:.1f} s from the kill;"
          f" longest send() {sender.longest_send_s * 1000:.0f} ms")


class CallLoop(threading.Thread):
    """Makes one client call again and again until stopped; counts what it returned, the
    rayk errors it raised, and keeps anything else it raised (which the test forbids)."""

    def __init__(self, name, call):
        super().__init__(daemon=True, name=name)
        self.call = call
        self.returned = 0
        self.kafka_errors: list[KafkaError] = []
        self.other_errors: list[BaseException] = []
        self._halt = threading.Event()

    def run(self):
        i = 0
        while not self._halt.is_set():
            try:
                self.call(i)
                self.returned += 1
            except KafkaError as e:
                self.kafka_errors.append(e)
            except BaseException as e:
                self.other_errors.append(e)
            i += 1
            time.sleep(0.02)

    def stop(self):
        self._halt.set()
        self.join(timeout=150)  # a call in flight ends within default_api_timeout_ms
        assert not self.is_alive(), f"{self.name}: a call did not end"


@pytest.mark.chaos  # ~37 s, in `make chaos`; make test keeps a Controller killed for good (below) and
# killed under traffic (faults/test_process_faults.py), which check the same typed errors
def test_admin_and_cluster_calls_raise_only_rayk_errors_across_controller_restarts(cluster):
    cluster.create_topic("steady", num_partitions=2, replication_factor=3)
    admin = cluster.admin()

    def create_and_delete(i):
        name = f"churn-{i}"
        admin.create_topic(name, 1, 1)  # not idempotent: a retry must not turn into TOPIC_ALREADY_EXISTS
        admin.delete_topics([name])

    loops = [
        CallLoop("describe_topic", lambda i: cluster.describe_topic("steady")),
        CallLoop("list_topics", lambda i: admin.list_topics()),
        CallLoop("describe_topics", lambda i: admin.describe_topics(["steady"])),
        CallLoop("describe_topic_configs", lambda i: admin.describe_topic_configs("steady")),
        CallLoop("create_and_delete", create_and_delete),
    ]
    metadata_dir = Path(ray.get(cluster.controller.data_dir.remote())) / "__cluster_metadata-0"
    for loop in loops:
        loop.start()
    # The restarts below restore a snapshot: the churn makes the first one (on a loaded
    # machine its 4 KiB of records can take longer than the restarts' first pause).
    wait_until(lambda: list(metadata_dir.glob("*.checkpoint")), 60, "the churn to make the Controller snapshot")
    for _ in range(3):
        time.sleep(1.5)
        before = pid_of(cluster.controller)
        kill_controller(cluster)
        wait_until(lambda: pid_of(cluster.controller) not in (0, before), 120, "Ray to restart the Controller")
        wait_until(lambda: cluster.list_topics(), 120, "the restarted Controller to answer")
    time.sleep(1.5)
    for loop in loops:
        loop.stop()

    raised = {loop.name: loop.other_errors for loop in loops if loop.other_errors}
    assert not raised, f"errors other than rayk's reached the caller: {raised}"
    assert list(metadata_dir.glob("*.checkpoint")), "the churn made the Controller snapshot its metadata"
    assert cluster.describe_topic("steady")[1]["isr"], "the restored metadata still has the topic"
    assert all(loop.returned for loop in loops), {loop.name: loop.returned for loop in loops}
    create_loop = loops[-1]
    assert not [e for e in create_loop.kafka_errors if isinstance(e, TopicAlreadyExistsError)]
    print("\n" + "; ".join(f"{loop.name}: {loop.returned} returned, {len(loop.kafka_errors)} rayk errors"
                           f"{' (' + repr(loop.kafka_errors[0]) + ')' if loop.kafka_errors else ''}" for loop in loops))


def test_client_calls_raise_only_rayk_errors_while_the_controller_is_away(tmp_path):
    """With the Controller gone for good (killed, no restart), calls that need it fail
    with typed errors within their timeouts instead of Ray's."""
    c = rayk.start(brokers=1, data_dir=tmp_path, config=CONFIG, namespace="controller-gone")
    try:
        c.create_topic("gone", num_partitions=1, replication_factor=1)
        ray.kill(c.controller, no_restart=True)
        # ray.kill returns before the process is gone: a call made meanwhile was answered.
        wait_until(lambda: is_dead(c.controller), 30, "the Controller's death")
        consumer = c.consumer(group_id="g", default_api_timeout_ms=1500, request_timeout_ms=500)
        for call in (lambda: consumer.partitions_for_topic("gone"),
                     lambda: consumer.committed(TopicPartition("gone", 0)),
                     lambda: c.producer(max_block_ms=1500)):
            started = time.monotonic()
            with pytest.raises(KafkaError):
                call()
            assert time.monotonic() - started < 10
        consumer.close()
    finally:
        ray.kill(c.broker(0))  # its replicas go with it; the Controller is gone already
