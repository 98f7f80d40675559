"""Partition reassignment (KIP-455) through rayk's Admin API and through Kafka's wire
protocol (kafka-python's KafkaAdminClient: AlterPartitionReassignments and
ListPartitionReassignments), on a 4-broker cluster on local Ray: a partition moves while
it takes writes and keeps every record, its old copy is deleted; a reassignment held up
by a stopped broker is listed and cancelled; bad targets and cancels with nothing to
cancel are refused per partition with Kafka's error codes."""

from __future__ import annotations

import time
import uuid

import confluent_kafka
import confluent_kafka.admin
import kafka.errors as kafka_errors
import pytest
import ray
from ray._private.state import actors as actor_table
from kafka.admin import KafkaAdminClient
from kafka.structs import TopicPartition as KafkaTopicPartition

import rayk
from rayk.metadata.elections import PartitionState
from rayk.server.replica_manager import PartitionAssignment
from rayk.client import PartitionReassignment, TopicPartition
from rayk.errors import (
    InvalidReplicaAssignmentError,
    InvalidTopicError,
    KafkaTimeoutError,
    NoReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)
from rayk.storage.log_manager import partition_dir_name
from tests.cluster_helpers import FAST_CONFIG, Writer, read_replica, shared_local_ray, wait_until

BROKERS = 4
MOVE_S = 60  # generous: two cores shared with the rest of the suite


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("reassignment")


@pytest.fixture(scope="module")
def cluster(data_dir):
    c = rayk.start(brokers=BROKERS, data_dir=data_dir, config=FAST_CONFIG, namespace="reassignment")
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def bootstrap(cluster):
    return cluster.bootstrap_servers


def partition_state(cluster, topic: str, partition: int = 0) -> dict:
    return cluster.describe_topic(topic)[partition]


def settled_on(cluster, topic: str, target: list[int]) -> dict | None:
    """The partition's state once it has exactly `target`, all in sync, nothing moving."""
    p = partition_state(cluster, topic)
    done = p["replicas"] == target and sorted(p["isr"]) == sorted(target) and p["leader"] in target
    return p if done and not p["adding_replicas"] and not p["removing_replicas"] else None


def broker_fenced(cluster, broker_id: int) -> bool:
    return next(b["fenced"] for b in cluster.brokers() if b["broker_id"] == broker_id)


def test_a_partition_moves_to_a_new_broker_under_writes_and_its_old_copy_is_deleted(cluster, data_dir):
    cluster.create_topic("moving", num_partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    assert partition_state(cluster, "moving")["replicas"] == [0, 1, 2], "the module's first topic starts at broker 0"
    tp = TopicPartition("moving", 0)
    admin = cluster.admin()
    writer = Writer(cluster, "moving")
    writer.start()
    try:
        wait_until(lambda: len(writer.acked) >= 50, 60, "acknowledged writes before the move")
        assert admin.alter_partition_reassignments({tp: [3, 1, 2]}) == {tp: None}
        under_way = admin.list_partition_reassignments()
        assert under_way in ({}, {tp: PartitionReassignment([3, 1, 2, 0], [3], [0])}), "or already complete"
        moved = wait_until(lambda: settled_on(cluster, "moving", [3, 1, 2]), MOVE_S, "the move to complete")
        acked_at_move = len(writer.acked)
        wait_until(lambda: len(writer.acked) >= acked_at_move + 20, 60, "writes to go on after the move")
    finally:
        writer.stop()
    assert moved["leader"] != 0 and admin.list_partition_reassignments() == {}

    new_replica = cluster.replica("moving", 0, 3)
    end = max(base + len(values) for base, values in writer.acked)

    def copied() -> dict[int, bytes] | None:
        stored = dict(read_replica(new_replica))
        return stored if len(stored) >= end else None

    stored = wait_until(copied, 30, "broker 3's copy to hold every acknowledged record")
    for base, values in writer.acked:
        for i, value in enumerate(values):
            assert stored[base + i] == value, f"acked record at offset {base + i} on broker 3 is {stored[base + i]!r}"
    assert cluster.replica("moving", 0, 0) is None, "broker 0's replica is gone"
    old_dir = data_dir / "broker-0" / partition_dir_name("moving", 0)
    wait_until(lambda: not old_dir.exists(), 30, f"{old_dir} to be deleted")
    assert (data_dir / "broker-3" / partition_dir_name("moving", 0)).is_dir()


def late_push(described: dict) -> PartitionAssignment:
    """The push the Controller sent for the partition as `described` (a describe_topic
    entry), arriving only now."""
    state = PartitionState(
        tuple(described["replicas"]), tuple(described["isr"]), described["leader"],
        described["leader_epoch"], described["partition_epoch"],
    )
    return PartitionAssignment(described["topic"], described["partition"], described["topic_id"], state, {}, None)


def test_a_push_older_than_a_replicas_removal_or_its_topics_deletion_does_not_bring_it_back(cluster, data_dir):
    """Pushes sent before the Controller stopped a replica (a reassignment dropped it, or
    its topic was deleted) that arrive afterwards must not re-create it as an orphan."""
    cluster.create_topic("late-push", num_partitions=1, replication_factor=3)
    before = partition_state(cluster, "late-push")
    gone = next(b for b in reversed(before["replicas"]) if b != before["leader"])
    target = [b for b in range(BROKERS) if b not in before["replicas"]] + [b for b in before["replicas"] if b != gone]
    tp = TopicPartition("late-push", 0)
    assert cluster.admin().alter_partition_reassignments({tp: target}) == {tp: None}
    wait_until(lambda: settled_on(cluster, "late-push", target), MOVE_S, "the move to complete")
    old_dir = data_dir / f"broker-{gone}" / partition_dir_name("late-push", 0)
    wait_until(lambda: not old_dir.exists(), 30, f"{old_dir} to be deleted")

    removed_from = cluster.broker(gone)
    assert ray.get(removed_from.apply_partition.remote(late_push(before))) is None
    assert ("late-push", 0) not in ray.get(removed_from.describe.remote())["replicas"]
    assert not old_dir.exists(), "no replica, no directory"

    last = partition_state(cluster, "late-push")
    cluster.delete_topic("late-push")
    for broker_id in last["replicas"]:
        manager = cluster.broker(broker_id)
        assert ray.get(manager.apply_partition.remote(late_push(last))) is None
        assert ("late-push", 0) not in ray.get(manager.describe.remote())["replicas"]
        assert not (data_dir / f"broker-{broker_id}" / partition_dir_name("late-push", 0)).exists()


def test_a_replica_whose_partition_nobody_assigns_stops_itself(cluster, data_dir):
    """A replica whose stop never arrived (lost to a Controller restart, say) fetched from a
    leader that was gone, forever: its broker finds it is no longer assigned and removes it."""
    broker_id = 1
    orphan = PartitionAssignment("ghost", 0, "ghost-topic-id-000000", PartitionState((broker_id,), (broker_id,), broker_id, 0, 0), {}, None)
    manager = cluster.broker(broker_id)
    handle = ray.get(manager.apply_partition.remote(orphan))
    # Started (its broker's next look at what is assigned may remove it at once, so its
    # presence in `describe` is not asserted: that raced with the check under load).
    assert handle is not None, "the broker started the replica"
    ghost_dir = data_dir / f"broker-{broker_id}" / partition_dir_name("ghost", 0)
    wait_until(lambda: ("ghost", 0) not in ray.get(manager.describe.remote())["replicas"] and not ghost_dir.exists(),
               60, "the stray replica to stop and its directory to go")
    wait_until(lambda: actor_table(handle._actor_id.hex())["State"] == "DEAD", 30, "its process to end")


def live_replica_actors(namespace: str) -> int:
    return sum(1 for info in actor_table().values()
               if info["State"] == "ALIVE" and info["ActorClassName"] == "PartitionReplica"
               and info.get("RayNamespace", namespace) == namespace)


def test_topics_deleted_at_any_point_of_their_creation_leave_no_replica_or_directory(cluster, data_dir, bootstrap):
    """A client created topics and deleted them while creation went on: every follower
    pushed after the deletion stayed alive, fetching from its deleted leader, with its
    directory. Deletions at several points of a creation leave nothing behind."""
    before = live_replica_actors("reassignment")
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    names = [f"short-lived-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    for name, delay_s in zip(names, (0.0, 0.05, 0.3, 1.0)):
        created = admin.create_topics([confluent_kafka.admin.NewTopic(name, 2, 3)], operation_timeout=0)
        time.sleep(delay_s)
        try:
            created[name].result(30)
        except confluent_kafka.KafkaException:
            pass  # REQUEST_TIMED_OUT or the like: the creation goes on
        deleted = admin.delete_topics([name], operation_timeout=30)
        deleted[name].result(60)
    brokers = [cluster.broker(b) for b in range(BROKERS)]

    def clean() -> bool:
        held = [tp for m in brokers for tp in ray.get(m.describe.remote())["replicas"] if tp[0] in names]
        dirs = [d for d in data_dir.glob("broker-*/short-lived-*") if d.name.rpartition("-")[0] in names]
        return not held and not dirs and live_replica_actors("reassignment") <= before
    wait_until(clean, 60, "no replica process or directory of the deleted topics")


def test_bad_targets_and_cancels_with_nothing_to_cancel_are_refused_per_partition(cluster):
    cluster.create_topic("refused", num_partitions=2, replication_factor=3)
    before = cluster.describe_topic("refused")
    admin = cluster.admin()
    p0, p1 = TopicPartition("refused", 0), TopicPartition("refused", 1)
    answers = admin.alter_partition_reassignments({
        p0: [1, 1],
        ("refused", 1): [],
        ("refused", 7): [0, 1, 2],
        ("no-such-topic", 0): [0, 1, 2],
    })  # fmt: skip
    assert set(answers) == {p0, p1, TopicPartition("refused", 7), TopicPartition("no-such-topic", 0)}
    assert isinstance(answers[p0], InvalidReplicaAssignmentError) and answers[p0].code == 39
    assert isinstance(answers[p1], InvalidReplicaAssignmentError)
    assert isinstance(answers[TopicPartition("refused", 7)], UnknownTopicOrPartitionError)
    assert isinstance(answers[TopicPartition("no-such-topic", 0)], UnknownTopicOrPartitionError)

    unknown_broker = admin.alter_partition_reassignments({p0: [0, 1, 99]})[p0]
    assert isinstance(unknown_broker, InvalidReplicaAssignmentError) and "99" in str(unknown_broker)
    not_ids = admin.alter_partition_reassignments({p0: ["3"], p1: "3,1,2"})
    assert all(isinstance(e, InvalidReplicaAssignmentError) and "integer broker ids" in str(e) for e in not_ids.values())
    cancelled = admin.alter_partition_reassignments({p0: None})[p0]
    assert isinstance(cancelled, NoReassignmentInProgressError) and cancelled.name == "NO_REASSIGNMENT_IN_PROGRESS"
    with pytest.raises(InvalidTopicError, match="not a \\(topic, partition\\) pair"):
        admin.alter_partition_reassignments({"refused": [0, 1, 2]})

    assert cluster.describe_topic("refused") == before, "nothing changed"
    assert admin.list_partition_reassignments([p0, p1, ("no-such-topic", 0)]) == {}
    with pytest.raises(KafkaTimeoutError):
        admin.list_partition_reassignments(timeout_ms=0)


def test_a_reassignment_held_up_by_a_stopped_broker_is_listed_and_cancelled_on_both_doors(cluster):
    cluster.create_topic("held", num_partitions=1, replication_factor=3)
    original = partition_state(cluster, "held")
    stopped = next(b for b in range(BROKERS) if b not in original["replicas"])
    target = [stopped, *original["replicas"][1:]]
    tp = TopicPartition("held", 0)
    admin = cluster.admin()
    ray.kill(cluster.broker(stopped))
    try:
        wait_until(lambda: broker_fenced(cluster, stopped), 30, f"broker {stopped} to be fenced")
        assert admin.alter_partition_reassignments({tp: target}) == {tp: None}
        held = PartitionReassignment([*target, original["replicas"][0]], [stopped], [original["replicas"][0]])
        assert admin.list_partition_reassignments() == {tp: held}
        assert admin.list_partition_reassignments([tp]) == {tp: held}
        p = partition_state(cluster, "held")
        assert (p["adding_replicas"], p["removing_replicas"]) == ([stopped], [original["replicas"][0]])

        kafka_admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
        try:
            ktp = KafkaTopicPartition("held", 0)
            listed = kafka_admin.list_partition_reassignments()
            assert listed == {ktp: {"replicas": held.replicas, "adding_replicas": held.adding_replicas,
                                    "removing_replicas": held.removing_replicas}}  # fmt: skip
            assert kafka_admin.list_partition_reassignments({"held": [0]}) == listed
            assert kafka_admin.alter_partition_reassignments({ktp: None}) == {ktp: None}, "cancelled over the wire"
            assert kafka_admin.list_partition_reassignments() == {}
            again = kafka_admin.alter_partition_reassignments({ktp: None})
            assert again == {ktp: kafka_errors.NoReassignmentInProgressError}
        finally:
            kafka_admin.close()
        reverted = partition_state(cluster, "held")
        # Kafka's revert order: the replicas kept from the target, then the ones it was removing.
        assert reverted["replicas"] == [*original["replicas"][1:], original["replicas"][0]]
        assert sorted(reverted["isr"]) == sorted(original["replicas"]) and reverted["leader"] in original["isr"]
        assert reverted["adding_replicas"] == [] == reverted["removing_replicas"]
        assert isinstance(admin.alter_partition_reassignments({tp: None})[tp], NoReassignmentInProgressError)
    finally:
        wait_until(lambda: cluster.broker(stopped) is None, 30, f"broker {stopped}'s actor to be gone")
        cluster.restart_broker(stopped)
        wait_until(lambda: not broker_fenced(cluster, stopped), 60, f"broker {stopped} back")


def test_kafka_python_moves_a_partition_and_gets_kafkas_per_partition_errors(cluster):
    cluster.create_topic("wire", num_partitions=1, replication_factor=3)
    original = partition_state(cluster, "wire")["replicas"]
    spare = next(b for b in range(BROKERS) if b not in original)
    target = [spare, *original[1:]]
    with cluster.producer(acks="all") as producer:
        for i in range(200):
            producer.send("wire", b"value %d" % i)
    kafka_admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        ktp = KafkaTopicPartition("wire", 0)
        assert kafka_admin.alter_partition_reassignments({ktp: target}) == {ktp: None}
        wait_until(lambda: settled_on(cluster, "wire", target), MOVE_S, "the move to complete")
        assert kafka_admin.list_partition_reassignments() == {}
        refused = kafka_admin.alter_partition_reassignments({
            ktp: [spare, spare],
            KafkaTopicPartition("wire", 3): target,
            KafkaTopicPartition("no-such-topic", 0): target,
        })  # fmt: skip
        assert refused == {
            ktp: kafka_errors.InvalidReplicationAssignmentError,
            KafkaTopicPartition("wire", 3): kafka_errors.UnknownTopicOrPartitionError,
            KafkaTopicPartition("no-such-topic", 0): kafka_errors.UnknownTopicOrPartitionError,
        }
    finally:
        kafka_admin.close()
    values = sorted(v for _, v in read_replica(cluster.replica("wire", 0, spare)))
    assert values == sorted(b"value %d" % i for i in range(200)), "the new replica holds every record"
