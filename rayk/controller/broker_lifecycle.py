"""BrokerLifecycle: brokers added to and removed from a running cluster (what Kafka leaves
to an operator: a new broker process, and a decommission with the reassignment tool
followed by UnregisterBroker).

Adding (`add_broker`): a new broker id (one above every registered broker's and every
one being added), on the given node or on the candidate node running the fewest brokers
(the alive nodes offering the cluster's node resource, if it has one:
broker_placement.py), created by the BrokerFactory the Controller was handed (so that
rayk/controller never imports the listener), started, and registered when the call
returns. The balancer then gives it its share of the partitions.

Removing (`remove_broker`) is a decommission, carried by the metadata so that a
restarted Controller goes on with it:
1. a DecommissionBrokerRecord marks the broker: it keeps serving what it holds but gets
   no new replica (`placeable_brokers`). Refused with POLICY_VIOLATION, changing nothing,
   if the other brokers cannot hold its replicas: too few brokers for a partition's
   replicas to stay on brokers apart, or more replicas than their capacity leaves room for;
2. its partitions move off it as KIP-455 reassignments, a bounded number at a time. With
   the balancer on (`auto.balance.enable`, the default) the balancer moves them (its first
   goal: the broker is leaving), placed by its goals, so that nothing is copied twice;
   with it off, each maintenance round (`decommission`) swaps the broker for another in
   at most MAX_CONCURRENT_MOVES of its partitions, placed as a lost broker's replicas are
   (broker_replacement.py). Either way a reassignment removes the old replica only once
   its replacement is in the ISR, so no partition goes below min.insync.replicas, and a
   leader on the broker hands over with a new epoch then;
3. once it holds nothing, the broker is retired, in a task of its own so that the
   maintenance round goes on: asked to `decommission` itself (a clean stop that deletes
   its data directory), its actor killed for good, and an UnregisterBrokerRecord ends its
   registration. A broker that died meanwhile is unregistered all the same; its directory
   then stays on its node's disk. An id retired in this Controller session is never given
   to a new broker (its actor's name may outlive the kill for a moment).

Not thread-safe: the Controller's event loop calls it. Plans and commits never await
between them, as everywhere in the Controller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import ray
from ray.exceptions import RayError

from rayk.actors.wakeup import Wakeup
from rayk.config import BrokerConfig
from rayk.controller.broker_heartbeat_manager import BrokerHeartbeatManager
from rayk.controller.broker_replacement import replacement_for
from rayk.controller.channel_manager import ControllerChannelManager
from rayk.errors import InvalidRequestError, KafkaError, PolicyViolationError, RequestTimedOutError
from rayk.metadata.cluster_metadata import ClusterMetadata, Record
from rayk.server.broker_placement import candidate_nodes, least_loaded_node

logger = logging.getLogger(__name__)

Commit = Callable[[list[Record]], None]

MAX_CONCURRENT_MOVES = 5  # a decommissioning broker's partitions moving at once (Cruise Control's per-broker default)
BROKER_START_TIMEOUT_MS = 600_000  # a new broker's process to start and register (as rayk.start waits)
BROKER_STOP_TIMEOUT_MS = 60_000  # a leaving broker to stop cleanly and delete its directory


class BrokerLifecycle:
    """Adds brokers, and decommissions them (see the module docstring). Owns the ids being
    added and the BrokerFactory; the decommissions themselves are in the metadata."""

    def __init__(self, meta: ClusterMetadata, commit: Commit, channels: ControllerChannelManager,
                 sessions: BrokerHeartbeatManager, config: BrokerConfig, broker_factory: Any,
                 committed: Callable[[], Wakeup], on_brokers_changed: Callable[[], None],
                 replica_caps: Callable[[], Mapping[int, int]]) -> None:  # fmt: skip
        self._meta = meta
        self._commit = commit
        self._channels = channels
        self._sessions = sessions
        self._config = config
        self.factory = broker_factory  # rayk.broker.BrokerFactory, or None: brokers only by rayk.start
        self._committed = committed
        self._on_brokers_changed = on_brokers_changed
        self._replica_caps = replica_caps  # each live broker's cap (TopicCreation.replica_caps)
        self._adding: set[int] = set()  # ids of brokers being started
        self._retiring: set[int] = set()  # ids of brokers being retired now
        self._retired: set[int] = set()  # ids retired in this session: never given again
        self._stuck: set[tuple[int, str, int]] = set()  # (broker, topic, partition) with nowhere to go, logged once

    # ------------------------------------------------------------------ adding

    async def add_broker(self, node_id: str | None, controller: Any) -> int:
        """Starts a new broker (see the module docstring); its id once it registered.
        INVALID_REQUEST if the cluster has no BrokerFactory or `node_id` cannot take it."""
        if self.factory is None:
            raise InvalidRequestError("this Controller creates no brokers: it was started without a broker factory")
        nodes = await asyncio.to_thread(candidate_nodes, self.factory.node_resource)
        if self.factory.one_per_node:  # each broker reserves its node's unit of the resource (autoscaling)
            taken = {reg.node_id for reg in self._meta.brokers.values()}
            if node_id in taken or (node_id is None and not set(nodes) - taken):
                raise InvalidRequestError(f"{f'node {node_id}' if node_id else 'every node'} offering "
                                          f"{self.factory.node_resource!r} runs a broker already: one per node")  # fmt: skip
            nodes = [n for n in nodes if n not in taken]
        if node_id is not None and node_id not in nodes:
            offering = f" offering {self.factory.node_resource!r}" if self.factory.node_resource else ""
            raise InvalidRequestError(f"node {node_id} is not an alive Ray node{offering}")
        if not nodes:
            raise InvalidRequestError(f"no alive Ray node offers {self.factory.node_resource!r}")
        broker_id = max([*self._meta.brokers, *self._adding, *self._retiring, *self._retired, -1]) + 1
        brokers_per_node = Counter(reg.node_id for reg in self._meta.brokers.values())
        node = node_id or least_loaded_node(nodes, brokers_per_node)
        self._adding.add(broker_id)
        try:
            try:
                manager = self.factory.create(broker_id, node, self._meta.cluster_id, controller)
            except ValueError as e:  # Ray refused the actor (its name taken)
                raise InvalidRequestError(f"broker {broker_id} could not be created on node {node}: {e}") from None
            try:
                async with asyncio.timeout(BROKER_START_TIMEOUT_MS / 1000):
                    await manager.start.remote()
            except (TimeoutError, RayError) as e:
                ray.kill(manager, no_restart=True)
                raise RequestTimedOutError(f"broker {broker_id} did not start on node {node}: {e}") from None
        finally:
            self._adding.discard(broker_id)
        assert broker_id in self._meta.brokers, "a started broker has registered"
        logger.info("broker %d added on node %s", broker_id, node)
        self._on_brokers_changed()
        return broker_id

    # ------------------------------------------------------------------ removing

    async def remove_broker(self, broker_id: int, timeout_ms: int) -> None:
        """Starts decommissioning the broker (idempotent) and returns once it left the
        cluster; REQUEST_TIMED_OUT after `timeout_ms`, the decommission going on."""
        records = self._meta.plan_decommission_broker(broker_id)  # BROKER_NOT_AVAILABLE, POLICY_VIOLATION
        if records:
            self._check_capacity_without(broker_id)
            self._commit(records)
            logger.info("broker %d is being decommissioned: %d partitions to move", broker_id,
                        len(self._meta.replication.partitions_of_broker(broker_id)))  # fmt: skip
            self._on_brokers_changed()
            await self.decommission()
        deadline_s = time.monotonic() + timeout_ms / 1000
        while broker_id in self._meta.brokers:
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                left = len(self._meta.replication.partitions_of_broker(broker_id))
                raise RequestTimedOutError(
                    f"broker {broker_id} is still being decommissioned after {timeout_ms} ms ({left} partitions left to move)"
                )
            await self._committed().wait(remaining_s)  # every commit, its unregistration among them

    def _check_capacity_without(self, broker_id: int) -> None:
        """POLICY_VIOLATION if the placeable brokers other than `broker_id` have less room
        for replicas, under their capacity, than it holds."""
        others = self._meta.placeable_brokers - {broker_id}
        caps = {b: cap for b, cap in self._replica_caps().items() if b in others}
        if not caps:
            return  # no broker reported a capacity: nothing to check against
        held = Counter(b for _, _, state in self._meta.all_partitions() for b in state.replicas)
        room = sum(max(caps[b] - held[b], 0) for b in caps)
        moving = sum(held[b] for b in self._meta.cluster.decommissioning_brokers | {broker_id})  # all that must move
        if moving > room:
            raise PolicyViolationError(
                f"broker {broker_id} cannot leave: it holds {moving} replicas and the other brokers have room for "
                f"{room} under their capacity (max.replicas.per.broker); add a broker first"
            )

    async def decommission(self) -> None:
        """One maintenance round: retires the decommissioning brokers that hold nothing (each
        in a task of its own) and, with the balancer off, moves the others' partitions, a
        bounded number at a time."""
        for broker_id in sorted(self._meta.cluster.decommissioning_brokers - self._retiring):
            held = self._meta.replication.partitions_of_broker(broker_id)
            if not held:
                self._retiring.add(broker_id)
                self._channels.spawn(self._retire(broker_id))
                continue
            if self._config.auto_balance_enable:
                continue  # the balancer moves them (see the module docstring)
            in_flight = sum(1 for _, _, state in held if state.adding or state.removing)
            moved: list[tuple[str, int]] = []
            for topic, partition, state in held:
                if in_flight + len(moved) >= MAX_CONCURRENT_MOVES:
                    break
                if state.adding or state.removing:
                    continue  # its move is under way (maybe one that brings it here: it goes once done)
                target = replacement_for(self._meta, state, {broker_id})
                if target is None:
                    if (broker_id, topic, partition) not in self._stuck:
                        self._stuck.add((broker_id, topic, partition))
                        logger.warning("broker %d is decommissioning but no broker can take %s-%d", broker_id, topic, partition)
                    continue
                self._commit(self._meta.replication.plan_reassign(topic, partition, target))
                moved.append((topic, partition))
            if moved:
                logger.info("decommissioning broker %d: moving %s", broker_id, ", ".join(f"{t}-{p}" for t, p in moved))
                self._channels.spawn(self._channels.push_marking_failures(moved))

    async def _retire(self, broker_id: int) -> None:
        """The broker holds nothing: it stops and deletes its directory, its actor goes for
        good, and its registration ends (once: `_retiring` holds its id meanwhile)."""
        try:
            manager = self._sessions.manager(broker_id)
            if manager is not None:
                try:
                    async with asyncio.timeout(BROKER_STOP_TIMEOUT_MS / 1000):
                        await manager.decommission.remote()
                except (TimeoutError, RayError, KafkaError) as e:
                    logger.warning("broker %d did not stop cleanly (%s): its directory may stay on its node", broker_id, e)
            self._sessions.forget(broker_id)  # from here its death is no failure to report
            self._channels.forget_broker(broker_id)
            if self.factory is not None:  # its actor goes before its registration: no process serves an unknown id
                handle = await asyncio.to_thread(self.factory.find, broker_id)
                if handle is not None:
                    ray.kill(handle, no_restart=True)
            try:
                records = self._meta.plan_unregister_broker(broker_id)
            except KafkaError as e:  # a partition names it again (a user's reassignment onto it meanwhile)
                logger.error("broker %d was stopped but cannot leave (%s): its replicas move as a lost broker's do",
                             broker_id, e)  # fmt: skip
                return
            self._commit(records)
            self._retired.add(broker_id)
            self._stuck = {s for s in self._stuck if s[0] != broker_id}
        finally:
            self._retiring.discard(broker_id)
        logger.info("broker %d decommissioned: it left the cluster", broker_id)
        self._on_brokers_changed()
