"""Share groups (KIP-932) without a cluster: the group coordinator's membership and the
share-partitions' durable state (share_coordinator.py), and a partition leader's
ShareFetch and ShareAcknowledge (share_fetch.py) over a real log, with the coordinator
as the place the state is written to. Several members of one partition receive different
records; what is not acknowledged comes back once its lock expires; a poison record is
archived at the delivery limit; acknowledgements survive a new leader and a new
coordinator; a deposed leader cannot write; a failed write never leaves the leader ahead
of the coordinator."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayk.coordinator.group.consumer_protocol_group import ConsumerHeartbeat
from rayk.coordinator.group.group_coordinator import GroupCoordinator
from rayk.coordinator.group.group_records import decode_record
from rayk.coordinator.share.share_records import (
    ShareGroupRecord,
    ShareMemberRecord,
    share_group_key,
    share_group_value,
    share_state_key,
    share_state_value,
)
from rayk.replication.share import share_fetch
from rayk.replication.share.share_fetch import SharePartitions, ShareSettings
from rayk.replication.share.share_partition import AcknowledgeType
from rayk.replication.share.share_state import ShareStateRecord
from rayk.config import BrokerConfig
from rayk.errors import (
    CoordinatorNotAvailableError,
    FencedLeaderEpochError,
    FencedMemberEpochError,
    FencedStateEpochError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    InvalidConfigurationError,
    InvalidRecordStateError,
    NonEmptyGroupError,
    NotLeaderOrFollowerError,
)
from rayk.storage.log import Log
from rayk.storage.records import SimpleRecord, build_batch, decode_records, iter_batches
from tests.test_consumer_group_coordinator import Partition as OffsetsPartition

ACCEPT, RELEASE, REJECT = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT


class Partition(OffsetsPartition):
    """The __consumer_offsets partition (its records; `fail` makes appends fail)."""

    def coordinator(self) -> GroupCoordinator:
        coordinator = GroupCoordinator(self.append, BrokerConfig(group_share_session_timeout_ms=6_000))
        coordinator.load([(offset, key, value) for offset, (key, value) in enumerate(self.records)])
        return coordinator


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def leader(log: Log, coordinator: GroupCoordinator | list[GroupCoordinator], epoch: int = 0,
           **settings: int) -> SharePartitions:  # fmt: skip
    """A leader's share-partitions writing to `coordinator` (the last of a list, which
    the test extends when the coordinator moves)."""
    return SharePartitions(log, "t", 0, epoch, LastCoordinator(coordinator), ShareSettings(**settings))


class LastCoordinator:
    """The share state store of `leader`: the coordinator, or the last of the list, as it is at each call."""

    def __init__(self, coordinator: GroupCoordinator | list[GroupCoordinator]) -> None:
        self._coordinator = coordinator

    def _current(self) -> GroupCoordinator:
        return self._coordinator[-1] if isinstance(self._coordinator, list) else self._coordinator

    async def read_share_state(self, *args: Any) -> Any:
        return await self._current().read_share_state(*args)

    async def write_share_state(self, *args: Any) -> None:
        await self._current().write_share_state(*args)


def write(log: Log, *values: str) -> None:
    log.append_as_leader(build_batch([SimpleRecord(v.encode()) for v in values]), 0)
    log.high_watermark = log.log_end_offset


def offsets_of(result: Any) -> list[int]:
    ranges = [range(a, b + 1) for a, b, _ in result.acquired]
    assert result.error is None, result.error
    got = [r.offset for batch in iter_batches(result.records) for r in decode_records(batch.data)]
    return [o for o in got if any(o in r for r in ranges)]


async def member(coordinator: GroupCoordinator, member_id: str, topics: tuple[str, ...] = ("t",)) -> Any:
    return await coordinator.share_heartbeat("g", member_id, 0, list(topics), partition_counts={"t": 1})


# ---------------------------------------------------------------------------------- membership


def test_every_member_of_a_one_partition_topic_is_assigned_it_and_a_new_coordinator_keeps_them():
    async def main() -> None:
        partition = Partition()
        coordinator = partition.coordinator()
        a = await member(coordinator, "a")
        b = await member(coordinator, "b")
        assert a.assignment == b.assignment == {("t", 0)} and a.member_epoch == 1 and b.member_epoch == 2
        again = await coordinator.share_heartbeat("g", "a", 1, partition_counts={"t": 1})
        assert again.member_epoch == 2 and again.assignment == {("t", 0)}
        quiet = await coordinator.share_heartbeat("g", "a", 2, partition_counts={"t": 1})
        assert quiet.assignment is None and quiet.heartbeat_interval_ms == 5_000
        with pytest.raises(FencedMemberEpochError):
            await coordinator.share_heartbeat("g", "b", 7, partition_counts={"t": 1})
        replayed = partition.coordinator()
        assert replayed.describe_share_group("g") == coordinator.describe_share_group("g")
        assert (await replayed.share_heartbeat("g", "b", 2, partition_counts={"t": 1})).member_epoch == 2
        assert (await replayed.list_groups())[0] == {"group_id": "g", "state": "Stable", "protocol_type": "share",
                                                     "group_type": "share"}  # fmt: skip

    run(main())


def test_members_are_dealt_the_partitions_and_a_leaver_or_a_silent_member_gives_theirs_back():
    async def main() -> None:
        gone: list[Any] = []
        coordinator = GroupCoordinator(Partition().append, BrokerConfig(group_share_session_timeout_ms=6_000),
                                       share_members_gone=lambda g, members: gone.append((g, members)))  # fmt: skip
        counts = {"t": 3}
        a = await coordinator.share_heartbeat("g", "a", 0, ["t"], partition_counts=counts)
        assert a.assignment == {("t", 0), ("t", 1), ("t", 2)}
        await coordinator.share_heartbeat("g", "b", 0, ["t"], partition_counts=counts)
        a = await coordinator.share_heartbeat("g", "a", a.member_epoch, partition_counts=counts)
        assert a.assignment == {("t", 0), ("t", 2)}
        await coordinator.share_heartbeat("g", "b", -1, partition_counts=counts)
        assert gone == [("g", [("b", frozenset({("t", 1)}))])]
        assert (await coordinator.share_heartbeat("g", "a", a.member_epoch, partition_counts=counts)).assignment == {
            ("t", 0), ("t", 1), ("t", 2)}
        assert await coordinator.expire_share_members("g", now_ms=time.monotonic() * 1000 + 7_000) == ["a"]
        assert coordinator.describe_share_group("g")["state"] == "Empty"
        await coordinator.delete_group("g")
        with pytest.raises(GroupIdNotFoundError):
            coordinator.describe_share_group("g")

    run(main())


def test_a_member_past_group_share_max_size_is_refused_until_one_leaves():
    async def main() -> None:
        coordinator = GroupCoordinator(Partition().append, BrokerConfig(group_share_max_size=2))
        await member(coordinator, "a")
        await member(coordinator, "b")
        with pytest.raises(GroupMaxSizeReachedError):
            await member(coordinator, "c")
        await coordinator.share_heartbeat("g", "b", -1, partition_counts={"t": 1})
        assert (await member(coordinator, "c")).member_epoch > 0

    run(main())


def test_share_groups_and_consumer_groups_do_not_share_an_id():
    async def main() -> None:
        coordinator = Partition().coordinator()
        await member(coordinator, "a")
        with pytest.raises(GroupIdNotFoundError, match="share group"):
            await coordinator.consumer_heartbeat("g", ConsumerHeartbeat("m", 0, subscribed_topics=("t",), owned=()),
                                                 {"t": 1})  # fmt: skip
        with pytest.raises(GroupIdNotFoundError, match="share group"):
            await coordinator.commit_offsets("g", -1, "", {("t", 0): (5, "")})
        with pytest.raises(NonEmptyGroupError):
            await coordinator.delete_group("g")
        await coordinator.consumer_heartbeat("c", ConsumerHeartbeat("m", 0, subscribed_topics=("t",), owned=()), {"t": 1})
        with pytest.raises(GroupIdNotFoundError, match="not a share group"):
            await coordinator.share_heartbeat("c", "x", 0, ["t"], partition_counts={"t": 1})
        with pytest.raises(InvalidConfigurationError):
            await coordinator.alter_share_group_configs("g", {"share.auto.offset.reset": "middle"})

    run(main())


# ---------------------------------------------------------------------------------- delivery


def test_members_of_one_partition_receive_different_records_and_accepted_ones_never_come_back(tmp_path):
    async def main() -> None:
        log = Log(tmp_path / "t-0")
        write(log, "old")
        coordinator = Partition().coordinator()
        await member(coordinator, "a")
        await member(coordinator, "b")
        shares = leader(log, coordinator)
        assert offsets_of(await shares.share_fetch("g", "a", 10, 0)) == []  # latest: after "old"
        write(log, *"abc")
        write(log, *"def")
        first = offsets_of(await shares.share_fetch("g", "a", 3, 0))
        second = offsets_of(await shares.share_fetch("g", "b", 10, 0))
        assert first == [1, 2, 3] and second == [4, 5, 6]
        result = await shares.share_fetch("g", "a", 10, 0, [(1, 3, ACCEPT)])
        assert result.acknowledge_error is None and offsets_of(result) == []
        with pytest.raises(InvalidRecordStateError):
            await shares.share_acknowledge("g", "a", [(4, 4, ACCEPT)])  # b holds it
        await shares.share_acknowledge("g", "b", [(4, 6, RELEASE)])
        redelivered = await shares.share_fetch("g", "a", 10, 0)
        assert offsets_of(redelivered) == [4, 5, 6] and redelivered.acquired == ((4, 6, 2),)
        assert coordinator.share_group_offsets("g") == {("t", 0): 4}

    run(main())


async def fetch_parked_on_an_empty_log(tmp_path: Any, max_records: int) -> tuple[Log, Any, asyncio.Future]:
    """A leader (locks of 200 ms) of an empty log, and member "a"'s share fetch of
    `max_records` (0: a probe) waiting there for records, up to 5 s."""
    log = Log(tmp_path / "t-0")
    coordinator = Partition().coordinator()
    await member(coordinator, "a")
    shares = leader(log, coordinator, lock_duration_ms=200)
    waiting = asyncio.ensure_future(shares.share_fetch("g", "a", max_records, 5_000))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    return log, shares, waiting


def test_a_fetch_waits_for_records_and_unacknowledged_ones_come_back_after_the_lock(tmp_path):
    async def main() -> None:
        log, shares, waiting = await fetch_parked_on_an_empty_log(tmp_path, max_records=10)
        write(log, "x", "y")
        shares.wake()
        assert offsets_of(await asyncio.wait_for(waiting, 1)) == [0, 1]
        started = time.monotonic()
        again = await shares.share_fetch("g", "b", 10, 5_000)  # nothing new: waits for the lock to expire
        assert offsets_of(again) == [0, 1] and again.acquired == ((0, 1, 2),) and time.monotonic() - started >= 0.1

    run(main())


def test_a_probe_acquires_nothing_and_is_answered_once_records_could_be_acquired(tmp_path):
    async def main() -> None:
        log, shares, probe = await fetch_parked_on_an_empty_log(tmp_path, max_records=0)
        write(log, "x")
        shares.wake()
        answer = await asyncio.wait_for(probe, 1)
        assert (answer.records, answer.acquired, answer.error) == (b"", (), None)
        assert offsets_of(await shares.share_fetch("g", "a", 10, 0)) == [0]  # nothing was acquired by the probe
        probe = asyncio.ensure_future(shares.share_fetch("g", "b", 0, 5_000))
        await asyncio.sleep(0.05)
        assert not probe.done()  # "a" holds the only record
        await asyncio.wait_for(probe, 1)  # until its lock expires: then "b" could acquire it
        assert offsets_of(await shares.share_fetch("g", "b", 10, 0)) == [0]

    run(main())


def test_an_answer_fits_one_data_plane_frame_with_new_and_redelivered_batches_alike(tmp_path, monkeypatch):
    monkeypatch.setattr(share_fetch, "MAX_RECORDS_BYTES", 10_000)  # two 4 KB batches fit, not three
    async def main() -> None:
        log = Log(tmp_path / "t-0")
        coordinator = Partition().coordinator()
        await coordinator.alter_share_group_configs("g", {"share.auto.offset.reset": "earliest"})
        for value in "abc":
            write(log, value * 4000)  # a batch each
        await member(coordinator, "a")
        shares = leader(log, coordinator)
        assert offsets_of(await shares.share_fetch("g", "a", 10, 0)) == [0, 1]
        assert offsets_of(await shares.share_fetch("g", "a", 10, 0)) == [2]
        await shares.release_member("g", "a")  # all three available again
        await member(coordinator, "b")
        assert offsets_of(await shares.share_fetch("g", "b", 10, 0)) == [0, 1]
        assert offsets_of(await shares.share_fetch("g", "b", 10, 0)) == [2]

    run(main())


def test_a_fetch_reads_its_new_records_once_and_answers_a_batch_cut_at_max_records_whole(tmp_path, monkeypatch):
    async def main() -> None:
        log = Log(tmp_path / "t-0")
        coordinator = Partition().coordinator()
        await coordinator.alter_share_group_configs("g", {"share.auto.offset.reset": "earliest"})
        write(log, *"abcde")
        write(log, *"fg")
        await member(coordinator, "a")
        shares = leader(log, coordinator)
        reads: list[int] = []
        read = log.read
        monkeypatch.setattr(log, "read", lambda offset, *args, **kwargs: reads.append(offset) or read(offset, *args, **kwargs))

        def batches(result: Any) -> list[int]:
            return [batch.header.base_offset for batch in iter_batches(result.records)]

        first = await shares.share_fetch("g", "a", 3, 0)
        assert (offsets_of(first), batches(first), reads) == ([0, 1, 2], [0], [0])
        reads.clear()
        rest = await shares.share_fetch("g", "a", 10, 0)  # the rest of the first batch, and the second
        assert (offsets_of(rest), batches(rest), reads) == ([3, 4, 5, 6], [0, 5], [3])
        await shares.share_acknowledge("g", "a", [(1, 1, RELEASE)])
        again = await shares.share_fetch("g", "a", 10, 0)  # a redelivery: read where it is
        assert (offsets_of(again), batches(again), again.acquired) == ([1], [0], ((1, 1, 2),))

    run(main())


def test_a_poison_record_is_archived_at_the_delivery_limit(tmp_path):
    async def main() -> None:
        log = Log(tmp_path / "t-0")
        coordinator = Partition().coordinator()
        await coordinator.alter_share_group_configs("g", {"share.auto.offset.reset": "earliest"})
        write(log, "poison")
        write(log, "fine")
        await member(coordinator, "a")
        shares = leader(log, coordinator, delivery_count_limit=3)
        for delivery in range(1, 4):
            result = await shares.share_fetch("g", "a", 1, 0)
            assert result.acquired == ((0, 0, delivery),)
            await shares.share_acknowledge("g", "a", [(0, 0, RELEASE)])
        assert offsets_of(await shares.share_fetch("g", "a", 10, 0)) == [1]
        await shares.share_acknowledge("g", "a", [(1, 1, ACCEPT)])
        assert coordinator.share_group_offsets("g") == {("t", 0): 2}

    run(main())


def test_acknowledgements_survive_a_new_leader_and_a_new_coordinator_and_the_old_leader_is_fenced(tmp_path):
    async def main() -> None:
        log = Log(tmp_path / "t-0")
        partition = Partition()
        coordinator = partition.coordinator()
        await coordinator.alter_share_group_configs("g", {"share.auto.offset.reset": "earliest"})
        write(log, *"abcd")
        await member(coordinator, "a")
        coordinators = [coordinator]
        old = leader(log, coordinators, epoch=3)
        assert offsets_of(await old.share_fetch("g", "a", 4, 0)) == [0, 1, 2, 3]
        await old.share_acknowledge("g", "a", [(0, 0, ACCEPT), (2, 2, REJECT)])
        coordinators.append(partition.coordinator())  # the coordinator moved
        new = leader(log, coordinators, epoch=4)  # and so did the leadership
        again = await new.share_fetch("g", "a", 10, 0)
        assert offsets_of(again) == [1, 3] and again.acquired == ((1, 1, 2), (3, 3, 2))
        with pytest.raises(NotLeaderOrFollowerError):  # deposed: its members look the leader up again
            await old.share_acknowledge("g", "a", [(1, 1, ACCEPT)])
        _, state_epoch, _ = await coordinators[-1].read_share_state("g", "t", 0, 4)
        with pytest.raises(FencedLeaderEpochError):
            await coordinators[-1].write_share_state("g", "t", 0, 3, state_epoch, 0, [])
        with pytest.raises(FencedStateEpochError):  # a leader that read no state may only create one
            await coordinators[-1].write_share_state("g", "t", 0, 5, state_epoch, 0, [], create=True)

    run(main())


def test_a_share_groups_offsets_are_altered_and_deleted_only_while_it_is_empty_and_old_states_are_fenced(tmp_path):
    async def main() -> None:
        log = Log(tmp_path / "t-0")
        partition = Partition()
        reset: list[Any] = []
        coordinator = GroupCoordinator(partition.append, BrokerConfig(group_share_session_timeout_ms=6_000),
                                       share_states_reset=lambda g, partitions: reset.append((g, partitions)))  # fmt: skip
        await coordinator.alter_share_group_configs("g", {"share.auto.offset.reset": "earliest"})
        write(log, *"abcdef")
        await member(coordinator, "a")
        shares = leader(log, coordinator)
        assert offsets_of(await shares.share_fetch("g", "a", 3, 0, [])) == [0, 1, 2]
        await shares.share_acknowledge("g", "a", [(0, 0, ACCEPT)])
        with pytest.raises(NonEmptyGroupError):
            await coordinator.alter_share_group_offsets("g", {("t", 0): 4})
        with pytest.raises(NonEmptyGroupError):
            await coordinator.delete_share_group_offsets("g", ["t"])
        await coordinator.share_heartbeat("g", "a", -1, partition_counts={"t": 1})  # leaves
        _, old_epoch, _ = await coordinator.read_share_state("g", "t", 0, 0)
        await coordinator.alter_share_group_offsets("g", {("t", 0): 4})
        assert coordinator.share_group_offsets("g") == {("t", 0): 4} == partition.coordinator().share_group_offsets("g")
        assert reset == [("g", [("t", 0)])]
        with pytest.raises(FencedStateEpochError):  # the state the leader read before is no more
            await coordinator.write_share_state("g", "t", 0, 0, old_epoch, 1, [])
        shares.forget("g")  # (what the reset's callback makes each leader do)
        await member(coordinator, "b")
        assert offsets_of(await shares.share_fetch("g", "b", 10, 0, [])) == [4, 5]
        with pytest.raises(GroupIdNotFoundError):
            await coordinator.alter_share_group_offsets("no-such-group", {("t", 0): 0})

        await coordinator.share_heartbeat("g", "b", -1, partition_counts={"t": 1})
        await coordinator.delete_share_group_offsets("g", ["t"])
        assert coordinator.share_group_offsets("g") == {} == partition.coordinator().share_group_offsets("g")
        shares.forget("g")
        await member(coordinator, "c")  # from share.auto.offset.reset again: every record
        assert offsets_of(await shares.share_fetch("g", "c", 10, 0, [])) == [0, 1, 2, 3, 4, 5]

    run(main())


def test_a_state_a_leader_was_reading_when_the_offsets_were_altered_is_read_again(tmp_path):
    """The reset's callback (`forget`) reaches a leader while its read of the old state is
    on its way back: that state is not kept, so no record before the new start is handed out."""
    async def main() -> None:
        log = Log(tmp_path / "t-0")
        coordinator = Partition().coordinator()
        await coordinator.alter_share_group_configs("g", {"share.auto.offset.reset": "earliest"})
        write(log, *"abcd")
        await leader(log, coordinator).share_fetch("g", "a", 0, 0)  # the group's state is written, at offset 0
        shares = leader(log, coordinator)  # a new leader: it reads that state, with nothing to write
        read, answered, release = coordinator.read_share_state, asyncio.Event(), asyncio.Event()

        async def held_read(*args: Any) -> Any:
            answer = await read(*args)
            answered.set()
            await release.wait()
            return answer

        coordinator.read_share_state = held_read
        fetch = asyncio.ensure_future(shares.share_fetch("g", "a", 10, 0))
        await answered.wait()  # the leader's read has the state at offset 0
        coordinator.read_share_state = read
        await coordinator.alter_share_group_offsets("g", {("t", 0): 3})
        shares.forget("g")
        release.set()
        assert offsets_of(await fetch) == [3]  # read again at once, not after a fenced write

    run(main())


def test_a_failed_state_write_is_an_error_and_the_leader_reads_the_state_again(tmp_path):
    async def main() -> None:
        log = Log(tmp_path / "t-0")
        partition = Partition()
        coordinator = partition.coordinator()
        await coordinator.alter_share_group_configs("g", {"share.auto.offset.reset": "earliest"})
        write(log, *"ab")
        await member(coordinator, "a")
        shares = leader(log, coordinator)
        await shares.share_fetch("g", "a", 2, 0)
        partition.fail = True
        with pytest.raises(CoordinatorNotAvailableError):
            await shares.share_acknowledge("g", "a", [(0, 1, ACCEPT)])
        partition.fail = False
        assert offsets_of(await shares.share_fetch("g", "b", 10, 0)) == [0, 1]  # not accepted: delivered again

    run(main())


def test_control_batches_and_compacted_gaps_are_passed_over(tmp_path):
    async def main() -> None:
        log = Log(tmp_path / "t-0")
        coordinator = Partition().coordinator()
        await coordinator.alter_share_group_configs("g", {"share.auto.offset.reset": "earliest"})
        log.append_as_leader(build_batch([SimpleRecord(b"a")], producer_id=7, producer_epoch=0, base_sequence=0,
                                         is_transactional=True), 0, allow_transactional=True,
                         verification_guard=log.verification_guard(7))  # fmt: skip
        log.append_txn_marker(7, 0, True, 0, 0)
        write(log, "b")
        await member(coordinator, "a")
        shares = leader(log, coordinator)
        result = await shares.share_fetch("g", "a", 10, 0)
        assert offsets_of(result) == [0, 2]
        await shares.share_acknowledge("g", "a", [(0, 0, ACCEPT), (2, 2, ACCEPT)])
        assert coordinator.share_group_offsets("g") == {("t", 0): 3}

    run(main())


def test_coordinator_unavailable_reaches_the_member_as_an_error(tmp_path):
    async def main() -> None:
        class Down:
            async def read_share_state(self, *args: Any) -> Any:
                raise CoordinatorNotAvailableError("moving")

            async def write_share_state(self, *args: Any) -> None:
                raise CoordinatorNotAvailableError("moving")

        shares = SharePartitions(Log(tmp_path / "t-0"), "t", 0, 0, Down(), ShareSettings())
        assert isinstance((await shares.share_fetch("g", "a", 1, 0)).error, CoordinatorNotAvailableError)

    run(main())


# ---------------------------------------------------------------------------------- records

names = st.text(max_size=8)
members = st.builds(ShareMemberRecord, names, st.integers(0, 99), st.integers(0, 99), st.lists(names).map(tuple),
                    st.lists(st.tuples(names, st.integers(0, 9))).map(tuple), names, names, st.none() | names)


@given(st.builds(ShareGroupRecord, names, st.integers(0, 1 << 40), st.dictionaries(names, st.integers(0, 99)),
                 st.lists(members).map(tuple), st.dictionaries(names, names), st.integers(0, 1 << 45)))
def test_a_share_group_record_decodes_to_itself(record):
    assert decode_record(share_group_key(record.group_id), share_group_value(record)) == record


@given(names, names, st.integers(0, 99), st.integers(0, 99), st.integers(0, 1 << 40),
       st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9), st.sampled_from(["available", "archived"]),
                          st.integers(0, 5))))
def test_a_share_state_record_decodes_to_itself(group, topic, partition, epoch, start, batches):
    batches = tuple((start + a, start + a + b, s, n) for a, b, s, n in batches)
    record = ShareStateRecord(group, topic, partition, epoch, 1, start, batches)
    assert decode_record(share_state_key(group, topic, partition), share_state_value(record)) == record
