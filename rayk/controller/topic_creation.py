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

Admission is the seam where capacity decisions belong. With Ray's autoscaler
(`rayk.start(autoscale=True)`), a creation that does not fit, on too few brokers for its
replication factor or past their caps, is not refused at once: it asks for the brokers it
lacks (BrokerAutoscaling.scale_out), waits for them up to the request's timeout, and is
planned again; POLICY_VIOLATION, naming what was missing, if they did not come in time.

Holds no state: it reads the image and the brokers' node memory and cores as they
registered (BrokerHeartbeatManager), commits through the Controller's `commit` and pushes
through the ControllerChannelManager. Runs on the Controller's event loop: a plan, its
admission and its commit never await between them (a wait for brokers comes before the
plan that is committed).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections import Counter
from collections.abc import Callable

from rayk.config import BrokerConfig, validate_topic_configs
from rayk.controller.autoscaling import DEFAULT_SCALE_OUT_TIMEOUT_MS, BrokerAutoscaling, brokers_short
from rayk.controller.broker_heartbeat_manager import BrokerHeartbeatManager
from rayk.controller.channel_manager import ControllerChannelManager
from rayk.controller.metadata_view import MetadataView
from rayk.errors import (
    InvalidReplicationFactorError, InvalidRequestError, PolicyViolationError, RequestTimedOutError, TopicAlreadyExistsError,
)
from rayk.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, is_internal
from rayk.metadata.cluster_metadata import ClusterMetadata, Record
from rayk.metadata.records import PartitionRecord
from rayk.server.replica_capacity import check_replica_caps, node_capacity, replica_caps

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
                 sessions: BrokerHeartbeatManager, view: MetadataView, config: BrokerConfig,
                 autoscaling: BrokerAutoscaling | None = None) -> None:  # fmt: skip
        self._meta = meta
        self._commit = commit
        self._channels = channels
        self._sessions = sessions
        self._view = view
        self._config = config
        self._autoscaling = autoscaling  # None: a creation that does not fit is refused at once

    async def create_topic(
        self, name: str, num_partitions: int | None = None, replication_factor: int | None = None,
        configs: dict | None = None, validate_only: bool = False, timeout_ms: int | None = None,
        scale_out_timeout_ms: int | None = None,
    ) -> list[dict]:
        """Controller.create_topic: defaults for the counts left out (None or -1), placement,
        admission (`_admitted`), commit, then the pushes, waited for up to `timeout_ms`
        (None: all of them; 0: none; counted from the call, a wait for brokers included)
        while they go on in the background. A wait for brokers ends `scale_out_timeout_ms`
        after the call (None: `timeout_ms`, or DEFAULT_SCALE_OUT_TIMEOUT_MS without one)."""
        started_s = time.monotonic()
        if num_partitions in (None, -1):
            num_partitions = self._config.num_partitions
        if replication_factor in (None, -1):
            replication_factor = self._config.default_replication_factor
        checked = validate_topic_configs(configs, self._config)
        topic_id = new_uuid()
        scale_out_ms = next(t for t in (scale_out_timeout_ms, timeout_ms, DEFAULT_SCALE_OUT_TIMEOUT_MS) if t is not None)
        records = await self._admitted(
            lambda: self._meta.replication.plan_create_topic(name, num_partitions, replication_factor, checked, topic_id),
            num_partitions, replication_factor, f"topic {name!r}", started_s + scale_out_ms / 1000,
            check_caps=not is_internal(name), validate_only=validate_only,
        )  # fmt: skip
        if validate_only:
            return []
        self._commit(records)
        pushes = self._channels.spawn(self._channels.push_marking_failures([(name, p) for p in range(num_partitions)]))
        if timeout_ms is None:
            await pushes
        elif timeout_ms > 0:
            try:
                await asyncio.wait_for(asyncio.shield(pushes), max(started_s + timeout_ms / 1000 - time.monotonic(), 0))
            except TimeoutError:
                raise RequestTimedOutError(
                    f"topic {name!r} is created; its replicas were not all started within {timeout_ms} ms"
                ) from None
        return await self._view.describe_topic(name)

    async def create_partitions(
        self, name: str, total: int, validate_only: bool = False, scale_out_timeout_ms: int | None = None
    ) -> list[dict]:
        """Controller.create_partitions: the new partitions placed, admitted (`_admitted`, a
        wait for brokers ending `scale_out_timeout_ms` after the call, None:
        DEFAULT_SCALE_OUT_TIMEOUT_MS), committed and pushed; the topic's description."""
        if is_internal(name):  # its partition count is what maps a group or a transactional id to its coordinator
            raise InvalidRequestError(f"the partition count of {name} cannot change")
        deadline_s = time.monotonic() + (scale_out_timeout_ms if scale_out_timeout_ms is not None
                                         else DEFAULT_SCALE_OUT_TIMEOUT_MS) / 1000  # fmt: skip
        topic = self._meta.topics.get(name)
        current = len(topic.partitions) if topic is not None else 0
        replication_factor = len(topic.partitions[0].target_replicas) if topic is not None else 0
        records = await self._admitted(
            lambda: self._meta.replication.plan_create_partitions(name, total), total - current, replication_factor,
            f"{total - current} new partitions of {name!r}", deadline_s, check_caps=True, validate_only=validate_only,
        )  # fmt: skip
        if validate_only:
            return []
        current = len(self._meta.topics[name].partitions)  # as planned, after any wait for brokers
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
        partitions, rf, configs = internal_topic_settings(name, self._config, len(self._meta.placeable_brokers))
        try:
            await self.create_topic(name, partitions, rf, configs, timeout_ms=timeout_ms)
        except TopicAlreadyExistsError:
            pass  # a concurrent request created it

    async def _admitted(
        self, plan: Callable[[], list[Record]], num_partitions: int, replication_factor: int, what: str,
        deadline_s: float, check_caps: bool, validate_only: bool,
    ) -> list[Record]:
        """The records of `plan()` once admitted: its replicas on brokers apart (the plan
        raises INVALID_REPLICATION_FACTOR otherwise) and, if `check_caps`, no broker past its
        cap (not for internal topics: groups and transactions must work whatever users have
        filled). With Ray's autoscaler, a plan that does not fit asks for the brokers it
        lacks, waits for them until `deadline_s` (monotonic) and is planned again; with
        `validate_only` it asks for none and passes ([]) if brokers would make it fit."""
        while True:
            try:
                records = plan()
                if check_caps:
                    self.check_replica_caps(records)
                return records
            except (InvalidReplicationFactorError, PolicyViolationError):
                if self._autoscaling is None or not check_caps:
                    raise
                short = self._brokers_short(num_partitions, replication_factor)
                if not short:
                    raise  # no number of new brokers makes it fit
                if validate_only:
                    return []
                await self._autoscaling.scale_out(short, deadline_s, what)

    def _brokers_short(self, num_partitions: int, replication_factor: int) -> int | None:
        """How many brokers a creation of `num_partitions` x `replication_factor` lacks
        (autoscaling.brokers_short over the placeable brokers and their caps)."""
        held, caps = self._replica_caps()
        placeable = self._meta.placeable_brokers
        start = sum(len(t.partitions) for t in self._meta.topics.values())  # as the replication manager places
        return brokers_short(num_partitions, replication_factor, self._meta.cluster.node_of(placeable), start, held,
                             {b: cap for b, cap in caps.items() if b in placeable},
                             configured=self._config.max_replicas_per_broker > 0)  # fmt: skip

    def _replica_caps(self) -> tuple[Counter[int], dict[int, int]]:
        """The replicas each broker holds, and each live broker's cap."""
        held = Counter(b for _, _, state in self._meta.all_partitions() for b in state.replicas)
        return held, self.replica_caps()

    def replica_caps(self) -> dict[int, int]:
        """Each live broker's cap on the replicas it may hold (replica_capacity.py: its
        node's memory and cores); a broker without one (it reported no node memory) is left
        out."""
        node_of = {b: self._meta.brokers[b].node_id for b in self._meta.live_brokers}
        return replica_caps(self._config.max_replicas_per_broker, self._sessions.node_memory_bytes, node_of,
                            self._sessions.node_cpus)

    def check_replica_caps(self, records: list[Record]) -> None:
        """POLICY_VIOLATION if the new partitions of `records` put a broker past its cap,
        naming what bounds each cap (memory or cores)."""
        held, caps = self._replica_caps()
        adding = [b for r in records if isinstance(r, PartitionRecord) for b in r.replicas]
        mem, cpus = self._sessions.node_memory_bytes, self._sessions.node_cpus
        bounds = {b: node_capacity(mem[b], cpus.get(b, 0)) for b in caps if mem.get(b, 0) > 0}
        check_replica_caps(held, adding, caps, configured=self._config.max_replicas_per_broker > 0, bounds=bounds)
