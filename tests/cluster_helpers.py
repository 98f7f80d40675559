"""Helpers shared by the cluster tests: waiting, producing, reading a partition back."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import ray
from ray._private.state import actors as actor_table
from ray.cluster_utils import Cluster

from rayk.errors import KafkaError
from rayk.storage.records import SimpleRecord, build_batch, iter_batches

# Fast failure detection so tests do not wait out Kafka's 9 s session timeout, a new
# group's first join answered at once rather than after Kafka's 3 s wait for more members
# (tests/test_static_membership.py and test_group_coordinator.py test that wait), and one
# partition of each internal topic (3 replica processes, not 9, per topic per cluster;
# test_kafka_clients keeps Kafka's layout of several).
FAST_CONFIG = {
    "broker.session.timeout.ms": 4000,
    "broker.heartbeat.interval.ms": 400,
    "replica.lag.time.max.ms": 5000,
    "replica.high.watermark.checkpoint.interval.ms": 500,
    "group.initial.rebalance.delay.ms": 0,
    "offsets.topic.num.partitions": 1,
    "transaction.state.log.num.partitions": 1,
    "listeners": "PLAINTEXT://127.0.0.1:0",  # tests bind to loopback, on free ports
}
# For the modules whose tests speak no Kafka protocol (they use the Python API, Ray Data or
# the replicas themselves): brokers without a Kafka listener. Each broker's listener is a
# SocketServer process of its own, ~2 CPU-s to start (kio's message classes are most of its
# imports): a 3-broker cluster started in 4.6-4.8 s without them, 8.0-8.5 s with them (two
# starts each, alternated in one run on this 2-core machine).
NO_LISTENERS = {"listeners": ""}


LOCAL_RAY = {"address": "local", "num_cpus": 2, "include_dashboard": False, "log_to_driver": False}
_shared_local_ray = False
_shared_broker_nodes: Cluster | None = None


def shared_local_ray() -> str:
    """The one-node Ray (2 CPUs) that the modules running only rayk clusters share, since
    starting and stopping a Ray costs ~7 s. Those modules shut every cluster they start.
    A module that needs a Ray of its own (a ray.cluster_utils.Cluster, other resources, or
    actors of its own that must not outlive it) calls `release_shared_local_ray` first.
    Returns the GCS address."""
    global _shared_local_ray
    _release_shared_broker_nodes()
    if not _shared_local_ray:
        assert not ray.is_initialized(), "a module left its own Ray running"
        ray.init(**LOCAL_RAY)
        _shared_local_ray = True
    return ray.get_runtime_context().gcs_address


def release_shared_local_ray() -> None:
    """Shuts down whichever Ray the modules share: the local one or the broker nodes."""
    global _shared_local_ray
    _release_shared_broker_nodes()
    if _shared_local_ray:
        ray.shutdown()
        _shared_local_ray = False


BROKER_RESOURCE = "rayk_broker"  # what `rayk.start(node_resource=...)` places one broker per node by


def _start_broker_nodes(broker_nodes: int) -> Cluster:
    release_shared_local_ray()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(broker_nodes):
        cluster.add_node(num_cpus=1, resources={BROKER_RESOURCE: 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def _stop_broker_nodes(cluster: Cluster) -> None:
    ray.shutdown()
    cluster.shutdown()


@contextlib.contextmanager
def broker_node_cluster(broker_nodes: int = 3) -> Iterator[Cluster]:
    """A Ray cluster of a head and `broker_nodes` nodes for one broker each (1 CPU and
    BROKER_RESOURCE apiece), connected to for as long as the block lasts."""
    cluster = _start_broker_nodes(broker_nodes)
    try:
        yield cluster
    finally:
        _stop_broker_nodes(cluster)


def shared_broker_node_cluster() -> Cluster:
    """A broker_node_cluster(3) that the modules of node faults, process faults and
    failover share (starting and stopping one costs ~12 s here), until a module needs
    another Ray. Each of their tests shuts the rayk cluster it starts and leaves three live
    broker nodes (one that takes a node away adds one). A test that failed midway may not:
    a module taking the cluster over finds its three broker nodes free, or it starts a
    fresh cluster, so that a failure stays in its own module. tests/conftest.py runs those
    modules one after another."""
    global _shared_broker_nodes
    if _shared_broker_nodes is not None and not _free_broker_nodes(3, timeout_s=20):
        _release_shared_broker_nodes()
    if _shared_broker_nodes is None:
        _shared_broker_nodes = _start_broker_nodes(3)
    return _shared_broker_nodes


def _free_broker_nodes(count: int, timeout_s: float) -> bool:
    """Whether `count` broker nodes are alive with their BROKER_RESOURCE free, waiting up to
    `timeout_s` for the brokers of a cluster just shut down to release theirs."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get(BROKER_RESOURCE, 0) < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _release_shared_broker_nodes() -> None:
    global _shared_broker_nodes
    if _shared_broker_nodes is not None:
        cluster, _shared_broker_nodes = _shared_broker_nodes, None
        _stop_broker_nodes(cluster)


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def wait_for_live_brokers(cluster: Any, count: int, timeout_s: float = 60) -> None:
    """Until `count` brokers are registered and unfenced: a broker killed by an earlier test
    is fenced until its restarted process registers again, later on a busy machine."""
    wait_until(lambda: sum(not b["fenced"] for b in cluster.brokers()) >= count, timeout_s, f"{count} live brokers")


def start_new_broker(cluster: Any, broker_id: int) -> None:
    """Cluster.add_broker, which must start broker `broker_id` (the next id)."""
    assert cluster.add_broker() == broker_id


def placement(cluster: Any) -> tuple[Counter, Counter, bool]:
    """Replicas and leaders per broker over every partition (internal topics too), and
    whether every partition is steady: nothing moving, every replica in sync."""
    replicas: Counter = Counter()
    leaders: Counter = Counter()
    steady = True
    for topic in cluster.list_topics(include_internal=True):
        for p in cluster.describe_topic(topic):
            replicas.update(p["replicas"])
            leaders[p["leader"]] += 1
            steady &= not p["adding_replicas"] and not p["removing_replicas"] and sorted(p["isr"]) == sorted(p["replicas"])
    return replicas, leaders, steady


def balanced(cluster: Any, brokers: int) -> bool:
    """Steady, with every broker's replicas and leaders within 1 of the mean."""
    replicas, leaders, steady = placement(cluster)
    return steady and all(
        abs(counts[b] - sum(counts.values()) / brokers) < 1 for counts in (replicas, leaders) for b in range(brokers)
    )


def assert_lookup_is_a_long_poll(controller: Any, method: str, change: Callable[[], Any]) -> Any:
    """The Controller's `method(known_version, wait_ms)` (what the listeners hold open for
    the ACLs and client quotas): at the current version it answers None after `wait_ms`,
    and a call held open answers the moment `change()` commits a change. The new value."""
    version, _ = ray.get(getattr(controller, method).remote())
    started = time.monotonic()
    assert ray.get(getattr(controller, method).remote(version, 300)) is None
    assert time.monotonic() - started >= 0.3, "nothing changed, yet it answered before wait_ms"
    held = getattr(controller, method).remote(version, 60_000)
    assert ray.wait([held], timeout=0.5)[0] == [], "nothing changed, yet the held call answered"
    started = time.monotonic()
    change()
    new_version, value = ray.get(held, timeout=30)
    assert new_version > version
    assert time.monotonic() - started < 5, "the held call answered the change late"
    return value


def pid_of(handle: Any) -> int:
    """The pid Ray's actor table gives for an actor's process."""
    return actor_table(handle._actor_id.hex())["Pid"]


def is_dead(handle: Any) -> bool:
    """Whether Ray's actor table has the actor DEAD: `ray.kill` returns before it is."""
    return actor_table(handle._actor_id.hex())["State"] == "DEAD"


def batch_of(values: list[bytes]) -> bytes:
    return build_batch([SimpleRecord(v) for v in values])


def produce(handle: Any, values: list[bytes], acks: int = -1, timeout_ms: int = 5000):
    return ray.get(handle.produce.remote(batch_of(values), acks, timeout_ms))


def produce_to_leader(cluster: Any, topic: str, partition: int, values: list[bytes], timeout_s: float = 30):
    """`produce` to the partition's leader, looked up again while the one found is gone or
    no longer leads (on loaded cores a broker may replace a replica that answered nothing
    for its session timeout, as it must a hung one); the first other answer is returned."""
    from rayk.errors import NotLeaderOrFollowerError

    def attempt(leader: Any) -> Any:
        result = produce(leader, values)
        return None if isinstance(result.error, NotLeaderOrFollowerError) else result

    return on_leader(cluster, topic, partition, attempt, timeout_s, what="took the records")


def read_from_leader(cluster: Any, topic: str, partition: int, end_offset: int, timeout_s: float = 30):
    """`read_partition` from the partition's leader, looked up again while the one found is
    gone (as for `produce_to_leader`)."""
    return on_leader(cluster, topic, partition, lambda leader: read_partition(leader, end_offset), timeout_s, what="was read")


def on_leader(cluster: Any, topic: str, partition: int, attempt: Any, timeout_s: float, what: str) -> Any:
    """`attempt(leader handle)`'s first answer that is not None, with the partition's leader
    looked up again after each None or RayActorError, for up to `timeout_s`."""
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = attempt(cluster.leader(topic, partition))
            if result is not None:
                return result
        except RayActorError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"no leader of {topic}-{partition} {what} in {timeout_s} s")
        time.sleep(0.1)


def decode(records: bytes) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for b in iter_batches(records) for r in b.records()]


def read_partition(handle: Any, end_offset: int, start_offset: int = 0) -> list[tuple[int, bytes]]:
    """Every (offset, value) a consumer fetch returns from `start_offset` up to `end_offset`."""
    out: list[tuple[int, bytes]] = []
    offset = start_offset
    while offset < end_offset:
        result = ray.get(handle.fetch.remote(offset, 1 << 20, 1, 0))
        assert result.error is None, result.error
        records = decode(result.records)
        assert records, f"no progress at offset {offset} (HW {result.high_watermark})"
        out += records
        offset = records[-1][0] + 1
    return out


def consume_topic(cluster: Any, topic: str, expected: int, timeout_s: float = 30, **settings: Any) -> list:
    """Records of every partition of `topic` from its beginning, read by rayk's consumer
    (assign and seek, no group) until `expected` came or timeout_s passed."""
    from rayk.client import TopicPartition

    consumer = cluster.consumer(**settings)
    consumer.assign([TopicPartition(topic, p) for p in range(len(cluster.describe_topic(topic)))])
    consumer.seek_to_beginning()
    records: list = []
    deadline = time.monotonic() + timeout_s
    while len(records) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            records += batch
    consumer.close()
    return records


def read_replica(handle: Any) -> list[tuple[int, bytes]]:
    """A replica's whole local log, leader or follower."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while records := decode(ray.get(handle.read_local.remote(offset, 1 << 20))):
        out += records
        offset = records[-1][0] + 1
    return out


class Writer(threading.Thread):
    """Produces batches with acks=-1 without pause, following the leader as it moves.

    `acked` holds (base offset, values) of every acknowledged batch; `errors` counts the
    failed attempts by error name. A failed batch is retried (it may then appear twice,
    as with a non-idempotent Kafka producer; each acknowledged copy is where it was acked).
    """

    def __init__(self, cluster: Any, topic: str, partition: int = 0, batch_records: int = 5) -> None:
        super().__init__(daemon=True)
        self.cluster, self.topic, self.partition, self.batch_records = cluster, topic, partition, batch_records
        self.acked: list[tuple[int, list[bytes]]] = []
        self.errors: dict[str, int] = {}
        self._halt = threading.Event()
        self._seq = 0

    def run(self) -> None:
        handle = None
        values = self._next_values()
        while not self._halt.is_set():
            try:
                if handle is None:
                    handle = self.cluster.leader(self.topic, self.partition)
                result = ray.get(handle.produce.remote(batch_of(values), -1, 2000), timeout=10)
                error = result.error
            except KafkaError as e:
                error = e
            except Exception as e:  # the leader's actor died with its node
                error = e
            if error is None:
                self.acked.append((result.base_offset, values))
                values = self._next_values()
                continue
            name = getattr(error, "name", type(error).__name__)
            self.errors[name] = self.errors.get(name, 0) + 1
            handle = None
            time.sleep(0.05)

    def _next_values(self) -> list[bytes]:
        values = [b"record-%d" % (self._seq + i) for i in range(self.batch_records)]
        self._seq += self.batch_records
        return values

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        assert not self.is_alive(), "the writer did not stop"


def assert_acked_records_present(cluster: Any, topic: str, acked: list[tuple[int, list[bytes]]]) -> None:
    """Every acknowledged record is read back at exactly its acknowledged offset."""
    assert acked, "nothing was acknowledged"
    leader = cluster.leader(topic, 0)
    end = max(base + len(values) for base, values in acked)
    stored = dict(read_partition(leader, end))
    for base, values in acked:
        for i, value in enumerate(values):
            assert stored.get(base + i) == value, f"acked record at offset {base + i} is {stored.get(base + i)!r}"


def confluent_round_trip(settings: dict, topic: str, values: list[bytes], timeout_s: float = 60) -> list[bytes]:
    """Produces `values` with a confluent-kafka producer (acks=all) and reads them back with a
    consumer in a group of its own, both with the client `settings` (security included);
    the values read, in the order read."""
    import confluent_kafka

    producer = confluent_kafka.Producer({**settings, "acks": "all"})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0, "every record delivered"
    consumer = confluent_kafka.Consumer({**settings, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < len(values) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    return got
