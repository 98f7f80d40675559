"""A broker's wall clock stepped an hour forward or back (issue 68, clock faults), part by
part and without Ray: Kafka's rule is that timeouts, deadlines and lags are elapsed times
inside a process (the monotonic clock), and that record timestamps, compared with the wall
clock, decide only retention and the time index.

- The leader's ISR: a follower's lag (replica.lag.time.max.ms) is monotonic, so a step
  forward drops no follower and a step back keeps no silent one.
- Transactions: the start is written as wall time, the timeout's deadline is held on the
  monotonic clock, also for a transaction loaded after a failover.
- Group members' sessions (consumer and share groups) are monotonic.
- The Controller's metadata snapshot interval is monotonic.
- Retention and the time index follow record timestamps against the wall clock, as
  Kafka's: a segment goes when its largest timestamp is older than now - retention.ms,
  the time index only grows, and a lookup by timestamp is right whatever order the
  timestamps came in.

The wall clock is stepped by patching `time.time` (what every wall-clock read in rayk
calls); the monotonic clock runs, or is the injected one where a part takes a clock.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from rayk.config import BrokerConfig
from rayk.coordinator.group.consumer_protocol_group import ConsumerHeartbeat
from rayk.coordinator.group.group_coordinator import GroupCoordinator
from rayk.coordinator.transaction.transaction_metadata import TxnState
from rayk.metadata.log import MetadataLog
from rayk.metadata.records import ClusterIdRecord
from rayk.replication.leader_fetch import LeaderFetch
from rayk.replication.leader_isr import LeaderIsr
from rayk.replication.replica_context import ReplicaConfig, ReplicaContext
from rayk.storage import Log, LogConfig
from rayk.storage.records import SimpleRecord, build_batch
from tests.test_transaction_coordinator import A, Partitions

HOUR_MS = 3_600_000
# The tests wait for real for what must pass (a lag, a session), and check at once what
# must not have: the limits are short, but long enough for a loaded machine's pauses.
LAG_MS = 1_000  # replica.lag.time.max.ms


@pytest.fixture
def wall(monkeypatch):
    """Steps this process's wall clock: `wall.step(ms)` adds `ms` to what time.time says."""

    class Wall:
        offset_ms = 0

        def step(self, ms: int) -> None:
            self.offset_ms += ms

    w, real = Wall(), time.time
    monkeypatch.setattr(time, "time", lambda: real() + w.offset_ms / 1000)
    return w


# ---------------------------------------------------------------------- the ISR


def leader_of_three(tmp_path, lag_ms: int = LAG_MS) -> tuple[LeaderIsr, LeaderFetch]:
    """Broker 1 leading [1, 2, 3], every follower caught up (their fetch at the LEO)."""
    ctx = ReplicaContext("t", 0, 1, None, Log(tmp_path / "t-0"), ReplicaConfig(replica_lag_time_max_ms=lag_ms))
    ctx.lead(0)
    isr = LeaderIsr(ctx, None)  # no Controller: an ISR change commits at once
    isr.lead([1, 2, 3], [1, 2, 3], partition_epoch=0)
    fetch = LeaderFetch(ctx, isr)
    for follower in (2, 3):
        fetch._record_follower_position(follower, ctx.log.log_end_offset)
    return isr, fetch


def test_a_step_forward_drops_no_follower_from_the_isr(tmp_path, wall):
    async def main() -> None:
        isr, _ = leader_of_three(tmp_path, lag_ms=60_000)
        wall.step(HOUR_MS)
        isr._maybe_shrink()  # the isr-expiration task's check
        assert isr.leading().isr == {1, 2, 3}, "an hour of wall clock is no lag: the followers fetched just now"
        isr.stop()

    asyncio.run(main())


def test_a_step_back_keeps_no_silent_follower_past_the_lag_limit(tmp_path, wall):
    async def main() -> None:
        isr, fetch = leader_of_three(tmp_path)
        wall.step(-HOUR_MS)
        await asyncio.sleep(LAG_MS / 1000 * 1.5)  # broker 3 is silent; broker 2 fetches
        fetch._record_follower_position(2, isr._ctx.log.log_end_offset)
        isr._maybe_shrink()
        assert 3 not in isr.leading().isr, "broker 3 fell behind by replica.lag.time.max.ms, whatever the wall says"
        isr.stop()

    asyncio.run(main())


# ---------------------------------------------------------------------- transactions


async def open_transaction(p: Partitions, timeout_ms: int = 60_000):
    c = p.coordinator()
    pid, epoch = await c.init_producer_id("tx", timeout_ms)
    await c.add_partitions("tx", pid, epoch, [A])
    return c


def test_a_step_forward_does_not_abort_an_open_transaction():
    async def main() -> None:
        p = Partitions()
        c = await open_transaction(p)
        p.now_ms += HOUR_MS  # the wall clock steps; the monotonic one does not
        assert await c.abort_timed_out() == []
        assert c.metadata("tx").state is TxnState.ONGOING

    asyncio.run(main())


def test_a_step_back_does_not_keep_a_transaction_past_its_timeout():
    async def main() -> None:
        p = Partitions()
        c = await open_transaction(p)
        p.now_ms -= HOUR_MS
        p.monotonic_ms += 59_000
        assert await c.abort_timed_out() == []
        p.advance(1_001)  # 60.001 s after it started, by the monotonic clock
        assert await c.abort_timed_out() == ["tx"]

    asyncio.run(main())


@pytest.mark.parametrize("skew_ms, aborted_after_ms", [(-HOUR_MS, 60_001), (0, 40_001), (HOUR_MS, 1)])
def test_a_loaded_transaction_times_out_by_what_is_left_of_it(skew_ms, aborted_after_ms):
    """A failover 20 s into a 60 s transaction: the new coordinator counts 40 s more on its
    monotonic clock. Its wall clock an hour behind the old one's: never more than the
    whole timeout; an hour ahead: at once, never earlier than that."""

    async def main() -> None:
        p = Partitions()
        await open_transaction(p)
        p.advance(20_000)
        p.now_ms += skew_ms  # the next coordinator's wall clock
        c = p.coordinator(epoch=4)
        c.load(p.records)
        p.advance(aborted_after_ms - 1)
        assert await c.abort_timed_out() == []
        p.advance(1)
        assert await c.abort_timed_out() == ["tx"]

    asyncio.run(main())


# ---------------------------------------------------------------------- group sessions

SESSION_MS = 1_000


def group_coordinator() -> GroupCoordinator:
    appended = 0

    async def append(records) -> int:
        nonlocal appended
        appended += len(records)
        return appended - len(records)

    config = BrokerConfig(group_initial_rebalance_delay_ms=0, group_consumer_session_timeout_ms=SESSION_MS,
                          group_share_session_timeout_ms=SESSION_MS)  # fmt: skip
    coordinator = GroupCoordinator(append, config)
    coordinator.load([])
    return coordinator


def join(member_id: str) -> ConsumerHeartbeat:
    return ConsumerHeartbeat(member_id, 0, subscribed_topics=("t",), owned=())


@pytest.mark.parametrize("step_ms", [HOUR_MS, -HOUR_MS])
def test_group_members_expire_by_their_session_timeout_not_by_the_wall_clock(wall, step_ms):
    async def main() -> None:
        c = group_coordinator()
        await c.consumer_heartbeat("g", join("a"), {"t": 2})
        share = await c.share_heartbeat("s", "", 0, ("t",), partition_counts={"t": 2})
        wall.step(step_ms)
        assert await c.expire_consumer_members("g") == [], "a step of the clock is not a silent member"
        assert await c.expire_share_members("s") == []
        await asyncio.sleep(SESSION_MS / 1000 * 1.5)
        assert await c.expire_consumer_members("g") == ["a"], "silent for its session timeout"
        assert await c.expire_share_members("s") == [share.member_id]

    asyncio.run(main())


# ---------------------------------------------------------------------- the Controller's snapshots


@pytest.mark.parametrize("step_ms", [HOUR_MS, -HOUR_MS])
def test_the_metadata_snapshot_interval_is_an_elapsed_time(tmp_path, wall, step_ms):
    """metadata.log.max.snapshot.interval.ms: a step forward takes no snapshot early, a
    step back holds none off."""
    interval_ms = 1_000
    log = MetadataLog(tmp_path, max_snapshot_interval_ms=interval_ms)
    log.load()
    log.append([ClusterIdRecord("cluster")])
    wall.step(step_ms)
    assert not log.snapshot_due(), "no time has passed"
    time.sleep(interval_ms / 1000 * 1.5)
    assert log.snapshot_due(), "the interval has passed"
    log.close()


# ---------------------------------------------------------------------- retention, the time index


def stamped(timestamp_ms: int, n: int = 2) -> bytes:
    return build_batch([SimpleRecord(b"v" * 20, timestamp_ms=timestamp_ms + i) for i in range(n)])


def test_time_retention_compares_the_largest_record_timestamp_with_the_wall_clock(tmp_path, wall):
    """Kafka's rule: a segment is deleted once now - its largest timestamp > retention.ms,
    now by the broker's wall clock. Stepped back, nothing is deleted until the clock is
    past it again; stepped forward, what is then older goes (records are not lost to a
    step: only what retention would delete an hour later)."""
    now_ms = int(time.time() * 1000)
    one = stamped(0)
    log = Log(tmp_path, LogConfig(segment_bytes=len(one) * 2, retention_ms=HOUR_MS // 2))
    for age_ms in (50 * 60_000, 40 * 60_000, 10 * 60_000, 0):  # records 50, 40, 10 and 0 minutes old
        log.append_as_leader(stamped(now_ms - age_ms), leader_epoch=0)
        log.roll()
    log.high_watermark = log.log_end_offset
    wall.step(-HOUR_MS)
    assert log.delete_expired_segments() == 0, "every record is in the future of a clock an hour back"
    wall.step(HOUR_MS)
    assert log.delete_expired_segments() == 2, "the two older than 30 minutes"
    assert log.log_start_offset == 4
    wall.step(HOUR_MS)
    assert log.delete_expired_segments() == 2 and log.log_start_offset == 8, "an hour ahead: everything is older"
    log.close()


def test_the_time_index_grows_only_and_lookups_follow_record_timestamps_that_go_back(tmp_path):
    """A producer whose clock stepped back: timestamps 1000, 2000, then 1000 - 1 h, then
    3000. The time index takes a batch only if its max timestamp is the largest yet (as
    Kafka's maxTimestampSoFar), and ListOffsets by timestamp answers the earliest offset
    whose timestamp is >= the target."""
    t = 10 * HOUR_MS
    log = Log(tmp_path, LogConfig(index_interval_bytes=1))  # an index entry per batch, when it may have one
    for timestamp_ms in (t + 1000, t + 2000, t + 1000 - HOUR_MS, t + 3000):
        log.append_as_leader(stamped(timestamp_ms), leader_epoch=0)  # offsets 0-1, 2-3, 4-5, 6-7
    index = log._local.segments.active.time_index
    entries = [index._entry(n) for n in range(index.entries)]
    # Kafka's index interval: no entry for the first batch; none for the one that went back
    # (the largest timestamp is still the second batch's), one for the fourth.
    assert entries == [(t + 2001, 3), (t + 3001, 7)]

    def found(target_ms: int) -> tuple[int, int] | None:
        hit = log.offset_for_timestamp(target_ms)
        return None if hit is None else (hit.offset, hit.timestamp_ms)

    assert found(t - HOUR_MS) == (0, t + 1000), "the earliest offset at or after: not the batch that went back"
    assert found(t + 1000 - HOUR_MS) == (0, t + 1000)
    assert found(t + 2001) == (3, t + 2001)
    assert found(t + 2002) == (6, t + 3000), "past the batch that went back, to the next larger timestamp"
    assert found(t + 3002) is None
    log.close()
