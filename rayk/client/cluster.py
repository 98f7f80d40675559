"""Cluster: deploying rayk onto the current Ray cluster (`start`), attaching to it
(`connect`), and the admin handle both return.

A deployment is one Controller and one ReplicaManager per broker id, all detached named
actors in one Ray namespace (default "rayk"), so they outlive the driver that started
them and any driver can `connect` to them. The Controller runs on the node of the
process that calls `start`, keeping its metadata log in `<data_dir>/controller`. Broker
`b` keeps its logs in `<data_dir>/broker-<b>` on its own node: on a multi-node cluster
one broker goes to each node (optionally only nodes offering the custom resource
`node_resource`), several per node when there are more brokers than nodes. A restart
on the same `data_dir` puts each broker back on the node whose disk holds its directory
(found by asking every node which `broker-*` directories it sees).

`Cluster` is a small picklable handle (the Controller's actor handle, the namespace and
two client settings), so it can be passed to Ray tasks and actors. Its calls go through
`rayk.client.calls.ApiCalls`: each bounded by `default_api_timeout_ms` (Kafka's
default.api.timeout.ms, 60 s; `dataclasses.replace(cluster, default_api_timeout_ms=...)`
for another), retried across a Controller restart, and raising only rayk's errors.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from rayk import native_paths
from rayk.actors import CONTROLLER_NAME, INTERNAL_ACTOR_OPTIONS
from rayk.controller.autoscaling import DEFAULT_BROKER_RESOURCE, AutoscaleSettings
from rayk.controller.controller import Controller
from rayk.client import calls
from rayk.client.deprecation import deprecated
from rayk.client.descriptions import ClusterHealth, PartitionDescription, partition_descriptions
from rayk.config import BrokerConfig
from rayk.errors import InvalidConfigurationError, KafkaError, KafkaTimeoutError, NetworkError
from rayk.internal_topics import is_internal
from rayk.ray_settings import ray_system_config_in_env

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # imported where used: a Ray task that unpickles a Cluster needs none of them
    from rayk.client.admin import Admin
    from rayk.client.consumer import Consumer
    from rayk.client.producer import Producer
    from rayk.client.share_consumer import ShareConsumer

DEFAULT_NAMESPACE = "rayk"
HEALTH_TIMEOUT_S = 10  # a broker that does not answer `health` by then is shown without figures
NODE_POLL_S = 0.5  # how often `start` looks for the broker nodes it asked Ray's autoscaler for
# For actors to be created and started: a Controller replaying its metadata log, brokers
# recovering their logs after a crash and registering. Longer than any API call.
START_TIMEOUT_MS = 600_000

ControllerActor = ray.remote(**INTERNAL_ACTOR_OPTIONS)(Controller)


def broker_actor_name(broker_id: int) -> str:
    return f"rayk-broker-{broker_id}"  # as rayk.broker names them (not imported here: see _factory)


def _find_actor(name: str, namespace: str) -> Any | None:
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def _bootstrap_servers(brokers: list[dict], listener_name: str | None) -> str:
    addresses = []
    for b in brokers:
        endpoints = b["endpoints"]
        name = next(iter(endpoints), None) if listener_name is None else listener_name.upper()
        if not b["fenced"] and name in endpoints:
            addresses.append("{}:{}".format(*endpoints[name]))
    return ",".join(addresses)


def _factory(data_dir: Path, namespace: str, config: BrokerConfig, node_resource: str | None, one_per_node: bool) -> Any:
    """The cluster's BrokerFactory. Imported here: the processes that only use a Cluster
    (Ray Data and Spark tasks unpickle one) need not load what a broker brings."""
    from rayk.broker import BrokerFactory

    return BrokerFactory(str(data_dir), namespace, config, node_resource, one_per_node)


def brokers_to_start(registered: Iterable[int], brokers: int) -> list[int]:
    """The `brokers` broker ids `start` starts: the brokers the cluster's metadata has
    registered, lowest ids first (on a data_dir used before, each comes back with its id and
    its directory, whatever brokers were added or removed since), then new ids above theirs."""
    ids = sorted(registered)[:brokers]
    next_id = max(registered, default=-1) + 1
    ids += range(next_id, next_id + brokers - len(ids))
    return ids


def _request_broker_nodes(settings: AutoscaleSettings, deadline_s: float) -> None:
    """Asks Ray's autoscaler for `min_brokers` nodes offering the broker resource (the
    standing request the Controller then keeps) and waits until they joined."""
    from ray.autoscaler.sdk import request_resources

    from rayk.server.broker_placement import candidate_nodes

    request_resources(bundles=[{settings.node_resource: 1}] * settings.min_brokers)
    while len(candidate_nodes(settings.node_resource)) < settings.min_brokers:
        if time.monotonic() > deadline_s:
            raise KafkaTimeoutError(
                f"Ray's autoscaler did not bring {settings.min_brokers} nodes offering {settings.node_resource!r} "
                f"within {START_TIMEOUT_MS} ms (see `ray status`)"
            )
        time.sleep(NODE_POLL_S)


def start(
    brokers: int = 3,
    data_dir: str | Path = "./rayk-data",
    *,
    config: dict[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    node_resource: str | None = None,
    address: str | None = None,
    autoscale: bool = False,
) -> Cluster:
    """Deploys a rayk cluster of `brokers` brokers on the current Ray cluster (starting
    Ray locally, or joining `address`, if this process is not connected yet). A Ray started
    here runs its workers, the brokers among them, at nice 0 rather than Ray's 15
    (rayk.ray_settings); a Ray started otherwise should be given RAY_worker_niceness=0.

    `config` holds broker settings by Kafka name (`broker.session.timeout.ms`, ...). On a
    `data_dir` used before, the cluster comes back with its topics and data: every broker
    registered there starts again with its id (those `add_broker` added included, those
    `remove_broker` removed not), and new brokers are added up to `brokers` in all; with
    more registered than `brokers`, the lowest ids start and the others stay down (a
    warning names them: a broker leaves by remove_broker, not by starting fewer).

    With `autoscale`, the brokers follow Ray's autoscaler (rayk/controller/autoscaling.py)
    and `brokers` is their minimum: one broker runs on each node offering `node_resource`
    (default "rayk_broker"; each broker reserves one unit of it), Ray's autoscaler is asked
    for `brokers` such nodes first, a topic that does not fit asks it for more, and a
    broker that holds nothing for `broker.idle.removal.ms` is decommissioned so that its
    node can go.

    Each partition replica is a Ray actor process, so this driver's console no longer
    prints Ray's "N PYTHON worker processes have been started ..." warning
    (rayk.ray_console.hide_worker_pool_warning); Ray's other messages are unchanged.
    """
    from rayk.ray_console import hide_worker_pool_warning

    if brokers < 1:
        raise InvalidConfigurationError(f"a cluster needs at least one broker, got {brokers}")
    native_paths.chosen(os.environ.get(native_paths.ENV, ""))  # this driver's RAYK_NATIVE, checked before anything starts
    hide_worker_pool_warning()
    if not ray.is_initialized():
        with ray_system_config_in_env():  # a Ray started here runs the brokers at a server's priority
            ray.init(address=address, namespace=namespace)
    broker_config = BrokerConfig.from_properties(config)
    if autoscale and node_resource is None:
        node_resource = DEFAULT_BROKER_RESOURCE
    autoscaling = AutoscaleSettings(brokers, node_resource or "") if autoscale else None
    data_dir = Path(data_dir).resolve()
    if _find_actor(CONTROLLER_NAME, namespace) is not None:
        raise InvalidConfigurationError(
            f"a rayk cluster is already running in Ray namespace {namespace!r}: "
            "use rayk.connect(), or shut it down first"
        )
    from rayk.server.broker_placement import pinned, place_brokers

    factory = _factory(data_dir, namespace, broker_config, node_resource, one_per_node=autoscaling is not None)
    controller = ControllerActor.options(
        name=CONTROLLER_NAME,
        namespace=namespace,
        lifetime="detached",
        max_restarts=-1,
        scheduling_strategy=pinned(ray.get_runtime_context().get_node_id()),
    ).remote(str(data_dir / "controller"), broker_config, factory, autoscaling)
    cluster = Cluster(controller, namespace)
    deadline_s = time.monotonic() + START_TIMEOUT_MS / 1000
    cluster_id = calls.get(controller.cluster_id.remote(), deadline_s, "the Controller's start")
    registered = [b["broker_id"] for b in calls.get(controller.brokers.remote(), deadline_s, "the registered brokers")]
    broker_ids = brokers_to_start(registered, brokers)
    if left_down := sorted(set(registered) - set(broker_ids)):
        logger.warning("brokers %s are registered in %s but not started (brokers=%d): their replicas stay "
                       "offline until they are (Cluster.restart_broker); a broker leaves by remove_broker",
                       left_down, data_dir, brokers)  # fmt: skip
    if autoscaling is not None:
        _request_broker_nodes(autoscaling, deadline_s)
    placement = place_brokers(broker_ids, data_dir, cluster_id, node_resource, timeout_s=START_TIMEOUT_MS / 1000)
    managers = [factory.create(b, node, cluster_id, controller) for b, node in placement.items()]
    calls.get_all([m.start.remote() for m in managers], deadline_s, "the brokers' start")
    calls.get(controller.start.remote(), deadline_s, "the Controller's start")  # session timeouts count from here
    return cluster


def connect(namespace: str = DEFAULT_NAMESPACE, address: str | None = None) -> Cluster:
    """Attaches to a running rayk cluster. As `start` does, keeps Ray's "N PYTHON worker
    processes have been started ..." warning off this driver's console
    (rayk.ray_console.hide_worker_pool_warning)."""
    from rayk.ray_console import hide_worker_pool_warning

    hide_worker_pool_warning()
    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=namespace)
    controller = _find_actor(CONTROLLER_NAME, namespace)
    if controller is None:
        raise InvalidConfigurationError(f"no rayk cluster runs in Ray namespace {namespace!r}; start one with rayk.start()")
    return Cluster(controller, namespace)


@dataclass(frozen=True)
class Cluster:
    """A handle on a running rayk cluster: topics, leaders, brokers, shutdown. Each call
    ends within `default_api_timeout_ms` (KafkaTimeoutError if the Controller did not
    answer by then; it is asked again after `retry_backoff_ms` while Ray restarts it) and
    raises only rayk's errors (rayk.errors)."""

    controller: Any
    namespace: str = DEFAULT_NAMESPACE
    default_api_timeout_ms: int = calls.DEFAULT_API_TIMEOUT_MS
    retry_backoff_ms: int = calls.RETRY_BACKOFF_MS

    @property
    def api_calls(self) -> calls.ApiCalls:
        """How this handle calls actors (its timeout and backoff); for the client's modules."""
        return calls.ApiCalls(self.default_api_timeout_ms, self.retry_backoff_ms)

    # ------------------------------------------------------------------ clients

    def producer(self, **settings: Any) -> Producer:
        """A Producer; its settings (kafka-python's names: acks, linger_ms, batch_size,
        compression_type, ...) are listed with their defaults in its class docstring."""
        from rayk.client.producer import Producer

        return Producer(self, **settings)

    def consumer(self, *topics: str, **settings: Any) -> Consumer:
        """A Consumer of `topics`; its settings (group_id, auto_offset_reset,
        enable_auto_commit, ...) are listed in its class docstring."""
        from rayk.client.consumer import Consumer

        return Consumer(self, *topics, **settings)

    def share_consumer(self, *topics: str, group_id: str, **settings: Any) -> ShareConsumer:
        """A member of the share group `group_id` (KIP-932) consuming `topics`; its
        settings (acknowledgement_mode, max_poll_records, deserializers, ...) are listed in
        rayk.client.share_consumer."""
        from rayk.client.share_consumer import ShareConsumer

        return ShareConsumer(self, *topics, group_id=group_id, **settings)

    def admin(self, **settings: Any) -> Admin:
        """An Admin (default_api_timeout_ms, retry_backoff_ms: this handle's unless given)."""
        from rayk.client.admin import Admin

        defaults = {"default_api_timeout_ms": self.default_api_timeout_ms, "retry_backoff_ms": self.retry_backoff_ms}
        return Admin(self, **{**defaults, **settings})

    # ------------------------------------------------------------------ topics

    # The rule shared with Admin: the same names (kafka-python's) for the same things.
    # Admin's calls are Kafka's, many topics at once (create_topics, delete_topics,
    # describe_topics); the Cluster's are the one-topic conveniences.

    def create_topic(
        self,
        name: str,
        num_partitions: int | None = None,
        replication_factor: int | None = None,
        config: dict[str, Any] | None = None,
        *,
        partitions: int | None = None,
    ) -> list[PartitionDescription]:
        """Creates a topic and returns its partitions once every one has its leader and
        followers (Admin.create_topic). Counts left out take the brokers' `num.partitions`
        / `default.replication.factor`. TopicAlreadyExistsError if it exists, unless this
        call's own lost attempt made it; InvalidTopicError, InvalidPartitionsError,
        InvalidReplicationFactorError, InvalidConfigurationError, PolicyViolationError
        for what the Controller refuses; KafkaTimeoutError. `partitions` is the
        deprecated spelling of `num_partitions`."""
        if partitions is not None:
            deprecated("create_topic(partitions=...)", "create_topic(num_partitions=...)")
            if num_partitions is not None:
                raise TypeError("give num_partitions or partitions (deprecated), not both")
            num_partitions = partitions
        return self.admin().create_topic(name, num_partitions, replication_factor, config)

    def delete_topic(self, name: str) -> None:
        """UnknownTopicOrPartitionError if it does not exist (Admin.delete_topics)."""
        self.admin().delete_topics([name])

    def list_topics(self, include_internal: bool = False) -> list[str]:
        """The topics' names; internal ones (`__consumer_offsets`) only with
        `include_internal`, as in Kafka's Admin and Admin.list_topics."""
        names = self._ask("list_topics", what="ListTopics")
        return [n for n in names if include_internal or not is_internal(n)]

    def describe_topic(self, name: str) -> list[PartitionDescription]:
        """Its partitions (PartitionDescription: leader, replicas, isr, leader_epoch,
        high_watermark, log_end_offset, ...). UnknownTopicOrPartitionError if there is no
        such topic."""
        return partition_descriptions(self._ask("describe_topic", name, what=f"DescribeTopics {name!r}"))

    def leader(self, topic: str, partition: int) -> Any:
        """The actor handle of the partition's leader PartitionReplica. LEADER_NOT_AVAILABLE,
        raised at once, while it has none (during an election, or until the brokers report
        to a restarted Controller): call again after a backoff."""
        return self._ask("leader", topic, partition, what=f"leader of {topic}-{partition}")

    def replica(self, topic: str, partition: int, broker_id: int) -> Any:
        """The actor handle of one replica, leader or follower (None if its broker is away)."""
        return self._ask("replica", topic, partition, broker_id, what=f"replica {broker_id} of {topic}-{partition}")

    def metadata(self, topics: list[str] | None = None) -> dict[str, dict]:
        return self._ask("metadata", topics, what="Metadata")

    def data_dir(self) -> Path:
        """The directory the cluster keeps its data in (as given to `start`)."""
        return Path(self._ask("data_dir", what="data_dir")).parent

    def _ask(self, method: str, *args: Any, what: str) -> Any:
        """The Controller's answer to `method(*args)` (see the class docstring)."""
        return self.api_calls(lambda: getattr(self.controller, method).remote(*args), what)

    # ------------------------------------------------------------------ brokers

    def brokers(self) -> list[dict]:
        return self._ask("brokers", what="brokers")

    @property
    def bootstrap_servers(self) -> str:
        """The live brokers' first Kafka listener (the first of `listeners`) as a
        `bootstrap.servers` string for Kafka clients ("" when `listeners` is empty)."""
        return self.bootstrap_servers_for(None)

    def bootstrap_servers_for(self, listener_name: str | None) -> str:
        """The live brokers' addresses on one listener (by name; None: the first) as a
        `bootstrap.servers` string."""
        return _bootstrap_servers(self.brokers(), listener_name)

    def health(self) -> ClusterHealth:
        """Kafka's health gauges, asked of the actors themselves (no Prometheus needed): the
        Controller's `active_controller_count` and `offline_partitions_count`, and in
        `brokers` each registered broker's BrokerHealth (leader and partition counts,
        under-replicated and under-min-ISR partitions; None if it did not answer). The
        Controller is given HEALTH_TIMEOUT_S to answer (KafkaTimeoutError after)."""
        timeout_ms = HEALTH_TIMEOUT_S * 1000
        controller, registered = self.api_calls.retry(self._controller_health, "health", timeout_ms=timeout_ms)
        deadline_s = time.monotonic() + HEALTH_TIMEOUT_S
        asked = {b: manager.health.remote() for b in registered if (manager := self.broker(b)) is not None}
        brokers = {}
        for broker_id in registered:
            try:
                answer = calls.get(asked[broker_id], deadline_s, f"health of broker {broker_id}") if broker_id in asked else None
            except KafkaError:  # dead, restarting, or slower than HEALTH_TIMEOUT_S
                answer = None
            brokers[broker_id] = answer
        return ClusterHealth(**controller, brokers=brokers)

    def _controller_health(self, deadline_s: float) -> tuple[dict[str, int], list[int]]:
        asked = [self.controller.health.remote(), self.controller.brokers.remote()]
        health, brokers = calls.get_all(asked, deadline_s, "the Controller's health")
        return health, sorted(b["broker_id"] for b in brokers)

    def broker(self, broker_id: int) -> Any:
        """The ReplicaManager actor handle of a broker, or None if it is not running."""
        return _find_actor(broker_actor_name(broker_id), self.namespace)

    def restart_broker(self, broker_id: int, node_id: str | None = None) -> None:
        """Starts a broker that stopped or died (e.g. its node was lost), on `node_id` or
        wherever its data directory is; it recovers its logs and rejoins."""
        from rayk.server.broker_placement import place_brokers

        if self.broker(broker_id) is not None:
            raise InvalidConfigurationError(f"broker {broker_id} is running")
        factory = self._ask("broker_factory", what="broker_factory")
        cluster_id = self._ask("cluster_id", what="cluster_id")
        deadline_s = time.monotonic() + START_TIMEOUT_MS / 1000
        if node_id is None:
            node_id = place_brokers([broker_id], Path(factory.data_dir), cluster_id, factory.node_resource,
                                    timeout_s=START_TIMEOUT_MS / 1000)[broker_id]  # fmt: skip
        manager = factory.create(broker_id, node_id, cluster_id, self.controller)
        calls.get(manager.start.remote(), deadline_s, f"the start of broker {broker_id}")

    def add_broker(self, node_id: str | None = None) -> int:
        """Starts a new broker, with a new id, on `node_id` or on the node (offering the
        cluster's `node_resource`, if it has one) that runs the fewest brokers, and returns
        its id once it has registered. The balancer then gives it its share of the
        partitions (`auto.balance.enable`). Kafka's clients see it in Metadata. One call,
        never retried (a retry could start a second broker): NETWORK_EXCEPTION if the
        Controller went away meanwhile (`brokers()` then tells whether it was added)."""
        deadline_s = time.monotonic() + START_TIMEOUT_MS / 1000
        return calls.get(self.controller.add_broker.remote(node_id), deadline_s, "add_broker")

    def remove_broker(self, broker_id: int, timeout_ms: int = START_TIMEOUT_MS) -> None:
        """Decommissions a broker: it takes no new replicas, each of its replicas moves to
        the others by a KIP-455 reassignment (added and in sync before it is removed, so no
        partition goes below min.insync.replicas), then it stops, its data directory is
        deleted and it leaves the cluster. Returns once it is gone; REQUEST_TIMED_OUT after
        `timeout_ms` (the decommission goes on). POLICY_VIOLATION, changing nothing, if the
        other brokers cannot hold its replicas; BROKER_NOT_AVAILABLE if no such broker."""
        # Asked again while unanswered (the Controller restarting): a decommission is
        # idempotent, and the Controller carries it on from its metadata anyway.
        self.api_calls(lambda: self.controller.remove_broker.remote(broker_id, timeout_ms), f"remove_broker {broker_id}",
                       timeout_ms=timeout_ms + self.default_api_timeout_ms)  # fmt: skip

    def _controller_gone(self) -> bool:
        """Whether this handle's Controller was killed for good: its name is freed (or
        taken by another cluster's), where a restarting one keeps it."""
        found = _find_actor(CONTROLLER_NAME, self.namespace)
        return found is None or found._actor_id != self.controller._actor_id

    def _raise_if_gone(self, error: KafkaError) -> None:
        """Ends the retries of a call that only a restarting Controller would answer."""
        if self._controller_gone():
            raise error

    def shutdown(self) -> None:
        """Stops every broker cleanly (flush, checkpoints) and the Controller; data stays on
        disk. Once it is done, calling it again does nothing. A Controller that Ray is
        restarting is waited for (default_api_timeout_ms)."""
        if self._controller_gone():
            return  # shut down already
        try:
            self.api_calls(lambda: self.controller.shutdown.remote(), "shutdown", on_retriable=self._raise_if_gone)
            brokers = self.api_calls(lambda: self.controller.brokers.remote(), "brokers", on_retriable=self._raise_if_gone)
        except NetworkError:
            return  # it was being killed: shut down already
        for b in brokers:
            if (manager := self.broker(b["broker_id"])) is not None:
                ray.kill(manager)
        ray.kill(self.controller)
