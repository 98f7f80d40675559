"""Controller: the cluster's metadata and elections, as one detached async Ray actor.

It keeps `ClusterMetadata` (brokers, topics with ids and configs, and per partition the
replicas, leader, leader epoch, ISR and partition epoch) and is the only writer of it.
Every change is decided by `ClusterMetadata.plan_*`, written durably to the
`MetadataLog` (`<dir>/__cluster_metadata-0`), applied, and only then pushed to the
brokers concerned: the leader's ReplicaManager first (its answer is the leader replica's
handle), then the followers' with that handle. Planning and committing never await, so
on the actor's event loop each change is atomic; pushes are asynchronous and may
overlap, which the brokers tolerate because every push carries its epochs.

Liveness: brokers heartbeat every `broker.heartbeat.interval.ms`. A broker silent for
`broker.session.timeout.ms`, or whose actor Ray reports dead (a call held open on it,
`run_until_stopped`, fails), is fenced: out of every ISR, and a new leader with a bumped
epoch wherever it led (see `cluster_metadata.elect`). A fenced broker that speaks again
is told to register anew, which unfences it and gives leaderless partitions their leader
back. A broker that registers while its previous incarnation still had a session (it
restarted faster than the timeout) is first fenced, because its replicas lost their
in-memory state.

After a restart (same directory), the Controller replays its log and gives every broker
that was live one session timeout to register again before it is fenced, so a whole
cluster restarts with its leaders and ISRs as they were.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from ray.exceptions import RayActorError

from rayk.actors.cluster_metadata import NO_LEADER, ClusterMetadata, Record
from rayk.actors.group_coordinator import OFFSETS_TOPIC, coordinator_partition
from rayk.actors.metadata_log import MetadataLog
from rayk.actors.replica_manager import PartitionAssignment
from rayk.config import BrokerConfig, validate_topic_configs
from rayk.errors import (
    LeaderNotAvailableError,
    StaleBrokerEpochError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

logger = logging.getLogger(__name__)

SESSION_CHECK_MAX_INTERVAL_MS = 1_000
PRODUCER_ID_BLOCK_SIZE = 1000  # ids reserved per metadata record


def new_uuid() -> str:
    """A Kafka-style id: a random UUID in URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class Controller:
    def __init__(self, directory: str, broker_config: BrokerConfig | None = None) -> None:
        self.dir = Path(directory)
        self.config = broker_config or BrokerConfig()
        self._log = MetadataLog(self.dir)
        self._meta = ClusterMetadata(self.config)
        for offset, record in self._log.replay():
            self._meta.apply(record, offset)
        if self._meta.cluster_id is None:
            self._commit([{"type": "cluster", "cluster_id": new_uuid()}])
        now = time.monotonic()
        self._last_heartbeat: dict[int, float] = {b: now for b in self._meta.live_brokers}
        self._managers: dict[int, Any] = {}  # broker id -> ReplicaManager handle, this session
        self._endpoints: dict[int, tuple[str, int]] = {}  # broker id -> Kafka listener (host, port)
        self._replica_handles: dict[tuple[str, int, int], Any] = {}
        self._tasks: set[asyncio.Task] = set()
        self._registering: set[int] = set()
        self._producer_ids = range(0)  # the reserved block not yet handed out
        self._session_checker: asyncio.Task | None = None

    def _commit(self, records: list[Record]) -> None:
        if not records:
            return
        first_offset = self._log.append(records)
        for i, record in enumerate(records):
            self._meta.apply(record, first_offset + i)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Starts the session checker (idempotent); returns the cluster id.

        Called once the brokers were (re)started: a broker of the replayed metadata that has
        not registered by then gets one full session timeout from now to do so."""
        if self._session_checker is None:
            now = time.monotonic()
            for broker_id in self._meta.live_brokers - set(self._managers):
                self._last_heartbeat[broker_id] = now
            self._session_checker = asyncio.get_running_loop().create_task(self._check_sessions())
        return self._meta.cluster_id

    async def shutdown(self) -> None:
        """Cleanly stops every broker (data and metadata stay on disk), then itself."""
        if self._session_checker is not None:
            self._session_checker.cancel()
        managers = list(self._managers.values())
        self._managers.clear()
        self._meta.attached.clear()
        await asyncio.gather(*(m.shutdown.remote() for m in managers), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        self._log.close()

    # ------------------------------------------------------------------ broker sessions

    async def register_broker(
        self, broker_id: int, node_id: str, manager: Any, endpoint: tuple[str, int] | None = None
    ) -> tuple[int, dict]:
        """A ReplicaManager (re)starts. Returns its broker epoch and the partitions assigned
        to it (topic, partition) -> topic id, after pushing their states to it. `endpoint` is
        its Kafka listener's advertised (host, port), if it runs one."""
        if endpoint is None:
            self._endpoints.pop(broker_id, None)
        else:
            self._endpoints[broker_id] = (str(endpoint[0]), int(endpoint[1]))
        changed: set[tuple[str, int]] = set()
        registration = self._meta.brokers.get(broker_id)
        if registration is not None and not registration.fenced and broker_id in self._managers:
            changed |= self._fence(broker_id)  # a new incarnation: the old replicas' state is gone
        records = self._meta.plan_register_broker(broker_id, node_id)
        self._commit(records)
        changed |= _partitions_in(records)
        epoch = self._meta.brokers[broker_id].epoch
        self._managers[broker_id] = manager
        self._meta.attached.add(broker_id)
        self._spawn(self._watch(broker_id, epoch, manager))
        mine = {(t, p) for t, p, _ in self._meta.partitions_of_broker(broker_id)}
        # Creating replica actors takes a while; the broker cannot heartbeat before this
        # returns, so its session starts when the pushes are done.
        self._registering.add(broker_id)
        try:
            await asyncio.gather(*(self._push_partition(t, p) for t, p in mine | changed))
        finally:
            self._registering.discard(broker_id)
            self._last_heartbeat[broker_id] = time.monotonic()
        logger.info("broker %d registered on node %s with epoch %d", broker_id, node_id, epoch)
        return epoch, {(t, p): self._meta.topics[t].topic_id for t, p in mine}

    async def heartbeat(self, broker_id: int, broker_epoch: int) -> str:
        """Answers "ok", "reregister" (fenced, or unknown to this Controller session) or "stale"."""
        registration = self._meta.brokers.get(broker_id)
        if registration is None or registration.fenced or broker_id not in self._managers:
            return "reregister"
        if broker_epoch != registration.epoch:
            return "stale"
        self._last_heartbeat[broker_id] = time.monotonic()
        return "ok"

    async def _check_sessions(self) -> None:
        timeout_s = self.config.broker_session_timeout_ms / 1000
        period_s = min(SESSION_CHECK_MAX_INTERVAL_MS, self.config.broker_session_timeout_ms // 4) / 1000
        while True:
            await asyncio.sleep(period_s)
            now = time.monotonic()
            for broker_id in sorted(self._meta.live_brokers - self._registering):
                silent_s = now - self._last_heartbeat.get(broker_id, now)
                if silent_s > timeout_s:
                    logger.warning("broker %d silent for %.1f s: fencing it", broker_id, silent_s)
                    await self._fence_and_push(broker_id)

    async def _watch(self, broker_id: int, epoch: int, manager: Any) -> None:
        """Fences the broker as soon as Ray reports its actor dead."""
        try:
            await manager.run_until_stopped.remote()
        except RayActorError:
            registration = self._meta.brokers.get(broker_id)
            if registration is not None and registration.epoch == epoch and not registration.fenced:
                logger.warning("broker %d died: fencing it", broker_id)
                await self._fence_and_push(broker_id)

    def _fence(self, broker_id: int) -> set[tuple[str, int]]:
        records = self._meta.plan_fence_broker(broker_id)
        self._commit(records)
        self._managers.pop(broker_id, None)
        self._meta.attached.discard(broker_id)
        for key in [k for k in self._replica_handles if k[2] == broker_id]:
            del self._replica_handles[key]
        return _partitions_in(records)

    async def _fence_and_push(self, broker_id: int) -> None:
        changed = self._fence(broker_id)
        await asyncio.gather(*(self._push_partition(t, p) for t, p in changed))

    # ------------------------------------------------------------------ pushing states

    async def _push_partition(self, topic: str, partition: int) -> None:
        """Sends the partition's current state to its live replicas, leader first."""
        meta = self._meta.topics.get(topic)
        if meta is None:
            return
        state = meta.partitions[partition]
        live = self._meta.live_brokers

        def assignment(leader_handle: Any) -> PartitionAssignment:
            return PartitionAssignment(topic, partition, meta.topic_id, state, meta.configs, leader_handle)

        leader_handle = None
        if state.leader != NO_LEADER and state.leader in live and state.leader in self._managers:
            leader_handle = await self._push_to(state.leader, assignment(None))
        followers = [b for b in state.replicas if b != state.leader and b in live and b in self._managers]
        await asyncio.gather(*(self._push_to(b, assignment(leader_handle)) for b in followers))

    async def _push_to(self, broker_id: int, assignment: PartitionAssignment) -> Any:
        manager = self._managers.get(broker_id)
        if manager is None:
            return None
        try:
            handle = await manager.apply_partition.remote(assignment)
        except RayActorError:
            self._spawn(self._fence_and_push(broker_id))
            return None
        except Exception:
            logger.exception("pushing %s-%d to broker %d failed", assignment.topic, assignment.partition, broker_id)
            return None
        self._replica_handles[(assignment.topic, assignment.partition, broker_id)] = handle
        return handle

    # ------------------------------------------------------------------ requests from leaders

    async def alter_partition(
        self,
        broker_id: int,
        broker_epoch: int,
        topic: str,
        partition: int,
        leader_epoch: int,
        partition_epoch: int,
        isr: list[int],
    ) -> tuple[list[int], int]:
        """Kafka's AlterPartition: a leader's ISR change, checked and committed."""
        registration = self._meta.brokers.get(broker_id)
        if registration is None or registration.fenced or registration.epoch != broker_epoch:
            raise StaleBrokerEpochError(f"broker {broker_id} epoch {broker_epoch} is fenced or not current")
        self._commit(self._meta.plan_alter_partition(topic, partition, broker_id, leader_epoch, partition_epoch, isr))
        state = self._meta.partition(topic, partition)
        return list(state.isr), state.partition_epoch

    # ------------------------------------------------------------------ topics

    async def create_topic(
        self, name: str, num_partitions: int | None = None, replication_factor: int | None = None,
        configs: dict | None = None,
    ) -> list[dict]:
        """Creates a topic, waits until every live replica has its role; returns its description.
        A count left out (None, or -1 as in Kafka's CreateTopics) takes the brokers' default:
        `num.partitions`, `default.replication.factor`."""
        if num_partitions in (None, -1):
            num_partitions = self.config.num_partitions
        if replication_factor in (None, -1):
            replication_factor = self.config.default_replication_factor
        checked = validate_topic_configs(configs)
        records = self._meta.plan_create_topic(name, num_partitions, replication_factor, checked, new_uuid())
        self._commit(records)
        await asyncio.gather(*(self._push_partition(name, p) for p in range(num_partitions)))
        return await self.describe_topic(name)

    async def delete_topic(self, name: str) -> None:
        partitions = dict(self._meta.topics[name].partitions) if name in self._meta.topics else {}
        self._commit(self._meta.plan_delete_topic(name))
        stops = []
        for p, state in partitions.items():
            for b in state.replicas:
                self._replica_handles.pop((name, p, b), None)
                if (manager := self._managers.get(b)) is not None:
                    stops.append(manager.stop_replica.remote(name, p, True))
        await asyncio.gather(*stops, return_exceptions=True)

    async def alter_topic_configs(self, name: str, configs: dict) -> dict[str, str]:
        """Replaces the topic's configs (Kafka names); replicas pick them up as they are
        recreated (min.insync.replicas, retention, segment settings)."""
        checked = validate_topic_configs(configs)
        self._commit(self._meta.plan_alter_topic_configs(name, checked))
        meta = self._meta.topics[name]
        await asyncio.gather(*(self._push_partition(name, p) for p in meta.partitions))
        return dict(meta.configs)

    async def list_topics(self) -> list[str]:
        return sorted(self._meta.topics)

    async def init_producer_id(self) -> int:
        """A producer id never handed out before, even across Controller restarts."""
        if not self._producer_ids:
            first = self._meta.next_producer_id
            self._commit(self._meta.plan_allocate_producer_ids(PRODUCER_ID_BLOCK_SIZE))
            self._producer_ids = range(first, self._meta.next_producer_id)
        producer_id, self._producer_ids = self._producer_ids[0], self._producer_ids[1:]
        return producer_id

    # ------------------------------------------------------------------ group coordinators

    async def find_coordinator(self, group_id: str) -> tuple[int, Any]:
        """(partition of __consumer_offsets, handle of its leader replica) for a group;
        creates the internal topic on first use, as Kafka does."""
        if OFFSETS_TOPIC not in self._meta.topics:
            c = self.config
            rf = min(c.offsets_topic_replication_factor, len(self._meta.live_brokers))
            try:
                await self.create_topic(OFFSETS_TOPIC, c.offsets_topic_num_partitions, max(rf, 1), {"retention.ms": "-1"})
            except TopicAlreadyExistsError:
                pass  # a concurrent request created it
        partition = coordinator_partition(group_id, len(self._meta.topics[OFFSETS_TOPIC].partitions))
        return partition, await self.leader(OFFSETS_TOPIC, partition)

    async def coordinators(self) -> list[Any]:
        """Handles of every __consumer_offsets leader (to list all groups)."""
        meta = self._meta.topics.get(OFFSETS_TOPIC)
        if meta is None:
            return []
        return [self._replica_handles.get((OFFSETS_TOPIC, p, s.leader)) for p, s in sorted(meta.partitions.items())]

    async def describe_topic(self, name: str) -> list[dict]:
        """Per partition: leader, replicas, isr, epochs, and the leader's HW and LEO."""
        meta = self._meta.topics.get(name)
        if meta is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        out = []
        for p, state in sorted(meta.partitions.items()):
            handle = self._replica_handles.get((name, p, state.leader))
            offsets = {"high_watermark": None, "log_end_offset": None, "log_start_offset": None}
            if handle is not None:
                try:
                    info = await handle.describe.remote()
                    offsets = {k: info[k] for k in offsets}
                except RayActorError:
                    pass
            out.append(
                {
                    "topic": name,
                    "topic_id": meta.topic_id,
                    "partition": p,
                    "leader": state.leader,
                    "replicas": list(state.replicas),
                    "isr": list(state.isr),
                    "leader_epoch": state.leader_epoch,
                    "partition_epoch": state.partition_epoch,
                    **offsets,
                }
            )
        return out

    async def topic_configs(self, name: str) -> dict[str, str]:
        if name not in self._meta.topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return dict(self._meta.topics[name].configs)

    async def leader(self, topic: str, partition: int) -> Any:
        """The leader replica's actor handle; LEADER_NOT_AVAILABLE while there is none."""
        state = self._meta.partition(topic, partition)
        handle = self._replica_handles.get((topic, partition, state.leader))
        if handle is None:
            raise LeaderNotAvailableError(f"{topic}-{partition} has no leader ready (leader {state.leader})")
        return handle

    async def replica(self, topic: str, partition: int, broker_id: int) -> Any:
        """The actor handle of one replica (leader or follower); None if its broker is away."""
        self._meta.partition(topic, partition)
        return self._replica_handles.get((topic, partition, broker_id))

    async def metadata(self, topics: list[str] | None = None) -> dict[str, dict]:
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
                        "leader_handle": self._replica_handles.get((name, p, s.leader)),
                    }
                    for p, s in sorted(meta.partitions.items())
                },
            }
        return out

    async def client_metadata(self, topics: list[str] | None = None) -> dict[str, Any]:
        """What Kafka's Metadata answer holds: the live brokers' listeners, and per topic
        (all, or those of `topics` that exist) its id and per partition leader, epoch,
        replicas and ISR."""
        live = self._meta.live_brokers
        names = sorted(self._meta.topics) if topics is None else [t for t in topics if t in self._meta.topics]
        return {
            "cluster_id": self._meta.cluster_id,
            "brokers": {b: self._endpoints[b] for b in sorted(live) if b in self._endpoints},
            "topics": {
                name: {
                    "topic_id": self._meta.topics[name].topic_id,
                    "partitions": {
                        p: {"leader": s.leader, "leader_epoch": s.leader_epoch, "replicas": list(s.replicas), "isr": list(s.isr)}
                        for p, s in sorted(self._meta.topics[name].partitions.items())
                    },
                }
                for name in names
            },
        }

    # ------------------------------------------------------------------ brokers

    async def brokers(self) -> list[dict]:
        return [
            {
                "broker_id": b.broker_id,
                "epoch": b.epoch,
                "node_id": b.node_id,
                "fenced": b.fenced,
                "connected": b.broker_id in self._managers,
                "endpoint": self._endpoints.get(b.broker_id),
            }
            for b in sorted(self._meta.brokers.values(), key=lambda r: r.broker_id)
        ]

    async def cluster_id(self) -> str:
        return self._meta.cluster_id

    async def data_dir(self) -> str:
        return str(self.dir)

    async def broker_config(self) -> BrokerConfig:
        return self.config


def _partitions_in(records: list[Record]) -> set[tuple[str, int]]:
    return {(r["topic"], r["partition"]) for r in records if r["type"] == "partition"}

