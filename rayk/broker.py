"""A broker as `rayk.start` deploys it: a ReplicaManager (rayk/actors) that runs a Kafka
listener (rayk/net).

The one module that knows both layers. `BrokerFactory` is how brokers are created, by
`rayk.start` for the first ones and by the Controller for those added at runtime (it is
handed the factory, so that rayk/controller never imports the listener either). The ReplicaManager is handed the listener's
factory instead of importing it, so imports point one way (DESIGN's layers) and the wire
protocol stays out of every process that merely holds a broker's handle: Ray loads an
actor handle's class module in each process the handle reaches. (Partition replicas, a
process per partition, hold no broker handle at all: they reach their broker by name,
rayk/actors/named_actor.py.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from rayk.actors import INTERNAL_ACTOR_OPTIONS
from rayk.config import BrokerConfig
from rayk.net.socket_server_actor import create_listener
from rayk.server.broker_placement import pinned
from rayk.server.replica_manager import ReplicaManager

BrokerActor = ray.remote(**INTERNAL_ACTOR_OPTIONS)(ReplicaManager)


def create_broker(
    broker_id: int, data_dir: str, cluster_id: str, controller: Any, config: BrokerConfig, namespace: str,
    **actor_options: Any,
) -> Any:
    """A broker's actor (not started yet: call its `start`), named broker_actor_name in Ray
    `namespace` (where the Controller is named too), with Ray `actor_options` (lifetime,
    scheduling strategy, ...)."""
    return BrokerActor.options(name=broker_actor_name(broker_id), namespace=namespace, **actor_options).remote(
        broker_id, data_dir, cluster_id, controller, config, listener_factory=create_listener, namespace=namespace
    )


def broker_actor_name(broker_id: int) -> str:
    return f"rayk-broker-{broker_id}"


@dataclass(frozen=True, slots=True)
class BrokerFactory:
    """Creates one cluster's brokers: each a detached, named ReplicaManager actor pinned to
    its node with hard affinity, restarted by Ray in place if its process dies (an actor
    whose node is gone stays dead until it is placed again). Picklable: the Controller
    keeps it, and a restarted Controller gets it again with its constructor's arguments."""

    data_dir: str
    namespace: str
    config: BrokerConfig
    node_resource: str | None = None  # brokers run only on nodes that offer it
    # Each broker reserves one unit of `node_resource` (with Ray's autoscaler: a broker node
    # type offers one), so a node runs one broker at most, and Ray's resource accounting
    # shows which broker nodes are taken (`ray status`). Its replicas and listener reserve
    # nothing: they follow it by hard affinity.
    one_per_node: bool = False

    def __post_init__(self) -> None:
        assert self.node_resource or not self.one_per_node, "one broker per node is counted by a node resource"

    def create(self, broker_id: int, node_id: str, cluster_id: str, controller: Any) -> Any:
        """The broker's actor on `node_id`, not started yet (call its `start`)."""
        reserved = {"resources": {self.node_resource: 1}} if self.one_per_node and self.node_resource else {}
        return create_broker(
            broker_id, self.data_dir, cluster_id, controller, self.config, self.namespace,
            lifetime="detached",
            max_restarts=-1,
            scheduling_strategy=pinned(node_id),
            **reserved,
        )  # fmt: skip

    def find(self, broker_id: int) -> Any | None:
        """The broker's actor if it exists (alive or restarting), else None."""
        try:
            return ray.get_actor(broker_actor_name(broker_id), namespace=self.namespace)
        except ValueError:
            return None
