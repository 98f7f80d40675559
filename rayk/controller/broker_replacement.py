"""BrokerReplacement: the replicas of a broker that stays fenced move to live brokers (a
periodic task of the Controller; Kafka leaves this to an operator or Cruise Control).

Once a broker was fenced for `broker.replacement.delay.ms` (-1: never), each partition
holding a replica on it, and not already being reassigned, gets a KIP-455 reassignment
whose target swaps every lost broker for a live attached one (`replacement_for`): on a
node holding no other replica of the partition if possible, then the one holding the
fewest replicas. The new replicas are added, catch up and join the ISR, and only then is
the lost one removed (ReplicationControlManager, elections.py). Partitions that no live
broker can take are logged once per broker, until it registers again.

Decides where replicas go; the ReplicationControlManager plans the reassignment, the
Controller's `commit` writes it, the ControllerChannelManager pushes it. Each
partition's reassignment is committed before the next is placed, so placements see the
moves before them. Not thread-safe: the Controller's event loop calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rayk.controller.broker_heartbeat_manager import BrokerHeartbeatManager
from rayk.controller.channel_manager import ControllerChannelManager
from rayk.metadata.cluster_metadata import ClusterMetadata, PartitionState, Record

logger = logging.getLogger(__name__)

Commit = Callable[[list[Record]], None]


class BrokerReplacement:
    """Moves the replicas of brokers fenced for too long to live brokers."""

    def __init__(self, meta: ClusterMetadata, commit: Commit, channels: ControllerChannelManager,
                 sessions: BrokerHeartbeatManager, replacement_delay_ms: int) -> None:
        self._meta = meta
        self._commit = commit
        self._channels = channels
        self._sessions = sessions
        self._delay_ms = replacement_delay_ms
        self._blocked: set[int] = set()  # lost brokers with nowhere to move (logged once)

    def broker_back(self, broker_id: int) -> None:
        """The broker registered again: it is no longer lost."""
        self._blocked.discard(broker_id)

    async def replace_lost_brokers(self) -> None:
        """Moves the replicas of brokers fenced for `broker.replacement.delay.ms` to live
        brokers (KIP-455 reassignments), where one can take them."""
        delay_ms = self._delay_ms
        if delay_ms < 0:
            return
        lost = self._sessions.fenced_for(delay_ms / 1000)
        if not lost:
            return
        moved, stuck = [], []
        for topic, partition, state in self._meta.all_partitions():
            if not lost & set(state.replicas) or state.adding or state.removing:
                continue  # nothing lost here, or already moving
            target = replacement_for(self._meta, state, lost)
            if target is None:
                stuck.append((topic, partition))
                continue
            self._commit(self._meta.replication.plan_reassign(topic, partition, target))
            moved.append((topic, partition))
        if moved:
            logger.warning("brokers %s lost for %.0f s or more: moving %s to live brokers", sorted(lost), delay_ms / 1000, moved)
            await self._channels.push_all(moved)
        newly_stuck = {b for t, p in stuck for b in self._meta.partition(t, p).replicas if b in lost} - self._blocked
        if newly_stuck:
            self._blocked |= newly_stuck
            logger.warning("brokers %s are lost but no live broker can take %s", sorted(newly_stuck), stuck)


def replacement_for(meta: ClusterMetadata, state: PartitionState, lost: set[int]) -> list[int] | None:
    """The replicas with every lost one swapped for a live attached broker that is not
    being decommissioned: on a node holding no other replica of the partition if
    possible, then holding the fewest replicas; None if there is no broker to take one."""
    load: dict[int, int] = {}
    for _, _, s in meta.all_partitions():
        for r in s.replicas:
            load[r] = load.get(r, 0) + 1
    target = list(state.replicas)
    for i, r in enumerate(target):
        if r not in lost:
            continue
        nodes_used = {meta.brokers[b].node_id for b in target if b not in lost and b in meta.brokers}
        candidates = [b for b in sorted(meta.attached & meta.placeable_brokers) if b not in target]
        if not candidates:
            return None
        best = min(candidates, key=lambda b: (meta.brokers[b].node_id in nodes_used, load.get(b, 0), b))
        target[i] = best
        load[best] = load.get(best, 0) + 1
    return target
