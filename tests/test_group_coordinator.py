"""GroupCoordinator without a cluster: committed offsets expire as KIP-211 says (a group
without members loses them all offsets.retention.minutes after it became empty, a
standalone consumer's each that long after its commit, a group with members none), and
DeleteGroups deletes an empty group with its offsets; both are written as tombstones, so
a new coordinator replaying the partition sees what this one does."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import msgpack
import pytest

from rayk.actors.group_coordinator import GroupCoordinator, group_key, offset_key
from rayk.config import BrokerConfig
from rayk.errors import GroupIdNotFoundError, NonEmptyGroupError

RETENTION_MINUTES = 10
RETENTION_MS = RETENTION_MINUTES * 60_000
PROTOCOLS = [("range", b"")]


class Partition:
    """The __consumer_offsets partition a coordinator writes to: its records, in order."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None]] = []

    async def append(self, records: list[tuple[bytes, bytes | None]]) -> None:
        self.records += records

    def replayed(self) -> GroupCoordinator:
        coordinator = GroupCoordinator(self.append, config())
        coordinator.load(self.records)
        return coordinator


def config() -> BrokerConfig:
    return BrokerConfig(offsets_retention_minutes=RETENTION_MINUTES, group_initial_rebalance_delay_ms=0)


def now_ms() -> int:
    return int(time.time() * 1000)


async def commit_standalone(coordinator: GroupCoordinator, group_id: str, offset: int = 5) -> None:
    await coordinator.commit_offsets(group_id, -1, "", {("t", 0): (offset, ""), ("t", 1): (offset, "")})


async def join_and_leave(coordinator: GroupCoordinator, group_id: str) -> None:
    """A member joins (a generation settles), commits, and leaves: the group is empty."""
    joined = await coordinator.join_group(group_id, "", "c", 10_000, 10_000, "consumer", PROTOCOLS)
    await coordinator.sync_group(group_id, joined.generation, joined.member_id, {joined.member_id: b""})
    await coordinator.commit_offsets(group_id, joined.generation, joined.member_id, {("t", 0): (7, "")})
    await coordinator.leave_group(group_id, joined.member_id)
    await asyncio.sleep(0)  # the rebalance with no members completes


def test_offsets_expire_by_kip_211s_rules_as_tombstones_a_replay_agrees_with():
    async def main() -> None:
        partition = Partition()
        coordinator = GroupCoordinator(partition.append, config())
        await commit_standalone(coordinator, "standalone")
        await join_and_leave(coordinator, "emptied")
        joined = await coordinator.join_group("active", "", "c", 10_000, 10_000, "consumer", PROTOCOLS)
        await coordinator.sync_group("active", joined.generation, joined.member_id, {joined.member_id: b""})
        await coordinator.commit_offsets("active", joined.generation, joined.member_id, {("t", 0): (3, "")})
        assert coordinator._groups["emptied"].empty_since_ms is not None

        assert await coordinator.expire_offsets(now_ms() + RETENTION_MS - 60_000) == 0, "not yet"
        assert await coordinator.expire_offsets(now_ms() + RETENTION_MS + 1_000) == 3, "standalone 2, emptied 1"
        assert coordinator.committed_offsets() == {"active": {("t", 0): 3}}, "a group with members keeps its offsets"
        assert {g["group_id"] for g in await coordinator.list_groups()} == {"active"}
        tombstones = {key for key, value in partition.records if value is None}
        assert {offset_key("standalone", "t", 0), offset_key("standalone", "t", 1), offset_key("emptied", "t", 0),
                group_key("emptied")} == tombstones
        replay = partition.replayed()
        assert replay.committed_offsets() == {"active": {("t", 0): 3}}
        coordinator.close()

    asyncio.run(main())


def test_an_emptied_groups_offsets_count_from_when_it_became_empty_not_from_their_commit():
    async def main() -> None:
        partition = Partition()
        coordinator = GroupCoordinator(partition.append, config())
        await join_and_leave(coordinator, "g")
        # Committed long ago (a partition without traffic), but the group only just emptied.
        committed = coordinator._offsets["g"][("t", 0)]
        coordinator._offsets["g"][("t", 0)] = dataclasses.replace(
            committed, commit_timestamp_ms=committed.commit_timestamp_ms - 10 * RETENTION_MS)
        assert await coordinator.expire_offsets(now_ms() + 60_000) == 0
        group_record = msgpack.unpackb(next(v for k, v in reversed(partition.records) if k == group_key("g")))
        assert group_record["members"] == [] and group_record["empty_since_ms"] is not None, "a new coordinator knows"
        assert partition.replayed()._groups["g"].empty_since_ms == group_record["empty_since_ms"]
        coordinator.close()

    asyncio.run(main())


def test_delete_group_refuses_a_group_with_members_or_none_and_deletes_an_empty_one():
    async def main() -> None:
        partition = Partition()
        coordinator = GroupCoordinator(partition.append, config())
        with pytest.raises(GroupIdNotFoundError):
            await coordinator.delete_group("nobody")
        joined = await coordinator.join_group("busy", "", "c", 10_000, 10_000, "consumer", PROTOCOLS)
        with pytest.raises(NonEmptyGroupError):
            await coordinator.delete_group("busy")
        await coordinator.leave_group("busy", joined.member_id)
        await asyncio.sleep(0)
        await coordinator.delete_group("busy")
        await commit_standalone(coordinator, "standalone")
        await coordinator.delete_group("standalone")
        assert coordinator.committed_offsets() == {} and await coordinator.list_groups() == []
        with pytest.raises(GroupIdNotFoundError):
            await coordinator.delete_group("standalone")
        replay = partition.replayed()
        assert replay.committed_offsets() == {} and await replay.list_groups() == []
        coordinator.close()

    asyncio.run(main())
