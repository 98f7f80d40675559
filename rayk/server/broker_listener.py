"""BrokerListener: a broker's Kafka listener as its ReplicaManager keeps it.

The listener is a SocketServer actor (rayk/net) on the broker's node, made by the listener
factory the broker was handed (this module never imports rayk/net). It owns the handle,
the advertised endpoints, the ports it listens on and its process id, and:
- starts it (`start`), and has the broker's ChildSupervisor watch it;
- restarts it when it died (`restart`), on the ports it had: with port 0 in `listeners`
  (any free port) a restarted listener used to come back on new ones, and clients'
  bootstrap lists pointed at closed ports. A port not free yet (the dead process not yet
  reaped) is tried again, with backoff (restart_backoff.py), as are restarts after
  restarts; only after `PORT_ATTEMPTS` attempts does it take any free port, since a
  listener on a new port that Metadata advertises beats none;
- tells the supervisor when it runs (`probe`): its process ran or waited for a CPU since
  the last round (/proc, on this node: supervision.ProcessProgress), so that a listener
  slow to answer a ping on a starved node is late, not dead; a stopped or wedged one does
  neither and is killed as before.

Not thread-safe: the ReplicaManager's event loop calls it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from ray.exceptions import RayActorError

from rayk.actors.restart_backoff import BackoffPolicy, RestartBackoff
from rayk.actors.supervision import ChildSupervisor, ProcessProgress
from rayk.config import BrokerConfig
from rayk.errors import KafkaError, StaleBrokerEpochError

logger = logging.getLogger(__name__)

LISTENER = "listener"  # the supervisor's key for the Kafka listener; replicas are keyed by TopicPartition
# Restarts: the first at once, then 0.5 s doubling to 30 s with jitter, at most 10 in 10 minutes.
LISTENER_RESTARTS = BackoffPolicy(first_delay_s=0.5, max_delay_s=30, budget=10, window_s=600)
PORT_ATTEMPTS = 10  # attempts on the ports it had before a restarted listener takes free ones
PUBLISH_RETRY_S = 0.2  # between attempts to tell an unreachable (restarting) Controller the endpoints
Endpoints = dict[str, tuple[str, int]]  # advertised (host, port) by listener name
# (broker id, Controller handle, config, node id) -> the broker's listener actor, created on
# that node, or None when the config's `listeners` names none.
ListenerFactory = Callable[[int, Any, BrokerConfig, str], Any]


class BrokerListener:
    """A broker's Kafka listener: started, supervised, restarted on its ports, seen running."""

    def __init__(self, broker_id: int, factory: ListenerFactory | None, controller: Any, config: BrokerConfig,
                 node_id: str, children: ChildSupervisor) -> None:  # fmt: skip
        self.broker_id = broker_id
        self._factory = factory
        self._controller = controller
        self._config = config
        self._node_id = node_id
        self._children = children
        self.handle: Any = None  # the SocketServer actor, while one runs
        self.endpoints: Endpoints | None = None
        self._ports: dict[str, int] = {}  # listener name -> the port it listened on, kept across restarts
        self._process: ProcessProgress | None = None
        self._restarts = RestartBackoff(LISTENER_RESTARTS)
        self.restarted = 0  # restarts after a death, for the broker's description

    async def start(self, ports: dict[str, int] | None = None) -> None:
        """Starts the listener on this node (on `ports`, by listener name, if given), when
        `listeners` names one."""
        if self.handle is not None or self._factory is None:
            return
        listener = self._factory(self.broker_id, self._controller, self._config, self._node_id)
        if listener is None:
            return
        try:
            self.endpoints = await listener.start.remote(ports)
            ports_and_pid: tuple[Any, Any] = await asyncio.gather(listener.bound_ports.remote(), listener.pid.remote())
        except BaseException:
            ray.kill(listener)  # it could not bind (a port in use, a keystore that does not load)
            raise
        self._ports = ports_and_pid[0]
        self.handle, self._process = listener, ProcessProgress(ports_and_pid[1])
        self._children.watch(LISTENER, listener)

    async def restart(self, publish: Callable[[], Awaitable[None]]) -> None:
        """After the listener died: starts another on the ports it had, backing off between
        attempts, and `publish`es its endpoints (to the Controller), retried while the
        Controller is unreachable. Returns once it runs and was published, or when the
        broker is registering again (StaleBrokerEpochError: the registration carries them)."""
        self.handle = None
        attempts = 0
        while self.handle is None:
            delay_s = self._restarts.delay_s(LISTENER)
            if delay_s > 0:
                logger.info("broker %d: restarting the Kafka listener in %.1f s", self.broker_id, delay_s)
                await asyncio.sleep(delay_s)
            self._restarts.restarted(LISTENER)
            attempts += 1
            ports = self._ports if attempts <= PORT_ATTEMPTS else None
            try:
                await self.start(ports)
            except KafkaError as e:  # the port is not free yet
                logger.warning("broker %d: cannot restart the Kafka listener on %s yet: %s", self.broker_id, ports, e)
            except RayActorError as e:
                logger.warning("broker %d: listener restart: %s", self.broker_id, e)
        self.restarted += 1
        while True:
            try:
                await publish()
                return
            except StaleBrokerEpochError:
                return
            except (KafkaError, RayActorError) as e:  # the Controller is restarting
                logger.warning("broker %d: publishing the restarted listener's address: %s", self.broker_id, e)
                await asyncio.sleep(PUBLISH_RETRY_S)

    def probe(self, now_s: float) -> None:
        """Tells the supervisor the listener ran at `now_s` if its process ran or waited for
        a CPU since the last probe (a stopped or gone process does not count)."""
        if self.handle is not None and self._process is not None and self._process.moved():
            self._children.ran(LISTENER, self.handle, now_s)

    async def stop(self) -> None:
        """Stops it for good (the broker's clean shutdown)."""
        if self.handle is not None:
            self._children.forget(LISTENER)
            await asyncio.gather(self.handle.stop.remote(), return_exceptions=True)
            ray.kill(self.handle)
            self.handle = None
