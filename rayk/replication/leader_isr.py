"""LeaderIsr: a partition leader's in-sync replicas and high watermark (Kafka's Partition:
maybeExpandIsr, maybeShrinkIsr, maybeIncrementLeaderHW, with its AlterPartitionManager).

It owns the leader's `LeaderReplicaState` (replica_state.py: what the leader knows of its
followers, the ISR and the HW rules), the partition epoch, the isr-expiration timer and
the AlterPartition calls in flight. The fetch path tells it where followers are
(leader_fetch.py); the produce path asks it whether the ISR is large enough
(leader_produce.py); every HW move goes through `maybe_increment_high_watermark`, which
writes it to the log and wakes the waiters.

ISR expiration (Kafka's isr-expiration task) runs in the leader's own event loop, every
half of replica.lag.time.max.ms while it leads: a timer there costs microseconds, where the
broker's call to each leader for it cost ~1-2 ms of CPU across the two processes, every
5 s, for each partition, idle or not.

ISR changes the leader decides (a follower caught up, or one fell behind) go to the
Controller as AlterPartition through `isr_manager` (the broker's ReplicaManager) and take
effect when it commits them; until then the HW respects the maximal ISR (see
`LeaderReplicaState`). A change the Controller refused is dropped and may be proposed
again; one whose outcome is unknown (no answer: the call failed or timed out, or the
broker's epoch was stale, so an earlier try may have been applied), or that the Controller
refused because this replica's view is stale, stays pending, keeping the larger ISR in the
HW, until an answer or the Controller's next assignment settles it, as Kafka's
AlterPartitionManager does. Without an `isr_manager` (a replica used on its own) changes
commit at once.

Lifecycle: `lead` at each new leader epoch makes a fresh state and starts the timer;
`update` applies the Controller's changes within that epoch; `stop` (following, closing)
drops both. The state exists exactly while the replica leads the epoch it was made for,
and an AlterPartition answer is applied only in the epoch its proposal was made in.
Not thread-safe: the replica actor's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from rayk.actors.named_actor import handle_of
from rayk.errors import IneligibleReplicaError, KafkaError, NotEnoughReplicasError, StaleBrokerEpochError
from rayk.replication.replica_context import ReplicaContext, Role, now_ms
from rayk.replication.replica_state import LeaderReplicaState

logger = logging.getLogger(__name__)

ISR_CHANGE_RETRY_BACKOFF_MS = 100
ISR_CHANGE_TIMEOUT_MS = 10_000  # no answer from the Controller by then: the outcome is unknown
# The Controller definitely did not apply a change it refused with these: drop it.
# Only a per-partition refusal says that the change was not applied, by any Controller,
# before or after (Kafka's Partition.handleAlterPartitionError resets on INELIGIBLE_REPLICA
# alone). STALE_BROKER_EPOCH is about the broker, not the change: an earlier try whose answer
# was lost may have been applied, so the change stays pending and is sent again.
_ISR_CHANGE_REFUSED = (IneligibleReplicaError,)


class LeaderIsr:
    """A leader's ISR, HW and AlterPartition calls (see the module docstring)."""

    def __init__(self, ctx: ReplicaContext, isr_manager: Any) -> None:
        """`isr_manager`: an actor handle with `alter_partition` (the ReplicaManager), or
        None (changes commit at once)."""
        self._ctx = ctx
        self._isr_manager = isr_manager
        self.state: LeaderReplicaState | None = None  # while leading
        self.partition_epoch = -1
        self._epoch = -1  # the leader epoch `state` was made for
        self._retry_at = 0.0  # monotonic seconds: no expansion proposed before (a refusal's backoff)
        self._expiration: asyncio.TimerHandle | None = None  # while leading
        self._alterations: set[asyncio.Task] = set()  # AlterPartition calls in flight

    # ------------------------------------------------------------------ lifecycle

    def lead(self, replicas: list[int], isr: list[int], partition_epoch: int) -> None:
        """The replica leads a new epoch (its context says so already): followers start
        "caught up now", the HW may move at once (a single-replica ISR), the timer starts."""
        ctx = self._ctx
        assert ctx.role is Role.LEADER, ctx.role
        log = ctx.log
        self.partition_epoch = partition_epoch
        self._epoch = ctx.leader_epoch
        self.state = LeaderReplicaState(ctx.broker_id, replicas, isr, log.high_watermark, log.log_end_offset, now_ms())
        self.maybe_increment_high_watermark()
        self._schedule_expiration()

    def update(self, replicas: list[int], isr: list[int], partition_epoch: int) -> None:
        """The Controller's assignment for the epoch this replica leads already: a newer
        `partition_epoch` sets the replicas and the ISR (it fenced a follower's broker, or a
        reassignment added or removed replicas)."""
        state = self.state
        assert state is not None and self._ctx.leads_in(self._epoch), "updated only while leading"
        if partition_epoch > self.partition_epoch:
            self.partition_epoch = partition_epoch
            state.update_replicas(replicas, now_ms())
            state.commit_isr(isr)
            self.after_change()
        elif partition_epoch == self.partition_epoch and list(replicas) != state.replicas:
            # This epoch was learnt from an AlterPartition answer, which carries no replica
            # set (Kafka's makeLeader also takes an equal epoch); the ISR and any pending
            # change stay as they are.
            state.update_replicas(replicas, now_ms())

    def stop(self) -> None:
        """No longer leading: the state and the timer go; calls in flight find out."""
        self.state = None
        if self._expiration is not None:
            self._expiration.cancel()
            self._expiration = None

    # ------------------------------------------------------------------ the rules

    def leading(self) -> LeaderReplicaState:
        """The state, for a caller that found the replica leading since its last await."""
        state = self.state
        assert state is not None, "a leader's state, asked for while leading"
        return state

    def too_few_in_sync(self) -> NotEnoughReplicasError | None:
        """What an acks=all write is refused with while the ISR is below min.insync.replicas."""
        isr_size = len(self.leading().isr)
        min_insync_replicas = self._ctx.config.min_insync_replicas
        if isr_size >= min_insync_replicas:
            return None
        return NotEnoughReplicasError(
            f"{self._ctx.name} has {isr_size} in-sync replicas, min.insync.replicas is {min_insync_replicas}"
        )

    def maybe_increment_high_watermark(self) -> bool:
        """Moves the log's HW to min LEO over the ISR if that is higher (LeaderReplicaState's
        rule); True if it moved. The caller wakes the waiters."""
        state, ctx = self.state, self._ctx
        log = ctx.log
        if state is None or not state.maybe_increment_high_watermark(log.log_end_offset, ctx.config.min_insync_replicas):
            return False
        assert ctx.leads_in(self._epoch), f"the HW moves in the epoch it is tracked in ({self._epoch}), as its leader"
        assert log.high_watermark <= state.high_watermark <= log.log_end_offset, "the HW only grows, HW <= LEO"
        log.high_watermark = state.high_watermark
        if ctx.trace is not None:
            ctx.trace.high_watermark(state.high_watermark)
        return True

    def after_change(self) -> None:
        """The ISR or min.insync.replicas changed: a smaller ISR, or one back at
        min.insync.replicas, may let the HW move; parked acks=-1 produces re-check it."""
        assert self.state is None or self._ctx.broker_id in self.state.isr, "the ISR holds the leader"
        self.maybe_increment_high_watermark()
        self._ctx.events.notify_change()

    def follower_fetched(self, replica_id: int) -> None:
        """A follower's fetch was recorded in the state: proposes adding it to the ISR if
        it caught up (unless a refused change is still backing off), and moves the HW."""
        proposal = self.leading().isr_expansion(replica_id)
        if proposal is not None and time.monotonic() >= self._retry_at:
            self._change(proposal, f"broker {replica_id} caught up")
        if self.maybe_increment_high_watermark():
            self._ctx.events.notify_high_watermark()

    # ------------------------------------------------------------------ expiration

    def _schedule_expiration(self) -> None:
        if self._expiration is None and self._ctx.role is Role.LEADER:
            self._expiration = asyncio.get_running_loop().call_later(
                self._ctx.config.replica_lag_time_max_ms / 2000, self._expire
            )

    def _expire(self) -> None:
        """The timer of Kafka's isr-expiration task, for as long as this replica leads."""
        self._expiration = None
        try:
            self._maybe_shrink()
        finally:
            self._schedule_expiration()

    def _maybe_shrink(self) -> None:
        """Kafka's isr-expiration for this partition: proposes dropping followers that have
        not caught up within replica.lag.time.max.ms."""
        if self._ctx.role is not Role.LEADER:
            return
        state = self.leading()
        out = state.out_of_sync_replicas(self._ctx.config.replica_lag_time_max_ms, now_ms())
        proposal = state.isr_shrink(out)
        if proposal is not None:
            self._change(proposal, f"brokers {sorted(out)} fell behind")

    # ------------------------------------------------------------------ AlterPartition

    def _change(self, proposal: set[int], reason: str) -> None:
        ctx, state = self._ctx, self.leading()
        state.propose_isr(proposal)
        logger.info("%s: proposing ISR %s (%s)", ctx.name, sorted(proposal), reason)
        if self._isr_manager is None:
            state.commit_isr(proposal)
            self.partition_epoch += 1
            self.after_change()
            return
        # The processes whose fetches put the added followers in: the Controller refuses the
        # change if one of them is no longer its broker's registered process (KIP-903).
        added = state.incarnations_of(proposal - state.isr)
        task = asyncio.get_running_loop().create_task(
            self._alter_partition(proposal, ctx.leader_epoch, self.partition_epoch, added)
        )
        self._alterations.add(task)
        task.add_done_callback(self._alterations.discard)

    def _settled(self, proposal: set[int], epoch: int) -> bool:
        """Whether a newer assignment from the Controller settled the proposal already."""
        return not self._ctx.leads_in(epoch) or self.leading().pending_isr != frozenset(proposal)

    async def _alter_partition(
        self, proposal: set[int], epoch: int, partition_epoch_sent: int, added_incarnations: dict[int, str]
    ) -> None:
        """Sends one ISR proposal, made in `partition_epoch_sent`, to the Controller (through
        the ReplicaManager) until its outcome is known, and settles it (see the module
        docstring). A proposal an assignment settled before it went out is not sent."""
        ctx = self._ctx
        while not self._settled(proposal, epoch):
            try:
                async with asyncio.timeout(ISR_CHANGE_TIMEOUT_MS / 1000):
                    manager = await handle_of(self._isr_manager)
                    isr, partition_epoch = await manager.alter_partition.remote(
                        ctx.topic, ctx.partition, ctx.broker_id, epoch, partition_epoch_sent, sorted(proposal),
                        added_incarnations,
                    )
                error = None
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a typed KafkaError from the Controller, or no answer
                error = e
            if self._settled(proposal, epoch):
                return
            if error is None:
                if partition_epoch >= self.partition_epoch and ctx.broker_id in isr:
                    self.partition_epoch = partition_epoch
                    self.leading().commit_isr(isr)
                    self.after_change()
                # else: a reassignment that moved the leadership away completed with it;
                # the Controller's assignment, on its way, says what this replica is now.
                return
            if not await self._after_failure(proposal, error):
                return

    async def _after_failure(self, proposal: set[int], error: Exception) -> bool:
        """Settles a proposal the Controller did not take, or waits to send it again;
        True: send it again."""
        name = self._ctx.name
        if isinstance(error, _ISR_CHANGE_REFUSED):
            logger.warning("%s: ISR change %s refused: %s", name, sorted(proposal), error)
            self.leading().abort_isr_change()
            self._retry_at = time.monotonic() + ISR_CHANGE_RETRY_BACKOFF_MS / 1000
            self.after_change()
            return False
        if isinstance(error, StaleBrokerEpochError):
            logger.info("%s: ISR change %s waits for its broker to register again: %s", name, sorted(proposal), error)
        elif isinstance(error, KafkaError):
            # This replica's epochs are stale: the Controller has moved on, and its next
            # assignment (already on its way) settles the pending change either way.
            logger.info("%s: ISR change %s waits for the Controller's assignment: %s", name, sorted(proposal), error)
            return False
        else:
            logger.warning("%s: ISR change %s has no answer yet (%s); sending it again", name, sorted(proposal), error)
        await asyncio.sleep(ISR_CHANGE_RETRY_BACKOFF_MS / 1000)
        return True
