"""ReplicaManager: one broker, as a Ray actor pinned to one node (Kafka's ReplicaManager
plus its BrokerLifecycleManager and LogManager's startup and shutdown).

A broker is this actor, the PartitionReplica actors it creates, and its Kafka listener (a
SocketServer actor on the same node, started while the broker registers; its address
then goes to the Controller, which tells clients where the broker listens; kept by a
BrokerListener, broker_listener.py). The listener comes from a `listener_factory` that
whoever deploys the broker hands in (rayk/broker.py): this module never imports rayk/net, so the wire protocol stays out of the processes that
only hold a broker's handle. Every replica holds one, and Ray loads a handle's class
module in the process that receives it.
It owns `<data_dir>/broker-<id>` on its node's disk: `meta.properties` (broker and
cluster id, checked at every start, and the directory's id), the three offset
checkpoints, the clean-shutdown marker, and one `<topic>-<partition>` directory per
replica, each with a `partition.metadata` naming the topic id.

Lifecycle: at start it consumes the clean-shutdown marker (KIP-966: none means the last
run crashed and its logs may have lost their unflushed tails), then registers with the
Controller (a new broker epoch every time) with a new incarnation id, its directory id
and whether its last shutdown was clean, and starts its loops (all in `start`, each a
task of its own, so that a slow one never delays the heartbeat), each with its period
named after Kafka's setting:
- heartbeat every `broker.heartbeat.interval.ms`; a Controller that no longer knows this
  registration (it fenced us, or it restarted) gets a new registration, at once the first
  time and backing off if it keeps happening (each registration has every partition of the
  broker pushed again);
- a probe round every `broker.heartbeat.interval.ms`, which pings those of its replicas and
  its listener that answered nothing for a third of `broker.session.timeout.ms` (a
  replica's publication on the board counts: see supervision.py);
- the BrokerLogManager's (broker_log_manager.py): offset checkpoints every
  `replica.high.watermark.checkpoint.interval.ms`, of the offsets the replicas last
  published on the broker's board (replica_board.py: shared memory each replica writes on
  a timer of its own, more often than that and than a third of
  `broker.session.timeout.ms`; no call); retention every
  `log.retention.check.interval.ms`; the log cleaner (if `log.cleaner.enable`), which
  waits `log.cleaner.backoff.ms` when no log needs it (see log_cleaner.py);
- isr-expiration is not among them: each leader runs it in its own event loop (see
  leader_isr.py);
- its metrics every GAUGE_REFRESH_INTERVAL_MS (rayk/metrics.py): Kafka's ReplicaManager
  gauges from the partition states the Controller pushed (broker_health.py, also served
  by `health` for `rayk status`) and each replica's log size as of the last checkpoint;
  and, as often, in a loop of its own since it waits for other actors, the consumer lag
  of the groups its coordinators hold (group_lag.py).
A clean `shutdown` closes every replica (flushing its log), checkpoints and writes the
marker last.

The Controller pushes partition states with `apply_partition` (leader, ISR, epochs, and the
leader replica's handle for followers); a replica is told its role with its share of the
broker's replication throttles while a reassignment it takes part in adds replicas
(broker_throttles.py), and the others their new shares as such moves start and complete.
A push that needs a new replica process waits for one of REPLICA_STARTS_IN_FLIGHT start
slots, held until the process's first answer, so creating many partitions never takes
every core of the node at once. Pushes may arrive out of order; each carries its
epochs, and an older one than the replica has seen is ignored. Replicas send ISR changes
back through `alter_partition`, which adds this broker's epoch so a fenced or replaced
incarnation cannot change an ISR, and counts the changes the Controller commits (Kafka's
IsrShrinksPerSec and IsrExpandsPerSec).

Supervision (see supervision.py). Replicas and the listener are created on this node
(hard node affinity) and owned by this actor: if the broker dies, they die with it.
- A replica that dies (or stops answering for `broker.session.timeout.ms` without being
  seen running, and is then killed; a slow one is late, not dead) is a replica failure,
  not a broker failure: this broker reports it to the Controller (`replica_failed`), which
  moves its leadership and takes it out of the ISR, then pushes the partition again; that
  push re-creates the replica from its log on disk, at once the first time and backing off
  (REPLICA_RESTARTS) if it keeps dying. Until then, a push that would have it lead in the
  epoch it failed in is not applied.
- A replica that died may have met a failing disk (storage_failure.py): the broker then
  probes its data directory, and one that fails the probe goes offline
  (log_dir_health.py, Kafka's KIP-112): every replica in it is stopped and reported as
  failed, none is created there while it is offline (DescribeLogDirs says
  KAFKA_STORAGE_ERROR), and once a probe passes the Controller pushes the broker's
  partitions again (`replicas_ready`), which creates them. So does a broker loop that the
  disk fails (an offset checkpoint's write or fsync).
- A listener that dies is started again on the ports it had, backing off, and its address
  sent to the Controller (broker_listener.py).
- This actor itself is created with `max_restarts=-1`: if its process dies while its node
  lives, Ray starts it again on the same node, where it starts itself (recovering its
  logs, registering as a new incarnation). If the node is gone, it stays dead until the
  broker is started elsewhere with its disk (`Cluster.restart_broker`) or the Controller
  moves its replicas away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
import time
import uuid
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayk import metrics
from rayk.actors import CONTROLLER_NAME, INTERNAL_ACTOR_OPTIONS, raylet_watch
from rayk.actors.named_actor import NamedActor
from rayk.ray_settings import lowered_priority_warning
from rayk.server.broker_health import broker_health
from rayk.server.broker_log_manager import BrokerLogManager
from rayk.server.log_dir_health import LogDirHealth
from rayk.server.broker_throttles import BrokerThrottles
from rayk.metadata.cluster_metadata import NO_LEADER, PartitionState
from rayk.coordinator.group.group_lag import group_lags
from rayk.coordinator.group.offsets_replica import OffsetsPartitionReplica
from rayk.replication.partition_replica import PartitionReplica, ReplicaConfig
from rayk.replication.replica_board import BoardSlot, ReplicaBoard
from rayk.replication.replication_throttle import ThrottleSetting
from rayk.replication.share.share_fetch import ShareSettings
from rayk.coordinator.transaction.transaction_state_replica import TransactionStatePartitionReplica
from rayk.actors.restart_backoff import BackoffPolicy, RestartBackoff
from rayk.actors.supervision import ChildSupervisor, ProcessProgress, Supervised, start_again_if_restarted
from rayk.server.broker_listener import LISTENER, BrokerListener, Endpoints, ListenerFactory
from rayk.config import BrokerConfig, log_config_of, min_insync_replicas_of
from rayk.dataplane.tls import data_plane_keystore
from rayk.errors import KafkaError, KafkaStorageError, StaleBrokerEpochError
from rayk.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from rayk.storage import clean_shutdown, meta_properties
from rayk.storage.log_dir_checkpoints import PartitionOffsets
from rayk.storage.meta_properties import MetaProperties

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
ReplicaActor = ray.remote(**INTERNAL_ACTOR_OPTIONS)(PartitionReplica)
OffsetsReplicaActor = ray.remote(**INTERNAL_ACTOR_OPTIONS)(OffsetsPartitionReplica)
TransactionStateReplicaActor = ray.remote(**INTERNAL_ACTOR_OPTIONS)(TransactionStatePartitionReplica)
CONTROLLER_RETRY_BACKOFF_MS = 200
MAX_STOPPED_REMEMBERED = 100_000  # stopped partitions whose late pushes a broker ignores
STRAY_CHECK_HEARTBEATS = 10  # how often (in heartbeat intervals) a broker looks for replicas nobody assigns it
# Replica processes a broker starts at a time (from creation to its first answer): each
# start costs ~0.35 CPU-s of Ray's worker before rayk's own, so a topic of a hundred
# partitions started at once took every core of a 2-core node for a minute, heartbeats
# included. A start waiting for its turn holds no core. See benchmarks/capacity_bench.py.
REPLICA_STARTS_IN_FLIGHT = 2
# A replica's re-creation after its process died: the first at once, then 1 s doubling to
# 30 s with jitter, at most 10 in 10 minutes (restart_backoff.py).
REPLICA_RESTARTS = BackoffPolicy(first_delay_s=1, max_delay_s=30, budget=10, window_s=600)
REGISTRATION = "registration"  # the backoff's key for registering again


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
    handle: Any  # None after the replica died, until the Controller's next push re-creates it
    assignment: PartitionAssignment
    failed_in_epoch: int = -1  # the leader epoch it died in, while handle is None
    last_push: int = 0  # the number of the last push applied to it (ReplicaManager._pushes_applied)
    slot: BoardSlot | None = None  # where its process publishes its offsets, while handle is set
    process: ProcessProgress | None = None  # its process on this node, once it told its pid


async def _tell_throttle(handle: Any, setting: ThrottleSetting) -> None:
    try:
        await handle.throttle_replication.remote(setting)
    except RayActorError:
        pass  # it died: the push that re-creates it tells it its share


def _node_memory_bytes() -> int:
    """This node's memory as Ray's memory monitor sees it: a cgroup's limit where one is set
    (a container), else the host's."""
    from ray._private.utils import get_system_memory  # what Ray's own memory monitor reads

    return int(get_system_memory())


def _node_cpus() -> float:
    """This node's cores as Ray counts them by default: a cgroup's CPU quota where one is
    set (a container), else the host's."""
    from ray._private.utils import get_num_cpus

    return float(get_num_cpus())


def replica_config_of(topic_configs: dict[str, str], c: BrokerConfig) -> ReplicaConfig:
    """The settings of a replica of a topic with `topic_configs`, on a broker configured so."""
    return ReplicaConfig(
        min_insync_replicas=min_insync_replicas_of(topic_configs, c),
        replica_lag_time_max_ms=c.replica_lag_time_max_ms,
        replica_fetch_max_bytes=c.replica_fetch_max_bytes,
        replica_fetch_min_bytes=c.replica_fetch_min_bytes,
        replica_fetch_wait_max_ms=c.replica_fetch_wait_max_ms,
        replica_socket_timeout_ms=c.replica_socket_timeout_ms,
        data_plane_host=next((listener.host for listener in c.kafka_listeners()), ""),
        data_plane_keystore=data_plane_keystore(c),
        share=ShareSettings(c.group_share_record_lock_duration_ms, c.group_share_delivery_count_limit,
                            c.group_share_partition_max_record_locks),
        remote_storage=c.remote_storage(),
        remote_log_manager_task_interval_ms=c.remote_log_manager_task_interval_ms,
    )


class ReplicaManager(Supervised):
    """One broker: its registration and heartbeats, its replicas (created, supervised, told
    their roles, stopped), its listener, and its loops; its logs' checkpoints, retention
    and cleaning are its BrokerLogManager's."""

    def __init__(
        self,
        broker_id: int,
        data_dir: str,
        cluster_id: str,
        controller: Any,
        broker_config: BrokerConfig | None = None,
        listener_factory: ListenerFactory | None = None,
        namespace: str | None = None,
    ) -> None:
        """`listener_factory` starts the broker's Kafka listener; without one the broker
        serves only actor handles. `namespace`: the Ray namespace this actor and the
        Controller are named in (a Ray actor's runtime context tells its job's namespace,
        not the one it was named in); its replicas reach both by name (NamedActor)."""
        raylet_watch.start()  # this process goes with its node's raylet (raylet_watch.py)
        self.broker_id = broker_id
        self.config = broker_config or BrokerConfig()
        self.dir = broker_dir(data_dir, broker_id)
        ensured = meta_properties.ensure(self.dir, MetaProperties(cluster_id, broker_id))
        if ensured.formatted:
            logger.warning("broker %d: formatted %s as a new data directory", broker_id, self.dir)
        self._directory_id = ensured.meta.directory_id
        # KIP-966: consumed before anything is written, so a crash of this run is seen next time.
        self._clean_shutdown = clean_shutdown.consume(self.dir) is not None
        self._incarnation_id = uuid.uuid4().hex  # this process; the Controller tells restarts apart by it
        # Replicas publish more often than their broker checkpoints, and than it would ping
        # them (a third of the session timeout): a live replica is pinged only to check that
        # it takes calls (supervision.py, CALL_CHECK_PINGS).
        self._board = ReplicaBoard(self.dir, max(1, min(self.config.replica_high_watermark_checkpoint_interval_ms,
                                                        self.config.broker_session_timeout_ms // 4)))  # fmt: skip
        self._controller = controller
        self._namespace = namespace if namespace is not None else ray.get_runtime_context().namespace
        self._node_id = ray.get_runtime_context().get_node_id()
        self._replicas: dict[TopicPartition, _Replica] = {}
        # Partitions whose replica the Controller stopped and deleted here: (topic id, the
        # partition epoch up to which a push is older than the stop, None: every epoch, the
        # topic was deleted). Bounded: the oldest are forgotten first.
        self._stopped: dict[TopicPartition, tuple[str, int | None]] = {}
        self._pushes_applied = 0  # pushes applied so far: which replicas a stray check may judge
        self._logs = BrokerLogManager(broker_id, self.dir, self._board, self._replicas, self.config)
        self._log_dir = LogDirHealth(self.dir, self.config.broker_heartbeat_interval_ms / 1000)
        self._throttles = BrokerThrottles(broker_id, self.config)
        self._locks: dict[TopicPartition, asyncio.Lock] = {}
        self._broker_epoch = -1
        self._loops: list[asyncio.Task] = []
        self._tasks: set[asyncio.Task] = set()
        self._start_lock: asyncio.Lock | None = None
        self._registered_event: asyncio.Event | None = None
        self._children = ChildSupervisor(f"broker {broker_id}", self._on_child_death, self.config.broker_session_timeout_ms)
        self._listener = BrokerListener(broker_id, listener_factory, controller, self.config, self._node_id, self._children)
        self._starts = asyncio.Semaphore(REPLICA_STARTS_IN_FLIGHT)  # replica processes starting (bounded)
        self._replica_restarts = RestartBackoff(REPLICA_RESTARTS)
        # Registering again after the Controller fenced this broker: at once the first time,
        # then from a heartbeat interval doubling to twice the session timeout, with jitter.
        c = self.config
        self._registrations = RestartBackoff(BackoffPolicy(
            c.broker_heartbeat_interval_ms / 1000, 2 * c.broker_session_timeout_ms / 1000, budget=10,
            window_s=max(600, 2 * c.broker_session_timeout_ms / 1000)))  # fmt: skip
        if start_again_if_restarted():  # Ray restarted this broker after its process died
            logger.warning("broker %d restarted by Ray after its process died; starting again", broker_id)
        if below_a_server := lowered_priority_warning(f"broker {broker_id}"):  # its replicas and listener too
            logger.warning(below_a_server)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        """Registers with the Controller and starts the broker's loops; returns the broker
        epoch. Idempotent: concurrent calls wait for the first."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._broker_epoch < 0:
                # The listener's process starts while the broker registers: a restarted
                # broker's partitions should not wait for it. Its address follows.
                listener = asyncio.get_running_loop().create_task(self._listener.start())
                await self._register()
                await listener
                if self._listener.endpoints is not None:
                    await self._publish_endpoints()
                c = self.config
                self._loops = [
                    self._every(c.broker_heartbeat_interval_ms, self._heartbeat),
                    self._every(c.broker_heartbeat_interval_ms, self._probe_children),
                    self._every(c.broker_heartbeat_interval_ms * STRAY_CHECK_HEARTBEATS, self._stop_strays),
                    self._every(c.replica_high_watermark_checkpoint_interval_ms, self._on_disk(self._logs.checkpoint)),
                    self._every(c.log_retention_check_interval_ms, self._on_disk(self._logs.enforce_retention)),
                    self._every(metrics.GAUGE_REFRESH_INTERVAL_MS, self._record_metrics),
                    self._every(metrics.GAUGE_REFRESH_INTERVAL_MS, self._record_group_lag),
                ]
                if c.log_cleaner_enable:
                    self._loops.append(self._every(c.log_cleaner_backoff_ms, self._on_disk(self._logs.clean_logs)))
        return self._broker_epoch

    async def _publish_endpoints(self) -> None:
        """The listener's address, to the Controller. If the broker's session lapsed while
        the listener started (no heartbeat goes before the listener is up; on a loaded
        machine that start can outlast broker.session.timeout.ms), the Controller fenced
        it: it registers again, with the address, as a heartbeat told "reregister" does."""
        try:
            await self._controller.update_endpoints.remote(self.broker_id, self._broker_epoch, self._listener.endpoints)
        except StaleBrokerEpochError:
            if await self._controller.heartbeat.remote(self.broker_id, self._broker_epoch) != "reregister":
                raise  # replaced by another registration of this broker, not fenced
            logger.warning("broker %d: fenced while its listener started; registering again", self.broker_id)
            await self._register_again()

    async def _register(self) -> None:
        """Registers (again), retrying while the Controller is unreachable (restarting)."""
        me = ray.get_runtime_context().current_actor
        while True:
            try:
                epoch, assigned = await self._controller.register_broker.remote(
                    self.broker_id,
                    self._node_id,
                    me,
                    self._listener.endpoints,
                    self._incarnation_id,
                    self._directory_id,
                    self._clean_shutdown,
                    _node_memory_bytes(),
                    _node_cpus(),
                )
                break
            except RayActorError as e:
                logger.warning("broker %d: the Controller is unreachable (%s); registering again", self.broker_id, e)
                await asyncio.sleep(CONTROLLER_RETRY_BACKOFF_MS / 1000)
        self._broker_epoch = epoch
        self._registered().set()
        await self._logs.delete_strays(assigned)
        logger.info("broker %d registered with epoch %d", self.broker_id, epoch)

    async def _register_again(self) -> None:
        """Registers again after the Controller fenced this broker, backing off when it
        keeps doing so: each registration has the Controller push every partition this
        broker holds, which on a starved node is more of what made it late."""
        delay_s = self._registrations.delay_s(REGISTRATION)
        if delay_s > 0:
            logger.warning("broker %d: fenced again; registering again in %.1f s (%d registrations in the last %.0f s)",
                           self.broker_id, delay_s, self._registrations.recent(REGISTRATION),
                           self._registrations.policy.window_s)  # fmt: skip
            await asyncio.sleep(delay_s)
        self._registrations.restarted(REGISTRATION)
        await self._register()

    async def _stop_strays(self) -> None:
        """Stops and deletes the replicas whose partition the Controller no longer assigns
        to this broker (deleted, or moved away) although no stop reached us: a stop lost to a
        Controller restart, say, left a replica fetching from a leader that is gone, forever.
        Only replicas that no push reached since the question are judged: a push answered
        after it may be for a partition created meanwhile."""
        asked_at = self._pushes_applied
        try:
            assigned = await self._controller.assigned_partitions.remote(self.broker_id, self._broker_epoch)
        except (RayActorError, KafkaError):
            return  # the Controller is restarting, or this broker registers again: next time
        for tp, replica in list(self._replicas.items()):
            if assigned.get(tp) == replica.assignment.topic_id or replica.last_push > asked_at:
                continue
            async with self._locks.setdefault(tp, asyncio.Lock()):
                if self._replicas.get(tp) is not replica or replica.last_push > asked_at:
                    continue  # a push came meanwhile
                logger.warning("broker %d: stopping replica %s-%d: its partition is no longer assigned here", self.broker_id, *tp)
                self._stopped.pop(tp, None)
                self._stopped[tp] = (replica.assignment.topic_id, replica.assignment.state.partition_epoch)
                await self._stop_replica(tp, delete=True)

    def _registered(self) -> asyncio.Event:
        if self._registered_event is None:
            self._registered_event = asyncio.Event()
        return self._registered_event

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

    def _on_disk(self, step: Any) -> Any:
        """`step`, skipped while the data directory is offline (its replicas are stopped); one
        that the disk fails (a checkpoint's write or fsync) has the directory checked."""

        async def unless_offline() -> None:
            if self._log_dir.offline:
                return
            try:
                await step()
            except (OSError, KafkaStorageError):
                self._spawn(self._check_log_dir())
                raise

        unless_offline.__name__ = step.__name__
        return unless_offline

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def shutdown(self) -> None:
        """Clean shutdown: stop the loops and the listener, close every replica (flushing
        its log), checkpoint, and write the clean-shutdown marker last."""
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        await self._listener.stop()
        items = [(tp, r) for tp, r in self._replicas.items() if r.handle is not None]
        for tp, _ in items:
            self._children.forget(tp)
        closed = await asyncio.gather(*(r.handle.close.remote() for _, r in items), return_exceptions=True)
        await self._logs.write_checkpoints({tp: o for (tp, _), o in zip(items, closed) if isinstance(o, PartitionOffsets)})
        for _, r in items:
            ray.kill(r.handle)
        unclosed = [tp for (tp, _), o in zip(items, closed) if not isinstance(o, PartitionOffsets)]
        unclosed += [tp for tp, r in self._replicas.items() if r.handle is None]  # died, not flushed
        self._replicas.clear()
        self._board.close(remove=True)
        for task in list(self._tasks):
            task.cancel()
        if unclosed:
            logger.warning("broker %d: replicas %s did not close: no clean-shutdown marker", self.broker_id, unclosed)
        else:
            await asyncio.to_thread(clean_shutdown.write, self.dir, self._broker_epoch)
        self._stop_supervision()

    async def decommission(self) -> None:
        """This broker left the cluster (the Controller moved every replica away): it stops
        as `shutdown` does, and its data directory goes, so nothing of it is left on its
        node's disk to be mistaken for a broker later."""
        stray = [tp for tp, r in self._replicas.items() if r.handle is not None]
        if stray:  # moved away in the metadata, their stop_replica still on its way: shutdown stops them
            logger.info("broker %d: decommissioned with replicas %s still running; stopping them", self.broker_id, stray)
        await self.shutdown()
        await asyncio.to_thread(shutil.rmtree, self.dir, True)
        logger.info("broker %d decommissioned: %s deleted", self.broker_id, self.dir)

    # ------------------------------------------------------------------ the loops

    async def _heartbeat(self) -> None:
        try:
            status = await self._controller.heartbeat.remote(self.broker_id, self._broker_epoch)
        except RayActorError:
            return  # the Controller is restarting; the next beat will reach it
        if status == "reregister":
            await self._register_again()
        elif status == "stale":
            raise StaleBrokerEpochError(f"broker {self.broker_id} epoch {self._broker_epoch} was replaced")

    async def _probe_children(self) -> None:
        now_s = time.monotonic()
        self._listener.probe(now_s)
        for tp, replica in self._replicas.items():
            if replica.handle is not None and replica.slot is not None:
                published = self._board.read(replica.slot)
                if published is not None:  # it ran then: no ping needed for a while
                    self._children.ran(tp, replica.handle, published.at_s)
        for key in self._children.unanswered():  # a late ping: does its process run, or want to?
            late = self._replicas.get(key) if isinstance(key, tuple) else None
            if late is not None and late.handle is not None and late.process is not None and late.process.moved():
                self._children.ran(key, late.handle, now_s)
        self._children.probe()

    async def _record_metrics(self) -> None:
        metrics.record_broker_health(self._health())
        self._logs.record_log_sizes()

    async def _record_group_lag(self) -> None:
        coordinators = [
            r.handle for (topic, _), r in self._replicas.items()
            if topic == OFFSETS_TOPIC and r.handle is not None and r.assignment.state.leader == self.broker_id
        ]
        if coordinators:
            for (group, topic, partition), lag in (await group_lags(coordinators, self._controller)).items():
                metrics.record_group_lag(group, topic, partition, lag)

    def _health(self) -> metrics.BrokerHealth:
        held = [r.assignment for r in self._replicas.values()]
        return broker_health(self.broker_id, ((a.state, min_insync_replicas_of(a.configs, self.config)) for a in held))

    # ------------------------------------------------------------------ supervision

    async def _on_child_death(self, key: Hashable, handle: Any) -> None:
        if key == LISTENER:
            await self._listener.restart(self._publish_listener)
        else:
            assert isinstance(key, tuple), key  # replicas are keyed by (topic, partition)
            await self._on_replica_death(key, handle)

    async def _publish_listener(self) -> None:
        """A restarted listener's address, to the Controller."""
        await self._controller.update_endpoints.remote(self.broker_id, self._broker_epoch, self._listener.endpoints)

    async def _on_replica_death(self, tp: TopicPartition, handle: Any) -> None:
        async with self._locks.setdefault(tp, asyncio.Lock()):
            replica = self._replicas.get(tp)
            if replica is None or replica.handle is not handle:
                return  # stopped or replaced on purpose meanwhile
            self._drop_handle(replica)
            replica.failed_in_epoch = replica.assignment.state.leader_epoch
        self._spawn(self._check_log_dir())  # did its disk fail?
        await self._report_replica_failure(tp)

    async def _report_replica_failure(self, tp: TopicPartition) -> None:
        """Tells the Controller (retrying while it is unreachable) so that it moves the
        partition's leadership before the replica is re-created by its next push."""
        while tp in self._replicas and self._replicas[tp].handle is None:
            try:
                await self._controller.replica_failed.remote(self.broker_id, self._broker_epoch, *tp)
                return
            except StaleBrokerEpochError:
                # This broker is registering again: report once it has its new epoch (the
                # registration of the same process does not re-decide the leadership).
                await asyncio.sleep(CONTROLLER_RETRY_BACKOFF_MS / 1000)
            except (RayActorError, KafkaError) as e:
                logger.warning("broker %d: reporting the failed replica of %s-%d: %s", self.broker_id, *tp, e)
                await asyncio.sleep(CONTROLLER_RETRY_BACKOFF_MS / 1000)

    # ------------------------------------------------------------------ the data directory (log_dir_health.py)

    async def _check_log_dir(self) -> None:
        """A replica died: if the data directory fails its probe, it goes offline: every
        replica in it is stopped and reported, and none is created there until it works."""
        if self._log_dir.offline or await self._log_dir.check():
            return
        for tp, replica in list(self._replicas.items()):
            async with self._locks.setdefault(tp, asyncio.Lock()):
                if replica.handle is None or self._replicas.get(tp) is not replica:
                    continue
                self._children.forget(tp)
                ray.kill(replica.handle, no_restart=True)
                self._drop_handle(replica)
                replica.failed_in_epoch = replica.assignment.state.leader_epoch
            self._spawn(self._report_replica_failure(tp))
        logger.error("broker %d: its data directory %s is offline (%s): its replicas are stopped until it works",
                     self.broker_id, self.dir, self._log_dir.error)  # fmt: skip
        self._spawn(self._log_dir.wait_online(self._log_dir_online))

    async def _log_dir_online(self) -> None:
        """The directory works again: the Controller pushes the partitions of the replicas
        that wait here, which creates them again (apply_partition)."""
        waiting = sorted(tp for tp, r in self._replicas.items() if r.handle is None)
        logger.warning("broker %d: its data directory is online again; starting its %d replicas", self.broker_id,
                       len(waiting))  # fmt: skip
        while waiting:
            try:
                await self._controller.replicas_ready.remote(self.broker_id, self._broker_epoch, waiting)
                return
            except (RayActorError, KafkaError) as e:  # restarting, or this broker registering again
                logger.warning("broker %d: asking for its partitions again: %s", self.broker_id, e)
                await asyncio.sleep(CONTROLLER_RETRY_BACKOFF_MS / 1000)

    async def describe_log_dirs(self) -> dict[str, Any]:
        """The data directory as Kafka's DescribeLogDirs describes a log directory: its path,
        its error (None while online), its volume's total and usable bytes, and its
        replicas' log sizes as of the last checkpoint (none while offline, as in Kafka)."""
        total_bytes, usable_bytes = self._log_dir.usage_bytes()
        sizes = {} if self._log_dir.offline else self._logs.log_sizes
        return {
            "path": str(self.dir),
            "error": self._log_dir.error,
            "total_bytes": total_bytes,
            "usable_bytes": usable_bytes,
            "partitions": {tp: sizes.get(tp, 0) for tp, r in self._replicas.items() if r.handle is not None},
        }

    # ------------------------------------------------------------------ Controller -> broker

    async def apply_partition(self, assignment: PartitionAssignment) -> Any:
        """Makes this broker's replica of a partition lead or follow as the Controller says;
        returns the replica's actor handle (None while a failed replica waits for the
        Controller to move its leadership)."""
        tp = (assignment.topic, assignment.partition)
        async with self._locks.setdefault(tp, asyncio.Lock()):
            current = self._replicas.get(tp)
            if current is None and self._stopped_before(assignment):
                logger.info("broker %d: ignoring a push of %s-%d older than the replica's stop", self.broker_id, *tp)
                return None  # it would re-create, as an orphan, a replica the Controller removed
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
            if current is not None and current.handle is None:
                state = assignment.state
                if state.leader == self.broker_id and state.leader_epoch <= current.failed_in_epoch:
                    current.assignment = assignment
                    return None  # it would lead in the epoch it died in: wait for the Controller's move
            starting = current is None or current.handle is None
            if starting and self._log_dir.offline:  # created once the directory is back (_log_dir_online)
                if current is None:
                    self._replicas[tp] = _Replica(None, assignment)
                else:
                    current.assignment = assignment
                return None
            if current is not None and current.handle is None:
                await self._restart_pause(tp)
            # A new process takes one of the broker's start slots until its first answer.
            async with self._starts if starting else contextlib.nullcontext():
                if starting:
                    current = await self._start_process(tp, current, assignment)
                    if current is None:
                        return None
                elif current.assignment.configs != assignment.configs:
                    await current.handle.update_config.remote(
                        log_config_of(assignment.configs), replica_config_of(assignment.configs, self.config)
                    )
                current.assignment = assignment
                self._pushes_applied += 1
                current.last_push = self._pushes_applied
                return await self._take_role(tp, current)

    async def _start_process(
        self, tp: TopicPartition, current: _Replica | None, assignment: PartitionAssignment
    ) -> _Replica | None:
        """A new process for a new replica (`current` None) or one whose process died; None
        if its directory could not be made (the disk is checked: _check_log_dir)."""
        try:
            handle, slot = await self._create_replica(assignment)
        except OSError as e:
            logger.error("broker %d: cannot create the replica of %s-%d: %s", self.broker_id, *tp, e)
            if current is None:
                self._replicas[tp] = _Replica(None, assignment)
            self._spawn(self._check_log_dir())
            return None
        if current is None:
            current = self._replicas[tp] = _Replica(handle, assignment, slot=slot)
        else:
            current.handle, current.slot = handle, slot
        return current

    async def _take_role(self, tp: TopicPartition, replica: _Replica) -> Any:
        """Tells the replica its role; its handle, or None if it died (a new one that dies
        before its first answer is reported here, a watched one by its supervisor)."""
        handle = replica.handle
        try:
            await self._make_role(replica)
        except RayActorError as e:
            if self._children.watching(tp) is not handle:  # died before its first answer
                logger.warning("broker %d: new replica of %s-%d died: %s", self.broker_id, *tp, e)
                self._drop_handle(replica)
                replica.failed_in_epoch = replica.assignment.state.leader_epoch
                self._spawn(self._check_log_dir())
                self._spawn(self._report_replica_failure(tp))
            return None  # else its supervisor reports it
        if self._children.watching(tp) is not handle:
            self._children.watch(tp, handle)  # it answered: from now on it is probed
            self._spawn(self._learn_process(tp, handle))
        self._retell_throttles()
        return handle

    async def _learn_process(self, tp: TopicPartition, handle: Any) -> None:
        """Asks a new replica its pid: when a ping of it is late, its process's progress
        tells a starved replica from a stopped one (supervision.py)."""
        try:
            pid = await handle.pid.remote()
        except RayActorError:
            return  # died meanwhile: its supervisor reports it
        replica = self._replicas.get(tp)
        if replica is not None and replica.handle is handle:
            replica.process = ProcessProgress(pid)

    async def _restart_pause(self, tp: TopicPartition) -> None:
        """Before a replica whose process died is created again: at once the first time,
        then backing off (REPLICA_RESTARTS), so that a replica that keeps dying, or a node
        whose replicas all do, does not turn into a storm of process starts."""
        delay_s = self._replica_restarts.delay_s(tp)
        if delay_s > 0:
            logger.warning("broker %d: re-creating the replica of %s-%d in %.1f s (%d re-creations in the last %.0f s)",
                           self.broker_id, *tp, delay_s, self._replica_restarts.recent(tp),
                           self._replica_restarts.policy.window_s)  # fmt: skip
            await asyncio.sleep(delay_s)
        self._replica_restarts.restarted(tp)

    def _drop_handle(self, replica: _Replica) -> None:
        """Its process died or was stopped: its slot on the board is free again."""
        replica.handle = None
        replica.process = None
        if replica.slot is not None:
            self._board.release(replica.slot)
            replica.slot = None

    async def _create_replica(self, a: PartitionAssignment) -> tuple[Any, BoardSlot]:
        """A new replica process, and its slot on the board."""
        tp = (a.topic, a.partition)
        log_dir = await self._logs.prepare_dir(tp, a.topic_id)
        args = (
            a.topic,
            a.partition,
            self.broker_id,
            str(log_dir),
            log_config_of(a.configs),
            replica_config_of(a.configs, self.config),
            self._logs.offsets(tp),
            # By name, not by handle: a handle would make the replica's process load this
            # module's and the Controller's (rayk/actors/named_actor.py).
            NamedActor(ray.get_runtime_context().get_actor_name(), self._namespace),
            NamedActor(CONTROLLER_NAME, self._namespace),
        )
        # On this node: the board is shared memory, and its times are this node's clock.
        pinned = NodeAffinitySchedulingStrategy(self._node_id, soft=False)
        if a.topic == OFFSETS_TOPIC:
            actor, kwargs = OffsetsReplicaActor, {"broker_config": self.config}
        elif a.topic == TRANSACTION_STATE_TOPIC:
            actor, kwargs = TransactionStateReplicaActor, {"broker_config": self.config}
        else:
            actor, kwargs = ReplicaActor, {}
        slot = self._board.assign()
        try:
            return actor.options(scheduling_strategy=pinned).remote(*args, board_slot=slot, **kwargs), slot
        except BaseException:
            self._board.release(slot)
            raise

    async def _make_role(self, replica: _Replica) -> None:
        """Tells the replica its role, with its share of the broker's replication throttles."""
        state = replica.assignment.state
        tp = (replica.assignment.topic, replica.assignment.partition)
        throttle = self._throttles.setting_for(tp, self._partition_states())
        if state.leader == self.broker_id:
            await replica.handle.become_leader.remote(
                state.leader_epoch, list(state.replicas), list(state.isr), state.partition_epoch, throttle
            )
        else:
            leader = replica.assignment.leader_handle if state.leader != NO_LEADER else None
            await replica.handle.become_follower.remote(
                state.leader_epoch, state.leader, leader, self._incarnation_id, throttle
            )

    def _partition_states(self) -> dict[TopicPartition, PartitionState]:
        return {tp: r.assignment.state for tp, r in self._replicas.items()}

    def _retell_throttles(self) -> None:
        """The moves this broker takes part in changed: each replica whose share of the
        replication throttles changed is told its new one (in the background)."""
        handles = {tp: r.handle for tp, r in self._replicas.items() if r.handle is not None}
        for handle, setting in self._throttles.changed(self._partition_states(), handles):
            self._spawn(_tell_throttle(handle, setting))

    async def stop_replica(
        self, topic: str, partition: int, delete: bool, topic_id: str = "", partition_epoch: int | None = None
    ) -> None:
        """Stops this broker's replica of a partition (and deletes its log with `delete`).
        With `topic_id`, pushes of that topic id's partition up to `partition_epoch` (every
        one if None: the topic was deleted) that arrive afterwards are ignored: they were
        sent before the stop, and would re-create the replica as an orphan."""
        tp = (topic, partition)
        async with self._locks.setdefault(tp, asyncio.Lock()):
            if topic_id:
                self._stopped.pop(tp, None)
                self._stopped[tp] = (topic_id, partition_epoch)
                while len(self._stopped) > MAX_STOPPED_REMEMBERED:
                    del self._stopped[next(iter(self._stopped))]
            await self._stop_replica(tp, delete)
        self._retell_throttles()

    def _stopped_before(self, assignment: PartitionAssignment) -> bool:
        """Whether `assignment` was pushed before the Controller stopped this replica."""
        stopped = self._stopped.get((assignment.topic, assignment.partition))
        if stopped is None:
            return False
        topic_id, partition_epoch = stopped
        if assignment.topic_id == topic_id and (partition_epoch is None or assignment.state.partition_epoch <= partition_epoch):
            return True
        del self._stopped[(assignment.topic, assignment.partition)]  # newer: added back, or a new topic
        return False

    async def _stop_replica(self, tp: TopicPartition, delete: bool) -> None:
        self._children.forget(tp)
        self._replica_restarts.forget(tp)
        replica = self._replicas.pop(tp, None)
        try:
            if replica is None or replica.handle is None:
                if delete:
                    await self._logs.delete_partition_dir(tp)
                return
            try:
                if delete:
                    await replica.handle.delete.remote()
                else:
                    await self._logs.write_checkpoints({tp: await replica.handle.close.remote()})
            except RayActorError:
                pass  # already dead: the directory is what remains
            finally:
                ray.kill(replica.handle)
                self._drop_handle(replica)
            if delete:
                await self._logs.delete_partition_dir(tp)
        finally:
            self._logs.release_dir(tp)  # once its process is gone: only then may it be a stray

    # ------------------------------------------------------------------ broker -> Controller

    async def alter_partition(
        self, topic: str, partition: int, leader_id: int, leader_epoch: int, partition_epoch: int, isr: list[int],
        added_incarnations: dict[int, str] | None = None,
    ) -> tuple[list[int], int]:
        """Forwards a leader replica's ISR change to the Controller with this broker's epoch
        (once it has one: a replica may lead before this broker's registration returns), and
        the processes whose fetches the added followers' positions came from (KIP-903)."""
        assert leader_id == self.broker_id, "only this broker's replicas report here"
        await self._registered().wait()
        replica = self._replicas.get((topic, partition))
        before = set(replica.assignment.state.isr) if replica is not None else set(isr)
        committed, new_partition_epoch = await self._controller.alter_partition.remote(
            self.broker_id, self._broker_epoch, topic, partition, leader_epoch, partition_epoch, isr, added_incarnations
        )
        if set(committed) == set(isr) != before:  # Kafka's IsrShrinksPerSec / IsrExpandsPerSec
            metrics.record_isr_change(self.broker_id, shrink=len(isr) < len(before))
        return committed, new_partition_epoch

    # ------------------------------------------------------------------ inspection

    async def describe(self) -> dict[str, Any]:
        return {
            "broker_id": self.broker_id,
            "broker_epoch": self._broker_epoch,
            "node_id": self._node_id,
            "data_dir": str(self.dir),
            "incarnation_id": self._incarnation_id,
            "directory_id": self._directory_id,
            "clean_shutdown": self._clean_shutdown,
            "replicas": sorted(self._replicas),
            "failed_replicas": sorted(tp for tp, r in self._replicas.items() if r.handle is None),
            # Since this process started: children found late (slow, not killed) and killed
            # for answering nothing (supervision.py), and listener restarts.
            "children_late": self._children.late,
            "children_killed": self._children.killed,
            "listener_restarts": self._listener.restarted,
        }

    async def health(self) -> metrics.BrokerHealth:
        """Leader and partition counts, under-replicated and under-min-ISR partitions (what
        the gauges say; for `rayk status`, which needs no Prometheus)."""
        return self._health()

    async def log_sizes(self) -> dict[TopicPartition, int]:
        """Each of its replicas' log size in bytes as of the last offset checkpoint (what
        the Controller's balancer weighs partitions by)."""
        return self._logs.log_sizes

    async def listener(self) -> Any:
        """This broker's Kafka listener actor (a SocketServerActor), or None (for tools and tests)."""
        return self._listener.handle

    async def loaded_modules(self) -> list[str]:
        """The modules this broker's process has imported (for tests and diagnosis): the
        wire protocol's are its listener's process's alone."""
        return sorted(name for name, module in sys.modules.items() if module is not None)

    async def replica_handles(self) -> dict[TopicPartition, Any]:
        """The live replica actors of this broker (for tools and fault tests)."""
        return {tp: r.handle for tp, r in self._replicas.items() if r.handle is not None}
