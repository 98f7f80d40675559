"""ConsumerProtocolGroupManager: the groups of KIP-848's consumer protocol
(ConsumerGroupHeartbeat; consumer_protocol_group.py, Kafka's ConsumerGroup) of one
`__consumer_offsets` partition, a part of the GroupCoordinator that owns it (Kafka keeps
them in its GroupMetadataManager).

It maps group id -> ConsumerProtocolGroup, rebuilt on load from each group's latest
record (one record per change: consumer_group_records.py), and writes through the coordinator's
append, under the coordinator's per-group lock.

These groups share the group id namespace with the classic ones, as in Kafka 4:
- an empty group converts either way: a heartbeat makes an empty classic group a consumer
  group, a JoinGroup an empty consumer group a classic one (each tombstones the other's
  record; committed offsets stay);
- online migration with members: a consumer-protocol member's heartbeat to a Stable
  classic group (of protocol type "consumer") upgrades it, its members becoming classic
  members of the consumer group with their partitions and generation
  (ConsumerProtocolGroup.from_classic); a classic JoinGroup to a consumer group with
  members makes a classic member of it; SyncGroup, Heartbeat and LeaveGroup of classic
  members are answered by the consumer group (classic_sync, ...). When the last
  consumer-protocol member leaves or times out and classic members remain, the group is
  classic again, in its epoch as the generation, and rebalances. A classic group that is
  still rebalancing answers the upgrading heartbeat COORDINATOR_LOAD_IN_PROGRESS (retried)
  and one of another protocol type GROUP_ID_NOT_FOUND.

A heartbeat (or a classic member's join or leave) is applied to a copy of its group,
under the group's lock; the copy's record is written (acks=all) if it changed anything
but heartbeat times, and only then does the copy replace the group and the member get
its answer, so a failed write changes nothing. Members past their session or rebalance
timeout are removed the same way. Commits are checked by member epoch: an older one is
STALE_MEMBER_EPOCH, a newer one FENCED_MEMBER_EPOCH (a classic member's either way
ILLEGAL_GENERATION), and a commit without a member (epoch < 0) is taken only while the
group has no members.

Not thread-safe; the owning actor's event loop calls it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from rayk.config import BrokerConfig
from rayk.coordinator.group.classic_group_manager import ClassicGroupManager
from rayk.coordinator.group.classic_group_records import group_key
from rayk.coordinator.group.consumer_group import ConsumerGroup, GroupState, JoinResult, Member
from rayk.coordinator.group.consumer_protocol_group import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    ClassicMembership,
    ConsumerHeartbeat,
    ConsumerProtocolGroup,
    HeartbeatAnswer,
)
from rayk.coordinator.group.consumer_protocol_group import Member as ConsumerMember
from rayk.coordinator.group.consumer_group_records import ConsumerGroupRecord, consumer_group_key, consumer_group_value
from rayk.coordinator.group.member_reconciliation import MemberAssignment
from rayk.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidGroupIdError,
    KafkaError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    RequestTimedOutError,
    StaleMemberEpochError,
    UnknownMemberIdError,
)

logger = logging.getLogger(__name__)

CONSUMER_PROTOCOL_TYPE = "consumer"
TopicPartition = tuple[str, int]
Records = list[tuple[bytes, bytes | None]]
Append = Callable[[Records], Awaitable[None]]
PartitionCounts = Callable[[], Awaitable[dict[str, int]]]  # every topic's partition count, from the Controller


def encode_partitions(partitions: Iterable[TopicPartition]) -> bytes:
    """Partitions as the classic consumer protocol's assignment (a classic member's SyncGroup answer)."""
    from rayk.consumer_protocol import encode_assignment  # (rayk.client imports this module)

    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return encode_assignment(by_topic)


def check_max_size(group: Any, trial: Any, max_size: int, setting: str) -> None:
    """GROUP_MAX_SIZE_REACHED if the heartbeat applied to `trial` (a copy of `group`) added
    a member past `max_size` (a static member taking its old place adds none)."""
    if len(trial.members) > max(len(group.members), max_size):
        raise GroupMaxSizeReachedError(f"group {group.group_id!r} has {len(group.members)} members, its {setting}")


async def write_group_records(append: Append, group_id: str, records: Records) -> None:
    """Writes a group's records before its change is answered: a write the partition could
    not replicate is COORDINATOR_NOT_AVAILABLE, which clients retry."""
    try:
        await append(records)
    except (NotEnoughReplicasError, NotEnoughReplicasAfterAppendError, RequestTimedOutError) as e:
        raise CoordinatorNotAvailableError(f"the state of group {group_id!r} was not replicated: {e}") from None


def monotonic_ms() -> int:
    """The clock of consumer-protocol members' sessions (a restored member's counts from its load)."""
    return int(time.monotonic() * 1000)


def check_member_epoch(group: ConsumerProtocolGroup, member_id: str, member_epoch: int) -> None:
    """A consumer-protocol group's check of a commit or fetch (Kafka's
    ConsumerGroup.validateOffsetCommit / validateOffsetFetch)."""
    if member_epoch < 0 and not group.members:
        return  # an admin client, or a consumer outside group management, while the group is empty
    member = group.members.get(member_id)
    if member is None:
        raise UnknownMemberIdError(f"member {member_id!r} is not in group {group.group_id!r}")
    current = member.assignment.member_epoch
    if member.classic is not None and member_epoch != current:  # a classic member's epoch is its generation
        raise IllegalGenerationError(f"generation {member_epoch} is not member {member_id!r}'s {current}")
    if member_epoch > current:
        raise FencedMemberEpochError(f"member {member_id!r} of group {group.group_id!r} is in epoch {current}, "
                                     f"not {member_epoch}")  # fmt: skip
    if member_epoch < current:
        raise StaleMemberEpochError(f"member {member_id!r} of group {group.group_id!r} is in epoch {current} "
                                    f"now, not {member_epoch}: retry with the epoch of its next heartbeat")  # fmt: skip


class ConsumerProtocolGroupManager:
    """The consumer-protocol groups of one `__consumer_offsets` partition (`groups`, read by
    the coordinator, changed only through these methods), and their conversions to and
    from the classic groups of its ClassicGroupManager."""

    def __init__(self, config: BrokerConfig, append: Append, lock: Callable[[str], asyncio.Lock],
                 partition_counts: PartitionCounts, classic: ClassicGroupManager,
                 is_share_group: Callable[[str], bool]) -> None:  # fmt: skip
        self._config = config
        self._append = append
        self._lock = lock  # the coordinator's lock of a group id, whatever its kind
        self._partition_counts = partition_counts
        self._classic = classic
        self._is_share_group = is_share_group
        self.groups: dict[str, ConsumerProtocolGroup] = {}

    def load(self, record: ConsumerGroupRecord) -> None:
        """Replays one consumer group record (a tombstone deletes the group)."""
        if record.group_epoch is None:
            self.groups.pop(record.group_id, None)
            return
        self.groups[record.group_id] = ConsumerProtocolGroup.restore(
            record, self._config.group_consumer_session_timeout_ms, monotonic_ms())

    def discard(self, group_id: str) -> None:
        """A later record made the id another kind's (during the load: nothing runs yet)."""
        self.groups.pop(group_id, None)

    async def expire_members(self, group_id: str, now_ms: int | None = None) -> list[str]:
        """Removes the consumer group's members past their session (or rebalance)
        timeout, once the group's record without them is written; returns their ids."""
        async with self._lock(group_id):
            group = self.groups.get(group_id)
            if group is None:
                return []
            trial = group.copy()
            gone = trial.expire(monotonic_ms() if now_ms is None else now_ms)
            if gone:
                consumer_left = any(group.members[m].classic is None for m in gone)
                downgraded = self._downgraded(trial) if consumer_left else None
                value = None if downgraded is not None else consumer_group_value(trial.snapshot())
                await self._append([(consumer_group_key(group_id), value)])
                self._replace_group(group_id, trial, downgraded)
                for member_id in gone:
                    logger.info("group %s: member %s timed out", group_id, member_id)
            return gone

    async def delete_if_empty(self, group_id: str) -> None:
        """Deletes the group (its record tombstoned) if it has no members; the caller holds
        the group's lock and has checked it has no offsets."""
        group = self.groups.get(group_id)
        if group is not None and not group.members:
            await self._append([(consumer_group_key(group_id), None)])
            del self.groups[group_id]

    # ------------------------------------------------------------------ classic members

    @staticmethod
    def _classic_member_id(group: ConsumerProtocolGroup, member_id: str, group_instance_id: str | None) -> str:
        """The member a classic request names (by instance id alone in a LeaveGroup);
        FENCED_INSTANCE_ID if the instance id is another member's."""
        if group_instance_id is None:
            return member_id
        holder = next((m.member_id for m in group.members.values() if m.instance_id == group_instance_id), None)
        if holder is None:
            raise UnknownMemberIdError(f"no member of group {group.group_id!r} has instance id {group_instance_id!r}")
        if member_id and member_id != holder:
            raise FencedInstanceIdError(f"instance id {group_instance_id!r} of group {group.group_id!r} is member {holder!r}, "
                                        f"not {member_id!r}")  # fmt: skip
        return holder

    async def classic_join(
        self, group_id: str, member_id: str, client_id: str, session_timeout_ms: int, rebalance_timeout_ms: int,
        protocol_type: str, protocols: list[tuple[str, bytes]], group_instance_id: str | None,
    ) -> JoinResult | None:
        """A JoinGroup: to a consumer-protocol group with members, the joining consumer
        becomes a classic member of it (a mixed group, Kafka's online migration), answered
        at once; an empty one is tombstoned and gives its id to a classic group (None, as
        for an id that is no consumer-protocol group's)."""
        from rayk.consumer_protocol import decode_subscription  # (rayk.client imports this module)

        if group_id not in self.groups:
            return None
        async with self._lock(group_id):
            group = self.groups.get(group_id)
            if group is None:
                return None
            if not group.members:
                await write_group_records(self._append, group_id, [(consumer_group_key(group_id), None)])
                del self.groups[group_id]
                return None
            if protocol_type != CONSUMER_PROTOCOL_TYPE or not protocols:
                raise InconsistentGroupProtocolError(
                    f"group {group_id!r} is a consumer-protocol group: it takes classic members of protocol type "
                    f"'consumer' only, not {protocol_type!r}"
                )
            try:
                subscription = decode_subscription(protocols[0][1])
            except KafkaError as e:
                raise InconsistentGroupProtocolError(f"group {group_id!r}: a malformed subscription ({e})") from None
            owned = [(t, p) for t, ps in subscription.owned_partitions.items() for p in ps]
            counts = await self._partition_counts()
            trial = group.copy()
            answer = trial.classic_join(
                member_id or f"{group_instance_id or client_id or 'member'}-{uuid.uuid4()}", monotonic_ms(), counts,
                subscription.topics, owned, rebalance_timeout_ms, ClassicMembership(session_timeout_ms, tuple(protocols)),
                group_instance_id, client_id,
            )  # fmt: skip
            check_max_size(group, trial, self._config.group_consumer_max_size, "group.consumer.max.size")
            await write_group_records(self._append, group_id,
                                      [(consumer_group_key(group_id), consumer_group_value(trial.snapshot()))])  # fmt: skip
            self.groups[group_id] = trial
            # Never the leader (the coordinator assigns): its SyncGroup carries no assignments.
            return JoinResult(answer.member_epoch, protocols[0][0], "", answer.member_id, [])

    async def classic_sync(self, group_id: str, generation: int, member_id: str,
                           group_instance_id: str | None) -> bytes | None:  # fmt: skip
        """A classic member's SyncGroup: its assignment; None if the id is no consumer-protocol group's."""
        if group_id not in self.groups:
            return None
        async with self._lock(group_id):
            mixed = self.groups.get(group_id)
            if mixed is None:
                return None
            return encode_partitions(mixed.classic_sync(self._classic_member_id(mixed, member_id, group_instance_id),
                                                        generation, monotonic_ms()))  # fmt: skip

    async def classic_heartbeat(self, group_id: str, generation: int, member_id: str,
                                group_instance_id: str | None) -> bool:  # fmt: skip
        """A classic member's Heartbeat; False if the id is no consumer-protocol group's."""
        if group_id not in self.groups:
            return False
        async with self._lock(group_id):
            mixed = self.groups.get(group_id)
            if mixed is None:
                return False
            mixed.classic_heartbeat(self._classic_member_id(mixed, member_id, group_instance_id), generation,
                                    monotonic_ms())  # fmt: skip
            return True

    async def classic_leave(self, group_id: str, member_id: str, group_instance_id: str | None) -> bool:
        """A classic member's LeaveGroup, once written; False if the id is no consumer-protocol group's."""
        if group_id not in self.groups:
            return False
        async with self._lock(group_id):
            mixed = self.groups.get(group_id)
            if mixed is None:
                return False
            trial = mixed.copy()
            trial.classic_leave(self._classic_member_id(trial, member_id, group_instance_id))
            await write_group_records(self._append, group_id,
                                      [(consumer_group_key(group_id), consumer_group_value(trial.snapshot()))])  # fmt: skip
            self.groups[group_id] = trial
            return True

    # ------------------------------------------------------------------ heartbeats

    async def heartbeat(self, group_id: str, heartbeat: ConsumerHeartbeat,
                        partition_counts: dict[str, int] | None = None) -> HeartbeatAnswer:  # fmt: skip
        """One ConsumerGroupHeartbeat (see the module docstring); `partition_counts`: every
        topic's partition count now (None: looked up)."""
        if not group_id:
            raise InvalidGroupIdError("a consumer group needs a non-empty group id")
        if partition_counts is None:
            partition_counts = await self._partition_counts()
        async with self._lock(group_id):
            records: Records = []
            group = self.groups.get(group_id)
            if group is None:
                group = await self._new_or_upgraded(group_id, heartbeat, records)
            before = group.snapshot()
            trial = group.copy()
            answer = trial.heartbeat(
                heartbeat.member_id, heartbeat.member_epoch, monotonic_ms(), partition_counts,
                subscribed_topics=heartbeat.subscribed_topics, owned=heartbeat.owned, assignor=heartbeat.assignor,
                rebalance_timeout_ms=heartbeat.rebalance_timeout_ms, subscribed_regex=heartbeat.subscribed_regex,
                instance_id=heartbeat.instance_id, client_id=heartbeat.client_id, client_host=heartbeat.client_host,
                rack_id=heartbeat.rack_id,
            )  # fmt: skip
            check_max_size(group, trial, self._config.group_consumer_max_size, "group.consumer.max.size")
            downgraded = self._downgraded(trial) if heartbeat.member_epoch == LEAVE_EPOCH else None
            after = trial.snapshot()
            if downgraded is not None:
                records.append((consumer_group_key(group_id), None))
            elif after != before or group_id not in self.groups:
                records.append((consumer_group_key(group_id), consumer_group_value(after)))
            if records:
                await write_group_records(self._append, group_id, records)
            self._replace_group(group_id, trial, downgraded)
            return dataclasses.replace(answer, heartbeat_interval_ms=self._config.group_consumer_heartbeat_interval_ms)

    async def _new_or_upgraded(self, group_id: str, heartbeat: ConsumerHeartbeat, records: Records) -> ConsumerProtocolGroup:
        """The group a joining member's heartbeat makes of an id that is no consumer-protocol
        group's (the caller holds its lock): a new one, or the classic group's upgrade, whose
        record's tombstone it adds to `records`."""
        if group_id in self._classic.groups:
            # The classic group's record written when it last turned Stable goes first: in
            # the log after the records that end the group, it would make a replay classic again.
            await self._classic.background_writes_landed()
        if self._is_share_group(group_id):
            raise GroupIdNotFoundError(f"group {group_id!r} is a share group")
        if heartbeat.member_epoch != JOIN_EPOCH:
            raise UnknownMemberIdError(f"group {group_id!r} has no member {heartbeat.member_id!r} (no such group here)")
        classic = self._classic.groups.get(group_id)
        if classic is not None and classic.generation > 0:
            records.append((group_key(group_id), None))
        if classic is not None and classic.members:
            # Built from the classic group as it is now, and written after an await: it stays
            # so until then, as classic requests wait for the lock held (GroupCoordinator).
            return self._upgraded(classic)
        return ConsumerProtocolGroup(group_id, self._config.group_consumer_session_timeout_ms)

    def _replace_group(self, group_id: str, consumer_group: ConsumerProtocolGroup, downgraded: ConsumerGroup | None) -> None:
        """The group's new state, once written: a consumer-protocol group (the classic one
        it was, if any, is closed), or the classic group it was downgraded to, rebalancing."""
        self._classic.replace(group_id, downgraded)
        if downgraded is None:
            self.groups[group_id] = consumer_group
            return
        self.groups.pop(group_id, None)
        downgraded.rebalance()  # its members rejoin, told by their next heartbeat
        logger.info("group %s: its last consumer-protocol member left; a classic group again", group_id)

    def _upgraded(self, classic: ConsumerGroup) -> ConsumerProtocolGroup:
        """A classic group with members, as a consumer-protocol group of classic members
        (Kafka's online upgrade): only a Stable group of the consumer protocol type."""
        from rayk.consumer_protocol import decode_assignment, decode_subscription  # (rayk.client imports this module)

        if classic.protocol_type != CONSUMER_PROTOCOL_TYPE or classic.protocol is None:
            raise GroupIdNotFoundError(f"group {classic.group_id!r} is a classic group of protocol type "
                                       f"{classic.protocol_type!r}: it cannot become a consumer group")  # fmt: skip
        if classic.state is not GroupState.STABLE:
            raise CoordinatorLoadInProgressError(f"group {classic.group_id!r} is rebalancing: it is upgraded to the "
                                                 "consumer protocol once its generation settles")  # fmt: skip
        now_ms = monotonic_ms()
        members = []
        for m in classic.members.values():
            try:
                topics = decode_subscription(m.metadata_for(classic.protocol)).topics
                assigned = frozenset((t, p) for t, ps in decode_assignment(m.assignment).partitions.items() for p in ps)
            except KafkaError as e:
                raise GroupIdNotFoundError(f"group {classic.group_id!r} cannot become a consumer group: member "
                                           f"{m.member_id!r}'s embedded consumer protocol is malformed ({e})") from None
            members.append((ConsumerMember(
                m.member_id, frozenset(topics), None, m.rebalance_timeout_ms, MemberAssignment(classic.generation), now_ms,
                instance_id=m.group_instance_id, client_id=m.client_id,
                classic=ClassicMembership(m.session_timeout_ms, tuple(m.protocols)),
            ), assigned))  # fmt: skip
        logger.info("group %s: a consumer-protocol member joins; upgraded with its %d classic member(s)",
                    classic.group_id, len(members))
        return ConsumerProtocolGroup.from_classic(classic.group_id, self._config.group_consumer_session_timeout_ms,
                                                  classic.generation, now_ms, members)  # fmt: skip

    def _downgraded(self, group: ConsumerProtocolGroup) -> ConsumerGroup | None:
        """The classic group that `group` becomes now that its last consumer-protocol member
        left, if classic members remain (Kafka's online downgrade), in its epoch as the
        generation with their assignments; None if it stays as it is."""
        if not group.members or any(m.classic is None for m in group.members.values()):
            return None
        classic = self._classic.new_group(group.group_id)
        classic.generation = group.group_epoch
        members = [
            Member(m.member_id, m.client_id, m.classic.session_timeout_ms, m.rebalance_timeout_ms, list(m.classic.protocols),
                   classic.clock_s(), encode_partitions(m.assignment.assigned), m.instance_id)
            for m in group.members.values() if m.classic is not None
        ]  # fmt: skip
        shared = set.intersection(*({name for name, _ in m.protocols} for m in members))
        protocol = next((name for name, _ in members[0].protocols if name in shared), None)
        if protocol is None:
            return None  # no protocol every member has: it stays a mixed group
        classic.restore_stable(CONSUMER_PROTOCOL_TYPE, protocol, members[0].member_id, members)
        return classic

    def describe(self, group_id: str) -> dict[str, Any]:
        """A consumer-protocol group for ConsumerGroupDescribe: GROUP_ID_NOT_FOUND for any
        other (Kafka's answer, also for a classic group)."""
        group = self.groups.get(group_id)
        if group is None:
            raise GroupIdNotFoundError(f"group {group_id!r} is not a consumer-protocol group here")
        return {
            "group_id": group_id, "state": group.state.value, "group_epoch": group.group_epoch,
            "assignment_epoch": group.target_epoch, "assignor": group.assignor_name,
            "members": [{
                "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
                "member_epoch": m.assignment.member_epoch, "client_id": m.client_id, "client_host": m.client_host,
                "subscribed_topics": sorted(m.subscribed_topics), "subscribed_regex": m.subscribed_regex,
                "assignment": sorted(m.assignment.assigned), "target": sorted(group.target.get(m.member_id, ())),
                "classic": m.classic is not None,
            } for m in group.members.values()],
        }  # fmt: skip

    @staticmethod
    def describe_as_classic(group: ConsumerProtocolGroup) -> dict[str, Any]:
        """The group as DescribeGroups shows a classic one: its group epoch as the
        generation, its assignor as the protocol, and each member's subscription and
        assignment in the classic consumer protocol's encoding."""
        from rayk.consumer_protocol import encode_subscription  # (rayk.client imports this module)

        known = tuple(group.subscribed_topics())
        return {
            "generation": group.group_epoch, "protocol": group.assignor_name,
            "leader": None,
            "members": [{"member_id": m.member_id, "client_id": m.client_id, "group_instance_id": m.instance_id,
                         "assignment": encode_partitions(m.assignment.assigned),
                         "metadata": encode_subscription(sorted(m.subscription(known)))}
                        for m in group.members.values()],
        }  # fmt: skip
