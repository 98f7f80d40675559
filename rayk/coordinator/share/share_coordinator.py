"""ShareCoordinator: the share coordinator of KIP-932. It owns the share groups of one
`__consumer_offsets` partition (their members and assignments, share_group.py) and the
durable state of their share-partitions, which those partitions' leaders read and write
(rayk.replication.share: SharePartition is the leader's state machine, ShareStateRecord
what it hands over here).

Kafka splits this between the group coordinator (share groups' membership, in its
GroupMetadataManager) and a share coordinator of its own (ShareCoordinatorShard, the
states, in `__share_group_state`). Here both sit in the partition of the group they belong
to, so that a group and its states are deleted together and described by one coordinator:
the GroupCoordinator of that partition owns this object, which shares its log (writes go
through its append, acks=all, before a request is answered), its load (it replays the
share_group and share_state records, share_records.py) and its per-group locks and group
id namespace.

It maps group id -> ShareGroup, and group id -> (topic, partition) -> ShareStateRecord
(the start offset, SPSO, and the in-flight batches' states and delivery counts, with the
leader epoch and state epoch they were written in).

Membership: a ShareGroupHeartbeat is applied to a copy of its group under the group's
lock; the copy's record is written (acks=all) when anything but heartbeat times changed,
and only then replaces the group, so a failed write changes nothing
(COORDINATOR_NOT_AVAILABLE). Members past their session timeout are removed the same way.
Share groups share the group id namespace with the other kinds: a heartbeat for a
classic or consumer group's id is GROUP_ID_NOT_FOUND ("not a share group"), as Kafka
answers, and the other kinds' requests for a share group's id are refused likewise.

State (Kafka's share coordinator, here beside the group, see share_records.py): each
share-partition's leader reads its state when it starts serving the partition for the
group (`read_state`) and writes it whenever records are settled (`write_state`). Both carry the leader's epoch: an older leader than the last one
seen is FENCED_LEADER_EPOCH, so a deposed leader can never overwrite its successor's
state, and the first read of a new leader writes its epoch down before answering, so
that fence survives a coordinator move too. Writes also carry the group's state epoch:
a state written for a group since deleted and made again is FENCED_STATE_EPOCH, and its
leader reads the state again. A state not yet written starts where the group's
`share.auto.offset.reset` says, which the leader resolves against its log.

Deleting a share group (no members: NON_EMPTY_GROUP) tombstones its states with it,
under their locks, so no leader's state write lands after the tombstones.
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

from rayk.config import BrokerConfig
from rayk.coordinator.group.consumer_protocol_group_manager import check_max_size, write_group_records
from rayk.coordinator.share.share_group import ShareGroup, ShareHeartbeatAnswer, check_group_configs
from rayk.coordinator.share.share_records import (
    ShareGroupRecord,
    share_group_key,
    share_group_value,
    share_state_key,
    share_state_value,
)
from rayk.errors import (
    FencedLeaderEpochError,
    FencedStateEpochError,
    GroupIdNotFoundError,
    InvalidGroupIdError,
    InvalidRequestError,
    NonEmptyGroupError,
)
from rayk.replication.share.share_state import ShareStateRecord

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Records = list[tuple[bytes, bytes | None]]
Append = Callable[[Records], Awaitable[None]]
# (group id, [(member id, its assignment)]) of members that left or timed out
MembersGone = Callable[[str, list[tuple[str, frozenset[TopicPartition]]]], None]
# (group id, its share-partitions) whose states were altered or deleted: their leaders read them again
StatesReset = Callable[[str, list[TopicPartition]], None]


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class ShareCoordinator:
    """The share groups of one `__consumer_offsets` partition (`groups`, read by the group
    coordinator, changed only through these methods) and their share-partitions' states
    (see the module docstring)."""

    def __init__(self, config: BrokerConfig, append: Append, lock: Callable[[str], asyncio.Lock],
                 partition_counts: Callable[[], Awaitable[dict[str, int]]], other_kind: Callable[[str], bool],
                 members_gone: MembersGone | None = None, states_reset: StatesReset | None = None) -> None:  # fmt: skip
        self._config = config
        self._append = append
        self._lock = lock  # the group coordinator's lock of a group id, whatever its kind
        self._partition_counts = partition_counts
        self._other_kind = other_kind  # whether a group id is held by a classic or consumer group (or its offsets)
        self._members_gone_to = members_gone
        self._states_reset = states_reset
        self.groups: dict[str, ShareGroup] = {}
        self._states: dict[str, dict[TopicPartition, ShareStateRecord]] = {}
        self._state_locks: weakref.WeakValueDictionary[tuple[str, str, int], asyncio.Lock] = weakref.WeakValueDictionary()

    # ------------------------------------------------------------------ loading

    def load_group(self, record: ShareGroupRecord) -> None:
        """Replays one share group record (a tombstone deletes the group)."""
        if record.group_epoch is None:
            self.groups.pop(record.group_id, None)
            return
        self.groups[record.group_id] = ShareGroup.restore(record, self._config.group_share_session_timeout_ms,
                                                          monotonic_ms())  # fmt: skip

    def load_state(self, record: ShareStateRecord) -> None:
        """Replays one share-partition's state record (a tombstone deletes the state)."""
        states = self._states.setdefault(record.group_id, {})
        if record.leader_epoch is None:
            states.pop((record.topic, record.partition), None)
        else:
            states[(record.topic, record.partition)] = record
        if not states:
            del self._states[record.group_id]

    def discard(self, group_id: str) -> None:
        """A later record made the id another kind's (during the load: nothing runs yet)."""
        self.groups.pop(group_id, None)

    # ------------------------------------------------------------------ membership

    def _refuse_other_kinds(self, group_id: str) -> None:
        if self._other_kind(group_id):
            raise GroupIdNotFoundError(f"group {group_id!r} is not a share group")

    def _require_group(self, group_id: str) -> ShareGroup:
        group = self.groups.get(group_id)
        if group is None:
            raise GroupIdNotFoundError(f"share group {group_id!r} does not exist")
        return group

    def _new_group(self, group_id: str) -> ShareGroup:
        return ShareGroup(group_id, self._config.group_share_session_timeout_ms, int(time.time() * 1000))

    async def heartbeat(
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
            group = self.groups.get(group_id)
            if group is None:
                self._refuse_other_kinds(group_id)
                group = self._new_group(group_id)
            before = group.snapshot() if group_id in self.groups else None
            trial = group.copy()
            answer = trial.heartbeat(member_id, member_epoch, monotonic_ms(), partition_counts,
                                     None if subscribed_topics is None else list(subscribed_topics),
                                     client_id, client_host, rack_id)  # fmt: skip
            check_max_size(group, trial, self._config.group_share_max_size, "group.share.max.size")
            after = trial.snapshot()
            if after != before:
                await write_group_records(self._append, group_id, [(share_group_key(group_id), share_group_value(after))])
            self.groups[group_id] = trial
            if answer.member_epoch < 0:
                self._members_gone(group_id, [(answer.member_id, group.members[answer.member_id].assignment)])
            return dataclasses.replace(answer, heartbeat_interval_ms=self._config.group_share_heartbeat_interval_ms)

    async def expire_members(self, group_id: str, now_ms: int | None = None) -> list[str]:
        """Removes the share group's members past their session timeout, once the group's
        record without them is written; returns their ids."""
        async with self._lock(group_id):
            group = self.groups.get(group_id)
            if group is None:
                return []
            trial = group.copy()
            gone = trial.expire(monotonic_ms() if now_ms is None else now_ms)
            if gone:
                await write_group_records(self._append, group_id,
                                          [(share_group_key(group_id), share_group_value(trial.snapshot()))])  # fmt: skip
                self.groups[group_id] = trial
                self._members_gone(group_id, [(m, group.members[m].assignment) for m in gone])
                for member_id in gone:
                    logger.info("share group %s: member %s timed out", group_id, member_id)
            return gone

    def _members_gone(self, group_id: str, gone: list[tuple[str, frozenset[TopicPartition]]]) -> None:
        """Tells the leaders of the members' partitions (through the replica) that their
        records may go to others now, not only when their locks expire."""
        if self._members_gone_to is not None and gone:
            self._members_gone_to(group_id, gone)

    def group_configs(self, group_id: str) -> dict[str, str]:
        """The configs set for the group ({} for a group that is not a share group: every
        config at its default)."""
        group = self.groups.get(group_id)
        return dict(group.configs) if group is not None else {}

    async def alter_group_configs(self, group_id: str, configs: dict[str, str], replace: bool = False) -> None:
        """Sets the group's configs (INVALID_CONFIG for one a share group has not); with
        `replace`, those not given go back to their defaults. Makes the group, without
        members, if there is none."""
        check_group_configs(configs)
        async with self._lock(group_id):
            group = self.groups.get(group_id)
            if group is None:
                self._refuse_other_kinds(group_id)
                group = self._new_group(group_id)
            trial = group.copy()
            if replace:
                trial.configs.clear()
            trial.configs.update(configs)
            await write_group_records(self._append, group_id,
                                      [(share_group_key(group_id), share_group_value(trial.snapshot()))])  # fmt: skip
            self.groups[group_id] = trial

    # ------------------------------------------------------------------ share-partition state

    def _state_lock(self, group_id: str, topic: str, partition: int) -> asyncio.Lock:
        key = (group_id, topic, partition)
        lock = self._state_locks.get(key)
        if lock is None:
            lock = self._state_locks[key] = asyncio.Lock()
        return lock

    async def read_state(self, group_id: str, topic: str, partition: int,
                         leader_epoch: int) -> tuple[ShareStateRecord | None, int, str]:  # fmt: skip
        """(the share-partition's state or None, the group's state epoch, its
        share.auto.offset.reset) for the partition's leader in `leader_epoch`."""
        async with self._state_lock(group_id, topic, partition):
            group = self._require_group(group_id)
            state = self._states.get(group_id, {}).get((topic, partition))
            if state is not None:
                assert state.leader_epoch is not None, "a tombstone deletes the state it replays"
                if leader_epoch < state.leader_epoch:
                    raise FencedLeaderEpochError(f"share state of {topic}-{partition} in group {group_id!r} was "
                                                 f"written in leader epoch {state.leader_epoch}, not {leader_epoch}")  # fmt: skip
                if leader_epoch > state.leader_epoch:
                    state = dataclasses.replace(state, leader_epoch=leader_epoch)
                    await self._write_state(state)
            return state, group.state_epoch, group.auto_offset_reset

    async def write_state(self, group_id: str, topic: str, partition: int, leader_epoch: int, state_epoch: int,
                          start_offset: int, batches: list[tuple[int, int, str, int]],
                          create: bool = False) -> None:  # fmt: skip
        """Writes a leader's state; `create`: a state the leader started (none was there
        when it read), FENCED_STATE_EPOCH if another leader's came meanwhile."""
        async with self._state_lock(group_id, topic, partition):
            group = self._require_group(group_id)
            if state_epoch != group.state_epoch:
                raise FencedStateEpochError(f"share group {group_id!r} is in state epoch {group.state_epoch}, "
                                            f"not {state_epoch}: read the state again")  # fmt: skip
            known = self._states.get(group_id, {}).get((topic, partition))
            if create and known is not None and known.state_epoch == state_epoch:
                raise FencedStateEpochError(f"share state of {topic}-{partition} in group {group_id!r} was written "
                                            "since it was read: read it again")  # fmt: skip
            if known is not None:
                assert known.leader_epoch is not None, "a tombstone deletes the state it replays"
                if leader_epoch < known.leader_epoch:
                    raise FencedLeaderEpochError(f"share state of {topic}-{partition} in group {group_id!r} was "
                                                 f"written in leader epoch {known.leader_epoch}, not {leader_epoch}")  # fmt: skip
            await self._write_state(ShareStateRecord(group_id, topic, partition, leader_epoch, state_epoch, start_offset,
                                                     tuple(map(tuple, batches))))  # fmt: skip

    async def _write_state(self, state: ShareStateRecord) -> None:
        await write_group_records(self._append, state.group_id, [
            (share_state_key(state.group_id, state.topic, state.partition), share_state_value(state))])
        group = self.groups.get(state.group_id)
        if group is None or group.state_epoch != state.state_epoch:  # deleted while it was written: it is stale
            raise FencedStateEpochError(f"share group {state.group_id!r} was deleted meanwhile")
        self._states.setdefault(state.group_id, {})[(state.topic, state.partition)] = state

    # ------------------------------------------------------------------ admin

    def group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        """DescribeShareGroupOffsets: each share-partition's start offset (SPSO)."""
        group = self._require_group(group_id)
        return {tp: s.start_offset for tp, s in self._states.get(group_id, {}).items()
                if s.state_epoch == group.state_epoch}  # fmt: skip

    def describe_group(self, group_id: str) -> dict[str, Any]:
        group = self._require_group(group_id)
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

    async def alter_group_offsets(self, group_id: str, start_offsets: dict[TopicPartition, int]) -> None:
        """AlterShareGroupOffsets: each share-partition starts at its offset, with nothing in
        flight (an empty group only: NON_EMPTY_GROUP)."""
        if any(offset < 0 for offset in start_offsets.values()):
            raise InvalidRequestError("a share group's start offset cannot be negative")
        await self._reset_states(group_id, dict(start_offsets), frozenset())

    async def delete_group_offsets(self, group_id: str, topics: Iterable[str]) -> None:
        """DeleteShareGroupOffsets: the states of the topics' share-partitions go (an empty
        group only); the group starts them again where share.auto.offset.reset says."""
        await self._reset_states(group_id, {}, frozenset(topics))

    async def _reset_states(self, group_id: str, start_offsets: dict[TopicPartition, int],
                            deleted_topics: frozenset[str]) -> None:  # fmt: skip
        """See the module docstring: a new state epoch, the states written again under it."""
        async with self._lock(group_id):
            group = self._require_group(group_id)
            if group.members:
                raise NonEmptyGroupError(f"share group {group_id!r} has members; its offsets can be changed once "
                                         "they have left")  # fmt: skip
            async with contextlib.AsyncExitStack() as locks:  # no leader's write runs meanwhile
                locked = await self._lock_states(group_id, locks, start_offsets)
                stored = self._states.get(group_id, {})
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
                await write_group_records(self._append, group_id, records)
                self.groups[group_id] = trial
                if states:
                    self._states[group_id] = states
                else:
                    self._states.pop(group_id, None)
        if self._states_reset is not None and touched:
            self._states_reset(group_id, touched)

    async def delete_group(self, group_id: str) -> None:
        """DeleteGroups for a share group (the caller holds the group's lock): its record
        and its states' tombstones, written under every state lock of the group, so that a
        leader's state write under way (past its check of the group) lands before them and
        is tombstoned too, never after them as an orphan a later load would keep."""
        if self.groups[group_id].members:
            raise NonEmptyGroupError(f"share group {group_id!r} has members; it can be deleted once they have left")
        async with contextlib.AsyncExitStack() as locks:
            await self._lock_states(group_id, locks)
            # (heartbeats take the group's lock, which the caller holds: no member came meanwhile)
            states = self._states.get(group_id, {})
            tombstones: Records = [(share_state_key(group_id, t, p), None) for t, p in sorted(states)]
            await write_group_records(self._append, group_id, tombstones + [(share_group_key(group_id), None)])
            self._states.pop(group_id, None)
            del self.groups[group_id]

    async def _lock_states(self, group_id: str, locks: contextlib.AsyncExitStack,
                           also: Iterable[TopicPartition] = ()) -> set[TopicPartition]:  # fmt: skip
        """Takes, into `locks`, the lock of each share-partition of the group that has a state,
        a lock in use (a leader's read or write under way, maybe making a state) or is in
        `also`; returns them. Each lock may wait for a write that makes another state: that
        one is locked too, until none is left. The caller holds the group's lock, so no other
        taker of several state locks runs meanwhile, and readers and writers take one each:
        no order of taking them can deadlock."""
        locked: set[TopicPartition] = set()
        also = set(also)
        while True:
            in_use = {(t, p) for g, t, p in list(self._state_locks.keys()) if g == group_id}
            wanted = (set(self._states.get(group_id, {})) | in_use | also) - locked
            if not wanted:
                return locked
            for topic, partition in sorted(wanted):
                await locks.enter_async_context(self._state_lock(group_id, topic, partition))
                locked.add((topic, partition))
