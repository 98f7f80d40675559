"""BrokerAutoscaling: a cluster's brokers follow Ray's autoscaler (`rayk.start(autoscale=True)`).

Ray's autoscaler owns the nodes; rayk only asks it for some and lets it take them back,
through the one interface Ray gives a program for that, the standing request
(`ray.autoscaler.sdk.request_resources`). This part of the Controller owns:
- **the standing request**: bundles of `{node_resource: 1}`, one per broker wanted: the
  placeable brokers (never fewer than `min_brokers`, `rayk.start`'s `brokers`), or as
  many as a creation waiting for brokers needs. It is sent when that number changes
  (and on a restarted Controller's first round), so it drops as soon as brokers go;
- **one broker per broker node** (`adopt`): an alive node offering `node_resource` that
  runs no broker of this cluster gets one (BrokerLifecycle.add_broker), in a task of its
  own so that the maintenance round is not held up for the broker's start. A node whose
  broker this part removed is not given another: the autoscaler is about to take it;
- **scale-out on admission** (`scale_out`, called by TopicCreation): a CreateTopics or
  CreatePartitions that does not fit raises the request by the brokers it lacks
  (`brokers_short`) and waits, up to the request's deadline, until that many more
  brokers registered; it is then planned again, or refused with POLICY_VIOLATION naming
  what was missing;
- **idle removal**: a placeable broker that held no replica (internal topics' count) for
  `broker.idle.removal.ms` is decommissioned (BrokerLifecycle.remove_broker), newest
  first, while more than `min_brokers` remain and no creation waits for brokers.

What Ray 2.60's autoscaler does, measured on its fake multi-node provider (tests/test_
autoscaling.py runs the whole scenario on it):
- a standing request counts against the nodes' total resources, not their free ones: with
  one node's unit taken by an actor, a request of 3 bundles brought 2 nodes, not 3. So
  the request is the number of brokers wanted, never an addition;
- a node the standing request needs is never taken as idle: the request must drop first;
- a node is idle only when nothing runs on it, whatever its actors reserve: a node with a
  zero-CPU actor (rayk's are all num_cpus=0) was kept a minute past idle_timeout_minutes
  (0.25), an empty one went within ~15 s. So a broker's replicas keep its node; once it is
  decommissioned (replicas, listener and broker gone), the node goes. A broker still
  reserves one unit of `node_resource` (BrokerFactory.one_per_node): a node runs one
  broker at most, and `ray status` shows which broker nodes are taken.

Restart: the settings are the Controller's constructor arguments, so a restarted
Controller follows them. It sends the request again on its first round, idle clocks start
anew, and it forgets the nodes it released: one the autoscaler has not taken yet gets a
broker again, which is removed idle again `broker.idle.removal.ms` later.

Not thread-safe: the Controller's event loop runs it. Plans and commits are BrokerLifecycle's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from ray.autoscaler.sdk import request_resources

from rayk.actors.wakeup import Wakeup
from rayk.controller.broker_lifecycle import BrokerLifecycle
from rayk.errors import InvalidConfigurationError, InvalidReplicationFactorError, KafkaError, PolicyViolationError
from rayk.metadata.cluster_metadata import ClusterMetadata
from rayk.metadata.replication_control import assign_replicas
from rayk.server.broker_placement import candidate_nodes
from rayk.server.replica_capacity import check_replica_caps

logger = logging.getLogger(__name__)

DEFAULT_BROKER_RESOURCE = "rayk_broker"  # the custom resource a broker node type offers (clusters/*.yaml)
# How long a creation that does not fit waits for brokers when its request names no
# timeout: Kafka's default.api.timeout.ms, what a client waits for an answer by default.
DEFAULT_SCALE_OUT_TIMEOUT_MS = 60_000
MAX_SCALE_OUT_BROKERS = 64  # the most brokers one creation asks for at once (bounds `brokers_short`)
ADOPT_RETRY_MS = 30_000  # a node whose broker failed to start is tried again this much later
REMOVAL_TIMEOUT_MS = 600_000  # an idle broker's decommission (it holds nothing: seconds, normally)
_NEW_NODE = "~new-node-"  # a node id that sorts after Ray's hex ids, for brokers not there yet


@dataclass(frozen=True, slots=True)
class AutoscaleSettings:
    """How a cluster follows Ray's autoscaler: at least `min_brokers` brokers, one per Ray
    node offering the custom resource `node_resource`. Picklable: handed to the Controller
    with its constructor's arguments, so that Ray restarts it with them."""

    min_brokers: int
    node_resource: str = DEFAULT_BROKER_RESOURCE

    def __post_init__(self) -> None:
        if self.min_brokers < 1:
            raise InvalidConfigurationError(f"an autoscaled cluster needs at least one broker, got {self.min_brokers}")
        if not self.node_resource:
            raise InvalidConfigurationError("an autoscaled cluster needs a node resource to find its broker nodes by")


def brokers_short(
    num_partitions: int, replication_factor: int, broker_nodes: Mapping[int, str], start_index: int,
    held: Counter[int], caps: Mapping[int, int], configured: bool, max_extra: int = MAX_SCALE_OUT_BROKERS,
) -> int | None:
    """The fewest brokers to add for `num_partitions` new partitions of `replication_factor`
    replicas to fit, placed as the ReplicationControlManager places them (assign_replicas
    from `start_index` over `broker_nodes`, each new broker on a node of its own) on
    brokers apart and within every cap (check_replica_caps; a new broker's cap is the
    smallest of `caps`, none if none is known). 0 if they fit now; None if no number up
    to `max_extra` makes them fit (a replication factor below 1, or a full broker that
    the round-robin keeps giving replicas to: more nodes do not help it)."""
    if replication_factor < 1 or num_partitions < 1:
        return None
    new_cap = min(caps.values(), default=None)
    first_new = max([*broker_nodes, *held, *caps], default=-1) + 1  # ids no broker has
    for extra in range(max_extra + 1):
        new = {first_new + i: f"{_NEW_NODE}{i:05d}" for i in range(extra)}
        try:
            assignment = assign_replicas(num_partitions, replication_factor, {**broker_nodes, **new}, start_index, held)
            new_caps = {b: new_cap for b in new} if new_cap is not None else {}
            check_replica_caps(held, [b for replicas in assignment for b in replicas], {**caps, **new_caps}, configured)
        except (InvalidReplicationFactorError, PolicyViolationError):
            continue
        return extra
    return None


class BrokerAutoscaling:
    """The standing request, one broker per broker node, scale-out on admission and idle
    removal (see the module docstring). Owns the brokers wanted by waiting creations, the
    idle clocks, the nodes being given a broker and those released."""

    def __init__(self, settings: AutoscaleSettings, meta: ClusterMetadata, lifecycle: BrokerLifecycle,
                 committed: Callable[[], Wakeup], idle_removal_ms: int, controller: Callable[[], Any]) -> None:  # fmt: skip
        self.settings = settings
        self._meta = meta
        self._lifecycle = lifecycle
        self._committed = committed
        self._idle_removal_ms = idle_removal_ms  # -1: never
        self._controller = controller  # this Controller's own actor handle, for the brokers it adds
        self._targets: list[int] = []  # per creation waiting for brokers: the placeable brokers it waits for
        self._requested: int | None = None  # the bundles of the standing request last sent (None: not yet)
        self._idle_since_s: dict[int, float] = {}  # placeable broker holding nothing -> since when (monotonic)
        self._adopting: set[str] = set()  # nodes whose broker is starting
        self._retry_at_s: dict[str, float] = {}  # nodes whose broker failed to start -> when to try again
        self._released: set[str] = set()  # nodes whose broker left (idle, or removed): the autoscaler's to take
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ the standing request

    def wanted_brokers(self) -> int:
        """Brokers the cluster wants: the placeable ones, at least `min_brokers`, and as many
        as the creations waiting for brokers wait for."""
        return max(self.settings.min_brokers, len(self._meta.placeable_brokers), *self._targets)

    async def update_request(self) -> None:
        """Sends the standing request if the brokers wanted changed since it was last sent."""
        wanted = self.wanted_brokers()
        if wanted != self._requested:
            await asyncio.to_thread(request_resources, bundles=[{self.settings.node_resource: 1}] * wanted)
            logger.info("asked Ray's autoscaler for %d nodes offering %r (was %s)", wanted, self.settings.node_resource,
                        self._requested)  # fmt: skip
            self._requested = wanted

    async def close(self) -> None:
        """The cluster shuts down: its tasks stop and the request drops, so its nodes can go."""
        for task in self._tasks:
            task.cancel()
        await asyncio.to_thread(request_resources, bundles=[])
        self._requested = 0

    # ------------------------------------------------------------------ scale-out on admission

    async def scale_out(self, extra: int, deadline_s: float, what: str) -> None:
        """Asks for `extra` more brokers and returns once that many more placeable brokers
        registered; POLICY_VIOLATION at `deadline_s` (monotonic), naming what was missing."""
        assert extra >= 1, extra
        before = len(self._meta.placeable_brokers)
        target, started_s = before + extra, time.monotonic()
        needs = (f"{what} needs {extra} more brokers than the {before} there are, each on a Ray node offering "
                 f"{self.settings.node_resource!r}")  # fmt: skip
        if deadline_s <= started_s:  # no time to wait (Metadata's auto-creation): nothing is asked
            raise PolicyViolationError(f"{needs}, and the request leaves no time to wait for Ray's autoscaler")
        self._targets.append(target)
        try:
            await self.update_request()
            logger.info("%s: waiting for Ray's autoscaler", needs)
            while (have := len(self._meta.placeable_brokers)) < target:
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0:
                    raise PolicyViolationError(
                        f"{needs}; {max(have - before, 0)} joined within {(time.monotonic() - started_s) * 1000:.0f} ms: "
                        "Ray's autoscaler added no more nodes in time (see `ray status`, and the max_workers of that node type)"
                    )
                await self._committed().wait(remaining_s)  # every registration commits
        finally:
            self._targets.remove(target)
            await self.update_request()

    # ------------------------------------------------------------------ maintenance

    def brokers_changed(self) -> None:
        """A broker joined, started leaving or left (BrokerLifecycle): the node of one that
        leaves, by idle removal or by `Cluster.remove_broker`, is released, not given a
        broker again."""
        self._released |= {reg.node_id for reg in self._meta.brokers.values() if reg.decommissioning}

    async def run_round(self) -> None:
        """One maintenance round: brokers for new broker nodes, idle brokers removed, and
        the standing request brought up to date."""
        nodes = await asyncio.to_thread(candidate_nodes, self.settings.node_resource)
        self._released &= set(nodes)  # the autoscaler took the others
        self._retry_at_s = {n: at_s for n, at_s in self._retry_at_s.items() if n in nodes}
        self._adopt(nodes, time.monotonic())
        self._remove_idle(time.monotonic())
        await self.update_request()

    def _adopt(self, nodes: list[str], now_s: float) -> None:
        """Starts a broker on each node offering the resource that runs none (see the module docstring)."""
        with_broker = {reg.node_id for reg in self._meta.brokers.values()}
        for node in nodes:
            if node in with_broker or node in self._adopting or node in self._released:
                continue
            if self._retry_at_s.get(node, 0.0) > now_s:
                continue
            self._adopting.add(node)
            self._spawn(self._adopt_one(node))

    async def _adopt_one(self, node: str) -> None:
        try:
            broker_id = await self._lifecycle.add_broker(node, self._controller())
            logger.info("broker %d started on node %s, which joined offering %r", broker_id, node, self.settings.node_resource)
        except KafkaError as e:
            logger.warning("no broker could start on node %s (%s): trying again in %d s", node, e, ADOPT_RETRY_MS // 1000)
            self._retry_at_s[node] = time.monotonic() + ADOPT_RETRY_MS / 1000
        finally:
            self._adopting.discard(node)

    def _remove_idle(self, now_s: float) -> None:
        """Decommissions the brokers idle for `broker.idle.removal.ms`, newest first, down to
        `min_brokers`; none while a creation waits for brokers (they may be what it needs)."""
        placeable = self._meta.placeable_brokers
        holding = {b for _, _, state in self._meta.all_partitions() for b in state.replicas}
        self._idle_since_s = {b: self._idle_since_s.get(b, now_s) for b in placeable - holding}
        if self._idle_removal_ms < 0 or self._targets:
            return
        due = sorted((b for b, since_s in self._idle_since_s.items() if (now_s - since_s) * 1000 >= self._idle_removal_ms),
                     reverse=True)  # fmt: skip
        for broker_id in due[: max(len(placeable) - self.settings.min_brokers, 0)]:
            logger.info("broker %d held no replica for %d ms: decommissioning it so that its node can go",
                        broker_id, self._idle_removal_ms)  # fmt: skip
            self._released.add(self._meta.brokers[broker_id].node_id)
            del self._idle_since_s[broker_id]
            self._spawn(self._remove_one(broker_id))

    async def _remove_one(self, broker_id: int) -> None:
        try:
            await self._lifecycle.remove_broker(broker_id, REMOVAL_TIMEOUT_MS)
        except KafkaError as e:
            logger.warning("idle broker %d was not removed: %s", broker_id, e)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
