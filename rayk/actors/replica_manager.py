"""ReplicaManager: one broker, as a Ray actor pinned to one node (Kafka's ReplicaManager
plus its BrokerLifecycleManager).

A broker is this actor, the PartitionReplica actors it creates, and its Kafka listener (a
SocketServer actor on the same node, started before registering so that the Controller
can tell clients where the broker listens).
It owns `<data_dir>/broker-<id>` on its node's disk: `meta.properties` (broker and
cluster id, checked at every start), the three offset checkpoints, and one
`<topic>-<partition>` directory per replica, each with a `partition.metadata` naming the
topic id.

Lifecycle: `start` registers with the Controller (a new broker epoch every time) and starts
four loops, each with its period named after Kafka's setting:
- heartbeat every `broker.heartbeat.interval.ms`; a Controller that no longer knows this
  registration (it fenced us, or it restarted) gets a new registration;
- isr-expiration every `replica.lag.time.max.ms / 2`, on every replica this broker leads;
- offset checkpoints every `replica.high.watermark.checkpoint.interval.ms`;
- retention every `log.retention.check.interval.ms`.

The Controller pushes partition states with `apply_partition` (leader, ISR, epochs, and the
leader replica's handle for followers). Pushes may arrive out of order; each carries its
epochs, and an older one than the replica has seen is ignored. Replicas send ISR changes
back through `alter_partition`, which adds this broker's epoch so a fenced or replaced
incarnation cannot change an ISR.

A replica actor is created on this node (hard node affinity) and is owned by this actor:
if the broker dies, its replicas die with it. A restarted broker (same id, same disk)
reopens every log from its checkpoints and rejoins as the Controller assigns.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayk.actors.cluster_metadata import PartitionState
from rayk.actors.group_coordinator import OFFSETS_TOPIC
from rayk.actors.offsets_replica import OffsetsPartitionReplica
from rayk.actors.partition_replica import PartitionReplica, ReplicaConfig
from rayk.config import BrokerConfig, log_config_of, min_insync_replicas_of
from rayk.errors import StaleBrokerEpochError
from rayk.net.listener_address import parse_listener
from rayk.net.socket_server import SocketServerActor
from rayk.storage import meta_properties, partition_metadata
from rayk.storage.log_dir_checkpoints import LogDirCheckpoints, PartitionOffsets
from rayk.storage.log_manager import partition_dir_name
from rayk.storage.meta_properties import MetaProperties

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
ReplicaActor = ray.remote(num_cpus=0)(PartitionReplica)
OffsetsReplicaActor = ray.remote(num_cpus=0)(OffsetsPartitionReplica)
CONTROLLER_RETRY_BACKOFF_MS = 200


def broker_dir(data_dir: str | Path, broker_id: int) -> Path:
    return Path(data_dir) / f"broker-{broker_id}"


@dataclass(frozen=True, slots=True)
class PartitionAssignment:
    """What the Controller tells a broker about one partition it replicates."""

    topic: str
    partition: int
    topic_id: str
    state: PartitionState
    configs: dict[str, str]
    leader_handle: Any = None  # the leader's PartitionReplica, for followers


@dataclass(slots=True)
class _Replica:
    handle: Any
    assignment: PartitionAssignment


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        data_dir: str,
        cluster_id: str,
        controller: Any,
        broker_config: BrokerConfig | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.config = broker_config or BrokerConfig()
        self.dir = broker_dir(data_dir, broker_id)
        meta_properties.ensure(self.dir, MetaProperties(cluster_id, broker_id))
        self._checkpoints = LogDirCheckpoints(self.dir)
        self._checkpoints_lock = asyncio.Lock()  # writes run in a thread; one at a time
        self._controller = controller
        self._node_id = ray.get_runtime_context().get_node_id()
        self._replicas: dict[TopicPartition, _Replica] = {}
        self._locks: dict[TopicPartition, asyncio.Lock] = {}
        self._broker_epoch = -1
        self._loops: list[asyncio.Task] = []
        self._stopped: asyncio.Event | None = None
        self._listener: Any = None  # this broker's SocketServer actor, if it runs one
        self._endpoint: tuple[str, int] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        """Registers with the Controller and starts the broker's loops; returns the broker epoch."""
        if self._stopped is None:
            self._stopped = asyncio.Event()
        if self._broker_epoch < 0:
            await self._start_listener()
            await self._register()
            c = self.config
            self._loops = [
                self._every(c.broker_heartbeat_interval_ms, self._heartbeat),
                self._every(c.replica_lag_time_max_ms // 2, self._expire_isr),
                self._every(c.replica_high_watermark_checkpoint_interval_ms, self._checkpoint),
                self._every(c.log_retention_check_interval_ms, self._enforce_retention),
            ]
        return self._broker_epoch

    async def _start_listener(self) -> None:
        """The broker's Kafka listener, on this node, when `listeners` names one."""
        if self._listener is not None or parse_listener(self.config.listeners) is None:
            return
        self._listener = SocketServerActor.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(self._node_id, soft=False)
        ).remote(self.broker_id, self._controller, self.config)
        self._endpoint = await self._listener.start.remote()

    async def _register(self) -> None:
        me = ray.get_runtime_context().current_actor
        epoch, assigned = await self._controller.register_broker.remote(self.broker_id, self._node_id, me, self._endpoint)
        self._broker_epoch = epoch
        await self._delete_strays(assigned)
        logger.info("broker %d registered with epoch %d", self.broker_id, epoch)

    async def _delete_strays(self, assigned: dict[TopicPartition, str]) -> None:
        """Removes partition directories of topics deleted (or re-created) while we were away."""
        for path in self.dir.iterdir():
            if not path.is_dir() or (topic_id := partition_metadata.read(path)) is None:
                continue
            topic, _, partition = path.name.rpartition("-")
            if not partition.isdigit():
                continue
            tp = (topic, int(partition))
            if assigned.get(tp) != topic_id and tp not in self._replicas:
                logger.info("broker %d: deleting stray partition directory %s", self.broker_id, path)
                await self._delete_partition_dir(tp)

    def _every(self, period_ms: int, step: Any) -> asyncio.Task:
        async def loop() -> None:
            while True:
                await asyncio.sleep(period_ms / 1000)
                try:
                    await step()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("broker %d: %s failed", self.broker_id, step.__name__)

        return asyncio.get_running_loop().create_task(loop())

    async def run_until_stopped(self) -> None:
        """Returns when the broker shuts down cleanly; the Controller's call fails if it dies."""
        if self._stopped is None:
            self._stopped = asyncio.Event()
        await self._stopped.wait()

    async def shutdown(self) -> None:
        """Clean shutdown: stop the loops, close every replica (flushing its log), checkpoint."""
        if self._listener is not None:
            await asyncio.gather(self._listener.stop.remote(), return_exceptions=True)
            ray.kill(self._listener)
            self._listener = None
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        items = list(self._replicas.items())
        closed = await asyncio.gather(*(r.handle.close.remote() for _, r in items), return_exceptions=True)
        await self._write_checkpoints({tp: o for (tp, _), o in zip(items, closed) if isinstance(o, PartitionOffsets)})
        for _, r in items:
            ray.kill(r.handle)
        self._replicas.clear()
        if self._stopped is not None:
            self._stopped.set()

    # ------------------------------------------------------------------ the loops

    async def _heartbeat(self) -> None:
        try:
            status = await self._controller.heartbeat.remote(self.broker_id, self._broker_epoch)
        except RayActorError:
            return  # the Controller is restarting; the next beat will reach it
        if status == "reregister":
            await self._register()
        elif status == "stale":
            raise StaleBrokerEpochError(f"broker {self.broker_id} epoch {self._broker_epoch} was replaced")

    async def _expire_isr(self) -> None:
        leaders = [r for r in self._replicas.values() if r.assignment.state.leader == self.broker_id]
        await asyncio.gather(*(r.handle.maybe_shrink_isr.remote() for r in leaders), return_exceptions=True)

    async def _checkpoint(self) -> None:
        items = list(self._replicas.items())
        offsets = await asyncio.gather(*(r.handle.checkpoint_offsets.remote() for _, r in items), return_exceptions=True)
        await self._write_checkpoints({tp: o for (tp, _), o in zip(items, offsets) if isinstance(o, PartitionOffsets)})

    async def _write_checkpoints(self, offsets: dict[TopicPartition, PartitionOffsets]) -> None:
        async with self._checkpoints_lock:
            # Three fsyncs: off the event loop, so heartbeats and pushes are not held up by the disk.
            await asyncio.to_thread(self._checkpoints.write, offsets)

    async def _delete_partition_dir(self, tp: TopicPartition) -> None:
        async with self._checkpoints_lock:
            shutil.rmtree(self.dir / partition_dir_name(*tp), ignore_errors=True)
            self._checkpoints.remove(tp)

    async def _enforce_retention(self) -> None:
        await asyncio.gather(*(r.handle.enforce_retention.remote() for r in self._replicas.values()), return_exceptions=True)

    # ------------------------------------------------------------------ Controller -> broker

    async def apply_partition(self, assignment: PartitionAssignment) -> Any:
        """Makes this broker's replica of a partition lead or follow as the Controller says;
        returns the replica's actor handle."""
        tp = (assignment.topic, assignment.partition)
        async with self._locks.setdefault(tp, asyncio.Lock()):
            current = self._replicas.get(tp)
            if current is not None:
                old = current.assignment
                if old.topic_id != assignment.topic_id:
                    await self._stop_replica(tp, delete=True)  # a new topic under an old name
                    current = None
                elif (assignment.state.leader_epoch, assignment.state.partition_epoch) < (
                    old.state.leader_epoch,
                    old.state.partition_epoch,
                ):
                    return current.handle  # an older push that arrived late
            if current is None:
                current = self._replicas[tp] = _Replica(await self._create_replica(assignment), assignment)
            elif current.assignment.configs != assignment.configs:
                await current.handle.update_config.remote(
                    log_config_of(assignment.configs), self._replica_config(assignment.configs)
                )
            current.assignment = assignment
            await self._make_role(current)
            return current.handle

    async def _create_replica(self, a: PartitionAssignment) -> Any:
        tp = (a.topic, a.partition)
        log_dir = self.dir / partition_dir_name(a.topic, a.partition)
        if partition_metadata.read(log_dir) not in (None, a.topic_id):
            await self._delete_partition_dir(tp)  # records of a deleted topic that had the same name
        partition_metadata.write(log_dir, a.topic_id)
        args = (
            a.topic,
            a.partition,
            self.broker_id,
            str(log_dir),
            log_config_of(a.configs),
            self._replica_config(a.configs),
            self._checkpoints.offsets(tp),
            ray.get_runtime_context().current_actor,
        )
        pinned = NodeAffinitySchedulingStrategy(self._node_id, soft=False)
        if a.topic == OFFSETS_TOPIC:
            return OffsetsReplicaActor.options(scheduling_strategy=pinned).remote(*args, broker_config=self.config)
        return ReplicaActor.options(scheduling_strategy=pinned).remote(*args)

    def _replica_config(self, topic_configs: dict[str, str]) -> ReplicaConfig:
        c = self.config
        return ReplicaConfig(
            min_insync_replicas=min_insync_replicas_of(topic_configs, c),
            replica_lag_time_max_ms=c.replica_lag_time_max_ms,
            replica_fetch_max_bytes=c.replica_fetch_max_bytes,
            replica_fetch_min_bytes=c.replica_fetch_min_bytes,
            replica_fetch_wait_max_ms=c.replica_fetch_wait_max_ms,
        )

    async def _make_role(self, replica: _Replica) -> None:
        state = replica.assignment.state
        if state.leader == self.broker_id:
            await replica.handle.become_leader.remote(
                state.leader_epoch, list(state.replicas), list(state.isr), state.partition_epoch
            )
        else:
            await replica.handle.become_follower.remote(state.leader_epoch, state.leader, replica.assignment.leader_handle)

    async def stop_replica(self, topic: str, partition: int, delete: bool) -> None:
        tp = (topic, partition)
        async with self._locks.setdefault(tp, asyncio.Lock()):
            await self._stop_replica(tp, delete)

    async def _stop_replica(self, tp: TopicPartition, delete: bool) -> None:
        replica = self._replicas.pop(tp, None)
        if replica is None:
            if delete:
                await self._delete_partition_dir(tp)
            return
        try:
            if delete:
                await replica.handle.delete.remote()
            else:
                await self._write_checkpoints({tp: await replica.handle.close.remote()})
        except RayActorError:
            pass  # already dead: the directory is what remains
        ray.kill(replica.handle)
        if delete:
            await self._delete_partition_dir(tp)

    # ------------------------------------------------------------------ broker -> Controller

    async def alter_partition(
        self, topic: str, partition: int, leader_id: int, leader_epoch: int, partition_epoch: int, isr: list[int]
    ) -> tuple[list[int], int]:
        """Forwards a leader replica's ISR change to the Controller with this broker's epoch."""
        assert leader_id == self.broker_id, "only this broker's replicas report here"
        return await self._controller.alter_partition.remote(
            self.broker_id, self._broker_epoch, topic, partition, leader_epoch, partition_epoch, isr
        )

    # ------------------------------------------------------------------ inspection

    async def describe(self) -> dict[str, Any]:
        return {
            "broker_id": self.broker_id,
            "broker_epoch": self._broker_epoch,
            "node_id": self._node_id,
            "data_dir": str(self.dir),
            "replicas": sorted(self._replicas),
        }
