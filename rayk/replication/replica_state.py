"""LeaderReplicaState: what a partition leader knows of its followers (Kafka's Partition).

For each follower it keeps the log end offset the follower last reported (the offset of
its fetch), and Kafka's `lastCaughtUpTimeMs`: the last time the follower had fetched up
to the leader's LEO as it stood at the follower's previous fetch. From these it decides
the in-sync replica set (ISR) and the high watermark:

- A follower joins the ISR once its LEO reaches the HW (and the start of the leader's
  current epoch, so it cannot join with data from an older leader).
- A follower leaves the ISR when `now - lastCaughtUpTimeMs > replica.lag.time.max.ms`:
  it stopped fetching, or fetches but never catches up. The leader never leaves; the ISR
  is never empty.
- HW = min LEO over the ISR, leader included, and it only moves forward; it stands still
  while the ISR is smaller than min.insync.replicas (KIP-966's strict min ISR).

An ISR change is a proposal until the Controller commits it (Kafka's AlterPartition,
KIP-497): `propose_isr` records it as pending, `commit_isr` makes it the ISR,
`abort_isr_change` drops it. One change is in flight at a time. While it is pending the
HW is computed over the *maximal* ISR, the union of the committed and the proposed sets,
so neither a pending expansion nor a pending shrink can let the HW pass a replica the
Controller might still elect.

Pure logic: no Ray, no I/O, not thread-safe. A leader's LeaderIsr (leader_isr.py) owns
one and calls it from the replica's event loop; it decides what to do with a changed ISR or HW.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class FollowerState:
    """What a leader knows of one follower, from its fetches: its LEO (the fetch offset), when
    it was last caught up (Kafka's lastCaughtUpTimeMs), its last fetch's time and the
    leader's LEO then (times in monotonic ms: replica_context.now_ms), and the broker process
    that sent it."""

    log_end_offset: int = -1  # unknown until the follower's first fetch
    last_caught_up_time_ms: int = 0
    last_fetch_time_ms: int = 0
    last_fetch_leader_log_end_offset: int = -1
    incarnation_id: str = ""  # the follower's broker process that sent the last fetch (KIP-903)


class LeaderReplicaState:
    """A leader's view of its partition in one leader epoch: owns the replicas, the committed
    ISR and any pending change, each follower's FollowerState and the high watermark.
    Created when the replica becomes leader, dropped when it stops leading; pure, not
    thread-safe (LeaderIsr calls it from the replica's event loop)."""

    def __init__(
        self,
        leader_id: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        high_watermark: int,
        leader_epoch_start_offset: int,
        now_ms: int,
    ) -> None:
        self.leader_id = leader_id
        self.replicas = list(replicas)
        self.isr = set(isr) | {leader_id}
        self.pending_isr: frozenset[int] | None = None
        assert leader_id in self.replicas, f"leader {leader_id} is not a replica {self.replicas}"
        self.high_watermark = high_watermark
        self.leader_epoch_start_offset = leader_epoch_start_offset
        # Followers start "caught up now": a new leader gives each a full lag window.
        self.followers = {
            r: FollowerState(last_caught_up_time_ms=now_ms, last_fetch_time_ms=now_ms)
            for r in self.replicas
            if r != leader_id
        }

    def update_replicas(self, replicas: Iterable[int], now_ms: int) -> None:
        """The partition's replicas changed (a reassignment added or removed some): a new
        follower starts "caught up now", like every follower of a new leader; a removed
        one is forgotten. The ISR is not changed here, but a pending change that names a
        removed replica is dropped: the Controller refuses it (a removed replica still
        fetching until its stop arrives could be proposed back into the ISR), and kept, it
        would put a replica this leader no longer tracks into the HW."""
        replicas = list(replicas)
        assert self.leader_id in replicas, f"leader {self.leader_id} is not a replica {replicas}"
        if self.pending_isr is not None and not self.pending_isr <= set(replicas):
            self.pending_isr = None
        self.replicas = replicas
        self.followers = {
            r: self.followers.get(r) or FollowerState(last_caught_up_time_ms=now_ms, last_fetch_time_ms=now_ms)
            for r in replicas
            if r != self.leader_id
        }

    def record_follower_fetch(
        self, replica_id: int, fetch_offset: int, leader_log_end_offset: int, now_ms: int, incarnation_id: str = ""
    ) -> None:
        """A follower fetched from `fetch_offset` (its LEO); Kafka's updateFetchState.
        `incarnation_id` names the follower's broker process, which an ISR expansion sends
        along so that the Controller can refuse one based on a fetch from a process that has
        since restarted (KIP-903's broker epoch in fetches)."""
        state = self.followers.get(replica_id)
        if state is None:
            raise KeyError(f"replica {replica_id} is not a follower of this partition ({self.replicas})")
        if fetch_offset >= leader_log_end_offset:
            state.last_caught_up_time_ms = max(state.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= state.last_fetch_leader_log_end_offset:
            state.last_caught_up_time_ms = max(state.last_caught_up_time_ms, state.last_fetch_time_ms)
        state.log_end_offset = fetch_offset
        state.last_fetch_leader_log_end_offset = leader_log_end_offset
        state.last_fetch_time_ms = now_ms
        state.incarnation_id = incarnation_id

    @property
    def maximal_isr(self) -> set[int]:
        """The ISR the HW must respect: committed plus any pending change."""
        return self.isr | self.pending_isr if self.pending_isr is not None else self.isr

    def isr_expansion(self, replica_id: int) -> set[int] | None:
        """The ISR with a caught-up follower added, or None (not caught up, or a change is pending)."""
        state = self.followers[replica_id]
        if self.pending_isr is not None or replica_id in self.isr:
            return None
        if state.log_end_offset >= self.high_watermark and state.log_end_offset >= self.leader_epoch_start_offset:
            return self.isr | {replica_id}
        return None

    def out_of_sync_replicas(self, lag_time_max_ms: int, now_ms: int) -> set[int]:
        """ISR followers that have not caught up within `lag_time_max_ms`."""
        return {
            r
            for r, state in self.followers.items()
            if r in self.isr and now_ms - state.last_caught_up_time_ms > lag_time_max_ms
        }

    def isr_shrink(self, out_of_sync: set[int]) -> set[int] | None:
        """The ISR without `out_of_sync` (never the leader), or None (no change, or one is pending)."""
        out_of_sync = out_of_sync - {self.leader_id}
        if self.pending_isr is not None or not out_of_sync & self.isr:
            return None
        return self.isr - out_of_sync

    def incarnations_of(self, replica_ids: Iterable[int]) -> dict[int, str]:
        """The broker process each follower's last fetch came from ("" if unknown)."""
        return {r: self.followers[r].incarnation_id for r in replica_ids if r in self.followers}

    def propose_isr(self, new_isr: set[int]) -> None:
        assert self.pending_isr is None, "one ISR change at a time"
        assert self.leader_id in new_isr, "the ISR always holds the leader"
        self.pending_isr = frozenset(new_isr)

    def commit_isr(self, isr: set[int] | list[int]) -> None:
        """The Controller's ISR becomes the ISR; any pending change is settled."""
        isr = set(isr)
        assert self.leader_id in isr and isr <= set(self.replicas), f"ISR {isr} holds the leader, only replicas"
        self.isr, self.pending_isr = isr, None

    def abort_isr_change(self) -> None:
        self.pending_isr = None

    def maybe_increment_high_watermark(self, leader_log_end_offset: int, min_insync_replicas: int = 1) -> bool:
        """HW = min LEO over the ISR, never backwards; True if it moved. It stands still
        while the committed ISR is smaller than min.insync.replicas (capped at the replica
        count): KIP-966's strict min ISR, which lets a replica that leaves such an ISR stay
        eligible to lead, since it holds everything committed (`elections.track_eligible`)."""
        if len(self.isr) < min(min_insync_replicas, len(self.replicas)):
            return False
        candidates = [leader_log_end_offset] + [
            self.followers[r].log_end_offset for r in self.maximal_isr if r != self.leader_id
        ]
        new_hw = min(candidates)
        if new_hw > self.high_watermark:
            assert new_hw <= leader_log_end_offset, "HW <= LEO"
            self.high_watermark = new_hw
            return True
        return False
