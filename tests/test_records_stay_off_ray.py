"""Records never ride a Ray call (the data-plane issue's "done when"): produced through the
Python Producer and through a Kafka client at the listener, replicated to every follower,
and read back through the Python Consumer and a Kafka client, they move only over the data
plane, while Ray carries the control calls (metadata, elections, offsets, ...).

Every process on the records' path (this driver, the listeners, the partition replicas,
the brokers' ReplicaManagers) records each actor call it makes for the workload's length,
with the bytes and text its arguments and its answer hold: `ActorHandle._actor_method_call`
is what every `handle.method.remote(...)` goes through, and the answer is sized when the
call completes (an answer still awaited at the end counts 0: a long poll of control)."""

from __future__ import annotations

import time
from typing import Any

import confluent_kafka
import pytest
import ray

import rayk
from rayk.client import TopicPartition
from tests.cluster_helpers import FAST_CONFIG, shared_local_ray, wait_until

RECORD_BYTES = 1024
RECORDS_PER_PATH = 1_000
PARTITIONS = 3
LARGEST_CONTROL_CALL_BYTES = 8 * 1024  # a record batch of this workload is several times this


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("records-off-ray"),
                   config={**FAST_CONFIG, "min.insync.replicas": 2}, namespace="records-off-ray")
    yield c
    c.shutdown()


def _payload_bytes(value: Any, depth: int = 0) -> int:
    """The bytes and text a call's arguments or answer hold, walked (not pickled: pickling
    an ObjectRef or actor handle outside Ray's own calls would pin it for good)."""
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return len(value)
    if depth > 8 or isinstance(value, (ray.ObjectRef, ray.actor.ActorHandle)):
        return 0
    if isinstance(value, dict):
        return sum(_payload_bytes(k, depth + 1) + _payload_bytes(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(_payload_bytes(v, depth + 1) for v in value)
    fields = getattr(value, "__dict__", None)
    if fields is None and hasattr(value, "__slots__"):
        fields = {name: getattr(value, name, None) for name in value.__slots__}
    return _payload_bytes(fields, depth + 1) if fields else 0


def _recording(calls: list[list]) -> Any:
    """`ActorHandle._actor_method_call` keeping each call as [method, argument bytes,
    answer bytes] in `calls` (the answer's once it came)."""
    call = ray.actor.ActorHandle._actor_method_call

    def recording(handle, method_name, args=None, kwargs=None, *rest, **options):
        ref = call(handle, method_name, args, kwargs, *rest, **options)
        if not method_name.startswith("__ray"):  # the test's own probes
            entry = [method_name, _payload_bytes((args, kwargs)), 0]
            calls.append(entry)
            if isinstance(ref, ray.ObjectRef):
                ref._on_completed(lambda answer: entry.__setitem__(2, _payload_bytes(answer)))
        return ref

    return recording


def _start_recording(actor: Any) -> None:
    """In an actor's process, for the rest of its life (the module's cluster ends with it):
    each actor call it makes is kept in `actor._recorded_ray_calls`."""
    actor._recorded_ray_calls = []
    ray.actor.ActorHandle._actor_method_call = _recording(actor._recorded_ray_calls)


def _recorded(actor: Any) -> list[list]:
    return list(actor._recorded_ray_calls)


def _record_path_actors(cluster: Any) -> dict[str, Any]:
    """Label -> handle of every listener, partition replica and ReplicaManager."""
    out = {}
    for broker in cluster.brokers():
        broker_id = broker["broker_id"]
        manager = cluster.broker(broker_id)
        out[f"ReplicaManager {broker_id}"] = manager
        out[f"listener {broker_id}"] = ray.get(manager.listener.remote())
        for key, handle in ray.get(manager.replica_handles.remote()).items():
            out[f"replica {key} on broker {broker_id}"] = handle
    return out


def _replicas_caught_up(cluster: Any, topic: str, expected: int) -> bool:
    ends = [ray.get(cluster.replica(topic, p.partition, b).describe.remote())["log_end_offset"]
            for p in cluster.describe_topic(topic) for b in p.replicas]
    return sum(ends) == 3 * expected


def test_no_ray_call_carries_records_on_the_produce_replication_or_consume_paths(cluster, monkeypatch):
    topic = "records-off-ray"
    cluster.create_topic(topic, num_partitions=PARTITIONS, replication_factor=3)
    bootstrap = cluster.bootstrap_servers
    warm = cluster.producer(acks="all")  # metadata and connections settle before the recording
    warm.send(topic, b"warm-up", partition=0).get(timeout=30)
    warm.close()
    actors = _record_path_actors(cluster)
    ray.get([handle.__ray_call__.remote(_start_recording) for handle in actors.values()])
    driver_calls: list[list] = []
    monkeypatch.setattr(ray.actor.ActorHandle, "_actor_method_call", _recording(driver_calls))
    value = bytes(range(256)) * (RECORD_BYTES // 256)

    producer = cluster.producer(acks="all")
    for i in range(RECORDS_PER_PATH):
        producer.send(topic, value, partition=i % PARTITIONS)
    producer.flush(timeout=60)
    producer.close()
    kafka_producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                                               "enable.idempotence": True})  # a retry writes nothing twice
    for i in range(RECORDS_PER_PATH):
        kafka_producer.produce(topic, value, partition=i % PARTITIONS)
    assert kafka_producer.flush(60) == 0, "every record delivered"
    del kafka_producer  # librdkafka's threads end with it
    expected = 2 * RECORDS_PER_PATH + 1
    wait_until(lambda: _replicas_caught_up(cluster, topic, expected), 60, "every follower to hold every record")

    consumer = cluster.consumer(auto_offset_reset="earliest", consumer_timeout_ms=10_000)
    consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
    read_by_rayk = sum(1 for _, record in zip(range(expected), consumer) if record.value == value)
    consumer.close(autocommit=False)
    kafka_consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "records-off-ray",
                                               "enable.auto.commit": False})
    kafka_consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    read_by_kafka, deadline = 0, time.monotonic() + 60
    while read_by_kafka < 2 * RECORDS_PER_PATH and time.monotonic() < deadline:
        for message in kafka_consumer.consume(500, 0.5):
            read_by_kafka += message.error() is None and message.value() == value
    kafka_consumer.close()
    assert read_by_rayk == read_by_kafka == 2 * RECORDS_PER_PATH

    recorded = {"driver": driver_calls}
    recorded |= dict(zip(actors, ray.get([h.__ray_call__.remote(_recorded) for h in actors.values()])))
    assert all(recorded[label] for label in actors if label.startswith("ReplicaManager")), \
        "the recording ran in the actors (a broker heartbeats its Controller every 400 ms)"
    calls = [(who, method, sent, answered) for who, entries in recorded.items() for method, sent, answered in entries]
    record_bytes = 2 * RECORDS_PER_PATH * RECORD_BYTES * (1 + 2 + 2)  # produced once, replicated twice, read twice
    largest = max(calls, key=lambda c: max(c[2], c[3]))
    assert max(largest[2], largest[3]) < LARGEST_CONTROL_CALL_BYTES, f"a Ray call carried records: {largest}"
    total = sum(sent + answered for _, _, sent, answered in calls)
    assert total < record_bytes / 100, f"{total} bytes in {len(calls)} Ray calls against {record_bytes} of records"
