"""Records never ride a Ray call (the data-plane issue's "done when"): produced through the
Python Producer and through a Kafka client at the listener, replicated to every follower,
and read back through the Python Consumer and a Kafka client, they move only over the data
plane, while Ray carries the control calls (metadata, elections, offsets, ...).

Every process on the records' path (this driver, the listeners, the partition replicas,
the brokers' ReplicaManagers) records each actor call it makes for the workload's length,
with the pickled size of its arguments and of its answer: `ActorHandle._actor_method_call`
is what every `handle.method.remote(...)` goes through, and the answer is sized when the
call completes."""

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


def _pickled_bytes(value: Any) -> int:
    try:
        return len(ray.cloudpickle.dumps(value))
    except Exception:  # an actor handle outside a Ray call, a lock: not records either way
        return 0


def _start_recording(actor: Any = None) -> None:
    """In the process it runs in: from now on, each actor call it makes is kept as
    [method, argument bytes, answer bytes] in `actor._recorded_ray_calls` (or, in the
    driver, in `_start_recording.calls`)."""
    import ray.actor

    calls: list[list] = []
    call = ray.actor.ActorHandle._actor_method_call

    def recording(handle, method_name, args=None, kwargs=None, *rest, **options):
        ref = call(handle, method_name, args, kwargs, *rest, **options)
        if not method_name.startswith("__ray"):  # the test's own probes
            entry = [method_name, _pickled_bytes((args, kwargs)), 0]
            calls.append(entry)
            if isinstance(ref, ray.ObjectRef):
                ref._on_completed(lambda answer: entry.__setitem__(2, _pickled_bytes(answer)))
        return ref

    ray.actor.ActorHandle._actor_method_call = recording
    if actor is None:
        _start_recording.calls = calls
    else:
        actor._recorded_ray_calls = calls


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


def test_no_ray_call_carries_records_on_the_produce_replication_or_consume_paths(cluster):
    topic = "records-off-ray"
    cluster.create_topic(topic, num_partitions=PARTITIONS, replication_factor=3)
    bootstrap = cluster.bootstrap_servers
    warm = cluster.producer(acks="all")  # metadata and connections settle before the recording
    warm.send(topic, b"warm-up", partition=0).get(timeout=30)
    warm.close()
    actors = _record_path_actors(cluster)
    ray.get([handle.__ray_call__.remote(_start_recording) for handle in actors.values()])
    _start_recording()
    value = bytes(range(256)) * (RECORD_BYTES // 256)

    producer = cluster.producer(acks="all")
    for i in range(RECORDS_PER_PATH):
        producer.send(topic, value, partition=i % PARTITIONS)
    producer.flush(timeout=60)
    producer.close()
    kafka_producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS_PER_PATH):
        kafka_producer.produce(topic, value, partition=i % PARTITIONS)
    assert kafka_producer.flush(60) == 0, "every record delivered"
    expected = 2 * RECORDS_PER_PATH + 1
    wait_until(lambda: _replicas_caught_up(cluster, topic, expected), 60, "every follower to hold every record")

    consumer = cluster.consumer(auto_offset_reset="earliest", consumer_timeout_ms=10_000)
    consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
    read_by_rayk = sum(1 for record, _ in zip(consumer, range(expected)) if record.value == value)
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

    recorded = {"driver": _start_recording.calls}
    recorded |= dict(zip(actors, ray.get([h.__ray_call__.remote(_recorded) for h in actors.values()])))
    calls = [(who, method, sent, answered) for who, entries in recorded.items() for method, sent, answered in entries]
    record_bytes = 2 * RECORDS_PER_PATH * RECORD_BYTES * (1 + 2 + 2)  # produced once, replicated twice, read twice
    largest = max(calls, key=lambda c: max(c[2], c[3]))
    assert max(largest[2], largest[3]) < LARGEST_CONTROL_CALL_BYTES, f"a Ray call carried records: {largest}"
    total = sum(sent + answered for _, _, sent, answered in calls)
    assert total < record_bytes / 100, f"{total} bytes in {len(calls)} Ray calls against {record_bytes} of records"
    assert calls, "the recording saw the control calls (else it saw nothing at all)"
