"""Balancer: the Controller's partition balancer (issue 67, after Cruise Control's goals),
a periodic task; what to move is planned by rayk/metadata/balancer.py.

When it runs (`auto.balance.enable`, default true; off, it never moves anything):
- right after a broker registers for the first time, and when one starts leaving
  (`request_run`: decommissioning calls it): these settle the cluster, every count as
  close to the mean as the goals allow;
- at every maintenance tick while its last run's moves are under way or the bound held
  some back (a follow-up, settling as the run it follows did), so that a new broker takes
  its whole share five moves at a time without waiting for the next check;
- every `balancer.interval.ms`, a check that moves replicas or leaders only where a
  broker is outside the planner's band around the mean (so drift of a replica or two is
  left alone).
A run waits while a broker holding a replica is fenced or not registered with this
Controller session: a lost broker is BrokerReplacement's, and moving data in the middle
of a failure only adds load; requests and follow-ups are kept until the cluster is whole.

A run: the partitions' sizes are asked of the brokers (the log sizes of their last offset
checkpoint: one call per broker, at most every SIZES_REFRESH_INTERVAL_MS, bounded by
SIZES_TIMEOUT_MS), the planner's moves (at most `balancer.max.concurrent.moves.per.broker`
reassignments touching a broker at a time, those under way counted) are started as KIP-455
reassignments through the ReplicationControlManager (`plan_reassign`; a target that only
reorders the replicas changes the preferred leader and moves no data), committed in one
batch, and pushed in the background (a new replica is a process; a push that fails is
pushed again by `push_dirty`). The brokers' replica caps (TopicCreation.replica_caps) are
the planner's capacities; brokers whose registration says `decommissioning` are leaving.

Leaders move by preferred election: once a partition it moved has completed its
reassignment (or at once, for a reorder), its first replica is elected
(LeaderElections.elect) unless it leads already; an election that cannot happen yet (the
replica is not back in the ISR) is tried again at the next ticks, PREFERRED_ELECTION_TICKS
times at most.

Owns: when to run, the sizes it last asked, the partitions whose preferred leader it still
has to elect. Decides nothing itself (the planner does), commits through the Controller's
`commit`, pushes through the ControllerChannelManager. Not thread-safe: the Controller's
event loop calls it; a plan and its commit never await between them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from rayk.config import BrokerConfig
from rayk.controller.broker_heartbeat_manager import BrokerHeartbeatManager
from rayk.controller.channel_manager import ControllerChannelManager
from rayk.controller.leader_elections import LeaderElections
from rayk.errors import ElectionNotNeededError, KafkaError
from rayk.metadata.balancer import BalancePlan, BalancerBroker, Move, partitions_of, plan_balance
from rayk.metadata.cluster_metadata import ClusterMetadata, Record

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Commit = Callable[[list[Record]], None]

SIZES_REFRESH_INTERVAL_MS = 10_000  # the brokers checkpoint their log sizes every few seconds anyway
SIZES_TIMEOUT_MS = 2_000  # each broker answers from memory; a slow one is planned without
PREFERRED_ELECTION_TICKS = 30  # maintenance ticks a moved partition's preferred leader is tried for


class Balancer:
    """Runs the balancer's planner when due and starts its moves (see the module docstring)."""

    def __init__(self, meta: ClusterMetadata, commit: Commit, channels: ControllerChannelManager,
                 sessions: BrokerHeartbeatManager, elections: LeaderElections,
                 replica_caps: Callable[[], Mapping[int, int]], config: BrokerConfig) -> None:
        self._meta = meta
        self._commit = commit
        self._channels = channels
        self._sessions = sessions
        self._elections = elections
        self._replica_caps = replica_caps
        self.enabled = config.auto_balance_enable
        self._interval_s = config.balancer_interval_ms / 1000
        self._max_moves = config.balancer_max_concurrent_moves_per_broker
        self._next_check_s = time.monotonic() + self._interval_s
        self._requested = False  # a broker joined or started leaving: settle at the next tick
        self._follow_up: bool | None = None  # None, or the `settle` of the run being followed up
        self._electing: dict[TopicPartition, int] = {}  # moved partitions -> ticks left to elect their preferred leader
        self._sizes: dict[TopicPartition, int] = {}
        self._sizes_at_s = float("-inf")
        self.last_plan: BalancePlan | None = None  # for inspection (Controller.balancer_status)

    def request_run(self) -> None:
        """A broker registered for the first time or started leaving: settle the cluster
        at the next maintenance tick (once every broker holding a replica is back)."""
        if self.enabled:
            self._requested = True

    @property
    def busy(self) -> bool:
        """Whether a run is requested, its moves are being followed up, or preferred leaders
        of moved partitions are still to be elected."""
        return self._requested or self._follow_up is not None or bool(self._electing)

    async def maintain(self) -> None:
        """The periodic task: preferred leaders of completed moves, then a run if one is due."""
        if not self.enabled:
            return
        await self._elect_preferred()
        now = time.monotonic()
        checking = now >= self._next_check_s
        if checking:
            self._next_check_s = now + self._interval_s
        if not (checking or self._requested or self._follow_up is not None):
            return
        why_not = self._not_steady()
        if why_not is not None:
            if checking:
                logger.info("balancer: check skipped: %s", why_not)
            return  # a request or a follow-up waits for the cluster to be whole again
        settle = self._requested or bool(self._follow_up)
        requested, self._requested = self._requested, False
        if await self.run(settle) is None:
            self._requested = self._requested or requested  # the image changed meanwhile: kept for the next tick

    async def run(self, settle: bool = True) -> BalancePlan | None:
        """Plans and starts moves now; None if the cluster is not steady (see `maintain`)."""
        sizes = await self._partition_sizes()
        if self._not_steady() is not None:  # the image may have changed while the brokers answered
            return None
        plan = plan_balance(self._brokers(), partitions_of(self._meta.all_partitions(), sizes), self._max_moves, settle)
        self.last_plan = plan
        started = self._start(plan.moves)
        self._follow_up = settle if started or plan.incomplete else None
        if started:
            self._channels.spawn(self._channels.push_marking_failures(started))
            await self._elect_preferred()
        return plan

    # ------------------------------------------------------------------ the cluster as the planner sees it

    def _not_steady(self) -> str | None:
        """Why partitions should not move now, or None."""
        live, attached = self._meta.live_brokers, self._meta.attached
        holding = {b for _, _, state in self._meta.all_partitions() for b in state.replicas}
        away = sorted(b for b in holding if b not in live or b not in attached)
        if away:
            return f"brokers {away} hold replicas but are fenced or not registered with this Controller"
        if not any(not b.leaving for b in self._brokers()):
            return "no broker may take replicas"
        return None

    def _brokers(self) -> list[BalancerBroker]:
        """The live attached brokers with their replica caps; those decommissioning leave."""
        caps = self._replica_caps()
        live, attached = self._meta.live_brokers, self._meta.attached
        return [
            BalancerBroker(b, reg.node_id, caps.get(b), reg.decommissioning)  # (being removed: Cluster.remove_broker)
            for b, reg in sorted(self._meta.brokers.items())
            if b in live and b in attached
        ]

    async def _partition_sizes(self) -> dict[TopicPartition, int]:
        """Each partition's size in bytes, the largest its brokers last checkpointed."""
        now = time.monotonic()
        if now - self._sizes_at_s < SIZES_REFRESH_INTERVAL_MS / 1000:
            return self._sizes
        managers = [m for b in sorted(self._meta.attached) if (m := self._sessions.manager(b)) is not None]
        answers: list = []
        try:
            async with asyncio.timeout(SIZES_TIMEOUT_MS / 1000):
                answers = await asyncio.gather(*(m.log_sizes.remote() for m in managers), return_exceptions=True)
        except TimeoutError:
            logger.info("balancer: the brokers' log sizes did not come within %d ms; planning without them", SIZES_TIMEOUT_MS)
        sizes: dict[TopicPartition, int] = {}
        for answer in answers:
            if isinstance(answer, dict):
                for tp, size_bytes in answer.items():
                    sizes[tp] = max(sizes.get(tp, 0), size_bytes)
        self._sizes, self._sizes_at_s = sizes, now
        return sizes

    # ------------------------------------------------------------------ moves and their leaders

    def _start(self, moves: tuple[Move, ...]) -> list[TopicPartition]:
        """Starts the moves as reassignments, in one commit; the partitions started."""
        records: list[Record] = []
        started = []
        for move in moves:
            try:
                records += self._meta.replication.plan_reassign(move.topic, move.partition, move.replicas)
            except KafkaError as e:  # the image changed under the plan: the next run sees it
                logger.warning("balancer: cannot move %s-%d to %s: %s", move.topic, move.partition, list(move.replicas), e)
                continue
            started.append((move.topic, move.partition))
            self._electing[(move.topic, move.partition)] = PREFERRED_ELECTION_TICKS
        self._commit(records)
        if started:
            logger.info("balancer: %s", ", ".join(
                f"{m.topic}-{m.partition} {list(m.previous)} -> {list(m.replicas)}"
                for m in moves if (m.topic, m.partition) in started))
        return started

    async def _elect_preferred(self) -> None:
        """Elects the preferred leader of each moved partition whose reassignment completed."""
        ready = []
        for tp in sorted(self._electing):
            topic = self._meta.topics.get(tp[0])
            state = topic.partitions.get(tp[1]) if topic is not None else None
            if state is None or state.leader == state.target_replicas[0]:
                del self._electing[tp]
            elif not (state.adding or state.removing):
                ready.append(tp)
        if not ready:
            return
        for tp, error in (await self._elections.elect(ready, unclean=False)).items():
            if error is None or isinstance(error, ElectionNotNeededError):
                self._electing.pop(tp, None)
            elif (ticks := self._electing.get(tp, 0) - 1) > 0:
                self._electing[tp] = ticks
            else:
                self._electing.pop(tp, None)
                logger.info("balancer: %s-%d's preferred leader could not be elected: %s", *tp, error)
