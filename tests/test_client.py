"""The Python client API against a 3-broker cluster on one Ray node: Producer, Consumer,
consumer groups, Admin."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest
import ray

import rayk
from rayk.client import TopicPartition
from rayk.consumer_protocol import decode_assignment
from rayk.client.partitioner import partition_for_key
from rayk.internal_topics import OFFSETS_TOPIC, coordinator_partition
from rayk.client.admin import NewTopic
from rayk.client.columns import HEADERS_TYPE
from rayk.client.descriptions import ClusterHealth, ConsumerGroupDescription, GroupListing, PartitionDescription, PartitionLag
from rayk.client.producer import Producer
from rayk.storage.records import iter_batches
from rayk.errors import (
    BufferExhaustedError,
    GroupIdNotFoundError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    ProducerFencedError,
    RecordTooLargeError,
    UnknownTopicOrPartitionError,
)
from tests.cluster_helpers import (
    FAST_CONFIG,
    NO_LISTENERS,
    consume_topic,
    pid_of,
    read_replica,
    release_shared_local_ray,
    wait_until,
)
from tests.dataplane_fakes import FakeReplicaEndpoint

RUNS_ON = "own Ray"  # a Ray of its own: tests/conftest.py runs this module before those sharing the local one

CONFIG = {
    **FAST_CONFIG,
    **NO_LISTENERS,  # the Python API's tests: no Kafka protocol
    "group.initial.rebalance.delay.ms": 0,
    "group.min.session.timeout.ms": 1000,
    "num.partitions": 2,
    "default.replication.factor": 3,
    # Small offsets segments and an eager cleaner, so that __consumer_offsets gets compacted;
    # Kafka's layout of several coordinator partitions, so that the compaction test's group
    # shares its partition with few of the module's other groups.
    "offsets.topic.segment.bytes": 4096,
    "offsets.topic.num.partitions": 3,
    "log.cleaner.backoff.ms": 300,
}
_namespaces = itertools.count()
pytestmark = pytest.mark.usefixtures("delete_topics_after_test")


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    release_shared_local_ray()  # a Ray of its own: what it starts dies with it
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("client"), config=CONFIG, namespace="client")
    yield c
    c.shutdown()


_topics = itertools.count()


def new_topic(cluster, partitions=3, replication_factor=3, **config) -> str:
    name = f"t{next(_topics)}"
    cluster.create_topic(name, num_partitions=partitions, replication_factor=replication_factor, config=config or None)
    return name


def test_every_acks_setting_and_codec_round_trips_keys_values_and_headers(cluster):
    topic = new_topic(cluster, partitions=2, replication_factor=2)
    sent = []
    for compression in (None, "gzip", "snappy", "lz4", "zstd"):
        for acks in (0, 1, "all"):
            producer = cluster.producer(acks=acks, compression_type=compression, linger_ms=2)
            for i in range(20):
                key, value = b"k%d" % i, b"%s-%s-%d" % (str(acks).encode(), str(compression).encode(), i)
                producer.send(topic, value=value, key=key, headers=[("h", b"x%d" % i)])
                sent.append((key, value, [("h", b"x%d" % i)]))
            producer.close()
    records = consume_topic(cluster, topic, len(sent))
    assert sorted((r.key, r.value, r.headers) for r in records) == sorted(sent)


def test_acknowledged_metadata_matches_what_consumers_read(cluster):
    topic = new_topic(cluster, replication_factor=1)
    with cluster.producer(acks="all") as producer:
        futures = [producer.send(topic, value=b"v%d" % i, key=b"key-%d" % i) for i in range(300)]
        metas = [f.result(timeout=30) for f in futures]
    for i, meta in enumerate(metas):
        assert meta.partition == partition_for_key(b"key-%d" % i, 3), "murmur2, as Kafka's Java client"
    by_position = {(r.partition, r.offset): r.value for r in consume_topic(cluster, topic, 300)}
    assert {(m.partition, m.offset): b"v%d" % i for i, m in enumerate(metas)} == by_position


def test_records_of_a_partition_arrive_in_send_order(cluster):
    topic = new_topic(cluster, partitions=1, replication_factor=2)
    with cluster.producer(acks=1, linger_ms=1, batch_size=2048) as producer:
        for i in range(3000):
            producer.send(topic, value=b"%06d" % i)
    records = consume_topic(cluster, topic, 3000)
    assert [r.value for r in records] == [b"%06d" % i for i in range(3000)]
    assert [r.offset for r in records] == list(range(3000))


def test_a_callback_given_to_send_gets_its_own_record_once_acknowledged_in_send_order(cluster):
    """send(..., callback=fn), Kafka's send(record, callback): fn gets the record's future
    once the batch is acknowledged, in the order the records were sent, across batches
    and with add_done_callback on the same records."""
    topic = new_topic(cluster, partitions=1, replication_factor=3)
    given, added = [], []
    with cluster.producer(acks="all", linger_ms=1, batch_size=2048) as producer:
        for i in range(3000):
            future = producer.send(topic, value=b"%06d" % i, callback=lambda f, i=i: given.append((i, f.get(0).offset)))
            if i % 7 == 0:
                future.add_done_callback(lambda f, i=i: added.append((i, f.get(0).offset)))
    assert given == [(i, i) for i in range(3000)], "each its own record's offset, in send order"
    assert added == [(i, i) for i in range(0, 3000, 7)]


def test_small_batches_queued_behind_a_call_are_merged_up_to_max_request_size(cluster):
    topic = new_topic(cluster, partitions=1, replication_factor=3)
    settings = dict(batch_size=1024, max_request_size=65_536, max_in_flight_requests_per_connection=1)
    with cluster.producer(acks="all", linger_ms=0, **settings) as producer:
        futures = [producer.send(topic, value=b"%06d" % i + b"v" * 94) for i in range(5000)]
    assert [f.get(5).offset for f in futures] == list(range(5000))
    leader = ray.get(cluster.controller.metadata.remote([topic]))[topic]["partitions"][0]["leader_handle"]
    sizes = [batch.header.size_bytes for batch in iter_batches(ray.get(leader.read_local.remote(0, 1 << 24)))]
    assert sum(1 for size in sizes if size > 1024) > 0, "queued 1 KiB batches went as bigger ones"
    assert max(sizes) <= 65_536
    assert [r.value[:6] for r in consume_topic(cluster, topic, 5000)] == [b"%06d" % i for i in range(5000)]


def test_serializers_msgpack_and_str(cluster):
    topic = new_topic(cluster, partitions=1, replication_factor=1)
    with cluster.producer(value_serializer="msgpack", key_serializer="str") as producer:
        producer.send(topic, value={"user": "ann", "clicks": [1, 2]}, key="ann")
    records = consume_topic(cluster, topic, 1, value_deserializer="msgpack", key_deserializer="str")
    assert (records[0].key, records[0].value) == ("ann", {"user": "ann", "clicks": [1, 2]})


def test_topics_created_without_counts_take_the_broker_defaults(cluster):
    cluster.create_topic("defaults-a")
    cluster.admin().create_topics([NewTopic("defaults-b")])
    for name in ("defaults-a", "defaults-b"):
        partitions = cluster.describe_topic(name)
        assert [len(p["replicas"]) for p in partitions] == [3, 3], "num.partitions 2, default.replication.factor 3"


def test_producer_errors_are_typed(cluster):
    topic = new_topic(cluster, partitions=1, replication_factor=1)
    with cluster.producer(max_request_size=1000) as producer:
        with pytest.raises(RecordTooLargeError):
            producer.send(topic, value=b"x" * 2000)
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("no-such-topic", value=b"x")
        with pytest.raises(TypeError):
            producer.send(topic, value=12345)
    with pytest.raises(ValueError, match="max_request_size"):  # a request must fit in one data plane frame
        cluster.producer(max_request_size=128 * 1024 * 1024)


@ray.remote
class HeldLeader(FakeReplicaEndpoint):
    """A leader replica that holds every produce call until `release()`, to fill the buffer."""

    def __init__(self):
        import asyncio

        self._released = asyncio.Event()
        self.calls = 0

    async def produce(self, batch, acks, timeout_ms):
        from rayk.replication.partition_replica import ProduceResult

        self.calls += 1
        await self._released.wait()
        return ProduceResult(base_offset=0, log_append_time_ms=-1, log_start_offset=0)

    async def release(self):
        self._released.set()

    async def produce_calls(self):
        return self.calls


@ray.remote
class OnePartitionController:
    def __init__(self, leader):
        self._leader = leader

    def init_producer_id(self):
        return 7

    def metadata(self, topics):
        return {t: {"partitions": {0: {"leader_handle": self._leader}}} for t in topics}


class FakeCluster:
    def __init__(self, controller):
        self.controller = controller


def test_send_blocks_while_buffer_memory_is_full_then_raises_buffer_exhausted():
    leader = HeldLeader.remote()
    controller = OnePartitionController.remote(leader)
    # Both actors' processes started first: the producer's InitProducerId has max_block_ms
    # (1.5 s), and a worker process can take longer than that to start on a loaded machine.
    ray.get([leader.produce_calls.remote(), controller.init_producer_id.remote()])
    producer = Producer(
        FakeCluster(controller), buffer_memory=1000, max_block_ms=1500, batch_size=400, linger_ms=0, acks="all"
    )
    futures = [producer.send("t", value=b"x" * 100) for _ in range(8)]  # 8 x 121 bytes fit
    wait_until(lambda: ray.get(leader.produce_calls.remote()) >= 1, 10, "the first batch to reach the leader")
    started = time.monotonic()
    with pytest.raises(BufferExhaustedError):
        producer.send("t", value=b"x" * 100)
    assert 1.5 <= time.monotonic() - started < 10
    with pytest.raises(RecordTooLargeError):  # could never fit, so it fails at once
        producer.send("t", value=b"x" * 2000)
    with pytest.raises(KafkaTimeoutError):
        producer.flush(timeout_s=0.2)

    def release_soon():
        time.sleep(0.3)
        ray.get(leader.release.remote())

    releaser = threading.Thread(target=release_soon)
    releaser.start()
    late = producer.send("t", value=b"y" * 100)  # blocks until the release frees room
    releaser.join()
    producer.flush(timeout_s=30)
    assert all(f.result().offset >= 0 for f in futures + [late])
    producer.close()


@ray.remote
class CountingLeader(FakeReplicaEndpoint):
    """A leader replica that holds produce calls until `release()`, then gives each batch
    the next offsets; it notes how many records each call carried."""

    def __init__(self):
        import asyncio

        self._released = asyncio.Event()
        self._next_offset = 0
        self.records_per_call = []

    async def produce(self, batch, acks, timeout_ms):
        from rayk.replication.partition_replica import ProduceResult
        from rayk.storage.records import BatchHeader

        count = BatchHeader.parse(batch).record_count
        self.records_per_call.append(count)
        await self._released.wait()
        base_offset, self._next_offset = self._next_offset, self._next_offset + count
        return ProduceResult(base_offset=base_offset, log_append_time_ms=-1, log_start_offset=0)

    async def release(self):
        self._released.set()

    async def calls(self):
        return self.records_per_call


def test_queued_batches_of_a_partition_go_merged_in_one_call_and_each_record_learns_its_offset():
    leader = CountingLeader.remote()
    producer = Producer(
        FakeCluster(OnePartitionController.remote(leader)),
        batch_size=200, max_request_size=1300, max_in_flight_requests_per_connection=1, linger_ms=0, acks="all",
    )
    first = producer.send("t", value=b"x" * 100)  # 121 bytes: a batch of one record each
    wait_until(lambda: ray.get(leader.calls.remote()) == [1], 10, "the first batch to reach the leader")
    queued = [producer.send("t", value=b"%03d" % i + b"y" * 97) for i in range(20)]
    ray.get(leader.release.remote())
    producer.flush(timeout_s=30)
    # 1300 bytes hold the 61-byte header and 10 records of 121 bytes: the 19 queued batches
    # go as 10 + 9, and the last one (still open then) with them or after them, by flush.
    records_per_call = ray.get(leader.calls.remote())
    assert records_per_call in ([1, 10, 10], [1, 10, 9, 1])
    assert first.get(5).offset == 0
    assert [f.get(5).offset for f in queued] == list(range(1, 21))
    producer.close()


def test_producer_is_usable_from_a_ray_task(cluster):
    topic = new_topic(cluster, partitions=2, replication_factor=1)
    producer = cluster.producer(acks="all")

    @ray.remote
    def produce_in_task(p, n):
        futures = [p.send(topic, value=b"task-%d" % i) for i in range(n)]
        p.flush()
        return [f.result().offset for f in futures]

    offsets = ray.get(produce_in_task.remote(producer, 50))
    producer.close()
    assert len(offsets) == 50 and min(offsets) >= 0
    assert len(consume_topic(cluster, topic, 50)) == 50


def test_offsets_for_times_end_offsets_and_seek(cluster):
    topic = new_topic(cluster, partitions=1, replication_factor=1)
    with cluster.producer(acks="all") as producer:
        for i in range(10):
            producer.send(topic, value=b"%d" % i, timestamp_ms=1_000_000 + i * 1000)
    consumer = cluster.consumer()
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    assert consumer.end_offsets([tp]) == {tp: 10}
    assert consumer.beginning_offsets([tp]) == {tp: 0}
    assert consumer.offsets_for_times({tp: 1_004_500}) == {tp: (5, 1_005_000)}
    assert consumer.offsets_for_times({tp: 2_000_000}) == {tp: None}
    consumer.seek(tp, 7)
    values = []
    while len(values) < 3:
        values += [r.value for r in consumer.poll(timeout_ms=1000).get(tp, [])]
    assert values == [b"7", b"8", b"9"]
    consumer.close()


def poll_values(consumer, wanted: int) -> dict[int, list[bytes]]:
    """Values per partition from polls until `wanted` records came (at most 30 s)."""
    got: dict[int, list[bytes]] = {}
    deadline = time.monotonic() + 30
    while sum(map(len, got.values())) < wanted and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=500).items():
            got.setdefault(tp.partition, []).extend(r.value for r in records)
    return got


def test_kafka_python_habits_pause_resume_commit_async_and_timeouts(cluster):
    topic = new_topic(cluster, partitions=2, replication_factor=1)
    producer = cluster.producer()
    for p in (0, 1):
        for i in range(5):
            producer.send(topic, value=b"%d-%d" % (p, i), partition=p)
    producer.flush(timeout=30)  # kafka-python's name, in seconds like rayk's timeout_s
    with pytest.raises(TypeError, match="not both"):
        producer.flush(10, timeout=10)
    producer.close(timeout=10)

    consumer = cluster.consumer(group_id="habits", auto_offset_reset="earliest", enable_auto_commit=False)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer.assign([tp0, tp1])
    consumer.pause(tp0)
    assert consumer.paused() == {tp0}
    assert poll_values(consumer, 5) == {1: [b"1-%d" % i for i in range(5)]}
    assert consumer.poll(timeout_ms=300) == {} and consumer.position(tp0) == 0, "a paused partition stays put"
    with pytest.raises(ValueError, match="not assigned"):
        consumer.pause(TopicPartition(topic, 7))
    consumer.resume(tp0)
    assert consumer.paused() == set()
    assert poll_values(consumer, 5) == {0: [b"0-%d" % i for i in range(5)]}

    answers = []
    future = consumer.commit_async(callback=lambda offsets, error: answers.append((offsets, error)))
    assert future.result(timeout=30) is None
    wait_until(lambda: answers, 10, "the commit callback")
    assert answers == [({tp0: (5, ""), tp1: (5, "")}, None)]
    later = consumer.commit_async({tp1: 3})  # close waits for it
    consumer.close(timeout_ms=None)
    assert later.done() and later.exception() is None
    assert cluster.admin().describe_consumer_groups(["habits"])["habits"].partitions[tp1].committed == 3


def test_admin_names_are_one_set_with_typed_results_and_old_spellings_warn(cluster):
    name = f"t{next(_topics)}"
    with pytest.warns(DeprecationWarning, match="num_partitions"):
        created = cluster.create_topic(name, partitions=2, replication_factor=1)
    first = created[0]
    assert isinstance(first, PartitionDescription) and first.leader == first["leader"] in first.replicas
    assert [p.partition for p in cluster.describe_topic(name)] == [0, 1]
    assert dict(first) == {f: getattr(first, f) for f in first} and first == dict(first), "reads as the dict it was"
    assert cluster.admin().describe_topics([name])[name][1].partition == 1

    with cluster.consumer(name, group_id="typed", auto_offset_reset="earliest") as consumer:
        with cluster.producer() as producer:
            producer.send(name, value=b"x", partition=0)
        assert poll_values(consumer, 1) == {0: [b"x"]}
        consumer.commit()
        listed = {g.group_id: g for g in cluster.admin().list_consumer_groups()}
        assert isinstance(listed["typed"], GroupListing) and listed["typed"]["state"] == "Stable"
        group = cluster.admin().describe_consumer_groups(["typed"])["typed"]
        assert isinstance(group, ConsumerGroupDescription) and len(group.members) == 1
        assert group.partitions[TopicPartition(name, 0)] == PartitionLag(committed=1, end_offset=1, lag=0)
        with pytest.warns(DeprecationWarning, match="describe_consumer_groups"):
            assert cluster.admin().describe_consumer_group("typed").partitions == group.partitions

    # One rule for internal topics, on both surfaces: shown only when asked for.
    assert OFFSETS_TOPIC in cluster.list_topics(include_internal=True)
    assert OFFSETS_TOPIC not in cluster.list_topics() and OFFSETS_TOPIC not in cluster.admin().list_topics()
    assert sorted(cluster.list_topics()) == sorted(cluster.admin().list_topics())
    health = cluster.health()
    assert isinstance(health, ClusterHealth) and health.offline_partitions_count == 0 == health["offline_partitions_count"]
    assert sorted(health.brokers) == [0, 1, 2]


def test_producer_retries_across_a_leader_failover_lose_nothing(cluster):
    topic = new_topic(cluster, partitions=1, **{"min.insync.replicas": "2"})
    leader_id = cluster.describe_topic(topic)[0]["leader"]
    producer = cluster.producer(acks="all", linger_ms=2, max_in_flight_requests_per_connection=1)
    futures = []
    for i in range(400):
        futures.append(producer.send(topic, value=b"%05d" % i))
        if i == 150:
            ray.kill(cluster.broker(leader_id))
        time.sleep(0.002)
    producer.flush(timeout_s=60)
    metas = [f.result() for f in futures]  # every record acknowledged despite the failover
    producer.close()
    assert cluster.describe_topic(topic)[0]["leader"] != leader_id
    stored = {r.offset: r.value for r in consume_topic(cluster, topic, metas[-1].offset + 1)}
    assert all(stored[m.offset] == b"%05d" % i for i, m in enumerate(metas))
    cluster.restart_broker(leader_id)
    wait_until(lambda: len(cluster.describe_topic(topic)[0]["isr"]) == 3, 60, "the ISR to heal")


# ---------------------------------------------------------------------- consumer groups


@ray.remote(num_cpus=0, max_concurrency=4)
class GroupMemberActor:
    """A consumer in its own process running its own poll loop, like one instance of a
    consuming service; it commits what it consumed every 200 ms."""

    def __init__(self, cluster, topic, group_id, **settings):
        import threading

        self.consumer = cluster.consumer(
            topic,
            group_id=group_id,
            auto_offset_reset="earliest",
            auto_commit_interval_ms=200,
            session_timeout_ms=2000,
            heartbeat_interval_ms=300,
            **settings,
        )
        self.records, self.assigned = [], []
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._run, daemon=True)
        self._loop.start()

    def _run(self):
        while not self._stop.is_set():
            for records in self.consumer.poll(timeout_ms=200).values():
                self.records += [(r.partition, r.offset, r.value) for r in records]
            self.assigned = sorted(tp.partition for tp in self.consumer.assignment())

    def assignment(self):
        return self.assigned

    def seen(self):
        return list(self.records)

    def close(self):
        self._stop.set()
        self._loop.join()
        self.consumer.close()


def coordinator_view(cluster, group):
    """member id -> partitions, as the group coordinator assigned them (None while rebalancing)."""
    try:
        described = cluster.admin().describe_consumer_groups([group])[group]
    except GroupIdNotFoundError:  # no member has reached the coordinator yet
        return None
    if described["state"] != "Stable":
        return None
    return {
        m["member_id"]: sorted(p for ps in decode_assignment(m["assignment"]).partitions.values() for p in ps)
        for m in described["members"]
    }


def settle(cluster, group, members, timeout_s=60):
    """Waits until the coordinator's stable assignment covers every member and each member
    works on exactly the partitions it was given; returns the assignments."""
    deadline = time.monotonic() + timeout_s
    view = None
    while time.monotonic() < deadline:
        view = coordinator_view(cluster, group)
        mine = sorted(ray.get([m.assignment.remote() for m in members]))
        if view is not None and len(view) == len(members) and sorted(view.values()) == mine:
            return mine
        time.sleep(0.2)
    raise AssertionError(f"group {group} did not settle: coordinator {view}")


@pytest.mark.parametrize("members", [2, 3])
def test_group_members_share_partitions_without_overlap(cluster, members):
    topic = new_topic(cluster, partitions=6, replication_factor=1)
    group = f"share-{members}"
    actors = [GroupMemberActor.remote(cluster, topic, group) for _ in range(members)]
    assignments = settle(cluster, group, actors)
    flat = [p for a in assignments for p in a]
    assert sorted(flat) == list(range(6)), f"{assignments} covers every partition once"
    assert max(map(len, assignments)) - min(map(len, assignments)) <= 1
    ray.get([a.close.remote() for a in actors])


def test_a_group_rebalances_onto_partitions_added_to_its_topic(cluster):
    topic = new_topic(cluster, partitions=2, replication_factor=1)
    actors = [GroupMemberActor.remote(cluster, topic, "grow", metadata_max_age_ms=300) for _ in range(2)]
    assert sorted(p for a in settle(cluster, "grow", actors) for p in a) == [0, 1]
    cluster.admin().create_partitions({topic: 4})
    with cluster.producer(acks="all") as producer:
        for i in range(40):
            producer.send(topic, value=b"%d" % i, partition=i % 4)

    def assigned():
        return sorted(p for a in ray.get([m.assignment.remote() for m in actors]) for p in a)

    wait_until(lambda: assigned() == [0, 1, 2, 3], 30, "the leader to see 4 partitions and the group to rebalance")
    wait_until(lambda: len({v for a in actors for _, _, v in ray.get(a.seen.remote())}) == 40, 30,
               "every record, new partitions' included, to be consumed")
    ray.get([a.close.remote() for a in actors])


def test_a_group_leader_drops_a_deleted_topic_and_takes_it_back_when_it_is_created_again(cluster):
    kept, deleted = new_topic(cluster, partitions=2, replication_factor=1), new_topic(cluster, partitions=1, replication_factor=1)
    consumer = cluster.consumer(kept, deleted, group_id="follows-topics", auto_offset_reset="earliest",
                                metadata_max_age_ms=300)
    seen: list[bytes] = []

    def assigned_after_poll() -> set[TopicPartition]:
        seen.extend(r.value for records in consumer.poll(timeout_ms=200).values() for r in records)
        return consumer.assignment()

    try:
        both = {TopicPartition(kept, 0), TopicPartition(kept, 1), TopicPartition(deleted, 0)}
        wait_until(lambda: assigned_after_poll() == both, 30, "both topics assigned")
        cluster.admin().delete_topics([deleted])
        only_kept = {TopicPartition(kept, 0), TopicPartition(kept, 1)}
        wait_until(lambda: assigned_after_poll() == only_kept, 30, "the leader to rejoin without the deleted topic")
        with cluster.producer(acks="all") as producer:
            producer.send(kept, value=b"after the delete", partition=1)
        wait_until(lambda: assigned_after_poll() and b"after the delete" in seen, 30, "the kept topic still consumed")
        cluster.create_topic(deleted, num_partitions=1, replication_factor=1)
        wait_until(lambda: assigned_after_poll() == both, 30, "the topic, created again, assigned again")
    finally:
        consumer.close()


def test_a_group_subscribed_to_a_topic_not_yet_created_consumes_it_soon_after_it_is(cluster):
    topic = f"later-{next(_topics)}"
    consumer = cluster.consumer(topic, group_id="waits-for-topic", auto_offset_reset="earliest")  # default max age
    try:
        assert consumer.poll(timeout_ms=1_000) == {}
        cluster.create_topic(topic, num_partitions=1, replication_factor=1)
        with cluster.producer(acks="all") as producer:
            producer.send(topic, value=b"first")
        seen: list[bytes] = []

        def consumed() -> bool:
            seen.extend(r.value for records in consumer.poll(timeout_ms=200).values() for r in records)
            return b"first" in seen

        wait_until(consumed, 30, "the topic found within seconds, not metadata.max.age.ms")
    finally:
        consumer.close()


def test_crashed_member_partitions_resume_from_committed_offsets(cluster):
    topic = new_topic(cluster, partitions=4, replication_factor=1)
    with cluster.producer(acks="all") as producer:
        for i in range(400):
            producer.send(topic, value=b"%d" % i, partition=i % 4)
    a, b = GroupMemberActor.remote(cluster, topic, "crash"), GroupMemberActor.remote(cluster, topic, "crash")
    settle(cluster, "crash", [a, b])

    def fully_committed():
        partitions = cluster.admin().describe_consumer_groups(["crash"])["crash"]["partitions"]
        return len(partitions) == 4 and all(v["lag"] == 0 for v in partitions.values())

    wait_until(fully_committed, 30, "both members to consume and commit everything")
    before = {v for _, _, v in ray.get(a.seen.remote()) + ray.get(b.seen.remote())}
    assert len(before) == 400

    ray.kill(a)  # no LeaveGroup: the coordinator notices when its session times out
    seen_by_b = len(ray.get(b.seen.remote()))
    with cluster.producer(acks="all") as producer:
        for i in range(400, 480):
            producer.send(topic, value=b"%d" % i, partition=i % 4)
    wait_until(lambda: ray.get(b.assignment.remote()) == [0, 1, 2, 3], 30, "b to take over every partition")
    wait_until(lambda: len(ray.get(b.seen.remote())) >= seen_by_b + 80, 30, "b to read the new records")
    after = [int(v) for _, _, v in ray.get(b.seen.remote())[seen_by_b:]]
    assert sorted(after) == list(range(400, 480)), "exactly the records after the committed offsets"
    ray.get(b.close.remote())


def test_describing_an_unknown_group_is_group_id_not_found(cluster):
    with pytest.raises(GroupIdNotFoundError):
        cluster.admin().describe_consumer_groups(["never-used"])["never-used"]


def test_offsets_survive_a_coordinator_failover_while_members_commit(cluster):
    """The broker leading the group's __consumer_offsets partition dies while two members
    consume and commit: the partition's new leader takes over as coordinator with every
    committed offset, the members find it, and nobody reads from the start again."""
    topic = new_topic(cluster, partitions=4)
    group = "failover"
    with cluster.producer(acks="all") as producer:
        for i in range(400):
            producer.send(topic, value=b"%d" % i, partition=i % 4)
    members = [GroupMemberActor.remote(cluster, topic, group) for _ in range(2)]
    settle(cluster, group, members)

    def committed():
        return {tp.partition: v["committed"] for tp, v in cluster.admin().describe_consumer_groups([group])[group]["partitions"].items()}

    wait_until(lambda: committed() == {p: 100 for p in range(4)}, 30, "the members to commit everything")
    offsets_partition = coordinator_partition(group, len(cluster.describe_topic(OFFSETS_TOPIC)))
    before = cluster.describe_topic(OFFSETS_TOPIC)[offsets_partition]
    seen_before = [len(ray.get(m.seen.remote())) for m in members]

    ray.kill(cluster.broker(before["leader"]))
    with cluster.producer(acks="all") as producer:  # the members keep consuming and committing
        for i in range(400, 480):
            producer.send(topic, value=b"%d" % i, partition=i % 4)
    wait_until(
        lambda: cluster.describe_topic(OFFSETS_TOPIC)[offsets_partition]["leader"] not in (before["leader"], -1),
        30, "a new coordinator",
    )
    wait_until(lambda: committed() == {p: 120 for p in range(4)}, 60, "commits to reach the new coordinator")
    after = [int(v) for m, n in zip(members, seen_before) for _, _, v in ray.get(m.seen.remote())[n:]]
    assert set(range(400, 480)) <= set(after)
    reread = [v for v in after if v < 400]
    assert not reread, f"records before the committed offsets were read again: {reread[:10]}"
    ray.get([m.close.remote() for m in members])
    cluster.restart_broker(before["leader"])
    wait_until(
        lambda: len(cluster.describe_topic(OFFSETS_TOPIC)[offsets_partition]["isr"]) == len(before["isr"]),
        60, "the __consumer_offsets ISR to heal",
    )


def test_a_new_coordinator_replays_a_compacted_offsets_topic(cluster):
    """Every commit is a record in __consumer_offsets. The brokers' cleaners compact each
    replica's copy, so a coordinator taking over replays each key's latest record plus the
    uncleaned tail, not every commit ever made, and still answers the latest offsets."""
    topic = new_topic(cluster, partitions=2, replication_factor=1)
    group = "compacted-offsets"
    commits = 400
    with cluster.consumer(group_id=group, enable_auto_commit=False) as consumer:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        for i in range(1, commits + 1):
            consumer.commit({TopicPartition(topic, 0): i, TopicPartition(topic, 1): 2 * i})
    partition = coordinator_partition(group, len(cluster.describe_topic(OFFSETS_TOPIC)))
    before = cluster.describe_topic(OFFSETS_TOPIC)[partition]

    def records_in(broker_id):
        return sum(1 for _ in read_replica(cluster.replica(OFFSETS_TOPIC, partition, broker_id)))

    for broker_id in before["isr"]:  # every replica compacts its own copy, down to ~60 records (measured)
        wait_until(
            lambda b=broker_id: records_in(b) < commits // 4, 60, f"broker {broker_id}'s cleaner to compact the offsets"
        )
    os.kill(pid_of(cluster.replica(OFFSETS_TOPIC, partition, before["leader"])), signal.SIGKILL)
    wait_until(
        lambda: cluster.describe_topic(OFFSETS_TOPIC)[partition]["leader"] not in (before["leader"], -1),
        30, "a new coordinator",
    )
    after = cluster.describe_topic(OFFSETS_TOPIC)[partition]
    loaded = ray.get(cluster.replica(OFFSETS_TOPIC, partition, after["leader"]).describe.remote())["coordinator_load"]
    # 800 offset records were written; compacted, about 50 are left (measured), ~0.5 ms to load.
    assert loaded["records"] < commits // 2, f"the new coordinator replayed {loaded} for {2 * commits} offset records"
    offsets = cluster.admin().describe_consumer_groups([group])[group]["partitions"]
    assert {tp.partition: v["committed"] for tp, v in offsets.items()} == {0: commits, 1: 2 * commits}
    wait_until(  # the restarted replica copies the new leader's compacted log, gaps and all
        lambda: len(cluster.describe_topic(OFFSETS_TOPIC)[partition]["isr"]) == len(before["isr"]),
        60, "the killed replica to catch up with the compacted log and rejoin the ISR",
    )


def test_committed_offsets_survive_a_cluster_restart(tmp_path):
    """One broker: what is under test is the group's offsets coming back from the
    __consumer_offsets log on disk (test_cluster_local restarts replicated clusters)."""
    namespace = f"restart-{next(_namespaces)}"
    config = {**CONFIG, "default.replication.factor": 1, "offsets.topic.replication.factor": 1}
    c = rayk.start(brokers=1, data_dir=tmp_path, config=config, namespace=namespace)
    c.create_topic("orders", num_partitions=2, replication_factor=1)
    with c.producer(acks="all") as producer:
        for i in range(400):  # 200 per partition: neither is used up by the first 60 reads
            producer.send("orders", value=b"%d" % i, partition=i % 2)
    consumer = c.consumer("orders", group_id="billing", auto_offset_reset="earliest", enable_auto_commit=False)
    got = 0
    while got < 60:
        got += sum(len(v) for v in consumer.poll(timeout_ms=500, max_records=60 - got).values())
    consumer.commit()
    positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
    consumer.close(autocommit=False)
    c.shutdown()

    again = rayk.start(brokers=1, data_dir=tmp_path, config=config, namespace=namespace)
    try:
        consumer = again.consumer("orders", group_id="billing", auto_offset_reset="earliest")
        first = {}
        deadline = time.monotonic() + 30
        while len(first) < 2 and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                first.setdefault(tp, records[0].offset)
        assert first == positions, "each partition resumes at its committed offset"
        consumer.close()
    finally:
        again.shutdown()


# ---------------------------------------------------------------------------- send_batch


def test_send_batch_puts_keys_where_send_does_and_answers_every_record_s_offset(cluster):
    topic = new_topic(cluster, partitions=3, replication_factor=1)
    producer = cluster.producer()
    n = 500
    keys = [b"k%d" % i for i in range(n)]
    values = [b"v%d" % i for i in range(n)]
    headers = pa.array([[{"key": "i", "value": b"%d" % i}] if i % 2 else None for i in range(n)], HEADERS_TYPE)
    single = [producer.send(topic, value=b"one", key=k) for k in keys[:20]]
    key_column = np.empty(n, dtype=object)
    key_column[:] = keys
    future = producer.send_batch(
        topic, pa.array(values), keys=key_column, headers=headers, timestamps_ms=np.arange(n) + 10**12
    )
    result = future.result(30)
    producer.close()
    assert future.done() and result.topic == topic
    assert [f.get(5).partition for f in single] == result.partitions[:20].tolist()
    assert result.partitions.tolist() == [partition_for_key(k, 3) for k in keys]
    assert sum(b.record_count for b in result.batches) == n
    for batch in result.batches:  # one offset range per batch, the rows of its partition
        mine = np.sort(result.offsets[result.partitions == batch.partition])
        assert batch.base_offset in mine and batch.last_offset in mine
    by_place = {(r.partition, r.offset): r for r in consume_topic(cluster, topic, n + 20)}
    assert len(by_place) == n + 20
    for i in range(n):
        record = by_place[(int(result.partitions[i]), int(result.offsets[i]))]
        assert (record.key, record.value, record.timestamp) == (keys[i], values[i], 10**12 + i)
        assert record.headers == ([("i", b"%d" % i)] if i % 2 else [])


def test_send_batch_follows_send_in_a_partition_and_moves_the_sticky_partition_per_batch(cluster):
    topic = new_topic(cluster, partitions=3, replication_factor=1)
    producer = cluster.producer(max_request_size=10_000)  # ~90 records of 100 B a batch
    first = producer.send(topic, b"first", partition=1)
    pinned = producer.send_batch(topic, [b"x" * 100] * 300, partition=1, headers=[("h", b"v")]).result(30)
    assert first.get(5).offset == 0
    assert pinned.offsets.tolist() == list(range(1, 301)) and len(pinned.batches) >= 3
    spread = producer.send_batch(topic, np.zeros((1000, 100), dtype=np.uint8)).result(30)
    assert len(spread.batches) >= 10 and len(set(spread.partitions.tolist())) == 3
    for batch in spread.batches:  # a batch goes to one partition, whole
        assert batch.last_offset - batch.base_offset + 1 == batch.record_count
    mixed = producer.send_batch(topic, [b"a", b"b", b"c"], keys=[b"k", None, b"k"], partition=[-1, 0, 2]).result(30)
    assert mixed.partitions.tolist() == [partition_for_key(b"k", 3), 0, 2]
    empty = producer.send_batch(topic, []).result(5)
    assert empty.batches == [] and len(empty.offsets) == 0
    producer.close()


def test_send_batch_refuses_bad_input_with_typed_errors_and_writes_nothing(cluster):
    topic = new_topic(cluster, partitions=2, replication_factor=1)
    producer = cluster.producer(max_request_size=2_000)
    with pytest.raises(ValueError, match=r"partitions 0\.\.1, not 5"):
        producer.send_batch(topic, [b"a"], partition=5)
    with pytest.raises(ValueError, match="partition must be an int or 1 ints"):
        producer.send_batch(topic, [b"a"], partition=[0, 1])
    with pytest.raises(TypeError, match="values must be bytes"):
        producer.send_batch(topic, [1, 2])
    with pytest.raises(RecordTooLargeError):
        producer.send_batch(topic, [b"a", b"b", b"x" * 5_000])  # refused whole: a and b are not sent either
    with pytest.raises(ValueError, match="keys has 1 rows"):
        producer.send_batch(topic, [b"a", b"b"], keys=[b"k"])
    producer.close()
    consumer = cluster.consumer()
    partitions = [TopicPartition(topic, p) for p in range(2)]
    assert consumer.end_offsets(partitions) == {tp: 0 for tp in partitions}
    consumer.close()


# ---------------------------------------------------------------------------- transactions


def test_a_transactional_producer_commits_aborts_and_commits_a_groups_offsets_with_its_transaction(cluster):
    """Producer(transactional_id=...): only what a committed transaction sent (by `send`
    and `send_batch`) is read_committed; an aborted one's records are read_uncommitted only;
    a consumer's offsets sent with a transaction are committed with it, and not when it
    aborts; outside a transaction `send` is refused."""
    source, sink, group = new_topic(cluster, partitions=1), new_topic(cluster, partitions=2), "py-ctp"
    with cluster.producer() as plain:
        for i in range(6):
            plain.send(source, b"m%d" % i)
    producer = cluster.producer(transactional_id=f"py-tx-{sink}")
    consumer = cluster.consumer(source, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        with pytest.raises(InvalidTxnStateError):
            producer.begin_transaction()  # before init_transactions
        producer.init_transactions()
        with pytest.raises(InvalidTxnStateError):
            producer.send(sink, b"outside")
        producer.begin_transaction()
        producer.send(sink, b"c0", key=b"k")
        producer.send(sink, b"c1")
        producer.send_batch(sink, [b"c2", b"c3"])
        producer.commit_transaction()

        producer.begin_transaction()
        producer.send(sink, b"aborted", partition=0)
        producer.flush()
        producer.abort_transaction()
        for end in (producer.abort_transaction, producer.commit_transaction):  # nothing added: ended here
            producer.begin_transaction()
            end()

        def transform(commit: bool) -> None:
            records: list = []
            while len(records) < 3:
                records += [r for batch in consumer.poll(timeout_ms=500, max_records=3 - len(records)).values() for r in batch]
            producer.begin_transaction()
            for r in records:
                producer.send(sink, r.value.upper(), partition=1)
            tp = TopicPartition(source, 0)
            producer.send_offsets_to_transaction({tp: consumer.position(tp)}, consumer.group_metadata())
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
                consumer.seek(tp, consumer.committed(tp) or 0)

        transform(commit=True)
        assert consumer.committed(TopicPartition(source, 0)) == 3
        transform(commit=False)
        assert consumer.committed(TopicPartition(source, 0)) == 3, "an abort commits no offsets"
        transform(commit=True)
        assert consumer.committed(TopicPartition(source, 0)) == 6
    finally:
        consumer.close()
        producer.close()
    committed = {r.value for r in consume_topic(cluster, sink, 10, isolation_level="read_committed")}
    assert committed == {b"c0", b"c1", b"c2", b"c3", b"M0", b"M1", b"M2", b"M3", b"M4", b"M5"}
    everything = [r.value for r in consume_topic(cluster, sink, 14)]
    assert b"aborted" in everything and everything.count(b"M3") == 2, "the aborted round's records are in the log"


def test_a_transactional_producer_fenced_by_a_newer_one_fails_for_good(cluster):
    topic, txn_id = new_topic(cluster, partitions=1, replication_factor=1), f"py-fence-{uuid.uuid4().hex[:6]}"
    zombie = cluster.producer(transactional_id=txn_id)
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send(topic, b"zombie").get(timeout=30)
    successor = cluster.producer(transactional_id=txn_id)
    successor.init_transactions()  # aborts the zombie's transaction
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction()
    with pytest.raises(ProducerFencedError):
        zombie.begin_transaction()  # fatal: every later call raises it
    successor.begin_transaction()
    successor.send(topic, b"successor")
    successor.commit_transaction()
    zombie.close()
    successor.close()
    assert [r.value for r in consume_topic(cluster, topic, 1, isolation_level="read_committed")] == [b"successor"]


def test_a_read_committed_consumer_reset_to_latest_during_an_open_transaction_reads_it_whole(cluster):
    """Kafka's "latest" for read_committed is the LSO: a consumer that starts while a
    transaction is open starts at its first record, not at the high watermark past its
    records (from where it would see none of them once it commits)."""
    topic = new_topic(cluster, partitions=1, replication_factor=1)
    tp = TopicPartition(topic, 0)
    with cluster.producer() as plain:
        plain.send(topic, b"before").get(timeout=30)
    producer = cluster.producer(transactional_id=f"py-latest-{topic}")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_batch(topic, [b"t0", b"t1"])
    producer.flush()  # the LSO 1, the high watermark 3
    consumer = cluster.consumer(auto_offset_reset="latest", isolation_level="read_committed", enable_auto_commit=False)
    consumer.assign([tp])
    # poll's own reset (position() would look the offset up itself, blocking)
    wait_until(lambda: not consumer.poll(timeout_ms=200) and tp in consumer._positions.offsets, 30, "poll's reset")
    assert consumer.position(tp) == 1, "the LSO: the open transaction's first record"
    producer.commit_transaction()
    producer.close()
    records: list = []
    deadline = time.monotonic() + 30
    while len(records) < 2 and time.monotonic() < deadline:
        records += [r for batch in consumer.poll(timeout_ms=500).values() for r in batch]
    consumer.close()
    assert [(r.offset, r.value) for r in records] == [(1, b"t0"), (2, b"t1")], "the whole transaction"


def test_a_commit_whose_marker_is_pending_when_its_partition_leader_is_killed_completes_after_it(cluster):
    """The transactions issue's failure: the partition's followers are stopped until its ISR
    is the leader alone, below min.insync.replicas, so the leader refuses the COMMIT marker
    the coordinator writes after EndTxn (NOT_ENOUGH_REPLICAS); then the leader's process is
    SIGKILLed with the marker pending, and the followers resume. The coordinator retries
    the marker until the partition takes it: read_committed readers see the transaction
    whole, and the LSO moves on."""
    topic = new_topic(cluster, partitions=1, **{"min.insync.replicas": "2"})
    tp = TopicPartition(topic, 0)
    producer = cluster.producer(transactional_id=f"py-marker-{topic}")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_batch(topic, [b"t0", b"t1", b"t2"])
    producer.flush()  # acks=all: every replica has the records
    partition = cluster.describe_topic(topic)[0]

    def followers_known() -> list | None:  # a handle is None until its broker answered the Controller's push
        handles = [cluster.replica(topic, 0, b) for b in partition["replicas"] if b != partition["leader"]]
        return handles if all(handles) else None

    followers = wait_until(followers_known, 30, "the followers' handles")
    for follower in followers:
        os.kill(pid_of(follower), signal.SIGSTOP)
    try:
        wait_until(lambda: cluster.describe_topic(topic)[0]["isr"] == [partition["leader"]], 30, "the ISR to shrink")
        # The Controller commits the shrink before the leader reads its answer; until then the
        # leader still counts the old ISR (Kafka's pending shrink does too) and takes the marker.
        leader = cluster.leader(topic, 0)
        wait_until(lambda: ray.get(leader.describe.remote())["isr"] == [partition["leader"]], 30,
                   "the leader to learn the shrink")
        producer.commit_transaction()  # answered once the decision is written; the marker is pending
        time.sleep(0.5)
        assert cluster.describe_topic(topic)[0]["log_end_offset"] == 3, "the marker refused below min ISR"
        os.kill(pid_of(leader), signal.SIGKILL)
    finally:
        for follower in followers:
            os.kill(pid_of(follower), signal.SIGCONT)
    committed = consume_topic(cluster, topic, 3, isolation_level="read_committed")
    assert [r.value for r in committed] == [b"t0", b"t1", b"t2"]
    with cluster.consumer(enable_auto_commit=False, isolation_level="read_committed") as reader:
        assert reader.end_offsets([tp])[tp] == cluster.describe_topic(topic)[0]["high_watermark"] == 4, (
            "the LSO moved on past the 3 records and the COMMIT marker")
    producer.begin_transaction()
    producer.send(topic, b"next")
    producer.commit_transaction()
    producer.close()
    wait_until(lambda: len(cluster.describe_topic(topic)[0]["isr"]) == 3, 60, "the ISR to heal")
