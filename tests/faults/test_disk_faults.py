"""A broker's disk full, on a multi-host cluster of network namespaces (netns_cluster.py)
where each node has a disk of its own (a tmpfs that `resize_disk` shrinks to what it
holds), under continuous acks=all idempotent production (harness.Traffic).

What Kafka promises (KIP-112's LogDirFailureChannel): a log directory that fails a write
goes offline, its replicas leave the ISR and lose leadership, and the broker serves what
it can; nothing acknowledged is lost. rayk's broker has one data directory: a replica
whose append fails with ENOSPC (KafkaStorageError) fails that request, falls behind as a
follower or is taken out of leadership when its process fails, and the other replicas
carry the partition; once the disk has room it catches up and rejoins the ISR.
"""

from __future__ import annotations

import time

import pytest

from tests.cluster_helpers import wait_until
from tests.faults import netns_cluster as nc
from tests.faults.harness import TOPIC, check, run_until_acked

SCENARIO_TIMEOUT_S = 420
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


@pytest.mark.chaos  # 70-100 s, as each scenario on a netns cluster: in `make chaos`
def test_a_full_disk_takes_its_broker_out_of_the_isrs_and_it_rejoins_once_there_is_room():
    output = nc.run_scenario("tests.faults.test_disk_faults:full_disk", SCENARIO_TIMEOUT_S)
    assert "MEASURED disk full" in output
