"""The Controller's composed parts without Ray: the maintenance loop's scheduling, the
brokers' sessions, and the consistency a commit asserts."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from rayk.controller.broker_heartbeat_manager import BrokerHeartbeatManager
from rayk.controller.controller import assert_consistent
from rayk.controller.periodic_tasks import PeriodicTask, PeriodicTasks
from rayk.metadata.cluster_metadata import ClusterMetadata
from rayk.metadata.records import ClusterIdRecord, FenceBrokerRecord, PartitionRecord


def test_periodic_tasks_run_in_order_each_when_due_and_a_failure_stops_none_of_the_others(caplog):
    ran: list[str] = []

    def task(name: str, fails: bool = False):
        async def run() -> None:
            ran.append(name)
            if fails:
                raise RuntimeError(name)

        return run

    async def scenario() -> None:
        tasks = PeriodicTasks(0.01, [
            PeriodicTask("first", task("first"), 0),
            PeriodicTask("broken", task("broken", fails=True), 0),
            PeriodicTask("hourly", task("hourly"), 3600),
            PeriodicTask("last", task("last"), 0),
        ])
        await tasks.run_due()
        tasks.tasks[2].next_s = time.monotonic()  # the hourly one is due now
        await tasks.run_due()

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert ran == ["first", "broken", "last", "first", "broken", "hourly", "last"]
    assert "broken failed" in caplog.text


def cluster(brokers: int) -> ClusterMetadata:
    meta = ClusterMetadata()
    offset = 0
    for records in [[ClusterIdRecord("c")], *(meta.plan_register_broker(b, f"node-{b}") for b in range(brokers))]:
        for record in records:
            meta.apply(record, offset)
            offset += 1
    return meta


def test_silent_brokers_are_judged_one_at_a_time_and_registering_ones_not_at_all():
    meta = cluster(3)

    async def scenario() -> list[int]:
        sessions = BrokerHeartbeatManager(meta.cluster, session_timeout_ms=10, heartbeat_interval_ms=3)
        for b in range(3):
            sessions.attach(b, manager=object())
        assert meta.attached == {0, 1, 2}
        await asyncio.sleep(0.03)
        fenced = []
        async with sessions.registering(2):
            for broker_id, _silent_s in sessions.silent_brokers():
                fenced.append(broker_id)
                sessions.heartbeat(1, meta.brokers[1].epoch)  # heard from while broker 0 is fenced
        sessions.detach(0)
        assert meta.attached == {1, 2}
        return fenced

    assert asyncio.run(scenario()) == [0]


def test_a_commit_that_left_a_fenced_broker_leading_fails_its_consistency_check():
    meta = cluster(3)
    offset = meta.last_offset + 1
    for record in meta.replication.plan_create_topic("t", 1, 3, {}, "t-id"):
        meta.apply(record, offset)
        offset += 1
    leader = meta.partition("t", 0).leader
    epochs = {b: r.epoch for b, r in meta.brokers.items()}
    fence = FenceBrokerRecord(leader, fenced=True)  # without the partition records that move its leadership
    meta.apply(fence, offset)
    with pytest.raises(AssertionError, match="still leads"):
        assert_consistent(meta, [fence], epochs)
    with pytest.raises(AssertionError, match="a fenced leader"):
        assert_consistent(meta, [PartitionRecord.of("t", 0, meta.partition("t", 0))], epochs)
