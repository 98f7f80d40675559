"""Real Kafka clients (kafka-python, confluent-kafka / librdkafka, aiokafka, kcat) against
rayk's listeners: metadata, produce with every acks setting and codec, consume with
assign + seek and with subscribe in a group, offsets shared with rayk's own groups,
records crossing between the Python API and Kafka clients both ways."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import struct
import subprocess
import threading
import time
import uuid
from typing import Any

import aiokafka
import confluent_kafka
import confluent_kafka.admin
import kafka
import pytest
import ray
from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
from kafka.structs import TopicPartition as KafkaTopicPartition

import rayk
from rayk.coordinator.group.offset_records import CommittedOffset, offset_key, offset_value
from rayk.client import TopicPartition
from rayk.client.partitioner import partition_for_key
from rayk.config import BrokerConfig
from rayk.errors import FencedInstanceIdError, InvalidTopicError, UnknownTopicOrPartitionError, UnreleasedInstanceIdError
from rayk.internal_topics import OFFSETS_TOPIC, coordinator_partition
from rayk.net.api_versions import (
    ADD_PARTITIONS_TO_TXN,
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    CREATE_TOPICS,
    DESCRIBE_GROUPS,
    DESCRIBE_PRODUCERS,
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    FETCH,
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
    LEAVE_GROUP,
    LIST_GROUPS,
    METADATA,
    PRODUCE,
)
from rayk.net import native_produce
from rayk.net.entities import kafka_uuid
from rayk.storage.records import SimpleRecord, build_batch, iter_batches
from tests.cluster_helpers import FAST_CONFIG, shared_local_ray, wait_until
from tests.protocol_helpers import RawConnection, request_frame, sized

HEARTBEAT_INTERVAL_MS = 500  # KIP-848 members' (the broker's setting)
CONFIG = {
    **FAST_CONFIG,
    "group.initial.rebalance.delay.ms": 0,
    "group.min.session.timeout.ms": 1000,
    "num.partitions": 3,
    "default.replication.factor": 1,  # topics made on first use (each replica is a process to start)
    "auto.leader.rebalance.enable": False,  # leaders move back only when a test asks
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 500,  # an abandoned transaction's abort
    "group.consumer.heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
    "group.consumer.session.timeout.ms": 6000,
    # Kafka's layout of the internal topics, which tests here check: more than one
    # coordinator partition (FAST_CONFIG has one of each).
    "offsets.topic.num.partitions": 3,
    "transaction.state.log.num.partitions": 3,
}
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
_names = itertools.count()
pytestmark = pytest.mark.usefixtures("delete_topics_after_test")


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("kafka-clients"), config=CONFIG, namespace="kafka-clients")
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def bootstrap(cluster):
    return cluster.bootstrap_servers


def new_topic(cluster, partitions=3, replication_factor=3) -> str:
    name = f"k{next(_names)}"
    cluster.create_topic(name, num_partitions=partitions, replication_factor=replication_factor)
    return name


def kafka_python_read(bootstrap, topic, expected, partitions=3, **settings):
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **settings)
    consumer.assign([KafkaTopicPartition(topic, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    records = []
    deadline = time.monotonic() + 30
    while len(records) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            records += batch
    consumer.close()
    return records


def test_a_metadata_request_creates_consumer_offsets_with_its_own_settings_only(cluster, bootstrap):
    """Runs first in this module, before a group has created __consumer_offsets: a Metadata
    request naming it creates it with offsets.topic.* (compacted), never with the defaults
    for client topics, as Kafka's AutoTopicCreationManager does."""
    assert OFFSETS_TOPIC not in cluster.list_topics(include_internal=True), "this test runs before any group is used"
    connection = RawConnection(bootstrap)
    try:
        answer = connection.call(METADATA, 12, {"topics": [{"name": OFFSETS_TOPIC, "topic_id": None}],
                                                "allow_auto_topic_creation": True,
                                                "include_topic_authorized_operations": False})
    finally:
        connection.close()
    assert answer.topics[0].error_code.value == 5  # LEADER_NOT_AVAILABLE: being created
    wait_until(lambda: OFFSETS_TOPIC in cluster.list_topics(include_internal=True), 30, "__consumer_offsets to be created")
    offsets_topic = BrokerConfig()  # CONFIG keeps offsets.topic.* at their defaults
    configs = cluster.admin().describe_topic_configs(OFFSETS_TOPIC)
    assert configs == {"cleanup.policy": "compact", "segment.bytes": str(offsets_topic.offsets_topic_segment_bytes)}
    described = cluster.describe_topic(OFFSETS_TOPIC)
    assert len(described) == offsets_topic.offsets_topic_num_partitions
    assert all(len(p["replicas"]) == offsets_topic.offsets_topic_replication_factor for p in described)


def test_consumer_offsets_followers_follow_and_join_the_isr(cluster, bootstrap):
    """Group commits live on every copy: each __consumer_offsets partition's followers
    follow their leader (a change of the follower API once left them failing every push,
    with the ISR the leader alone)."""
    connection = RawConnection(bootstrap)
    try:
        metadata_of(connection, [OFFSETS_TOPIC])  # created here if no earlier test did
    finally:
        connection.close()
    wait_until(lambda: OFFSETS_TOPIC in cluster.list_topics(include_internal=True), 30, "__consumer_offsets to exist")
    wait_until(lambda: all(p["leader"] >= 0 for p in cluster.describe_topic(OFFSETS_TOPIC)), 30, "their leaders")
    # A commit is written with acks=all, so it is answered once every ISR member has it: a
    # follower that did not follow would hold it up until it left the ISR
    # (replica.lag.time.max.ms), and would never join it again.
    topic, partitions = new_topic(cluster, partitions=1, replication_factor=1), BrokerConfig().offsets_topic_num_partitions
    for p in range(partitions):
        group = next(g for g in (f"follow-{p}-{i}" for i in itertools.count()) if coordinator_partition(g, partitions) == p)
        committed_standalone(bootstrap, topic, group, 1)
    # Waited for, not read once: on a loaded machine a follower whose process started more
    # than replica.lag.time.max.ms after its leader was elected leaves the ISR, as at Kafka,
    # and joins it again on its first fetch that reaches the high watermark.
    wait_until(lambda: all(sorted(p["isr"]) == sorted(p["replicas"]) for p in cluster.describe_topic(OFFSETS_TOPIC)),
               6 * CONFIG["replica.lag.time.max.ms"] / 1000, "every __consumer_offsets partition's followers in its ISR")


def committed_standalone(bootstrap: str, topic: str, group: str, offset: int) -> None:
    """A standalone consumer (assign, no subscription) commits `offset` for partition 0,
    again while the coordinator is not there yet (librdkafka's synchronous commit does not
    wait for it: __consumer_offsets may have been created a moment ago)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})

    def commit() -> bool:
        try:
            consumer.commit(offsets=[confluent_kafka.TopicPartition(topic, 0, offset)], asynchronous=False)
        except confluent_kafka.KafkaException as e:
            if not (e.args[0].retriable() or e.args[0].code() == confluent_kafka.KafkaError._WAIT_COORD):
                raise
            time.sleep(0.5)
            return False
        return True

    try:
        wait_until(commit, 60, f"group {group} to commit")
    finally:
        consumer.close()


def committed(cluster, group: str) -> dict:
    return {tp: p["committed"] for tp, p in cluster.admin().describe_consumer_groups([group])[group]["partitions"].items()}


def offsets_records_since(cluster, partition: int, offset: int) -> list:
    """The records of a __consumer_offsets partition's leader from `offset` on."""
    leader = cluster.describe_topic(OFFSETS_TOPIC)[partition]["leader"]
    stored = ray.get(cluster.replica(OFFSETS_TOPIC, partition, leader).read_local.remote(offset, 1 << 20))
    return [r for batch in iter_batches(stored) for r in batch.records()]


def test_a_kafka_clients_produce_to_consumer_offsets_is_invalid_topic_and_moves_no_offsets(cluster, bootstrap):
    """A forged commit of another group's offset, and a record no coordinator can read,
    each answered INVALID_TOPIC_EXCEPTION; neither is stored, the group's offset stays."""
    topic, group = new_topic(cluster, partitions=1, replication_factor=1), f"victim-{uuid.uuid4().hex[:8]}"
    committed_standalone(bootstrap, topic, group, 5)
    partition = coordinator_partition(group, len(cluster.describe_topic(OFFSETS_TOPIC)))
    end_offset = cluster.describe_topic(OFFSETS_TOPIC)[partition]["log_end_offset"]
    forged = {offset_key(group, topic, 0): offset_value(CommittedOffset(999)), b"\xc1not msgpack": b"x"}
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 30_000})
    errors = []
    for key, value in forged.items():
        producer.produce(OFFSETS_TOPIC, value=value, key=key, partition=partition,
                         on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(60) == 0
    assert [e.code() if e else None for e in errors] == [confluent_kafka.KafkaError.TOPIC_EXCEPTION] * 2, errors
    assert committed(cluster, group) == {TopicPartition(topic, 0): 5}
    assert not {r.key for r in offsets_records_since(cluster, partition, end_offset)} & set(forged), "stored"


def test_the_python_producer_sending_to_consumer_offsets_gets_invalid_topic(cluster, bootstrap):
    topic, group = new_topic(cluster, partitions=1, replication_factor=1), f"victim-{uuid.uuid4().hex[:8]}"
    committed_standalone(bootstrap, topic, group, 5)
    partition = coordinator_partition(group, len(cluster.describe_topic(OFFSETS_TOPIC)))
    end_offset = cluster.describe_topic(OFFSETS_TOPIC)[partition]["log_end_offset"]
    key = offset_key(group, topic, 0)
    producer = cluster.producer()
    try:
        future = producer.send(OFFSETS_TOPIC, value=offset_value(CommittedOffset(999)), key=key, partition=partition)
        with pytest.raises(InvalidTopicError):
            future.result(timeout=60)
    finally:
        producer.close()
    assert committed(cluster, group) == {TopicPartition(topic, 0): 5}
    assert key not in {r.key for r in offsets_records_since(cluster, partition, end_offset)}


def test_metadata_and_admin_through_kafka_python(cluster, bootstrap):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_cluster()
        assert sorted(b["broker_id"] for b in described["brokers"]) == [0, 1, 2], described
        admin.create_topics([NewTopic("from-kafka-admin", num_partitions=2, replication_factor=3,
                                      topic_configs={"retention.ms": "3600000"})])
        assert len(cluster.describe_topic("from-kafka-admin")) == 2
        assert "from-kafka-admin" in admin.list_topics()
        configs = admin.describe_configs([kafka.admin.ConfigResource("TOPIC", "from-kafka-admin")])
        assert "retention.ms" in str(configs)
        admin.delete_topics(["from-kafka-admin"])
        wait_until(lambda: "from-kafka-admin" not in cluster.list_topics(), 10, "topic deletion")
    finally:
        admin.close()


def test_kafka_python_produces_with_every_codec_and_acks_setting_and_reads_back(cluster, bootstrap):
    topic = new_topic(cluster)  # one topic for every setting: a topic is 9 replica processes to start
    sent = []
    for acks in (0, 1, "all"):
        for codec in CODECS:
            producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, acks=acks, linger_ms=5,
                                           compression_type=None if codec == "none" else codec,
                                           enable_idempotence=acks == "all")
            for i in range(40):
                key = f"key-{i % 7}".encode() if i % 2 else None
                value = f"{codec}-{acks}-{i}".encode()
                producer.send(topic, key=key, value=value, headers=[("h", codec.encode())])
                sent.append((key, value))
            producer.flush()
            producer.close()
    got = kafka_python_read(bootstrap, topic, len(sent))
    assert sorted(((r.key, r.value) for r in got), key=lambda kv: kv[1]) == sorted(sent, key=lambda kv: kv[1])
    assert all(r.headers == [("h", r.value.split(b"-")[0])] for r in got)
    by_key = {}
    for r in got:
        if r.key is not None:
            by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values()), "a key always lands in one partition"
    # The records came and went over the data plane: each leader holds a connection from each
    # follower and one from its broker's listener, and another for the listener's produce
    # requests where the native path sends them (rayk/net/native_produce.py).
    listener_connections = 2 if native_produce.available() else 1
    for p in range(3):
        assert ray.get(cluster.leader(topic, p).describe.remote())["data_plane_connections"] == 2 + listener_connections


def test_records_cross_between_python_api_and_kafka_clients(cluster, bootstrap):
    topic = new_topic(cluster)
    producer = cluster.producer()
    for i in range(30):
        producer.send(topic, key=f"k{i % 5}".encode(), value=f"rayk-{i}".encode())
    producer.flush()
    producer.close()
    kp = kafka.KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(30):
        kp.send(topic, key=f"k{i % 5}".encode(), value=f"kafka-{i}".encode())
    kp.flush()
    kp.close()
    from_kafka = sorted(r.value for r in kafka_python_read(bootstrap, topic, 60))
    consumer = cluster.consumer(auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, p) for p in range(3)])
    from_rayk = []
    deadline = time.monotonic() + 30
    while len(from_rayk) < 60 and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            from_rayk += [r.value for r in batch]
    consumer.close()
    expected = sorted([f"rayk-{i}".encode() for i in range(30)] + [f"kafka-{i}".encode() for i in range(30)])
    assert from_kafka == expected and sorted(from_rayk) == expected
    partitions_of = {}
    for r in kafka_python_read(bootstrap, topic, 60):
        partitions_of.setdefault(r.key, set()).add(r.partition)
    assert all(len(p) == 1 for p in partitions_of.values()), "rayk and Kafka clients partition keys alike (murmur2)"


def test_assign_and_seek(cluster, bootstrap):
    topic = new_topic(cluster, partitions=1, replication_factor=1)
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(20):
        producer.send(topic, value=str(i).encode(), partition=0)
    producer.flush()
    producer.close()
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = KafkaTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 15)
    values = []
    deadline = time.monotonic() + 20
    while len(values) < 5 and time.monotonic() < deadline:
        values += [r.value for batch in consumer.poll(timeout_ms=500).values() for r in batch]
    assert values == [b"15", b"16", b"17", b"18", b"19"]
    assert consumer.end_offsets([tp])[tp] == 20 and consumer.beginning_offsets([tp])[tp] == 0
    consumer.close()


def test_kafka_python_group_commits_are_rayk_group_offsets_and_back(cluster, bootstrap):
    topic = new_topic(cluster, replication_factor=1)
    producer = cluster.producer()
    for i in range(60):
        producer.send(topic, value=f"v{i}".encode(), partition=i % 3)
    producer.flush()
    producer.close()
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="shared", auto_offset_reset="earliest",
                                   enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=500)
    got = []
    deadline = time.monotonic() + 40
    while len(got) < 60 and time.monotonic() < deadline:
        got += [r.value for batch in consumer.poll(timeout_ms=500).values() for r in batch]
    assert len(got) == 60
    consumer.commit()
    consumer.close()
    described = cluster.admin().describe_consumer_groups(["shared"])["shared"]
    assert {tp: p["committed"] for tp, p in described["partitions"].items()} == {
        TopicPartition(topic, p): 20 for p in range(3)
    }
    # A rayk group member commits; a Kafka client sees it.
    member = cluster.consumer(topic, group_id="shared", enable_auto_commit=False)
    wait_until(lambda: member.poll(timeout_ms=200) is not None and member.assignment(), 30, "rayk member assignment")
    member.commit({TopicPartition(topic, p): 5 for p in range(3)})
    member.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets("shared")
        offsets = offsets.get("shared", offsets)
        assert {tp.partition: om.offset for tp, om in offsets.items()} == {0: 5, 1: 5, 2: 5}, offsets
        groups = admin.list_groups()
        assert "shared" in str(groups), groups
        described = admin.describe_groups(["shared"])
        assert "shared" in str(described), described
    finally:
        admin.close()


def test_two_kafka_python_members_split_partitions(cluster, bootstrap):
    """Each member polls in a thread of its own, as in an application: a member's poll
    blocks in JoinGroup until the other one has joined too."""
    topic = new_topic(cluster, partitions=4, replication_factor=1)
    members = [kafka.KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="pair", auto_offset_reset="earliest",
                                   session_timeout_ms=10000, heartbeat_interval_ms=500) for _ in range(2)]
    stop = threading.Event()

    def run(member):
        while not stop.is_set():
            member.poll(timeout_ms=100)

    threads = [threading.Thread(target=run, args=(m,), daemon=True) for m in members]
    for t in threads:
        t.start()
    try:
        def balanced():
            owned = [set(m.assignment()) for m in members]
            return all(len(a) == 2 for a in owned) and not (owned[0] & owned[1])

        # CI's run at stop 40 (30 min, a loaded machine) timed out here at 60 s with a 6 s
        # session; kafka-python's default session (10 s) and a longer bound ride out a
        # member expelled once and its rebalance again.
        wait_until(balanced, 120, "the group to split 4 partitions 2 / 2")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for m in members:
            m.close()


def test_confluent_kafka_round_trip_with_codecs_and_group(cluster, bootstrap):
    topic = new_topic(cluster)
    sent = []
    for codec in CODECS:
        for acks in ("0", "1", "all"):
            producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": acks, "compression.type": codec,
                                                "enable.idempotence": acks == "all", "linger.ms": 5})
            failures = []
            for i in range(10):
                value = f"{codec}-{acks}-{i}".encode()
                producer.produce(topic, value=value, key=str(i).encode(),
                                 on_delivery=lambda err, msg: failures.append(err) if err else None)
                sent.append(value)
            assert producer.flush(30) == 0 and not failures
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "rdkafka", "auto.offset.reset": "earliest",
                                         "enable.auto.commit": False, "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < len(sent) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert sorted(got) == sorted(sent)
    partitions = cluster.admin().describe_consumer_groups(["rdkafka"])["rdkafka"]["partitions"]
    assert sum(p["committed"] for p in partitions.values()) == len(sent)


def test_confluent_assign_and_seek_read_records_of_the_python_api(cluster, bootstrap):
    topic = new_topic(cluster, partitions=1, replication_factor=1)
    producer = cluster.producer()
    for i in range(20):
        producer.send(topic, value=str(i).encode(), partition=0)
    producer.flush()
    producer.close()
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "assigner", "enable.auto.commit": False})

    def read(n):
        values, deadline = [], time.monotonic() + 20
        while len(values) < n and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        return values

    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 15)])
    assert read(5) == [b"15", b"16", b"17", b"18", b"19"]
    consumer.seek(confluent_kafka.TopicPartition(topic, 0, 3))
    assert read(2) == [b"3", b"4"]
    low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=10)
    assert (low, high) == (0, 20)
    consumer.close()


def test_a_producer_with_many_requests_in_flight_has_them_appended_in_the_order_sent(cluster, bootstrap):
    # linger.ms 0 and no idempotence: librdkafka sends a request per record without
    # waiting for answers; the listener pipelines and coalesces them, and keeps their order.
    topic = new_topic(cluster, partitions=2)
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                                         "enable.idempotence": False, "max.in.flight.requests.per.connection": 1000})
    failed = []
    for i in range(3000):
        producer.produce(topic, value=str(i).encode(), partition=i % 2,
                         on_delivery=lambda err, _: failed.append(err) if err else None)
        if i % 50 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0 and not failed
    by_partition = {0: [], 1: []}
    for record in kafka_python_read(bootstrap, topic, 3000, partitions=2):
        by_partition[record.partition].append(int(record.value))
    assert by_partition == {p: list(range(p, 3000, 2)) for p in (0, 1)}


def test_librdkafka_fails_only_the_keyless_records_of_a_batch_to_a_compacted_topic(cluster, bootstrap):
    """KIP-467: of a batch of 100 records, 10 without a key, the leader names those 10;
    librdkafka fails them with INVALID_RECORD and the other 90 with
    _INVALID_DIFFERENT_RECORD (for the application to send again). Nothing is written."""
    topic = f"k{next(_names)}"
    cluster.create_topic(topic, num_partitions=1, replication_factor=1, config={"cleanup.policy": "compact"})
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2000,
                                         "enable.idempotence": False, "message.timeout.ms": 30_000})
    outcomes: dict[int, int] = {}
    for i in range(100):
        producer.produce(topic, value=str(i).encode(), key=None if i % 10 == 7 else b"k%d" % i, partition=0,
                         on_delivery=lambda err, msg: outcomes.__setitem__(int(msg.value()), err and err.code()))
    assert producer.flush(60) == 0
    invalid = {i for i, code in outcomes.items() if code == confluent_kafka.KafkaError.INVALID_RECORD}
    different = {i for i, code in outcomes.items() if code == confluent_kafka.KafkaError._INVALID_DIFFERENT_RECORD}
    assert invalid == set(range(7, 100, 10)) and different == set(range(100)) - invalid, outcomes
    assert cluster.describe_topic(topic)[0]["log_end_offset"] == 0


def test_a_broker_that_does_not_lead_answers_not_leader_or_follower(cluster):
    topic = new_topic(cluster, partitions=1)
    leader = cluster.describe_topic(topic)[0]["leader"]
    follower = next(b for b in cluster.brokers() if b["broker_id"] != leader)
    conn = RawConnection("%s:%d" % tuple(follower["endpoints"]["PLAINTEXT"]))
    try:
        answer = conn.call(PRODUCE, 9, {"acks": -1, "timeout": 1000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": build_batch([SimpleRecord(b"x")])}]}]})
        assert answer.responses[0].partition_responses[0].error_code.value == 6  # NOT_LEADER_OR_FOLLOWER
    finally:
        conn.close()
    assert cluster.describe_topic(topic)[0]["high_watermark"] == 0, "nothing was appended"


def _fetch_values(topic_key: str, topic, offset: int, session_id: int, epoch: int, max_wait_ms: int = 200) -> dict:
    partitions = [] if topic is None else [{"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20,
                                            "current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1}]
    return {"max_wait": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20, "session_id": session_id,
            "session_epoch": epoch, "topics": [] if topic is None else [{topic_key: topic, "partitions": partitions}],
            "forgotten_topics_data": [], "rack_id": ""}


def test_fetch_sessions_answer_only_what_changed_and_fetch_v13_names_topics_by_id(cluster):
    """KIP-227 on the wire (kafka-python uses sessions; librdkafka Fetch v16 with topic ids):
    a full fetch opens a session, an incremental one with nothing new is empty, a new
    record brings its partition back; stale epochs and unknown sessions get Kafka's errors."""
    topic = new_topic(cluster, partitions=1, replication_factor=1)
    leader = cluster.describe_topic(topic)[0]["leader"]
    address = "%s:%d" % tuple(next(b["endpoints"]["PLAINTEXT"] for b in cluster.brokers() if b["broker_id"] == leader))
    conn, producer = RawConnection(address), cluster.producer()
    try:
        full = conn.call(FETCH, 12, _fetch_values("topic", topic, 0, session_id=0, epoch=0))
        session_id = full.session_id
        assert full.error_code.value == 0 and session_id != 0 and len(full.responses[0].partitions) == 1
        quiet = conn.call(FETCH, 12, _fetch_values("topic", None, 0, session_id, epoch=1))
        assert (quiet.error_code.value, quiet.session_id, quiet.responses) == (0, session_id, ())
        producer.send(topic, b"new", partition=0).result(timeout=30)
        changed = conn.call(FETCH, 12, _fetch_values("topic", None, 0, session_id, epoch=2))
        [partition] = changed.responses[0].partitions
        assert partition.high_watermark == 1 and partition.records
        stale = conn.call(FETCH, 12, _fetch_values("topic", None, 0, session_id, epoch=2))
        assert stale.error_code.value == 71  # INVALID_FETCH_SESSION_EPOCH
        unknown = conn.call(FETCH, 12, _fetch_values("topic", None, 0, session_id + 1, epoch=1))
        assert unknown.error_code.value == 70  # FETCH_SESSION_ID_NOT_FOUND

        topic_id = kafka_uuid(cluster.describe_topic(topic)[0]["topic_id"])
        by_id = conn.call(FETCH, 16, _fetch_values("topic_id", topic_id, 0, session_id=0, epoch=-1))
        assert by_id.responses[0].topic_id == topic_id and by_id.responses[0].partitions[0].records
        for unknown_id in (uuid.uuid4(), uuid.UUID(int=0)):  # kio reads the zero id as None
            missing = conn.call(FETCH, 16, _fetch_values("topic_id", unknown_id, 0, session_id=0, epoch=-1))
            assert missing.error_code.value == 0
            assert missing.responses[0].partitions[0].error_code.value == 100  # UNKNOWN_TOPIC_ID

        cluster.delete_topic(topic)  # a topic created again under the name is not the old id's
        wait_until(lambda: topic not in cluster.list_topics(), 30, "the topic is deleted")
        cluster.create_topic(topic, num_partitions=1, replication_factor=1)
        producer.send(topic, b"other", partition=0).result(timeout=30)
        new_leader = cluster.describe_topic(topic)[0]["leader"]
        conn.close()
        conn = RawConnection("%s:%d" % tuple(next(b["endpoints"]["PLAINTEXT"] for b in cluster.brokers() if b["broker_id"] == new_leader)))
        codes = []
        for _ in range(3):  # the first may be NOT_LEADER_OR_FOLLOWER (the old replica is gone), as a client retries
            [partition] = conn.call(FETCH, 16, _fetch_values("topic_id", topic_id, 0, 0, -1)).responses[0].partitions
            assert not partition.records
            codes.append(partition.error_code.value)
        assert codes[-1] == 100, codes  # UNKNOWN_TOPIC_ID
    finally:
        conn.close()
        producer.close()


def test_create_partitions_grows_a_topic_and_keyed_records_follow_the_new_count(cluster, bootstrap):
    topic = f"k{next(_names)}"
    cluster.create_topic(topic, num_partitions=2, replication_factor=1)  # one process per new partition
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    rayk_producer = cluster.producer(metadata_max_age_ms=300)
    try:
        assert rayk_producer.partitions_for(topic) == {0, 1}
        admin.create_partitions({topic: NewPartitions(4)}, validate_only=True)
        assert len(cluster.describe_topic(topic)) == 2, "validate_only changes nothing"
        admin.create_partitions({topic: NewPartitions(4)})
        with pytest.raises(kafka.errors.InvalidPartitionsError):
            admin.create_partitions({topic: NewPartitions(3)})
        confluent_admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
        confluent_admin.create_partitions([confluent_kafka.admin.NewPartitions(topic, 5)])[topic].result(timeout=60)
        assert [p["partition"] for p in cluster.describe_topic(topic)] == [0, 1, 2, 3, 4]

        keys = [f"key-{i}".encode() for i in range(30)]
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap)  # murmur2 over the 5 partitions it is told of
        placed = [producer.send(topic, key=k, value=k).get(timeout=30).partition for k in keys]
        producer.close()
        assert placed == [partition_for_key(k, 5) for k in keys]
        fillers = []

        def learned() -> bool:
            if rayk_producer.partitions_for(topic) == set(range(5)):
                return True
            fillers.append(rayk_producer.send(topic, b"-").result(timeout=30))  # its sender looks again when stale
            return False

        wait_until(learned, 10, "the rayk producer learns the new count within metadata.max.age.ms")
        assert [rayk_producer.send(topic, k, key=k).result(timeout=30).partition for k in keys] == placed
        records = kafka_python_read(bootstrap, topic, 2 * len(keys) + len(fillers), partitions=5)
        assert sorted(r.value for r in records if r.value != b"-") == sorted(keys * 2)
    finally:
        rayk_producer.close()
        admin.close()


def test_elect_leaders_gives_a_partition_back_to_its_preferred_replica(cluster, bootstrap):
    """KIP-460 through confluent-kafka's AdminClient: after a leader's replica process dies,
    leadership moves on; once the preferred replica is back in sync, ElectLeaders
    (PREFERRED) gives it back, and a second election is not needed."""
    topic = new_topic(cluster, partitions=1)
    preferred = cluster.describe_topic(topic)[0]["replicas"][0]
    ray.kill(cluster.replica(topic, 0, preferred))  # its ReplicaManager re-creates it
    wait_until(lambda: cluster.describe_topic(topic)[0]["leader"] not in (preferred, -1), 30, "leadership to move")
    wait_until(lambda: preferred in cluster.describe_topic(topic)[0]["isr"], 30, "the preferred replica back in sync")
    elected = cluster.admin().elect_leaders([(topic, 0), (topic, 0)])  # named twice: elected once
    assert elected == {TopicPartition(topic, 0): None}
    assert cluster.describe_topic(topic)[0]["leader"] == preferred
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    tp = confluent_kafka.TopicPartition(topic, 0)
    again = admin.elect_leaders(confluent_kafka.ElectionType.PREFERRED, [tp]).result(timeout=60)
    assert again[tp].code() == confluent_kafka.KafkaError.ELECTION_NOT_NEEDED
    missing = confluent_kafka.TopicPartition(topic, 7)
    unknown = admin.elect_leaders(confluent_kafka.ElectionType.PREFERRED, [missing]).result(timeout=60)
    assert unknown[missing].code() == confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART
    producer = cluster.producer()
    producer.send(topic, b"after").result(timeout=30)  # the new leader serves
    producer.close()


def test_a_missing_topic_is_created_on_first_use(cluster, bootstrap):
    """auto.create.topics.enable, as in Kafka: created with num.partitions, answered
    LEADER_NOT_AVAILABLE until it has leaders, which the clients retry."""
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap)
    producer.send("made-on-first-use", b"first").get(timeout=30)
    producer.close()
    assert len(cluster.describe_topic("made-on-first-use")) == 3  # num.partitions
    assert [r.value for r in kafka_python_read(bootstrap, "made-on-first-use", 1)] == [b"first"]


def metadata_of(connection: RawConnection, names: list[str]) -> Any:
    return connection.call(METADATA, 12, {"topics": [{"name": n, "topic_id": None} for n in names],
                                          "allow_auto_topic_creation": True,
                                          "include_topic_authorized_operations": False})


def test_metadata_auto_creation_answers_before_the_replicas_run_and_names_a_leader_only_once_it_takes_writes(cluster, bootstrap):
    """Kafka answers a Metadata request naming new topics at once (LEADER_NOT_AVAILABLE):
    it used to wait for every replica process of each topic in turn, holding up the
    requests behind it. And the broker Metadata names as leader takes writes then: one
    named before its replica led answered NOT_LEADER_OR_FOLLOWER, and librdkafka's retries
    then landed out of order."""
    names = [f"auto-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    connection = RawConnection(bootstrap)
    try:
        answer = metadata_of(connection, names)
        assert [t.error_code.value for t in answer.topics] == [5, 5]  # LEADER_NOT_AVAILABLE
        pending = ray.get(cluster.controller.client_metadata.remote(names))["topics"]
        assert any(p["leader"] < 0 for t in pending.values() for p in t["partitions"].values()), (
            "answered while replicas were still starting"
        )
        endpoints = {b["broker_id"]: "%s:%d" % tuple(b["endpoints"]["PLAINTEXT"]) for b in cluster.brokers()}
        unproduced = {(n, p) for n in names for p in range(3)}
        deadline = time.monotonic() + 60
        while unproduced:
            assert time.monotonic() < deadline, f"no leader named for {sorted(unproduced)}"
            for topic in metadata_of(connection, names).topics:
                for partition in topic.partitions:
                    key = (topic.name, partition.partition_index)
                    if key not in unproduced or partition.leader_id < 0:
                        continue
                    leader = RawConnection(endpoints[partition.leader_id])
                    try:  # at once, to the broker just named
                        produced = leader.call(PRODUCE, 9, {"acks": 1, "timeout": 5000, "topic_data": [
                            {"name": key[0], "partition_data": [
                                {"index": key[1], "records": build_batch([SimpleRecord(b"x")])}]}]})
                    finally:
                        leader.close()
                    assert produced.responses[0].partition_responses[0].error_code.value == 0, (
                        f"{key}: the leader Metadata named refused the write"
                    )
                    unproduced.discard(key)
            time.sleep(0.02)
    finally:
        connection.close()


def test_create_topics_answers_request_timed_out_at_its_timeout_while_the_creation_goes_on(cluster, bootstrap):
    name = f"slow-{uuid.uuid4().hex[:8]}"
    connection = RawConnection(bootstrap)
    try:
        answer = connection.call(CREATE_TOPICS, 7, {"topics": [{"name": name, "num_partitions": 2, "replication_factor": 3,
                                                                "assignments": [], "configs": []}],
                                                    "timeout": 1, "validate_only": False})
    finally:
        connection.close()
    assert answer.topics[0].error_code.value == 7  # REQUEST_TIMED_OUT
    wait_until(lambda: all(p["leader"] >= 0 for p in ray.get(cluster.controller.client_metadata.remote([name]))
                           ["topics"][name]["partitions"].values()), 60, "the creation to finish")
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    delivered = []
    producer.produce(name, b"v", partition=1, on_delivery=lambda err, msg: delivered.append(err))
    producer.flush(30)
    assert delivered == [None]


def test_aiokafka_produces_with_codecs_and_consumes_in_a_group(cluster, bootstrap):
    topic = new_topic(cluster)

    async def produce_then_consume() -> list:
        for codec in ("gzip", "lz4", "zstd"):
            producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                                                 compression_type=codec)
            await producer.start()
            try:
                for i in range(10):
                    await producer.send_and_wait(topic, b"%s-%d" % (codec.encode(), i), key=b"user-%d" % (i % 4))
            finally:
                await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="aio",
                                             auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        got = []
        try:
            while len(got) < 30:
                for records in (await consumer.getmany(timeout_ms=1000)).values():
                    got.extend(records)
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(asyncio.wait_for(produce_then_consume(), 120))
    assert sorted(r.value for r in got) == sorted(b"%s-%d" % (c, i) for c in (b"gzip", b"lz4", b"zstd") for i in range(10))
    assert all(r.partition == partition_for_key(r.key, 3) for r in got), "the same key -> partition as rayk's producer"
    committed = cluster.admin().describe_consumer_groups(["aio"])["aio"]["partitions"]
    assert sum(p["committed"] for p in committed.values()) == 30


@pytest.mark.skipif(shutil.which("kcat") is None, reason="needs kcat (`.ci/run` installs Debian's kcat)")
def test_kcat_lists_metadata_produces_and_consumes(cluster, bootstrap):
    topic = new_topic(cluster, partitions=2)
    listed = subprocess.run(["kcat", "-b", bootstrap, "-L", "-t", topic], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "3 brokers" in listed.stdout and "2 partitions" in listed.stdout
    produced = subprocess.run(["kcat", "-b", bootstrap, "-P", "-t", topic, "-K:"], input="a:1\nb:2\nc:3\n",
                              capture_output=True, text=True, timeout=60)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%k=%s\\n"],
                              capture_output=True, text=True, timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == ["a=1", "b=2", "c=3"]


def test_confluent_admin_deletes_a_group_once_its_members_have_left_and_its_offsets_go_with_it(cluster, bootstrap):
    topic, group = new_topic(cluster, partitions=1, replication_factor=1), f"deleted-{uuid.uuid4().hex[:8]}"
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for i in range(5):
        producer.produce(topic, b"%d" % i)
    assert producer.flush(30) == 0
    settings = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                "enable.auto.commit": False}
    consumer = confluent_kafka.Consumer(settings)
    consumer.subscribe([topic])
    seen = wait_until(lambda: consumer.poll(1.0), 30, "a record")
    consumer.commit(message=seen, asynchronous=False)
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})

    def delete_error(name: str) -> int | None:
        try:
            admin.delete_consumer_groups([name], request_timeout=30)[name].result(30)
        except confluent_kafka.KafkaException as e:
            return e.args[0].code()
        return None

    assert delete_error(group) == confluent_kafka.KafkaError.NON_EMPTY_GROUP
    consumer.close()
    assert delete_error(group) is None
    assert delete_error(group) == confluent_kafka.KafkaError.GROUP_ID_NOT_FOUND
    assert group not in {g["group_id"] for g in cluster.admin().list_consumer_groups()}
    again = confluent_kafka.Consumer(settings)
    again.subscribe([topic])
    first = wait_until(lambda: again.poll(1.0), 30, "a record")
    assert first.offset() == 0, "its committed offset was deleted: it starts over from auto.offset.reset"
    again.close()


def test_a_commit_of_an_unknown_topic_or_partition_is_unknown_topic_or_partition_and_stores_nothing(cluster, bootstrap):
    """As Kafka's KafkaApis: per partition UNKNOWN_TOPIC_OR_PARTITION for a topic or a
    partition that does not exist, while the request's existing partitions are committed."""
    topic, group = new_topic(cluster, partitions=1, replication_factor=1), f"unknown-{uuid.uuid4().hex[:8]}"
    committed_standalone(bootstrap, topic, group, 1)  # (the coordinator is up)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        wanted = [confluent_kafka.TopicPartition(topic, 0, 4), confluent_kafka.TopicPartition(topic, 7, 4),
                  confluent_kafka.TopicPartition(f"absent-{uuid.uuid4().hex[:8]}", 0, 4)]
        try:
            answered = consumer.commit(offsets=wanted, asynchronous=False)
        except confluent_kafka.KafkaException as e:
            answered = e.args[0]
        assert not isinstance(answered, list) or any(tp.error for tp in answered), "a commit of nothing that exists succeeded"
        codes = ({(tp.topic, tp.partition): tp.error.code() if tp.error else None for tp in answered}
                 if isinstance(answered, list) else {"request": answered.code()})
        unknown = confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART
        assert unknown in codes.values(), codes
    finally:
        consumer.close()
    assert committed(cluster, group) == {TopicPartition(topic, 0): 4}, "only the existing partition is stored"


def test_a_committed_leader_epoch_is_stored_and_fetched_back(cluster, bootstrap):
    """KIP-320: librdkafka commits the leader epoch of the last consumed record and, on
    resuming, validates its position with it; OffsetFetch used to answer -1."""
    topic, group = new_topic(cluster, partitions=1, replication_factor=1), f"epoch-{uuid.uuid4().hex[:8]}"
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        producer.produce(topic, b"%d" % i, partition=0)
    assert producer.flush(30) == 0
    epoch = 0
    committed_standalone(bootstrap, topic, group, 1)  # (the coordinator is up)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[confluent_kafka.TopicPartition(topic, 0, 3, leader_epoch=epoch + 1)], asynchronous=False)
        (found,) = consumer.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=30)
    finally:
        consumer.close()
    assert (found.offset, found.leader_epoch) == (3, epoch + 1)


def test_a_static_member_keeps_its_partitions_across_a_restart_fences_its_twin_and_leaves_by_instance_id(cluster, bootstrap):
    """KIP-345 with librdkafka's group.instance.id: a static member that restarts within its
    session gets its partitions back and the other member sees no rebalance; a second
    process with the same instance id fences the first (FENCED_INSTANCE_ID, fatal in
    librdkafka); DescribeGroups names the instance ids; LeaveGroup v5 by instance id alone
    removes a closed static member long before its session would have expired."""
    topic, group = new_topic(cluster, partitions=4, replication_factor=1), f"static-{uuid.uuid4().hex[:8]}"
    rebalances: dict[str, int] = {}
    errors: list[confluent_kafka.KafkaError] = []

    def member(instance: str) -> confluent_kafka.Consumer:
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": instance,
            "session.timeout.ms": 60_000, "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest"})  # fmt: skip

        def count(_consumer: Any, _partitions: Any) -> None:
            rebalances[instance] = rebalances.get(instance, 0) + 1

        consumer.subscribe([topic], on_assign=count, on_revoke=count)
        return consumer

    def poll(*consumers: confluent_kafka.Consumer) -> None:
        for c in consumers:
            message = c.poll(0.05)
            if message is not None and message.error():
                errors.append(message.error())

    def owned(consumer: confluent_kafka.Consumer) -> set[int]:
        return {tp.partition for tp in consumer.assignment()}

    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})

    def described() -> Any:
        return admin.describe_consumer_groups([group], request_timeout=30)[group].result(30)

    a, b = member("a"), member("b")
    wait_until(lambda: poll(a, b) or (len(owned(a)), len(owned(b))) == (2, 2), 60, "the group to split 4 partitions")
    a_partitions, b_rebalances = owned(a), rebalances["b"]
    a.close()  # a static member sends no LeaveGroup: it stays in the group for its session
    restarted = member("a")
    wait_until(lambda: poll(restarted, b) or owned(restarted) == a_partitions, 30, "the restarted member's partitions")
    for _ in range(20):
        poll(restarted, b)
    assert rebalances["b"] == b_rebalances, "the other member was rebalanced"
    assert sorted(m.group_instance_id for m in described().members) == ["a", "b"]

    twin = member("a")
    fatal = confluent_kafka.KafkaError._FATAL  # (librdkafka's event for a fatal error)
    wait_until(lambda: poll(twin, b, restarted) or any(e.code() == fatal for e in errors), 30,
               "the older process to be fenced")  # fmt: skip
    assert "fenced by other consumer with same group.instance.id" in str(errors), errors
    wait_until(lambda: poll(twin, b) or owned(twin) == a_partitions, 30, "the twin's partitions")
    restarted.close()

    b.close()
    coordinator = described().coordinator
    connection = RawConnection(f"{coordinator.host}:{coordinator.port}")
    try:
        left = connection.call(LEAVE_GROUP, 5, {"group_id": group, "members": [
            {"member_id": "", "group_instance_id": "b", "reason": "scaled in"}]})  # fmt: skip
    finally:
        connection.close()
    assert (left.error_code, [(m.group_instance_id, m.error_code) for m in left.members]) == (0, [("b", 0)])
    assert [m.group_instance_id for m in described().members] == ["a"]
    wait_until(lambda: poll(twin) or owned(twin) == {0, 1, 2, 3}, 30, "the member left to own every partition")
    twin.close()


def test_kafka_python_deletes_group_offsets_but_not_of_a_topic_its_members_consume(cluster, bootstrap):
    """OffsetDelete (KIP-496) as Kafka answers it: GROUP_SUBSCRIBED_TO_TOPIC for a topic
    the group's members consume, the other partition's offset tombstoned; once they have
    left that one goes too; GROUP_ID_NOT_FOUND for a group that does not exist."""
    consumed, other = (new_topic(cluster, partitions=1, replication_factor=1) for _ in range(2))
    group = f"offset-delete-{uuid.uuid4().hex[:8]}"
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                                         "auto.offset.reset": "earliest"})
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        consumer.subscribe([consumed])
        wait_until(lambda: consumer.poll(0.5) is None and consumer.assignment(), 60, "an assignment")
        consumer.commit(offsets=[confluent_kafka.TopicPartition(consumed, 0, 2), confluent_kafka.TopicPartition(other, 0, 3)],
                        asynchronous=False)
        results = admin.delete_group_offsets(group, [KafkaTopicPartition(consumed, 0), KafkaTopicPartition(other, 0)])
        assert results == {KafkaTopicPartition(consumed, 0): kafka.errors.GroupSubscribedToTopicError,
                           KafkaTopicPartition(other, 0): kafka.errors.NoError}, results
        assert committed(cluster, group) == {TopicPartition(consumed, 0): 2}
        consumer.close()
        deleted = cluster.admin().delete_consumer_group_offsets(group, [(consumed, 0), (consumed, 5)])
        assert {tp: type(e) if e else None for tp, e in deleted.items()} == {
            TopicPartition(consumed, 0): None, TopicPartition(consumed, 5): UnknownTopicOrPartitionError}
        assert committed(cluster, group) == {}
        with pytest.raises(kafka.errors.GroupIdNotFoundError):
            admin.delete_group_offsets(f"absent-{uuid.uuid4().hex[:8]}", [KafkaTopicPartition(other, 0)])
    finally:
        admin.close()



# ---------------------------------------------------------------------------- transactions


def txn_producer(bootstrap: str, txn_id: str | None = None, **settings: Any) -> confluent_kafka.Producer:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap,
                                         "transactional.id": txn_id or f"tx-{uuid.uuid4().hex[:8]}", **settings})
    producer.init_transactions(60)
    return producer


def read_values(bootstrap: str, topic: str, isolation_level: str, expected: int, timeout_s: float = 30,
                position: int | None = None) -> list[bytes]:
    """Partition 0's values from its start, read by librdkafka until `expected` came (and
    the consumer's position reached `position`, if given) or timeout_s passed."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                                         "isolation.level": isolation_level, "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s

    def at_position() -> bool:
        return position is None or consumer.position([confluent_kafka.TopicPartition(topic, 0)])[0].offset == position

    while (len(values) < expected or not at_position()) and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            values.append(message.value())
    reached = at_position()
    consumer.close()
    assert reached, f"the consumer's position did not reach {position}"
    return values


def test_a_confluent_transaction_is_read_committed_only_once_committed_and_never_if_aborted(cluster, bootstrap):
    """librdkafka's transactional producer: while a transaction is open, read_committed
    consumers wait at its first offset (the LSO) and read_uncommitted ones read it; once
    committed both read it; an aborted transaction's records (sent before the abort) only
    read_uncommitted consumers see; read_committed ones move past them and the markers."""
    topic = new_topic(cluster, partitions=1)
    producer = txn_producer(bootstrap)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, f"c{i}".encode(), partition=0)
    producer.flush(30)
    assert read_values(bootstrap, topic, "read_committed", 1, timeout_s=2) == []
    assert read_values(bootstrap, topic, "read_uncommitted", 5) == [f"c{i}".encode() for i in range(5)]
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, f"a{i}".encode(), partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"d0", partition=0)
    producer.commit_transaction(30)

    committed = [f"c{i}".encode() for i in range(5)] + [b"d0"]
    wait_until(lambda: cluster.describe_topic(topic)[0]["high_watermark"] == 14, 30,
               "the last marker")  # 11 records and 3 markers; EndTxn is answered before its markers are written
    assert read_values(bootstrap, topic, "read_committed", 6, position=14) == committed  # past the markers
    assert read_values(bootstrap, topic, "read_uncommitted", 11) == committed[:5] + [f"a{i}".encode() for i in range(5)] + [b"d0"]


def test_consume_transform_produce_commits_the_group_offsets_with_the_transaction(cluster, bootstrap):
    """send_offsets_to_transaction (AddOffsetsToTxn, TxnOffsetCommit): the group's offsets
    move with a committed transaction and stay where they were when it aborts, so each
    input record's output is committed exactly once."""
    source, sink, group = new_topic(cluster, partitions=1), new_topic(cluster, partitions=1), f"ctp-{uuid.uuid4().hex[:6]}"
    plain = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        plain.produce(source, f"m{i}".encode(), partition=0)
    plain.flush(30)
    producer = txn_producer(bootstrap)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.subscribe([source])

    def committed() -> int:
        """The group's offset once no transaction's offsets for it await their marker (EndTxn
        is answered before the markers are written): rayk's consumer asks with require_stable."""
        reader = cluster.consumer(group_id=group, enable_auto_commit=False)
        try:
            return reader.committed(TopicPartition(source, 0))
        finally:
            reader.close(autocommit=False)

    def transform(count: int, commit: bool) -> None:
        messages: list = []
        while len(messages) < count:
            messages += [m for m in consumer.consume(count - len(messages), 1.0) if m.error() is None]
        producer.begin_transaction()
        for m in messages:
            producer.produce(sink, m.value().upper(), partition=0)
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)
            consumer.seek(confluent_kafka.TopicPartition(source, 0, committed() or 0))

    try:
        transform(5, commit=True)
        assert committed() == 5
        transform(5, commit=False)
        assert committed() == 5
        transform(5, commit=True)
        assert committed() == 10
    finally:
        consumer.close()
    assert read_values(bootstrap, sink, "read_committed", 10) == [f"M{i}".encode() for i in range(10)]


def test_a_zombie_producer_is_fenced_by_a_new_one_with_its_transactional_id(cluster, bootstrap):
    """A second producer with the same transactional.id bumps the epoch: the first one's
    open transaction is aborted, and its commit fails as fenced (fatal); nothing it wrote
    is read_committed."""
    topic, txn_id = new_topic(cluster, partitions=1), f"zombie-{uuid.uuid4().hex[:6]}"
    zombie = txn_producer(bootstrap, txn_id)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie", partition=0)
    zombie.flush(30)
    successor = txn_producer(bootstrap, txn_id)
    with pytest.raises(confluent_kafka.KafkaException) as fenced:
        zombie.commit_transaction(30)
    assert fenced.value.args[0].fatal(), fenced.value
    successor.begin_transaction()
    successor.produce(topic, b"successor", partition=0)
    successor.commit_transaction(30)
    assert read_values(bootstrap, topic, "read_committed", 1) == [b"successor"]
    assert read_values(bootstrap, topic, "read_uncommitted", 2) == [b"zombie", b"successor"]


def coordinator_connection(bootstrap: str, key: str, key_type: int = 1) -> RawConnection:
    """A connection to the coordinator of a transactional id (key type 1) or a group (0)."""
    connection = RawConnection(bootstrap)
    try:
        found = connection.call(FIND_COORDINATOR, 4, {"key_type": key_type, "coordinator_keys": [key]}).coordinators[0]
    finally:
        connection.close()
    assert found.error_code.value == 0, found
    return RawConnection(f"{found.host}:{found.port}")


def test_an_abandoned_transaction_is_aborted_by_the_coordinator_after_its_timeout(cluster, bootstrap):
    """A producer that stops mid-transaction holds read_committed consumers back only
    until transaction.timeout.ms: the coordinator then fences it (the epoch goes up) and
    aborts the transaction, and the LSO moves on to what others wrote since."""
    topic, txn_id = new_topic(cluster, partitions=1), f"abandoned-{uuid.uuid4().hex[:6]}"
    abandoned = txn_producer(bootstrap, txn_id, **{"transaction.timeout.ms": 2000})
    abandoned.begin_transaction()
    abandoned.produce(topic, b"abandoned", partition=0)
    abandoned.flush(30)
    plain = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, b"later", partition=0)
    plain.flush(30)
    assert read_values(bootstrap, topic, "read_committed", 1) == [b"later"]
    connection = coordinator_connection(bootstrap, txn_id)

    def described() -> tuple:
        [state] = connection.call(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [txn_id]}).transaction_states
        return state.error_code.value, state.transaction_state, state.producer_epoch

    try:  # (CompleteAbort is written once the markers are: the LSO may move a moment before)
        wait_until(lambda: described() == (0, "CompleteAbort", 1), 30, "the coordinator's abort, with the epoch fenced")
    finally:
        connection.close()


def test_the_transaction_apis_answer_kafkas_errors(cluster, bootstrap):
    """On the wire: a timeout above transaction.max.timeout.ms, a partition that does not
    exist (the others of the request not attempted), a stale epoch, a transactional produce
    to a partition the transaction does not hold (KIP-890's verification), an unknown id;
    and DescribeProducers shows an open transaction's first offset."""
    topic, txn_id = new_topic(cluster, partitions=1), f"raw-{uuid.uuid4().hex[:6]}"
    connection = coordinator_connection(bootstrap, txn_id)
    try:
        too_long = connection.call(INIT_PRODUCER_ID, 4, {"transactional_id": txn_id, "transaction_timeout": 900_001,
                                                         "producer_id": -1, "producer_epoch": -1})
        assert too_long.error_code.value == 50  # INVALID_TRANSACTION_TIMEOUT
        init = connection.call(INIT_PRODUCER_ID, 4, {"transactional_id": txn_id, "transaction_timeout": 60_000,
                                                     "producer_id": -1, "producer_epoch": -1})
        assert init.error_code.value == 0
        pid, epoch = init.producer_id, init.producer_epoch

        def add(partitions: list[int], version: int = 3) -> dict[int, int]:
            answer = connection.call(ADD_PARTITIONS_TO_TXN, version, {
                "v3_and_below_transactional_id": txn_id, "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [{"name": topic, "partitions": partitions}]})
            return {p.partition_index: p.partition_error_code.value for p in answer.results_by_topic_v3_and_below[0].results_by_partition}

        assert add([0, 7]) == {0: 55, 7: 3}  # OPERATION_NOT_ATTEMPTED, UNKNOWN_TOPIC_OR_PARTITION
        verified = connection.call(ADD_PARTITIONS_TO_TXN, 4, {"transactions": [{
            "transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch, "verify_only": True,
            "topics": [{"name": topic, "partitions": [0]}]}]})
        [result] = verified.results_by_transaction[0].topic_results[0].results_by_partition
        assert result.partition_error_code.value == 48  # INVALID_TXN_STATE: not in the transaction
        stale = connection.call(END_TXN, 3, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch - 1,
                                             "committed": True})
        assert stale.error_code.value == 90  # PRODUCER_FENCED
        # (kio cannot decode the answer's start time of -1, "none", so its error code is read by hand:
        # correlation id, header tags, throttle time, array length, then the first state's error code)
        connection.send(sized(request_frame(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [txn_id + "-absent"]}, 7, "t")))
        unknown = connection.receive()
        assert unknown is not None and struct.unpack_from(">h", unknown, 10)[0] in (105, 16)  # TRANSACTIONAL_ID_NOT_FOUND, NOT_COORDINATOR
    finally:
        connection.close()

    leader = cluster.describe_topic(topic)[0]["leader"]
    to_leader = RawConnection("%s:%d" % tuple(next(b["endpoints"]["PLAINTEXT"] for b in cluster.brokers() if b["broker_id"] == leader)))
    batch = build_batch([SimpleRecord(b"x")], producer_id=pid, producer_epoch=epoch, base_sequence=0, is_transactional=True)

    def produce() -> int:
        answer = to_leader.call(PRODUCE, 9, {"transactional_id": txn_id, "acks": -1, "timeout": 10_000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
        return answer.responses[0].partition_responses[0].error_code.value

    try:
        assert produce() == 48  # INVALID_TXN_STATE: AddPartitionsToTxn first
        connection = coordinator_connection(bootstrap, txn_id)
        try:
            assert add([0]) == {0: 0}
        finally:
            connection.close()
        assert produce() == 0
        producers = to_leader.call(DESCRIBE_PRODUCERS, 0, {"topics": [{"name": topic, "partition_indexes": [0]}]})
        [state] = producers.topics[0].partitions[0].active_producers
        assert (state.producer_id, state.producer_epoch, state.current_txn_start_offset) == (pid, epoch, 0)
    finally:
        to_leader.close()


def test_transaction_version_2_adds_partitions_at_the_leader_and_bumps_the_epoch_at_every_end(cluster, bootstrap):
    """KIP-890 part 2 on the wire, as Kafka's Java client runs it once ApiVersions finalizes
    transaction.version 2: a Produce v12 opens the transaction at the partition's leader
    with no AddPartitionsToTxn; EndTxn v5 answers the bumped epoch; a produce of the ended
    transaction that lands late, with the old epoch, is fenced; the next transaction runs
    in the new epoch from sequence 0, and an abort of it bumps again."""
    topic, txn_id = new_topic(cluster, partitions=1), f"tv2-{uuid.uuid4().hex[:6]}"
    coordinator = coordinator_connection(bootstrap, txn_id)
    leader = cluster.describe_topic(topic)[0]["leader"]
    to_leader = RawConnection("%s:%d" % tuple(next(b["endpoints"]["PLAINTEXT"] for b in cluster.brokers() if b["broker_id"] == leader)))
    try:
        init = coordinator.call(INIT_PRODUCER_ID, 5, {"transactional_id": txn_id, "transaction_timeout": 60_000,
                                                      "producer_id": -1, "producer_epoch": -1})
        pid, epoch = init.producer_id, init.producer_epoch

        def produce(value: bytes, epoch: int, sequence: int) -> int:
            batch = build_batch([SimpleRecord(value)], producer_id=pid, producer_epoch=epoch, base_sequence=sequence,
                                is_transactional=True)  # fmt: skip
            answer = to_leader.call(PRODUCE, 12, {"transactional_id": txn_id, "acks": -1, "timeout": 10_000, "topic_data": [
                {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
            return answer.responses[0].partition_responses[0].error_code.value

        def end(epoch: int, commit: bool) -> int:
            answer = coordinator.call(END_TXN, 5, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                                                   "committed": commit})
            assert answer.error_code.value == 0 and answer.producer_id == pid, answer
            return answer.producer_epoch

        assert produce(b"c0", epoch, 0) == 0, "the leader added the partition to the transaction"
        assert end(epoch, commit=True) == epoch + 1
        wait_until(lambda: cluster.describe_topic(topic)[0]["high_watermark"] == 2, 30, "the COMMIT marker")
        # What KIP-890 closes: before it, this write would open a transaction no coordinator knows.
        assert produce(b"late", epoch, 1) == 47  # INVALID_PRODUCER_EPOCH: the ended transaction's epoch
        assert produce(b"a0", epoch + 1, 0) == 0
        assert end(epoch + 1, commit=False) == epoch + 2
    finally:
        coordinator.close()
        to_leader.close()
    wait_until(lambda: cluster.describe_topic(topic)[0]["high_watermark"] == 4, 30, "the ABORT marker")
    with cluster.consumer(enable_auto_commit=False, isolation_level="read_committed", auto_offset_reset="earliest") as reader:
        reader.assign([TopicPartition(topic, 0)])
        records = [r.value for batch in reader.poll(timeout_ms=5000).values() for r in batch]
    assert records == [b"c0"], "the committed record only: not the late one, nor the aborted"


# Last in the module: it kills a broker, and the tests after it would find 2 of 3 brokers live.
class PartitionWriter:
    """Writes to every partition of a topic in a thread, a record to each every 20 ms
    (librdkafka, linger.ms 2), until `stop`."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self._producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
        self._topic, self._partitions = topic, partitions
        self._rounds = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            for p in range(self._partitions):
                self._producer.produce(self._topic, value=b"%d-%d" % (p, self._rounds), partition=p)
            self._producer.poll(0)
            self._rounds += 1
            time.sleep(0.02)
        assert self._producer.flush(30) == 0

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(30)

    def counts(self) -> dict[int, int]:
        """Records written per partition (once stopped: each partition's end offset)."""
        return {p: self._rounds for p in range(self._partitions)}

    def written(self) -> set[tuple[int, int]]:
        """Every (partition, offset) written (once stopped)."""
        return {(p, o) for p in range(self._partitions) for o in range(self._rounds)}


CLASSIC = {"group.protocol": "classic", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
           "partition.assignment.strategy": "cooperative-sticky"}


class ProtocolMember:
    """A confluent-kafka consumer with group.protocol=consumer (KIP-848), or with `settings`
    (CLASSIC), polling in a thread: what it received (partition, offset, time) and each
    partition it was given or had taken away, as its rebalance callbacks saw them."""

    def __init__(self, bootstrap: str, group_id: str, topic: str, name: str, **settings: Any) -> None:
        self.name = name
        self.consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group_id, "group.protocol": "consumer",
            "auto.offset.reset": "earliest", "client.id": name, "auto.commit.interval.ms": 200, **settings,
        })
        self.received: list[tuple[int, int, float]] = []
        self.revoked: list[int] = []
        self.assignment: set[int] = set()  # partition numbers (of the one topic most tests use)
        self.topic_partitions: set[tuple[str, int]] = set()
        self.errors: list[Any] = []
        self._stop = threading.Event()
        self.consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _assigned(self, consumer, partitions) -> None:
        self.assignment |= {p.partition for p in partitions}
        self.topic_partitions |= {(p.topic, p.partition) for p in partitions}

    def _revoked(self, consumer, partitions) -> None:
        gone = {p.partition for p in partitions}
        self.revoked += sorted(gone)
        self.assignment -= gone
        self.topic_partitions -= {(p.topic, p.partition) for p in partitions}

    def topics(self) -> set[str]:
        return {t for t, _ in self.topic_partitions}

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.consumer.poll(0.1)
            if message is None:
                continue
            if message.error() is not None:
                self.errors.append(message.error())
                continue
            self.received.append((message.partition(), message.offset(), time.monotonic()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()


def test_confluent_consumers_of_the_consumer_protocol_split_partitions_and_move_only_those_that_must(cluster, bootstrap):
    """KIP-848 with librdkafka's group.protocol=consumer: two members split a 4-partition
    topic within two heartbeats; a third joins and the second leaves, and the partitions
    that stay with the first are consumed throughout (never revoked, no pause); every
    record sent is received, and the group's committed offsets reach the end."""
    topic = new_topic(cluster, partitions=4, replication_factor=1)  # (groups need no replicas)
    group_id = f"kip848-{topic}"
    writer = PartitionWriter(bootstrap, topic, 4)

    members = [ProtocolMember(bootstrap, group_id, topic, "a")]
    try:
        wait_until(lambda: len(members[0].assignment) == 4, 30, "the first member to get every partition")
        started = time.monotonic()
        members.append(ProtocolMember(bootstrap, group_id, topic, "b"))
        wait_until(lambda: len(members[0].assignment) == len(members[1].assignment) == 2, 30, "the split")
        split_s = time.monotonic() - started
        # Join, then the assignment: B's first heartbeat, A's next (it revokes two), A's
        # acknowledgement and B's next: two heartbeat intervals and the time to join, a few
        # seconds on a loaded machine, where a heartbeat may time out (librdkafka gives it
        # about one interval) and go again. What it must never wait for is a timeout of the
        # group: the session's (45 s) or the rebalance's (5 minutes).
        assert split_s < 4 * HEARTBEAT_INTERVAL_MS / 1000 + 6, f"the split took {split_s:.1f} s"
        kept_by_a = set(members[0].assignment)
        revoked_before = len(members[0].revoked)
        members.append(ProtocolMember(bootstrap, group_id, topic, "c"))
        wait_until(lambda: len(members[2].assignment) >= 1, 30, "the third member to get a partition")
        churn_started = time.monotonic()
        members[1].close()
        wait_until(lambda: len(members[0].assignment) + len(members[2].assignment) == 4
                   and not members[0].assignment & members[2].assignment, 30, "b's partitions to move")
        churn_ended = time.monotonic()
        time.sleep(0.5)
        writer.stop()
        a = members[0]
        # A was never made to give up a partition it ended with: its pauses are only the
        # moved partitions'.
        stayed = kept_by_a & a.assignment
        assert stayed, (kept_by_a, a.assignment)
        assert not set(a.revoked[revoked_before:]) & stayed
        for p in stayed:
            times = [t for q, _, t in a.received if q == p and churn_started - 1 <= t <= churn_ended + 0.5]
            gaps = [b - x for x, b in zip(times, times[1:])]
            assert times and max(gaps, default=0) < 2.0, f"partition {p} paused {max(gaps):.1f} s while the group changed"
        wait_until(lambda: {(p, o) for m in members for p, o, _ in m.received} >= writer.written(), 30,
                   "every record to arrive")
        assert not [e for m in members for e in m.errors if not e.retriable()], [m.errors for m in members]
    finally:
        writer.stop()
        for m in members:
            if not m._stop.is_set():
                m.close()
    described = cluster.admin().describe_consumer_groups([group_id])[group_id]
    assert described.protocol_type == "consumer" and described.state == "Empty"
    assert {tp.partition: lag.committed for tp, lag in described.partitions.items()} == writer.counts()


def test_a_classic_group_is_upgraded_member_by_member_and_downgraded_while_it_consumes(cluster, bootstrap):
    """Kafka 4's online migration with librdkafka: two classic members (cooperative-sticky)
    consume; a member with group.protocol=consumer joins and the group becomes a consumer
    group in which the classic ones go on as classic members; they are replaced one by one
    by consumer-protocol members; a classic member then joins the consumer group, and when
    the consumer-protocol members leave the group is a classic group again. Members never
    share a partition, and every record sent is received."""
    topic = new_topic(cluster, partitions=4, replication_factor=1)  # (groups need no replicas)
    group_id = f"migrate-{topic}"
    writer = PartitionWriter(bootstrap, topic, 4)

    def group_type() -> str:
        return next(g.type for g in admin.list_consumer_groups().result().valid if g.group_id == group_id).name

    def settled(*members: ProtocolMember) -> bool:
        owned = [m.assignment for m in members]
        return all(owned) and sum(map(len, owned)) == 4 and len(set().union(*owned)) == 4

    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    everyone: list[ProtocolMember] = []

    def member(name: str, **settings: Any) -> ProtocolMember:
        everyone.append(ProtocolMember(bootstrap, group_id, topic, name, **settings))
        return everyone[-1]

    try:
        c1, c2 = member("c1", **CLASSIC), member("c2", **CLASSIC)
        wait_until(lambda: settled(c1, c2), 30, "the classic members to split the partitions")
        assert group_type() == "CLASSIC"
        n1 = member("n1")
        wait_until(lambda: settled(c1, c2, n1), 30, "the upgraded group to assign n1 some partitions")
        assert group_type() == "CONSUMER"
        c1.close()
        n2 = member("n2")
        wait_until(lambda: settled(c2, n1, n2), 30, "n2 to replace c1")
        c2.close()
        wait_until(lambda: settled(n1, n2), 30, "the consumer-protocol members to take c2's partitions")
        c3 = member("c3", **CLASSIC)
        # 60 s: a fresh-clone run on a loaded machine (librdkafka's heartbeats timing out)
        # once took longer than 30 s here; every other run took a few seconds.
        wait_until(lambda: settled(n1, n2, c3), 60, "a classic member to join the consumer group")
        n1.close()
        n2.close()
        wait_until(lambda: len(c3.assignment) == 4, 30, "c3 to take every partition")
        assert group_type() == "CLASSIC", "downgraded once its consumer-protocol members left"
        writer.stop()
        wait_until(lambda: {(p, o) for m in everyone for p, o, _ in m.received} >= writer.written(), 30,
                   "every record to arrive")
        assert not [e for m in everyone for e in m.errors if not e.retriable()], [m.errors for m in everyone]
    finally:
        writer.stop()
        for m in everyone:
            if not m._stop.is_set():
                m.close()


def test_a_consumer_protocol_regex_subscription_takes_the_matching_topics_those_created_later_too(cluster, bootstrap):
    """librdkafka sends a subscription starting with ^ as KIP-848's subscribed_topic_regex:
    the coordinator resolves it at every heartbeat, so a matching topic created while the
    member runs is assigned to it, and one that does not match never is."""
    prefix = f"rx{next(_names)}"
    for name in (f"{prefix}-a", f"{prefix}-b", f"other-{prefix}"):
        cluster.create_topic(name, num_partitions=1, replication_factor=1)
    member = ProtocolMember(bootstrap, f"regex-{prefix}", f"^{prefix}-.*", "regex")
    try:
        wait_until(lambda: member.topics() == {f"{prefix}-a", f"{prefix}-b"}, 30, "the matching topics")
        cluster.create_topic(f"{prefix}-c", num_partitions=2, replication_factor=1)
        wait_until(lambda: member.topics() == {f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"}, 30, "the new topic")
        assert len(member.topic_partitions) == 4
    finally:
        member.close()


def test_rayk_and_confluent_consumers_share_a_consumer_protocol_group(cluster, bootstrap):
    """rayk's Consumer with group_protocol="consumer" and a librdkafka member in one KIP-848
    group: they split the partitions, rayk's commits carry its member epoch, and when it
    leaves the other takes its partitions from where it committed. Every record is read
    once: a revoked partition's offsets are committed before it is released."""
    topic = new_topic(cluster, partitions=4, replication_factor=1)  # (groups need no replicas)
    group_id = f"mixed848-{topic}"
    producer = cluster.producer()
    for i in range(200):
        producer.send(topic, b"first-%d" % i, partition=i % 4)
    producer.flush()
    received: list[tuple[int, int]] = []
    assignments: list[set[int]] = []
    stop = threading.Event()
    consumer = cluster.consumer(topic, group_id=group_id, group_protocol="consumer", auto_offset_reset="earliest",
                                auto_commit_interval_ms=200)

    def run_rayk() -> None:
        while not stop.is_set():
            for tp, records in consumer.poll(timeout_ms=100).items():
                received.extend((tp.partition, r.offset) for r in records)
            now = {tp.partition for tp in consumer.assignment()}
            if not assignments or assignments[-1] != now:
                assignments.append(now)
        consumer.commit()
        consumer.close()

    rayk_thread = threading.Thread(target=run_rayk, daemon=True)
    rayk_thread.start()
    other = None
    try:
        wait_until(lambda: assignments and len(assignments[-1]) == 4, 30, "rayk's consumer to get every partition")
        other = ProtocolMember(bootstrap, group_id, topic, "librdkafka")
        wait_until(lambda: len(other.assignment) == 2 and len(assignments[-1]) == 2, 30, "the split")
        assert not other.assignment & assignments[-1]
        wait_until(lambda: len({r for r in received} | {(p, o) for p, o, _ in other.received}) == 200, 30,
                   "the first 200 records")
        stop.set()
        rayk_thread.join(60)
        assert not rayk_thread.is_alive()
        wait_until(lambda: len(other.assignment) == 4, 30, "the librdkafka member to take every partition")
        for i in range(100):
            producer.send(topic, b"second-%d" % i, partition=i % 4)
        producer.flush()
        wait_until(lambda: len({(p, o) for p, o, _ in other.received} | set(received)) == 300, 30, "every record")
        assert not [e for e in other.errors if not e.retriable()], other.errors
        everything = received + [(p, o) for p, o, _ in other.received]
        assert len(everything) == 300, "each member took its partitions where the other committed: no record twice"
    finally:
        stop.set()
        if other is not None:
            other.close()
    described = cluster.admin().describe_consumer_groups([group_id])[group_id]
    assert {tp.partition: lag.committed for tp, lag in described.partitions.items()} == {p: 75 for p in range(4)}


def test_consumer_group_heartbeat_and_describe_answer_kafkas_errors_and_name_partitions_by_topic_id(cluster, bootstrap):
    """KIP-848 on the wire, request by request: Kafka's checks and errors, the assignment by
    topic id (in every answer, since the one that changed it may be lost, where Kafka
    answers null for "unchanged"), ConsumerGroupDescribe, ListGroups'
    group type, Metadata by topic id (how librdkafka learns the assigned topics' names)."""
    topic = new_topic(cluster, partitions=2, replication_factor=1)
    group_id = f"raw848-{topic}"
    topic_id = kafka_uuid(cluster.describe_topic(topic)[0]["topic_id"])
    connection = coordinator_connection(bootstrap, group_id, key_type=0)

    def heartbeat(**values):
        return connection.call(CONSUMER_GROUP_HEARTBEAT, 1, {
            "group_id": group_id, "member_id": "m1", "member_epoch": 0, "rebalance_timeout": 30_000,
            "subscribed_topic_names": [topic], "topic_partitions": [], **values})

    try:
        for refused in ({"member_id": ""}, {"rebalance_timeout": -1}, {"subscribed_topic_names": None},
                        {"topic_partitions": None}, {"member_epoch": -2}):
            assert heartbeat(**refused).error_code.value == 42, refused  # INVALID_REQUEST
        assert heartbeat(server_assignor="sticky").error_code.value == 112  # UNSUPPORTED_ASSIGNOR
        assert heartbeat(subscribed_topic_names=None, subscribed_topic_regex="(").error_code.value == 128
        joined = heartbeat()
        assert (joined.error_code.value, joined.member_id, joined.member_epoch) == (0, "m1", 1)
        assert joined.heartbeat_interval.total_seconds() * 1000 == HEARTBEAT_INTERVAL_MS
        [assigned] = joined.assignment.topic_partitions
        assert (assigned.topic_id, sorted(assigned.partitions)) == (topic_id, [0, 1])
        same = heartbeat(member_epoch=1, rebalance_timeout=-1, subscribed_topic_names=None, topic_partitions=None)
        [again] = same.assignment.topic_partitions  # unchanged, and said again (Kafka: null)
        assert (same.error_code.value, same.member_epoch, again.topic_id, sorted(again.partitions)) == (0, 1, topic_id, [0, 1])
        assert heartbeat(member_epoch=7, topic_partitions=None).error_code.value == 110  # FENCED_MEMBER_EPOCH
        assert heartbeat(member_id="m2", member_epoch=3, topic_partitions=None).error_code.value == 25  # UNKNOWN_MEMBER_ID

        partitions = BrokerConfig().offsets_topic_num_partitions
        no_such_group = next(g for g in (f"no-such-group-{i}" for i in itertools.count())
                             if coordinator_partition(g, partitions) == coordinator_partition(group_id, partitions))
        [described, unknown] = connection.call(CONSUMER_GROUP_DESCRIBE, 1, {
            "group_ids": [group_id, no_such_group], "include_authorized_operations": False}).groups
        assert (described.error_code.value, described.group_state, described.group_epoch) == (0, "Stable", 1)
        [member] = described.members
        [owned] = member.assignment.topic_partitions
        assert (member.member_id, member.member_epoch, member.client_id, member.member_type) == ("m1", 1, "test", 1)
        assert (owned.topic_id, owned.topic_name, sorted(owned.partitions)) == (topic_id, topic, [0, 1])
        assert unknown.error_code.value == 69  # GROUP_ID_NOT_FOUND
        classic_view = connection.call(DESCRIBE_GROUPS, 5, {"groups": [group_id], "include_authorized_operations": False})
        assert classic_view.groups[0].error_code.value == 69, "DescribeGroups describes classic groups"
        listed = connection.call(LIST_GROUPS, 5, {"states_filter": [], "types_filter": []}).groups
        assert [(g.group_state, g.group_type) for g in listed if g.group_id == group_id] == [("Stable", "consumer")]
        for kind, expected in (("Consumer", [group_id]), ("classic", [])):  # (v5's filter, case as Kafka's tools send it)
            listed = connection.call(LIST_GROUPS, 5, {"states_filter": [], "types_filter": [kind]}).groups
            assert [g.group_id for g in listed if g.group_id == group_id] == expected, kind

        by_id = connection.call(METADATA, 12, {"topics": [{"name": None, "topic_id": topic_id},
                                                          {"name": None, "topic_id": uuid.UUID(int=1)}],
                                               "allow_auto_topic_creation": True,
                                               "include_topic_authorized_operations": False}).topics
        assert [(t.name, t.topic_id, t.error_code.value) for t in by_id] == [
            (topic, topic_id, 0), (None, uuid.UUID(int=1), 100)]  # UNKNOWN_TOPIC_ID

        # A second member joins; m1's answer telling it to give a partition up is lost (as
        # when librdkafka's heartbeat times out, it asks again reporting nothing), and so is
        # m2's answer giving it that partition: every answer carries the assignment, so
        # the next one says it again.
        def incremental(member_id: str, epoch: int, **values):
            return heartbeat(**{"member_id": member_id, "member_epoch": epoch, "rebalance_timeout": -1,
                                "subscribed_topic_names": None, "topic_partitions": None, **values})

        def partitions_of(answer) -> list[int]:
            return sorted(p for tp in answer.assignment.topic_partitions for p in tp.partitions)

        joined = heartbeat(member_id="m2")
        assert (joined.error_code.value, joined.member_epoch, partitions_of(joined)) == (0, 2, [])
        told, asked_again = incremental("m1", 1), incremental("m1", 1)
        assert told.member_epoch == asked_again.member_epoch == 1 and len(partitions_of(told)) == 1
        assert asked_again.assignment is not None and partitions_of(asked_again) == partitions_of(told)
        waiting = incremental("m2", 2)
        assert partitions_of(waiting) == [], "still held by m1: answered (empty) while m2 waits for it"
        acked = incremental("m1", 1, topic_partitions=[{"topic_id": topic_id, "partitions": partitions_of(told)}])
        assert (acked.member_epoch, partitions_of(acked)) == (2, partitions_of(told))
        assert partitions_of(incremental("m1", 2)) == partitions_of(told), "reconciled: the same again"
        released = incremental("m2", 2)
        assert partitions_of(released) == sorted({0, 1} - set(partitions_of(told)))
        assert partitions_of(incremental("m2", 2)) == partitions_of(released), "that answer lost: said again"
        for member_id in ("m1", "m2"):
            left = incremental(member_id, -1)
            assert (left.error_code.value, left.member_epoch) == (0, -1)
    finally:
        connection.close()


def test_confluent_idempotent_producer_loses_no_acknowledged_record_across_a_leader_failover(cluster, bootstrap):
    """Runs last in this module: it kills a broker."""
    topic = f"k{next(_names)}"
    cluster.create_topic(topic, num_partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    leader_id = cluster.describe_topic(topic)[0]["leader"]
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                        "linger.ms": 2, "message.timeout.ms": 60000})
    acked, failed = [], []

    def delivered(err, msg):
        (failed if err else acked).append(err or msg.value())

    for i in range(600):
        producer.produce(topic, value=b"%05d" % i, on_delivery=delivered)
        producer.poll(0)
        if i == 200:
            ray.kill(cluster.broker(leader_id))
        time.sleep(0.003)
    assert producer.flush(90) == 0
    assert not failed, failed[:3]
    assert cluster.describe_topic(topic)[0]["leader"] != leader_id
    stored = [r.value for r in kafka_python_read(cluster.bootstrap_servers, topic, len(acked), partitions=1)]
    assert set(acked) <= set(stored), f"{len(set(acked) - set(stored))} acknowledged records lost"
    assert len(stored) == len(set(stored)), "idempotence: no record written twice"


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_a_static_rayk_consumer_that_closes_is_replaced_by_one_with_its_instance_id_and_nothing_else_moves(
        cluster, protocol):  # fmt: skip
    """rayk's Consumer with group_instance_id: closing leaves its partitions waiting for it
    (KIP-848: epoch -2; classic: no LeaveGroup) instead of going to the other member; a
    consumer made with the same instance id (a restarted Ray actor, say) gets them back,
    and the other member's partitions never move."""
    topic = new_topic(cluster, partitions=4, replication_factor=1)
    group_id = f"static-{protocol}-{topic}"
    settings = {"group_id": group_id, "group_protocol": protocol, "auto_offset_reset": "earliest"}
    static = cluster.consumer(topic, group_instance_id="worker-a", **settings)
    other = cluster.consumer(topic, **settings)
    replacement = None

    def split(*consumers) -> list[set[int]]:
        for c in consumers:
            c.poll(timeout_ms=50)
        return [{tp.partition for tp in c.assignment()} for c in consumers]

    try:
        wait_until(lambda: [len(s) for s in split(static, other)] == [2, 2], 30, "the split")
        held, others = split(static, other)
        static.close()
        ends = time.monotonic() + 3 * HEARTBEAT_INTERVAL_MS / 1000
        while time.monotonic() < ends:  # heartbeats go on: nothing moves to the other member
            assert split(other) == [others]
        members = cluster.admin().describe_consumer_groups([group_id])[group_id].members
        assert len(members) == 2, "the static member keeps its place"
        replacement = cluster.consumer(topic, group_instance_id="worker-a", **settings)
        wait_until(lambda: split(replacement, other) == [held, others], 30, "the replacement to take its partitions")
    finally:
        for c in (static, other, replacement):
            if c is not None:
                c.close()


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_two_live_rayk_consumers_with_one_instance_id_end_with_one_of_them_refused(cluster, protocol):
    """Kafka's rules for an instance id in use: the classic protocol lets the newcomer take
    it and fences the old member (FencedInstanceIdError at its next poll); KIP-848 refuses
    the newcomer while the holder lives (UnreleasedInstanceIdError)."""
    topic = new_topic(cluster, partitions=2, replication_factor=1)
    settings = {"group_id": f"dup-{protocol}-{topic}", "group_protocol": protocol, "group_instance_id": "same"}
    first, second = cluster.consumer(topic, **settings), None
    try:
        wait_until(lambda: first.poll(timeout_ms=50) or first.assignment(), 30, "the first to join")
        second = cluster.consumer(topic, **settings)
        refused, expected = (first, FencedInstanceIdError) if protocol == "classic" else (second, UnreleasedInstanceIdError)
        deadline = time.monotonic() + 30
        with pytest.raises(expected):
            while time.monotonic() < deadline:
                for c in (second, first):
                    c.poll(timeout_ms=50)
    finally:
        for c in (first, second):
            if c is not None:
                c.close()
