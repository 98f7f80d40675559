"""Replication throttles (leader.replication.throttled.rate, follower.replication.throttled.rate)
without Ray: a broker's rates shared among the replicas its moves add, a throttled copy of
B bytes taking at least B / rate on either side, and an unthrottled one not slowed."""

from __future__ import annotations

import asyncio
import time

from rayk.config import BrokerConfig
from rayk.metadata.elections import PartitionState
from rayk.replication.partition_replica import CONSUMER_REPLICA_ID, PartitionReplica, ReplicaConfig
from rayk.replication.replica_fetcher import ReplicaFetcher
from rayk.replication.replication_throttle import (
    UNTHROTTLED,
    ReplicationThrottle,
    ThrottleSetting,
    throttle_settings,
)
from rayk.server.broker_throttles import BrokerThrottles
from rayk.storage import Log
from rayk.storage.records import SimpleRecord, build_batch
from tests.test_replica_fetcher import FakeLeader

RATE_BYTES_PER_S = 400_000
RECORD = b"x" * 10_000
BATCHES = 60  # ~600 KB: 1.5 s at the rate


def fill(log: Log, batches: int = BATCHES) -> int:
    for _ in range(batches):
        log.append_as_leader(build_batch([SimpleRecord(RECORD)]), leader_epoch=0)
    log.high_watermark = log.log_end_offset
    return log.size_bytes


def moving(leader: int, replicas: tuple[int, ...], adding: tuple[int, ...]) -> PartitionState:
    """A partition whose reassignment adds `adding` (not in sync yet)."""
    return PartitionState(replicas, tuple(r for r in replicas if r not in adding), leader, 0, 1, adding=adding)


def test_a_brokers_rates_are_shared_among_the_moves_it_takes_part_in_and_nothing_else_is_throttled():
    steady = PartitionState((0, 1, 2), (0, 1, 2), 0, 0, 0)
    states = {
        ("a", 0): moving(0, (3, 1, 0), adding=(3,)),  # broker 0 leads it, 3 is added
        ("b", 0): moving(0, (0, 3, 2), adding=(3,)),
        ("c", 0): moving(1, (0, 1, 2), adding=(0,)),  # broker 0 is added, 1 leads
        ("d", 0): steady,
    }
    settings = throttle_settings(0, states, 1000, 600)
    assert settings == {("a", 0): ThrottleSetting(500, (3,)), ("b", 0): ThrottleSetting(500, (3,)),
                        ("c", 0): ThrottleSetting(follower_rate_bytes_per_s=600)}
    assert throttle_settings(0, states, None, None) == {}


def test_a_broker_tells_the_others_their_new_share_when_a_move_completes():
    config = BrokerConfig.from_properties({"leader.replication.throttled.rate": 1000})
    throttles = BrokerThrottles(0, config)
    states = {("a", 0): moving(0, (3, 1, 0), adding=(3,)), ("b", 0): moving(0, (0, 3, 2), adding=(3,))}
    assert throttles.setting_for(("a", 0), states) == ThrottleSetting(500, (3,))
    assert throttles.changed(states, {("a", 0): "A", ("b", 0): "B"}) == [("B", ThrottleSetting(500, (3,)))]
    states[("a", 0)] = PartitionState((3, 1, 0), (3, 1, 0), 0, 0, 2)  # a's move completed
    assert throttles.changed(states, {("a", 0): "A", ("b", 0): "B"}) == [
        ("A", UNTHROTTLED), ("B", ThrottleSetting(1000, (3,)))]
    assert BrokerThrottles(0, BrokerConfig()).off, "Kafka's default rates throttle nothing"


def test_the_throttle_paces_bytes_to_its_rate_and_saves_nothing_up_while_idle():
    throttle = ReplicationThrottle(1000)
    assert throttle.charge(500, now_s=10.0) == 0.5
    assert throttle.charge(500, now_s=10.0) == 1.0, "queued behind the first"
    assert throttle.charge(1000, now_s=100.0) == 1.0, "idle time is not credit"
    assert throttle.max_bytes(1 << 20) == 500
    assert ReplicationThrottle(None).charge(1 << 30, now_s=0.0) == 0.0


def copy_time(tmp_path, name: str, throttle: ReplicationThrottle) -> tuple[float, int]:
    leader = Log(tmp_path / f"{name}-leader")
    follower = Log(tmp_path / f"{name}-follower")
    size = fill(leader)
    fetcher = ReplicaFetcher(follower, name, 1, FakeLeader(leader), 0, ReplicaConfig(), lambda: None, "", throttle)

    async def go() -> float:
        started = time.monotonic()
        task = asyncio.get_running_loop().create_task(fetcher.run())
        while follower.log_end_offset < leader.log_end_offset:
            assert time.monotonic() - started < 30, "the copy never completed"
            await asyncio.sleep(0.005)
        task.cancel()
        return time.monotonic() - started

    return asyncio.run(go()), size


def test_a_throttled_follower_copies_no_faster_than_its_rate_and_an_unthrottled_one_is_not_slowed(tmp_path):
    throttled_s, size = copy_time(tmp_path, "throttled", ReplicationThrottle(RATE_BYTES_PER_S))
    unthrottled_s, _ = copy_time(tmp_path, "free", ReplicationThrottle())
    assert throttled_s >= size / RATE_BYTES_PER_S, (throttled_s, size)
    assert unthrottled_s < size / RATE_BYTES_PER_S / 2, f"{unthrottled_s:.3f} s for {size} bytes unthrottled"


def test_a_leader_answers_an_adding_follower_no_faster_than_its_share_and_the_others_at_once(tmp_path):
    async def read_all(replica: PartitionReplica, replica_id: int, end: int) -> float:
        started, offset = time.monotonic(), 0
        while offset < end:
            result = await replica.fetch(offset, 1 << 20, 1, 0, replica_id=replica_id, leader_epoch=0)
            assert result.error is None, result.error
            offset = result.log_end_offset if not result.records else _next_offset(result.records)
        return time.monotonic() - started

    async def main() -> tuple[float, float, float, int]:
        replica = PartitionReplica("t", 0, 0, tmp_path / "t-0", replica_config=ReplicaConfig())
        await replica.become_leader(0, [0, 1, 2], [0, 1], 0, ThrottleSetting(RATE_BYTES_PER_S, (2,)))
        for _ in range(BATCHES):
            assert (await replica.produce(build_batch([SimpleRecord(RECORD)]), 1, 5_000)).error is None
        end, size = replica._log.log_end_offset, replica._log.size_bytes
        adding_s = await read_all(replica, 2, end)
        in_sync_s = await read_all(replica, 1, end)
        consumer_s = await read_all(replica, CONSUMER_REPLICA_ID, replica._log.high_watermark)
        await replica.close()
        return adding_s, in_sync_s, consumer_s, size

    adding_s, in_sync_s, consumer_s, size = asyncio.run(main())
    assert adding_s >= size / RATE_BYTES_PER_S, (adding_s, size)
    assert max(in_sync_s, consumer_s) < size / RATE_BYTES_PER_S / 2, (in_sync_s, consumer_s)


def _next_offset(records: bytes) -> int:
    from rayk.storage.records import iter_batches

    return max(b.header.next_offset for b in iter_batches(records))
