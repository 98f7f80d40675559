"""ShareGroup: one share group (KIP-932) at its share coordinator (share_coordinator.py),
and what a ShareGroupHeartbeat does to it, as pure state (no I/O, no clock of its own).

A share group's members do not own partitions: they consume them together, record by
record, and each partition's leader hands every record to one member at a time
(share_partition.py). The assignment only says which partitions' leaders a member fetches
from, so it moves at once, with no revocation: there is no reconciliation, and a member's
epoch is simply the group epoch its assignment was computed in.

The group epoch counts the group's changes: a member joins or leaves, changes its
subscribed topics, or a subscribed topic gains partitions. Each change recomputes every
member's assignment (Kafka's simple assignor in spirit): the subscribed partitions, in
order, dealt round-robin over the members that subscribe to their topic, so that with
fewer members than partitions each partition has one member, and with more members than
partitions each member has one partition and a partition several members.

A heartbeat's `member_epoch` says who is asking, as in Kafka:
- 0: a member joining, with the member id the client made (or none: one is made here);
- -1: the member leaving;
- the member's epoch, or the one before it (its last answer was lost), for a member in
  the group; anything else is FENCED_MEMBER_EPOCH, an unknown member UNKNOWN_MEMBER_ID.
A member moves to the group epoch, and takes its part of the assignment, at its own next
heartbeat; the answer carries its assignment when that is new to the member (a join, a
change, or an answer that was lost), else None.

A member that sends no heartbeat for `session_timeout_ms` is removed (`expire`).

The group's configs (`share.auto.offset.reset`: where a partition's share state starts
when a leader first serves it, "latest" or "earliest") are kept with it.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rayk.coordinator.share.share_records import ShareGroupRecord, ShareMemberRecord
from rayk.errors import FencedMemberEpochError, InvalidConfigurationError, UnknownMemberIdError

JOIN_EPOCH, LEAVE_EPOCH = 0, -1
AUTO_OFFSET_RESET = "share.auto.offset.reset"
GROUP_CONFIGS = {AUTO_OFFSET_RESET: ("latest", "earliest")}  # name -> allowed values, the first the default
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ShareMember:
    """One member of a share group as of its last heartbeat: its epoch and the one before (a
    lost answer's retry), its subscription, the partitions it fetches from, and its client."""

    member_id: str
    member_epoch: int
    previous_epoch: int
    subscribed_topics: frozenset[str]
    assignment: frozenset[TopicPartition]
    last_heartbeat_ms: int
    client_id: str = ""
    client_host: str = ""
    rack_id: str | None = None


@dataclass(frozen=True, slots=True)
class ShareHeartbeatAnswer:
    """What a ShareGroupHeartbeat answers a member: its id and epoch, and its assignment when
    that is new to it (else None)."""

    member_id: str
    member_epoch: int
    assignment: frozenset[TopicPartition] | None  # None: the member has it already (or left)
    heartbeat_interval_ms: int = 0


def check_group_configs(configs: Mapping[str, str]) -> None:
    """INVALID_CONFIG unless every config is a share group's, with an allowed value."""
    for name, value in configs.items():
        allowed = GROUP_CONFIGS.get(name)
        if allowed is None:
            raise InvalidConfigurationError(f"{name!r} is not a share group config (those are {sorted(GROUP_CONFIGS)})")
        if value not in allowed:
            raise InvalidConfigurationError(f"{name} is one of {list(allowed)}, not {value!r}")


class ShareGroup:
    """One share group at its coordinator: owns the group epoch, the members and their
    assignments, the group's configs and its share state's epoch. Made by ShareCoordinator;
    pure and not thread-safe (the coordinator's loop)."""

    def __init__(self, group_id: str, session_timeout_ms: int, state_epoch: int = 0) -> None:
        self.group_id = group_id
        self.state_epoch = state_epoch  # its share-partitions' states' (the coordinator's clock when it came to be)
        self.session_timeout_ms = session_timeout_ms
        self.group_epoch = 0
        self.partition_counts: dict[str, int] = {}  # of the subscribed topics, as the last assignment saw them
        self.members: dict[str, ShareMember] = {}
        self.configs: dict[str, str] = {}
        self._target: dict[str, frozenset[TopicPartition]] = {}  # member -> its assignment in the group epoch

    @property
    def auto_offset_reset(self) -> str:
        return self.configs.get(AUTO_OFFSET_RESET, GROUP_CONFIGS[AUTO_OFFSET_RESET][0])

    def heartbeat(
        self, member_id: str, member_epoch: int, now_ms: int, partition_counts: Mapping[str, int],
        subscribed_topics: Iterable[str] | None = None, client_id: str = "", client_host: str = "",
        rack_id: str | None = None,
    ) -> ShareHeartbeatAnswer:
        """One ShareGroupHeartbeat (see the module docstring); `partition_counts`: every
        topic's now. `subscribed_topics` None: unchanged (required to join)."""
        if member_epoch == JOIN_EPOCH:
            member_id = member_id or str(uuid.uuid4())
            known = self.members.get(member_id)
            topics = frozenset(subscribed_topics or (known.subscribed_topics if known else ()))
            self.members[member_id] = ShareMember(member_id, 0, 0, topics, frozenset(), now_ms, client_id, client_host, rack_id)
            self._changed(partition_counts)
            return self._answer(member_id, JOIN_EPOCH)
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"share group {self.group_id!r} has no member {member_id!r}")
        if member_epoch == LEAVE_EPOCH:
            del self.members[member_id]
            self._changed(partition_counts)
            return ShareHeartbeatAnswer(member_id, LEAVE_EPOCH, None)
        if member_epoch not in (member.member_epoch, member.previous_epoch):
            raise FencedMemberEpochError(f"member {member_id!r} of share group {self.group_id!r} is in epoch "
                                         f"{member.member_epoch}, not {member_epoch}: it must join again")  # fmt: skip
        topics = member.subscribed_topics if subscribed_topics is None else frozenset(subscribed_topics)
        self.members[member_id] = dataclasses.replace(member, last_heartbeat_ms=now_ms, subscribed_topics=topics)
        if topics != member.subscribed_topics or self._counts(partition_counts) != self.partition_counts:
            self._changed(partition_counts)
        return self._answer(member_id, member_epoch)

    def _answer(self, member_id: str, asked_epoch: int) -> ShareHeartbeatAnswer:
        """The member moves to the group epoch, with its part of the assignment; the answer
        carries that part unless the member asked in the epoch it has."""
        member = self.members[member_id]
        if member.member_epoch != self.group_epoch:
            member = self.members[member_id] = dataclasses.replace(
                member, member_epoch=self.group_epoch, previous_epoch=member.member_epoch,
                assignment=self._target.get(member_id, frozenset()))  # fmt: skip
        fresh = asked_epoch != member.member_epoch
        return ShareHeartbeatAnswer(member_id, member.member_epoch, member.assignment if fresh else None)

    def _counts(self, partition_counts: Mapping[str, int]) -> dict[str, int]:
        return {t: partition_counts.get(t, 0) for t in self.subscribed_topics()}

    def _changed(self, partition_counts: Mapping[str, int]) -> None:
        self.group_epoch += 1
        self._assign(partition_counts)

    def _assign(self, partition_counts: Mapping[str, int]) -> None:
        """Every member's part of the assignment (see the module docstring); each member
        takes its own at its next heartbeat."""
        self.partition_counts = self._counts(partition_counts)
        target: dict[str, set[TopicPartition]] = {m: set() for m in self.members}
        for topic, count in sorted(self.partition_counts.items()):
            takers = sorted(m.member_id for m in self.members.values() if topic in m.subscribed_topics)
            if not takers or not count:
                continue
            for i in range(max(count, len(takers))):
                target[takers[i % len(takers)]].add((topic, i % count))
        self._target = {m: frozenset(ps) for m, ps in target.items()}

    def subscribed_topics(self) -> frozenset[str]:
        return frozenset().union(*(m.subscribed_topics for m in self.members.values()))

    def expire(self, now_ms: int) -> list[str]:
        """Removes the members that sent no heartbeat for the session timeout; their ids."""
        gone = [m.member_id for m in self.members.values() if now_ms - m.last_heartbeat_ms >= self.session_timeout_ms]
        for member_id in gone:
            del self.members[member_id]
        if gone:
            self._changed(self.partition_counts)
        return gone

    @property
    def state(self) -> str:
        """Kafka's ShareGroup states: Empty or Stable (nothing to reconcile)."""
        return "Stable" if self.members else "Empty"

    def copy(self) -> ShareGroup:
        group = ShareGroup(self.group_id, self.session_timeout_ms, self.state_epoch)
        group.group_epoch, group.partition_counts = self.group_epoch, dict(self.partition_counts)
        group.members, group.configs, group._target = dict(self.members), dict(self.configs), dict(self._target)
        return group

    def snapshot(self) -> ShareGroupRecord:
        """What is written when the group changes (heartbeat times are not)."""
        members = tuple(
            ShareMemberRecord(m.member_id, m.member_epoch, m.previous_epoch, tuple(sorted(m.subscribed_topics)),
                              tuple(sorted(m.assignment)), m.client_id, m.client_host, m.rack_id)
            for m in sorted(self.members.values(), key=lambda m: m.member_id)
        )  # fmt: skip
        return ShareGroupRecord(self.group_id, self.group_epoch, dict(self.partition_counts), members, dict(self.configs),
                                self.state_epoch)

    @classmethod
    def restore(cls, record: ShareGroupRecord, session_timeout_ms: int, now_ms: int) -> ShareGroup:
        """The group as `record` has it; its members' sessions count from `now_ms`."""
        assert record.group_epoch is not None
        group = cls(record.group_id, session_timeout_ms, record.state_epoch)
        group.group_epoch, group.partition_counts, group.configs = record.group_epoch, dict(record.partition_counts), dict(record.configs)
        for m in record.members:
            group.members[m.member_id] = ShareMember(
                m.member_id, m.member_epoch, m.previous_epoch, frozenset(m.subscribed_topics),
                frozenset(map(tuple, m.assignment)), now_ms, m.client_id, m.client_host, m.rack_id,
            )  # fmt: skip
        group._assign(group.partition_counts)
        return group
