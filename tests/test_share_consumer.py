"""rayk's share consumer (KIP-932) on a 3-broker cluster: several members of ONE
partition each receive different records and together every record once; what a member
does not acknowledge comes back to another after the lock duration; a poison record is
archived at the delivery limit; the Admin describes, lists the offsets of and deletes a
share group; and acknowledgements survive the death of the partition's leader and of the
group coordinator (kept last: it kills replica processes)."""

from __future__ import annotations

import itertools
import os
import signal
import time

import pytest
import ray

import rayk
from rayk.client.share_consumer import IllegalStateError
from rayk.errors import GroupIdNotFoundError, NonEmptyGroupError
from tests.cluster_helpers import pid_of, shared_local_ray, wait_until

LOCK_MS = 2_000
CONFIG = {"group.share.record.lock.duration.ms": LOCK_MS, "group.share.heartbeat.interval.ms": 500,
          "group.share.session.timeout.ms": 6_000, "group.share.delivery.count.limit": 3}
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


def topic_with(cluster, count: int) -> tuple[str, str]:
    """A new 1-partition topic of `count` records, and a share group reading it from the start."""
    n = next(_names)
    topic, group = f"share{n}", f"workers{n}"
    cluster.create_topic(topic, num_partitions=1, replication_factor=3)
    with cluster.producer() as producer:
        for i in range(count):
            producer.send(topic, str(i).encode())
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


def test_members_of_one_partition_each_receive_different_records_and_together_all_once(cluster):
    topic, group = topic_with(cluster, 300)
    consumers = [cluster.share_consumer(topic, group_id=group, max_poll_records=20) for _ in range(3)]
    try:
        got = drain(consumers, 300)
        everything = sorted(v for values in got.values() for v in values)
        assert everything == list(range(300))  # each once: nobody received another's record
        assert sum(1 for values in got.values() if values) >= 2  # the work was shared
        for c in consumers:
            c.commit()
        wait_until(lambda: cluster.admin().list_share_group_offsets(group) == {(topic, 0): 300}, 30, "SPSO at the end")
        description = cluster.admin().describe_share_groups([group])[group]
        assert description["state"] == "Stable" and len(description["members"]) == 3
        assert all(m["assignment"] == [(topic, 0)] for m in description["members"])
    finally:
        for c in consumers:
            c.close()
    assert cluster.admin().describe_share_groups([group])[group]["state"] == "Empty"
    assert cluster.admin().delete_consumer_groups([group]) == {group: None}
    with pytest.raises(GroupIdNotFoundError):
        cluster.admin().list_share_group_offsets(group)


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


def test_acknowledgements_survive_the_death_of_the_partition_leader_and_of_the_group_coordinator(cluster):
    topic, group = topic_with(cluster, 20)
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
        finally:
            second.close()
    finally:
        first.close()
