"""Tiered storage on a live cluster (file:// store): a topic with remote.storage.enable and a
small local retention keeps its whole history readable from offset 0 by rayk's consumer,
Kafka clients and Ray Data while its replicas' disks hold only the local retention; a new
leader (after a kill -9 of the old one) goes on from what the store holds; a replica added
later starts at the leader's local log start from the remote copy; a store that fails
holds back copying and local deletion, never produce or fetch."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import kafka
import pytest
import ray
from kafka.structs import TopicPartition as KafkaTopicPartition

import rayk
import rayk.data
from rayk.client import TopicPartition
from rayk.client.offset_ranges import OffsetRange
from rayk.client.remote_slices import RemotePlanner, RemoteSlice
from rayk.replication.leader_fetch import EARLIEST_LOCAL_TIMESTAMP, LATEST_TIERED_TIMESTAMP
from tests import readme
from tests.cluster_helpers import FAST_CONFIG, consume_topic, pid_of, shared_local_ray, wait_until

SEGMENT_BYTES = 16384
LOCAL_RETENTION_BYTES = 3 * SEGMENT_BYTES
TOPIC_CONFIG = {
    "remote.storage.enable": "true",
    "segment.bytes": str(SEGMENT_BYTES),
    "local.retention.bytes": str(LOCAL_RETENTION_BYTES),
    "min.insync.replicas": "2",
}
RECORDS = 2000
VALUE_BYTES = 60


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("remote-store")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, store):
    shared_local_ray()
    config = {
        **FAST_CONFIG,
        "auto.leader.rebalance.enable": False,
        "remote.log.storage.system.enable": True,
        "remote.log.storage.uri": f"file://{store}",
        "remote.log.manager.task.interval.ms": 300,
    }
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("tiered"), config=config, namespace="tiered")
    yield c
    c.shutdown()


def values(start: int, count: int) -> list[bytes]:
    return [f"r{i:06d}".encode().ljust(VALUE_BYTES, b".") for i in range(start, start + count)]


def produce(cluster, topic: str, vals: list[bytes]) -> None:
    with cluster.producer(acks="all", batch_size=4096, max_request_size=8192) as producer:  # batches fit segments
        futures = [producer.send(topic, v, partition=0) for v in vals]
        producer.flush()
    for future in futures:
        future.result(timeout=0)  # raises if a record failed


def local_start(cluster, topic: str, broker: int) -> int:
    return ray.get(cluster.replica(topic, 0, broker).log_size.remote())[0]


def tiered_down(cluster, topic: str, replicas: list[int]) -> None:
    """Waits until every replica's local log starts past offset 0 and holds about the local retention."""
    def done() -> bool:
        sizes = [ray.get(cluster.replica(topic, 0, b).log_size.remote()) for b in replicas]
        return all(start > 0 and size <= LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES for start, _end, size in sizes)

    wait_until(done, 60, f"{topic}'s replicas to keep only their local retention")


def consumed_values(cluster, topic: str, expected: int) -> list[bytes]:
    # auto.offset.reset none: an offset the leader cannot serve fails the test there, not as
    # records missing after a silent skip to the end.
    return [r.value for r in consume_topic(cluster, topic, expected, timeout_s=60, auto_offset_reset="none")]


def test_the_whole_history_stays_readable_from_offset_0_while_disks_keep_the_local_retention(cluster, store):
    cluster.create_topic("history", num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    produce(cluster, "history", values(0, RECORDS))
    tiered_down(cluster, "history", [0, 1, 2])
    [description] = cluster.describe_topic("history")
    leader = cluster.leader("history", 0)
    remote = ray.get(leader.remote_segments.remote())
    assert remote[0]["base_offset"] == 0 and len(remote) > 5
    assert (store / f"history-0-{description.topic_id}").is_dir()
    # ListOffsets: the whole log starts at 0, the local one past it; the last tiered offset.
    assert ray.get(leader.list_offset.remote(-2))[0] == 0
    local = ray.get(leader.list_offset.remote(EARLIEST_LOCAL_TIMESTAMP))[0]
    assert local == local_start(cluster, "history", description.leader) > 0
    assert ray.get(leader.list_offset.remote(LATEST_TIERED_TIMESTAMP))[0] == remote[-1]["end_offset"] - 1
    assert ray.get(leader.list_offset.remote(0))[0] == 0  # by time: the remote segments' time indexes first
    expected = values(0, RECORDS)
    # rayk's consumer, from the beginning.
    assert consumed_values(cluster, "history", RECORDS) == expected
    # A Kafka client over the wire, from offset 0.
    consumer = kafka.KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers, enable_auto_commit=False,
                                   consumer_timeout_ms=20_000)  # fmt: skip
    tp = KafkaTopicPartition("history", 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    assert consumer.beginning_offsets([tp])[tp] == 0
    got = [m.value for _, m in zip(range(RECORDS), consumer)]
    consumer.close()
    assert got == expected
    # Ray Data.
    rows = rayk.data.read_topic("history", cluster=cluster).take_all()
    assert [bytes(r["value"]) for r in sorted(rows, key=lambda r: r["offset"])] == expected


def test_a_new_leader_after_a_kill_9_goes_on_copying_and_nothing_acknowledged_is_lost(cluster):
    cluster.create_topic("failover", num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    produce(cluster, "failover", values(0, RECORDS // 2))
    tiered_down(cluster, "failover", [0, 1, 2])
    old = cluster.describe_topic("failover")[0].leader
    copied_by_old = ray.get(cluster.leader("failover", 0).remote_segments.remote())
    os.kill(pid_of(cluster.leader("failover", 0)), signal.SIGKILL)
    wait_until(lambda: cluster.describe_topic("failover")[0].leader not in (old, -1), 60, "a new leader")
    produce(cluster, "failover", values(RECORDS // 2, RECORDS // 2))
    new = cluster.describe_topic("failover")[0].leader
    # (It may have copied them already while the producer was still sending.)
    wait_until(lambda: any(s["copied_by_broker"] == new and s["end_offset"] > copied_by_old[-1]["end_offset"]
                           for s in ray.get(cluster.leader("failover", 0).remote_segments.remote())),
               60, "the new leader to copy past what the old one had")  # fmt: skip
    assert consumed_values(cluster, "failover", RECORDS) == values(0, RECORDS)


def test_a_replica_added_later_starts_at_the_leader_s_local_log_start_from_the_remote_copy(cluster):
    cluster.create_topic("grow", num_partitions=1, replication_factor=2, config=TOPIC_CONFIG)
    [description] = cluster.describe_topic("grow")
    produce(cluster, "grow", values(0, RECORDS))
    tiered_down(cluster, "grow", description.replicas)
    [newcomer] = {0, 1, 2} - set(description.replicas)
    admin = cluster.admin()
    assert admin.alter_partition_reassignments({TopicPartition("grow", 0): [newcomer, *description.replicas]}) == {
        TopicPartition("grow", 0): None}
    wait_until(lambda: newcomer in cluster.describe_topic("grow")[0].isr, 60, "the new replica to join the ISR")
    start = local_start(cluster, "grow", newcomer)
    assert start > 0  # it never copied the history its leader has only in the store
    # Let it lead: it serves the history from the store, and the producer's sequences go on.
    admin.elect_leaders([TopicPartition("grow", 0)])
    wait_until(lambda: cluster.describe_topic("grow")[0].leader == newcomer, 60, "the new replica to lead")
    produce(cluster, "grow", values(RECORDS, 100))
    assert consumed_values(cluster, "grow", RECORDS + 100) == values(0, RECORDS + 100)


def test_a_failing_store_holds_back_copying_and_local_deletion_but_never_produce_or_fetch(cluster, store):
    cluster.create_topic("blocked", num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    [description] = cluster.describe_topic("blocked")
    blocker = store / f"blocked-0-{description.topic_id}"
    blocker.write_bytes(b"not a folder")  # every write under the partition's prefix fails
    produce(cluster, "blocked", values(0, RECORDS))
    time.sleep(2)  # several passes of the remote log task, each failing
    leader = cluster.leader("blocked", 0)
    start, _end, size = ray.get(leader.log_size.remote())
    assert start == 0 and size > LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES  # nothing copied, nothing deleted
    assert consumed_values(cluster, "blocked", RECORDS) == values(0, RECORDS)
    blocker.unlink()  # the store is back: copying catches up, then local retention
    tiered_down(cluster, "blocked", [0, 1, 2])
    assert consumed_values(cluster, "blocked", RECORDS) == values(0, RECORDS)


def test_deleting_a_tiered_topic_deletes_its_remote_segments(cluster, store):
    cluster.create_topic("gone", num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    [description] = cluster.describe_topic("gone")
    produce(cluster, "gone", values(0, RECORDS // 2))
    prefix = store / f"gone-0-{description.topic_id}"
    wait_until(lambda: prefix.is_dir() and any(prefix.iterdir()), 60, "a remote segment")
    cluster.delete_topic("gone")
    wait_until(lambda: not prefix.exists(), 30, "the remote segments to go")


def test_read_committed_readers_leave_out_aborted_transactions_in_remote_segments(cluster):
    """Transactions whose records and markers are in remote segments: rayk's read_committed
    consumer (served by the leader from the store) and Ray Data's read_committed slices (the
    remote transaction indexes, through the leader's list) see only the committed ones."""
    cluster.create_topic("txns", num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    producer = cluster.producer(transactional_id="tiered-txns", batch_size=4096, max_request_size=8192)
    producer.init_transactions()
    committed: list[bytes] = []
    for t in range(10):
        batch = values(t * 100, 100)
        producer.begin_transaction()
        for v in batch:
            producer.send("txns", v, partition=0)
        if t % 3 == 1:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed += batch
    producer.close()
    produce(cluster, "txns", values(5000, RECORDS))  # enough after them that they all go remote
    committed += values(5000, RECORDS)
    tiered_down(cluster, "txns", [0, 1, 2])
    leader = cluster.leader("txns", 0)
    remote = ray.get(leader.remote_segments.remote())
    assert any("txnindex" in s["object_bytes"] and s["object_bytes"]["txnindex"] for s in remote)
    consumer_values = [r.value for r in consume_topic(cluster, "txns", len(committed), timeout_s=60,
                                                      isolation_level="read_committed")]  # fmt: skip
    assert consumer_values == committed
    rows = rayk.data.read_topic("txns", cluster=cluster, isolation_level="read_committed").take_all()
    assert [bytes(r["value"]) for r in sorted(rows, key=lambda r: r["offset"])] == committed


def test_delete_records_below_the_local_log_deletes_remote_records_for_every_reader(cluster):
    cluster.create_topic("trimmed", num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    produce(cluster, "trimmed", values(0, RECORDS))
    tiered_down(cluster, "trimmed", [0, 1, 2])
    leader = cluster.leader("trimmed", 0)
    remote = ray.get(leader.remote_segments.remote())
    target = remote[1]["base_offset"] + 5  # inside the second remote segment
    assert target < local_start(cluster, "trimmed", cluster.describe_topic("trimmed")[0].leader)
    admin = cluster.admin()
    assert admin.delete_records({TopicPartition("trimmed", 0): target}) == {TopicPartition("trimmed", 0): target}
    assert ray.get(leader.list_offset.remote(-2))[0] == target
    assert consumed_values(cluster, "trimmed", RECORDS - target) == values(target, RECORDS - target)
    rows = rayk.data.read_topic("trimmed", cluster=cluster).take_all()
    assert sorted(r["offset"] for r in rows) == list(range(target, RECORDS))
    planner = RemotePlanner.for_topic(cluster, "trimmed")  # a plan made before it knew: the store says
    assert planner is not None and planner.split(OffsetRange("trimmed", 0, 0, RECORDS, 0))[0].start == target
    wait_until(lambda: ray.get(leader.remote_segments.remote())[0]["base_offset"] > 0, 30,
               "the remote segment wholly below the new start to go")  # fmt: skip


def test_the_tiered_storage_guide_runs_as_written(cluster, capsys):
    """The guide's example on this module's cluster, whose brokers have a store."""
    readme.run('cluster.create_topic("clickstream", num_partitions=1, replication_factor=3, config={',
               {"cluster": cluster, "rayk": rayk})
    assert capsys.readouterr().out.split() == ["1000"]


def test_ray_data_reads_the_remote_history_from_the_store_with_no_broker_running(cluster):
    """Last in the module: it shuts the cluster down. The read is planned while it runs; by
    the time its tasks run, no broker, replica or Controller is left to serve a record."""
    cluster.create_topic("offline", num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    produce(cluster, "offline", values(0, RECORDS))
    tiered_down(cluster, "offline", [0, 1, 2])
    remote = ray.get(cluster.leader("offline", 0).remote_segments.remote())
    remote_end = remote[-1]["end_offset"]
    source = rayk.data.TopicDatasource("offline", ending_offsets={"offline": {"0": remote_end}}, cluster=cluster)
    assert len(source.tasks) == len(remote) and all(
        isinstance(piece, RemoteSlice) for task in source.tasks for piece in task)  # fmt: skip
    full = rayk.data.TopicDatasource("offline", cluster=cluster)  # the local tail stays the leaders'
    assert isinstance(full.tasks[-1][-1], OffsetRange) and full.tasks[-1][-1].end == RECORDS
    dataset = rayk.data.read_topic("offline", ending_offsets={"offline": {"0": remote_end}}, cluster=cluster)
    cluster.shutdown()
    rows = dataset.take_all()
    assert [bytes(r["value"]) for r in sorted(rows, key=lambda r: r["offset"])] == values(0, remote_end)
    assert [r["offset"] for r in sorted(rows, key=lambda r: r["offset"])] == list(range(remote_end))
