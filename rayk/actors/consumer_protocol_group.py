"""ConsumerProtocolGroup: one group of KIP-848's consumer protocol at its coordinator, and what a
ConsumerGroupHeartbeat does to it, as pure state (no I/O, no clock of its own).

The group epoch counts the group's changes: a member joins or leaves, changes its
subscribed topics or its assignor, or a subscribed topic gains partitions. Whenever the
group epoch is ahead of the target assignment's epoch, the next heartbeat has the
server-side assignor (rayk.actors.server_assignors, `uniform` unless the members name
another) compute the target for the group epoch. Every heartbeat then reconciles its
member towards its part of the target (rayk.actors.member_reconciliation): partitions
move one member at a time, only once released, with no group-wide barrier.

A heartbeat's `member_epoch` says who is asking, as in Kafka:
- 0: a member joining (with the member id the client made, KIP-1082, or none: one is
  made here);
- -1: the member leaving (its partitions are free at once);
- the member's current epoch, or the epoch before it when the member reports owning no
  partition it no longer has (a lost answer), for a member in the group;
- anything else is FENCED_MEMBER_EPOCH (the member must rejoin with epoch 0 and no
  partitions), and an unknown member id UNKNOWN_MEMBER_ID.
A member that sends no heartbeat for its session timeout, or keeps partitions it must
revoke past its rebalance timeout, is removed (`expire`), which frees its partitions.

Not thread-safe. Not yet hosted by a coordinator, persisted, or reachable through the
wire protocol (the classic protocol's groups are rayk.actors.consumer_group).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rayk.actors.member_reconciliation import NOT_OWNED, MemberAssignment, MemberState, reconcile
from rayk.actors.server_assignors import ASSIGNORS, TopicPartition
from rayk.errors import FencedMemberEpochError, InvalidRequestError, UnknownMemberIdError, UnsupportedAssignorError

JOIN_EPOCH, LEAVE_EPOCH = 0, -1
DEFAULT_ASSIGNOR = "uniform"


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    subscribed_topics: frozenset[str]
    assignor: str | None  # the server assignor the member asked for, if any
    rebalance_timeout_ms: int
    assignment: MemberAssignment
    last_heartbeat_ms: int
    revoking_since_ms: int = -1  # when it entered UNREVOKED_PARTITIONS


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    member_id: str
    member_epoch: int
    assignment: frozenset[TopicPartition] | None  # None: the member left


class ConsumerProtocolGroup:
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
    ) -> HeartbeatAnswer:
        """One ConsumerGroupHeartbeat. `subscribed_topics` None: unchanged since the last
        heartbeat; `owned` None: not reported (taken to be everything it was given);
        `partition_counts`: every topic's partition count now."""
        if assignor is not None and assignor not in ASSIGNORS:
            raise UnsupportedAssignorError(f"server assignor {assignor!r} is not one of {sorted(ASSIGNORS)}")
        if member_epoch == LEAVE_EPOCH:
            self._remove(self._known(member_id))
            return HeartbeatAnswer(member_id, LEAVE_EPOCH, None)
        if member_epoch == JOIN_EPOCH:
            member = self._join(member_id or str(uuid.uuid4()), subscribed_topics, assignor, rebalance_timeout_ms, now_ms)
            changed = True
        else:
            member = self._check_epoch(self._known(member_id), member_epoch, owned)
            changed = False
            if subscribed_topics is not None and frozenset(subscribed_topics) != member.subscribed_topics:
                member, changed = dataclasses.replace(member, subscribed_topics=frozenset(subscribed_topics)), True
            if assignor is not None and assignor != member.assignor:
                member, changed = dataclasses.replace(member, assignor=assignor), True
        self.members[member.member_id] = member
        if self._partition_counts_changed(partition_counts) or changed:
            self.group_epoch += 1  # once per heartbeat, whatever changed
        if self.target_epoch < self.group_epoch:
            self._compute_target(partition_counts)
        return self._reconcile(member.member_id, owned, now_ms)

    def expire(self, now_ms: int) -> list[str]:
        """Removes the members past their session timeout, or past their rebalance timeout
        with partitions still to revoke; returns their ids."""
        gone = [
            m for m in self.members.values()
            if now_ms - m.last_heartbeat_ms > self.session_timeout_ms
            or (m.revoking_since_ms >= 0 and now_ms - m.revoking_since_ms > m.rebalance_timeout_ms)
        ]  # fmt: skip
        for member in gone:
            self._remove(member)
        return [m.member_id for m in gone]

    def owner_epoch(self, tp: TopicPartition, asking: str) -> int:
        """The epoch of the member (other than `asking`) that owns `tp`, or NOT_OWNED."""
        for member in self.members.values():
            if member.member_id != asking and tp in member.assignment.owned:
                return member.assignment.member_epoch
        return NOT_OWNED

    # ------------------------------------------------------------------ helpers

    def _known(self, member_id: str) -> Member:
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"member {member_id!r} is not in group {self.group_id!r}")
        return member

    def _join(self, member_id: str, subscribed_topics: Iterable[str] | None, assignor: str | None,
              rebalance_timeout_ms: int, now_ms: int) -> Member:  # fmt: skip
        if subscribed_topics is None:
            raise InvalidRequestError("a joining member must name its subscribed topics")
        old = self.members.get(member_id)
        if old is not None:  # it rejoins (fenced, or its answer was lost): it starts over, owning nothing
            self._remove(old)
        return Member(member_id, frozenset(subscribed_topics), assignor, rebalance_timeout_ms,
                      MemberAssignment(member_epoch=0), now_ms)  # fmt: skip

    def _check_epoch(self, member: Member, member_epoch: int, owned: Iterable[TopicPartition] | None) -> Member:
        current = member.assignment.member_epoch
        if member_epoch == current:
            return member
        # The answer that moved it to `current` may be lost: the epoch before is fine while
        # it owns nothing it has not been given since.
        if owned is not None and member_epoch < current and frozenset(owned) <= member.assignment.assigned:
            return member
        raise FencedMemberEpochError(
            f"member {member.member_id!r} of group {self.group_id!r} is in epoch {current}, not {member_epoch}: rejoin"
        )

    def _remove(self, member: Member) -> None:
        del self.members[member.member_id]
        self.target.pop(member.member_id, None)
        self.group_epoch += 1

    def _partition_counts_changed(self, partition_counts: Mapping[str, int]) -> bool:
        """Whether a subscribed topic's partition count differs from the last heartbeat's."""
        subscribed = {t for m in self.members.values() for t in m.subscribed_topics}
        counts = {t: partition_counts[t] for t in subscribed if t in partition_counts}
        changed, self._partition_counts = counts != self._partition_counts, counts
        return changed

    def _compute_target(self, partition_counts: Mapping[str, int]) -> None:
        names = {m.assignor for m in self.members.values() if m.assignor is not None}
        assign = ASSIGNORS[min(names) if names else DEFAULT_ASSIGNOR]  # Kafka: the most asked-for; ties alike
        subscriptions = {m.member_id: m.subscribed_topics for m in self.members.values()}
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
                                                      revoking_since_ms=since)  # fmt: skip
        return HeartbeatAnswer(member_id, assignment.member_epoch, assignment.assigned)
