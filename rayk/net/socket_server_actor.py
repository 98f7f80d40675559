"""SocketServerActor: the Ray actor a broker's Kafka listener (SocketServer) runs in.

For Ray to create an actor, the creating process must hold the actor's class, and a
broker's ReplicaManager creates its listener. With SocketServer itself decorated, every
broker process imported the listener's modules to create it: kio's message schemas and
what they import (~170 modules; hypothesis too, through kio's phantom types, where it is
installed), ~0.5 CPU-s of each broker's start for code that only the listener's process
runs (`python -c "import ray, rayk.server.replica_manager"` against the same with
rayk.net.socket_server: 1.55 against 2.05 CPU-s). This class is what the broker creates:
it imports SocketServer in the listener's own process and hands each call on.
Supervised as SocketServer is: it dies with its process, and its broker starts another.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayk.actors import INTERNAL_ACTOR_OPTIONS
from rayk.config import BrokerConfig

if TYPE_CHECKING:
    from rayk.net.request_context import RequestContext


@ray.remote(**INTERNAL_ACTOR_OPTIONS, max_restarts=0)
class SocketServerActor:
    """A SocketServer's remote methods (see there), and Supervised's."""

    def __init__(self, broker_id: int, controller: Any, config: BrokerConfig) -> None:
        from rayk.net.socket_server import SocketServer

        self._server = SocketServer(broker_id, controller, config)

    async def start(self, ports: dict[str, int] | None = None) -> dict[str, tuple[str, int]]:
        return await self._server.start(ports)

    async def stop(self) -> None:
        await self._server.stop()

    async def bound_ports(self) -> dict[str, int]:
        return await self._server.bound_ports()

    async def connections(self) -> int:
        return await self._server.connections()

    async def describe_connections(self) -> list[RequestContext]:
        return await self._server.describe_connections()

    async def queued_requests(self) -> int:
        return await self._server.queued_requests()

    async def queued_request_bytes(self) -> int:
        return await self._server.queued_request_bytes()

    async def run_until_stopped(self) -> None:
        await self._server.run_until_stopped()

    async def ping(self) -> None:
        """Answers at once while the actor's event loop runs."""

    async def pid(self) -> int:
        return os.getpid()


def create_listener(broker_id: int, controller: Any, config: BrokerConfig, node_id: str) -> Any:
    """A broker's listener factory (see ReplicaManager): its SocketServerActor, created on
    the broker's node, or None when `listeners` names no listener."""
    if not config.kafka_listeners():
        return None
    return SocketServerActor.options(  # type: ignore[attr-defined]
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote(broker_id, controller, config)
