"""The group coordinator hosting KIP-848's consumer-protocol groups, without a cluster: a
heartbeat's change is written before it is answered, a failed write changes nothing, a
new coordinator replaying the partition takes the group over as it was (no rebalance);
commits and fetches are checked by member epoch; members time out; the group id
namespace is shared with classic groups, converting an empty group either way, and a
group with members online (a consumer-protocol member upgrades a classic group, whose
members go on as classic members, and the group is classic again when it leaves)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rayk.coordinator.group.consumer_protocol_group import ConsumerHeartbeat
from rayk.coordinator.group.group_coordinator import GroupCoordinator
from rayk.coordinator.group.classic_group_records import group_key
from rayk.coordinator.group.consumer_group_records import consumer_group_key
from rayk.consumer_protocol import decode_assignment, encode_assignment, encode_subscription
from rayk.config import BrokerConfig
from rayk.errors import (
    CoordinatorNotAvailableError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    NonEmptyGroupError,
    NotEnoughReplicasError,
    RebalanceInProgressError,
    StaleMemberEpochError,
    UnknownMemberIdError,
)

COUNTS = {"t": 4}
SESSION_MS = 6_000


class Partition:
    """The __consumer_offsets partition: its records, in order; `fail` makes appends fail."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None]] = []
        self.fail = False

    async def append(self, records: list[tuple[bytes, bytes | None]]) -> int:
        if self.fail:
            raise NotEnoughReplicasError("the ISR is below min.insync.replicas")
        self.records += records
        return len(self.records) - len(records)

    def coordinator(self) -> GroupCoordinator:
        coordinator = GroupCoordinator(self.append, BrokerConfig(group_initial_rebalance_delay_ms=0,
                                                                 group_consumer_session_timeout_ms=SESSION_MS))
        coordinator.load([(offset, key, value) for offset, (key, value) in enumerate(self.records)])
        return coordinator


def join(member_id: str, **fields: Any) -> ConsumerHeartbeat:
    return ConsumerHeartbeat(member_id, 0, subscribed_topics=("t",), owned=(), **fields)


async def settle(coordinator: GroupCoordinator, answers: dict) -> dict:
    """Heartbeats every member with what it was given until none changes."""
    for _ in range(4):
        for member_id, answer in list(answers.items()):
            answers[member_id] = await coordinator.consumer_heartbeat(
                "g", ConsumerHeartbeat(member_id, answer.member_epoch, owned=tuple(answer.assignment)), COUNTS)
    return answers


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_heartbeat_is_written_before_its_answer_and_a_new_coordinator_takes_the_group_over():
    async def main() -> None:
        partition = Partition()
        coordinator = partition.coordinator()
        answers = {m: await coordinator.consumer_heartbeat("g", join(m), COUNTS) for m in ("a", "b")}
        answers = await settle(coordinator, answers)
        assert sorted(len(a.assignment) for a in answers.values()) == [2, 2]
        written = len(partition.records)
        assert {k for k, _ in partition.records} == {consumer_group_key("g")}
        same = await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("a", answers["a"].member_epoch), COUNTS)
        assert len(partition.records) == written, "a heartbeat that changed nothing writes nothing"
        assert (same.member_epoch, same.assignment) == (answers["a"].member_epoch, answers["a"].assignment)

        taken_over = partition.coordinator()  # the partition's next leader replays it
        described = await taken_over.describe_consumer_group("g")
        assert described == await coordinator.describe_consumer_group("g")
        for member_id, answer in answers.items():  # the members go on in their epochs, nothing moves
            again = await taken_over.consumer_heartbeat(
                "g", ConsumerHeartbeat(member_id, answer.member_epoch, owned=tuple(answer.assignment)), COUNTS)
            assert (again.member_epoch, again.assignment) == (answer.member_epoch, answer.assignment)
        assert described["state"] == "Stable" and described["group_epoch"] == 2
        assert (await taken_over.list_groups()) == [
            {"group_id": "g", "state": "Stable", "protocol_type": "consumer", "group_type": "consumer"}]

    run(main())


def test_a_heartbeat_whose_write_fails_changes_nothing_and_is_coordinator_not_available():
    async def main() -> None:
        partition = Partition()
        coordinator = partition.coordinator()
        a = await coordinator.consumer_heartbeat("g", join("a"), COUNTS)
        partition.fail = True
        with pytest.raises(CoordinatorNotAvailableError):
            await coordinator.consumer_heartbeat("g", join("b"), COUNTS)
        described = await coordinator.describe_consumer_group("g")
        assert [m["member_id"] for m in described["members"]] == ["a"] and described["group_epoch"] == 1
        partition.fail = False
        again = await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("a", a.member_epoch), COUNTS)
        assert (again.member_epoch, again.assignment) == (a.member_epoch, a.assignment)

    run(main())


def test_commits_and_fetches_are_checked_by_member_epoch():
    async def main() -> None:
        coordinator = Partition().coordinator()
        offsets = {("t", 0): (5, "")}
        with pytest.raises(UnknownMemberIdError):  # no such group yet, and not a join
            await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("a", 3), COUNTS)
        a = await coordinator.consumer_heartbeat("g", join("a"), COUNTS)
        await coordinator.commit_offsets("g", a.member_epoch, "a", offsets)
        b = await coordinator.consumer_heartbeat("g", join("b"), COUNTS)
        a2 = await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("a", a.member_epoch, owned=tuple(a.assignment)), COUNTS)
        a3 = await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("a", a2.member_epoch, owned=tuple(a2.assignment)), COUNTS)
        assert a3.member_epoch > a.member_epoch
        with pytest.raises(StaleMemberEpochError):
            await coordinator.commit_offsets("g", a.member_epoch, "a", offsets)
        with pytest.raises(FencedMemberEpochError):
            await coordinator.commit_offsets("g", a3.member_epoch + 1, "a", offsets)
        with pytest.raises(UnknownMemberIdError):
            await coordinator.commit_offsets("g", 1, "nobody", offsets)
        with pytest.raises(UnknownMemberIdError):  # no member while the group has some
            await coordinator.commit_offsets("g", -1, "", offsets)
        with pytest.raises(StaleMemberEpochError):
            await coordinator.fetch_offsets("g", None, False, "a", a.member_epoch)
        await coordinator.commit_offsets("g", a3.member_epoch, "a", {("t", 0): (9, "")})
        assert (await coordinator.fetch_offsets("g", None, False, "a", a3.member_epoch))[("t", 0)].offset == 9
        assert (await coordinator.fetch_offsets("g"))[("t", 0)].offset == 9, "an admin's fetch names no member"
        with pytest.raises(NonEmptyGroupError):
            await coordinator.delete_group("g")
        for member_id, epoch in (("a", a3.member_epoch), ("b", b.member_epoch)):
            await coordinator.consumer_heartbeat("g", ConsumerHeartbeat(member_id, -1), COUNTS)
        await coordinator.commit_offsets("g", -1, "", {("t", 1): (3, "")})  # empty: anyone may commit
        await coordinator.delete_group("g")
        assert await coordinator.list_groups() == []

    run(main())


def test_a_silent_member_times_out_and_its_removal_is_written(monkeypatch):
    clock_ms = [1_000]
    monkeypatch.setattr("rayk.coordinator.group.consumer_protocol_group_manager.monotonic_ms", lambda: clock_ms[0])

    async def main() -> None:
        partition = Partition()
        coordinator = partition.coordinator()
        await coordinator.consumer_heartbeat("g", join("a"), COUNTS)
        b = await coordinator.consumer_heartbeat("g", join("b"), COUNTS)
        members = (await coordinator.describe_consumer_group("g"))["members"]
        assert {m["member_id"] for m in members} == {"a", "b"}
        clock_ms[0] += SESSION_MS
        assert await coordinator.expire_consumer_members("g") == [], "a session is over only after its timeout"
        await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("b", b.member_epoch), COUNTS)
        clock_ms[0] += 1
        assert await coordinator.expire_consumer_members("g") == ["a"]
        replayed = partition.coordinator()
        assert [m["member_id"] for m in (await replayed.describe_consumer_group("g"))["members"]] == ["b"]

    run(main())


def test_classic_and_consumer_groups_share_ids_and_an_empty_group_converts_either_way():
    async def main() -> None:
        partition = Partition()
        coordinator = partition.coordinator()
        joined = await coordinator.join_group("g", "", "c", 10_000, 10_000, "consumer", [("range", b"")])
        await coordinator.sync_group("g", joined.generation, joined.member_id, {joined.member_id: b""})
        with pytest.raises(GroupIdNotFoundError):  # a classic group with members
            await coordinator.consumer_heartbeat("g", join("a"), COUNTS)
        await coordinator.leave_group("g", joined.member_id)
        await asyncio.sleep(0)
        a = await coordinator.consumer_heartbeat("g", join("a"), COUNTS)  # empty: it converts
        assert (group_key("g"), None) in partition.records, "the classic group's record is tombstoned"
        assert (await coordinator.list_groups())[0]["group_type"] == "consumer"
        with pytest.raises(InconsistentGroupProtocolError):
            await coordinator.join_group("g", "", "c", 10_000, 10_000, "consumer", [("range", b"")])
        with pytest.raises(GroupIdNotFoundError):  # DescribeGroups is for classic groups
            await coordinator.describe_group("g")
        shown = await coordinator.describe_group("g", consumer_protocol_too=True)
        assert shown["protocol_type"] == "consumer" and len(shown["members"]) == 1
        await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("a", -1), COUNTS)
        back = await coordinator.join_group("g", "", "c", 10_000, 10_000, "consumer", [("range", b"")])
        assert back.member_id and (consumer_group_key("g"), None) in partition.records
        await coordinator.sync_group("g", back.generation, back.member_id, {back.member_id: b""})
        await asyncio.sleep(0.05)  # the settled generation's record is written in the background
        assert (await partition.coordinator().list_groups())[0]["group_type"] == "classic"
        assert a.member_epoch == 1

    run(main())


async def classic_members(coordinator: GroupCoordinator, names: list[str]) -> dict[str, Any]:
    """Classic members of group "g" (eager, subscribed to "t"), joined and synced: the
    first joiner leads and gives each member the partitions range would."""
    subscription = encode_subscription(["t"])

    def join_as(name: str, member_id: str = "") -> Any:
        return coordinator.join_group("g", member_id, name, 10_000, 10_000, "consumer", [("range", subscription)])

    first = await join_as(names[0])  # a generation of its own, then everyone joins the next
    newcomers = [asyncio.ensure_future(join_as(n)) for n in names[1:]]
    await asyncio.sleep(0.01)
    joins = [await join_as(names[0], first.member_id)] + list(await asyncio.gather(*newcomers))
    leader = next(j for j in joins if j.leader_id == j.member_id)
    ids = sorted(j.member_id for j in joins)
    plan = {m: encode_assignment({"t": [p for p in range(4) if p % len(ids) == i]}) for i, m in enumerate(ids)}
    await asyncio.gather(*(coordinator.sync_group("g", j.generation, j.member_id, plan if j is leader else None)
                           for j in joins))  # fmt: skip
    return {j.member_id: j for j in joins}


def test_a_consumer_protocol_member_upgrades_a_classic_group_whose_members_rejoin_as_classic_members():
    """Kafka 4's online upgrade: a ConsumerGroupHeartbeat to a Stable classic group makes it
    a consumer group whose classic members keep their partitions and generation until they
    rejoin (told by their heartbeat); they then get the coordinator's assignment through
    JoinGroup and SyncGroup; when the last consumer-protocol member leaves, it is a classic
    group again, which its members rejoin."""
    async def main() -> None:
        partition = Partition()
        coordinator = partition.coordinator()
        coordinator._lookup_partition_counts = lambda: asyncio.sleep(0, COUNTS)
        joined = await classic_members(coordinator, ["c1", "c2"])
        generation = next(iter(joined.values())).generation
        new = await coordinator.consumer_heartbeat("g", join("new"), COUNTS)
        assert (group_key("g"), None) in partition.records, "the classic group's record is tombstoned"
        assert new.assignment == frozenset(), "everything is still the classic members'"
        described = await coordinator.describe_consumer_group("g")
        assert described["group_epoch"] == generation + 1 and len(described["members"]) == 3

        answers = {}
        for member_id, j in joined.items():
            with pytest.raises(RebalanceInProgressError):
                await coordinator.heartbeat("g", j.generation, member_id)
            again = await coordinator.join_group("g", member_id, "c", 10_000, 10_000, "consumer",
                                                 [("range", encode_subscription(["t"]))])  # eager: it owns nothing now
            assert again.leader_id == "" and again.members == [] and again.generation == generation + 1
            answers[member_id] = decode_assignment(await coordinator.sync_group("g", again.generation, member_id, None))
            await coordinator.commit_offsets("g", again.generation, member_id, {("t", 0): (1, "")})
            with pytest.raises(IllegalGenerationError):
                await coordinator.commit_offsets("g", generation, member_id, {("t", 0): (1, "")})
        new = await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("new", new.member_epoch, owned=()), COUNTS)
        owned = [{(t, p) for t, ps in a.partitions.items() for p in ps} for a in answers.values()] + [set(new.assignment)]
        assert sorted(map(len, owned)) == [1, 1, 2] and set().union(*owned) == {("t", p) for p in range(4)}

        replayed = await partition.coordinator().describe_consumer_group("g")
        assert replayed == await coordinator.describe_consumer_group("g"), "a mixed group replays with its classic members"

        await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("new", -1), COUNTS)
        assert (consumer_group_key("g"), None) in partition.records
        assert (await coordinator.list_groups())[0]["group_type"] == "classic", "downgraded"
        rejoins = await asyncio.gather(*(coordinator.join_group("g", m, "c", 10_000, 10_000, "consumer",
                                                                [("range", encode_subscription(["t"]))]) for m in joined))  # fmt: skip
        assert {r.member_id for r in rejoins} == set(joined) and rejoins[0].generation > generation + 1

    run(main())


def test_an_upgrade_is_written_after_the_classic_groups_last_record_even_when_it_comes_before_that_write_ran():
    """A classic group's record is written in the background when it turns Stable; a
    heartbeat upgrading it in the same turn of the event loop came before that write, so a
    replay of the log made the group classic again."""
    async def main() -> None:
        partition = Partition()
        coordinator = partition.coordinator()
        joined = await coordinator.join_group("g", "", "c", 10_000, 10_000, "consumer", [("range", encode_subscription(["t"]))])
        plan = {joined.member_id: encode_assignment({"t": [0, 1, 2, 3]})}
        await coordinator.sync_group("g", joined.generation, joined.member_id, plan)  # Stable: its record is on its way
        await coordinator.consumer_heartbeat("g", join("new"), COUNTS)  # (no turn of the loop in between)
        await asyncio.sleep(0.01)
        assert partition.records[-1][0] == consumer_group_key("g")
        replayed = await partition.coordinator().list_groups()
        assert [g["group_type"] for g in replayed] == ["consumer"]

    run(main())


def test_a_member_past_group_consumer_max_size_is_refused_and_a_static_member_may_take_its_place_back():
    async def main() -> None:
        async def counts() -> dict[str, int]:
            return COUNTS

        coordinator = GroupCoordinator(Partition().append, BrokerConfig(group_consumer_max_size=2,
                                                                        group_consumer_session_timeout_ms=SESSION_MS),
                                       partition_counts=counts)  # fmt: skip
        await coordinator.consumer_heartbeat("g", join("a", instance_id="static-a"), COUNTS)
        b = await coordinator.consumer_heartbeat("g", join("b"), COUNTS)
        with pytest.raises(GroupMaxSizeReachedError):
            await coordinator.consumer_heartbeat("g", join("c"), COUNTS)
        with pytest.raises(GroupMaxSizeReachedError):  # a classic member joining the consumer group too
            await coordinator.join_group("g", "", "classic", 10_000, 10_000, "consumer",
                                         [("range", encode_subscription(["t"]))])  # fmt: skip
        # A static member coming back under a new member id takes its instance's place.
        await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("a", -2, instance_id="static-a"), COUNTS)
        await coordinator.consumer_heartbeat("g", join("a2", instance_id="static-a"), COUNTS)
        await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("b", -1), COUNTS)  # b leaves: room for c
        await coordinator.consumer_heartbeat("g", join("c"), COUNTS)
        assert sorted(m["member_id"] for m in (await coordinator.describe_consumer_group("g"))["members"]) == ["a2", "c"]
        assert b.member_epoch > 0

    run(main())
