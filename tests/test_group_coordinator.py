"""GroupCoordinator without a cluster: committed offsets expire as KIP-211 says (a group
without members loses them all offsets.retention.minutes after it became empty, a
standalone consumer's each that long after its commit, a group with members none), and
DeleteGroups deletes an empty group with its offsets; both are written as tombstones, so
a new coordinator replaying the partition sees what this one does, also when a commit
races them; a new coordinator takes a settled generation's members over (heartbeats and
commits go on, a static member's instance id still fences, a silent member times out); requests for unknown groups make none; a record the coordinator did not
write is skipped by the load, which goes on."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import msgpack
import pytest

from rayk.coordinator.group.group_coordinator import GroupCoordinator
from rayk.coordinator.group.classic_group_records import group_key
from rayk.coordinator.group.group_records import RECORDS_PER_APPEND, decode_record
from rayk.coordinator.group.offset_records import CommittedOffset, offset_key, offset_value
from rayk.coordinator.group.record_schema import MalformedGroupRecordError
from rayk.config import BrokerConfig
from rayk.errors import (
    FencedInstanceIdError,
    GroupIdNotFoundError,
    IllegalGenerationError,
    NonEmptyGroupError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)

RETENTION_MINUTES = 10
RETENTION_MS = RETENTION_MINUTES * 60_000
PROTOCOLS = [("range", b"")]


class Partition:
    """The __consumer_offsets partition a coordinator writes to: its records, in order."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None]] = []

    async def append(self, records: list[tuple[bytes, bytes | None]]) -> int:
        self.records += records
        return len(self.records) - len(records)

    def replayed(self, source: str = "__consumer_offsets-0") -> GroupCoordinator:
        coordinator = GroupCoordinator(self.append, config())
        coordinator.load([(offset, key, value) for offset, (key, value) in enumerate(self.records)], source)
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
        assert coordinator.classic_groups.groups["emptied"].empty_since_ms is not None

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
        committed = coordinator.offsets.committed["g"][("t", 0)]
        coordinator.offsets.committed["g"][("t", 0)] = dataclasses.replace(
            committed, commit_timestamp_ms=committed.commit_timestamp_ms - 10 * RETENTION_MS)
        assert await coordinator.expire_offsets(now_ms() + 60_000) == 0
        group_record = msgpack.unpackb(next(v for k, v in reversed(partition.records) if k == group_key("g")))
        assert group_record["members"] == [] and group_record["empty_since_ms"] is not None, "a new coordinator knows"
        assert partition.replayed().classic_groups.groups["g"].empty_since_ms == group_record["empty_since_ms"]
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


class SlowPartition(Partition):
    """Appends that take a while, as acks=all ones do: other requests run meanwhile."""

    async def append(self, records: list[tuple[bytes, bytes | None]]) -> int:
        self.records += records  # in the log at once, acknowledged later (as a leader's produce)
        log_offset = len(self.records) - len(records)
        await asyncio.sleep(0.02)
        return log_offset


@pytest.mark.parametrize("removal", ["expire", "delete"])
def test_a_commit_racing_expiry_or_deletion_leaves_memory_and_the_log_agreeing(removal):
    async def main() -> None:
        partition = SlowPartition()
        coordinator = GroupCoordinator(partition.append, config())
        await commit_standalone(coordinator, "g", offset=5)
        if removal == "expire":
            removing = asyncio.ensure_future(coordinator.expire_offsets(now_ms() + RETENTION_MS + 1_000))
        else:
            removing = asyncio.ensure_future(coordinator.delete_group("g"))
        await asyncio.sleep(0.005)  # the tombstones are being written
        await coordinator.commit_offsets("g", -1, "", {("t", 0): (99, "")})
        await removing
        assert coordinator.committed_offsets() == partition.replayed().committed_offsets() == {"g": {("t", 0): 99}}
        coordinator.close()

    asyncio.run(main())


def test_requests_for_unknown_groups_make_no_group():
    async def main() -> None:
        coordinator = GroupCoordinator(Partition().append, config())
        for call in (coordinator.heartbeat("ghost-1", 1, "m"), coordinator.sync_group("ghost-2", 1, "m", None),
                     coordinator.leave_group("ghost-3", "m")):
            with pytest.raises(UnknownMemberIdError):
                await call
        with pytest.raises(IllegalGenerationError):
            await coordinator.commit_offsets("ghost-4", 3, "m", {("t", 0): (1, "")})
        assert await coordinator.list_groups() == []
        coordinator.close()

    asyncio.run(main())


def test_many_expired_offsets_are_written_in_batches_and_memberless_groups_without_offsets_go():
    async def main() -> None:
        partition = Partition()
        appends: list[int] = []
        original = partition.append

        async def counting(records):
            appends.append(len(records))
            return await original(records)

        coordinator = GroupCoordinator(counting, config())
        await coordinator.commit_offsets("wide", -1, "", {("t", p): (1, "") for p in range(2_500)})
        joined = await coordinator.join_group("left", "", "c", 10_000, 10_000, "consumer", PROTOCOLS)
        await coordinator.sync_group("left", joined.generation, joined.member_id, {joined.member_id: b""})
        await coordinator.leave_group("left", joined.member_id)  # no commits
        await asyncio.sleep(0)
        appends.clear()
        assert await coordinator.expire_offsets(now_ms() + RETENTION_MS + 1_000) == 2_500
        assert max(appends) <= RECORDS_PER_APPEND and sum(appends) == 2_500 + 1, "offsets, and left's record"
        assert await coordinator.list_groups() == [] and await partition.replayed().list_groups() == []
        coordinator.close()

    asyncio.run(main())


def test_a_group_loaded_from_a_record_with_members_has_its_empty_time_written_down():
    async def main() -> None:
        partition = Partition()
        partition.records.append((group_key("g"), msgpack.packb(
            {"generation": 4, "protocol_type": "consumer", "protocol": "range", "leader": "m", "members": ["m"]})))
        partition.records.append((offset_key("g", "t", 0), msgpack.packb(
            {"offset": 1, "metadata": "", "commit_timestamp_ms": 0, "leader_epoch": -1})))
        first = partition.replayed()
        first.start()
        await asyncio.sleep(0)  # the record is written
        stamped = first.classic_groups.groups["g"].empty_since_ms
        first.close()
        again = partition.replayed()
        assert again.classic_groups.groups["g"].empty_since_ms == stamped, "the next coordinator counts from the same time"
        assert await first.expire_offsets(stamped + RETENTION_MS - 1) == 0
        assert await first.expire_offsets(stamped + RETENTION_MS) == 1

    asyncio.run(main())


def test_commits_to_one_group_run_at_once_and_expiry_leaves_one_in_flight_alone():
    async def main() -> None:
        partition = SlowPartition()
        coordinator = GroupCoordinator(partition.append, config())
        await commit_standalone(coordinator, "g", offset=5)  # both partitions, long expired below
        first = asyncio.ensure_future(coordinator.commit_offsets("g", -1, "", {("t", 0): (6, "")}))
        second = asyncio.ensure_future(coordinator.commit_offsets("g", -1, "", {("t", 2): (1, "")}))
        await asyncio.sleep(0.005)
        assert len(partition.records) == 4, "the second commit did not wait for the first's acknowledgement"
        expired = await coordinator.expire_offsets(now_ms() + RETENTION_MS + 1_000)
        await asyncio.gather(first, second)
        assert expired == 1, "t-1 only: t-0 had a commit in flight"
        assert coordinator.committed_offsets() == partition.replayed().committed_offsets() == {
            "g": {("t", 0): 6, ("t", 2): 1}}
        coordinator.close()

    asyncio.run(main())


BAD_RECORDS = {  # what a client's produce (before internal topics were refused) or corruption left
    "a key that is not msgpack": (b"\xc1forged", b"anything"),
    "a key with bytes after its msgpack": (offset_key("victim", "t", 0) + b"x", offset_value(CommittedOffset(9))),
    "a key that is msgpack but not a list": (msgpack.packb({"offset": 1}), b""),
    "a key of no kind the coordinator writes": (msgpack.packb(["lease", "victim"]), b""),
    "an offset key of the wrong shape": (msgpack.packb(["offset", "victim", "t"]), offset_value(CommittedOffset(9))),
    "an offset value that is not msgpack": (offset_key("victim", "t", 0), b"\xc1"),
    "an offset value with a field of the wrong type": (offset_key("victim", "t", 1), msgpack.packb({"offset": "9"})),
    "an offset value with a field of its own": (offset_key("victim", "t", 2), msgpack.packb({"offset": 9, "x": 1})),
    "a group value without a generation": (group_key("victim"), msgpack.packb({"members": []})),
    "a group value that is not UTF-8": (group_key("emptied"), b"\xa2\xff\xfe"),
}


def test_records_the_coordinator_did_not_write_are_skipped_with_an_error_each_and_the_rest_served(caplog):
    async def main() -> None:
        partition = Partition()
        writer = GroupCoordinator(partition.append, config())
        await commit_standalone(writer, "before", offset=3)
        await join_and_leave(writer, "emptied")
        writer.close()
        generation = writer.classic_groups.groups["emptied"].generation
        first_bad = len(partition.records)
        partition.records += BAD_RECORDS.values()
        partition.records.append((offset_key("after", "t", 0), offset_value(CommittedOffset(4))))

        with caplog.at_level(logging.ERROR, logger="rayk.coordinator.group.group_coordinator"):
            coordinator = partition.replayed("__consumer_offsets-7")
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == len(BAD_RECORDS), errors
        for offset, (what, message) in enumerate(zip(BAD_RECORDS, errors), first_bad):
            assert message.startswith(f"__consumer_offsets-7 offset {offset}: skipped"), (what, message)

        coordinator.start()
        assert coordinator.committed_offsets() == {"before": {("t", 0): 3, ("t", 1): 3}, "emptied": {("t", 0): 7},
                                                   "after": {("t", 0): 4}}
        assert {g["group_id"] for g in await coordinator.list_groups()} == {"before", "emptied", "after"}
        joined = await coordinator.join_group("emptied", "", "c", 10_000, 10_000, "consumer", PROTOCOLS)
        assert joined.generation == generation + 1, "the group's record before the bad ones still counts"
        await commit_standalone(coordinator, "victim", offset=1)
        assert (await coordinator.fetch_offsets("victim"))[("t", 0)].offset == 1
        coordinator.close()

    asyncio.run(main())


def test_a_committed_leader_epoch_survives_a_replay_and_a_record_written_without_one_reads_as_minus_one():
    async def main() -> None:
        partition = Partition()
        coordinator = GroupCoordinator(partition.append, config())
        await coordinator.commit_offsets("g", -1, "", {("t", 0): (5, "m", 3), ("t", 1): (6, ""), ("t", 2): (7, "", -9)})
        older = {"offset": 8, "metadata": "", "commit_timestamp_ms": 0}  # written before leader epochs were kept
        partition.records.append((offset_key("g", "t", 3), msgpack.packb(older)))
        for loaded in (coordinator, partition.replayed()):
            found = await loaded.fetch_offsets("g")
            epochs = {tp: (c.offset, c.leader_epoch) for tp, c in found.items()}
            if loaded is coordinator:
                epochs.pop(("t", 3), None)
            assert epochs == {("t", 0): (5, 3), ("t", 1): (6, -1), ("t", 2): (7, -1),
                              **({("t", 3): (8, -1)} if loaded is not coordinator else {})}

    asyncio.run(main())


def test_delete_offsets_tombstones_unsubscribed_partitions_and_refuses_subscribed_ones_as_kafka():
    from rayk.consumer_protocol import encode_subscription
    from rayk.errors import GroupSubscribedToTopicError

    async def main() -> None:
        partition = Partition()
        coordinator = GroupCoordinator(partition.append, config())
        await commit_standalone(coordinator, "standalone")
        assert await coordinator.delete_offsets("standalone", [("t", 0), ("never", 0)]) == {("t", 0): None, ("never", 0): None}
        with pytest.raises(GroupIdNotFoundError):
            await coordinator.delete_offsets("nobody", [("t", 0)])

        joined = await coordinator.join_group("members", "", "c", 10_000, 10_000, "consumer",
                                              [("range", encode_subscription(["t"]))])
        await coordinator.sync_group("members", joined.generation, joined.member_id, {joined.member_id: b""})
        await coordinator.commit_offsets("members", joined.generation, joined.member_id, {("t", 0): (3, ""), ("u", 0): (4, "")})
        results = await coordinator.delete_offsets("members", [("t", 0), ("u", 0)])
        assert isinstance(results[("t", 0)], GroupSubscribedToTopicError) and results[("u", 0)] is None

        other = await coordinator.join_group("connect", "", "c", 10_000, 10_000, "connect", PROTOCOLS)
        await coordinator.sync_group("connect", other.generation, other.member_id, {other.member_id: b""})
        await coordinator.commit_offsets("connect", other.generation, other.member_id, {("u", 0): (4, "")})
        with pytest.raises(NonEmptyGroupError):
            await coordinator.delete_offsets("connect", [("u", 0)])

        for loaded in (coordinator, partition.replayed()):
            offsets = loaded.committed_offsets()
            assert offsets["standalone"] == {("t", 1): 5}
            assert offsets["members"] == {("t", 0): 3}
            assert offsets["connect"] == {("u", 0): 4}

    asyncio.run(main())


def test_a_new_coordinator_takes_a_settled_generations_members_over_and_they_go_on():
    """Kafka's GroupMetadataValue: the group's record holds its members and assignments, so
    after a coordinator move (a broker restart) the members heartbeat, sync and commit in
    their generation with no rebalance, which an at-least-once consumer would otherwise
    pay for by processing again what it had not committed yet. A static member's instance
    id still fences, and a member that does not reach the new coordinator within its
    session times out there, which starts a rebalance."""
    async def main() -> None:
        partition = Partition()
        settings = dataclasses.replace(config(), group_min_session_timeout_ms=10, group_initial_rebalance_delay_ms=50)
        first = GroupCoordinator(partition.append, settings)  # both join the first generation
        joins = await asyncio.gather(
            first.join_group("g", "", "steady", 10_000, 10_000, "consumer", PROTOCOLS),
            first.join_group("g", "", "static", 100, 10_000, "consumer", PROTOCOLS, group_instance_id="s-1"))
        steady, static = joins
        leader = next(j for j in joins if j.members)
        assignments = {steady.member_id: b"steady's", static.member_id: b"static's"}
        await asyncio.gather(*(first.sync_group("g", j.generation, j.member_id, assignments if j is leader else None)
                               for j in joins))
        await asyncio.sleep(0)  # the group's record is written
        # The static member's process restarts: it takes its old member id's place and
        # assignment, and the group's next record supersedes the first in the log.
        static = await first.join_group("g", "", "static", 100, 10_000, "consumer", PROTOCOLS, group_instance_id="s-1")
        assignments = {steady.member_id: b"steady's", static.member_id: b"static's"}
        await asyncio.sleep(0)
        assert sum(key == group_key("g") for key, _ in partition.records) == 2
        first.close()

        moved = partition.replayed()
        generation = steady.generation
        await moved.heartbeat("g", generation, steady.member_id)
        await moved.commit_offsets("g", generation, steady.member_id, {("t", 0): (5, "")})
        assert await moved.sync_group("g", generation, static.member_id, None, "s-1") == b"static's"
        described = await moved.describe_group("g")
        assert described["state"] == "Stable" and described["generation"] == generation
        assert {m["member_id"]: m["assignment"] for m in described["members"]} == assignments
        with pytest.raises(FencedInstanceIdError):
            await moved.heartbeat("g", generation, "an-older-process", "s-1")

        await asyncio.sleep(0.2)  # past the static member's 100 ms session, not the other's
        assert moved.classic_groups.groups["g"].expire() == [static.member_id]
        with pytest.raises(RebalanceInProgressError):
            await moved.heartbeat("g", generation, steady.member_id)
        moved.close()

    asyncio.run(main())


def test_a_group_record_with_a_malformed_member_state_is_refused_by_the_decoder():
    good = {"member_id": "m", "group_instance_id": None, "client_id": "c", "session_timeout_ms": 10,
            "rebalance_timeout_ms": 10, "protocols": [["range", b""]], "assignment": b""}
    value = {"generation": 1, "protocol_type": "consumer", "protocol": "range", "leader": "m", "members": ["m"]}
    assert decode_record(group_key("g"), msgpack.packb({**value, "member_states": [good]})).members[0].member_id == "m"
    for bad in ({**good, "assignment": "text"}, {**good, "protocols": [["range"]]}, {"member_id": "m"}, "m"):
        with pytest.raises(MalformedGroupRecordError):
            decode_record(group_key("g"), msgpack.packb({**value, "member_states": [bad]}))
