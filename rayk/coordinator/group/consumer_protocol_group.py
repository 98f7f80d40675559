"""ConsumerProtocolGroup: one group of KIP-848's consumer protocol at its coordinator, and what a
ConsumerGroupHeartbeat does to it, as pure state (no I/O, no clock of its own).

The group epoch counts the group's changes: a member joins or leaves, changes its
subscribed topics or its assignor, or a subscribed topic gains partitions. Whenever the
group epoch is ahead of the target assignment's epoch, the next heartbeat has the
server-side assignor (rayk.coordinator.group.server_assignors, `uniform` unless the members name
another) compute the target for the group epoch. Every heartbeat then reconciles its
member towards its part of the target (rayk.coordinator.group.member_reconciliation): partitions
move one member at a time, only once released, with no group-wide barrier.

A heartbeat's `member_epoch` says who is asking, as in Kafka:
- 0: a member joining (with the member id the client made, KIP-1082, or none: one is
  made here);
- -1: the member leaving (its partitions are free at once);
- the member's current epoch, or the epoch it had before (that one only) when the member
  reports owning no partition it no longer has (a lost answer), for a member in the group;
- -2: a static member (one with an instance id, KIP-345) going away for a while: it keeps
  its partitions, and the group its place, until its session times out or a member with
  the same instance id joins and takes its place, assignment and epoch over (no group
  change, so no partition moves). A join with an instance id another live member holds is
  UNRELEASED_INSTANCE_ID;
- anything else is FENCED_MEMBER_EPOCH (the member must rejoin with epoch 0 and no
  partitions), and an unknown member id UNKNOWN_MEMBER_ID.
A member that sends no heartbeat for its session timeout, or keeps partitions it must
revoke past its rebalance timeout, is removed (`expire`), which frees its partitions.

A member subscribes to topic names, a regular expression (matched against whole topic
names in RE2's syntax, internal topics excluded, as Kafka's), or both. The regex is resolved at every
heartbeat against the topics of that moment, so a topic created later that matches joins
the subscription like a topic gaining partitions.

Classic members (a "mixed" group, as Kafka 4's online migration makes them): a consumer
that speaks the classic protocol may be a member too, through `classic_join`,
`classic_sync`, `classic_heartbeat` and its session timeout of JoinGroup. It is reconciled
like the others; JoinGroup answers at once with its member epoch as the generation (it is
never the leader: the coordinator assigns), SyncGroup gives its assigned partitions, and a
Heartbeat answers REBALANCE_IN_PROGRESS whenever it should join again to move on (the group
changed, it must revoke, or partitions it waits for were released). An eager client
revokes everything before it rejoins; a cooperative one says what it still owns in its
subscription. `from_classic` makes such a group of a Stable classic group's members.

The group coordinator hosts these groups (consumer_protocol_group_manager.py): it applies a
heartbeat to a `copy()`, writes the copy's `snapshot()` when it differs, and only then keeps
it, so a failed write changes nothing; a new coordinator rebuilds each group with `restore`.

Not thread-safe (the classic protocol's groups are rayk.coordinator.group.consumer_group).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import re2

from rayk.coordinator.group.consumer_group_records import ConsumerGroupRecord, ConsumerMemberRecord
from rayk.coordinator.group.member_reconciliation import NOT_OWNED, MemberAssignment, MemberState, reconcile
from rayk.coordinator.group.server_assignors import ASSIGNORS, TopicPartition
from rayk.errors import (
    FencedMemberEpochError,
    IllegalGenerationError,
    InvalidRegularExpressionError,
    InvalidRequestError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)
from rayk.internal_topics import is_internal

JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH = 0, -1, -2
DEFAULT_ASSIGNOR = "uniform"


class GroupState(enum.Enum):
    """Kafka's ConsumerGroup states, as ListGroups and ConsumerGroupDescribe name them."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"  # the group epoch is ahead of the target's
    RECONCILING = "Reconciling"  # some member has not reached the target
    STABLE = "Stable"


@dataclass(frozen=True, slots=True)
class ClassicMembership:
    """How a member that speaks the classic protocol joined: its session timeout and its
    protocols (name, ConsumerProtocol subscription), as JoinGroup gave them."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a consumer-protocol group as of its last heartbeat: what it subscribes to,
    its assignment and reconciliation state, its timeouts (ms) and the client it runs in.
    Immutable: a heartbeat replaces it."""

    member_id: str
    subscribed_topics: frozenset[str]
    assignor: str | None  # the server assignor the member asked for, if any
    rebalance_timeout_ms: int
    assignment: MemberAssignment
    last_heartbeat_ms: int
    revoking_since_ms: int = -1  # when it entered UNREVOKED_PARTITIONS
    subscribed_regex: str | None = None
    instance_id: str | None = None  # a static member's (KIP-345)
    away: bool = False  # a static member that left with epoch -2 and may come back
    client_id: str = ""
    client_host: str = ""
    rack_id: str | None = None
    classic: ClassicMembership | None = None  # a member that speaks the classic protocol

    def subscription(self, topics: Iterable[str]) -> frozenset[str]:
        """The topics it subscribes to, among `topics` (those that exist) for its regex."""
        if self.subscribed_regex is None:
            return self.subscribed_topics
        pattern = _compiled(self.subscribed_regex)
        return self.subscribed_topics | {t for t in topics if not is_internal(t) and pattern.fullmatch(t)}


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeat:
    """A ConsumerGroupHeartbeat's fields, as the coordinator gets them (see `heartbeat`)."""

    member_id: str
    member_epoch: int
    subscribed_topics: tuple[str, ...] | None = None
    subscribed_regex: str | None = None
    owned: tuple[TopicPartition, ...] | None = None
    assignor: str | None = None
    rebalance_timeout_ms: int = 300_000
    instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rack_id: str | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    """What a ConsumerGroupHeartbeat answers a member: its id and epoch, and the partitions it
    should own now (None once it left)."""

    member_id: str
    member_epoch: int
    assignment: frozenset[TopicPartition] | None  # None: the member left
    heartbeat_interval_ms: int = 0  # when to heartbeat next (the coordinator's setting; 0: not set here)


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a client's bad regex is its INVALID_REGULAR_EXPRESSION, not the broker's stderr


@functools.lru_cache(maxsize=256)
def _compiled(regex: str) -> Any:
    """The regex in RE2's syntax, as Kafka compiles it (RE2/J): no backreferences or
    lookaround, and matching in time linear in the topic name."""
    try:
        return re2.compile(regex, _RE2_OPTIONS)
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise InvalidRegularExpressionError(f"subscribed topic regex {regex!r} does not compile: {why}") from None


class ConsumerProtocolGroup:
    """One KIP-848 group at its coordinator: owns the group epoch, the target assignment and
    its epoch, and the members. Its manager applies each heartbeat to a `copy()` and keeps
    the copy once its `snapshot()` is written; pure and not thread-safe."""

    def __init__(self, group_id: str, session_timeout_ms: int) -> None:
        self.group_id = group_id
        self.session_timeout_ms = session_timeout_ms
        self.group_epoch = 0
        self.target_epoch = 0
        self.target: dict[str, frozenset[TopicPartition]] = {}
        self.members: dict[str, Member] = {}
        self._partition_counts: dict[str, int] = {}  # of the subscribed topics, at the last change

    def heartbeat(
        self,
        member_id: str,
        member_epoch: int,
        now_ms: int,
        partition_counts: Mapping[str, int],
        subscribed_topics: Iterable[str] | None = None,
        owned: Iterable[TopicPartition] | None = None,
        assignor: str | None = None,
        rebalance_timeout_ms: int = 300_000,
        subscribed_regex: str | None = None,
        instance_id: str | None = None,
        client_id: str = "",
        client_host: str = "",
        rack_id: str | None = None,
    ) -> HeartbeatAnswer:
        """One ConsumerGroupHeartbeat. `subscribed_topics` and `subscribed_regex` None:
        unchanged since the last heartbeat ("" clears the regex); `owned` None: not reported
        (taken to be everything it was given); `partition_counts`: every topic's partition
        count now."""
        if assignor is not None and assignor not in ASSIGNORS:
            raise UnsupportedAssignorError(f"server assignor {assignor!r} is not one of {sorted(ASSIGNORS)}")
        if subscribed_regex:
            _compiled(subscribed_regex)  # INVALID_REGULAR_EXPRESSION before anything changes
        if member_epoch == LEAVE_EPOCH:
            self._remove(self._known(member_id))
            return HeartbeatAnswer(member_id, LEAVE_EPOCH, None)
        if member_epoch == STATIC_LEAVE_EPOCH:
            return self._leave_for_now(self._known(member_id), instance_id, now_ms)
        if member_epoch == JOIN_EPOCH:
            member_id = member_id or str(uuid.uuid4())
            taken_over = self._static_predecessor(member_id, instance_id)
            if taken_over is not None:
                member, changed = self._updated(self._take_over(taken_over, member_id, now_ms), subscribed_topics,
                                                subscribed_regex, assignor)  # fmt: skip
            else:
                member, changed = self._join(member_id, subscribed_topics, subscribed_regex, assignor,
                                             rebalance_timeout_ms, instance_id, now_ms), True  # fmt: skip
        else:
            member = self._check_epoch(self._known(member_id), member_epoch, owned)
            member, changed = self._updated(member, subscribed_topics, subscribed_regex, assignor)
        member = dataclasses.replace(member, client_id=client_id or member.client_id,
                                     client_host=client_host or member.client_host, rack_id=rack_id or member.rack_id)  # fmt: skip
        self.members[member.member_id] = member
        if self._partition_counts_changed(partition_counts) or changed:
            self.group_epoch += 1  # once per heartbeat, whatever changed
        if self.target_epoch < self.group_epoch:
            self._compute_target(partition_counts)
        return self._reconcile(member.member_id, owned, now_ms)

    @property
    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if self.target_epoch < self.group_epoch:
            return GroupState.ASSIGNING
        if any(m.assignment.member_epoch != self.target_epoch or m.assignment.state is not MemberState.STABLE
               for m in self.members.values()):
            return GroupState.RECONCILING
        return GroupState.STABLE

    @property
    def assignor_name(self) -> str:
        names = {m.assignor for m in self.members.values() if m.assignor is not None}
        return min(names) if names else DEFAULT_ASSIGNOR  # Kafka: the most asked-for; ties alike

    def subscribed_topics(self) -> frozenset[str]:
        """Every topic some member subscribes to, by name or (as of the last change) by regex."""
        known = tuple(self._partition_counts)
        return frozenset(t for m in self.members.values() for t in m.subscription(known))

    def copy(self) -> ConsumerProtocolGroup:
        """A group to apply a heartbeat to, leaving this one as it is (members are frozen)."""
        twin = ConsumerProtocolGroup(self.group_id, self.session_timeout_ms)
        twin.group_epoch, twin.target_epoch = self.group_epoch, self.target_epoch
        twin.target, twin.members = dict(self.target), dict(self.members)
        twin._partition_counts = dict(self._partition_counts)
        return twin

    def snapshot(self) -> ConsumerGroupRecord:
        """What survives a coordinator move (consumer_group_records.py): all but heartbeat times."""
        return ConsumerGroupRecord(self.group_id, self.group_epoch, self.target_epoch, dict(self._partition_counts), tuple(
            ConsumerMemberRecord(
                m.member_id, m.instance_id, m.client_id, m.client_host, m.rack_id, tuple(sorted(m.subscribed_topics)),
                m.subscribed_regex, m.assignor, m.rebalance_timeout_ms, m.assignment.member_epoch,
                m.assignment.state.value, tuple(sorted(m.assignment.assigned)),
                tuple(sorted(m.assignment.pending_revocation)), tuple(sorted(self.target.get(m.member_id, ()))), m.away,
                m.classic.session_timeout_ms if m.classic else -1, m.classic.protocols if m.classic else (),
                m.assignment.previous_member_epoch,
            ) for m in sorted(self.members.values(), key=lambda m: m.member_id)
        ))  # fmt: skip

    @classmethod
    def restore(cls, record: ConsumerGroupRecord, session_timeout_ms: int, now_ms: int) -> ConsumerProtocolGroup:
        """The group a snapshot describes; its members' sessions (and revocations) count from now."""
        group = cls(record.group_id, session_timeout_ms)
        group.group_epoch, group.target_epoch = record.group_epoch, record.target_epoch
        group._partition_counts = dict(record.partition_counts)
        for m in record.members:
            state = MemberState(m.state)
            assignment = MemberAssignment(m.member_epoch, state, frozenset(map(tuple, m.assigned)),
                                          frozenset(map(tuple, m.pending_revocation)), m.previous_member_epoch)  # fmt: skip
            group.members[m.member_id] = Member(
                m.member_id, frozenset(m.subscribed_topics), m.assignor, m.rebalance_timeout_ms, assignment, now_ms,
                now_ms if state is MemberState.UNREVOKED_PARTITIONS else -1, m.subscribed_regex, m.instance_id, m.away,
                m.client_id, m.client_host, m.rack_id,
                ClassicMembership(m.classic_session_timeout_ms, m.classic_protocols) if m.classic_session_timeout_ms >= 0 else None,
            )  # fmt: skip
            group.target[m.member_id] = frozenset(map(tuple, m.target))
        return group

    def expire(self, now_ms: int) -> list[str]:
        """Removes the members past their session timeout, or past their rebalance timeout
        with partitions still to revoke; returns their ids."""
        gone = [
            m for m in self.members.values()
            if now_ms - m.last_heartbeat_ms > (m.classic.session_timeout_ms if m.classic else self.session_timeout_ms)
            or (m.revoking_since_ms >= 0 and now_ms - m.revoking_since_ms > m.rebalance_timeout_ms)
        ]  # fmt: skip
        for member in gone:
            self._remove(member)
        return [m.member_id for m in gone]

    # ------------------------------------------------------------------ classic members

    def classic_join(self, member_id: str, now_ms: int, partition_counts: Mapping[str, int],
                     subscribed_topics: Iterable[str], owned: Iterable[TopicPartition], rebalance_timeout_ms: int,
                     classic: ClassicMembership, instance_id: str | None = None, client_id: str = "",
                     client_host: str = "") -> HeartbeatAnswer:  # fmt: skip
        """A classic member's JoinGroup (`owned`: what its subscription says it still
        owns; nothing for an eager client, which revoked everything first). The answer's
        epoch is its generation."""
        member = self.members.get(member_id)
        if member is not None and member.classic is None:
            raise UnknownMemberIdError(f"member {member_id!r} of group {self.group_id!r} uses the consumer protocol")
        if member is None:
            holder = self._static_predecessor(member_id, instance_id, classic_restart=True)
            member = (self._take_over(holder, member_id, now_ms) if holder is not None else
                      Member(member_id, frozenset(), None, rebalance_timeout_ms, MemberAssignment(member_epoch=0), now_ms,
                             instance_id=instance_id))  # fmt: skip
            changed = holder is None
        else:
            changed = False
        member, updated = self._updated(member, subscribed_topics, None, None)
        self.members[member_id] = dataclasses.replace(member, classic=classic, rebalance_timeout_ms=rebalance_timeout_ms,
                                                      client_id=client_id or member.client_id,
                                                      client_host=client_host or member.client_host)  # fmt: skip
        if self._partition_counts_changed(partition_counts) or changed or updated:
            self.group_epoch += 1
        if self.target_epoch < self.group_epoch:
            self._compute_target(partition_counts)
        return self._reconcile(member_id, owned, now_ms)

    def classic_sync(self, member_id: str, generation: int, now_ms: int) -> frozenset[TopicPartition]:
        """A classic member's SyncGroup: its assigned partitions (REBALANCE_IN_PROGRESS if
        the group moved on since its join and it has nothing to revoke first)."""
        member = self._classic_member(member_id, generation, now_ms)
        if self.group_epoch > member.assignment.member_epoch and member.assignment.state is not MemberState.UNREVOKED_PARTITIONS:
            raise RebalanceInProgressError(f"group {self.group_id!r} moved on: member {member_id!r} must join again")
        return member.assignment.assigned

    def classic_heartbeat(self, member_id: str, generation: int, now_ms: int) -> None:
        """A classic member's Heartbeat: REBALANCE_IN_PROGRESS when it should join again
        (the group moved on, it must revoke, or partitions it waits for are free now)."""
        member = self._classic_member(member_id, generation, now_ms)
        a = member.assignment
        released = a.state is MemberState.UNRELEASED_PARTITIONS and any(
            self.owner_epoch(tp, member_id) == NOT_OWNED for tp in self.target.get(member_id, frozenset()) - a.assigned)
        if a.member_epoch < self.group_epoch or a.state is MemberState.UNREVOKED_PARTITIONS or released:
            raise RebalanceInProgressError(f"group {self.group_id!r}: member {member_id!r} must join again to move on")

    def classic_leave(self, member_id: str) -> None:
        member = self.members.get(member_id)
        if member is None or member.classic is None:
            raise UnknownMemberIdError(f"member {member_id!r} is not a classic member of group {self.group_id!r}")
        self._remove(member)

    def _classic_member(self, member_id: str, generation: int, now_ms: int) -> Member:
        member = self.members.get(member_id)
        if member is None or member.classic is None:
            raise UnknownMemberIdError(f"member {member_id!r} is not a classic member of group {self.group_id!r}")
        if generation != member.assignment.member_epoch:
            raise IllegalGenerationError(f"member {member_id!r} of group {self.group_id!r} is in generation "
                                         f"{member.assignment.member_epoch}, not {generation}")  # fmt: skip
        self.members[member_id] = dataclasses.replace(member, last_heartbeat_ms=now_ms)
        return member

    @classmethod
    def from_classic(cls, group_id: str, session_timeout_ms: int, generation: int, now_ms: int,
                     members: Iterable[tuple[Member, frozenset[TopicPartition]]]) -> ConsumerProtocolGroup:  # fmt: skip
        """A Stable classic group's members as classic members of a consumer-protocol group
        in its generation, each owning what it was assigned: the target until the group changes."""
        group = cls(group_id, session_timeout_ms)
        group.group_epoch = group.target_epoch = generation
        for member, assigned in members:
            group.members[member.member_id] = dataclasses.replace(
                member, assignment=MemberAssignment(generation, MemberState.STABLE, assigned), last_heartbeat_ms=now_ms)
            group.target[member.member_id] = assigned
        return group

    def owner_epoch(self, tp: TopicPartition, asking: str) -> int:
        """The epoch of the member (other than `asking`) that owns `tp`, or NOT_OWNED."""
        for member in self.members.values():
            if member.member_id != asking and tp in member.assignment.owned:
                return member.assignment.member_epoch
        return NOT_OWNED

    # ------------------------------------------------------------------ helpers

    def _known(self, member_id: str) -> Member:
        member = self.members.get(member_id)
        if member is None or member.classic is not None:  # (a classic member speaks JoinGroup and Heartbeat)
            raise UnknownMemberIdError(f"member {member_id!r} is not a consumer-protocol member of group {self.group_id!r}")
        return member

    def _join(self, member_id: str, subscribed_topics: Iterable[str] | None, subscribed_regex: str | None,
              assignor: str | None, rebalance_timeout_ms: int, instance_id: str | None, now_ms: int) -> Member:  # fmt: skip
        if subscribed_topics is None and not subscribed_regex:
            raise InvalidRequestError("a joining member must name its subscribed topics or a regex")
        old = self.members.get(member_id)
        if old is not None:  # it rejoins (fenced, or its answer was lost): it starts over, owning nothing
            self._remove(old)
        return Member(member_id, frozenset(subscribed_topics or ()), assignor, rebalance_timeout_ms,
                      MemberAssignment(member_epoch=0), now_ms, subscribed_regex=subscribed_regex or None,
                      instance_id=instance_id)  # fmt: skip

    def _updated(self, member: Member, subscribed_topics: Iterable[str] | None, subscribed_regex: str | None,
                 assignor: str | None) -> tuple[Member, bool]:  # fmt: skip
        """The member with what a heartbeat changed, and whether that is a group change."""
        changes: dict = {}
        if subscribed_topics is not None and frozenset(subscribed_topics) != member.subscribed_topics:
            changes["subscribed_topics"] = frozenset(subscribed_topics)
        if subscribed_regex is not None and (subscribed_regex or None) != member.subscribed_regex:
            changes["subscribed_regex"] = subscribed_regex or None
        if assignor is not None and assignor != member.assignor:
            changes["assignor"] = assignor
        return (dataclasses.replace(member, **changes), True) if changes else (member, False)

    def _static_predecessor(self, member_id: str, instance_id: str | None, classic_restart: bool = False) -> Member | None:
        """The member whose place a joining static member takes: one with its instance id
        that left for now, or (`classic_restart`) a classic one, which never says it
        leaves: its process restarted, as a classic group's static member does
        (UNRELEASED_INSTANCE_ID if neither)."""
        if instance_id is None:
            return None
        holder = next((m for m in self.members.values() if m.instance_id == instance_id), None)
        if holder is None or holder.member_id == member_id and not holder.away:
            return None
        if not holder.away and not (classic_restart and holder.classic is not None):
            raise UnreleasedInstanceIdError(
                f"instance id {instance_id!r} of group {self.group_id!r} is still held by member {holder.member_id!r}"
            )
        return holder

    def _take_over(self, holder: Member, member_id: str, now_ms: int) -> Member:
        """The joining static member in the place of `holder`: its assignment, its epoch and
        its part of the target; nothing moves."""
        del self.members[holder.member_id]
        target = self.target.pop(holder.member_id, None)
        if target is not None:
            self.target[member_id] = target
        return dataclasses.replace(holder, member_id=member_id, away=False, last_heartbeat_ms=now_ms)

    def _leave_for_now(self, member: Member, instance_id: str | None, now_ms: int) -> HeartbeatAnswer:
        if member.instance_id is None or instance_id not in (None, member.instance_id):
            raise InvalidRequestError(f"member {member.member_id!r} has no instance id {instance_id!r} to leave with epoch -2")
        self.members[member.member_id] = dataclasses.replace(member, away=True, last_heartbeat_ms=now_ms)
        return HeartbeatAnswer(member.member_id, STATIC_LEAVE_EPOCH, None)

    def _check_epoch(self, member: Member, member_epoch: int, owned: Iterable[TopicPartition] | None) -> Member:
        current = member.assignment.member_epoch
        if member_epoch == current:
            return member
        # The answer that moved it to `current` may be lost: the epoch it had before (only
        # that one, as Kafka) is fine while it owns nothing it has not been given since.
        previous = member.assignment.previous_member_epoch
        if owned is not None and member_epoch == previous < current and frozenset(owned) <= member.assignment.assigned:
            return member
        raise FencedMemberEpochError(
            f"member {member.member_id!r} of group {self.group_id!r} is in epoch {current}, not {member_epoch}: rejoin"
        )

    def _remove(self, member: Member) -> None:
        del self.members[member.member_id]
        self.target.pop(member.member_id, None)
        self.group_epoch += 1

    def _partition_counts_changed(self, partition_counts: Mapping[str, int]) -> bool:
        """Whether the subscribed topics, or their partition counts, differ from the last
        heartbeat's (a regex can match a topic created since)."""
        subscribed = {t for m in self.members.values() for t in m.subscription(partition_counts)}
        counts = {t: partition_counts[t] for t in subscribed if t in partition_counts}
        changed, self._partition_counts = counts != self._partition_counts, counts
        return changed

    def _compute_target(self, partition_counts: Mapping[str, int]) -> None:
        assign = ASSIGNORS[self.assignor_name]
        subscriptions = {m.member_id: m.subscription(partition_counts) for m in self.members.values()}
        current = {m.member_id: m.assignment.assigned for m in self.members.values()}
        self.target = assign(subscriptions, partition_counts, current)
        self.target_epoch = self.group_epoch

    def _reconcile(self, member_id: str, owned: Iterable[TopicPartition] | None, now_ms: int) -> HeartbeatAnswer:
        member = self.members[member_id]
        assignment = reconcile(member.assignment, self.target_epoch, self.target.get(member_id, frozenset()),
                               lambda tp: self.owner_epoch(tp, member_id), owned)  # fmt: skip
        revoking = assignment.state is MemberState.UNREVOKED_PARTITIONS
        since = (member.revoking_since_ms if member.revoking_since_ms >= 0 else now_ms) if revoking else -1
        self.members[member_id] = dataclasses.replace(member, assignment=assignment, last_heartbeat_ms=now_ms,
                                                      revoking_since_ms=since, away=False)  # fmt: skip
        return HeartbeatAnswer(member_id, assignment.member_epoch, assignment.assigned)
