"""ControllerChannelManager: the Controller's pushes to the brokers' ReplicaManagers (Kafka's
ControllerChannelManager, with LeaderAndIsr and StopReplica as actor calls).

A push sends one partition's committed state (`PartitionAssignment`) to its replicas'
brokers that are attached to this session: the leader's ReplicaManager first, whose answer
is the leader replica's handle, then the followers' with that handle. Every push has a
timeout (twice `broker.session.timeout.ms`, so one hung broker stalls nothing else); a
push that fails or times out marks its partition dirty, and `push_dirty` (a periodic task)
pushes the dirty ones again. Pushes may overlap: the brokers ignore one older than what
they have, by its epochs. A stop (`stop_replicas`, `stop_topic`) stops and deletes
replicas that a reassignment dropped or whose topic was deleted.

Owns what the answers tell: each replica's actor handle, by (topic, partition, broker),
and the leader epoch in which each partition's leader last took its push, so that clients
are sent to a leader only once it takes writes. Reads the image (`ClusterMetadata`) and
the sessions (`BrokerHeartbeatManager`); changes neither. Its background pushes and stops
are tasks it owns (`cancel_all` at shutdown). Not thread-safe: the Controller's event
loop calls it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from rayk.controller.broker_heartbeat_manager import BrokerHeartbeatManager
from rayk.metadata.cluster_metadata import NO_LEADER, ClusterMetadata, PartitionState
from rayk.server.replica_manager import PartitionAssignment

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class ControllerChannelManager:
    """Pushes of partition states and stops of replicas, with timeouts; the replica handles."""

    def __init__(self, meta: ClusterMetadata, sessions: BrokerHeartbeatManager, push_timeout_s: float,
                 on_leading_change: Callable[[], None] = lambda: None) -> None:
        """`on_leading_change` is called whenever `leads_in` may answer differently."""
        self._meta = meta
        self._on_leading_change = on_leading_change
        self._sessions = sessions
        self.push_timeout_s = push_timeout_s
        self._replica_handles: dict[tuple[str, int, int], Any] = {}
        # The leader epoch in which each partition's leader last answered its push, so it
        # takes writes in it: Metadata names a leader only then (a client sent to a leader
        # still starting got NOT_LEADER_OR_FOLLOWER, and librdkafka then reordered retries).
        self._leading_in: dict[TopicPartition, int] = {}
        self.dirty: set[TopicPartition] = set()  # partitions whose last push did not reach every replica
        self._dirty_pushes: asyncio.Task | None = None  # `push_dirty`'s task
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ what the answers tell

    def handle(self, topic: str, partition: int, broker_id: int) -> Any:
        """The actor handle of a replica as its broker last answered a push; None if unknown."""
        return self._replica_handles.get((topic, partition, broker_id))

    def leads_in(self, topic: str, partition: int, leader_epoch: int) -> bool:
        """Whether the partition's leader took its push in `leader_epoch`."""
        return self._leading_in.get((topic, partition)) == leader_epoch

    def forget_replica(self, topic: str, partition: int, broker_id: int) -> None:
        self._replica_handles.pop((topic, partition, broker_id), None)

    def forget_broker(self, broker_id: int) -> None:
        """The broker left this session: its replicas' handles are of a process gone or going."""
        for key in [k for k in self._replica_handles if k[2] == broker_id]:
            del self._replica_handles[key]

    # ------------------------------------------------------------------ pushes

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Runs `coro` in a task of this manager's (cancelled by `cancel_all`)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def push(self, topic: str, partition: int) -> None:
        """Sends the partition's current state to its attached replicas, leader first."""
        meta = self._meta.topics.get(topic)
        if meta is None:
            return
        state = meta.partitions[partition]
        configs = self._meta.configs.of(topic)

        def assignment(leader_handle: Any) -> PartitionAssignment:
            return PartitionAssignment(topic, partition, meta.topic_id, state, configs, leader_handle)

        leader_handle = None
        if state.leader != NO_LEADER and self._sessions.is_attached(state.leader):
            leader_handle = await self._push_to(state.leader, assignment(None))
            # Only forward, and only for the topic still there (not one made again since): a
            # slower push of an older epoch answering after a newer one must not leave
            # Metadata naming no leader (nothing would push the partition again).
            current = self._meta.topics.get(topic)
            newer = state.leader_epoch > self._leading_in.get((topic, partition), -1)
            if leader_handle is not None and current is not None and current.topic_id == meta.topic_id and newer:
                self._leading_in[(topic, partition)] = state.leader_epoch
                self._on_leading_change()
        followers = [b for b in state.replicas if b != state.leader and self._sessions.is_attached(b)]
        await asyncio.gather(*(self._push_to(b, assignment(leader_handle)) for b in followers))

    async def push_all(self, partitions: Iterable[TopicPartition]) -> None:
        """Pushes each partition, all at once; fails as the first push that raises."""
        await asyncio.gather(*(self.push(t, p) for t, p in partitions))

    async def push_marking_failures(self, partitions: list[TopicPartition]) -> None:
        """Pushes each partition, all at once; one whose push raised is dirty again."""
        results = await asyncio.gather(*(self.push(t, p) for t, p in partitions), return_exceptions=True)
        for (topic, partition), result in zip(partitions, results):
            if isinstance(result, Exception):
                logger.error("pushing %s-%d again failed", topic, partition, exc_info=result)
                self.dirty.add((topic, partition))

    async def push_dirty(self) -> None:
        """Pushes again, in a task of their own, the partitions whose last push did not reach
        every replica: a slow broker's pushes wait out their timeout there, not in the
        maintenance round, whose fencing of silent brokers must keep its pace. One such
        task at a time; what turns dirty meanwhile goes with the next."""
        if self._dirty_pushes is not None and not self._dirty_pushes.done():
            return
        dirty, self.dirty = self.dirty, set()
        if dirty:
            self._dirty_pushes = self.spawn(self.push_marking_failures(sorted(dirty)))

    async def _push_to(self, broker_id: int, assignment: PartitionAssignment) -> Any:
        manager = self._sessions.manager(broker_id)
        if manager is None:
            return None
        tp = (assignment.topic, assignment.partition)
        try:
            async with asyncio.timeout(self.push_timeout_s):
                handle = await manager.apply_partition.remote(assignment)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            # A broker that still heartbeats is slow, not failed: each new replica is a
            # process, and a node creating a hundred of them takes longer than the timeout.
            # The push goes again with the next maintenance round either way.
            slow = self._sessions.heartbeats_recently(broker_id)
            logger.log(logging.INFO if slow else logging.WARNING, "pushing %s-%d to broker %d timed out after %.0f s%s",
                       *tp, broker_id, self.push_timeout_s, "; it heartbeats, so it is only slow" if slow else "")
            self.dirty.add(tp)
            return None
        except Exception as e:  # the broker died (its watch fences it), or the apply failed
            logger.warning("pushing %s-%d to broker %d failed: %s", *tp, broker_id, str(e).splitlines()[0] if str(e) else type(e).__name__)
            self.dirty.add(tp)
            return None
        if handle is None:
            self._replica_handles.pop((*tp, broker_id), None)  # its replica failed; it is being moved
        else:
            self._replica_handles[(*tp, broker_id)] = handle
        return handle

    # ------------------------------------------------------------------ stops

    def remove_replicas(self, topic: str, partition: int, brokers: set[int], topic_id: str, partition_epoch: int) -> None:
        """Stops and deletes, in the background, the replicas a reassignment dropped."""
        self.spawn(self._remove_replicas(topic, partition, brokers, topic_id, partition_epoch))

    async def _remove_replicas(
        self, topic: str, partition: int, brokers: set[int], topic_id: str, partition_epoch: int
    ) -> None:
        """Their managers then ignore any push of this partition up to `partition_epoch`
        still on its way."""
        for b in brokers:
            self._replica_handles.pop((topic, partition, b), None)
        stops = [
            m.stop_replica.remote(topic, partition, True, topic_id, partition_epoch)
            for b in brokers
            if (m := self._sessions.manager(b))
        ]
        await asyncio.gather(*stops, return_exceptions=True)

    async def stop_topic(self, name: str, topic_id: str, partitions: dict[int, PartitionState]) -> None:
        """Stops and deletes every replica of a deleted topic, forgetting its partitions."""
        stops = []
        for p, state in partitions.items():
            self.dirty.discard((name, p))
            if self._leading_in.pop((name, p), None) is not None:
                self._on_leading_change()
            for b in state.replicas:
                self._replica_handles.pop((name, p, b), None)
                if (manager := self._sessions.manager(b)) is not None:
                    # Every push of this topic id still on its way is older than this.
                    stops.append(manager.stop_replica.remote(name, p, True, topic_id, None))
        await asyncio.gather(*stops, return_exceptions=True)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()

