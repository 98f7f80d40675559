"""ConsumerGroup: one group's membership, Kafka's classic rebalance protocol (GroupMetadata
plus the group half of GroupCoordinator), on an asyncio event loop.

States: EMPTY -> PREPARING_REBALANCE -> COMPLETING_REBALANCE -> STABLE, and back to
PREPARING_REBALANCE whenever membership changes (a member joins, leaves or times out).

- `join`: the member is (re)added and waits. The join phase ends when every known member
  has rejoined, or when the rebalance timeout (the largest of the members') passes, after
  which members that did not rejoin are dropped. A group that was empty also waits
  `group.initial.rebalance.delay.ms`, extended by each newcomer up to the rebalance
  timeout, so consumers starting together land in one generation. Then the generation
  grows by one, a protocol every member supports is chosen (by the members' preference
  votes, as Kafka does), the leader (the old one if it stayed, else the first to join)
  receives every member's metadata, and each `join` returns.
- `sync`: the leader sends the assignment of every member; each member's `sync` returns
  its own. Members whose leader has not synced yet wait.
- `heartbeat` keeps a member's session; during a rebalance it answers
  REBALANCE_IN_PROGRESS so the member rejoins.
- `expire(now)` drops members silent for longer than their session timeout.

Static membership (KIP-345): a member that joins with a `group.instance.id` is static. When
it restarts it joins with no member id and the same instance id, and takes the place of
its old member id: in a Stable group whose protocol does not change it gets its old
assignment back in the current generation, with no rebalance (the join answer names the
group's previous leader, so that it does not assign). Any call with an instance id that
maps to another member id is FENCED_INSTANCE_ID: the old process of a static member, or a
second process started with the same id, is fenced by the newer one. Static members leave
by their session timeout (clients do not send LeaveGroup for them), or by a LeaveGroup
that names their instance id.

A member waiting in `join` or `sync` counts as alive. Errors are `rayk.errors` types with
Kafka's names (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS, ...).
Not thread-safe: the owning actor's event loop calls it.
"""

from __future__ import annotations

import asyncio
import enum
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from rayk.errors import (
    FencedInstanceIdError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    KafkaError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)


class GroupState(enum.Enum):
    """A classic group's state in its rebalance cycle (Kafka's names, as DescribeGroups shows
    them); DEAD once its coordinator moved away, or for a group that does not exist."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class JoinResult:
    """What a JoinGroup answers one member: the new generation and chosen protocol, who leads,
    the member's own id, and, for the leader only, every member's metadata."""

    generation: int
    protocol: str | None
    leader_id: str
    member_id: str
    members: list[tuple[str, bytes]]  # every member's metadata, for the leader only


@dataclass(slots=True)
class Member:
    """One member of a classic group: its session and rebalance timeouts (ms), the protocols
    it offers, its last heartbeat (on the group's clock, s), its assignment, and the futures
    of its JoinGroup or SyncGroup while one waits."""

    member_id: str
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    last_heartbeat_s: float
    assignment: bytes = b""
    group_instance_id: str | None = None  # a static member's (KIP-345)
    join_waiter: asyncio.Future | None = None
    sync_waiter: asyncio.Future | None = None

    def metadata_for(self, protocol: str) -> bytes:
        return next(meta for name, meta in self.protocols if name == protocol)


@dataclass(slots=True)
class ConsumerGroup:
    """One classic group at its coordinator: owns its members, generation, state and the
    rebalance timer. Made by ClassicGroupManager (`new_group`) when a group is first joined
    or loaded, `close`d when the coordinator moves; not thread-safe (the coordinator's loop)."""

    group_id: str
    initial_rebalance_delay_ms: int = 3000
    clock_s: Callable[[], float] = time.monotonic
    on_stable: Callable[[ConsumerGroup], None] | None = None  # persist the new generation
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    # Wall-clock ms when the group last became empty (Kafka's currentStateTimestamp of an
    # Empty group): its offsets expire offsets.retention.minutes after (KIP-211).
    empty_since_ms: int | None = None
    _join_deadline_s: float = 0.0
    _initial_delay_deadline_s: float | None = None
    _timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ join

    async def join(
        self,
        member_id: str,
        client_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        group_instance_id: str | None = None,
    ) -> JoinResult:
        if not protocols or (self.members and protocol_type != self.protocol_type):
            raise InconsistentGroupProtocolError(
                f"group {self.group_id!r} uses protocol type {self.protocol_type!r}, not {protocol_type!r}"
            )
        if self.members and not self._supported_protocols() & {name for name, _ in protocols}:
            raise InconsistentGroupProtocolError(
                f"none of {[n for n, _ in protocols]} is supported by every member of {self.group_id!r}"
            )
        now = self.clock_s()
        if member_id:
            self.check_not_fenced(group_instance_id, member_id)
            member = self.members.get(member_id)
            if member is None:
                raise UnknownMemberIdError(f"member {member_id!r} is not in group {self.group_id!r}; join with no id")
            member.protocols, member.session_timeout_ms = list(protocols), session_timeout_ms
            member.rebalance_timeout_ms, member.last_heartbeat_s = rebalance_timeout_ms, now
        elif group_instance_id is not None and group_instance_id in self.static_members:
            previous_leader_id = self.leader_id
            member = self._replace_static_member(group_instance_id, client_id, session_timeout_ms, rebalance_timeout_ms,
                                                 protocols, now)  # fmt: skip
            if self.state is GroupState.STABLE and self._select_protocol() == self.protocol:
                if self.on_stable is not None:
                    self.on_stable(self)
                # The previous leader's id, not this member's: it must not assign (a Stable
                # group would not pass a new assignment on); its sync gets its old one.
                return JoinResult(self.generation, self.protocol, previous_leader_id, member.member_id, [])
        else:
            member_id = f"{group_instance_id or client_id or 'member'}-{uuid.uuid4()}"
            member = Member(member_id, client_id, session_timeout_ms, rebalance_timeout_ms, list(protocols), now,
                            group_instance_id=group_instance_id)  # fmt: skip
            self.members[member_id] = member
            if group_instance_id is not None:
                self.static_members[group_instance_id] = member_id
            if self._initial_delay_deadline_s is not None:  # newcomers extend the initial delay
                self._initial_delay_deadline_s = min(
                    now + self.initial_rebalance_delay_ms / 1000, self._join_deadline_s
                )
        self.protocol_type = protocol_type
        _fail(member.join_waiter, RebalanceInProgressError("superseded by a newer join"))
        member.join_waiter = asyncio.get_running_loop().create_future()
        waiter = member.join_waiter
        if self.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(now)
        self._maybe_complete_join()
        return await waiter

    def _replace_static_member(
        self,
        group_instance_id: str,
        client_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocols: list[tuple[str, bytes]],
        now: float,
    ) -> Member:
        """A static member's new process takes its old member id's place (Kafka's
        replaceStaticMember): the same assignment under a new member id, and the old
        one's waiting join or sync answered FENCED_INSTANCE_ID."""
        old = self.members.pop(self.static_members[group_instance_id])
        fenced = FencedInstanceIdError(f"instance {group_instance_id!r} of group {self.group_id!r} joined again")
        _fail(old.join_waiter, fenced)
        _fail(old.sync_waiter, fenced)
        member = Member(f"{group_instance_id}-{uuid.uuid4()}", client_id, session_timeout_ms, rebalance_timeout_ms,
                        list(protocols), now, assignment=old.assignment, group_instance_id=group_instance_id)  # fmt: skip
        self.members[member.member_id] = member
        self.static_members[group_instance_id] = member.member_id
        if self.leader_id == old.member_id:
            self.leader_id = member.member_id
        return member

    def check_not_fenced(self, group_instance_id: str | None, member_id: str) -> None:
        """FENCED_INSTANCE_ID when `group_instance_id` belongs to another member id (Kafka's
        isStaticMemberFenced): a newer process of that static member took over."""
        if group_instance_id is None:
            return
        current = self.static_members.get(group_instance_id)
        if current is not None and current != member_id:
            raise FencedInstanceIdError(
                f"member {member_id!r} of group {self.group_id!r} was fenced: instance {group_instance_id!r} is {current!r} now"
            )

    def _remove(self, member: Member) -> None:
        del self.members[member.member_id]
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member.member_id:
            del self.static_members[member.group_instance_id]

    def _prepare_rebalance(self, now: float) -> None:
        was_empty = self.state is GroupState.EMPTY
        for m in self.members.values():  # members waiting for an assignment must rejoin
            _fail(m.sync_waiter, RebalanceInProgressError(f"group {self.group_id!r} is rebalancing"))
            m.sync_waiter = None
        self.state = GroupState.PREPARING_REBALANCE
        self._join_deadline_s = now + max((m.rebalance_timeout_ms for m in self.members.values()), default=0) / 1000
        self._initial_delay_deadline_s = (
            min(now + self.initial_rebalance_delay_ms / 1000, self._join_deadline_s) if was_empty else None
        )
        self._schedule_check()

    def _schedule_check(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        deadline = self._join_deadline_s
        if self._initial_delay_deadline_s is not None:
            deadline = min(deadline, self._initial_delay_deadline_s)
        delay_s = max(0.0, deadline - self.clock_s())
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join()
            if self.state is GroupState.PREPARING_REBALANCE:
                self._schedule_check()

    def _maybe_complete_join(self) -> None:
        if self.state is not GroupState.PREPARING_REBALANCE:
            return
        now = self.clock_s()
        if self._initial_delay_deadline_s is not None and now < self._initial_delay_deadline_s:
            return
        everyone_joined = all(m.join_waiter is not None for m in self.members.values())
        if not everyone_joined and now < self._join_deadline_s:
            return
        for member in [m for m in self.members.values() if m.join_waiter is None]:
            self._remove(member)  # did not rejoin within the rebalance timeout
        self._complete_join()

    def _complete_join(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._initial_delay_deadline_s = None
        self.generation += 1
        if not self.members:
            self.state, self.protocol, self.leader_id, self.protocol_type = GroupState.EMPTY, None, None, None
            self.empty_since_ms = int(time.time() * 1000)
            if self.on_stable is not None:
                self.on_stable(self)
            return
        self.protocol = self._select_protocol()
        if self.leader_id not in self.members:
            self.leader_id = next(iter(self.members))
        self.state = GroupState.COMPLETING_REBALANCE
        everyone = [(m.member_id, m.metadata_for(self.protocol)) for m in self.members.values()]
        for m in self.members.values():
            result = JoinResult(
                self.generation,
                self.protocol,
                self.leader_id,
                m.member_id,
                everyone if m.member_id == self.leader_id else [],
            )
            waiter, m.join_waiter = m.join_waiter, None
            m.last_heartbeat_s = self.clock_s()
            if waiter is not None and not waiter.done():
                waiter.set_result(result)

    def _supported_protocols(self) -> set[str]:
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def _select_protocol(self) -> str:
        candidates = self._supported_protocols()
        if not candidates:
            raise InconsistentGroupProtocolError(f"the members of {self.group_id!r} share no protocol")
        votes = Counter(next(name for name, _ in m.protocols if name in candidates) for m in self.members.values())
        return max(sorted(candidates), key=lambda name: votes[name])

    def restore_stable(self, protocol_type: str | None, protocol: str | None, leader_id: str | None,
                       members: list[Member]) -> None:
        """Takes over a settled generation from the group's record (a new coordinator):
        its members, each with a fresh session, and their assignments, in state STABLE."""
        assert members and self.state is GroupState.EMPTY and not self.members, "only a new group is restored"
        self.state, self.protocol_type, self.protocol, self.leader_id = GroupState.STABLE, protocol_type, protocol, leader_id
        self.members = {m.member_id: m for m in members}
        self.static_members = {m.group_instance_id: m.member_id for m in members if m.group_instance_id is not None}

    def rebalance(self) -> None:
        """Starts a rebalance of a Stable group (one its coordinator just made of a
        consumer-protocol group's classic members): their heartbeats answer
        REBALANCE_IN_PROGRESS, and those that do not rejoin in time are dropped."""
        self._prepare_rebalance(self.clock_s())
        self._maybe_complete_join()

    # ------------------------------------------------------------------ sync, heartbeat, leave

    async def sync(
        self, generation: int, member_id: str, assignments: dict[str, bytes] | None, group_instance_id: str | None = None
    ) -> bytes:
        member = self._member_at(generation, member_id, group_instance_id)
        if self.state is GroupState.PREPARING_REBALANCE:
            raise RebalanceInProgressError(f"group {self.group_id!r} is rebalancing")
        member.last_heartbeat_s = self.clock_s()
        if self.state is GroupState.STABLE:
            return member.assignment
        if member_id == self.leader_id:
            for m in self.members.values():
                m.assignment = (assignments or {}).get(m.member_id, b"")
            self.state = GroupState.STABLE
            for m in self.members.values():
                waiter, m.sync_waiter = m.sync_waiter, None
                if waiter is not None and not waiter.done():
                    waiter.set_result(m.assignment)
            if self.on_stable is not None:
                self.on_stable(self)
            return member.assignment
        _fail(member.sync_waiter, RebalanceInProgressError("superseded by a newer sync"))
        member.sync_waiter = asyncio.get_running_loop().create_future()
        return await member.sync_waiter

    def heartbeat(self, generation: int, member_id: str, group_instance_id: str | None = None) -> None:
        member = self._member_at(generation, member_id, group_instance_id)
        member.last_heartbeat_s = self.clock_s()
        if self.state is GroupState.PREPARING_REBALANCE:
            raise RebalanceInProgressError(f"group {self.group_id!r} is rebalancing: rejoin")

    def leave(self, member_id: str, group_instance_id: str | None = None) -> None:
        """Removes the member named by its id, or by its instance id (LeaveGroup v3+ may
        name a static member by its instance id alone, with an empty member id)."""
        if group_instance_id is not None:
            if member_id:
                self.check_not_fenced(group_instance_id, member_id)
            member_id = self.static_members.get(group_instance_id, "")
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"member {member_id or group_instance_id!r} is not in group {self.group_id!r}")
        self._remove(member)
        self._membership_changed([member])

    def expire(self) -> list[str]:
        """Drops members whose session timed out; returns their ids."""
        now = self.clock_s()
        expired = [
            m
            for m in self.members.values()
            if m.join_waiter is None
            and m.sync_waiter is None
            and now - m.last_heartbeat_s > m.session_timeout_ms / 1000
        ]
        for m in expired:
            self._remove(m)
        if expired:
            self._membership_changed(expired)
        return [m.member_id for m in expired]

    def _membership_changed(self, gone: list[Member]) -> None:
        for m in gone:
            _fail(m.join_waiter, UnknownMemberIdError(f"member {m.member_id!r} left the group"))
            _fail(m.sync_waiter, UnknownMemberIdError(f"member {m.member_id!r} left the group"))
        if self.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join()
        elif self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(self.clock_s())
            self._maybe_complete_join()

    def check_commit(self, generation: int, member_id: str, group_instance_id: str | None = None) -> None:
        """Whether an offset commit from this member and generation may be stored (Kafka's rules)."""
        if generation < 0 and not member_id:
            if self.members:
                raise UnknownMemberIdError(
                    f"group {self.group_id!r} has active members; commit as a member (with its generation)"
                )
            return
        self._member_at(generation, member_id, group_instance_id)
        if self.state is GroupState.COMPLETING_REBALANCE:
            raise RebalanceInProgressError(f"group {self.group_id!r} is rebalancing")

    def _member_at(self, generation: int, member_id: str, group_instance_id: str | None = None) -> Member:
        self.check_not_fenced(group_instance_id, member_id)
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"member {member_id!r} is not in group {self.group_id!r}")
        if generation != self.generation:
            raise IllegalGenerationError(
                f"generation {generation} is not group {self.group_id!r}'s current generation {self.generation}"
            )
        return member

    def close(self) -> None:
        """The coordinator moved: every waiting member is told to find the new one."""
        for m in self.members.values():
            _fail(m.join_waiter, NotCoordinatorError("the group coordinator moved"))
            _fail(m.sync_waiter, NotCoordinatorError("the group coordinator moved"))
        if self._timer is not None:
            self._timer.cancel()
        self.state = GroupState.DEAD


def _fail(waiter: asyncio.Future | None, error: KafkaError) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_exception(error)
