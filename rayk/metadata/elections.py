"""Who leads a partition and who is in sync: the Controller's rules for one partition
(pure functions over `PartitionState`; no I/O, no Ray).

Kafka's rules, plus KIP-966's for replicas whose log may have lost its unflushed tail.
Words used below, each about one broker and one partition:

- *live*: the broker is not fenced in the metadata.
- *attached*: the broker registered with this Controller session. After a Controller
  restart every broker of the replayed metadata is live but none is attached until it
  registers again, and until then nothing is known of its replicas: it may be running
  with its state intact, or about to come back from a crash.
- *recovering*: the replica restarted without a clean shutdown (no clean-shutdown
  marker: its unflushed tail may be gone) or on a freshly formatted, empty data
  directory. It may not lead, and leaves the ISR, until it has caught up from a leader
  and that leader has added it to the ISR again (AlterPartition clears the mark).
- *sound*: an ISR member that is live and not recovering, so it holds every committed
  record.
- *ready*: sound, attached and available (its replica process is not being re-created).
- *eligible* (KIP-966's ELR): out of the ISR, yet holding every committed record. While
  the ISR is smaller than min.insync.replicas a leader's high watermark stands still
  (the strict min ISR rule, `LeaderReplicaState`), so a replica that leaves an ISR
  already or thereby below that size keeps everything committed: `track_eligible`
  moves it to the ELR, and the ELR empties once the ISR is big enough again.

Rules, applied by `reconcile`:
1. The ISR drops its fenced, recovering and unavailable members only while a ready
   member remains. Never in favour of replicas whose state is unknown: as long as no
   replica is known to hold every committed record, the ISR keeps naming every replica
   that may hold the only copy.
2. A sound leader stays, unless its replica restarted or failed: then leadership is
   decided again, in a new leader epoch, even if the same broker is chosen.
3. A restarted leader that is ready (back from a clean shutdown, so it holds every
   record it led) leads again, in a new epoch: a whole-cluster restart keeps its
   leaders whatever order the brokers register in. Otherwise a new leader is the first
   replica, in assignment order, that is ready. A failed or restarted leader that is
   the only replica with the data leads again (new epoch).
   Else an eligible replica that is live, attached, available and not recovering leads
   alone (KIP-966: the ISR's members may all be gone for good).
4. Otherwise the partition is leaderless and its ISR is kept whole. When every live ISR
   and ELR member is attached and recovering (every copy restarted uncleanly: a
   whole-cluster crash), `copies_to_compare` names them; the Controller compares their logs and
   `recover_uncleanly` elects the one with the latest leader epoch and the longest log
   (KIP-966's unclean recovery, waiting for every member as its Balanced strategy does,
   but only until a missing one is fenced: a node that never returns must not keep the
   partition offline for good).
   `unclean.leader.election.enable` instead elects any live attached replica at once,
   losing what it lacks, as in Kafka.
5. The leader epoch grows whenever the leader changes or is elected again; the
   partition epoch grows with every change.

Reassignment (KIP-455) keeps the replicas being added and removed in the state:
`start_reassignment` makes the replica set target + removing, `finish_reassignment`
completes once every target replica is in the ISR, `cancel_reassignment` reverts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rayk.errors import ElectionNotNeededError, EligibleLeadersNotAvailableError, PreferredLeaderNotAvailableError

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition's leadership state as the Controller stores it (a PartitionRecord's
    fields): replicas in assignment order, ISR, leader (NO_LEADER if none) and epochs, plus
    the KIP-966 and reassignment sets. Immutable; `check` asserts its invariants."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]  # empty only while leaderless, when every in-sync copy was lost
    leader: int
    leader_epoch: int
    partition_epoch: int
    recovering: tuple[int, ...] = ()  # replicas that must catch up before they may lead
    adding: tuple[int, ...] = ()  # a reassignment's new replicas (KIP-455)
    removing: tuple[int, ...] = ()  # and the replicas it will drop
    eligible: tuple[int, ...] = ()  # KIP-966's ELR: out of the ISR, but holding every committed record

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """The replicas the partition will have once its reassignment (if any) completes."""
        return tuple(r for r in self.replicas if r not in self.removing)

    def check(self) -> None:
        """Asserts the invariants every stored state satisfies."""
        replicas = set(self.replicas)
        assert len(replicas) == len(self.replicas), f"replicas {self.replicas} repeat a broker"
        assert set(self.isr) <= replicas, f"ISR {self.isr} within replicas {self.replicas}"
        assert self.isr or self.leader == NO_LEADER, f"an empty ISR only while leaderless: {self}"
        assert self.leader == NO_LEADER or self.leader in self.isr, f"leader {self.leader} in ISR {self.isr}"
        assert set(self.recovering) <= replicas and set(self.adding) <= replicas and set(self.removing) <= replicas
        assert not set(self.adding) & set(self.removing), f"adding {self.adding} and removing {self.removing} overlap"
        assert set(self.eligible) <= replicas, f"ELR {self.eligible} within replicas {self.replicas}"
        assert not set(self.eligible) & set(self.isr), f"ELR {self.eligible} outside ISR {self.isr}"
        assert self.target_replicas, f"a reassignment keeps at least one replica: {self}"


def successor(old: PartitionState, new: PartitionState, new_leader_epoch: bool = False) -> PartitionState | None:
    """`new` as the state that follows `old`: its epochs are old's, bumped (the partition
    epoch always, the leader epoch if the leader changed or `new_leader_epoch`); None if
    nothing changed."""
    new = replace(new, leader_epoch=old.leader_epoch, partition_epoch=old.partition_epoch)
    if new == old and not new_leader_epoch:
        return None
    bump = new_leader_epoch or new.leader != old.leader
    return replace(new, leader_epoch=old.leader_epoch + (1 if bump else 0), partition_epoch=old.partition_epoch + 1)


def track_eligible(old: PartitionState, new: PartitionState, min_insync_replicas: int) -> PartitionState:
    """`new` with KIP-966's ELR kept: empty while the ISR holds at least min.insync.replicas
    (capped at the replica count, as Kafka's effective min ISR is) and after an unclean
    election; else `new`'s ELR plus the replicas that just left the ISR."""
    if len(new.isr) >= min(min_insync_replicas, len(new.replicas)):
        eligible: tuple[int, ...] = ()
    elif new.leader != NO_LEADER and new.leader not in old.isr and new.leader not in old.eligible:
        eligible = ()  # unclean: no other replica is known to hold what the new leader holds
    else:
        left = set(old.isr) - set(new.isr)
        eligible = tuple(r for r in new.replicas if (r in new.eligible or r in left) and r not in new.isr)
    return new if eligible == new.eligible else replace(new, eligible=eligible)


def reconcile(
    state: PartitionState,
    live: set[int],
    attached: set[int],
    unclean_allowed: bool,
    restarted: Iterable[int] = (),
    unavailable: Iterable[int] = (),
) -> PartitionState | None:
    """The state once rules 1-3 hold for who is live, attached, recovering; None if
    nothing changes. `restarted`: brokers whose replica lost its in-memory state (a new
    broker incarnation); `unavailable`: brokers whose replica process died and is being
    re-created from its log on disk."""
    restarted, unavailable = set(restarted), set(unavailable)

    def is_ready(r: int) -> bool:
        return r in live and r not in state.recovering and r in attached and r not in unavailable

    sound = [r for r in state.isr if r in live and r not in state.recovering]
    ready = [r for r in sound if is_ready(r)]
    isr = tuple(r for r in sound if r not in unavailable) if ready else state.isr
    leader = state.leader
    decide = leader == NO_LEADER or leader not in sound or leader in unavailable or leader in restarted
    recovering, eligible = state.recovering, state.eligible
    if decide:
        candidates = [r for r in state.replicas if r in ready]
        if leader in restarted and leader in candidates:
            pass  # back from a clean shutdown, it holds every record it led: it leads again, in a new epoch
        elif candidates:
            leader = candidates[0]
        elif leader in sound and leader in attached:
            pass  # the failed or restarted leader is the only copy: it leads again, in a new epoch
        elif eligible_ready := [r for r in state.replicas if r in state.eligible and is_ready(r)]:
            leader, isr = eligible_ready[0], (eligible_ready[0],)  # KIP-966: it holds every committed record
            eligible = tuple(r for r in eligible if r != leader)
        elif (
            unclean_allowed
            and not any(r in live for r in (*state.isr, *state.eligible))  # as in Kafka: only once none of them lives
            and (alive := [r for r in state.replicas if r in live and r in attached])
        ):
            leader, isr, eligible = alive[0], (alive[0],), ()
            recovering = tuple(r for r in recovering if r != leader)
        else:
            leader = NO_LEADER
    new = replace(state, isr=isr, leader=leader, recovering=recovering, eligible=eligible)
    return successor(state, new, new_leader_epoch=decide and leader != NO_LEADER)


def elect_preferred(state: PartitionState, live: set[int], attached: set[int]) -> PartitionState:
    """Preferred leader election (KIP-460 PREFERRED): the first target replica, the one a
    topic's placement spread leadership by, leads again in a new epoch. Only a sound
    (live, in sync, not recovering) attached replica may: else
    PREFERRED_LEADER_NOT_AVAILABLE; if it already leads, ELECTION_NOT_NEEDED."""
    preferred = state.target_replicas[0]
    if state.leader == preferred:
        raise ElectionNotNeededError(f"broker {preferred}, the preferred replica, already leads")
    if preferred not in state.isr or preferred not in live or preferred not in attached or preferred in state.recovering:
        raise PreferredLeaderNotAvailableError(
            f"broker {preferred}, the preferred replica, is not a live in-sync replica (ISR {list(state.isr)})"
        )
    new = successor(state, replace(state, leader=preferred), new_leader_epoch=True)
    assert new is not None and new.leader in new.isr
    return new


def elect_unclean(state: PartitionState, live: set[int], attached: set[int]) -> PartitionState:
    """Unclean leader election (KIP-460 UNCLEAN) of a leaderless partition: as rule 3 with
    `unclean.leader.election.enable`, asked for once. ELECTION_NOT_NEEDED if the partition
    has a leader; ELIGIBLE_LEADERS_NOT_AVAILABLE if no replica may lead."""
    if state.leader != NO_LEADER:
        raise ElectionNotNeededError(f"broker {state.leader} leads")
    new = reconcile(state, live, attached, unclean_allowed=True)
    if new is None or new.leader == NO_LEADER:
        raise EligibleLeadersNotAvailableError(f"no live replica of {list(state.replicas)} can lead")
    return new


def imbalanced(partitions: Iterable[tuple[Any, PartitionState]], max_ratio: float) -> list[Any]:
    """Kafka's auto leader rebalance: for each broker, the share of the partitions it is
    the preferred leader of that another broker leads; the keys of those partitions,
    for every broker whose share is over `max_ratio`."""
    preferred_of: dict[int, list[tuple[Any, bool]]] = {}
    for key, state in partitions:
        preferred = state.target_replicas[0]
        preferred_of.setdefault(preferred, []).append((key, state.leader != preferred))
    out = []
    for entries in preferred_of.values():
        moved = [key for key, is_moved in entries if is_moved]
        if len(moved) / len(entries) > max_ratio:
            out.extend(moved)
    return out


def mark_recovering(state: PartitionState, broker_id: int, data_lost: bool) -> PartitionState:
    """An ISR member that restarted without a clean shutdown becomes recovering. With
    `data_lost` (its data directory was found empty and formatted anew) it leaves the ISR
    at once instead, even if that empties it: an empty log can never be the copy to keep.
    An ELR member is marked the same way, or with `data_lost` leaves the ELR. A replica in
    neither needs no mark: it has to catch up to rejoin anyway."""
    if broker_id not in state.isr and broker_id not in state.eligible:
        return state
    if data_lost:
        isr = tuple(r for r in state.isr if r != broker_id)
        eligible = tuple(r for r in state.eligible if r != broker_id)
        return replace(state, isr=isr, eligible=eligible, leader=state.leader if state.leader in isr else NO_LEADER)
    if broker_id in state.recovering:
        return state
    return replace(state, recovering=(*state.recovering, broker_id))


def copies_to_compare(state: PartitionState, live: set[int], attached: set[int]) -> tuple[int, ...]:
    """The ISR and ELR members whose logs decide a leaderless partition (rule 4): every
    live one, once each is back (attached) but recovering and no sound member lives; ()
    otherwise.

    A fenced member is not waited for: its broker's session expired
    (broker.session.timeout.ms, counted from the Controller's start after a restart), and
    a node that never returns would otherwise keep the partition offline for good. Kafka
    elects among its live ISR the same way; what only the lost member held is lost, as
    it is when a disk fails."""
    if state.leader != NO_LEADER or not state.isr:
        return ()
    live_members = tuple(r for r in state.replicas if (r in state.isr or r in state.eligible) and r in live)
    if not live_members or not all(r in attached and r in state.recovering for r in live_members):
        return ()
    return live_members


def needs_log_comparison(state: PartitionState, live: set[int], attached: set[int]) -> bool:
    """Only comparing logs can tell which copy to keep (see `copies_to_compare`)."""
    return bool(copies_to_compare(state, live, attached))


@dataclass(frozen=True, slots=True)
class LogEnd:
    """What a replica reports of its log for an unclean recovery."""

    latest_epoch: int
    log_end_offset: int


def choose_by_log(state: PartitionState, copies: Sequence[int], ends: dict[int, LogEnd]) -> int:
    """Of `copies` (ISR and ELR members), the one whose log is the most complete: latest
    leader epoch, then longest log, then assignment order. `ends` must cover `copies`."""
    members = set(state.isr) | set(state.eligible)
    assert copies and set(copies) <= members, f"copies {copies} within the ISR {state.isr} and ELR {state.eligible}"
    assert set(copies) <= set(ends), f"log ends {sorted(ends)} do not cover the copies {copies}"
    order = {r: i for i, r in enumerate(state.replicas)}
    return max(copies, key=lambda r: (ends[r].latest_epoch, ends[r].log_end_offset, -order[r]))


def recover_uncleanly(state: PartitionState, chosen: int) -> PartitionState:
    """Rule 4's election: `chosen` leads alone, the other copies catch up from it."""
    assert (chosen in state.isr or chosen in state.eligible) and state.leader == NO_LEADER, (chosen, state)
    new = replace(state, leader=chosen, isr=(chosen,), recovering=tuple(r for r in state.recovering if r != chosen),
                  eligible=tuple(r for r in state.eligible if r != chosen))
    changed = successor(state, new, new_leader_epoch=True)
    assert changed is not None
    return changed


# ---------------------------------------------------------------------------- reassignment


def start_reassignment(state: PartitionState, target: Sequence[int]) -> PartitionState | None:
    """Begins moving the partition to `target` (KIP-455): the replica set becomes target
    plus the replicas to remove; the new ones follow and catch up. A reassignment already
    under way is replaced, as in KRaft, from the whole current replica set: replicas the
    earlier one was adding may already be the only in-sync copies, so they too stay
    until the new target is in sync."""
    original = list(state.replicas)
    target = tuple(target)
    adding = tuple(r for r in target if r not in original)
    removing = tuple(r for r in original if r not in target)
    replicas = target + removing
    isr = tuple(r for r in state.isr if r in replicas)
    leader = state.leader if state.leader in isr else NO_LEADER
    recovering = tuple(r for r in state.recovering if r in replicas)
    new = replace(state, replicas=replicas, isr=isr, leader=leader, recovering=recovering, adding=adding, removing=removing)
    return successor(state, new, new_leader_epoch=False)


def finish_reassignment(state: PartitionState, live: set[int], attached: set[int]) -> PartitionState | None:
    """Completes a reassignment whose target replicas are all in the ISR: the removed
    replicas go, and a leader among them is replaced (new epoch). None if not yet."""
    if not (state.adding or state.removing):
        return None
    target = state.target_replicas
    if not set(target) <= set(state.isr):
        return None
    isr = tuple(r for r in state.isr if r in target)
    leader = state.leader
    if leader not in target:
        ready = [r for r in target if r in live and r in attached and r not in state.recovering]
        leader = ready[0] if ready else NO_LEADER
    recovering = tuple(r for r in state.recovering if r in target)
    new = replace(state, replicas=target, isr=isr, leader=leader, recovering=recovering, adding=(), removing=())
    return successor(state, new, new_leader_epoch=False)


def cancel_reassignment(state: PartitionState, live: set[int], attached: set[int], unclean_allowed: bool) -> PartitionState | None:
    """Reverts to the replicas before the reassignment; None if none is under way."""
    if not (state.adding or state.removing):
        return None
    original = tuple(r for r in state.replicas if r not in state.adding)
    isr = tuple(r for r in state.isr if r in original)
    leader = state.leader if state.leader in isr else NO_LEADER
    recovering = tuple(r for r in state.recovering if r in original)
    reverted = replace(state, replicas=original, isr=isr, leader=leader, recovering=recovering, adding=(), removing=())
    if not isr:  # only the new replicas were in sync: keep them until they catch the rest up
        return None
    elected = reconcile(reverted, live, attached, unclean_allowed) or reverted
    return successor(state, elected, new_leader_epoch=False)
