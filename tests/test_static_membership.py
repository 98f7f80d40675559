"""Static membership (KIP-345) in ConsumerGroup, without a cluster: a static member that
comes back with its group.instance.id gets its assignment back with no rebalance, the
process it replaced is fenced (FENCED_INSTANCE_ID) in every call, a LeaveGroup may name a
static member by its instance id alone, and a session timeout still removes one. Over the
wire with confluent-kafka: tests/test_kafka_clients.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from rayk.coordinator.group.consumer_group import ConsumerGroup, GroupState
from rayk.errors import FencedInstanceIdError, RebalanceInProgressError, UnknownMemberIdError

PROTOCOLS = [("range", b"meta")]
SESSION_MS = 10_000


DELAY_MS = 50  # group.initial.rebalance.delay.ms: members joining together land in one generation


class Clock:
    """Monotonic time that a test can move ahead (session timeouts)."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead_s


async def join(group: ConsumerGroup, instance_id: str | None, member_id: str = ""):
    return await group.join(member_id, "client", SESSION_MS, SESSION_MS, "consumer", PROTOCOLS, instance_id)


async def stable_pair(clock: Clock | None = None) -> tuple[ConsumerGroup, dict[str, str]]:
    """Static members 'a' and 'b' in a Stable generation 1, each assigned b'<its instance id>'."""
    group = ConsumerGroup("g", initial_rebalance_delay_ms=DELAY_MS, clock_s=clock or Clock())
    a, b = await asyncio.gather(join(group, "a"), join(group, "b"))
    ids = {"a": a.member_id, "b": b.member_id}
    leader = a if a.member_id == a.leader_id else b
    follower = b if leader is a else a
    assignments = {ids[i]: i.encode() for i in ids}
    await asyncio.gather(
        group.sync(1, leader.member_id, assignments, "a" if leader is a else "b"),
        group.sync(1, follower.member_id, None, "b" if leader is a else "a"),
    )
    assert group.state is GroupState.STABLE and group.generation == 1
    return group, ids


@pytest.mark.parametrize("restarted", ["a", "b"])  # one of them is the leader
def test_a_static_member_that_comes_back_gets_its_assignment_back_without_a_rebalance(restarted):
    async def main() -> None:
        group, ids = await stable_pair()
        leader_before = group.leader_id
        again = await join(group, restarted)  # a new process: no member id, the same instance id
        assert again.generation == 1 and again.member_id != ids[restarted] and again.members == []
        assert again.leader_id == leader_before != again.member_id  # it must not assign
        assert group.state is GroupState.STABLE
        assert await group.sync(1, again.member_id, None, restarted) == restarted.encode()
        other = "b" if restarted == "a" else "a"
        group.heartbeat(1, ids[other], other)  # no REBALANCE_IN_PROGRESS: nobody rebalances
        group.heartbeat(1, again.member_id, restarted)
        assert group.static_members == {restarted: again.member_id, other: ids[other]}
        assert group.leader_id in {again.member_id, ids[other]}  # the leader's new id if it restarted

    asyncio.run(main())


def test_the_process_a_static_member_replaced_is_fenced_in_every_call():
    async def main() -> None:
        group, ids = await stable_pair()
        await join(group, "a")
        old = ids["a"]
        with pytest.raises(FencedInstanceIdError):
            group.heartbeat(1, old, "a")
        with pytest.raises(FencedInstanceIdError):
            await group.sync(1, old, None, "a")
        with pytest.raises(FencedInstanceIdError):
            group.check_commit(1, old, "a")
        with pytest.raises(FencedInstanceIdError):
            await join(group, "a", member_id=old)
        with pytest.raises(FencedInstanceIdError):
            group.leave(old, "a")
        with pytest.raises(UnknownMemberIdError):  # an old client version, without its instance id
            group.heartbeat(1, old)

    asyncio.run(main())


def test_a_static_member_that_comes_back_while_its_old_process_waits_in_a_join_fences_that_join():
    async def main() -> None:
        group, ids = await stable_pair()
        newcomer = asyncio.ensure_future(join(group, None))  # a dynamic member: a rebalance starts
        await asyncio.sleep(0)
        with pytest.raises(RebalanceInProgressError):
            group.heartbeat(1, ids["a"], "a")
        waiting = asyncio.ensure_future(join(group, "a", member_id=ids["a"]))
        await asyncio.sleep(0)
        replacing = asyncio.ensure_future(join(group, "a"))
        with pytest.raises(FencedInstanceIdError):
            await waiting
        b_rejoined = await join(group, "b", member_id=ids["b"])  # the last one: the join completes
        results = [await replacing, await newcomer, b_rejoined]
        assert {r.generation for r in results} == {2}
        assert set(group.members) == {r.member_id for r in results} and ids["a"] not in group.members
        assert group.static_members == {"a": results[0].member_id, "b": ids["b"]}

    asyncio.run(main())


def test_a_static_member_that_comes_back_during_completing_rebalance_makes_the_group_rebalance():
    async def main() -> None:
        group = ConsumerGroup("g", initial_rebalance_delay_ms=DELAY_MS, clock_s=Clock())
        a, b = await asyncio.gather(join(group, "a"), join(group, "b"))
        assert group.state is GroupState.COMPLETING_REBALANCE  # nobody synced yet
        follower = a if a.member_id != a.leader_id else b
        instance = "a" if follower is a else "b"
        leader_instance = "b" if instance == "a" else "a"
        again = asyncio.ensure_future(join(group, instance))
        await asyncio.sleep(0)
        assert group.state is GroupState.PREPARING_REBALANCE
        rejoined = await join(group, leader_instance, member_id=follower.leader_id)
        assert rejoined.generation == 2 and (await again).generation == 2

    asyncio.run(main())


def test_leave_group_by_instance_id_alone_removes_the_static_member():
    async def main() -> None:
        group, ids = await stable_pair()
        with pytest.raises(UnknownMemberIdError):
            group.leave("", "nobody")
        group.leave("", "a")
        assert list(group.members) == [ids["b"]] and group.static_members == {"b": ids["b"]}
        assert group.state is GroupState.PREPARING_REBALANCE

    asyncio.run(main())


def test_a_static_member_whose_session_times_out_is_removed_and_its_instance_id_joins_anew():
    async def main() -> None:
        clock = Clock()
        group, ids = await stable_pair(clock)
        clock.ahead_s += SESSION_MS / 1000 - 1
        group.heartbeat(1, ids["b"], "b")
        clock.ahead_s += 2
        assert group.expire() == [ids["a"]]
        assert group.static_members == {"b": ids["b"]} and group.state is GroupState.PREPARING_REBALANCE
        rejoin_b = asyncio.ensure_future(join(group, "b", member_id=ids["b"]))
        back = await join(group, "a")
        assert back.generation == 2 and back.member_id != ids["a"] and (await rejoin_b).generation == 2

    asyncio.run(main())
