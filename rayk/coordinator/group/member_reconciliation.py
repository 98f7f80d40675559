"""Member reconciliation of KIP-848's consumer group protocol (Kafka's
CurrentAssignmentBuilder), as a pure function.

In the consumer protocol the group coordinator, not a leader member, owns the assignment.
Every change of the group (a member joins, leaves, changes its subscription; a topic
gains partitions) bumps the group epoch, and the server-side assignor
(rayk.coordinator.group.server_assignors) computes a target assignment for that epoch. Each member
then moves from what it owns towards its target, one heartbeat at a time, without a
stop-the-world barrier: a partition is handed to its new owner only once the old one has
said (in a heartbeat's owned partitions) that it let it go. So no partition ever has two
owners, and a member whose partitions do not move keeps consuming throughout.

A member's state, as Kafka names them:
- STABLE: it owns its target of `member_epoch`.
- UNREVOKED_PARTITIONS: it must give up `pending_revocation` first; it stays in its epoch
  until a heartbeat no longer lists any of them as owned.
- UNRELEASED_PARTITIONS: it is in the target epoch, but some of its target partitions are
  still owned by another member (they are assigned once released).

`reconcile(member, target_epoch, target, owner_epoch, owned)` is one heartbeat's step:
- `target`: the member's partitions in the group's target assignment of `target_epoch`;
- `owner_epoch(tp)`: the epoch of the member that currently owns `tp` (has it assigned or
  pending revocation), or -1 when nobody does; the caller excludes the member itself;
- `owned`: the partitions the heartbeat says the member owns (None when the request did
  not say, which counts as still owning everything).
It returns the member's next state (the same object when nothing moves). Partitions are
any hashable key, (topic id, partition) in the coordinator.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Hashable

Partition = Hashable
NOT_OWNED = -1
NO_EPOCH = -1


class MemberState(enum.Enum):
    """Where a consumer-protocol member stands in moving to its target assignment: there, still
    to revoke partitions, or waiting for partitions other members have yet to release."""

    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass(frozen=True, slots=True)
class MemberAssignment:
    """A member's reconciliation state: its epoch (and the one before it, NO_EPOCH if
    none), what it is told it owns, and what it must give up before it moves on."""

    member_epoch: int
    state: MemberState = MemberState.STABLE
    assigned: frozenset[Partition] = frozenset()
    pending_revocation: frozenset[Partition] = frozenset()
    previous_member_epoch: int = NO_EPOCH

    def __post_init__(self) -> None:
        assert not (self.assigned & self.pending_revocation), "a partition is kept or revoked, not both"
        assert self.state is MemberState.UNREVOKED_PARTITIONS or not self.pending_revocation, self

    @property
    def owned(self) -> frozenset[Partition]:
        """What the member may still be consuming: no other member gets these."""
        return self.assigned | self.pending_revocation


def reconcile(
    member: MemberAssignment,
    target_epoch: int,
    target: Iterable[Partition],
    owner_epoch: Callable[[Partition], int],
    owned: Iterable[Partition] | None,
) -> MemberAssignment:
    """The member's state after one heartbeat (see the module docstring)."""
    target = frozenset(target)
    reported = None if owned is None else frozenset(owned)
    if member.state is MemberState.STABLE:
        if member.member_epoch == target_epoch:
            return member
        return _next(member, member.member_epoch, target_epoch, target, owner_epoch, reported)
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if _still_owns(reported, member.pending_revocation):
            return member
        # Revoked: it moves to the next epoch and towards the latest target.
        return _next(member, member.member_epoch + 1, target_epoch, target, owner_epoch, reported)
    return _next(member, member.member_epoch, target_epoch, target, owner_epoch, reported)


def _next(
    member: MemberAssignment,
    member_epoch: int,
    target_epoch: int,
    target: frozenset[Partition],
    owner_epoch: Callable[[Partition], int],
    reported: frozenset[Partition] | None,
) -> MemberAssignment:
    def moved_to(epoch: int) -> int:
        """The epoch before `epoch`: the member's, if it moves on, or the one it had."""
        return member.member_epoch if epoch != member.member_epoch else member.previous_member_epoch

    kept = member.assigned & target
    to_revoke = member.assigned - target
    wanted = target - kept
    unreleased = frozenset(tp for tp in wanted if owner_epoch(tp) != NOT_OWNED)
    to_assign = wanted - unreleased
    if to_revoke and _still_owns(reported, to_revoke):
        # Revoke first, in the current epoch: nothing new until the member lets them go.
        return dataclasses.replace(member, member_epoch=member_epoch, state=MemberState.UNREVOKED_PARTITIONS,
                                   assigned=kept, pending_revocation=to_revoke,
                                   previous_member_epoch=moved_to(member_epoch))  # fmt: skip
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return dataclasses.replace(member, member_epoch=target_epoch, state=state, assigned=kept | to_assign,
                               pending_revocation=frozenset(), previous_member_epoch=moved_to(target_epoch))  # fmt: skip


def _still_owns(reported: frozenset[Partition] | None, partitions: frozenset[Partition]) -> bool:
    """Whether the heartbeat's owned partitions include any of `partitions` (a heartbeat
    that did not list them is taken to own everything)."""
    return reported is None or bool(reported & partitions)
