"""Controller: the cluster's metadata and elections, as one detached async Ray actor.

It is the shell over `ClusterMetadata` (`rayk/metadata`: brokers, topics with ids and
configs, per partition the replicas, leader, leader epoch, ISR and partition epoch, ACLs,
SCRAM credentials, client quotas, producer ids), and the only writer of it. Every change
is planned by the control manager of its domain (`self._meta.replication.plan_*`, ...;
rules in `elections.py`), written durably to the `MetadataLog`
(`<dir>/__cluster_metadata-0`), applied, and only then
pushed to the brokers concerned: the leader's ReplicaManager first (its answer is the
leader replica's handle), then the followers' with that handle. Planning and committing
never await, so on the actor's event loop each change is atomic; pushes are asynchronous
and may overlap, which the brokers tolerate because every push carries its epochs. A
push has a timeout (twice `broker.session.timeout.ms`), so one hung broker stalls
nothing else; a push that fails or times out marks its partition to be pushed again.

Liveness: brokers heartbeat every `broker.heartbeat.interval.ms`. A broker silent for
`broker.session.timeout.ms`, or whose actor Ray reports dead (a call held open on it,
`run_until_stopped`, fails), is fenced: out of the ISRs it can leave, and a new leader
with a bumped epoch wherever it led. A fenced broker that speaks again is told to
register anew. Each registration names the broker process (an incarnation id): a new
process lost its replicas' in-memory state, and after an unclean shutdown (no
clean-shutdown marker, KIP-966) or on a freshly formatted directory its copies must catch
up before they may lead again (see `elections.py`). A replica process that dies is not
a broker failure: its broker reports it (`replica_failed`), the partition's leadership
moves if it led, and the next push re-creates it.

Maintenance, every second or so: fence silent brokers, push again what did not arrive,
elect the longest log where every in-sync copy restarted uncleanly (all back, all
recovering), and after `broker.replacement.delay.ms` move the replicas of a broker
that stays fenced to live brokers on other nodes, by Kafka's reassignment (KIP-455):
new replicas are added, catch up and join the ISR, and only then are the old ones
removed (and deleted on their brokers).

Metrics (rayk/metrics.py), every maintenance tick: ActiveControllerCount (1),
OfflinePartitionsCount (partitions without a leader), and as Kafka's EventQueueTimeMs how
late the tick's timer ran: how long a ready event waited for this actor's event loop,
where every call and push answer queues.

Snapshots: the maintenance writes one (`rayk/metadata/`) once
`metadata.log.max.record.bytes.between.snapshots` of records were appended since the last,
or `metadata.log.max.snapshot.interval.ms` after it, so a start restores the newest
snapshot and replays only the records after it.

Restarts: Ray restarts this actor (max_restarts=-1); it restores its metadata, starts its
maintenance on its own, and gives every broker that was live one session timeout to
register again before it is fenced. A broker that re-registers as the same process keeps
its roles; so a whole cluster, or only this Controller, restarts with its leaders and
ISRs as they were, as far as that is safe.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray.exceptions import RayActorError, RayError

from rayk import metrics
from rayk.metadata import elections
from rayk.metadata.cluster_metadata import NO_LEADER, ClusterMetadata, LogEnd, PartitionState, Record
from rayk.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, coordinator_partition, is_internal
from rayk.metadata.log import MetadataLog
from rayk.metadata.records import ClusterIdRecord, PartitionRecord
from rayk.server.replica_capacity import check_replica_caps, replica_caps
from rayk.acls import AclBinding, AclFilter
from rayk.quotas import QuotaEntity, QuotaFilterComponent
from rayk.scram import ScramCredential
from rayk.server.replica_manager import PartitionAssignment
from rayk.actors.supervision import start_again_if_restarted
from rayk.actors.wakeup import Wakeup
from rayk.config import MIN_INSYNC_REPLICAS, BrokerConfig, validate_topic_configs
from rayk.errors import (
    ElectionNotNeededError,
    InvalidRequestError,
    KafkaError,
    LeaderNotAvailableError,
    RequestTimedOutError,
    StaleBrokerEpochError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

logger = logging.getLogger(__name__)

MAINTENANCE_MAX_INTERVAL_MS = 1_000
PRODUCER_ID_BLOCK_SIZE = 1000  # ids reserved per metadata record
TopicPartition = tuple[str, int]


def new_uuid() -> str:
    """A Kafka-style id: a random UUID in URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class Controller:
    def __init__(self, directory: str, broker_config: BrokerConfig | None = None) -> None:
        self.dir = Path(directory)
        self.config = broker_config or BrokerConfig()
        self._log = MetadataLog(
            self.dir,
            self.config.metadata_log_max_record_bytes_between_snapshots,
            self.config.metadata_log_max_snapshot_interval_ms,
        )
        self._meta = ClusterMetadata(self.config)
        self._meta.load(self._log)
        self._committed = Wakeup()  # fired by every commit: the long polls of `acls` and `client_quotas`
        if self._meta.cluster_id is None:
            self._commit([ClusterIdRecord(new_uuid())])
        now = time.monotonic()
        self._last_heartbeat: dict[int, float] = {b: now for b in self._meta.live_brokers}
        self._fenced_since: dict[int, float] = {b: now for b, r in self._meta.brokers.items() if r.fenced}
        self._managers: dict[int, Any] = {}  # broker id -> ReplicaManager handle, this session
        # broker id -> its Kafka listeners' advertised (host, port) by listener name
        self._endpoints: dict[int, dict[str, tuple[str, int]]] = {}
        self._node_memory_bytes: dict[int, int] = {}  # broker id -> its node's memory, as it registered
        self._replica_handles: dict[tuple[str, int, int], Any] = {}
        # The leader epoch in which each partition's leader last answered its push, so it
        # takes writes in it: Metadata names a leader only then (a client sent to a leader
        # still starting got NOT_LEADER_OR_FOLLOWER, and librdkafka then reordered retries).
        self._leading_in: dict[TopicPartition, int] = {}
        self._dirty: set[TopicPartition] = set()  # partitions whose last push did not reach every replica
        self._replacement_blocked: set[int] = set()  # fenced brokers with nowhere to move (logged once)
        self._next_rebalance_s = time.monotonic() + self.config.leader_imbalance_check_interval_seconds
        self._tasks: set[asyncio.Task] = set()
        self._registering: set[int] = set()
        self._producer_ids = range(0)  # the reserved block not yet handed out
        self._maintenance: asyncio.Task | None = None
        self._dirty_pushes: asyncio.Task | None = None  # the maintenance's pushes of dirty partitions
        self._push_timeout_s = 2 * self.config.broker_session_timeout_ms / 1000
        if start_again_if_restarted():  # Ray restarted this Controller after its process died
            logger.warning("Controller restarted by Ray; metadata restored up to offset %d", self._meta.last_offset)

    def _commit(self, records: list[Record]) -> None:
        if not records:
            return
        before = {
            (r.topic, r.partition): self._meta.topics[r.topic].partitions.get(r.partition)
            for r in records
            if isinstance(r, PartitionRecord) and r.topic in self._meta.topics
        }
        first_offset = self._log.append(records)
        for i, record in enumerate(records):
            self._meta.apply(record, first_offset + i)
        committed, self._committed = self._committed, Wakeup()
        committed.fire()
        for (topic, partition), old in before.items():
            new = self._meta.topics[topic].partitions[partition]
            removed = set(old.replicas) - set(new.replicas) if old is not None else set()
            if removed:  # a reassignment completed: the replicas it dropped go
                topic_id = self._meta.topics[topic].topic_id
                self._spawn(self._remove_replicas(topic, partition, removed, topic_id, new.partition_epoch))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _attach(self, broker_id: int, manager: Any) -> None:
        self._managers[broker_id] = manager
        self._meta.attached.add(broker_id)

    def _detach(self, broker_id: int) -> None:
        self._managers.pop(broker_id, None)
        self._meta.attached.discard(broker_id)
        for key in [k for k in self._replica_handles if k[2] == broker_id]:
            del self._replica_handles[key]

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Starts the maintenance loop (idempotent); returns the cluster id.

        Called once the brokers were (re)started, or by this actor itself after Ray
        restarted it: a broker of the replayed metadata that has not registered by then
        gets one full session timeout from now to do so."""
        if self._maintenance is None:
            now = time.monotonic()
            for broker_id in self._meta.live_brokers - set(self._managers):
                self._last_heartbeat[broker_id] = now
            self._maintenance = asyncio.get_running_loop().create_task(self._maintain())
        return self._meta.cluster_id

    async def shutdown(self) -> None:
        """Cleanly stops every broker (data and metadata stay on disk), then itself."""
        if self._maintenance is not None:
            self._maintenance.cancel()
        managers = list(self._managers.values())
        self._managers.clear()
        self._meta.attached.clear()
        await asyncio.gather(*(m.shutdown.remote() for m in managers), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
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
    ) -> tuple[int, dict]:
        """A ReplicaManager (re)starts, or registers again. Returns its broker epoch and the
        partitions assigned to it (topic, partition) -> topic id, after pushing their states
        to it. `endpoints` are its Kafka listeners' advertised (host, port) by listener name;
        `incarnation_id` names its process, `directory_id` its data directory, and
        `clean_shutdown` says whether its last run ended with the clean-shutdown marker, and
        `node_memory_bytes` is its node's memory (what caps its replicas: replica_capacity.py)."""
        self._set_endpoints(broker_id, endpoints)
        self._node_memory_bytes[broker_id] = node_memory_bytes
        previous = self._meta.brokers.get(broker_id)
        if previous is not None and previous.incarnation_id != incarnation_id:
            self._detach(broker_id)  # a new process: the old one's replica handles are dead
        records = self._meta.plan_register_broker(broker_id, node_id, incarnation_id, directory_id, clean_shutdown)
        self._commit(records)
        changed = _partitions_in(records)
        epoch = self._meta.brokers[broker_id].epoch
        self._attach(broker_id, manager)
        self._fenced_since.pop(broker_id, None)
        self._replacement_blocked.discard(broker_id)
        self._spawn(self._watch(broker_id, epoch, manager))
        mine = {(t, p) for t, p, _ in self._meta.replication.partitions_of_broker(broker_id)}
        # Creating replica actors takes a while; the broker cannot heartbeat before this
        # returns, so its session starts when the pushes are done.
        self._registering.add(broker_id)
        try:
            await asyncio.gather(*(self._push_partition(t, p) for t, p in mine | changed))
        finally:
            self._registering.discard(broker_id)
            self._last_heartbeat[broker_id] = time.monotonic()
        await self._recover_uncleanly(mine)
        logger.info(
            "broker %d registered on node %s with epoch %d (%s shutdown)",
            broker_id, node_id, epoch, "clean" if clean_shutdown else "unclean",
        )
        # (a topic deleted while the pushes went out is no longer this broker's)
        return epoch, {(t, p): self._meta.topics[t].topic_id for t, p in mine if t in self._meta.topics}

    def _set_endpoints(self, broker_id: int, endpoints: dict[str, tuple[str, int]] | None) -> None:
        if not endpoints:
            self._endpoints.pop(broker_id, None)
        else:
            self._endpoints[broker_id] = {str(name): (str(host), int(port)) for name, (host, port) in endpoints.items()}

    def _check_broker_epoch(self, broker_id: int, broker_epoch: int) -> None:
        registration = self._meta.brokers.get(broker_id)
        if registration is None or registration.fenced or registration.epoch != broker_epoch:
            raise StaleBrokerEpochError(f"broker {broker_id} epoch {broker_epoch} is fenced or not current")

    async def assigned_partitions(self, broker_id: int, broker_epoch: int) -> dict[TopicPartition, str]:
        """The partitions a broker holds a replica of, with their topic ids (what it checks
        its running replicas against)."""
        self._check_broker_epoch(broker_id, broker_epoch)
        return {(t, p): self._meta.topics[t].topic_id for t, p, _ in self._meta.replication.partitions_of_broker(broker_id)}

    async def update_endpoints(self, broker_id: int, broker_epoch: int, endpoints: dict[str, tuple[str, int]] | None) -> None:
        """A broker restarted its Kafka listeners (they died), maybe on other ports."""
        self._check_broker_epoch(broker_id, broker_epoch)
        self._set_endpoints(broker_id, endpoints)

    async def heartbeat(self, broker_id: int, broker_epoch: int) -> str:
        """Answers "ok", "reregister" (fenced, or unknown to this Controller session) or "stale"."""
        registration = self._meta.brokers.get(broker_id)
        if registration is None or registration.fenced or broker_id not in self._managers:
            return "reregister"
        if broker_epoch != registration.epoch:
            return "stale"
        self._last_heartbeat[broker_id] = time.monotonic()
        return "ok"

    async def _watch(self, broker_id: int, epoch: int, manager: Any) -> None:
        """Fences the broker as soon as Ray reports its actor dead (Ray may then restart it:
        it registers again as a new incarnation)."""
        try:
            await manager.run_until_stopped.remote()
        except RayError:  # RayActorError, or ActorUnschedulableError once its node is gone
            registration = self._meta.brokers.get(broker_id)
            if registration is not None and registration.epoch == epoch and not registration.fenced:
                logger.warning("broker %d died: fencing it", broker_id)
                await self._fence_and_push(broker_id)

    def _fence(self, broker_id: int) -> set[tuple[str, int]]:
        records = self._meta.plan_fence_broker(broker_id)
        self._commit(records)
        self._detach(broker_id)
        if records:
            self._fenced_since[broker_id] = time.monotonic()
        return _partitions_in(records)

    async def _fence_and_push(self, broker_id: int) -> None:
        changed = self._fence(broker_id)
        await asyncio.gather(*(self._push_partition(t, p) for t, p in changed))

    # ------------------------------------------------------------------ maintenance

    async def _maintain(self) -> None:
        period_s = min(MAINTENANCE_MAX_INTERVAL_MS, self.config.broker_session_timeout_ms // 4) / 1000
        while True:
            slept_from_s = time.monotonic()
            await asyncio.sleep(period_s)
            metrics.record_event_queue_time((time.monotonic() - slept_from_s - period_s) * 1000)
            metrics.record_controller(self._offline_partitions_count())
            steps = (self._fence_silent_brokers, self._push_dirty, self._recover_leaderless, self._replace_lost_brokers,
                     self._rebalance_leaders, self._snapshot_if_due)
            for step in steps:
                try:
                    await step()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("Controller maintenance: %s failed", step.__name__)

    async def _snapshot_if_due(self) -> None:
        """Snapshots the metadata image once enough was appended since the last one (or
        long enough ago), so a restart replays only what came after it."""
        if self._log.snapshot_due():
            started_s = time.monotonic()
            path = self._log.write_snapshot(self._meta.snapshot())
            logger.info("metadata snapshot %s written in %.0f ms", path.name, (time.monotonic() - started_s) * 1000)

    async def _fence_silent_brokers(self) -> None:
        timeout_s = self.config.broker_session_timeout_ms / 1000
        now = time.monotonic()
        for broker_id in sorted(self._meta.live_brokers - self._registering):
            silent_s = now - self._last_heartbeat.get(broker_id, now)
            if silent_s > timeout_s:
                logger.warning("broker %d silent for %.1f s: fencing it", broker_id, silent_s)
                await self._fence_and_push(broker_id)

    async def _push_dirty(self) -> None:
        """Pushes again, in a task of their own, the partitions whose last push did not reach
        every replica: a slow broker's pushes wait out their timeout there, not in the
        maintenance round, whose fencing of silent brokers must keep its pace. One such
        task at a time; what turns dirty meanwhile goes with the next."""
        if self._dirty_pushes is not None and not self._dirty_pushes.done():
            return
        dirty, self._dirty = self._dirty, set()
        if dirty:
            self._dirty_pushes = asyncio.get_running_loop().create_task(self._push_partitions(sorted(dirty)))
            self._tasks.add(self._dirty_pushes)
            self._dirty_pushes.add_done_callback(self._tasks.discard)

    async def _push_partitions(self, partitions: list[TopicPartition]) -> None:
        results = await asyncio.gather(*(self._push_partition(t, p) for t, p in partitions), return_exceptions=True)
        for (topic, partition), result in zip(partitions, results):
            if isinstance(result, Exception):
                logger.error("pushing %s-%d again failed", topic, partition, exc_info=result)
                self._dirty.add((topic, partition))

    async def _recover_leaderless(self) -> None:
        """Every leaderless partition is elected again by the current rules (a safety net:
        events normally do it), and those that need it get their logs compared."""
        leaderless = {(t, p) for t, p, s in self._meta.all_partitions() if s.leader == NO_LEADER}
        elected = []
        for topic, partition in sorted(leaderless):
            records = self._meta.replication.plan_reconcile(topic, partition)
            if records:
                self._commit(records)
                elected.append((topic, partition))
        await asyncio.gather(*(self._push_partition(t, p) for t, p in elected))
        await self._recover_uncleanly(leaderless - set(elected))

    async def _recover_uncleanly(self, partitions: set[TopicPartition]) -> None:
        """Rule 4 of `elections`: where every live in-sync copy is back but restarted
        uncleanly (and the missing ones are fenced), ask each for its log's end and elect
        the most complete."""
        for topic, partition in sorted(partitions):
            copies = self._meta.replication.copies_to_compare(topic, partition) if topic in self._meta.topics else ()
            if not copies:
                continue
            handles = {b: self._replica_handles.get((topic, partition, b)) for b in copies}
            if None in handles.values():
                continue  # not every copy is open yet: the next round asks
            try:
                async with asyncio.timeout(self._push_timeout_s):
                    infos = await asyncio.gather(*(h.describe.remote() for h in handles.values()))
            except (TimeoutError, RayActorError) as e:
                logger.warning("%s-%d: could not compare the logs of %s: %s", topic, partition, sorted(copies), e)
                continue
            ends = {b: LogEnd(i["latest_epoch"], i["log_end_offset"]) for b, i in zip(handles, infos)}
            records = self._meta.replication.plan_unclean_recovery(topic, partition, ends)
            if records:
                logger.warning(
                    "%s-%d: every in-sync copy restarted uncleanly; electing broker %d, the most complete log of %s",
                    topic, partition, records[0].leader, {b: (e.latest_epoch, e.log_end_offset) for b, e in ends.items()},
                )
                self._commit(records)
                await self._push_partition(topic, partition)

    async def _rebalance_leaders(self) -> None:
        """Kafka's auto.leader.rebalance.enable: every leader.imbalance.check.interval.seconds,
        the partitions of each broker that leads fewer than (100 - percentage)% of those it
        is the preferred leader of get their preferred leader back, where it may lead.
        Partitions under reassignment are left to it."""
        c = self.config
        now = time.monotonic()
        if not c.auto_leader_rebalance_enable or now < self._next_rebalance_s:
            return
        self._next_rebalance_s = now + c.leader_imbalance_check_interval_seconds
        steady = (((t, p), s) for t, p, s in self._meta.all_partitions() if not s.adding and not s.removing)
        wanted = elections.imbalanced(steady, c.leader_imbalance_per_broker_percentage / 100)
        elected = await self._elect(sorted(wanted), unclean=False)
        moved = [tp for tp, error in elected.items() if error is None]
        if moved:
            logger.info("leader rebalance: preferred leaders back for %s", ", ".join(f"{t}-{p}" for t, p in moved))

    async def _elect(self, partitions: list[TopicPartition], unclean: bool) -> dict[TopicPartition, KafkaError | None]:
        """Elects each partition (see ClusterMetadata.plan_elect_leader) and pushes the new
        leaders; per partition None or the error that stopped its election."""
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
        await asyncio.gather(*(self._push_partition(t, p) for (t, p), e in results.items() if e is None))
        return results

    async def _replace_lost_brokers(self) -> None:
        """Moves the replicas of brokers fenced for `broker.replacement.delay.ms` to live
        brokers (KIP-455 reassignments), where one can take them."""
        delay_ms = self.config.broker_replacement_delay_ms
        if delay_ms < 0:
            return
        now = time.monotonic()
        lost = {b for b, since in self._fenced_since.items() if now - since >= delay_ms / 1000}
        if not lost:
            return
        moved, stuck = [], []
        for topic, partition, state in self._meta.all_partitions():
            if not lost & set(state.replicas) or state.adding or state.removing:
                continue  # nothing lost here, or already moving
            target = self._replacement_for(state, lost)
            if target is None:
                stuck.append((topic, partition))
                continue
            self._commit(self._meta.replication.plan_reassign(topic, partition, target))
            moved.append((topic, partition))
        if moved:
            logger.warning("brokers %s lost for %.0f s or more: moving %s to live brokers", sorted(lost), delay_ms / 1000, moved)
            await asyncio.gather(*(self._push_partition(t, p) for t, p in moved))
        newly_stuck = {b for t, p in stuck for b in self._meta.partition(t, p).replicas if b in lost} - self._replacement_blocked
        if newly_stuck:
            self._replacement_blocked |= newly_stuck
            logger.warning("brokers %s are lost but no live broker can take %s", sorted(newly_stuck), stuck)

    def _replacement_for(self, state: PartitionState, lost: set[int]) -> list[int] | None:
        """The replicas with every lost one swapped for a live broker: on a node holding no
        other replica of the partition if possible, then holding the fewest replicas."""
        load: dict[int, int] = {}
        for _, _, s in self._meta.all_partitions():
            for r in s.replicas:
                load[r] = load.get(r, 0) + 1
        target = list(state.replicas)
        for i, r in enumerate(target):
            if r not in lost:
                continue
            nodes_used = {self._meta.brokers[b].node_id for b in target if b not in lost and b in self._meta.brokers}
            candidates = [b for b in sorted(self._meta.attached & self._meta.live_brokers) if b not in target]
            if not candidates:
                return None
            best = min(candidates, key=lambda b: (self._meta.brokers[b].node_id in nodes_used, load.get(b, 0), b))
            target[i] = best
            load[best] = load.get(best, 0) + 1
        return target

    async def _remove_replicas(
        self, topic: str, partition: int, brokers: set[int], topic_id: str, partition_epoch: int
    ) -> None:
        """Stops and deletes the replicas a reassignment dropped; their managers then
        ignore any push of this partition up to `partition_epoch` still on its way."""
        for b in brokers:
            self._replica_handles.pop((topic, partition, b), None)
        stops = [
            m.stop_replica.remote(topic, partition, True, topic_id, partition_epoch)
            for b in brokers
            if (m := self._managers.get(b))
        ]
        await asyncio.gather(*stops, return_exceptions=True)

    # ------------------------------------------------------------------ pushing states

    async def _push_partition(self, topic: str, partition: int) -> None:
        """Sends the partition's current state to its attached replicas, leader first."""
        meta = self._meta.topics.get(topic)
        if meta is None:
            return
        state = meta.partitions[partition]
        configs = self._meta.configs.of(topic)

        def assignment(leader_handle: Any) -> PartitionAssignment:
            return PartitionAssignment(topic, partition, meta.topic_id, state, configs, leader_handle)

        leader_handle = None
        if state.leader != NO_LEADER and state.leader in self._managers:
            leader_handle = await self._push_to(state.leader, assignment(None))
            if leader_handle is not None and topic in self._meta.topics:
                self._leading_in[(topic, partition)] = state.leader_epoch
        followers = [b for b in state.replicas if b != state.leader and b in self._managers]
        await asyncio.gather(*(self._push_to(b, assignment(leader_handle)) for b in followers))

    async def _push_to(self, broker_id: int, assignment: PartitionAssignment) -> Any:
        manager = self._managers.get(broker_id)
        if manager is None:
            return None
        tp = (assignment.topic, assignment.partition)
        try:
            async with asyncio.timeout(self._push_timeout_s):
                handle = await manager.apply_partition.remote(assignment)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            # A broker that still heartbeats is slow, not failed: each new replica is a
            # process, and a node creating a hundred of them takes longer than the timeout.
            # The push goes again with the next maintenance round either way.
            silent_s = time.monotonic() - self._last_heartbeat.get(broker_id, 0.0)
            slow = broker_id in self._meta.live_brokers and silent_s < self.config.broker_heartbeat_interval_ms * 2 / 1000
            logger.log(logging.INFO if slow else logging.WARNING, "pushing %s-%d to broker %d timed out after %.0f s%s",
                       *tp, broker_id, self._push_timeout_s, "; it heartbeats, so it is only slow" if slow else "")
            self._dirty.add(tp)
            return None
        except Exception as e:  # the broker died (its watch fences it), or the apply failed
            logger.warning("pushing %s-%d to broker %d failed: %s", *tp, broker_id, str(e).splitlines()[0] if str(e) else type(e).__name__)
            self._dirty.add(tp)
            return None
        if handle is None:
            self._replica_handles.pop((*tp, broker_id), None)  # its replica failed; it is being moved
        else:
            self._replica_handles[(*tp, broker_id)] = handle
        return handle

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
        self._check_broker_epoch(broker_id, broker_epoch)
        records = self._meta.replication.plan_alter_partition(
            topic, partition, broker_id, leader_epoch, partition_epoch, isr, added_incarnations
        )
        self._commit(records)
        state = self._meta.partition(topic, partition)
        if records:
            # Every replica learns the new state from a push too, not only the leader from
            # this answer, which may be lost or arrive after the leader moved on; and a
            # completed reassignment changes the replicas and maybe the leader.
            self._spawn(self._push_partition(topic, partition))
        return list(state.isr), state.partition_epoch

    async def replica_failed(self, broker_id: int, broker_epoch: int, topic: str, partition: int) -> None:
        """A broker's replica process died (its broker lives): its leadership moves and it
        leaves the ISR where another copy is ready; then every replica gets the new state,
        which re-creates the failed one from its log."""
        self._check_broker_epoch(broker_id, broker_epoch)
        self._replica_handles.pop((topic, partition, broker_id), None)
        records = self._meta.replication.plan_replica_failed(topic, partition, broker_id)
        self._commit(records)
        logger.warning("broker %d's replica of %s-%d failed: %s", broker_id, topic, partition,
                       f"now {self._meta.partition(topic, partition)}" if records else "no change")
        await self._push_partition(topic, partition)

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
        await asyncio.gather(*(self._push_partition(t, p) for t, p in started))
        return results

    async def list_partition_reassignments(
        self, partitions: list[TopicPartition] | None = None
    ) -> dict[TopicPartition, dict[str, list[int]]]:
        """The reassignments under way: replicas, adding and removing per partition."""
        wanted = None if partitions is None else set(partitions)
        return {
            (t, p): {"replicas": list(s.replicas), "adding": list(s.adding), "removing": list(s.removing)}
            for t, p, s in sorted(self._meta.all_partitions(), key=lambda x: (x[0], x[1]))
            if (s.adding or s.removing) and (wanted is None or (t, p) in wanted)
        }

    # ------------------------------------------------------------------ topics

    async def create_topic(
        self, name: str, num_partitions: int | None = None, replication_factor: int | None = None,
        configs: dict | None = None, validate_only: bool = False, timeout_ms: int | None = None,
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
        never held up by replica processes starting). None waits for all of them."""
        if num_partitions in (None, -1):
            num_partitions = self.config.num_partitions
        if replication_factor in (None, -1):
            replication_factor = self.config.default_replication_factor
        checked = validate_topic_configs(configs)
        records = self._meta.replication.plan_create_topic(name, num_partitions, replication_factor, checked, new_uuid())
        if not is_internal(name):  # groups and transactions must work whatever users have filled
            self._check_replica_caps(records)
        if validate_only:
            return []
        self._commit(records)
        pushes = asyncio.get_running_loop().create_task(self._push_partitions([(name, p) for p in range(num_partitions)]))
        self._tasks.add(pushes)
        pushes.add_done_callback(self._tasks.discard)
        if timeout_ms is None:
            await pushes
        elif timeout_ms > 0:
            try:
                await asyncio.wait_for(asyncio.shield(pushes), timeout_ms / 1000)
            except TimeoutError:
                raise RequestTimedOutError(
                    f"topic {name!r} is created; its replicas were not all started within {timeout_ms} ms"
                ) from None
        return await self.describe_topic(name)

    async def create_partitions(self, name: str, total: int, validate_only: bool = False) -> list[dict]:
        """Grows the topic to `total` partitions (see ClusterMetadata.plan_create_partitions),
        waits until every live new replica has its role; returns the topic's description.
        `validate_only` checks and changes nothing, as Kafka's CreatePartitions does."""
        if is_internal(name):  # its partition count is what maps a group or a transactional id to its coordinator
            raise InvalidRequestError(f"the partition count of {name} cannot change")
        current = len(self._meta.topics[name].partitions) if name in self._meta.topics else 0
        records = self._meta.replication.plan_create_partitions(name, total)
        self._check_replica_caps(records)
        if validate_only:
            return []
        self._commit(records)
        await asyncio.gather(*(self._push_partition(name, p) for p in range(current, total)))
        return await self.describe_topic(name)

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

    async def _until_changed(self, version: Callable[[], int], known_version: int, wait_ms: int) -> None:
        """Returns once `version()` is no longer `known_version`, or after `wait_ms`."""
        deadline_s = time.monotonic() + wait_ms / 1000
        while version() == known_version and (remaining_s := deadline_s - time.monotonic()) > 0:
            await self._committed.wait(remaining_s)

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

    def _check_replica_caps(self, records: list[Record]) -> None:
        """POLICY_VIOLATION if the new partitions of `records` put a broker past its cap."""
        held = Counter(b for _, _, state in self._meta.all_partitions() for b in state.replicas)
        adding = [b for r in records if isinstance(r, PartitionRecord) for b in r.replicas]
        node_of = {b: self._meta.brokers[b].node_id for b in self._meta.live_brokers}
        caps = replica_caps(self.config.max_replicas_per_broker, self._node_memory_bytes, node_of)
        check_replica_caps(held, adding, caps, configured=self.config.max_replicas_per_broker > 0)

    async def elect_leaders(
        self, partitions: list[TopicPartition] | None = None, unclean: bool = False
    ) -> dict[TopicPartition, KafkaError | None]:
        """ElectLeaders (KIP-460): preferred leaders (or, with `unclean`, unclean elections of
        leaderless partitions) for `partitions`, or for every partition when None; then
        those whose election was not needed are left out of the answer, as in Kafka.
        Per partition None (elected) or its typed error."""
        if partitions is None:
            everything = sorted((t, p) for t, p, _ in self._meta.all_partitions())
            results = await self._elect(everything, unclean)
            return {tp: e for tp, e in results.items() if not isinstance(e, ElectionNotNeededError)}
        return await self._elect([(t, p) for t, p in partitions], unclean)

    async def delete_topic(self, name: str) -> None:
        meta = self._meta.topics.get(name)
        partitions = dict(meta.partitions) if meta is not None else {}
        self._commit(self._meta.replication.plan_delete_topic(name))
        stops = []
        for p, state in partitions.items():
            self._dirty.discard((name, p))
            self._leading_in.pop((name, p), None)
            for b in state.replicas:
                self._replica_handles.pop((name, p, b), None)
                if (manager := self._managers.get(b)) is not None:
                    # Every push of this topic id still on its way is older than this.
                    stops.append(manager.stop_replica.remote(name, p, True, meta.topic_id, None))
        await asyncio.gather(*stops, return_exceptions=True)

    async def alter_topic_configs(self, name: str, configs: dict) -> dict[str, str]:
        """Replaces the topic's configs (Kafka names); replicas pick them up as they are
        recreated (min.insync.replicas, retention, segment settings)."""
        checked = validate_topic_configs(configs)
        records = self._meta.configs.plan_alter_topic_configs(name, checked)
        if self._meta.configs.of(name).get(MIN_INSYNC_REPLICAS) != checked.get(MIN_INSYNC_REPLICAS):
            records += self._meta.replication.plan_min_insync_change(name)
        self._commit(records)
        meta = self._meta.topics[name]
        await asyncio.gather(*(self._push_partition(name, p) for p in meta.partitions))
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
        if name in self._meta.topics:
            return
        c, live = self.config, len(self._meta.live_brokers)
        if name == OFFSETS_TOPIC:
            partitions, segment_bytes = c.offsets_topic_num_partitions, c.offsets_topic_segment_bytes
            rf = max(min(c.offsets_topic_replication_factor, live), 1)
            configs = {}
        elif name == TRANSACTION_STATE_TOPIC:
            partitions, segment_bytes = c.transaction_state_log_num_partitions, c.transaction_state_log_segment_bytes
            rf = max(min(c.transaction_state_log_replication_factor, live), 1)
            configs = {"min.insync.replicas": str(min(c.transaction_state_log_min_isr, rf))}
        else:
            raise InvalidRequestError(f"{name!r} is not an internal topic")
        configs |= {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)}
        try:
            await self.create_topic(name, partitions, rf, configs, timeout_ms=timeout_ms)
        except TopicAlreadyExistsError:
            pass  # a concurrent request created it

    async def coordinators(self, topic: str = OFFSETS_TOPIC) -> list[Any]:
        """Handles of every leader of an internal topic's partitions (to list all groups, or
        all transactions)."""
        meta = self._meta.topics.get(topic)
        if meta is None:
            return []
        return [self._replica_handles.get((topic, p, s.leader)) for p, s in sorted(meta.partitions.items())]

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
                    "recovering": list(state.recovering),
                    "adding_replicas": list(state.adding),
                    "removing_replicas": list(state.removing),
                    "eligible_leader_replicas": list(state.eligible),
                    **offsets,
                }
            )
        return out

    async def topic_configs(self, name: str) -> dict[str, str]:
        if name not in self._meta.topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return self._meta.configs.of(name)

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
        """What Kafka's Metadata answer holds: the live brokers' listeners (by listener name:
        a Metadata request is answered with the addresses of the listener it came on), and per topic
        (all, or those of `topics` that exist) its id and per partition leader, epoch,
        replicas and ISR. A leader is named once it has taken up its leadership in the
        current epoch (else -1: LEADER_NOT_AVAILABLE, as for a topic being created)."""
        live = self._meta.live_brokers
        names = sorted(self._meta.topics) if topics is None else [t for t in topics if t in self._meta.topics]
        return {
            "cluster_id": self._meta.cluster_id,
            "brokers": {b: self._endpoints[b] for b in sorted(live) if b in self._endpoints},
            "topics": {
                name: {
                    "topic_id": self._meta.topics[name].topic_id,
                    "partitions": {
                        p: {
                            "leader": s.leader if self._leading_in.get((name, p)) == s.leader_epoch else NO_LEADER,
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

    # ------------------------------------------------------------------ brokers

    async def brokers(self) -> list[dict]:
        return [
            {
                "broker_id": b.broker_id,
                "epoch": b.epoch,
                "node_id": b.node_id,
                "fenced": b.fenced,
                "connected": b.broker_id in self._managers,
                "endpoints": self._endpoints.get(b.broker_id, {}),
            }
            for b in sorted(self._meta.brokers.values(), key=lambda r: r.broker_id)
        ]

    async def cluster_id(self) -> str:
        return self._meta.cluster_id

    async def health(self) -> dict[str, int]:
        """The Controller's gauges, for `rayk status` (which needs no Prometheus)."""
        return {"active_controller_count": 1, "offline_partitions_count": self._offline_partitions_count()}

    def _offline_partitions_count(self) -> int:
        return sum(1 for meta in self._meta.topics.values() for s in meta.partitions.values() if s.leader == NO_LEADER)

    async def data_dir(self) -> str:
        return str(self.dir)

    async def broker_config(self) -> BrokerConfig:
        return self.config


def _partitions_in(records: list[Record]) -> set[tuple[str, int]]:
    return {(r.topic, r.partition) for r in records if isinstance(r, PartitionRecord)}

