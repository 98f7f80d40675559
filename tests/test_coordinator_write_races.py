"""Races between a coordinator's writes and what happens while they wait for their acks,
without Ray: each test holds an append in the log (written, not yet acknowledged), runs
the other path to its end meanwhile, then lets the acks come, and checks that the
coordinator's memory agrees with a coordinator replaying the same log.

- A transaction's marker applied while its TxnOffsetCommit waits for its acks ends those
  offsets (an ABORT drops them, a COMMIT commits them); they never stay pending after it.
- Deleting a share group waits for a share-partition state write under way, so the state
  is tombstoned with the group and a group made again under the id starts with none.
- A coordinator closed because its replica loaded a successor (a new leader epoch) writes
  nothing more: its late requests are NOT_COORDINATOR.
- A classic request (LeaveGroup, a static member's JoinGroup) arriving while a
  consumer-protocol heartbeat's upgrade of its classic group awaits its acks waits for the
  upgrade, then is answered by the consumer group: it changed a classic group already on
  its way out, whose record then landed after the upgrade's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rayk.config import BrokerConfig
from rayk.consumer_protocol import encode_assignment, encode_subscription
from rayk.coordinator.coordinator_log import LogEntry, TxnMarker, TxnRecords
from rayk.coordinator.group.consumer_protocol_group import ConsumerHeartbeat
from rayk.coordinator.group.group_coordinator import GroupCoordinator
from rayk.coordinator.group.offsets_replica import OffsetsPartitionReplica
from rayk.errors import NotCoordinatorError
from rayk.internal_topics import OFFSETS_TOPIC

PID, PRODUCER_EPOCH = 40, 0
TP = ("t", 0)
COUNTS = {"t": 4}
CONFIG = BrokerConfig(group_initial_rebalance_delay_ms=0)  # a classic group's first generation settles at once


class HeldPartition:
    """A `__consumer_offsets` partition whose appends are in the log at once (as a leader's
    are) and acknowledged at once, or, after `hold()`, only once `release()` is called."""

    def __init__(self) -> None:
        self.entries: list[LogEntry] = []
        self.appended = asyncio.Event()  # set at each append
        self._acks: asyncio.Event | None = None

    def hold(self) -> None:
        self._acks = asyncio.Event()

    def release(self) -> None:
        assert self._acks is not None
        self._acks.set()

    async def append(self, records: list[tuple[bytes, bytes | None]]) -> int:
        log_offset = len(self.entries)
        self.entries += [(log_offset + i, key, value) for i, (key, value) in enumerate(records)]
        await self._acknowledged()
        return log_offset

    async def append_transactional(self, records: list[tuple[bytes, bytes | None]], transactional_id: str,
                                   producer_id: int, producer_epoch: int) -> int:  # fmt: skip
        log_offset = len(self.entries)  # (a batch is one entry here: its records share the offset)
        self.entries.append(TxnRecords(producer_id, [(log_offset, key, value) for key, value in records]))
        await self._acknowledged()
        return log_offset

    def marker(self, coordinator: GroupCoordinator, commit: bool) -> None:
        """The producer's marker written and acknowledged (what write_txn_marker does)."""
        self.entries.append(TxnMarker(PID, commit))
        coordinator.complete_txn(PID, commit)

    async def _acknowledged(self) -> None:
        self.appended.set()
        if self._acks is not None:
            await self._acks.wait()

    def coordinator(self) -> GroupCoordinator:
        """A coordinator that replays the partition as it is now."""
        async def partition_counts() -> dict[str, int]:
            return COUNTS

        coordinator = GroupCoordinator(self.append, CONFIG, self.append_transactional, partition_counts)
        coordinator.load(list(self.entries))
        return coordinator


# ---------------------------------------------------------------------------- a marker during TxnOffsetCommit


@pytest.mark.parametrize("commit", [False, True], ids=["abort", "commit"])
def test_a_marker_applied_while_the_txn_offset_commit_awaits_its_acks_ends_those_offsets(commit):
    async def main() -> None:
        partition = HeldPartition()
        coordinator = partition.coordinator()
        await coordinator.commit_offsets("g", -1, "", {TP: (1, "")})
        partition.hold()
        write = asyncio.ensure_future(coordinator.txn_commit_offsets("g", "tx", PID, PRODUCER_EPOCH, -1, "",
                                                                     {TP: (5, "")}))  # fmt: skip
        partition.appended.clear()
        await partition.appended.wait()  # in the log, its acks awaited
        partition.marker(coordinator, commit)  # (a timeout's abort, a new instance's InitProducerId) acked first
        partition.release()
        await write
        expected = 5 if commit else 1
        for seen in (coordinator, partition.coordinator()):
            assert seen.pending_partitions("g") == set(), "no marker is coming for them any more"
            assert (await seen.fetch_offsets("g", [TP], require_stable=True))[TP].offset == expected

        await coordinator.txn_commit_offsets("g", "tx", PID, PRODUCER_EPOCH, -1, "", {TP: (9, "")})
        assert coordinator.pending_partitions("g") == {TP}, "the producer's next transaction waits for its own marker"
        partition.marker(coordinator, True)
        for seen in (coordinator, partition.coordinator()):
            assert (await seen.fetch_offsets("g", [TP], require_stable=True))[TP].offset == 9

    asyncio.run(main())


# ---------------------------------------------------------------------------- commits whose acks come out of order


class EachHeld(HeldPartition):
    """A partition whose appends' acks are held each apart, to be released in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.acks: list[asyncio.Event] = []

    async def _acknowledged(self) -> None:
        acks = asyncio.Event()
        self.acks.append(acks)
        self.appended.set()
        await acks.wait()


@pytest.mark.parametrize("commit", [False, True], ids=["abort", "commit"])
@pytest.mark.parametrize("first", ["transactional", "plain", "plain twice"])
def test_commits_of_one_partition_whose_acks_resume_them_out_of_log_order_leave_memory_as_the_log_says(first, commit):
    """Two commits of one partition in the log, a TxnOffsetCommit's and a plain one's (or two
    plain ones), whose acks resume them in the reverse order: the coordinator's memory is
    what a replay of the log gives, before the producer's marker and after it (Kafka
    decides by the records' offsets, `olderThan`)."""

    async def main() -> None:
        partition = EachHeld()
        coordinator = partition.coordinator()

        async def write(kind: str, offset: int) -> asyncio.Future:
            if kind == "transactional":
                call = coordinator.txn_commit_offsets("g", "tx", PID, PRODUCER_EPOCH, -1, "", {TP: (offset, "")})
            else:
                call = coordinator.commit_offsets("g", -1, "", {TP: (offset, "")})
            written = asyncio.ensure_future(call)
            partition.appended.clear()
            await partition.appended.wait()  # in the log, its acks held
            return written

        kinds = {"transactional": ("transactional", "plain"), "plain": ("plain", "transactional"),
                 "plain twice": ("plain", "plain")}[first]
        writes = [await write(kinds[0], 5), await write(kinds[1], 9)]
        for acks, written in zip(reversed(partition.acks), reversed(writes)):  # the later write resumed first
            acks.set()
            await written
        replayed = partition.coordinator()
        assert coordinator.pending_partitions("g") == replayed.pending_partitions("g")
        partition.marker(coordinator, commit)
        for seen in (coordinator, partition.coordinator()):
            assert seen.pending_partitions("g") == set()
            expected = 5 if kinds[1] == "transactional" and not commit else 9
            assert (await seen.fetch_offsets("g", [TP], require_stable=True))[TP].offset == expected

    asyncio.run(main())


# ---------------------------------------------------------------------------- share group deletion


def test_deleting_a_share_group_waits_for_a_state_write_under_way_and_tombstones_that_state():
    async def main() -> None:
        partition = HeldPartition()
        coordinator = partition.coordinator()
        await coordinator.alter_share_group_configs("g", {})  # a share group without members
        _, state_epoch, _ = await coordinator.read_share_state("g", *TP, 0)
        partition.hold()
        partition.appended.clear()
        write = asyncio.ensure_future(coordinator.write_share_state("g", *TP, 0, state_epoch, 3, [], create=True))
        await partition.appended.wait()  # the leader's first state is in the log, its acks awaited
        delete = asyncio.ensure_future(coordinator.delete_group("g"))
        for _ in range(5):
            await asyncio.sleep(0)
        partition.release()
        await write  # it was ahead of the deletion: written, then tombstoned with the group
        await delete
        for seen in (coordinator, partition.coordinator()):
            await seen.alter_share_group_configs("g", {})  # the id made a share group again
            state, _, _ = await seen.read_share_state("g", *TP, 0)
            assert state is None, "the deleted group's state is gone from the log too"

    asyncio.run(main())


# ---------------------------------------------------------------------------- a coordinator closed by a reload


def test_a_coordinator_closed_by_its_successors_load_cannot_write_in_the_new_epoch(tmp_path: Path):
    async def main() -> None:
        replica = OffsetsPartitionReplica(OFFSETS_TOPIC, 0, 0, tmp_path / f"{OFFSETS_TOPIC}-0")
        await replica.become_leader(1, [0], [0])
        await replica.commit_offsets("g", -1, "", {TP: (5, "")})
        closed = replica._coordinator
        lock = closed._lock("g")
        await lock.acquire()  # (a heartbeat of the group writing)
        late = asyncio.ensure_future(replica.delete_offsets("g", [TP]))  # queued on the group's lock
        await asyncio.sleep(0)
        await replica.become_leader(2, [0], [0])  # a new epoch: the successor is loaded, the closed one
        end_offset = (await replica.describe())["log_end_offset"]
        lock.release()  # ... runs its queued request
        with pytest.raises(NotCoordinatorError):
            await late
        assert (await replica.describe())["log_end_offset"] == end_offset, "it appended nothing"
        assert (await replica.fetch_offsets("g"))[TP].offset == 5
        await replica.close()

    asyncio.run(main())


# ---------------------------------------------------------------------------- a classic request during an upgrade


async def stable_classic_group(coordinator: GroupCoordinator, instance_id: str | None = None) -> tuple[str, int]:
    """Group "g": one classic member (of the consumer protocol, owning all of "t"), Stable,
    its record written; returns its member id and generation."""
    joined = await coordinator.join_group("g", "", "c", 10_000, 10_000, "consumer",
                                          [("range", encode_subscription(["t"]))], instance_id)  # fmt: skip
    plan = {joined.member_id: encode_assignment({"t": [0, 1, 2, 3]})}
    await coordinator.sync_group("g", joined.generation, joined.member_id, plan, instance_id)
    await coordinator.classic_groups.background_writes_landed()
    return joined.member_id, joined.generation


async def upgrade_held(partition: HeldPartition, coordinator: GroupCoordinator) -> asyncio.Future:
    """A consumer-protocol member's first heartbeat upgrading group "g", its records in the
    log and their acks held."""
    partition.hold()
    partition.appended.clear()
    upgrade = asyncio.ensure_future(coordinator.consumer_heartbeat("g", ConsumerHeartbeat("new", 0, subscribed_topics=("t",)),
                                                                   COUNTS))  # fmt: skip
    await partition.appended.wait()
    return upgrade


def members(coordinator: GroupCoordinator) -> tuple[str, list[tuple[str, str | None]]]:
    """Group "g"'s kind and its members (id, instance id), as the coordinator holds them."""
    group = coordinator.consumer_groups.groups.get("g")
    if group is not None:
        return "consumer", sorted((m.member_id, m.instance_id) for m in group.members.values())
    classic = coordinator.classic_groups.groups.get("g")
    return "classic", sorted((m.member_id, m.group_instance_id) for m in (classic.members if classic else {}).values())


def test_a_classic_leave_during_an_upgrades_write_waits_and_leaves_the_consumer_group():
    async def main() -> None:
        partition = HeldPartition()
        coordinator = partition.coordinator()
        classic_id, _ = await stable_classic_group(coordinator)
        upgrade = await upgrade_held(partition, coordinator)
        leave = asyncio.ensure_future(coordinator.leave_group("g", classic_id))
        for _ in range(5):
            await asyncio.sleep(0)  # (the classic group's own record, had it been written, would be in the log now)
        partition.release()
        await upgrade
        await leave
        await coordinator.classic_groups.background_writes_landed()
        assert members(coordinator) == ("consumer", [("new", None)]), "the member that left holds nothing"
        assert members(partition.coordinator()) == members(coordinator), "the log replays what memory holds"

    asyncio.run(main())


def test_a_static_classic_member_rejoining_during_an_upgrades_write_takes_its_place_in_the_consumer_group():
    async def main() -> None:
        partition = HeldPartition()
        coordinator = partition.coordinator()
        old_id, _ = await stable_classic_group(coordinator, "i")
        upgrade = await upgrade_held(partition, coordinator)
        rejoin = asyncio.ensure_future(coordinator.join_group("g", "", "c", 10_000, 10_000, "consumer",
                                                              [("range", encode_subscription(["t"]))], "i"))  # fmt: skip
        for _ in range(5):
            await asyncio.sleep(0)
        partition.release()
        await upgrade
        joined = await rejoin
        await coordinator.classic_groups.background_writes_landed()
        assert joined.member_id != old_id
        assert members(coordinator) == ("consumer", sorted([("new", None), (joined.member_id, "i")]))
        assert members(partition.coordinator()) == members(coordinator), "the log replays what memory holds"
        # Its instance id is its own member id's, not FENCED_INSTANCE_ID (fatal for the client).
        await coordinator.heartbeat("g", joined.generation, joined.member_id, "i")

    asyncio.run(main())


def test_a_classic_request_waiting_for_a_write_of_a_coordinator_closed_meanwhile_is_not_coordinator():
    """A classic JoinGroup waited for the upgrade's write while the replica loaded a
    successor and closed this coordinator: it must not start a rebalance in the closed,
    dead group (answered only after the rebalance timeout), but send the client to find
    the coordinator again."""
    async def main() -> None:
        partition = HeldPartition()
        coordinator = partition.coordinator()
        await stable_classic_group(coordinator, "i")
        upgrade = await upgrade_held(partition, coordinator)
        rejoin = asyncio.ensure_future(coordinator.join_group("g", "", "c", 10_000, 10_000, "consumer",
                                                              [("range", encode_subscription(["t"]))], "i"))  # fmt: skip
        for _ in range(5):
            await asyncio.sleep(0)
        coordinator.close()  # its replica loads a successor
        partition.release()
        with pytest.raises(NotCoordinatorError):
            await asyncio.wait_for(rejoin, 5)
        await asyncio.gather(upgrade, return_exceptions=True)

    asyncio.run(main())
