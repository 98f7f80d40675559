"""Share groups (KIP-932) on a 3-broker cluster, with rayk's share consumer, librdkafka's
(confluent-kafka's ShareConsumer) and the wire APIs: several members of ONE partition each
receive different records and together every record once; what a member
does not acknowledge comes back to another after the lock duration; a poison record is
archived at the delivery limit; the Admin describes, lists the offsets of and deletes a
share group; share sessions and ShareGroupDescribe on the wire; the work queue of
`make demo` and one of Arrow batches; and acknowledgements survive the death of the partition's leader and of the
group coordinator (kept last: it kills replica processes)."""

from __future__ import annotations

import importlib.util
import itertools
import os
import signal
import threading
import time
from pathlib import Path

import confluent_kafka
import pytest
import ray

import rayk
from rayk.client.share_consumer import IllegalStateError
from rayk.errors import (
    GroupIdNotFoundError,
    InvalidConfigurationError,
    InvalidRequestError,
    InvalidShareSessionEpochError,
    NonEmptyGroupError,
    ShareSessionNotFoundError,
    UnknownTopicOrPartitionError,
)
from rayk.net.api_versions import (
    ALTER_SHARE_GROUP_OFFSETS,
    DELETE_SHARE_GROUP_OFFSETS,
    DESCRIBE_CONFIGS,
    DESCRIBE_SHARE_GROUP_OFFSETS,
    INCREMENTAL_ALTER_CONFIGS,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    SHARE_GROUP_DESCRIBE,
    SHARE_GROUP_HEARTBEAT,
)
from rayk.net.config_apis import DEFAULT_CONFIG_SOURCE, DELETE, GROUP_CONFIG_SOURCE, GROUP_RESOURCE, SET
from tests.cluster_helpers import pid_of, shared_local_ray, wait_until
from rayk.work_queue import WorkQueue
from rayk.net.entities import kafka_uuid
from tests.protocol_helpers import RawConnection

LOCK_MS = 2_000
CONFIG = {"group.share.record.lock.duration.ms": LOCK_MS, "group.share.heartbeat.interval.ms": 500,
          "group.share.session.timeout.ms": 6_000, "group.share.delivery.count.limit": 3,
          "offsets.topic.num.partitions": 1}  # (its replicas are processes to start)
_names = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("share"), config=CONFIG, namespace="share")
    ray.get(c.controller.find_coordinator.remote("warm-up"))
    yield c
    c.shutdown()


def topic_with(cluster, count: int, replication_factor: int = 1) -> tuple[str, str]:
    """A new 1-partition topic of `count` records, and a share group reading it from the start."""
    n = next(_names)
    topic, group = f"share{n}", f"workers{n}"
    cluster.create_topic(topic, num_partitions=1, replication_factor=replication_factor)
    with cluster.producer() as producer:
        for i in range(count):
            producer.send(topic, str(i).encode())
            if i % 10 == 9:
                producer.flush()  # batches of 10: a leader hands out whole batches, so the members share 30 of them
    cluster.admin().alter_share_group_config(group, {"share.auto.offset.reset": "earliest"})
    return topic, group


def drain(consumers, until: int, timeout_s: float = 60) -> dict[int, list[int]]:
    """Polls every consumer in turn (implicit acceptance) until `until` records came in."""
    got: dict[int, list[int]] = {i: [] for i in range(len(consumers))}
    deadline = time.monotonic() + timeout_s
    while sum(map(len, got.values())) < until:
        assert time.monotonic() < deadline, f"only {sum(map(len, got.values()))} of {until} records"
        for i, consumer in enumerate(consumers):
            got[i] += [int(r.value) for r in consumer.poll(200)]
    return got


def test_what_a_member_does_not_acknowledge_comes_back_after_the_lock_and_releases_come_back_at_once(cluster):
    topic, group = topic_with(cluster, 10)
    silent = cluster.share_consumer(topic, group_id=group, acknowledgement_mode="explicit")
    worker = cluster.share_consumer(topic, group_id=group, acknowledgement_mode="explicit")
    try:
        held = []
        deadline = time.monotonic() + 30
        while len(held) < 10 and time.monotonic() < deadline:
            held += silent.poll(500)
        assert sorted(int(r.value) for r in held) == list(range(10))
        with pytest.raises(IllegalStateError):
            silent.poll(0)  # explicit mode: the last poll's records first
        assert worker.poll(500) == []  # all held by the silent member
        started = time.monotonic()
        back = []
        while len(back) < 10 and time.monotonic() - started < 30:
            back += worker.poll(500)
        assert sorted(int(r.value) for r in back) == list(range(10)) and time.monotonic() - started >= LOCK_MS / 1000 / 2
        assert {r.delivery_count for r in back} == {2}
        for r in back[:5]:
            worker.acknowledge(r, "accept")
        for r in back[5:]:
            worker.acknowledge(r, "release")
        assert set(worker.commit().values()) == {None}
        assert sorted(int(r.value) for r in worker.poll(5_000)) == [int(r.value) for r in back[5:]]  # at once
        assert isinstance(cluster.admin().delete_consumer_groups([group])[group], NonEmptyGroupError)
    finally:
        worker.close()
        silent.close()


def test_a_poison_record_is_archived_at_the_delivery_limit(cluster):
    topic, group = topic_with(cluster, 2)
    with cluster.share_consumer(topic, group_id=group, acknowledgement_mode="explicit") as consumer:
        deliveries = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for record in consumer.poll(500):
                if record.value == b"0":
                    deliveries.append(record.delivery_count)
                    consumer.acknowledge(record, "release")
                else:
                    consumer.acknowledge(record, "accept")
            consumer.commit()
            if cluster.admin().list_share_group_offsets(group) == {(topic, 0): 2}:
                break
        assert deliveries == [1, 2, 3]  # group.share.delivery.count.limit 3, then archived


def test_the_admin_moves_a_share_group_s_start_offset_and_refuses_what_does_not_exist(cluster):
    """alter_share_group_offsets starts a partition at an offset, delete_share_group_offsets
    sends it back to share.auto.offset.reset; a partition or topic that does not exist, or a
    negative offset, is a typed error and changes nothing."""
    topic, group = topic_with(cluster, 10)
    admin = cluster.admin()
    for bad, error in [({(topic, 1): 0}, UnknownTopicOrPartitionError), ({("no-such", 0): 0}, UnknownTopicOrPartitionError),
                       ({(topic, 0): -1}, InvalidRequestError)]:  # fmt: skip
        with pytest.raises(error):
            admin.alter_share_group_offsets(group, bad)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_share_group_offsets(group, [topic, "no-such"])
    assert admin.list_share_group_offsets(group) == {}
    admin.alter_share_group_offsets(group, {(topic, 0): 7})
    assert admin.list_share_group_offsets(group) == {(topic, 0): 7}
    with cluster.share_consumer(topic, group_id=group) as consumer:
        assert sorted(drain([consumer], 3)[0]) == [7, 8, 9]
    admin.delete_share_group_offsets(group, [topic])
    assert admin.list_share_group_offsets(group) == {}
    with cluster.share_consumer(topic, group_id=group) as consumer:
        assert sorted(drain([consumer], 10)[0]) == list(range(10))  # from the start again: "earliest"


def kafka_share_consumer(cluster, topic: str, group: str, **settings):
    consumer = confluent_kafka.ShareConsumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                                              **settings})  # fmt: skip
    consumer.subscribe([topic])
    return consumer


def test_kafka_share_consumers_and_rayk_s_share_one_partition_each_record_once(cluster):
    """Two librdkafka share consumers and rayk's in one group on ONE partition: each record
    goes to one of them, all are accepted; the Admin describes the group, which is Empty
    once they close and is then deleted with its state."""
    topic, group = topic_with(cluster, 200)
    kafka = [kafka_share_consumer(cluster, topic, group, **{"max.poll.records": 10}) for _ in range(2)]
    ours = cluster.share_consumer(topic, group_id=group, max_poll_records=10)
    got: dict[str, list[int]] = {"kafka0": [], "kafka1": [], "rayk": []}
    try:
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < 200:
            assert time.monotonic() < deadline, {k: len(v) for k, v in got.items()}
            for i, consumer in enumerate(kafka):
                for message in consumer.poll(0.2):  # implicit mode: accepted by the next poll
                    assert message.error() is None, message.error()
                    got[f"kafka{i}"].append(int(message.value()))
            got["rayk"] += [int(r.value) for r in ours.poll(200)]
        assert sorted(v for values in got.values() for v in values) == list(range(200))  # each once
        assert sum(1 for values in got.values() if values) >= 2, {k: len(v) for k, v in got.items()}
        for consumer in kafka:
            consumer.commit_sync(30)
        ours.commit()
        wait_until(lambda: cluster.admin().list_share_group_offsets(group) == {(topic, 0): 200}, 30, "all accepted")
        description = cluster.admin().describe_share_groups([group])[group]
        assert description["state"] == "Stable" and len(description["members"]) == 3
        assert all(m["assignment"] == [(topic, 0)] for m in description["members"])
    finally:
        for consumer in kafka:
            consumer.close()
        ours.close()
    assert cluster.admin().describe_share_groups([group])[group]["state"] == "Empty"
    assert cluster.admin().delete_consumer_groups([group]) == {group: None}
    with pytest.raises(GroupIdNotFoundError):
        cluster.admin().list_share_group_offsets(group)


def test_a_kafka_share_consumer_releases_and_rejects_explicitly_and_sees_the_delivery_count(cluster):
    topic, group = topic_with(cluster, 3)
    consumer = kafka_share_consumer(cluster, topic, group, **{"share.acknowledgement.mode": "explicit"})
    try:
        counts: dict[int, list[int]] = {0: [], 1: [], 2: []}
        deadline = time.monotonic() + 60
        while len(counts[0]) < 2 or not counts[1] or not counts[2]:
            assert time.monotonic() < deadline, counts
            for message in consumer.poll(0.5):
                value = int(message.value())
                counts[value].append(message.delivery_count())
                kind = {0: "RELEASE" if len(counts[0]) == 1 else "ACCEPT", 1: "REJECT", 2: "ACCEPT"}[value]
                consumer.acknowledge(message, getattr(confluent_kafka.AcknowledgeType, kind))
            consumer.commit_sync(30)
        assert counts == {0: [1, 2], 1: [1], 2: [1]}  # the released record came back, counted
        wait_until(lambda: cluster.admin().list_share_group_offsets(group) == {(topic, 0): 3}, 30, "all settled")
    finally:
        consumer.close()


def coordinator_address(cluster, group: str) -> str:
    """The listener of the broker that coordinates `group`."""
    partition, _ = ray.get(cluster.controller.find_coordinator.remote(group))
    leader = next(p.leader for p in cluster.describe_topic("__consumer_offsets") if p.partition == partition)
    return broker_address(cluster, leader)


def broker_address(cluster, broker_id: int) -> str:
    broker = next(b for b in cluster.brokers() if b["broker_id"] == broker_id)
    return "%s:%d" % tuple(broker["endpoints"]["PLAINTEXT"])


def test_a_share_fetch_of_several_idle_partitions_is_answered_when_one_has_records_not_at_its_max_wait(cluster):
    """Kafka completes a ShareFetch as soon as any of its partitions can acquire records:
    a member waiting on two partitions of one broker gets a record produced to one of them
    at once, not when the other's wait (10 s here) ends."""
    n = next(_names)
    topic, group = f"share-idle{n}", f"idle{n}"
    cluster.create_topic(topic, num_partitions=6, replication_factor=1)  # two led by each broker
    leaders = {p.partition: p.leader for p in cluster.describe_topic(topic)}
    broker = leaders[0]
    pair = sorted(p for p, leader in leaders.items() if leader == broker)[:2]
    assert len(pair) == 2, leaders
    topic_id = kafka_uuid(ray.get(cluster.controller.client_metadata.remote([topic]))["topics"][topic]["topic_id"])
    cluster.admin().alter_share_group_config(group, {"share.auto.offset.reset": "earliest"})  # (makes the group)
    connection, producer = RawConnection(broker_address(cluster, broker)), cluster.producer()
    fetch = {"group_id": group, "member_id": "m", "min_bytes": 1, "max_records": 10, "batch_size": 10,
             "forgotten_topics_data": []}  # fmt: skip
    try:
        opened = connection.call(SHARE_FETCH, 1, {**fetch, "share_session_epoch": 0, "max_wait": 0, "topics": [
            {"topic_id": topic_id, "partitions": [{"partition_index": p, "acknowledgement_batches": []} for p in pair]}]})
        assert opened.error_code == 0
        timer = threading.Timer(0.5, lambda: producer.send(topic, b"now", partition=pair[1]).result(30))
        timer.start()
        started = time.monotonic()
        answer = connection.call(SHARE_FETCH, 1, {**fetch, "share_session_epoch": 1, "max_wait": 10_000, "topics": []})
        waited_s = time.monotonic() - started
        timer.join()
        got = [(p.partition_index, [(a.first_offset, a.last_offset) for a in p.acquired_records])
               for t in answer.responses for p in t.partitions if p.acquired_records]  # fmt: skip
        assert got == [(pair[1], [(0, 0)])], (waited_s, answer)
        assert waited_s < 5, f"answered after {waited_s:.1f} s: at the other partition's max wait"
    finally:
        connection.close()
        producer.close()


def test_share_sessions_share_group_describe_and_the_groups_offsets_and_configs_on_the_wire(cluster):
    topic, group = topic_with(cluster, 1)
    connection = RawConnection(coordinator_address(cluster, group))
    try:
        fetch = {"group_id": group, "member_id": "m", "max_wait": 0, "min_bytes": 1, "max_records": 10,
                 "batch_size": 10, "topics": [], "forgotten_topics_data": []}  # fmt: skip
        assert connection.call(SHARE_FETCH, 1, {**fetch, "share_session_epoch": 3}).error_code == (
            ShareSessionNotFoundError.code)
        assert connection.call(SHARE_FETCH, 1, {**fetch, "share_session_epoch": 0}).error_code == 0
        assert connection.call(SHARE_FETCH, 1, {**fetch, "share_session_epoch": 5}).error_code == (
            InvalidShareSessionEpochError.code)
        assert connection.call(SHARE_ACKNOWLEDGE, 1, {"group_id": group, "member_id": "m", "share_session_epoch": 0,
                                                      "topics": []}).error_code == InvalidShareSessionEpochError.code
        heartbeat = connection.call(SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": "m", "member_epoch": 0,
                                                               "subscribed_topic_names": [topic]})  # fmt: skip
        assert heartbeat.error_code == 0 and heartbeat.assignment.topic_partitions[0].partitions == (0,)
        describe = {"group_ids": [group], "include_authorized_operations": False}
        (ours,) = connection.call(SHARE_GROUP_DESCRIBE, 1, describe).groups
        assert ours.group_state == "Stable" and [m.member_id for m in ours.members] == ["m"]
        assert ours.members[0].assignment.topic_partitions[0].topic_name == topic
        elsewhere = RawConnection(coordinator_address(cluster, "no-such-group"))
        try:
            (missing,) = elsewhere.call(SHARE_GROUP_DESCRIBE, 1, {**describe, "group_ids": ["no-such-group"]}).groups
        finally:
            elsewhere.close()
        assert missing.error_code == GroupIdNotFoundError.code
        alter = {"group_id": group, "topics": [{"topic_name": topic, "partitions": [
            {"partition_index": 0, "start_offset": 1}, {"partition_index": 5, "start_offset": 0}]}]}
        assert connection.call(ALTER_SHARE_GROUP_OFFSETS, 0, alter).error_code == NonEmptyGroupError.code
        left = connection.call(SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": "m", "member_epoch": -1})
        assert left.error_code == 0 and left.member_epoch == -1

        # The group's offsets and configs, now that it is empty (what Kafka's Admin and tools send).
        altered = connection.call(ALTER_SHARE_GROUP_OFFSETS, 0, alter)
        assert altered.error_code == 0 and [(p.partition_index, p.error_code) for p in altered.responses[0].partitions] == [
            (0, 0), (5, UnknownTopicOrPartitionError.code)]
        described = {"groups": [{"group_id": group, "topics": None}]}
        (offsets,) = connection.call(DESCRIBE_SHARE_GROUP_OFFSETS, 0, described).groups
        assert [(t.topic_name, p.partition_index, p.start_offset) for t in offsets.topics for p in t.partitions] == [
            (topic, 0, 1)]
        deleted = connection.call(DELETE_SHARE_GROUP_OFFSETS, 0, {"group_id": group, "topics": [{"topic_name": topic}]})
        assert deleted.error_code == 0 and deleted.responses[0].error_code == 0
        assert connection.call(DESCRIBE_SHARE_GROUP_OFFSETS, 0, described).groups[0].topics == ()

        def configs(*ops: tuple[str, int, str | None]) -> int:
            body = {"validate_only": False, "resources": [{"resource_type": GROUP_RESOURCE, "resource_name": group,
                    "configs": [{"name": n, "config_operation": op, "value": v} for n, op, v in ops]}]}  # fmt: skip
            return connection.call(INCREMENTAL_ALTER_CONFIGS, 1, body).responses[0].error_code.value

        def config_value() -> tuple[str, int]:
            body = {"resources": [{"resource_type": GROUP_RESOURCE, "resource_name": group, "configuration_keys": None}],
                    "include_synonyms": False, "include_documentation": False}  # fmt: skip
            (result,) = connection.call(DESCRIBE_CONFIGS, 4, body).results
            (config,) = result.configs
            return config.value, config.config_source

        assert config_value() == ("earliest", GROUP_CONFIG_SOURCE)  # set by topic_with
        assert configs(("share.auto.offset.reset", SET, "sometimes")) == InvalidConfigurationError.code
        assert configs(("consumer.session.timeout.ms", SET, "6000")) == InvalidConfigurationError.code
        assert configs(("share.auto.offset.reset", DELETE, None)) == 0
        assert config_value() == ("latest", DEFAULT_CONFIG_SOURCE)
    finally:
        connection.close()


def test_make_demo_s_work_queue_does_every_job_with_duplicates_only_where_a_worker_died(cluster, capsys):
    """`make demo`'s third part, examples/work_queue.py, on this module's cluster with fewer
    jobs: a pool of 3 actors, one SIGKILLed mid-work, a poison job dead-lettered."""
    path = Path(__file__).resolve().parent.parent / "examples" / "work_queue.py"
    spec = importlib.util.spec_from_file_location("work_queue_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.run_queue(cluster, jobs=300, workers=3, suffix="-demo")
    assert "work queue check passed" in capsys.readouterr().out


class Seen:
    """What the pool's function saw (an actor, since the function runs in the workers)."""

    def __init__(self) -> None:
        self.rows: list = []

    def add(self, rows: list) -> None:
        self.rows += rows

    def get(self) -> list:
        return self.rows


def test_a_work_queue_of_arrow_batches_resizes_while_it_runs_and_retries_a_failed_batch(cluster):
    topic, group = topic_with(cluster, 200)
    seen = ray.remote(Seen).remote()

    def work(batch) -> None:
        values = [int(v) for v in batch.column("value").to_pylist()]
        if 13 in values and 1 in batch.column("deliveryCount").to_pylist():
            raise RuntimeError("a batch that fails once")  # released: delivered again, counted
        ray.get(seen.add.remote(list(zip(values, batch.column("deliveryCount").to_pylist()))))

    pool = WorkQueue(cluster, topic, group_id=group, fn=work, num_workers=1, batch=True, max_poll_records=7)
    try:
        wait_until(lambda: len(ray.get(seen.get.remote())) >= 50, 60, "the first worker to start")
        pool.resize(3)
        assert len(pool.workers) == 3
        wait_until(lambda: len(ray.get(seen.get.remote())) >= 120, 60, "three workers to go on")
        pool.resize(2)
        pool.wait_until_idle(timeout_s=120)
        rows = ray.get(seen.get.remote())
        assert sorted(v for v, _ in rows) == list(range(200))  # each once
        assert dict(rows)[13] == 2  # the failed batch came back
        stats = pool.stats()
        assert sum(s.accepted for s in stats) == 200 and sum(s.released for s in stats) >= 1 and len(stats) == 3
    finally:
        pool.stop()


def test_acknowledgements_survive_the_death_of_the_partition_leader_and_of_the_group_coordinator(cluster):
    topic, group = topic_with(cluster, 20, replication_factor=3)
    first = cluster.share_consumer(topic, group_id=group, acknowledgement_mode="explicit")
    try:
        held = []
        deadline = time.monotonic() + 30
        while len(held) < 20 and time.monotonic() < deadline:
            held += first.poll(500)
        assert sorted(int(r.value) for r in held) == list(range(20))
        accepted = [r for r in held if int(r.value) < 10]
        for r in accepted:
            first.acknowledge(r, "accept")
        assert set(first.commit().values()) == {None}
        admin = cluster.admin()  # it keeps its link to the group's coordinator, which moves below
        assert admin.list_share_group_offsets(group) == {(topic, 0): 10}
        leader = cluster.leader(topic, 0)
        _, coordinator = ray.get(cluster.controller.find_coordinator.remote(group))
        for handle in (leader, coordinator):
            os.kill(pid_of(handle), signal.SIGKILL)
        second = cluster.share_consumer(topic, group_id=group)
        try:
            got = drain([second], 10, timeout_s=90)[0]
            assert sorted(got) == list(range(10, 20))  # the unacknowledged ones, and no accepted one
            time.sleep(LOCK_MS / 1000)
            assert second.poll(1_000) == []
            wait_until(lambda: admin.list_share_group_offsets(group) == {(topic, 0): 20}, 30, "SPSO at the end")
        finally:
            second.close()
    finally:
        first.close()
