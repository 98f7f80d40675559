"""TopicCreation: topics and partitions created (Kafka's CreateTopics and CreatePartitions
paths in the Controller, its CreateTopicPolicy, and the AutoTopicCreationManager of the
internal topics).

A creation takes the brokers' defaults for what it leaves out (`num.partitions`,
`default.replication.factor`), has the ReplicationControlManager place its replicas,
is admitted only if no broker then holds more replicas than it may (`max.replicas.per.
broker`, or what its node's memory and cores hold: replica_capacity.py; POLICY_VIOLATION,
never a node that then starves), is committed, and its replicas are pushed: the call
waits for them up to `timeout_ms`, the replicas go on starting in the background after.
The internal topics (`__consumer_offsets`, `__transaction_state`) are created on first
use with their own settings, and are never refused by the cap: groups and transactions
must work whatever users have filled.

Admission is the seam where capacity decisions belong (asking Ray's autoscaler for nodes
when a topic does not fit: `replicas_over` says how many replicas past their caps a plan
puts each broker). Holds no state: it reads the image and the brokers' node memory and
cores as they registered (BrokerHeartbeatManager), commits through the Controller's
`commit` and pushes through the ControllerChannelManager. Runs on the Controller's
event loop: a plan, its admission and its commit never await between them.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections import Counter
from collections.abc import Callable

from rayk.config import BrokerConfig, validate_topic_configs
from rayk.controller.broker_heartbeat_manager import BrokerHeartbeatManager
from rayk.controller.channel_manager import ControllerChannelManager
from rayk.controller.metadata_view import MetadataView
from rayk.errors import InvalidRequestError, RequestTimedOutError, TopicAlreadyExistsError
from rayk.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, is_internal
from rayk.metadata.cluster_metadata import ClusterMetadata, Record
from rayk.metadata.records import PartitionRecord
from rayk.server.replica_capacity import check_replica_caps, node_capacity, replica_caps, replicas_over

Commit = Callable[[list[Record]], None]


def new_uuid() -> str:
    """A Kafka-style id: a random UUID in URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def internal_topic_settings(name: str, c: BrokerConfig, live_brokers: int) -> tuple[int, int, dict[str, str]]:
    """An internal topic's partitions, replication factor (as configured, but no more than
    the live brokers) and configs (compacted; offsets.topic.*, transaction.state.log.*)."""
    configs: dict[str, str]
    if name == OFFSETS_TOPIC:
        partitions, segment_bytes = c.offsets_topic_num_partitions, c.offsets_topic_segment_bytes
        rf = max(min(c.offsets_topic_replication_factor, live_brokers), 1)
        configs = {}
    elif name == TRANSACTION_STATE_TOPIC:
        partitions, segment_bytes = c.transaction_state_log_num_partitions, c.transaction_state_log_segment_bytes
        rf = max(min(c.transaction_state_log_replication_factor, live_brokers), 1)
        configs = {"min.insync.replicas": str(min(c.transaction_state_log_min_isr, rf))}
    else:
        raise InvalidRequestError(f"{name!r} is not an internal topic")
    return partitions, rf, configs | {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)}


class TopicCreation:
    """Creates topics and partitions: defaults, placement, admission by replica caps, commit, pushes."""

    def __init__(self, meta: ClusterMetadata, commit: Commit, channels: ControllerChannelManager,
                 sessions: BrokerHeartbeatManager, view: MetadataView, config: BrokerConfig) -> None:
        self._meta = meta
        self._commit = commit
        self._channels = channels
        self._sessions = sessions
        self._view = view
        self._config = config

    async def create_topic(
        self, name: str, num_partitions: int | None = None, replication_factor: int | None = None,
        configs: dict | None = None, validate_only: bool = False, timeout_ms: int | None = None,
    ) -> list[dict]:
        """Controller.create_topic: defaults for the counts left out (None or -1), placement,
        admission (not for internal topics), commit, then the pushes, waited for up to
        `timeout_ms` (None: all of them; 0: none) while they go on in the background."""
        if num_partitions in (None, -1):
            num_partitions = self._config.num_partitions
        if replication_factor in (None, -1):
            replication_factor = self._config.default_replication_factor
        checked = validate_topic_configs(configs)
        records = self._meta.replication.plan_create_topic(name, num_partitions, replication_factor, checked, new_uuid())
        if not is_internal(name):  # groups and transactions must work whatever users have filled
            self.check_replica_caps(records)
        if validate_only:
            return []
        self._commit(records)
        pushes = self._channels.spawn(self._channels.push_marking_failures([(name, p) for p in range(num_partitions)]))
        if timeout_ms is None:
            await pushes
        elif timeout_ms > 0:
            try:
                await asyncio.wait_for(asyncio.shield(pushes), timeout_ms / 1000)
            except TimeoutError:
                raise RequestTimedOutError(
                    f"topic {name!r} is created; its replicas were not all started within {timeout_ms} ms"
                ) from None
        return await self._view.describe_topic(name)

    async def create_partitions(self, name: str, total: int, validate_only: bool = False) -> list[dict]:
        """Controller.create_partitions: the new partitions placed, admitted, committed and
        pushed; the topic's description."""
        if is_internal(name):  # its partition count is what maps a group or a transactional id to its coordinator
            raise InvalidRequestError(f"the partition count of {name} cannot change")
        current = len(self._meta.topics[name].partitions) if name in self._meta.topics else 0
        records = self._meta.replication.plan_create_partitions(name, total)
        self.check_replica_caps(records)
        if validate_only:
            return []
        self._commit(records)
        await self._channels.push_all((name, p) for p in range(current, total))
        return await self._view.describe_topic(name)

    async def create_internal_topic(self, name: str, timeout_ms: int | None = None) -> None:
        """Creates __consumer_offsets or __transaction_state, unless it exists, with its own
        settings (`internal_topic_settings`), whoever asks: a group's or a transactional
        id's first request, or a Metadata request naming it (`timeout_ms` as for
        `create_topic`)."""
        if name in self._meta.topics:
            return
        partitions, rf, configs = internal_topic_settings(name, self._config, len(self._meta.live_brokers))
        try:
            await self.create_topic(name, partitions, rf, configs, timeout_ms=timeout_ms)
        except TopicAlreadyExistsError:
            pass  # a concurrent request created it

    def replicas_over(self, records: list[Record]) -> dict[int, int]:
        """Per broker that the new partitions of `records` put past its cap, by how many
        replicas (replica_capacity.replicas_over); {} when they fit."""
        held, adding, caps = self._placement(records)
        return replicas_over(held, adding, caps)

    def check_replica_caps(self, records: list[Record]) -> None:
        """POLICY_VIOLATION if the new partitions of `records` put a broker past its cap."""
        held, adding, caps = self._placement(records)
        mem, cpus = self._sessions.node_memory_bytes, self._sessions.node_cpus
        bounds = {b: node_capacity(mem[b], cpus.get(b, 0)) for b in caps if mem.get(b, 0) > 0}
        check_replica_caps(held, adding, caps, configured=self._config.max_replicas_per_broker > 0, bounds=bounds)

    def _placement(self, records: list[Record]) -> tuple[Counter[int], list[int], dict[int, int]]:
        """The replicas each broker holds, the brokers of the new replicas in `records`, and
        each live broker's cap."""
        held = Counter(b for _, _, state in self._meta.all_partitions() for b in state.replicas)
        adding = [b for r in records if isinstance(r, PartitionRecord) for b in r.replicas]
        node_of = {b: self._meta.brokers[b].node_id for b in self._meta.live_brokers}
        caps = replica_caps(self._config.max_replicas_per_broker, self._sessions.node_memory_bytes, node_of,
                            self._sessions.node_cpus)
        return held, adding, caps
