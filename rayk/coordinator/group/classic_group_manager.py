"""ClassicGroupManager: the classic groups (JoinGroup / SyncGroup, Kafka's ClassicGroup) of
one `__consumer_offsets` partition, a part of the GroupCoordinator that owns it (Kafka
keeps them in its GroupMetadataManager).

It maps group id -> ConsumerGroup (consumer_group.py: members, generations, rebalances).
Groups come into being by JoinGroup (or, for the coordinator's offsets, a standalone
commit); SyncGroup, Heartbeat and LeaveGroup for a group it does not know are
UNKNOWN_MEMBER_ID, as in Kafka. When a generation settles (Stable), the group's record is
written in the background through the coordinator's append: its generation, protocol,
leader and members with their assignments (Kafka's GroupMetadataValue), so that a new
coordinator takes the group over as it was (`load`): its members go on heartbeating and
committing in their generation, with no rebalance, and those that do not reach it within
their session time out. A record without members (an empty group) carries the time the
group became empty, from which its offsets expire; a group loaded from a record that lacks
it counts from its load, written down by `start` so that the next coordinator counts from
the same time.

Which kind holds a group id (classic, consumer-protocol or share) is the coordinator's to
decide; it drops a group here (`discard`) when a later record makes it another kind.

Not thread-safe; the owning actor's event loop calls it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from rayk.config import BrokerConfig
from rayk.coordinator.group.consumer_group import ConsumerGroup, GroupState, JoinResult, Member
from rayk.coordinator.group.classic_group_records import GroupRecord, MemberState, group_key, member_state_value
from rayk.coordinator.group.group_records import RECORDS_PER_APPEND
from rayk.errors import KafkaError, UnknownMemberIdError

logger = logging.getLogger(__name__)

Append = Callable[[list[tuple[bytes, bytes | None]]], Awaitable[None]]


def subscribed_topics(group: ConsumerGroup) -> frozenset[str] | None:
    """The topics a consumer group's members subscribe to, by the metadata they joined the
    current protocol with; None (all topics, as Kafka's ClassicGroup answers) while no
    protocol is chosen or a member's subscription does not decode."""
    from rayk.consumer_protocol import decode_subscription  # (rayk.client imports this module)

    if group.protocol is None:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        metadata = dict(member.protocols).get(group.protocol)
        if metadata is None:
            return None
        try:
            topics.update(decode_subscription(metadata).topics)
        except KafkaError:
            return None
    return frozenset(topics)


class ClassicGroupManager:
    """The classic groups of one `__consumer_offsets` partition (`groups`, read by the
    coordinator, changed only through these methods), and the background writes of their
    settled generations' records."""

    def __init__(self, config: BrokerConfig, append: Append) -> None:
        self._config = config
        self._append = append
        self.groups: dict[str, ConsumerGroup] = {}
        self._tasks: set[asyncio.Task] = set()  # background writes of group records
        self._unstamped: list[str] = []  # groups loaded without the time they became empty

    # ------------------------------------------------------------------ loading

    def load(self, record: GroupRecord) -> None:
        """Replays one group record (a tombstone deletes the group)."""
        self.groups.pop(record.group_id, None)  # each record supersedes the one before
        if record.generation is None:
            return
        group = self.group(record.group_id)
        group.generation = record.generation
        if record.members:
            # The settled generation's members, taken over as Kafka's coordinator loads its
            # GroupMetadata: they go on heartbeating and committing in their generation, and
            # those that do not come to this coordinator within their session leave as usual.
            group.restore_stable(record.protocol_type, record.protocol, record.leader_id, [
                Member(m.member_id, m.client_id, m.session_timeout_ms, m.rebalance_timeout_ms, list(m.protocols),
                       group.clock_s(), m.assignment, m.group_instance_id)
                for m in record.members
            ])
            group.empty_since_ms = None
            return
        # No members kept (an empty group, or a record written before members were kept):
        # the group is empty since it became so (or, for a record written while it had
        # members, since now, which `start` writes down so that the next coordinator
        # counts from it too) until its members join again.
        group.empty_since_ms = record.empty_since_ms
        if group.empty_since_ms is None:
            group.empty_since_ms = int(time.time() * 1000)
            self._unstamped.append(record.group_id)

    def discard(self, group_id: str) -> None:
        """A later record made the id another kind's (during the load: nothing runs yet)."""
        self.groups.pop(group_id, None)

    def start(self) -> None:
        """Writes down when the groups loaded without that time became empty (see `load`)."""
        stamped = [self._group_record(g) for g in map(self.groups.get, self._unstamped) if g is not None and not g.members]
        self._unstamped.clear()
        if stamped:
            self._write_in_background(stamped)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for group in self.groups.values():
            group.close()

    # ------------------------------------------------------------------ groups

    def new_group(self, group_id: str) -> ConsumerGroup:
        """An empty classic group, not yet kept here, whose settled generations are written."""
        return ConsumerGroup(group_id, self._config.group_initial_rebalance_delay_ms, on_stable=self._persist_group)

    def group(self, group_id: str) -> ConsumerGroup:
        """The group, made (empty) if there is none."""
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = self.new_group(group_id)
        return group

    def existing(self, group_id: str, member_id: str) -> ConsumerGroup:
        """The group; UNKNOWN_MEMBER_ID (Kafka's answer) if there is none."""
        group = self.groups.get(group_id)
        if group is None:
            raise UnknownMemberIdError(f"group {group_id!r} has no member {member_id!r} (no such group here)")
        return group

    def replace(self, group_id: str, group: ConsumerGroup | None) -> None:
        """The group's id goes to `group` (None: to another kind); the one it held is closed."""
        old = self.groups.pop(group_id, None)
        if old is not None:
            old.close()
        if group is not None:
            self.groups[group_id] = group

    def expire_members(self, busy: Callable[[str], bool] = lambda group_id: False) -> None:
        """Removes every group's members past their session timeout, but not yet those of a
        group `busy` (a change of the id being written: the next check removes them)."""
        for group in [g for g in self.groups.values() if not busy(g.group_id)]:
            for member_id in group.expire():
                logger.info("group %s: member %s timed out", group.group_id, member_id)

    async def delete_if_empty(self, group_id: str) -> None:
        """Deletes the group if it has no members (its record tombstoned if it had one);
        the caller holds the group's lock and has checked it has no offsets."""
        group = self.groups.get(group_id)
        if group is None or group.members:
            return
        if group.generation > 0:
            await self._append([(group_key(group_id), None)])
            if group.members:  # joined meanwhile: its next generation writes its record again
                return
        if self.groups.get(group_id) is group:
            del self.groups[group_id]
            group.close()

    # ------------------------------------------------------------------ membership

    async def join(self, group_id: str, member_id: str, client_id: str, session_timeout_ms: int,
                   rebalance_timeout_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
                   group_instance_id: str | None) -> JoinResult:  # fmt: skip
        return await self.group(group_id).join(member_id, client_id, session_timeout_ms, rebalance_timeout_ms,
                                               protocol_type, protocols, group_instance_id)  # fmt: skip

    async def sync(self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes] | None,
                   group_instance_id: str | None) -> bytes:  # fmt: skip
        return await self.existing(group_id, member_id).sync(generation, member_id, assignments, group_instance_id)

    def heartbeat(self, group_id: str, generation: int, member_id: str, group_instance_id: str | None) -> None:
        self.existing(group_id, member_id).heartbeat(generation, member_id, group_instance_id)

    def leave(self, group_id: str, member_id: str, group_instance_id: str | None) -> None:
        self.existing(group_id, member_id or group_instance_id or "").leave(member_id, group_instance_id)

    def describe(self, group_id: str) -> dict[str, Any]:
        """The group's generation, protocol, leader and members, as DescribeGroups shows them."""
        group = self.groups.get(group_id)
        if group is None:
            return {"generation": 0, "protocol": None, "leader": None, "members": []}
        return {
            "generation": group.generation,
            "protocol": group.protocol,
            "leader": group.leader_id,
            "members": [
                {
                    "member_id": m.member_id,
                    "client_id": m.client_id,
                    "group_instance_id": m.group_instance_id,
                    "assignment": m.assignment,
                    "metadata": dict(m.protocols).get(group.protocol, b""),  # the chosen protocol's
                }
                for m in group.members.values()
            ],
        }

    # ------------------------------------------------------------------ records

    def _persist_group(self, group: ConsumerGroup) -> None:
        self._write_in_background([self._group_record(group)])

    @staticmethod
    def _group_record(group: ConsumerGroup) -> tuple[bytes, bytes | None]:
        states = [
            member_state_value(MemberState(m.member_id, m.group_instance_id, m.client_id, m.session_timeout_ms,
                                           m.rebalance_timeout_ms, tuple(m.protocols), m.assignment))
            for m in group.members.values()
        ] if group.state is GroupState.STABLE else []
        value = msgpack.packb(
            {
                "generation": group.generation,
                "protocol_type": group.protocol_type,
                "protocol": group.protocol,
                "leader": group.leader_id,
                "members": sorted(group.members),
                "empty_since_ms": group.empty_since_ms if not group.members else None,
                "member_states": states,
            }
        )
        return group_key(group.group_id), value

    def _write_in_background(self, records: list[tuple[bytes, bytes | None]]) -> None:
        async def write() -> None:
            for i in range(0, len(records), RECORDS_PER_APPEND):
                await self._append(records[i:i + RECORDS_PER_APPEND])

        task = asyncio.get_running_loop().create_task(write())
        self._tasks.add(task)
        task.add_done_callback(self._persisted)

    async def background_writes_landed(self) -> None:
        """Returns once every record written in the background so far is written (or failed)."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def _persisted(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("could not persist group metadata: %s", task.exception())
