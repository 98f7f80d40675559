"""LeaderElections: the elections the Controller runs itself, on request or periodically
(Kafka's QuorumController tasks electPreferred and electUnclean over
ReplicationControlManager).

- `elect`: ElectLeaders (KIP-460), preferred or unclean, for the partitions named, in one
  commit; the new leaders are pushed.
- `rebalance_leaders` (periodic, `leader.imbalance.check.interval.seconds`, when
  `auto.leader.rebalance.enable`): preferred leaders back where a broker leads too few
  of the partitions it is the preferred leader of.
- `recover_leaderless` (periodic, every tick): every leaderless partition elected again
  by the current rules, a safety net behind the events that normally do it.
- `recover_uncleanly`: KIP-966's unclean recovery, where every live in-sync copy is back
  but restarted uncleanly: each copy is asked for its log's end (a Ray call, bounded by
  the push timeout) and the most complete is elected.

Decides nothing itself: `elections.py` and the ReplicationControlManager plan, the
Controller's `commit` writes, the ControllerChannelManager pushes. Holds no state of its
own. Runs on the Controller's event loop: a plan and its commit never await between them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ray.exceptions import RayActorError

from rayk.config import BrokerConfig
from rayk.controller.channel_manager import ControllerChannelManager
from rayk.errors import KafkaError
from rayk.metadata import elections
from rayk.metadata.cluster_metadata import NO_LEADER, ClusterMetadata, LogEnd, Record
from rayk.metadata.records import PartitionRecord

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Commit = Callable[[list[Record]], None]


class LeaderElections:
    """Preferred, unclean and recovery elections: planned, committed, pushed."""

    def __init__(self, meta: ClusterMetadata, commit: Commit, channels: ControllerChannelManager,
                 config: BrokerConfig) -> None:
        self._meta = meta
        self._commit = commit
        self._channels = channels
        self._config = config

    async def elect(self, partitions: list[TopicPartition], unclean: bool) -> dict[TopicPartition, KafkaError | None]:
        """Elects each partition (see ReplicationControlManager.plan_elect_leader) and
        pushes the new leaders; per partition None or the error that stopped its election."""
        results: dict[TopicPartition, KafkaError | None] = {}
        records: list[Record] = []
        for topic, partition in dict.fromkeys(partitions):  # a partition named twice is elected once
            try:
                records += self._meta.replication.plan_elect_leader(topic, partition, unclean)
                results[(topic, partition)] = None
            except KafkaError as e:
                results[(topic, partition)] = e
        if records:
            self._commit(records)  # one metadata log append for every election
        await self._channels.push_all(tp for tp, e in results.items() if e is None)
        return results

    async def rebalance_leaders(self) -> None:
        """Kafka's auto.leader.rebalance.enable: the partitions of each broker that leads
        fewer than (100 - leader.imbalance.per.broker.percentage)% of those it is the
        preferred leader of get their preferred leader back, where it may lead. Partitions
        under reassignment are left to it."""
        steady = (((t, p), s) for t, p, s in self._meta.all_partitions() if not s.adding and not s.removing)
        wanted = elections.imbalanced(steady, self._config.leader_imbalance_per_broker_percentage / 100)
        elected = await self.elect(sorted(wanted), unclean=False)
        moved = [tp for tp, error in elected.items() if error is None]
        if moved:
            logger.info("leader rebalance: preferred leaders back for %s", ", ".join(f"{t}-{p}" for t, p in moved))

    async def recover_leaderless(self) -> None:
        """Every leaderless partition is elected again by the current rules (a safety net:
        events normally do it), and those that need it get their logs compared."""
        leaderless = {(t, p) for t, p, s in self._meta.all_partitions() if s.leader == NO_LEADER}
        elected = []
        for topic, partition in sorted(leaderless):
            records = self._meta.replication.plan_reconcile(topic, partition)
            if records:
                self._commit(records)
                elected.append((topic, partition))
        await self._channels.push_all(elected)
        await self.recover_uncleanly(leaderless - set(elected))

    async def recover_uncleanly(self, partitions: set[TopicPartition]) -> None:
        """Rule 4 of `elections`: where every live in-sync copy is back but restarted
        uncleanly (and the missing ones are fenced), ask each for its log's end and elect
        the most complete."""
        for topic, partition in sorted(partitions):
            copies = self._meta.replication.copies_to_compare(topic, partition) if topic in self._meta.topics else ()
            if not copies:
                continue
            handles = {b: self._channels.handle(topic, partition, b) for b in copies}
            if None in handles.values():
                continue  # not every copy is open yet: the next round asks
            try:
                async with asyncio.timeout(self._channels.push_timeout_s):
                    infos = await asyncio.gather(*(h.describe.remote() for h in handles.values()))
            except (TimeoutError, RayActorError) as e:
                logger.warning("%s-%d: could not compare the logs of %s: %s", topic, partition, sorted(copies), e)
                continue
            ends = {b: LogEnd(i["latest_epoch"], i["log_end_offset"]) for b, i in zip(handles, infos)}
            records = self._meta.replication.plan_unclean_recovery(topic, partition, ends)
            if records:
                chosen = next(r.leader for r in records if isinstance(r, PartitionRecord))
                logger.warning(
                    "%s-%d: every in-sync copy restarted uncleanly; electing broker %d, the most complete log of %s",
                    topic, partition, chosen, {b: (e.latest_epoch, e.log_end_offset) for b, e in ends.items()},
                )
                self._commit(records)
                await self._channels.push(topic, partition)
