"""ShareGroupHosting: the group coordinator's side of KIP-932's share groups
(rayk.coordinator.share.share_group) and of their share-partitions' durable state, a part of
GroupCoordinator kept in a module of its own.

Membership: a ShareGroupHeartbeat is applied to a copy of its group under the group's
lock; the copy's record is written (acks=all) when anything but heartbeat times changed,
and only then replaces the group, so a failed write changes nothing
(COORDINATOR_NOT_AVAILABLE). Members past their session timeout are removed the same way.
Share groups share the group id namespace with the other kinds: a heartbeat for a
classic or consumer group's id is GROUP_ID_NOT_FOUND ("not a share group"), as Kafka
answers, and the other kinds' requests for a share group's id are refused likewise.

State (Kafka's share coordinator, here beside the group, see group_records.py): each
share-partition's leader reads its state when it starts serving the partition for the
group (`read_share_state`) and writes it whenever records are settled
(`write_share_state`). Both carry the leader's epoch: an older leader than the last one
seen is FENCED_LEADER_EPOCH, so a deposed leader can never overwrite its successor's
state, and the first read of a new leader writes its epoch down before answering, so
that fence survives a coordinator move too. Writes also carry the group's state epoch:
a state written for a group since deleted and made again is FENCED_STATE_EPOCH, and its
leader reads the state again. A state not yet written starts where the group's
`share.auto.offset.reset` says, which the leader resolves against its log.

Deleting a share group (no members: NON_EMPTY_GROUP) tombstones its states with it.
Altering its offsets (AlterShareGroupOffsets: a share-partition starts at a given offset,
nothing in flight) or deleting them (DeleteShareGroupOffsets: a topic's states go, and
it starts again where `share.auto.offset.reset` says) needs an empty group too. Either
moves the group's state epoch on and writes every state it keeps again under the new
one, in one append with the group's record: a leader still holding a state read before
is fenced at its next write, and the leaders are told to read theirs again
(`StatesReset`), so none hands out records from where the group no longer is.

Not thread-safe; the owning actor's event loop calls it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from rayk.coordinator.group.consumer_group_hosting import check_max_size
from rayk.coordinator.group.group_records import (
    ShareGroupRecord,
    ShareStateRecord,
    share_group_key,
    share_group_value,
    share_state_key,
    share_state_value,
)
from rayk.coordinator.share.share_group import ShareGroup, ShareHeartbeatAnswer, check_group_configs
from rayk.config import BrokerConfig
from rayk.errors import (
    FencedLeaderEpochError,
    FencedStateEpochError,
    GroupIdNotFoundError,
    InvalidGroupIdError,
    InvalidRequestError,
    NonEmptyGroupError,
)

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Records = list[tuple[bytes, bytes | None]]
# (group id, [(member id, its assignment)]) of members that left or timed out
MembersGone = Callable[[str, list[tuple[str, frozenset[TopicPartition]]]], None]
# (group id, its share-partitions) whose states were altered or deleted: their leaders read them again
StatesReset = Callable[[str, list[TopicPartition]], None]


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class ShareGroupHosting:
    """What GroupCoordinator keeps that this part uses."""

    config: BrokerConfig
    _groups: dict[str, Any]
    _consumer_groups: dict[str, Any]
    _offsets: dict[str, Any]
    _share_groups: dict[str, ShareGroup]
    _share_states: dict[str, dict[TopicPartition, ShareStateRecord]]
    _share_members_gone: MembersGone | None
    _share_states_reset: StatesReset | None
    _share_state_locks: weakref.WeakValueDictionary[tuple[str, str, int], asyncio.Lock]
    _lock: Callable[[str], asyncio.Lock]
    _write_group_records: Callable[[str, Records], Awaitable[None]]
    _partition_counts: Callable[[], Awaitable[dict[str, int]]]

    # ------------------------------------------------------------------ loading

    def _load_share_group(self, record: ShareGroupRecord) -> None:
        if record.group_epoch is None:
            self._share_groups.pop(record.group_id, None)
            return
        self._share_groups[record.group_id] = ShareGroup.restore(record, self.config.group_share_session_timeout_ms,
                                                                 monotonic_ms())  # fmt: skip
        self._groups.pop(record.group_id, None)  # the later record decides which kind the group is
        self._consumer_groups.pop(record.group_id, None)

    def _load_share_state(self, record: ShareStateRecord) -> None:
        states = self._share_states.setdefault(record.group_id, {})
        if record.leader_epoch is None:
            states.pop((record.topic, record.partition), None)
        else:
            states[(record.topic, record.partition)] = record
        if not states:
            del self._share_states[record.group_id]

    # ------------------------------------------------------------------ membership

    def _refuse_other_kinds(self, group_id: str) -> None:
        group = self._groups.get(group_id)
        if (group is not None and (group.generation > 0 or group.members)) or group_id in self._consumer_groups \
                or self._offsets.get(group_id):  # fmt: skip
            raise GroupIdNotFoundError(f"group {group_id!r} is not a share group")

    def _require_share_group(self, group_id: str) -> ShareGroup:
        group = self._share_groups.get(group_id)
        if group is None:
            raise GroupIdNotFoundError(f"share group {group_id!r} does not exist")
        return group

    def _new_share_group(self, group_id: str) -> ShareGroup:
        return ShareGroup(group_id, self.config.group_share_session_timeout_ms, int(time.time() * 1000))

    async def share_heartbeat(
        self, group_id: str, member_id: str, member_epoch: int, subscribed_topics: Iterable[str] | None = None,
        client_id: str = "", client_host: str = "", rack_id: str | None = None,
        partition_counts: dict[str, int] | None = None,
    ) -> ShareHeartbeatAnswer:
        """One ShareGroupHeartbeat (see share_group.py); `partition_counts`: every topic's
        (None: looked up)."""
        if not group_id:
            raise InvalidGroupIdError("a share group needs a non-empty group id")
        if partition_counts is None:
            partition_counts = await self._partition_counts()
        async with self._lock(group_id):
            group = self._share_groups.get(group_id)
            if group is None:
                self._refuse_other_kinds(group_id)
                group = self._new_share_group(group_id)
            before = group.snapshot() if group_id in self._share_groups else None
            trial = group.copy()
            answer = trial.heartbeat(member_id, member_epoch, monotonic_ms(), partition_counts,
                                     None if subscribed_topics is None else list(subscribed_topics),
                                     client_id, client_host, rack_id)  # fmt: skip
            check_max_size(group, trial, self.config.group_share_max_size, "group.share.max.size")
            after = trial.snapshot()
            if after != before:
                await self._write_group_records(group_id, [(share_group_key(group_id), share_group_value(after))])
            self._share_groups[group_id] = trial
            if answer.member_epoch < 0:
                self._members_gone(group_id, [(answer.member_id, group.members[answer.member_id].assignment)])
            return dataclasses.replace(answer, heartbeat_interval_ms=self.config.group_share_heartbeat_interval_ms)

    async def expire_share_members(self, group_id: str, now_ms: int | None = None) -> list[str]:
        """Removes the share group's members past their session timeout, once the group's
        record without them is written; returns their ids."""
        async with self._lock(group_id):
            group = self._share_groups.get(group_id)
            if group is None:
                return []
            trial = group.copy()
            gone = trial.expire(monotonic_ms() if now_ms is None else now_ms)
            if gone:
                await self._write_group_records(group_id, [(share_group_key(group_id), share_group_value(trial.snapshot()))])
                self._share_groups[group_id] = trial
                self._members_gone(group_id, [(m, group.members[m].assignment) for m in gone])
                for member_id in gone:
                    logger.info("share group %s: member %s timed out", group_id, member_id)
            return gone

    def _members_gone(self, group_id: str, gone: list[tuple[str, frozenset[TopicPartition]]]) -> None:
        """Tells the leaders of the members' partitions (through the replica) that their
        records may go to others now, not only when their locks expire."""
        if self._share_members_gone is not None and gone:
            self._share_members_gone(group_id, gone)

    def share_group_configs(self, group_id: str) -> dict[str, str]:
        """The configs set for the group ({} for a group that is not a share group: every
        config at its default)."""
        group = self._share_groups.get(group_id)
        return dict(group.configs) if group is not None else {}

    async def alter_share_group_configs(self, group_id: str, configs: dict[str, str], replace: bool = False) -> None:
        """Sets the group's configs (INVALID_CONFIG for one a share group has not); with
        `replace`, those not given go back to their defaults. Makes the group, without
        members, if there is none."""
        check_group_configs(configs)
        async with self._lock(group_id):
            group = self._share_groups.get(group_id)
            if group is None:
                self._refuse_other_kinds(group_id)
                group = self._new_share_group(group_id)
            trial = group.copy()
            if replace:
                trial.configs.clear()
            trial.configs.update(configs)
            await self._write_group_records(group_id, [(share_group_key(group_id), share_group_value(trial.snapshot()))])
            self._share_groups[group_id] = trial

    # ------------------------------------------------------------------ share-partition state

    def _state_lock(self, group_id: str, topic: str, partition: int) -> asyncio.Lock:
        key = (group_id, topic, partition)
        lock = self._share_state_locks.get(key)
        if lock is None:
            lock = self._share_state_locks[key] = asyncio.Lock()
        return lock

    async def read_share_state(self, group_id: str, topic: str, partition: int,
                               leader_epoch: int) -> tuple[ShareStateRecord | None, int, str]:  # fmt: skip
        """(the share-partition's state or None, the group's state epoch, its
        share.auto.offset.reset) for the partition's leader in `leader_epoch`."""
        async with self._state_lock(group_id, topic, partition):
            group = self._require_share_group(group_id)
            state = self._share_states.get(group_id, {}).get((topic, partition))
            if state is not None:
                if leader_epoch < state.leader_epoch:
                    raise FencedLeaderEpochError(f"share state of {topic}-{partition} in group {group_id!r} was "
                                                 f"written in leader epoch {state.leader_epoch}, not {leader_epoch}")  # fmt: skip
                if leader_epoch > state.leader_epoch:
                    state = dataclasses.replace(state, leader_epoch=leader_epoch)
                    await self._write_state(state)
            return state, group.state_epoch, group.auto_offset_reset

    async def write_share_state(self, group_id: str, topic: str, partition: int, leader_epoch: int, state_epoch: int,
                                start_offset: int, batches: list[tuple[int, int, str, int]],
                                create: bool = False) -> None:  # fmt: skip
        """Writes a leader's state; `create`: a state the leader started (none was there
        when it read), FENCED_STATE_EPOCH if another leader's came meanwhile."""
        async with self._state_lock(group_id, topic, partition):
            group = self._require_share_group(group_id)
            if state_epoch != group.state_epoch:
                raise FencedStateEpochError(f"share group {group_id!r} is in state epoch {group.state_epoch}, "
                                            f"not {state_epoch}: read the state again")  # fmt: skip
            known = self._share_states.get(group_id, {}).get((topic, partition))
            if create and known is not None and known.state_epoch == state_epoch:
                raise FencedStateEpochError(f"share state of {topic}-{partition} in group {group_id!r} was written "
                                            "since it was read: read it again")  # fmt: skip
            if known is not None and leader_epoch < known.leader_epoch:
                raise FencedLeaderEpochError(f"share state of {topic}-{partition} in group {group_id!r} was "
                                             f"written in leader epoch {known.leader_epoch}, not {leader_epoch}")  # fmt: skip
            await self._write_state(ShareStateRecord(group_id, topic, partition, leader_epoch, state_epoch, start_offset,
                                                     tuple(map(tuple, batches))))  # fmt: skip

    async def _write_state(self, state: ShareStateRecord) -> None:
        await self._write_group_records(state.group_id, [
            (share_state_key(state.group_id, state.topic, state.partition), share_state_value(state))])
        group = self._share_groups.get(state.group_id)
        if group is None or group.state_epoch != state.state_epoch:  # deleted while it was written: it is stale
            raise FencedStateEpochError(f"share group {state.group_id!r} was deleted meanwhile")
        self._share_states.setdefault(state.group_id, {})[(state.topic, state.partition)] = state

    # ------------------------------------------------------------------ admin

    def share_group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        """DescribeShareGroupOffsets: each share-partition's start offset (SPSO)."""
        group = self._require_share_group(group_id)
        return {tp: s.start_offset for tp, s in self._share_states.get(group_id, {}).items()
                if s.state_epoch == group.state_epoch}  # fmt: skip

    def describe_share_group(self, group_id: str) -> dict[str, Any]:
        group = self._require_share_group(group_id)
        return {
            "group_id": group_id,
            "state": group.state,
            "group_epoch": group.group_epoch,
            "configs": {"share.auto.offset.reset": group.auto_offset_reset, **group.configs},
            "members": [
                {"member_id": m.member_id, "member_epoch": m.member_epoch, "client_id": m.client_id,
                 "client_host": m.client_host, "rack_id": m.rack_id, "subscribed_topics": sorted(m.subscribed_topics),
                 "assignment": sorted(m.assignment)}
                for m in sorted(group.members.values(), key=lambda m: m.member_id)
            ],  # fmt: skip
        }

    async def alter_share_group_offsets(self, group_id: str, start_offsets: dict[TopicPartition, int]) -> None:
        """AlterShareGroupOffsets: each share-partition starts at its offset, with nothing in
        flight (an empty group only: NON_EMPTY_GROUP)."""
        if any(offset < 0 for offset in start_offsets.values()):
            raise InvalidRequestError("a share group's start offset cannot be negative")
        await self._reset_share_states(group_id, dict(start_offsets), frozenset())

    async def delete_share_group_offsets(self, group_id: str, topics: Iterable[str]) -> None:
        """DeleteShareGroupOffsets: the states of the topics' share-partitions go (an empty
        group only); the group starts them again where share.auto.offset.reset says."""
        await self._reset_share_states(group_id, {}, frozenset(topics))

    async def _reset_share_states(self, group_id: str, start_offsets: dict[TopicPartition, int],
                                  deleted_topics: frozenset[str]) -> None:  # fmt: skip
        """See the module docstring: a new state epoch, the states written again under it."""
        async with self._lock(group_id):
            group = self._require_share_group(group_id)
            if group.members:
                raise NonEmptyGroupError(f"share group {group_id!r} has members; its offsets can be changed once "
                                         "they have left")  # fmt: skip
            async with contextlib.AsyncExitStack() as locks:  # no leader's write runs meanwhile
                locked: set[TopicPartition] = set()
                while True:  # (each lock may wait for a write that makes a state: lock it too, then read)
                    stored = self._share_states.get(group_id, {})
                    wanted = (set(stored) | set(start_offsets)) - locked
                    if not wanted:
                        break
                    for topic, partition in sorted(wanted):
                        await locks.enter_async_context(self._state_lock(group_id, topic, partition))
                        locked.add((topic, partition))
                touched = sorted(locked)
                if not start_offsets and not any(topic in deleted_topics for topic, _ in stored):
                    return  # nothing to change: the group was only checked
                current = {tp: s for tp, s in stored.items() if s.state_epoch == group.state_epoch}
                trial = group.copy()
                trial.state_epoch = max(int(time.time() * 1000), group.state_epoch + 1)
                states = {tp: dataclasses.replace(s, state_epoch=trial.state_epoch)
                          for tp, s in current.items() if tp[0] not in deleted_topics}  # fmt: skip
                for (topic, partition), offset in start_offsets.items():
                    known = current.get((topic, partition))
                    states[(topic, partition)] = ShareStateRecord(group_id, topic, partition,
                                                                  known.leader_epoch if known else 0,
                                                                  trial.state_epoch, offset, ())  # fmt: skip
                records: Records = [(share_group_key(group_id), share_group_value(trial.snapshot()))]
                records += [(share_state_key(group_id, *tp), share_state_value(s)) for tp, s in sorted(states.items())]
                records += [(share_state_key(group_id, *tp), None) for tp in sorted(stored) if tp not in states]
                await self._write_group_records(group_id, records)
                self._share_groups[group_id] = trial
                if states:
                    self._share_states[group_id] = states
                else:
                    self._share_states.pop(group_id, None)
        if self._share_states_reset is not None and touched:
            self._share_states_reset(group_id, touched)

    async def _delete_share_group(self, group_id: str) -> None:
        """DeleteGroups for a share group (the caller holds the group's lock): its record
        and its states' tombstones."""
        group = self._share_groups[group_id]
        if group.members:
            raise NonEmptyGroupError(f"share group {group_id!r} has members; it can be deleted once they have left")
        states = self._share_states.get(group_id, {})
        await self._write_group_records(group_id, [(share_state_key(group_id, t, p), None) for t, p in states] +
                                        [(share_group_key(group_id), None)])  # fmt: skip
        self._share_states.pop(group_id, None)
        del self._share_groups[group_id]
