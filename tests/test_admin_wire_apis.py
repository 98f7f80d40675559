"""Kafka's config and record-deletion admin APIs over the wire, as real clients use them
(confluent-kafka's AdminClient, raw frames for what a client would not send): every topic
config described with a value that AlterConfigs takes back; IncrementalAlterConfigs'
SET / DELETE / APPEND / SUBTRACT and per-resource errors; broker configs refused as not
dynamic; DeleteRecords moving the log start for consumers, followers, retention and the
checkpoint, from a Kafka client, rayk's Admin and the CLI."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import confluent_kafka
import confluent_kafka.admin as confluent_admin
import pytest
import ray
from confluent_kafka import KafkaError as ConfluentError
from confluent_kafka import TopicPartition as ConfluentTopicPartition

import rayk
from rayk.client import TopicPartition
from rayk.errors import OffsetOutOfRangeError, PolicyViolationError
from rayk.net.api_versions import ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS
from tests.cluster_helpers import FAST_CONFIG, shared_local_ray, wait_until
from tests.protocol_helpers import RawConnection

NAMESPACE = "admin-wire-apis"
REPO = Path(__file__).resolve().parents[1]
LONG_MAX = "9223372036854775807"
TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_CONFIG, INVALID_REQUEST = 0, 1, 3, 40, 42
_names = itertools.count()


@pytest.fixture(scope="module")
def address():
    return shared_local_ray()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("admin-wire-apis")


@pytest.fixture(scope="module")
def cluster(address, data_dir):
    c = rayk.start(brokers=2, data_dir=data_dir, config={**FAST_CONFIG, "auto.leader.rebalance.enable": False},
                   namespace=NAMESPACE)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def admin(cluster):
    return confluent_admin.AdminClient({"bootstrap.servers": cluster.bootstrap_servers})


def new_topic(cluster, configs: dict | None = None) -> str:
    name = f"w{next(_names)}"
    cluster.create_topic(name, num_partitions=1, replication_factor=2, config=configs)
    return name


def described(admin, topic: str) -> dict[str, confluent_admin.ConfigEntry]:
    resource = confluent_admin.ConfigResource(confluent_admin.ResourceType.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(30)


def error_code(future) -> int:
    try:
        future.result(30)
    except confluent_kafka.KafkaException as e:
        return e.args[0].code()
    return NONE


def broker_address(cluster, broker_id: int) -> str:
    (broker,) = [b for b in cluster.brokers() if b["broker_id"] == broker_id]
    return "%s:%d" % tuple(broker["endpoints"]["PLAINTEXT"])


def incremental(connection: RawConnection, resources: list[tuple[int, str, list[tuple[str, int, str | None]]]],
                validate_only: bool = False) -> list[tuple[str, int]]:
    """IncrementalAlterConfigs v1; (resource name, error code) per resource."""
    body = {"validate_only": validate_only, "resources": [
        {"resource_type": t, "resource_name": n, "configs": [{"name": c, "config_operation": op, "value": v} for c, op, v in cs]}
        for t, n, cs in resources]}
    return [(r.resource_name, r.error_code.value) for r in connection.call(INCREMENTAL_ALTER_CONFIGS, 1, body).responses]


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")  # the legacy API is the one under test
def test_describe_configs_gives_every_topic_config_a_value_that_alter_configs_takes_back(cluster, admin):
    """Kafka describes flush.messages and flush.ms as Long.MAX_VALUE, not null; a client
    that writes back what it read (legacy AlterConfigs replaces the whole set) must succeed."""
    topic = new_topic(cluster)
    entries = described(admin, topic)
    assert {name for name, e in entries.items() if e.value is None} == set()
    assert entries["flush.messages"].value == entries["flush.ms"].value == LONG_MAX
    assert entries["message.timestamp.type"].value == "CreateTime"
    values = {name: e.value for name, e in entries.items()}
    resource = confluent_admin.ConfigResource(confluent_admin.ResourceType.TOPIC, topic, set_config=values)
    assert error_code(admin.alter_configs([resource])[resource]) == NONE
    assert {name: e.value for name, e in described(admin, topic).items()} == values
    assert cluster.admin().describe_topic_configs(topic) == values, "each is now the topic's own"


def test_incremental_alter_configs_sets_deletes_appends_and_subtracts(cluster, admin):
    topic = new_topic(cluster)
    ops = confluent_admin.AlterConfigOpType

    def alter(*entries: tuple[str, str | None, confluent_admin.AlterConfigOpType], validate_only: bool = False) -> int:
        resource = confluent_admin.ConfigResource(
            confluent_admin.ResourceType.TOPIC, topic,
            incremental_configs=[confluent_admin.ConfigEntry(n, v, incremental_operation=op) for n, v, op in entries])
        return error_code(admin.incremental_alter_configs([resource], validate_only=validate_only)[resource])

    assert alter(("retention.ms", "3600000", ops.SET), ("cleanup.policy", "compact", ops.APPEND)) == NONE
    assert cluster.admin().describe_topic_configs(topic) == {"retention.ms": "3600000", "cleanup.policy": "delete,compact"}
    assert alter(("cleanup.policy", "delete", ops.SUBTRACT), ("min.insync.replicas", "2", ops.SET)) == NONE
    assert cluster.admin().describe_topic_configs(topic) == {
        "retention.ms": "3600000", "cleanup.policy": "compact", "min.insync.replicas": "2"}
    assert alter(("retention.ms", None, ops.DELETE), ("min.insync.replicas", "1", ops.SET), validate_only=True) == NONE
    assert cluster.admin().describe_topic_configs(topic)["retention.ms"] == "3600000", "validate_only changes nothing"
    assert alter(("retention.ms", None, ops.DELETE)) == NONE
    entries = described(admin, topic)
    assert entries["retention.ms"].value == "604800000" and entries["cleanup.policy"].value == "compact"
    assert entries["retention.ms"].source == confluent_admin.ConfigSource.DEFAULT_CONFIG.value


def replicas(cluster, topic: str, partition: int = 0) -> list:
    """The partition's replica handles, its leader's first."""
    (state,) = [p for p in cluster.describe_topic(topic) if p["partition"] == partition]
    brokers = sorted(state["replicas"], key=lambda b: b != state["leader"])
    return [ray.get(cluster.controller.replica.remote(topic, partition, b)) for b in brokers]


def test_alter_configs_answers_each_resource_with_kafkas_error_and_changes_nothing_else(cluster):
    topic = new_topic(cluster, {"retention.ms": "5000"})
    connection = RawConnection(cluster.bootstrap_servers)
    try:
        answers = incremental(connection, [
            (TOPIC, "no-such-topic", [("retention.ms", SET, "1")]),
            (TOPIC, topic, [("retention.ms", SET, "soon")]),
        ])
        assert answers == [("no-such-topic", UNKNOWN_TOPIC_OR_PARTITION), (topic, INVALID_CONFIG)]
        for configs, code in [
            ([("retention.ms", APPEND, "1")], INVALID_CONFIG),  # not a list config
            ([("no.such.config", SET, "1")], INVALID_CONFIG),
            ([("cleanup.policy", APPEND, "shred")], INVALID_CONFIG),  # no such policy
            ([("retention.ms", SET, None)], INVALID_REQUEST),
            ([("retention.ms", 7, "1")], INVALID_REQUEST),
            ([("retention.ms", SET, "1"), ("retention.ms", DELETE, None)], INVALID_REQUEST),
        ]:
            assert incremental(connection, [(TOPIC, topic, configs)]) == [(topic, code)], configs
        twice = incremental(connection, [(TOPIC, topic, [("retention.ms", SET, "1")])] * 2)
        assert twice == [(topic, INVALID_REQUEST)] * 2
        assert incremental(connection, [(99, "x", [])]) == [("x", INVALID_REQUEST)]
        legacy = connection.call(ALTER_CONFIGS, 0, {"validate_only": False, "resources": [
            {"resource_type": TOPIC, "resource_name": topic, "configs": [{"name": "segment.bytes", "value": "-5"}]}]})
        assert [r.error_code.value for r in legacy.responses] == [INVALID_CONFIG]
    finally:
        connection.close()
    assert cluster.admin().describe_topic_configs(topic) == {"retention.ms": "5000"}


def test_broker_configs_are_refused_as_kafka_refuses_configs_that_are_not_dynamic(cluster, admin):
    connection = RawConnection(broker_address(cluster, 0))
    try:
        answers = incremental(connection, [
            (BROKER, "0", [("log.retention.check.interval.ms", SET, "1000")]),
            (BROKER, "", [("num.partitions", SET, "4")]),
            (BROKER, "1", [("num.partitions", SET, "4")]),  # not the broker asked
            (BROKER, "zero", [("num.partitions", SET, "4")]),
        ])
        assert answers == [("0", INVALID_REQUEST), ("", INVALID_REQUEST), ("1", INVALID_REQUEST), ("zero", INVALID_REQUEST)]
        assert incremental(connection, [(BROKER, "0", [("no.such.setting", SET, "1")])]) == [("0", INVALID_CONFIG)]
        assert incremental(connection, [(BROKER, "0", [("num.partitions", DELETE, None)])]) == [("0", NONE)], (
            "nothing is set dynamically: nothing to delete")
    finally:
        connection.close()
    resource = confluent_admin.ConfigResource(
        confluent_admin.ResourceType.BROKER, "0",
        incremental_configs=[confluent_admin.ConfigEntry("num.partitions", "4",
                                                         incremental_operation=confluent_admin.AlterConfigOpType.SET)])
    assert error_code(admin.incremental_alter_configs([resource])[resource]) == ConfluentError.INVALID_REQUEST
    assert ray.get(cluster.controller.broker_config.remote()).num_partitions == 1


def produce_one_batch_each(cluster, topic: str, count: int) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all", "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, b"v" * 100, partition=0)
        producer.flush(30)
    assert len(producer) == 0


def log_start_offsets_checkpointed(data_dir: Path, topic: str) -> list[int]:
    found = []
    for checkpoint in sorted(data_dir.glob("broker-*/log-start-offset-checkpoint")):
        for line in checkpoint.read_text().splitlines()[2:]:
            name, partition, offset = line.split()
            if (name, partition) == (topic, "0"):
                found.append(int(offset))
    return found


def test_delete_records_moves_the_log_start_for_consumers_followers_retention_and_the_checkpoint(cluster, admin, data_dir):
    topic = new_topic(cluster, {"segment.bytes": "1500"})  # ~8 one-record batches a segment
    produce_one_batch_each(cluster, topic, 40)
    deleted = admin.delete_records([ConfluentTopicPartition(topic, 0, 25)])
    (future,) = deleted.values()
    assert future.result(30).low_watermark == 25
    above_hw = admin.delete_records([ConfluentTopicPartition(topic, 0, 41)])
    assert error_code(next(iter(above_hw.values()))) == ConfluentError.OFFSET_OUT_OF_RANGE

    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "unused",
                                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        assert consumer.get_watermark_offsets(ConfluentTopicPartition(topic, 0), timeout=30) == (25, 40)
        consumer.assign([ConfluentTopicPartition(topic, 0, 3)])  # below the log start: out of range, reset
        message = None
        while message is None or message.error() is not None:
            message = consumer.poll(1)
        assert message.offset() == 25
    finally:
        consumer.close()

    leader, follower = replicas(cluster, topic)
    wait_until(lambda: ray.get(follower.log_size.remote())[0] == 25, 30, "the follower to take the leader's log start")
    for replica in (leader, follower):
        assert ray.get(replica.enforce_retention.remote()) >= 1, "segments wholly below the log start go"
        assert 0 < ray.get(replica.log_size.remote())[0] == 25
    wait_until(lambda: log_start_offsets_checkpointed(data_dir, topic) == [25, 25], 30, "the log-start-offset checkpoints")

    (to_hw,) = admin.delete_records([ConfluentTopicPartition(topic, 0, -1)]).values()
    assert to_hw.result(30).low_watermark == 40


def test_admin_and_cli_delete_records(cluster, address):
    topic = new_topic(cluster)
    produce_one_batch_each(cluster, topic, 10)
    admin = cluster.admin()
    assert admin.delete_records({(topic, 0): 4}) == {TopicPartition(topic, 0): 4}
    with pytest.raises(OffsetOutOfRangeError):
        admin.delete_records({(topic, 0): 11})
    compacted = new_topic(cluster, {"cleanup.policy": "compact"})
    with pytest.raises(PolicyViolationError):
        admin.delete_records({(compacted, 0): 0})
    result = subprocess.run(
        [sys.executable, "-m", "rayk.cli", "topics", "delete-records", topic, "--offset", "7",
         "--address", address, "--namespace", NAMESPACE],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "RAY_AUTH_MODE": "token"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-3:] == [topic, "0", "7"]
    assert ray.get(replicas(cluster, topic)[0].log_size.remote())[0] == 7
