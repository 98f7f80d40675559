"""BrokerHeartbeatManager: the brokers' sessions with this Controller (Kafka's
BrokerHeartbeatManager).

The broker set itself is metadata (`ClusterControlManager`: registrations, epochs,
fencing, replayed from the log); this owns what lives only as long as this Controller
process: per broker, the handle of the ReplicaManager that registered with this session
(`attached`; elections read the set from `ClusterControlManager.attached`, which this
keeps), when it last heartbeat, since when it is fenced, the Kafka listeners it
advertises, its node's memory and cores as it registered, and a call held open on its actor
(`run_until_stopped`) that fails the moment Ray reports it dead.

It decides nothing: it tells the Controller which brokers are silent for longer than
`broker.session.timeout.ms` (`silent_brokers`), which were fenced long enough to be
replaced (`fenced_for`), and answers heartbeats; fencing is a commit, the Controller's.

Lifecycle: created with the replayed metadata, every live broker counted as heard from
then; `start_clocks` gives those that have not registered again one more session timeout
(the Controller's `start`). `close` forgets every session. Times are monotonic. Not
thread-safe: the Controller's event loop calls it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from ray.exceptions import RayError

from rayk.errors import StaleBrokerEpochError
from rayk.metadata.cluster_control import ClusterControlManager

Endpoints = dict[str, tuple[str, int]]  # a broker's Kafka listeners: advertised (host, port) by listener name
OnBrokerDeath = Callable[[int, int], Awaitable[None]]  # (broker id, broker epoch the watch was started in)


class BrokerHeartbeatManager:
    """Sessions, heartbeats and liveness of the brokers registered with this Controller."""

    def __init__(self, cluster: ClusterControlManager, session_timeout_ms: int, heartbeat_interval_ms: int) -> None:
        self._cluster = cluster
        self._session_timeout_s = session_timeout_ms / 1000
        self._heartbeat_interval_s = heartbeat_interval_ms / 1000
        now = time.monotonic()
        self._last_heartbeat_s: dict[int, float] = {b: now for b in cluster.live_brokers}
        self._fenced_since_s: dict[int, float] = {b: now for b, r in cluster.brokers.items() if r.fenced}
        self._managers: dict[int, Any] = {}  # broker id -> ReplicaManager handle, this session
        self._registering: set[int] = set()  # brokers whose registration's pushes are under way
        self.endpoints: dict[int, Endpoints] = {}
        self.node_memory_bytes: dict[int, int] = {}  # broker id -> its node's memory, as it registered
        self.node_cpus: dict[int, float] = {}  # broker id -> its node's cores, as it registered
        self._watches: set[asyncio.Task] = set()

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

    def fenced(self, broker_id: int) -> None:
        """The Controller committed the broker's fencing (its replacement clock starts)."""
        self._fenced_since_s[broker_id] = time.monotonic()

    def fenced_for(self, delay_s: float) -> set[int]:
        """The brokers fenced for `delay_s` or longer."""
        now = time.monotonic()
        return {b for b, since in self._fenced_since_s.items() if now - since >= delay_s}

    def set_endpoints(self, broker_id: int, endpoints: Endpoints | None) -> None:
        if not endpoints:
            self.endpoints.pop(broker_id, None)
        else:
            self.endpoints[broker_id] = {str(name): (str(host), int(port)) for name, (host, port) in endpoints.items()}

    # ------------------------------------------------------------------ heartbeats and sessions

    def start_clocks(self) -> None:
        """Every live broker that has not registered with this session gets one session
        timeout from now to do so (a restarted Controller's maintenance starts)."""
        now = time.monotonic()
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
        self._last_heartbeat_s[broker_id] = time.monotonic()
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
            self._last_heartbeat_s[broker_id] = time.monotonic()

    def silent_brokers(self) -> Iterator[tuple[int, float]]:
        """Live brokers silent for longer than the session timeout, with how long, in id
        order. Lazy: each is judged when reached, so a heartbeat that arrives while the
        caller fences the one before still counts."""
        now = time.monotonic()
        for broker_id in sorted(self._cluster.live_brokers - self._registering):
            silent_s = now - self._last_heartbeat_s.get(broker_id, now)
            if silent_s > self._session_timeout_s:
                yield broker_id, silent_s

    def heartbeats_recently(self, broker_id: int) -> bool:
        """Live and heard from within two heartbeat intervals: slow if late, not failed."""
        silent_s = time.monotonic() - self._last_heartbeat_s.get(broker_id, 0.0)
        return broker_id in self._cluster.live_brokers and silent_s < self._heartbeat_interval_s * 2

    # ------------------------------------------------------------------ death, as Ray reports it

    def watch(self, broker_id: int, epoch: int, manager: Any, on_death: OnBrokerDeath) -> None:
        """Holds a call open on the broker's actor; `on_death(broker_id, epoch)` once Ray
        reports it dead (Ray may then restart it: it registers again, a new incarnation)."""
        task = asyncio.get_running_loop().create_task(self._watch(broker_id, epoch, manager, on_death))
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    @staticmethod
    async def _watch(broker_id: int, epoch: int, manager: Any, on_death: OnBrokerDeath) -> None:
        try:
            await manager.run_until_stopped.remote()
        except RayError:  # RayActorError, or ActorUnschedulableError once its node is gone
            await on_death(broker_id, epoch)

    def close(self) -> list[Any]:
        """Forgets every session; returns the ReplicaManager handles it had."""
        managers = list(self._managers.values())
        self._managers.clear()
        self._cluster.attached.clear()
        return managers

    def cancel_watches(self) -> None:
        for task in list(self._watches):
            task.cancel()
