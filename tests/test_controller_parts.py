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
            for broker_id, _silent_s, why in sessions.brokers_to_fence():
                assert why == "silent", "no call held on its process: Kafka's rule"
                fenced.append(broker_id)
                sessions.heartbeat(1, meta.brokers[1].epoch)  # heard from while broker 0 is fenced
        sessions.detach(0)
        assert meta.attached == {1, 2}
        return fenced

    assert asyncio.run(scenario()) == [0]


class FakeBroker:
    """A ReplicaManager stand-in whose held call (`run_until_stopped`) fails when `die` is called."""

    def __init__(self) -> None:
        self.held: list[asyncio.Future] = []
        self.run_until_stopped = type("Method", (), {"remote": staticmethod(self._hold)})()

    def _hold(self) -> asyncio.Future:
        self.held.append(asyncio.get_running_loop().create_future())
        return self.held[-1]

    def die(self) -> None:
        from ray.exceptions import RayActorError

        for future in self.held:
            if not future.done():
                future.set_exception(RayActorError())


def sessions_on_a_clock(meta: ClusterMetadata, brokers: dict[int, FakeBroker], deaths: list) -> tuple:
    clock = [0.0]
    sessions = BrokerHeartbeatManager(meta.cluster, session_timeout_ms=9_000, heartbeat_interval_ms=2_000,
                                      clock=lambda: clock[0])

    async def on_death(broker_id: int, epoch: int) -> None:
        deaths.append((broker_id, epoch))

    for b, broker in brokers.items():
        sessions.attach(b, broker)
        sessions.watch(b, meta.brokers[b].epoch, broker, on_death, incarnation_id=f"process-{b}")
    return sessions, clock


def test_a_late_broker_that_ray_has_alive_is_fenced_only_past_the_bound_and_one_at_a_time():
    meta = cluster(3)

    async def scenario() -> list[tuple[float, int, str]]:
        brokers = {b: FakeBroker() for b in range(3)}
        sessions, clock = sessions_on_a_clock(meta, brokers, [])
        await asyncio.sleep(0)  # the held calls go out
        fenced = []
        for second in range(1, 60):
            clock[0] = second
            sessions.heartbeat(2, meta.brokers[2].epoch)  # broker 2 keeps heartbeating; 0 and 1 are starved
            for broker_id, _silent_s, why in sessions.brokers_to_fence():
                fenced.append((clock[0], broker_id, why))
                for record in meta.plan_fence_broker(broker_id):  # what the Controller commits
                    meta.apply(record, meta.last_offset + 1)
                sessions.fenced(broker_id)
                sessions.detach(broker_id)
            if second == 20:
                assert sessions.late_brokers() == {0, 1}, "late, not fenced"
        return fenced

    # 4 sessions of 9 s: 36 s of silence; broker 1 only a session timeout after broker 0.
    assert asyncio.run(scenario()) == [(37.0, 0, "late"), (46.0, 1, "late")]


def test_a_broker_whose_process_ray_reports_dead_is_reported_at_once_and_a_silent_one_without_a_held_call_fenced():
    meta = cluster(2)

    async def scenario() -> tuple[list, list]:
        deaths: list = []
        brokers = {0: FakeBroker(), 1: FakeBroker()}
        sessions, clock = sessions_on_a_clock(meta, brokers, deaths)
        await asyncio.sleep(0)
        sessions.watch(0, 99, brokers[0], None, incarnation_id="process-0")  # registered again: same process
        assert len(brokers[0].held) == 1, "one held call per process"
        brokers[0].die()
        brokers[1].die()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        clock[0] = 9.5
        return deaths, list(sessions.brokers_to_fence())

    deaths, to_fence = asyncio.run(scenario())
    assert sorted(deaths) == [(0, 99), (1, meta.brokers[1].epoch)], "with the epoch each last registered with"
    assert [(b, why) for b, _, why in to_fence] == [(0, "silent"), (1, "silent")], "no held call: Kafka's rule"


def test_a_stall_of_the_controller_is_not_counted_as_the_brokers_silence():
    meta = cluster(1)
    clock = [0.0]
    sessions = BrokerHeartbeatManager(meta.cluster, session_timeout_ms=9_000, heartbeat_interval_ms=2_000,
                                      clock=lambda: clock[0])
    sessions.attach(0, manager=object())
    sessions.heartbeat(0, meta.brokers[0].epoch)
    clock[0] = 12.0  # the Controller's loop could not run for 10 of these 12 s
    sessions.credit_stall(10.0)
    assert list(sessions.brokers_to_fence()) == []
    clock[0] = 11.5 + 9
    assert [b for b, _, _ in sessions.brokers_to_fence()] == [0]


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


class _Leader:
    """A leader replica stand-in whose `describe` answers at once, or never (a leader the
    network cut off, which Ray has alive)."""

    def __init__(self, answers: bool) -> None:
        self.describe = self
        self._answers = answers

    async def remote(self) -> dict:
        if not self._answers:
            await asyncio.Event().wait()
        return {"high_watermark": 7, "log_end_offset": 9, "log_start_offset": 0}


class _Channels:
    def __init__(self, leaders: dict) -> None:
        self._leaders = leaders

    def handle(self, topic: str, partition: int, broker_id: int):
        return self._leaders.get(broker_id)


def test_describe_topic_answers_within_its_bound_when_a_leader_never_does(monkeypatch):
    from rayk.controller import metadata_view
    from rayk.metadata.records import PartitionRecord, TopicRecord

    monkeypatch.setattr(metadata_view, "DESCRIBE_OFFSETS_TIMEOUT_S", 0.2)
    meta = cluster(2)
    for offset, record in enumerate([TopicRecord("t", "id", {}), PartitionRecord("t", 0, (0, 1), (0, 1), 0, 0, 0),
                                     PartitionRecord("t", 1, (1, 0), (1, 0), 1, 0, 0)], start=100):  # fmt: skip
        meta.apply(record, offset)
    view = metadata_view.MetadataView(meta, _Channels({0: _Leader(answers=False), 1: _Leader(answers=True)}), None)
    started = time.monotonic()
    parts = asyncio.run(asyncio.wait_for(view.describe_topic("t"), 5))
    assert time.monotonic() - started < 1.5, "one silent leader held the whole answer"
    assert [(p["leader"], p["high_watermark"], p["log_end_offset"]) for p in parts] == [(0, None, None), (1, 7, 9)]
    assert [p["isr"] for p in parts] == [[0, 1], [1, 0]]
