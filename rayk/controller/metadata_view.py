"""MetadataView: what the Controller answers without changing anything (Kafka's
MetadataCache, on the Controller).

Reads the image (`ClusterMetadata`), the replica handles the pushes were answered with
(`ControllerChannelManager`) and the brokers' advertised listeners
(`BrokerHeartbeatManager`), and builds the answers of the Controller's read calls: topic
descriptions (with the leader's offsets, asked of its replica), the routing metadata of
rayk's clients (leaders' actor handles), Kafka's Metadata answer (a leader is named only
once it took its push in the current epoch), brokers, reassignments under way, the
coordinators' handles. Holds no state; each answer is as of the moment it is built.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray.exceptions import RayActorError

from rayk.controller.broker_heartbeat_manager import BrokerHeartbeatManager
from rayk.controller.channel_manager import ControllerChannelManager
from rayk.errors import LeaderNotAvailableError, UnknownTopicOrPartitionError
from rayk.internal_topics import OFFSETS_TOPIC
from rayk.metadata.cluster_metadata import NO_LEADER, ClusterMetadata

TopicPartition = tuple[str, int]


DESCRIBE_OFFSETS_TIMEOUT_S = 5.0
_NO_OFFSETS = {"high_watermark": None, "log_end_offset": None, "log_start_offset": None}


async def _offsets_of(leader: Any) -> dict[str, int | None]:
    """A leader replica's HW, LEO and log start; None each if there is no leader, or it is
    dead or did not answer within DESCRIBE_OFFSETS_TIMEOUT_S."""
    if leader is None:
        return _NO_OFFSETS
    try:
        async with asyncio.timeout(DESCRIBE_OFFSETS_TIMEOUT_S):
            info = await leader.describe.remote()
    except (TimeoutError, RayActorError):
        return _NO_OFFSETS
    return {k: info[k] for k in _NO_OFFSETS}


class MetadataView:
    """The Controller's read-only answers, from its image, its pushes' answers and its sessions."""

    def __init__(self, meta: ClusterMetadata, channels: ControllerChannelManager, sessions: BrokerHeartbeatManager) -> None:
        self._meta = meta
        self._channels = channels
        self._sessions = sessions

    def list_partition_reassignments(
        self, partitions: list[TopicPartition] | None = None
    ) -> dict[TopicPartition, dict[str, list[int]]]:
        """The reassignments under way: replicas, adding and removing per partition."""
        wanted = None if partitions is None else set(partitions)
        return {
            (t, p): {"replicas": list(s.replicas), "adding": list(s.adding), "removing": list(s.removing)}
            for t, p, s in sorted(self._meta.all_partitions(), key=lambda x: (x[0], x[1]))
            if (s.adding or s.removing) and (wanted is None or (t, p) in wanted)
        }

    def coordinators(self, topic: str = OFFSETS_TOPIC) -> list[Any]:
        """Handles of every leader of an internal topic's partitions (to list all groups, or
        all transactions)."""
        meta = self._meta.topics.get(topic)
        if meta is None:
            return []
        return [self._channels.handle(topic, p, s.leader) for p, s in sorted(meta.partitions.items())]

    async def describe_topic(self, name: str) -> list[dict]:
        """Per partition: leader, replicas, isr, epochs (as of the call), and the leader's HW,
        LEO and log start, asked of every leader at once for at most DESCRIBE_OFFSETS_TIMEOUT_S
        (None from a leader that is dead or did not answer: a leader cut off by the network
        is alive for Ray until it declares its node dead, a minute later)."""
        meta = self._meta.topics.get(name)
        if meta is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        out = [
            {
                "topic": name,
                "topic_id": meta.topic_id,
                "partition": p,
                "leader": state.leader,
                "replicas": list(state.replicas),
                "isr": list(state.isr),
                "leader_epoch": state.leader_epoch,
                "partition_epoch": state.partition_epoch,
                "recovering": list(state.recovering),
                "adding_replicas": list(state.adding),
                "removing_replicas": list(state.removing),
                "eligible_leader_replicas": list(state.eligible),
            }
            for p, state in sorted(meta.partitions.items())
        ]
        handles = [self._channels.handle(name, d["partition"], d["leader"]) for d in out]
        infos = await asyncio.gather(*(_offsets_of(h) for h in handles))
        return [{**d, **info} for d, info in zip(out, infos)]

    def topic_configs(self, name: str) -> dict[str, str]:
        if name not in self._meta.topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return self._meta.configs.of(name)

    def leader(self, topic: str, partition: int) -> Any:
        """The leader replica's actor handle; LEADER_NOT_AVAILABLE while there is none."""
        state = self._meta.partition(topic, partition)
        handle = self._channels.handle(topic, partition, state.leader)
        if handle is None:
            raise LeaderNotAvailableError(f"{topic}-{partition} has no leader ready (leader {state.leader})")
        return handle

    def replica(self, topic: str, partition: int, broker_id: int) -> Any:
        """The actor handle of one replica (leader or follower); None if its broker is away."""
        self._meta.partition(topic, partition)
        return self._channels.handle(topic, partition, broker_id)

    def metadata(self, topics: list[str] | None = None) -> dict[str, dict]:
        """What a client routes by: per topic, per partition the leader, its epoch and handle."""
        names = sorted(self._meta.topics) if topics is None else topics
        out: dict[str, dict] = {}
        for name in names:
            meta = self._meta.topics.get(name)
            if meta is None:
                continue
            out[name] = {
                "topic_id": meta.topic_id,
                "partitions": {
                    p: {
                        "leader": s.leader,
                        "leader_epoch": s.leader_epoch,
                        "replicas": list(s.replicas),
                        "isr": list(s.isr),
                        "leader_handle": self._channels.handle(name, p, s.leader),
                    }
                    for p, s in sorted(meta.partitions.items())
                },
            }
        return out

    def client_metadata(self, topics: list[str] | None = None) -> dict[str, Any]:
        """What Kafka's Metadata answer holds: the live brokers' listeners (by listener name:
        a Metadata request is answered with the addresses of the listener it came on), and per topic
        (all, or those of `topics` that exist) its id and per partition leader, epoch,
        replicas and ISR. A leader is named once it has taken up its leadership in the
        current epoch (else -1: LEADER_NOT_AVAILABLE, as for a topic being created)."""
        live = self._meta.live_brokers
        names = sorted(self._meta.topics) if topics is None else [t for t in topics if t in self._meta.topics]
        return {
            "cluster_id": self._meta.cluster_id,
            "brokers": {b: self._sessions.endpoints[b] for b in sorted(live) if b in self._sessions.endpoints},
            "topics": {
                name: {
                    "topic_id": self._meta.topics[name].topic_id,
                    "partitions": {
                        p: {
                            "leader": s.leader if self._channels.leads_in(name, p, s.leader_epoch) else NO_LEADER,
                            "leader_epoch": s.leader_epoch,
                            "replicas": list(s.replicas),
                            "isr": list(s.isr),
                        }
                        for p, s in sorted(self._meta.topics[name].partitions.items())
                    },
                }
                for name in names
            },
        }

    def brokers(self) -> list[dict]:
        return [
            {
                "broker_id": b.broker_id,
                "epoch": b.epoch,
                "node_id": b.node_id,
                "fenced": b.fenced,
                "decommissioning": b.decommissioning,
                "connected": self._sessions.is_attached(b.broker_id),
                "endpoints": self._sessions.endpoints.get(b.broker_id, {}),
            }
            for b in sorted(self._meta.brokers.values(), key=lambda r: r.broker_id)
        ]

    def offline_partitions_count(self) -> int:
        return sum(1 for meta in self._meta.topics.values() for s in meta.partitions.values() if s.leader == NO_LEADER)
