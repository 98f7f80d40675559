"""Controller: the cluster's metadata and elections, as one detached async Ray actor.

It is the shell over `ClusterMetadata` (`rayk/metadata`: brokers, topics with ids and
configs, per partition the replicas, leader, leader epoch, ISR and partition epoch, ACLs,
SCRAM credentials, client quotas, producer ids), and the only writer of it, as Kafka's
QuorumController: it orders requests and commits records; what a request means is
planned by the control manager of its domain (`self._meta.replication.plan_*`, ...;
rules in `elections.py`). `_commit` writes the records durably to the `MetadataLog`
(`<dir>/__cluster_metadata-0`), applies them, asserts the image still holds together,
and only then are they pushed to the brokers concerned. Planning and committing never
await, so on the actor's event loop each change is atomic.

What it is composed of (rayk/controller/):
- `BrokerHeartbeatManager`: the brokers' sessions with this Controller: their handles,
  heartbeats, listeners; a broker silent for `broker.session.timeout.ms`, or whose actor
  Ray reports dead, is fenced here (out of the ISRs it can leave, a new leader with a
  bumped epoch wherever it led). Each registration names the broker process (an
  incarnation id): a new process lost its replicas' in-memory state, and after an
  unclean shutdown (KIP-966) or on a freshly formatted directory its copies must catch
  up before they may lead again (see `elections.py`).
- `ControllerChannelManager`: the pushes to the brokers' ReplicaManagers (leader first,
  each with a timeout of twice `broker.session.timeout.ms`; what fails is pushed again)
  and the replica handles their answers name.
- `PeriodicTasks`: the maintenance, every second or so: metrics (ActiveControllerCount,
  OfflinePartitionsCount, EventQueueTimeMs), fencing silent brokers, dirty pushes,
  leaderless partitions and KIP-966 unclean recovery (`LeaderElections`), the
  replacement of brokers fenced for `broker.replacement.delay.ms` by KIP-455
  reassignments (`BrokerReplacement`), the balancer (`Balancer`: Cruise Control's goals,
  run when a broker joins or leaves and every `balancer.interval.ms`), preferred leaders
  back (`auto.leader.rebalance.enable`), and a metadata snapshot when one is due
  (`metadata.log.max.record.bytes.between.snapshots`, `...max.snapshot.interval.ms`).
- `TopicCreation` (defaults, admission by replica caps, internal topics) and
  `MetadataView` (the answers that change nothing).
- `BrokerLifecycle` (brokers added and decommissioned at runtime) and, with Ray's
  autoscaler, `BrokerAutoscaling`: one broker per node offering the broker resource,
  brokers asked for when a topic does not fit, idle brokers removed so nodes can go.

A replica process that dies is not a broker failure: its broker reports it
(`replica_failed`), the partition's leadership moves if it led, and the next push
re-creates it.

Restarts: Ray restarts this actor (max_restarts=-1); it restores its metadata (the newest
snapshot and the records after it), starts its maintenance on its own, and gives every
broker that was live one session timeout to register again before it is fenced. A
broker that re-registers as the same process keeps its roles; so a whole cluster, or
only this Controller, restarts with its leaders and ISRs as they were, as far as that
is safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from rayk import metrics
from rayk.acls import AclBinding, AclFilter
from rayk.actors import raylet_watch
from rayk.actors.supervision import start_again_if_restarted
from rayk.actors.wakeup import Wakeup
from rayk.config import MIN_INSYNC_REPLICAS, BrokerConfig, log_config_of, validate_topic_configs
from rayk.controller.autoscaling import AutoscaleSettings, BrokerAutoscaling
from rayk.controller.balancer import Balancer
from rayk.controller.broker_heartbeat_manager import BrokerHeartbeatManager
from rayk.controller.broker_lifecycle import BrokerLifecycle
from rayk.controller.broker_replacement import BrokerReplacement
from rayk.controller.channel_manager import ControllerChannelManager
from rayk.controller.leader_elections import LeaderElections
from rayk.controller.metadata_view import MetadataView
from rayk.controller.periodic_tasks import PeriodicTask, PeriodicTasks
from rayk.controller.topic_creation import TopicCreation, new_uuid
from rayk.errors import ElectionNotNeededError, InvalidConfigurationError, KafkaError
from rayk.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, coordinator_partition
from rayk.metadata.cluster_metadata import NO_LEADER, ClusterMetadata, Record
from rayk.metadata.log import MetadataLog
from rayk.metadata.records import ClusterIdRecord, FenceBrokerRecord, PartitionRecord, RegisterBrokerRecord
from rayk.quotas import QuotaEntity, QuotaFilterComponent
from rayk.scram import ScramCredential
from rayk.storage.remote.remote_log_storage import delete_remote_partitions
from rayk.storage.remote.remote_segment import partition_prefix

logger = logging.getLogger(__name__)

MAINTENANCE_MAX_INTERVAL_MS = 1_000
PRODUCER_ID_BLOCK_SIZE = 1000  # ids reserved per metadata record
CLIENT_METADATA_LINGER_MS = 10  # a long poll woken by a change answers this much later, with what followed it
TopicPartition = tuple[str, int]


class Controller:
    """The cluster's metadata shell: orders requests, commits their records, answers.

    Composed of: the image and its log (`ClusterMetadata`, `MetadataLog`), the brokers'
    sessions (`BrokerHeartbeatManager`), the pushes to brokers (`ControllerChannelManager`),
    the elections it runs itself (`LeaderElections`), the replacement of lost brokers
    (`BrokerReplacement`) and the loop they run in (`PeriodicTasks`). Every change of the
    image goes through `_commit`."""

    def __init__(self, directory: str, broker_config: BrokerConfig | None = None, broker_factory: Any = None,
                 autoscale: AutoscaleSettings | None = None) -> None:  # fmt: skip
        """`broker_factory` (rayk.broker.BrokerFactory) creates the brokers added at runtime;
        without one, brokers come only from whoever deployed the cluster. With `autoscale`,
        the brokers follow Ray's autoscaler (BrokerAutoscaling); it needs a factory that
        places brokers by the same node resource."""
        raylet_watch.start()  # this process goes with its node's raylet (raylet_watch.py)
        if autoscale is not None and (broker_factory is None or broker_factory.node_resource != autoscale.node_resource):
            raise InvalidConfigurationError("autoscaling needs a broker factory placing brokers by its node resource")
        self.dir = Path(directory)
        self.config = c = broker_config or BrokerConfig()
        self._log = MetadataLog(
            self.dir, c.metadata_log_max_record_bytes_between_snapshots, c.metadata_log_max_snapshot_interval_ms
        )
        self._meta = ClusterMetadata(c)
        self._meta.load(self._log)
        self._committed = Wakeup()  # fired by every commit: the long polls of `acls` and `client_quotas`
        # What `client_metadata` answers changes with every commit, a leader taking up its
        # epoch and a broker's listeners: counted here, for the listeners' metadata images
        # (`client_metadata_image`). The incarnation tells a restarted Controller's count apart.
        self._client_view_version = 0
        self._client_view_changed = Wakeup()
        self._client_view_built: tuple[tuple[str, int], dict[str, Any]] | None = None
        self._incarnation = new_uuid()
        self._sessions = BrokerHeartbeatManager(
            self._meta.cluster, c.broker_session_timeout_ms, c.broker_heartbeat_interval_ms,
            on_endpoints_change=self._client_view_moved,
        )
        self._channels = ControllerChannelManager(self._meta, self._sessions, 2 * c.broker_session_timeout_ms / 1000,
                                                  self._client_view_moved)  # fmt: skip
        self._view = MetadataView(self._meta, self._channels, self._sessions)
        self._elections = LeaderElections(self._meta, self._commit, self._channels, c)
        self._replacement = BrokerReplacement(
            self._meta, self._commit, self._channels, self._sessions, c.broker_replacement_delay_ms
        )
        self._lifecycle = BrokerLifecycle(self._meta, self._commit, self._channels, self._sessions, c, broker_factory,
                                          lambda: self._committed, self._brokers_changed,
                                          lambda: self._topics.replica_caps())  # fmt: skip
        self._autoscaling = None if autoscale is None else BrokerAutoscaling(
            autoscale, self._meta, self._lifecycle, lambda: self._committed, c.broker_idle_removal_ms,
            lambda: ray.get_runtime_context().current_actor,
        )  # fmt: skip
        self._topics = TopicCreation(self._meta, self._commit, self._channels, self._sessions, self._view, c,
                                     self._autoscaling)  # fmt: skip
        self._balancer = Balancer(
            self._meta, self._commit, self._channels, self._sessions, self._elections, self._topics.replica_caps, c
        )
        tick_s = min(MAINTENANCE_MAX_INTERVAL_MS, c.broker_session_timeout_ms // 4) / 1000
        self._periodic = PeriodicTasks(tick_s, on_late=self._sessions.credit_stall, tasks=[
            PeriodicTask("record_metrics", self._record_metrics),
            PeriodicTask("fence_silent_brokers", self._fence_silent_brokers),
            PeriodicTask("push_dirty", self._channels.push_dirty),
            PeriodicTask("recover_leaderless", self._elections.recover_leaderless),
            PeriodicTask("replace_lost_brokers", self._replacement.replace_lost_brokers),
            PeriodicTask("decommission_brokers", self._lifecycle.decommission),
            *([PeriodicTask("autoscale_brokers", self._autoscaling.run_round)] if self._autoscaling else []),
            PeriodicTask("balance", self._balancer.maintain),
            *([PeriodicTask("rebalance_leaders", self._elections.rebalance_leaders,
                            c.leader_imbalance_check_interval_seconds)] if c.auto_leader_rebalance_enable else []),
            PeriodicTask("snapshot_if_due", self._snapshot_if_due),
        ])  # fmt: skip
        self._producer_ids = range(0)  # the reserved block not yet handed out
        if self._meta.cluster_id is None:
            self._commit([ClusterIdRecord(new_uuid())])
        if start_again_if_restarted():  # Ray restarted this Controller after its process died
            logger.warning("Controller restarted by Ray; metadata restored up to offset %d", self._meta.last_offset)

    # ------------------------------------------------------------------ commits

    def _commit(self, records: list[Record]) -> None:
        """The one way the image changes: `records` are appended durably to the metadata
        log as one batch, then applied to the image, each once, at its offset. Never
        awaits, so on this actor's event loop a plan and its commit are atomic."""
        if not records:
            return
        before = {
            (r.topic, r.partition): self._meta.topics[r.topic].partitions.get(r.partition)
            for r in records
            if isinstance(r, PartitionRecord) and r.topic in self._meta.topics
        }
        broker_epochs = {b: reg.epoch for b, reg in self._meta.brokers.items()}
        first_offset = self._log.append(records)
        assert first_offset == self._meta.last_offset + 1, (
            f"the metadata log appends at {first_offset}, the image applied up to {self._meta.last_offset}"
        )
        for i, record in enumerate(records):
            self._meta.apply(record, first_offset + i)
        assert self._meta.last_offset == first_offset + len(records) - 1, "every committed record applied once"
        assert_consistent(self._meta, records, broker_epochs)
        committed, self._committed = self._committed, Wakeup()
        committed.fire()
        self._client_view_moved()
        for (topic, partition), old in before.items():
            new = self._meta.topics[topic].partitions[partition]
            removed = set(old.replicas) - set(new.replicas) if old is not None else set()
            if removed:  # a reassignment completed: the replicas it dropped go
                topic_id = self._meta.topics[topic].topic_id
                self._channels.remove_replicas(topic, partition, removed, topic_id, new.partition_epoch)

    def _client_view_moved(self) -> None:
        """What `client_metadata` answers may have changed: the listeners' long polls wake."""
        self._client_view_version += 1
        changed, self._client_view_changed = self._client_view_changed, Wakeup()
        changed.fire()

    def _detach(self, broker_id: int) -> None:
        self._sessions.detach(broker_id)
        self._channels.forget_broker(broker_id)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Starts the maintenance loop (idempotent); returns the cluster id.

        Called once the brokers were (re)started, or by this actor itself after Ray
        restarted it: a broker of the replayed metadata that has not registered by then
        gets one full session timeout from now to do so."""
        if not self._periodic.started:
            self._sessions.start_clocks()
            self._periodic.start()
        return self._meta.cluster_id

    async def shutdown(self) -> None:
        """Cleanly stops every broker (data and metadata stay on disk), then itself."""
        self._periodic.cancel()
        if self._autoscaling is not None:
            await self._autoscaling.close()
        managers = self._sessions.close()
        await asyncio.gather(*(m.shutdown.remote() for m in managers), return_exceptions=True)
        self._sessions.cancel_watches()
        self._channels.cancel_all()
        self._log.close()

    # ------------------------------------------------------------------ broker sessions

    async def register_broker(
        self,
        broker_id: int,
        node_id: str,
        manager: Any,
        endpoints: dict[str, tuple[str, int]] | None = None,
        incarnation_id: str = "",
        directory_id: str = "",
        clean_shutdown: bool = True,
        node_memory_bytes: int = 0,
        node_cpus: float = 0,
    ) -> tuple[int, dict]:
        """A ReplicaManager (re)starts, or registers again. Returns its broker epoch and the
        partitions assigned to it (topic, partition) -> topic id, after pushing their states
        to it. `endpoints` are its Kafka listeners' advertised (host, port) by listener name;
        `incarnation_id` names its process, `directory_id` its data directory, and
        `clean_shutdown` says whether its last run ended with the clean-shutdown marker, and
        `node_memory_bytes` and `node_cpus` are its node's memory and cores (what cap its
        replicas: replica_capacity.py)."""
        self._sessions.set_endpoints(broker_id, endpoints)
        self._sessions.node_memory_bytes[broker_id] = node_memory_bytes
        self._sessions.node_cpus[broker_id] = node_cpus
        previous = self._meta.brokers.get(broker_id)
        if previous is not None and previous.incarnation_id != incarnation_id:
            self._detach(broker_id)  # a new process: the old one's replica handles are dead
        records = self._meta.plan_register_broker(broker_id, node_id, incarnation_id, directory_id, clean_shutdown)
        self._commit(records)
        if previous is None:
            self._balancer.request_run()  # a new broker: it takes its share
        changed = _partitions_in(records)
        epoch = self._meta.brokers[broker_id].epoch
        self._sessions.attach(broker_id, manager)
        self._replacement.broker_back(broker_id)
        self._sessions.watch(broker_id, epoch, manager, self._on_broker_death, incarnation_id)
        self._sessions.counts["registrations"] += 1
        mine = {(t, p) for t, p, _ in self._meta.replication.partitions_of_broker(broker_id)}
        async with self._sessions.registering(broker_id):
            await self._channels.push_all(mine | changed)
        await self._elections.recover_uncleanly(mine)
        logger.info(
            "broker %d registered on node %s with epoch %d (%s shutdown)",
            broker_id, node_id, epoch, "clean" if clean_shutdown else "unclean",
        )
        # (a topic deleted while the pushes went out is no longer this broker's)
        return epoch, {(t, p): self._meta.topics[t].topic_id for t, p in mine if t in self._meta.topics}

    async def assigned_partitions(self, broker_id: int, broker_epoch: int) -> dict[TopicPartition, str]:
        """The partitions a broker holds a replica of, with their topic ids (what it checks
        its running replicas against)."""
        self._sessions.check_epoch(broker_id, broker_epoch)
        return {(t, p): self._meta.topics[t].topic_id for t, p, _ in self._meta.replication.partitions_of_broker(broker_id)}

    async def update_endpoints(self, broker_id: int, broker_epoch: int, endpoints: dict[str, tuple[str, int]] | None) -> None:
        """A broker restarted its Kafka listeners (they died), maybe on other ports."""
        self._sessions.check_epoch(broker_id, broker_epoch)
        self._sessions.set_endpoints(broker_id, endpoints)

    async def heartbeat(self, broker_id: int, broker_epoch: int) -> str:
        """Answers "ok", "reregister" (fenced, or unknown to this Controller session) or "stale"."""
        return self._sessions.heartbeat(broker_id, broker_epoch)

    # ------------------------------------------------------------------ brokers at runtime (see BrokerLifecycle)

    async def add_broker(self, node_id: str | None = None) -> int:
        """Starts a new broker on `node_id` or the least loaded candidate node; its id once
        it registered (Cluster.add_broker)."""
        return await self._lifecycle.add_broker(node_id, ray.get_runtime_context().current_actor)

    async def remove_broker(self, broker_id: int, timeout_ms: int) -> None:
        """Decommissions a broker; returns once it left (Cluster.remove_broker)."""
        await self._lifecycle.remove_broker(broker_id, timeout_ms)

    async def broker_factory(self) -> Any:
        """How this cluster creates brokers (Cluster.restart_broker uses it too)."""
        return self._lifecycle.factory

    def _brokers_changed(self) -> None:
        """A broker joined, started leaving, or left: the balancer settles the cluster again,
        and the autoscaler counts its brokers again."""
        self._balancer.request_run()
        if self._autoscaling is not None:
            self._autoscaling.brokers_changed()

    async def _on_broker_death(self, broker_id: int, epoch: int) -> None:
        """Ray reported the broker's actor dead: fenced, unless it registered anew since."""
        registration = self._meta.brokers.get(broker_id)
        if registration is not None and registration.epoch == epoch and not registration.fenced:
            logger.warning("broker %d died: fencing it", broker_id)
            await self._fence_and_push(broker_id, "dead")

    async def _fence_and_push(self, broker_id: int, why: str) -> None:
        """Fences a broker (`why`: dead, silent or late, for the counts), moving its leaderships."""
        records = self._meta.plan_fence_broker(broker_id)
        self._commit(records)
        self._detach(broker_id)
        if records:
            self._sessions.fenced(broker_id)
            self._sessions.counts[f"fenced_{why}"] += 1
        await self._channels.push_all(_partitions_in(records))

    # ------------------------------------------------------------------ maintenance (see PeriodicTasks)

    async def _record_metrics(self) -> None:
        metrics.record_controller(self._view.offline_partitions_count())

    async def _fence_silent_brokers(self) -> None:
        """Fences the brokers silent past their session that Ray does not have alive, and
        late ones past the bound, one at a time (BrokerHeartbeatManager.brokers_to_fence)."""
        for broker_id, silent_s, why in self._sessions.brokers_to_fence():
            logger.warning("broker %d silent for %.1f s%s: fencing it", broker_id, silent_s,
                           "" if why == "silent" else ", although Ray has its process alive")  # fmt: skip
            await self._fence_and_push(broker_id, why)

    async def _snapshot_if_due(self) -> None:
        """Snapshots the metadata image once enough was appended since the last one (or
        long enough ago), so a restart replays only what came after it."""
        if self._log.snapshot_due():
            started_s = time.monotonic()
            path = self._log.write_snapshot(self._meta.snapshot())
            logger.info("metadata snapshot %s written in %.0f ms", path.name, (time.monotonic() - started_s) * 1000)

    # ------------------------------------------------------------------ requests from brokers

    async def alter_partition(
        self,
        broker_id: int,
        broker_epoch: int,
        topic: str,
        partition: int,
        leader_epoch: int,
        partition_epoch: int,
        isr: list[int],
        added_incarnations: dict[int, str] | None = None,
    ) -> tuple[list[int], int]:
        """Kafka's AlterPartition: a leader's ISR change, checked and committed."""
        self._sessions.check_epoch(broker_id, broker_epoch)
        records = self._meta.replication.plan_alter_partition(
            topic, partition, broker_id, leader_epoch, partition_epoch, isr, added_incarnations
        )
        self._commit(records)
        state = self._meta.partition(topic, partition)
        if records:
            # Every replica learns the new state from a push too, not only the leader from
            # this answer, which may be lost or arrive after the leader moved on; and a
            # completed reassignment changes the replicas and maybe the leader.
            self._channels.spawn(self._channels.push(topic, partition))
        return list(state.isr), state.partition_epoch

    async def replica_failed(self, broker_id: int, broker_epoch: int, topic: str, partition: int) -> None:
        """A broker's replica process died (its broker lives): its leadership moves and it
        leaves the ISR where another copy is ready; then every replica gets the new state,
        which re-creates the failed one from its log."""
        self._sessions.check_epoch(broker_id, broker_epoch)
        self._channels.forget_replica(topic, partition, broker_id)
        records = self._meta.replication.plan_replica_failed(topic, partition, broker_id)
        self._commit(records)
        logger.warning("broker %d's replica of %s-%d failed: %s", broker_id, topic, partition,
                       f"now {self._meta.partition(topic, partition)}" if records else "no change")
        await self._channels.push(topic, partition)

    async def replicas_ready(self, broker_id: int, broker_epoch: int, partitions: list[TopicPartition]) -> None:
        """A broker's data directory works again after it was offline (log_dir_health.py):
        its partitions are pushed to it again, which creates their replicas there."""
        self._sessions.check_epoch(broker_id, broker_epoch)
        known = [(t, p) for t, p in partitions if t in self._meta.topics]
        logger.warning("broker %d's data directory is online again: pushing its %d partitions", broker_id, len(known))
        await self._channels.push_all(known)

    async def broker_log_dirs(self, broker_id: int) -> dict[str, Any] | None:
        """A broker's data directory, as it describes it (ReplicaManager.describe_log_dirs);
        None if the broker is not attached to this Controller."""
        manager = self._sessions.manager(broker_id)
        return None if manager is None else await manager.describe_log_dirs.remote()

    # ------------------------------------------------------------------ reassignments (KIP-455)

    async def alter_partition_reassignments(
        self, reassignments: dict[TopicPartition, list[int] | None]
    ) -> dict[TopicPartition, KafkaError | None]:
        """Starts (target replica list) or cancels (None) each partition's reassignment;
        per partition None, or the typed error that refused it."""
        results: dict[TopicPartition, KafkaError | None] = {}
        started = []
        for (topic, partition), target in reassignments.items():
            try:
                self._commit(self._meta.replication.plan_reassign(topic, partition, target))
            except KafkaError as e:
                results[(topic, partition)] = e
                continue
            results[(topic, partition)] = None
            started.append((topic, partition))
        await self._channels.push_all(started)
        return results

    async def list_partition_reassignments(
        self, partitions: list[TopicPartition] | None = None
    ) -> dict[TopicPartition, dict[str, list[int]]]:
        """The reassignments under way: replicas, adding and removing per partition."""
        return self._view.list_partition_reassignments(partitions)

    # ------------------------------------------------------------------ topics

    async def create_topic(
        self, name: str, num_partitions: int | None = None, replication_factor: int | None = None,
        configs: dict | None = None, validate_only: bool = False, timeout_ms: int | None = None,
        scale_out_timeout_ms: int | None = None,
    ) -> list[dict]:
        """Creates a topic, waits until every live replica has its role; returns its description.
        A count left out (None, or -1 as in Kafka's CreateTopics) takes the brokers' default:
        `num.partitions`, `default.replication.factor`. POLICY_VIOLATION if a broker would
        hold more replicas than it may (replica_capacity.py). `validate_only` checks all
        of that, creates nothing and returns [].

        `timeout_ms` bounds the wait for the replicas, as Kafka's CreateTopics does: the
        topic exists once its records are committed, and its replicas start in the
        background; past `timeout_ms` the call raises REQUEST_TIMED_OUT while they go on
        starting, and with 0 it returns at once (Metadata's auto-creation: a connection is
        never held up by replica processes starting). None waits for all of them.

        With Ray's autoscaler, a topic that does not fit waits for the brokers it lacks
        (TopicCreation._admitted) up to `scale_out_timeout_ms` (None: `timeout_ms`, or 60 s
        without one), then POLICY_VIOLATION naming what was missing."""
        return await self._topics.create_topic(name, num_partitions, replication_factor, configs, validate_only, timeout_ms,
                                               scale_out_timeout_ms)  # fmt: skip

    async def create_partitions(
        self, name: str, total: int, validate_only: bool = False, scale_out_timeout_ms: int | None = None
    ) -> list[dict]:
        """Grows the topic to `total` partitions (see ClusterMetadata.plan_create_partitions),
        waits until every live new replica has its role; returns the topic's description.
        `validate_only` checks and changes nothing, as Kafka's CreatePartitions does. A wait
        for brokers, with Ray's autoscaler, as for `create_topic`."""
        return await self._topics.create_partitions(name, total, validate_only, scale_out_timeout_ms)

    # ------------------------------------------------------------------ ACLs

    async def create_acls(self, bindings: list[AclBinding]) -> list[KafkaError | None]:
        """CreateAcls: per binding None, or why it was refused (INVALID_REQUEST)."""
        records, results = self._meta.acl.plan_create_acls(bindings)
        if records:
            self._commit(records)
        return results

    async def describe_acls(self, acl_filter: AclFilter) -> list[AclBinding]:
        return self._meta.acl.describe(acl_filter)

    async def delete_acls(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """DeleteAcls: per filter the bindings it matched, all of them deleted."""
        records, matched = self._meta.acl.plan_delete_acls(filters)
        if records:
            self._commit(records)
        return matched

    async def _until_changed(self, version: Callable[[], Any], known_version: Any, wait_ms: int,
                             changed: Callable[[], Wakeup] | None = None) -> None:  # fmt: skip
        """Returns once `version()` is no longer `known_version`, or after `wait_ms`;
        `changed` is the Wakeup a change fires (by default the commits')."""
        deadline_s = time.monotonic() + wait_ms / 1000
        while version() == known_version and (remaining_s := deadline_s - time.monotonic()) > 0:
            await (self._committed if changed is None else changed()).wait(remaining_s)

    async def acls(self, known_version: int = -2, wait_ms: int = 0) -> tuple[int, list[AclBinding]] | None:
        """Every ACL binding and the version they are at, for a listener's authorizer; None
        when the listener's `known_version` is still current after `wait_ms` (a long poll:
        a listener holds one such call open rather than asking again and again)."""
        await self._until_changed(lambda: self._meta.acl.version, known_version, wait_ms)
        if known_version == self._meta.acl.version:
            return None
        return self._meta.acl.version, list(self._meta.acl.bindings)

    # ------------------------------------------------------------------ SCRAM credentials

    async def alter_user_scram_credentials(
        self, deletions: list[tuple[str, str]], upsertions: list[tuple[str, ScramCredential | KafkaError]]
    ) -> dict[str, KafkaError | None]:
        """Deletes (user, mechanism) credentials and sets (user, credential) ones, in the
        metadata log; per user None or the error that refused all its changes."""
        records, results = self._meta.scram.plan_alter(deletions, upsertions)
        if records:
            self._commit(records)
        return results

    async def describe_user_scram_credentials(self, users: list[str] | None = None) -> dict[str, list[tuple[str, int]] | KafkaError]:
        """Per user (all with one, or those named) its (mechanism, iterations), or
        RESOURCE_NOT_FOUND; never a key or a salt."""
        return self._meta.scram.describe(users)

    async def scram_credentials(self, user: str) -> dict[str, ScramCredential]:
        """A user's credentials by mechanism, for a listener authenticating it ({} if none)."""
        return dict(self._meta.scram.credentials.get(user, {}))

    # ------------------------------------------------------------------ client quotas

    async def alter_client_quotas(
        self, alterations: list[tuple[QuotaEntity | KafkaError, list[tuple[str, float | None]]]], validate_only: bool = False
    ) -> list[KafkaError | None]:
        """AlterClientQuotas: sets (value) or removes (None) quota keys of entities; per
        entry None or why all its changes were refused. `validate_only` changes nothing."""
        records, results = self._meta.quotas.plan_alter(alterations)
        if records and not validate_only:
            self._commit(records)
        return results

    async def describe_client_quotas(
        self, components: list[QuotaFilterComponent], strict: bool = False
    ) -> list[tuple[QuotaEntity, dict[str, float]]]:
        """DescribeClientQuotas: the entities the filter matches, with their quotas."""
        return self._meta.quotas.describe(components, strict)

    async def client_quotas(
        self, known_version: int = -2, wait_ms: int = 0
    ) -> tuple[int, dict[QuotaEntity, dict[str, float]]] | None:
        """Every client quota and the version they are at, for a listener; None when the
        listener's `known_version` is still current after `wait_ms` (a long poll, as `acls`)."""
        await self._until_changed(lambda: self._meta.quotas.version, known_version, wait_ms)
        if known_version == self._meta.quotas.version:
            return None
        return self._meta.quotas.version, {e: dict(v) for e, v in self._meta.quotas.quotas.items()}

    async def elect_leaders(
        self, partitions: list[TopicPartition] | None = None, unclean: bool = False
    ) -> dict[TopicPartition, KafkaError | None]:
        """ElectLeaders (KIP-460): preferred leaders (or, with `unclean`, unclean elections of
        leaderless partitions) for `partitions`, or for every partition when None; then
        those whose election was not needed are left out of the answer, as in Kafka.
        Per partition None (elected) or its typed error."""
        if partitions is None:
            everything = sorted((t, p) for t, p, _ in self._meta.all_partitions())
            results = await self._elections.elect(everything, unclean)
            return {tp: e for tp, e in results.items() if not isinstance(e, ElectionNotNeededError)}
        return await self._elections.elect([(t, p) for t, p in partitions], unclean)

    async def delete_topic(self, name: str) -> None:
        meta = self._meta.topics.get(name)
        partitions = dict(meta.partitions) if meta is not None else {}
        tiered = meta is not None and log_config_of(self._meta.configs.of(name)).remote_storage_enable
        self._commit(self._meta.replication.plan_delete_topic(name))
        if meta is not None:
            await self._channels.stop_topic(name, meta.topic_id, partitions)
        settings = self.config.remote_storage()
        if tiered and settings is not None and meta is not None:
            # Its remote segments go with it, as Kafka's RemoteLogManager deletes a deleted
            # topic's (after its replicas stopped: no copy is under way). A store that fails
            # now leaves them, logged: the topic's id names them, no new topic reuses them.
            prefixes = [partition_prefix(name, p, meta.topic_id) for p in partitions]
            try:
                await asyncio.to_thread(delete_remote_partitions, settings, prefixes)
            except KafkaError as e:
                logger.warning("deleted topic %s: its remote segments stay in %s: %s", name, settings.uri, e)

    async def alter_topic_configs(self, name: str, configs: dict) -> dict[str, str]:
        """Replaces the topic's configs (Kafka names); replicas pick them up as they are
        recreated (min.insync.replicas, retention, segment settings)."""
        checked = validate_topic_configs(configs, self.config)
        records = self._meta.configs.plan_alter_topic_configs(name, checked)
        if self._meta.configs.of(name).get(MIN_INSYNC_REPLICAS) != checked.get(MIN_INSYNC_REPLICAS):
            records += self._meta.replication.plan_min_insync_change(name)
        self._commit(records)
        meta = self._meta.topics[name]
        await self._channels.push_all((name, p) for p in meta.partitions)
        return self._meta.configs.of(name)

    async def list_topics(self) -> list[str]:
        return sorted(self._meta.topics)

    async def init_producer_id(self) -> int:
        """A producer id never handed out before, even across Controller restarts."""
        if not self._producer_ids:
            records, first = self._meta.producer_ids.plan_allocate(PRODUCER_ID_BLOCK_SIZE)
            self._commit(records)
            self._producer_ids = range(first, first + PRODUCER_ID_BLOCK_SIZE)
        producer_id, self._producer_ids = self._producer_ids[0], self._producer_ids[1:]
        return producer_id

    async def allocate_producer_ids(self, count: int) -> int:
        """The first of `count` consecutive producer ids never handed out before (a write
        job gives one to each of its tasks, the same to every attempt of a task)."""
        records, first = self._meta.producer_ids.plan_allocate(count)
        self._commit(records)
        return first

    # ------------------------------------------------------------------ group coordinators

    async def find_coordinator(self, group_id: str) -> tuple[int, Any]:
        """(partition of __consumer_offsets, handle of its leader replica) for a group;
        creates the internal topic on first use, as Kafka does."""
        return await self._find_coordinator(OFFSETS_TOPIC, group_id)

    async def find_transaction_coordinator(self, transactional_id: str) -> tuple[int, Any]:
        """(partition of __transaction_state, handle of its leader replica) for a
        transactional id; creates the internal topic on first use, as Kafka does."""
        return await self._find_coordinator(TRANSACTION_STATE_TOPIC, transactional_id)

    async def _find_coordinator(self, topic: str, key: str) -> tuple[int, Any]:
        await self.create_internal_topic(topic)
        partition = coordinator_partition(key, len(self._meta.topics[topic].partitions))
        return partition, await self.leader(topic, partition)

    async def create_internal_topic(self, name: str, timeout_ms: int | None = None) -> None:
        """Creates __consumer_offsets or __transaction_state, unless it exists, with its own
        settings (offsets.topic.*, transaction.state.log.*; compacted), whoever asks: a
        group's or a transactional id's first request, or a Metadata request naming it
        (`timeout_ms` as for `create_topic`)."""
        await self._topics.create_internal_topic(name, timeout_ms)

    async def coordinators(self, topic: str = OFFSETS_TOPIC) -> list[Any]:
        """Handles of every leader of an internal topic's partitions (to list all groups, or
        all transactions)."""
        return self._view.coordinators(topic)

    async def describe_topic(self, name: str) -> list[dict]:
        """Per partition: leader, replicas, isr, epochs, and the leader's HW and LEO."""
        return await self._view.describe_topic(name)

    async def topic_configs(self, name: str) -> dict[str, str]:
        return self._view.topic_configs(name)

    async def leader(self, topic: str, partition: int) -> Any:
        """The leader replica's actor handle; LEADER_NOT_AVAILABLE while there is none."""
        return self._view.leader(topic, partition)

    async def replica(self, topic: str, partition: int, broker_id: int) -> Any:
        """The actor handle of one replica (leader or follower); None if its broker is away."""
        return self._view.replica(topic, partition, broker_id)

    async def metadata(self, topics: list[str] | None = None) -> dict[str, dict]:
        """What a client routes by: per topic, per partition the leader, its epoch and handle."""
        return self._view.metadata(topics)

    async def client_metadata(self, topics: list[str] | None = None) -> dict[str, Any]:
        """What Kafka's Metadata answer holds (see MetadataView.client_metadata)."""
        return self._view.client_metadata(topics)

    async def client_metadata_image(
        self, known_version: tuple[str, int] | None = None, wait_ms: int = 0
    ) -> tuple[tuple[str, int], dict[str, Any]] | None:
        """`client_metadata` of every topic and the version it is at, for a listener's image
        of it (Kafka's MetadataCache on each broker); None when the listener's
        `known_version` is still current after `wait_ms` (a long poll, as `acls`)."""
        def version() -> tuple[str, int]:
            return self._incarnation, self._client_view_version

        await self._until_changed(version, known_version, wait_ms, lambda: self._client_view_changed)
        if version() == known_version:
            return None
        if wait_ms > 0:
            # A long poll answers a little late, so the changes right behind this one (a push
            # of many partitions takes up their leaders one by one) go into the same answer,
            # and a listener behind a burst fetches at most one image per linger.
            await asyncio.sleep(CLIENT_METADATA_LINGER_MS / 1000)
        current = version()
        if self._client_view_built is None or self._client_view_built[0] != current:
            self._client_view_built = current, self._view.client_metadata(None)  # one build for every listener
        return self._client_view_built

    # ------------------------------------------------------------------ brokers

    async def brokers(self) -> list[dict]:
        """Every registered broker: epoch, node, fenced, attached to this session, listeners."""
        return self._view.brokers()

    async def cluster_id(self) -> str:
        return self._meta.cluster_id

    async def balancer_status(self) -> dict[str, Any]:
        """The balancer's state: `enabled`; `busy` while a run is requested, its moves are
        under way or their preferred leaders are still to be elected; and its last plan:
        the moves (topic, partition, replicas), the score per goal before and after, and
        whether more is to follow (for tools, tests and benchmarks)."""
        plan, balancer = self._balancer.last_plan, self._balancer
        return {
            "enabled": balancer.enabled,
            "busy": balancer.busy,
            "last_moves": [(m.topic, m.partition, list(m.replicas)) for m in plan.moves] if plan else [],
            "score_before": list(plan.score_before) if plan else [],
            "score_after": list(plan.score_after) if plan else [],
            "incomplete": plan.incomplete if plan else False,
        }

    async def health(self) -> dict[str, int]:
        """The Controller's gauges, for `rayk status` (which needs no Prometheus)."""
        return {"active_controller_count": 1, "offline_partitions_count": self._view.offline_partitions_count()}

    async def session_counts(self) -> dict[str, int]:
        """Since this Controller started: broker registrations, fencings by reason
        (fenced_dead: Ray reported the process dead; fenced_silent: past the session, with
        no process Ray has alive; fenced_late: alive per Ray, silent past the bound), and
        the longest gap between two heartbeats of a broker; and the brokers late right now
        (for tools and overload tests)."""
        counts = {k: self._sessions.counts[k] for k in ("registrations", "fenced_dead", "fenced_silent", "fenced_late")}
        return counts | {"late_brokers": len(self._sessions.late_brokers()),
                         "longest_silence_ms": int(self._sessions.longest_silence_s * 1000)}

    async def data_dir(self) -> str:
        return str(self.dir)

    async def broker_config(self) -> BrokerConfig:
        return self.config


def _partitions_in(records: list[Record]) -> set[tuple[str, int]]:
    return {(r.topic, r.partition) for r in records if isinstance(r, PartitionRecord)}


def assert_consistent(meta: ClusterMetadata, records: list[Record], broker_epochs: dict[int, int]) -> None:
    """Asserts what holds of the image after a commit of `records` (`broker_epochs`: each
    broker's epoch before it): broker epochs only grow; every partition the commit
    changed names registered brokers only, and a leader that is live or none; a fenced
    broker leads nothing. (Each partition's own invariants, and that its epochs only
    grow, are asserted as it is replayed: ReplicationControlManager.)"""
    brokers = meta.brokers
    for record in records:
        if isinstance(record, RegisterBrokerRecord) and record.broker_id in broker_epochs:
            assert brokers[record.broker_id].epoch > broker_epochs[record.broker_id], "broker epochs only grow"
        elif isinstance(record, PartitionRecord) and record.topic in meta.topics:
            state = meta.topics[record.topic].partitions[record.partition]
            assert all(b in brokers for b in state.replicas), f"replicas {state.replicas} are registered brokers"
            assert state.leader == NO_LEADER or not brokers[state.leader].fenced, f"a fenced leader: {record}"
        elif isinstance(record, FenceBrokerRecord) and record.fenced:
            led = [(t, p) for t, p, s in meta.all_partitions() if s.leader == record.broker_id]
            assert not led, f"fenced broker {record.broker_id} still leads {led}"
