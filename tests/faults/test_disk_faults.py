"""A broker's disk full or failing, on a multi-host cluster of network namespaces
(netns_cluster.py) where each node has a disk of its own (a tmpfs that `resize_disk`
shrinks to what it holds; for a failing disk, seen through failing_fs.py, which fails
reads, writes or fsyncs with EIO on demand), under continuous acks=all idempotent
production (harness.Traffic).

What Kafka promises (KIP-112's LogDirFailureChannel): a log directory that fails a write
goes offline, its replicas leave the ISR and lose leadership, and the broker serves what
it can; nothing acknowledged is lost. rayk's broker has one data directory: a replica
whose disk fails a write (ENOSPC, EIO), a read or an fsync answers KAFKA_STORAGE_ERROR and
ends its process; its broker probes the directory, takes it offline if the probe fails
too (its replicas stopped, out of the ISRs and their leaderships; DescribeLogDirs says
KAFKA_STORAGE_ERROR) and the other replicas carry the partitions; once a probe passes,
its replicas start again, catch up and rejoin the ISRs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import ray

from rayk.errors import KafkaStorageError
from tests.cluster_helpers import wait_until
from tests.faults import netns_cluster as nc
from tests.faults.harness import TOPIC, check, run_until_acked

SCENARIO_TIMEOUT_S = 420
FAILING_S = 30  # how long the disk fails, under writes
OFFLINE_BOUND_S = 30  # from the first failure to the broker out of every ISR
FULL_S = 30  # how long the disk stays full, under writes
RESUME_BOUND_S = 30  # the longest a partition may take no write while the disk is full
WHOLE_BOUND_S = 60  # from room on the disk to every partition led, with its full ISR


def full_disk() -> None:
    """The disk of partition 0's leader full for FULL_S: writes go on through the other
    brokers, nothing reaches the producer as an error, and once there is room the broker
    catches up and every ISR is whole again."""
    c, traffic = nc.rayk_under_traffic("diskfull")
    timeline = nc.Timeline(c, traffic)
    victim, node = nc.leader_node(c)
    nc.resize_disk(node, nc.disk_used_bytes(node) + (64 << 10))
    t0 = time.monotonic()
    nc.log(f"broker {victim}'s disk ({node}) full")
    traffic.wait_resumed(t0, RESUME_BOUND_S)
    wait_until(lambda: all(victim not in p["isr"] for p in c.describe_topic(TOPIC)), 60,
               f"broker {victim} out of every ISR")  # fmt: skip
    out_s = time.monotonic() - t0
    time.sleep(max(0.0, FULL_S - (time.monotonic() - t0)))
    gap_s = nc.longest_ack_gap_s(traffic, t0, time.monotonic())
    assert gap_s <= RESUME_BOUND_S, f"a partition took no write for {gap_s:.1f} s while the disk was full"
    acked_while_full = traffic.acked_count()
    assert traffic.failed == {}, f"errors reached the producer while the disk was full: {dict(traffic.failed)}"
    nc.resize_disk(node, nc.NODE_DISK_BYTES)
    nc.log("room on the disk again")
    whole_s = nc.wait_whole(c, WHOLE_BOUND_S, "once the disk had room")
    run_until_acked(traffic, 500)
    timeline.stop()
    check(c, traffic, "a broker's disk full", gap_s)
    print(f"MEASURED disk full: longest stall of a partition {gap_s:.1f} s; the broker out of every ISR after {out_s:.1f} s; "
          f"{acked_while_full} acknowledged by the end of the {FULL_S} s; whole again {whole_s:.1f} s after the disk had "
          "room", flush=True)  # fmt: skip
    c.shutdown()


def failing_disk(ops: str) -> None:
    """The disk of the broker on FAILING_DISK_NODE fails `ops` (comma-separated: read,
    write, fsync) with EIO for FAILING_S: the broker's directory goes offline and its
    replicas leave every ISR and leadership, writes go on through the other brokers with no
    error reaching the producer, DescribeLogDirs says KAFKA_STORAGE_ERROR; once the disk
    works, its replicas come back, catch up, and every ISR is whole again."""
    c, traffic = nc.rayk_under_traffic("diskfail")
    timeline = nc.Timeline(c, traffic)
    victim = next(b["broker_id"] for b in c.brokers() if nc.broker_node_of(c, b["broker_id"]) == nc.FAILING_DISK_NODE)
    led = [p["partition"] for p in c.describe_topic(TOPIC) if p["leader"] == victim]
    if ops == "read":  # only reads fail, and only reads the page cache cannot serve
        # The victim's own copy, looked up now: c.leader at the fetch named another broker's
        # once the probe had moved the leaderships (a read that did not touch the disk).
        own_copy = c.replica(TOPIC, led[0], victim)
        # Dropped before the disk fails: that takes seconds on a busy machine, and the
        # broker's probe finds a failing disk within one and moves its leaderships.
        Path("/proc/sys/vm/drop_caches").write_text("1")
    t0 = time.monotonic()
    nc.fail_disk(tuple(ops.split(",")))
    nc.log(f"broker {victim}'s disk fails {ops} (it leads partitions {led})")
    if ops == "read":
        answer = ray.get(own_copy.fetch.remote(0, 1 << 20, 1, 0), timeout=30)
        assert isinstance(answer.error, KafkaStorageError), f"a read the disk failed was answered {answer}"
        nc.log(f"a read of partition {led[0]} from offset 0 answered {type(answer.error).__name__}")

    def offline() -> bool:
        described = ray.get(c.broker(victim).describe_log_dirs.remote(), timeout=10)
        return described["error"] is not None and all(victim not in p["isr"] and p["leader"] != victim
                                                       for p in c.describe_topic(TOPIC))  # fmt: skip

    wait_until(offline, OFFLINE_BOUND_S, f"broker {victim}'s directory offline, out of every ISR and leadership")
    offline_s = time.monotonic() - t0
    time.sleep(max(0.0, FAILING_S - (time.monotonic() - t0)))
    gap_s = nc.longest_ack_gap_s(traffic, t0, time.monotonic())
    assert gap_s <= RESUME_BOUND_S, f"a partition took no write for {gap_s:.1f} s while the disk failed"
    assert traffic.failed == {}, f"errors reached the producer while the disk failed: {dict(traffic.failed)}"
    described = ray.get(c.broker(victim).describe_log_dirs.remote(), timeout=10)
    assert described["error"] is not None and described["partitions"] == {}, described
    nc.fail_disk(())
    nc.log("the disk works again")
    whole_s = nc.wait_whole(c, WHOLE_BOUND_S, "once the disk worked")
    assert ray.get(c.broker(victim).describe_log_dirs.remote(), timeout=10)["error"] is None
    run_until_acked(traffic, 500)
    timeline.stop()
    check(c, traffic, f"a broker's disk failing {ops}", gap_s)
    print(f"MEASURED disk failing {ops}: offline and out of every ISR after {offline_s:.1f} s; longest stall of a "
          f"partition {gap_s:.1f} s; whole again {whole_s:.1f} s after the disk worked", flush=True)  # fmt: skip
    c.shutdown()


@pytest.mark.chaos  # 70-100 s, as each scenario on a netns cluster: in `make chaos`
def test_a_full_disk_takes_its_broker_out_of_the_isrs_and_it_rejoins_once_there_is_room():
    output = nc.run_scenario("tests.faults.test_disk_faults:full_disk", timeout_s=SCENARIO_TIMEOUT_S)
    assert "MEASURED disk full" in output


@pytest.mark.chaos
@pytest.mark.parametrize("ops", ["read,write,fsync", "fsync", "read"])
def test_a_failing_disk_takes_its_directory_offline_and_its_replicas_come_back_once_it_works(ops):
    output = nc.run_scenario("tests.faults.test_disk_faults:failing_disk", ops, timeout_s=SCENARIO_TIMEOUT_S,
                             failing_disk=True)  # fmt: skip
    assert f"MEASURED disk failing {ops}" in output
