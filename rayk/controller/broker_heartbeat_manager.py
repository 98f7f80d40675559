"""BrokerHeartbeatManager: the brokers' sessions with this Controller (Kafka's
BrokerHeartbeatManager).

The broker set itself is metadata (`ClusterControlManager`: registrations, epochs,
fencing, replayed from the log); this owns what lives only as long as this Controller
process: per broker, the handle of the ReplicaManager that registered with this session
(`attached`; elections read the set from `ClusterControlManager.attached`, which this
keeps), when it last heartbeat, since when it is fenced, the Kafka listeners it
advertises, its node's memory and cores as it registered, and a call held open on its actor
(`run_until_stopped`) that fails the moment Ray reports it dead.

Slow is not dead. Ray's actor state is the authority on death: the held call fails when
the broker's process dies, or its node does (Ray then declares its actors dead), and the
Controller fences it at once. A broker silent for longer than `broker.session.timeout.ms`
whose held call has not failed is only *late*: on a node short of CPU heartbeats fall
behind, and fencing for it turned load into re-registrations, pushes of every partition
and more load (issue 67: brokers fenced ~1,960 times in 22 minutes). What fencing protects
holds without it: a late broker's leaders can acknowledge acks=all only through their ISR,
and ISR changes go through the Controller, which checks the broker's epoch; a leader
elsewhere is elected only by fencing. So a late broker is fenced only after
LATE_FENCE_SESSIONS session timeouts of silence, and one at a time (not while another late
one was fenced within the last session timeout), so that a starved node's brokers are not
all fenced at once. The bound is there for what Ray takes for alive but cannot work: a
stopped (SIGSTOP) or wedged process, or a node cut off from the Controller's while Ray's
GCS still reaches it; past it, its partitions' leadership moves. A broker with no held
call in this session (a Controller restarted, or the call returned because the broker
stopped) is fenced after one session timeout, as in Kafka. Silence is counted in time this
Controller could hear: a stall of its own event loop (`credit_stall`, from the maintenance
loop's timer) is not held against the brokers.

It decides nothing: it tells the Controller which brokers to fence for silence
(`brokers_to_fence`), which were fenced long enough to be replaced (`fenced_for`), and
answers heartbeats; fencing is a commit, the Controller's. It counts registrations and
fencings by reason (`counts`) for the Controller's health.

Lifecycle: created with the replayed metadata, every live broker counted as heard from
then; `start_clocks` gives those that have not registered again one more session timeout
(the Controller's `start`). `close` forgets every session. Times are monotonic (`clock`).
Not thread-safe: the Controller's event loop calls it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from ray.exceptions import RayError

from rayk.errors import StaleBrokerEpochError
from rayk.metadata.cluster_control import ClusterControlManager

logger = logging.getLogger(__name__)

# A broker Ray reports alive is fenced for silence only after this many session timeouts
# (36 s at Kafka's 9 s): several times the longest silence of a live broker measured on a
# starved node (tests/faults/test_overload.py), and short enough that a process Ray takes
# for alive but that cannot work holds its partitions' leadership for half a minute, not
# for good.
LATE_FENCE_SESSIONS = 4
Endpoints = dict[str, tuple[str, int]]  # a broker's Kafka listeners: advertised (host, port) by listener name
OnBrokerDeath = Callable[[int, int], Awaitable[None]]  # (broker id, broker epoch the watch was started in)


@dataclass(slots=True)
class _Watch:
    """The call held open on one broker process, and the epoch it last registered with."""

    incarnation_id: str
    epoch: int
    task: asyncio.Task | None = None


class BrokerHeartbeatManager:
    """Sessions, heartbeats and liveness of the brokers registered with this Controller."""

    def __init__(self, cluster: ClusterControlManager, session_timeout_ms: int, heartbeat_interval_ms: int,
                 clock: Callable[[], float] = time.monotonic,
                 on_endpoints_change: Callable[[], None] = lambda: None) -> None:  # fmt: skip
        """`on_endpoints_change` is called whenever `endpoints` changes."""
        self._cluster = cluster
        self._on_endpoints_change = on_endpoints_change
        self._session_timeout_s = session_timeout_ms / 1000
        self._late_fence_s = self._session_timeout_s * LATE_FENCE_SESSIONS
        self._heartbeat_interval_s = heartbeat_interval_ms / 1000
        self._clock = clock
        now = clock()
        self._last_heartbeat_s: dict[int, float] = {b: now for b in cluster.live_brokers}
        self._fenced_since_s: dict[int, float] = {b: now for b, r in cluster.brokers.items() if r.fenced}
        self._managers: dict[int, Any] = {}  # broker id -> ReplicaManager handle, this session
        self._registering: set[int] = set()  # brokers whose registration's pushes are under way
        self.endpoints: dict[int, Endpoints] = {}
        self.node_memory_bytes: dict[int, int] = {}  # broker id -> its node's memory, as it registered
        self.node_cpus: dict[int, float] = {}  # broker id -> its node's cores, as it registered
        self._watches: dict[int, _Watch] = {}  # broker id -> the held call on its latest process
        self._late: set[int] = set()  # brokers silent past the session timeout, not fenced for it (logged once)
        self._fenced_late_at_s = float("-inf")  # when a broker Ray reports alive was last fenced for silence
        self.counts: Counter[str] = Counter()  # "registrations", and fencings: "fenced_dead", "fenced_silent", "fenced_late"
        self.longest_silence_s = 0.0  # the longest gap between two heartbeats of a broker in session, since start

    # ------------------------------------------------------------------ the session's brokers

    def manager(self, broker_id: int) -> Any:
        """The ReplicaManager handle of an attached broker, else None."""
        return self._managers.get(broker_id)

    def is_attached(self, broker_id: int) -> bool:
        return broker_id in self._managers

    def attach(self, broker_id: int, manager: Any) -> None:
        """A broker registered with this session: it is attached, and no longer fenced."""
        self._managers[broker_id] = manager
        self._cluster.attached.add(broker_id)
        self._fenced_since_s.pop(broker_id, None)
        assert self._cluster.attached == set(self._managers), "the image's attached brokers are this session's"

    def detach(self, broker_id: int) -> None:
        self._managers.pop(broker_id, None)
        self._cluster.attached.discard(broker_id)

    def forget(self, broker_id: int) -> None:
        """The broker left the cluster (unregistered): nothing of its session stays."""
        self.detach(broker_id)
        for per_broker in (self._last_heartbeat_s, self._fenced_since_s, self.endpoints, self.node_memory_bytes,
                           self.node_cpus):  # fmt: skip
            per_broker.pop(broker_id, None)
        self._on_endpoints_change()
        self._late.discard(broker_id)
        watch = self._watches.pop(broker_id, None)
        if watch is not None and watch.task is not None:
            watch.task.cancel()  # its process is being killed for good: no death to report

    def fenced(self, broker_id: int) -> None:
        """The Controller committed the broker's fencing (its replacement clock starts)."""
        self._fenced_since_s[broker_id] = self._clock()
        self._late.discard(broker_id)

    def fenced_for(self, delay_s: float) -> set[int]:
        """The brokers fenced for `delay_s` or longer."""
        now = self._clock()
        return {b for b, since in self._fenced_since_s.items() if now - since >= delay_s}

    def set_endpoints(self, broker_id: int, endpoints: Endpoints | None) -> None:
        if not endpoints:
            self.endpoints.pop(broker_id, None)
        else:
            self.endpoints[broker_id] = {str(name): (str(host), int(port)) for name, (host, port) in endpoints.items()}
        self._on_endpoints_change()

    # ------------------------------------------------------------------ heartbeats and sessions

    def start_clocks(self) -> None:
        """Every live broker that has not registered with this session gets one session
        timeout from now to do so (a restarted Controller's maintenance starts)."""
        now = self._clock()
        for broker_id in self._cluster.live_brokers - set(self._managers):
            self._last_heartbeat_s[broker_id] = now

    def check_epoch(self, broker_id: int, broker_epoch: int) -> None:
        """STALE_BROKER_EPOCH unless `broker_epoch` is the broker's current, unfenced one."""
        registration = self._cluster.brokers.get(broker_id)
        if registration is None or registration.fenced or registration.epoch != broker_epoch:
            raise StaleBrokerEpochError(f"broker {broker_id} epoch {broker_epoch} is fenced or not current")

    def heartbeat(self, broker_id: int, broker_epoch: int) -> str:
        """"ok", "reregister" (fenced, or unknown to this session) or "stale"."""
        registration = self._cluster.brokers.get(broker_id)
        if registration is None or registration.fenced or broker_id not in self._managers:
            return "reregister"
        if broker_epoch != registration.epoch:
            return "stale"
        now = self._clock()
        silent_s = now - self._last_heartbeat_s.get(broker_id, now)
        self.longest_silence_s = max(self.longest_silence_s, silent_s)
        if broker_id in self._late:
            self._late.discard(broker_id)
            logger.info("broker %d heard from again, %.1f s after its last heartbeat: it was late, not fenced",
                        broker_id, silent_s)  # fmt: skip
        self._last_heartbeat_s[broker_id] = now
        return "ok"

    @asynccontextmanager
    async def registering(self, broker_id: int) -> AsyncIterator[None]:
        """While a registration's pushes go out: creating replica actors takes a while and
        the broker cannot heartbeat before its registration returns, so its session is not
        judged until then, and starts when they are done."""
        self._registering.add(broker_id)
        try:
            yield
        finally:
            self._registering.discard(broker_id)
            self._last_heartbeat_s[broker_id] = self._clock()

    def credit_stall(self, stall_s: float) -> None:
        """This Controller's event loop could not run for `stall_s` (its timer fired that
        late): heartbeats queued meanwhile were not heard, so that time is not silence."""
        if stall_s <= 0:
            return
        now = self._clock()
        for broker_id, heard_s in self._last_heartbeat_s.items():
            self._last_heartbeat_s[broker_id] = min(heard_s + stall_s, now)

    def brokers_to_fence(self) -> Iterator[tuple[int, float, str]]:
        """Live brokers to fence for silence now, in id order, with how long they were
        silent and why: "silent" (past the session timeout, and no held call says Ray has
        it alive) or "late" (Ray has it alive, but silent for LATE_FENCE_SESSIONS session
        timeouts; one at a time). Those late but not fenced are logged once per silence.
        Lazy: each is judged when reached, so a heartbeat that arrives while the caller
        fences the one before still counts."""
        for broker_id in sorted(self._cluster.live_brokers - self._registering):
            now = self._clock()
            silent_s = now - self._last_heartbeat_s.get(broker_id, now)
            if silent_s <= self._session_timeout_s:
                continue
            if not self.alive_per_ray(broker_id):
                yield broker_id, silent_s, "silent"
            elif silent_s > self._late_fence_s and now - self._fenced_late_at_s >= self._session_timeout_s:
                self._fenced_late_at_s = now
                yield broker_id, silent_s, "late"
            elif broker_id not in self._late:
                self._late.add(broker_id)
                logger.warning("broker %d silent for %.1f s, but Ray has its process alive: late, not fenced (for up "
                               "to %.0f s)", broker_id, silent_s, self._late_fence_s)  # fmt: skip

    def late_brokers(self) -> set[int]:
        """Brokers silent past the session timeout that Ray has alive (not fenced for it yet)."""
        return set(self._late)

    def heartbeats_recently(self, broker_id: int) -> bool:
        """Live and heard from within two heartbeat intervals: slow if late, not failed."""
        silent_s = self._clock() - self._last_heartbeat_s.get(broker_id, 0.0)
        return broker_id in self._cluster.live_brokers and silent_s < self._heartbeat_interval_s * 2

    # ------------------------------------------------------------------ death, as Ray reports it

    def watch(self, broker_id: int, epoch: int, manager: Any, on_death: OnBrokerDeath, incarnation_id: str = "") -> None:
        """Holds a call open on the broker's actor; `on_death(broker_id, epoch)` once Ray
        reports it dead (Ray may then restart it: it registers again, a new incarnation).
        The same process registering again keeps its held call, with its new epoch."""
        watch = self._watches.get(broker_id)
        if watch is not None and watch.incarnation_id == incarnation_id and watch.task is not None and not watch.task.done():
            watch.epoch = epoch
            return
        watch = self._watches[broker_id] = _Watch(incarnation_id, epoch)
        watch.task = asyncio.get_running_loop().create_task(self._watch(broker_id, watch, manager, on_death))

    def alive_per_ray(self, broker_id: int) -> bool:
        """Whether a call held open on the broker's latest process is still open: Ray has
        not reported that process dead, nor has it stopped."""
        watch = self._watches.get(broker_id)
        return watch is not None and watch.task is not None and not watch.task.done()

    async def _watch(self, broker_id: int, watch: _Watch, manager: Any, on_death: OnBrokerDeath) -> None:
        try:
            await manager.run_until_stopped.remote()
        except RayError:  # RayActorError, or ActorUnschedulableError once its node is gone
            await on_death(broker_id, watch.epoch)

    def close(self) -> list[Any]:
        """Forgets every session; returns the ReplicaManager handles it had."""
        managers = list(self._managers.values())
        self._managers.clear()
        self._cluster.attached.clear()
        return managers

    def cancel_watches(self) -> None:
        for watch in self._watches.values():
            if watch.task is not None:
                watch.task.cancel()
