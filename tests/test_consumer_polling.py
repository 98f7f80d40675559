"""Consumer polling against a 3-broker cluster: `poll(timeout_ms)` never blocks past its
timeout while a group rebalances (KIP-266), an evicted member drops its partitions at
once, and iteration commits only the records it handed out."""

from __future__ import annotations

import itertools
import os
import signal
import time

import pyarrow as pa
import pytest
import ray

import rayk
from rayk.client import TopicPartition
from rayk.client.arrow_batches import SCHEMA
from tests.cluster_helpers import FAST_CONFIG, NO_LISTENERS, shared_local_ray, wait_until

CONFIG = {
    **FAST_CONFIG,
    **NO_LISTENERS,  # the Python consumer's tests: no Kafka protocol
    "group.initial.rebalance.delay.ms": 0,
    "group.min.session.timeout.ms": 1000,
}
# What a poll may take beyond its timeout on a loaded 2-core machine (the whole suite runs
# beside it). The client this replaced blocked for seconds in JoinGroup: 6.5 s per poll here.
POLL_SLACK_S = 2.0
pytestmark = pytest.mark.usefixtures("delete_topics_after_test")
_names = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()  # the actors a test starts go when their handles do


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("polling"), config=CONFIG, namespace="polling")
    # Creating __consumer_offsets takes seconds here, and the Controller holds the first
    # FindCoordinator until it is done: create it first, so the tests time the clients.
    ray.get(c.controller.find_coordinator.remote("warm-up"))
    yield c
    c.shutdown()


def new_topic(cluster, partitions: int, records: int) -> str:
    name = f"poll{next(_names)}"
    cluster.create_topic(name, num_partitions=partitions, replication_factor=1)  # the group is under test
    with cluster.producer(linger_ms=20) as producer:
        for i in range(records):
            producer.send(name, value=b"%06d" % i, partition=i % partitions)
    return name


def test_two_members_polled_in_turn_from_one_thread_split_the_partitions_and_every_poll_returns_on_time(cluster):
    topic = new_topic(cluster, partitions=4, records=20_000)
    settings = dict(group_id="one-thread", auto_offset_reset="earliest", max_poll_records=100,
                    session_timeout_ms=6000, heartbeat_interval_ms=500)
    members = {"a": cluster.consumer(topic, **settings), "b": cluster.consumer(topic, **settings)}
    consumed = {name: [] for name in members}  # (partition, offset), in the order handed out
    latencies_s = []
    polls = 0
    split_at = None  # (polls so far, records consumed so far) when the members first held 2 + 2
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for name, member in members.items():
            started = time.monotonic()
            batch = member.poll(timeout_ms=200)
            latencies_s.append(time.monotonic() - started)
            polls += 1
            consumed[name] += [(r.partition, r.offset) for records in batch.values() for r in records]
        assignments = [member.assignment() for member in members.values()]
        if split_at is None and [len(a) for a in assignments] == [2, 2] and not assignments[0] & assignments[1]:
            split_at = (polls, {name: len(c) for name, c in consumed.items()})
        if len(set(consumed["a"]) | set(consumed["b"])) == 20_000:
            break
    for member in members.values():
        member.close()

    latencies_s.sort()
    print(f"\n{polls} polls; latency median {latencies_s[len(latencies_s) // 2] * 1000:.0f} ms, "
          f"max {latencies_s[-1] * 1000:.0f} ms; split 2/2 after {split_at}; "
          f"consumed a {len(consumed['a'])}, b {len(consumed['b'])}")
    assert latencies_s[-1] < 0.2 + POLL_SLACK_S, "poll(timeout_ms=200) returns on time, even while joining"
    assert split_at is not None, "the members split the partitions 2/2"
    assert split_at[0] <= 30, f"the split took {split_at[0]} polls"
    everything = {(p, o) for p in range(4) for o in range(5000)}
    assert set(consumed["a"]) | set(consumed["b"]) == everything, "no record missed"
    after_split = {name: set(c[split_at[1][name]:]) for name, c in consumed.items()}
    assert not after_split["a"] & after_split["b"], "no record consumed by both members after the split"
    twice = set(consumed["a"]) & set(consumed["b"])
    assert not twice, f"{len(twice)} records consumed by both (the revoking member commits before the rebalance)"


@ray.remote(num_cpus=0)
class PolledMember:
    """A group member in its own process, polled only when the test says so."""

    def __init__(self, cluster, topic, group_id):
        self.consumer = cluster.consumer(topic, group_id=group_id, auto_offset_reset="earliest", max_poll_records=10,
                                         session_timeout_ms=2000, heartbeat_interval_ms=300)

    def pid(self):
        return os.getpid()

    def poll(self, timeout_ms):
        started = time.monotonic()
        batch = self.consumer.poll(timeout_ms=timeout_ms)
        records = [(r.partition, r.offset) for rs in batch.values() for r in rs]
        return records, sorted(tp.partition for tp in self.consumer.assignment()), time.monotonic() - started

    def close(self):
        self.consumer.close()


def test_an_evicted_member_stops_returning_its_old_partitions_at_its_next_poll(cluster):
    topic = new_topic(cluster, partitions=2, records=4000)
    a = PolledMember.remote(cluster, topic, "evicted")
    wait_until(lambda: ray.get(a.poll.remote(200))[1] == [0, 1], 60, "a to hold both partitions")
    wait_until(lambda: ray.get(a.poll.remote(200))[0], 30, "a to return records (more are buffered)")
    pid = ray.get(a.pid.remote())

    os.kill(pid, signal.SIGSTOP)  # a long GC pause: no heartbeats, no polls
    try:
        b = cluster.consumer(topic, group_id="evicted", auto_offset_reset="earliest", max_poll_records=10,
                             session_timeout_ms=2000, heartbeat_interval_ms=300)
        stopped_at = time.monotonic()
        while b.assignment() != {TopicPartition(topic, 0), TopicPartition(topic, 1)}:
            assert time.monotonic() - stopped_at < 60, "b never took over a's partitions"
            b.poll(timeout_ms=200)
    finally:
        os.kill(pid, signal.SIGCONT)
    records, assigned, took_s = ray.get(a.poll.remote(0))
    assert records == [] and assigned == [], "its partitions are someone else's now: nothing of them is returned"
    assert took_s < POLL_SLACK_S

    def split():
        b.poll(timeout_ms=100)
        return ray.get(a.poll.remote(100))[1] and len(b.assignment()) == 1

    wait_until(split, 60, "a to rejoin and the partitions to split")
    ray.get(a.close.remote())
    b.close()


def test_iteration_commits_only_the_records_it_handed_out(cluster):
    topic = new_topic(cluster, partitions=1, records=300)
    tp = TopicPartition(topic, 0)
    settings = dict(group_id="iterate", auto_offset_reset="earliest", auto_commit_interval_ms=600_000)
    consumer = cluster.consumer(topic, **settings)
    received = []
    for record in consumer:
        received.append(record.offset)
        assert consumer.position(tp) == record.offset + 1, "the position moves per record handed out"
        if len(received) == 7:
            break
    consumer.close()  # auto-commit on close
    again = cluster.consumer(topic, **settings)
    assert again.committed(tp) == 7
    resumed = next(iter(again))
    assert (received, resumed.offset) == (list(range(7)), 7), "a new member resumes right after the last record received"
    again.close()


def test_iteration_times_out_consumer_timeout_ms_after_it_started_waiting_not_after_the_last_fetch(cluster):
    # The records come from one fetch and go out one by one while the caller is slow:
    # consumer_timeout_ms counts from when the iterator waits for a record, so the
    # caller's own time between records never ends the iteration early.
    topic = new_topic(cluster, partitions=1, records=6)
    consumer = cluster.consumer(auto_offset_reset="earliest", consumer_timeout_ms=1_500)
    consumer.assign([TopicPartition(topic, 0)])
    received, last_at = [], 0.0
    for record in consumer:
        received.append(record.offset)
        time.sleep(0.3)  # 6 x 0.3 s: more than the timeout in all (the iterator waits in polls of 1 s)
        last_at = time.monotonic()
    waited_s = time.monotonic() - last_at
    consumer.close()
    assert received == list(range(6))
    assert 1.5 <= waited_s < 3.5, waited_s


def test_iteration_stops_with_the_consumers_close_and_picks_up_a_seek_between_records(cluster):
    import numpy as np

    topic = new_topic(cluster, partitions=1, records=10)
    tp = TopicPartition(topic, 0)
    consumer = cluster.consumer(auto_offset_reset="earliest", consumer_timeout_ms=5_000)
    consumer.assign([tp])
    records = iter(consumer)
    assert [next(records).offset for _ in range(2)] == [0, 1]
    consumer.seek(tp, np.int64(6))  # any integer type, as kafka-python takes
    assert next(records).offset == 6 and consumer.position(tp) == 7
    assert consumer.poll(timeout_ms=5_000, max_records=1)[tp][0].offset == 7
    assert next(records).offset == 8, "a poll between two records moves the iteration on too"
    consumer.close()
    with pytest.raises(RuntimeError, match="closed"):
        next(records)
    assert list(records) == []


def test_poll_batch_hands_out_every_record_as_arrow_and_a_new_member_resumes_from_its_commit(cluster):
    topic = new_topic(cluster, partitions=2, records=5_000)
    with cluster.producer() as producer:  # keys and headers too, as Spark's Kafka source has them
        producer.send(topic, value=None, key=b"tombstone", partition=0, headers=[("h", b"x"), ("n", None)])
    settings = dict(group_id="columns", auto_offset_reset="earliest", enable_auto_commit=False)
    consumer = cluster.consumer(topic, **settings)
    seen: dict[int, list[int]] = {0: [], 1: []}
    deadline = time.monotonic() + 60
    while sum(map(len, seen.values())) < 5_001:
        assert time.monotonic() < deadline, f"only {sum(map(len, seen.values()))} of 5,001 records"
        for tp, columns in consumer.poll_batch(timeout_ms=500, max_records=3_000).items():
            assert isinstance(columns, pa.RecordBatch) and columns.schema == SCHEMA
            assert set(columns.column("partition").to_pylist()) == {tp.partition}
            seen[tp.partition] += columns.column("offset").to_pylist()
            assert consumer.position(tp) == seen[tp.partition][-1] + 1
            if tp.partition == 0 and seen[0][-1] == 2_500:
                last = columns.slice(columns.num_rows - 1).to_pylist()[0]
                assert (last["key"], last["value"], last["headers"]) == (
                    b"tombstone", None, [{"key": "h", "value": b"x"}, {"key": "n", "value": None}])
    assert seen == {0: list(range(2_501)), 1: list(range(2_500))}, "every record once, in offset order"
    consumer.commit()
    consumer.close()
    with cluster.producer() as producer:
        producer.send(topic, value=b"after", partition=1)
    again = cluster.consumer(topic, **settings)
    assert again.committed(TopicPartition(topic, 0)) == 2_501
    got = {}
    while not got:
        assert time.monotonic() < deadline + 60, "the new member got nothing"
        got = again.poll_batch(timeout_ms=500)
    assert {tp.partition: c.column("offset").to_pylist() for tp, c in got.items()} == {1: [2_500]}, (
        "a new member resumes at the commit: only the record produced after it")
    again.close()
