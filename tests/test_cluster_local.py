"""A rayk cluster of three brokers on one Ray node: Controller, ReplicaManagers, elections.

The multi-node failover scenarios are in test_cluster_failover.py.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time

import pytest
import ray

import rayk
from rayk.client import TopicPartition
from rayk.controller.broker_heartbeat_manager import LATE_FENCE_SESSIONS
from rayk.errors import (
    PreferredLeaderNotAvailableError,
    InvalidConfigurationError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    NotEnoughReplicasError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from rayk.storage import meta_properties
from tests.cluster_helpers import (
    FAST_CONFIG,
    NO_LISTENERS,
    pid_of,
    produce,
    produce_to_leader,
    read_from_leader,
    read_replica,
    shared_local_ray,
    wait_until,
)

_namespaces = itertools.count()
CONFIG = {**FAST_CONFIG, **NO_LISTENERS}  # these tests speak no Kafka protocol


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("shared-cluster")


@pytest.fixture(scope="module")
def shared(shared_dir):
    """One cluster for the tests that neither stop brokers nor count on a fresh cluster
    (each of them uses topics of its own): a cluster start is ~5 s of the suite."""
    c = rayk.start(brokers=3, data_dir=shared_dir, config=CONFIG, namespace=f"local-{next(_namespaces)}")
    yield c
    c.shutdown()


@pytest.fixture
def cluster(tmp_path):
    c = rayk.start(brokers=3, data_dir=tmp_path, config=CONFIG, namespace=f"local-{next(_namespaces)}")
    yield c
    try:
        c.shutdown()
    except Exception:
        pass  # the test shut it down itself


def test_topic_has_a_leader_and_a_full_isr_on_three_brokers(shared):
    cluster = shared
    description = cluster.create_topic("first", num_partitions=3, replication_factor=3, config={"min.insync.replicas": "2"})
    assert [p["partition"] for p in description] == [0, 1, 2]
    for p in description:
        assert sorted(p["replicas"]) == [0, 1, 2] and sorted(p["isr"]) == [0, 1, 2]
        assert p["leader"] == p["replicas"][0] and p["leader_epoch"] == 0
    assert sorted(p["leader"] for p in description) == [0, 1, 2], "leaders spread over brokers"
    result = produce(cluster.leader("first", 1), [b"a", b"b"])
    assert result.error is None and result.base_offset == 0
    after = cluster.describe_topic("first")[1]
    assert after["high_watermark"] == after["log_end_offset"] == 2


# A replica is a process per partition: a data library in it would cost its memory hundreds
# of times over on a node (pyarrow alone adds tens of MiB to a process).
LIBRARIES_NO_REPLICA_LOADS = {"pyarrow", "pandas", "pyspark", "kio", "raydp"}
# Nor the broker's, the Controller's, the listener's or the coordinators' modules: a replica
# reaches its broker and the Controller by name (rayk/actors/named_actor.py), since an
# actor handle in its creation arguments made its process load the handle's class.
RAYK_PACKAGES_NO_REPLICA_LOADS = ("rayk.server", "rayk.controller", "rayk.net", "rayk.coordinator")


def test_replica_processes_load_no_data_libraries_and_none_of_the_broker_s_modules(shared):
    cluster = shared
    cluster.create_topic("lean", num_partitions=2, replication_factor=3)
    produce(cluster.leader("lean", 0), [b"a"])
    handles = [cluster.replica("lean", p, b) for p in range(2) for b in range(3)]
    for handle, modules in zip(handles, ray.get([h.loaded_modules.remote() for h in handles])):
        assert "rayk.replication.partition_replica" in modules, "the answer comes from a replica's own process"
        libraries = {name.partition(".")[0] for name in modules}
        assert LIBRARIES_NO_REPLICA_LOADS.isdisjoint(libraries), (handle, LIBRARIES_NO_REPLICA_LOADS & libraries)
        loaded = sorted(m for m in modules if m.startswith(RAYK_PACKAGES_NO_REPLICA_LOADS))
        assert not loaded, (handle, loaded)


def test_starting_a_cluster_leaves_the_wire_protocol_out_of_the_callers_process():
    # rayk.start imports rayk.broker to create the brokers; the listener's module (and kio,
    # which brings pydantic and hypothesis) is for the brokers' processes only: ~18 MiB and
    # ~25,000 objects that the caller's collector would walk on every full collection.
    check = "import sys, rayk.broker; print(sorted(m for m in ('rayk.net.socket_server', 'kio', 'hypothesis') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


def test_broker_directories_carry_meta_properties(shared, shared_dir):
    cluster_id = ray.get(shared.controller.cluster_id.remote())
    for b in range(3):
        meta = meta_properties.read(shared_dir / f"broker-{b}")
        assert meta is not None and (meta.node_id, meta.cluster_id) == (b, cluster_id)


def test_bad_topic_requests_get_typed_errors(shared):
    cluster = shared
    before = set(cluster.list_topics())
    cluster.create_topic("dup")
    with pytest.raises(TopicAlreadyExistsError):
        cluster.create_topic("dup")
    with pytest.raises(InvalidTopicError):
        cluster.create_topic("no/slash")
    with pytest.raises(InvalidReplicationFactorError):
        cluster.create_topic("big", replication_factor=4)
    with pytest.raises(InvalidConfigurationError):
        cluster.create_topic("cfg", config={"retention.ms": "forever"})
    with pytest.raises(UnknownTopicOrPartitionError):
        cluster.describe_topic("missing")
    with pytest.raises(InvalidConfigurationError):
        rayk.start(brokers=1, data_dir="/tmp/unused", namespace=cluster.namespace)
    assert set(cluster.list_topics()) - before == {"dup"}, "failed requests leave no trace"


def test_min_insync_replicas_comes_from_the_topic_config(shared):
    cluster = shared
    cluster.create_topic("strict", replication_factor=1, config={"min.insync.replicas": "2"})
    result = produce(cluster.leader("strict", 0), [b"x"])
    assert isinstance(result.error, NotEnoughReplicasError)


def test_killed_broker_is_fenced_and_its_leadership_moves_then_it_rejoins(cluster):
    cluster.create_topic("t", replication_factor=3, config={"min.insync.replicas": "2"})
    assert produce(cluster.leader("t", 0), [b"before"]).error is None
    ray.kill(cluster.broker(0))  # broker 0 leads partition 0

    def moved():
        p = cluster.describe_topic("t")[0]
        return p if p["leader"] != 0 and 0 not in p["isr"] else None

    moved_to = wait_until(moved, 15, "a new leader without broker 0 in the ISR")
    assert moved_to["leader_epoch"] == 1 and moved_to["leader"] == 1, "the next replica in assignment order"
    # The Controller's metadata can name the new leader a moment before its replica has
    # been told (NOT_LEADER_OR_FOLLOWER meanwhile, which a client retries, as with Kafka).
    assert produce_to_leader(cluster, "t", 0, [b"after"]).error is None
    cluster.restart_broker(0)
    wait_until(lambda: 0 in cluster.describe_topic("t")[0]["isr"], 20, "broker 0 back in the ISR")
    assert [v for _, v in read_replica(cluster.replica("t", 0, 0))] == [b"before", b"after"]


def test_when_the_last_in_sync_replica_is_lost_an_eligible_replica_leads_with_every_acknowledged_record(cluster):
    """KIP-966's ELR: brokers 1 and 2 crash in turn, so the ISR shrinks below
    min.insync.replicas to the leader alone, whose high watermark then stands still;
    broker 2, the last to leave, stays eligible. When the leader's broker crashes too and
    only broker 2 comes back (uncleanly: its log is compared first), it leads with every
    acknowledged record instead of the partition waiting for broker 0 for good."""
    cluster.create_topic("elr", replication_factor=3, config={"min.insync.replicas": "2"})
    assert produce(cluster.leader("elr", 0), [b"a", b"b"]).error is None
    ray.kill(cluster.broker(1))  # no restart: the broker stays down
    wait_until(lambda: cluster.describe_topic("elr")[0]["isr"] == [0, 2], 15, "broker 1 out of the ISR")
    assert produce(cluster.leader("elr", 0), [b"c"]).error is None
    assert cluster.describe_topic("elr")[0]["eligible_leader_replicas"] == [], "broker 1 may lack c"
    ray.kill(cluster.broker(2))
    wait_until(lambda: ray.get(cluster.leader("elr", 0).describe.remote())["isr"] == [0], 15,
               "broker 2 out of the ISR, as the leader knows it")
    assert cluster.describe_topic("elr")[0]["eligible_leader_replicas"] == [2]
    assert produce(cluster.leader("elr", 0), [b"d"], acks=1).error is None  # only the leader has it
    assert produce(cluster.leader("elr", 0), [b"e"]).error is not None, "acks=all is refused below min ISR"
    assert cluster.describe_topic("elr")[0]["high_watermark"] == 3, "the HW stands still below min.insync.replicas"

    ray.kill(cluster.broker(0))
    wait_until(lambda: cluster.describe_topic("elr")[0]["leader"] == -1, 15, "the partition to lose its leader")
    cluster.restart_broker(2)
    p = wait_until(lambda: (p := cluster.describe_topic("elr")[0])["leader"] == 2 and p, 30, "broker 2 to lead")
    assert p["isr"] == [2] and p["eligible_leader_replicas"] == [0], "broker 0 left an ISR below min.insync.replicas"
    kept = [v for _, v in read_replica(cluster.replica("elr", 0, 2))]
    # Every acks=all record; after them maybe d and e, which broker 2's replica process may
    # have fetched before it followed its killed broker (neither was committed).
    assert kept[:3] == [b"a", b"b", b"c"] and kept[3:] in ([], [b"d"], [b"d", b"e"]), kept
    cluster.restart_broker(1)
    wait_until(lambda: cluster.describe_topic("elr")[0]["isr"] == [1, 2], 30, "broker 1 to catch up from broker 2")
    p = wait_until(lambda: (p := cluster.describe_topic("elr")[0])["high_watermark"] == len(kept) and p, 15, "the HW")
    assert p["eligible_leader_replicas"] == [], "the ISR is back at min.insync.replicas"
    assert produce(cluster.leader("elr", 0), [b"f"]).error is None


def test_leadership_returns_to_the_preferred_replica_by_itself_after_a_failover(tmp_path):
    """auto.leader.rebalance.enable: broker 0 prefers partition 0; while it is away another
    broker leads (an explicit election is refused), and once it is back in sync the
    Controller's imbalance check gives partition 0 back to it."""
    config = {**CONFIG, "leader.imbalance.check.interval.seconds": 1}
    c = rayk.start(brokers=3, data_dir=tmp_path, config=config, namespace=f"local-{next(_namespaces)}")
    try:
        c.create_topic("t", num_partitions=3, replication_factor=3)
        # Every follower in sync first: on a loaded machine a replica process can take longer
        # to start than replica.lag.time.max.ms, and a leader whose ISR shrank to itself has
        # no successor (CI once killed broker 0 while partition 0's ISR was [0]).
        wait_until(lambda: all(len(p["isr"]) == 3 for p in c.describe_topic("t")), 60, "every replica in sync")
        ray.kill(c.broker(0))
        # Ray's report of the death fences broker 0 at once; on a loaded machine the report
        # can be late, and then the Controller fences it as a silent broker Ray still has
        # alive, after LATE_FENCE_SESSIONS session timeouts (16 s here). CI once took longer
        # than 15 s: the bound waited for is that one, with room, and a timeout says what it saw.
        seen = []

        def moved_off_broker_0():
            seen[:] = [c.describe_topic("t")[0], [(b["broker_id"], b["fenced"]) for b in c.brokers()]]
            return seen[0]["leader"] not in (0, -1)

        late_fence_s = LATE_FENCE_SESSIONS * FAST_CONFIG["broker.session.timeout.ms"] / 1000
        try:
            wait_until(moved_off_broker_0, late_fence_s + 15, "partition 0 to move off broker 0")
        except AssertionError as e:
            raise AssertionError(f"{e}; last seen: partition 0 {seen[0]}, brokers (id, fenced) {seen[1]}") from None
        refused = c.admin().elect_leaders()
        assert list(refused) == [TopicPartition("t", 0)] and isinstance(refused[TopicPartition("t", 0)], PreferredLeaderNotAvailableError)
        c.restart_broker(0)
        wait_until(lambda: c.describe_topic("t")[0]["leader"] == 0, 30, "broker 0 to lead partition 0 again")
        assert c.admin().elect_leaders() == {}, "every partition is led by its preferred replica"
        assert [p["leader"] for p in c.describe_topic("t")] == [p["replicas"][0] for p in c.describe_topic("t")]
    finally:
        c.shutdown()


def test_stalled_follower_leaves_the_isr_through_the_controller_and_returns(cluster):
    cluster.create_topic("s", replication_factor=3, config={"min.insync.replicas": "2"})
    before = cluster.describe_topic("s")[0]
    stalled = before["replicas"][2]
    follower = cluster.replica("s", 0, stalled)
    leader = cluster.leader("s", 0)
    os.kill(pid_of(follower), signal.SIGSTOP)  # its process stops: no fetch, no answer
    try:
        assert produce(leader, [b"x"], acks=1).error is None

        def shrunk_partition():
            p = cluster.describe_topic("s")[0]
            return p if stalled not in p["isr"] else None

        shrunk = wait_until(shrunk_partition, 15, "the ISR to shrink")
        assert shrunk["partition_epoch"] > before["partition_epoch"] and shrunk["leader_epoch"] == before["leader_epoch"]
        assert produce(leader, [b"y"]).error is None, "acks=all no longer waits for the stalled follower"
    finally:
        os.kill(pid_of(follower), signal.SIGCONT)
    # Resumed (or, if its broker found it unresponsive meanwhile, replaced), it catches up.
    wait_until(lambda: stalled in cluster.describe_topic("s")[0]["isr"], 15, "the follower to rejoin the ISR")
    copy = wait_until(lambda: cluster.replica("s", 0, stalled), 15, "the follower's replica (a replaced one is re-created)")
    assert [v for _, v in read_replica(copy)] == [b"x", b"y"]


def test_whole_cluster_restart_keeps_topics_leaders_and_data(cluster, tmp_path):
    cluster.create_topic("keep", num_partitions=2, replication_factor=3, config={"min.insync.replicas": "2"})
    # A follower whose process takes longer than replica.lag.time.max.ms to start and fetch
    # (5 s here; a loaded machine) is rightly out of the ISR until it catches up.
    wait_until(lambda: all(len(p["isr"]) == 3 for p in cluster.describe_topic("keep")), 60, "every follower in sync")
    for p in range(2):
        assert produce_to_leader(cluster, "keep", p, [b"p%d-%d" % (p, i) for i in range(50)]).error is None
    before = cluster.describe_topic("keep")
    cluster.shutdown()

    # What is checked here is what the restart itself does, so slow cores must not move
    # anything. Kafka's default lag window: on 2 busy cores the 9 replica processes of the
    # restart can take longer than FAST_CONFIG's 5 s to start and fetch, and a leader would
    # then rightly shrink its ISR. And a session long enough for a ping: while the 12
    # processes start, a replica or a listener can answer no ping for 4-6 s (a CI machine,
    # Ray calls 1.4 ms), and its broker, past FAST_CONFIG's 4 s, would replace it as hung.
    restart_config = {**CONFIG, "replica.lag.time.max.ms": 30_000, "broker.session.timeout.ms": 30_000}
    again = rayk.start(brokers=3, data_dir=tmp_path, config=restart_config, namespace=cluster.namespace)
    try:
        after = again.describe_topic("keep")
        # A clean shutdown (every broker wrote its clean-shutdown marker) keeps leaders and
        # ISRs; each leader is elected again, in a new epoch, as a new broker process.
        assert [(p["leader"], sorted(p["isr"]), p["topic_id"]) for p in after] == [
            (p["leader"], sorted(p["isr"]), p["topic_id"]) for p in before
        ]
        assert all(a["leader_epoch"] > b["leader_epoch"] for a, b in zip(after, before))
        assert all(ray.get(again.broker(b).describe.remote())["clean_shutdown"] for b in range(3))
        # The leaders' offsets come from their replicas, which the Controller knows once
        # each broker has reported its replicas' handles: on loaded cores, after the election.
        def with_offsets() -> list[dict] | None:
            described = again.describe_topic("keep")
            return described if all(p["high_watermark"] is not None for p in described) else None

        after = wait_until(with_offsets, 60, "the leaders' offsets")
        for p in range(2):
            assert after[p]["high_watermark"] == 50, "the HW was checkpointed at shutdown"
            values = [v for _, v in read_from_leader(again, "keep", p, 50)]
            assert values == [b"p%d-%d" % (p, i) for i in range(50)]
        # On loaded cores a broker may replace a replica that answered nothing for its
        # session timeout (as it must a hung one): whichever replica leads has the 50.
        assert produce_to_leader(again, "keep", 0, [b"more"]).base_offset == 50
    finally:
        again.shutdown()


def test_deleted_topic_recreated_under_the_same_name_starts_empty(shared, shared_dir):
    cluster, tmp_path = shared, shared_dir
    cluster.create_topic("again", replication_factor=3)
    assert produce(cluster.leader("again", 0), [b"old"]).error is None
    cluster.delete_topic("again")
    assert "again" not in cluster.list_topics()
    assert not any((tmp_path / f"broker-{b}" / "again-0").exists() for b in range(3))
    cluster.create_topic("again", replication_factor=3)
    assert cluster.describe_topic("again")[0]["log_end_offset"] == 0


def test_a_broker_away_during_a_topic_delete_drops_the_stray_directory(cluster, tmp_path):
    cluster.create_topic("gone", replication_factor=3)
    assert produce(cluster.leader("gone", 0), [b"x"]).error is None
    ray.kill(cluster.broker(2))
    wait_until(lambda: cluster.brokers()[2]["fenced"], 15, "broker 2 to be fenced")
    cluster.delete_topic("gone")
    assert (tmp_path / "broker-2" / "gone-0").exists()
    cluster.restart_broker(2)
    wait_until(lambda: not (tmp_path / "broker-2" / "gone-0").exists(), 15, "the stray directory to go")


def test_consumer_fetch_is_answered_when_data_arrives_through_the_cluster(shared):
    cluster = shared
    cluster.create_topic("wait", replication_factor=3)
    leader = cluster.leader("wait", 0)
    pending = leader.fetch.remote(0, 1 << 20, 1, 5000)
    time.sleep(0.3)
    start = time.monotonic()
    assert produce(leader, [b"now"]).error is None
    result = ray.get(pending)
    assert result.records and time.monotonic() - start < 2.0


def test_the_python_producer_and_consumer_reach_a_leader_over_one_data_plane_connection(shared):
    """Records from and to this process go over the data plane: the leader of an RF=1
    partition (no followers) holds one connection from a producer while it is open, and
    one from a consumer, each closed with its client."""
    cluster = shared
    cluster.create_topic("plane", replication_factor=1)
    leader = cluster.leader("plane", 0)

    def connections() -> int:
        return ray.get(leader.describe.remote())["data_plane_connections"]

    assert connections() == 0
    with cluster.producer(acks="all") as producer:
        offsets = [producer.send("plane", b"v%d" % i).get(timeout=30).offset for i in range(20)]
        assert connections() == 1
    assert offsets == list(range(20))
    wait_until(lambda: connections() == 0, 10, "the producer's connection to close with it")
    with cluster.consumer(auto_offset_reset="earliest", consumer_timeout_ms=3_000) as consumer:
        consumer.assign([TopicPartition("plane", 0)])
        assert [r.value for r in itertools.islice(consumer, 20)] == [b"v%d" % i for i in range(20)]
        assert connections() == 1
    wait_until(lambda: connections() == 0, 10, "the consumer's connection to close with it")


def test_consume_perf_waits_for_the_group_join_before_it_counts_idle_time(shared):
    """The cluster's first group creates __consumer_offsets, which takes seconds: the perf
    consumer (and so `rayk demo`) must not take that for an idle topic. (No other test of
    the shared cluster uses a group.)"""
    cluster = shared
    from rayk.perf import run_consume_perf

    cluster.create_topic("perf-join", num_partitions=2, replication_factor=3)
    assert produce(cluster.leader("perf-join", 0), [b"%d" % i for i in range(100)]).error is None
    figures = run_consume_perf(cluster, "perf-join", 100, group="first-group", timeout_ms=500, progress=False)
    assert figures["records"] == 100 and not figures["timed_out"]
    assert figures["first_record_s"] > 0.5, "joining took longer than the idle timeout: the case under test"


def test_produce_perf_times_every_kth_record_and_counts_them_all(shared):
    from rayk.perf import run_produce_perf

    shared.create_topic("perf-sampled", num_partitions=2, replication_factor=3)
    figures = run_produce_perf(shared, "perf-sampled", 1_000, 50, latency_sample_every=10, progress=False)
    assert (figures["records"], figures["errors"], figures["latency_samples"]) == (1_000, 0, 100)
    assert 0 < figures["latency_p50_ms"] <= figures["latency_max_ms"]
    assert sum(p["high_watermark"] for p in shared.describe_topic("perf-sampled")) == 1_000
    every = run_produce_perf(shared, "perf-sampled", 30, 50, progress=False)
    assert (every["records"], every["latency_samples"]) == (30, 30)
    with pytest.raises(ValueError, match="latency_sample_every"):
        run_produce_perf(shared, "perf-sampled", 10, 50, latency_sample_every=0, progress=False)


def test_a_replica_that_led_an_epoch_without_appending_rejoins_the_isr_once_the_preferred_leader_is_back(shared):
    """Issue 66's stuck follower, end to end: the leader's replica is SIGKILLed; another ISR
    member leads epoch 1 and appends nothing; the killed replica comes back, rejoins the ISR
    and leads again (a preferred election, epoch 2); then acks=all records flow for longer
    than replica.lag.time.max.ms. The replica that led epoch 1 held an entry (1, LEO) the new
    leader never had: before the fix it fetched "diverging" for good and the ISR stayed at two."""
    c = shared
    c.create_topic("stuck", num_partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    wait_until(lambda: len(c.describe_topic("stuck")[0]["isr"]) == 3, 60, "every replica in sync")
    with c.producer(acks="all") as producer:
        for i in range(100):
            producer.send("stuck", value=b"before-%d" % i)
    before = c.describe_topic("stuck")[0]
    preferred = before["replicas"][0]
    assert before["leader"] == preferred
    os.kill(pid_of(c.replica("stuck", 0, preferred)), signal.SIGKILL)
    moved = wait_until(
        lambda: (p := c.describe_topic("stuck")[0])["leader"] not in (preferred, -1) and p, 30, "another ISR member to lead"
    )
    assert moved["leader_epoch"] > before["leader_epoch"] and moved["log_end_offset"] == 100, "it appended nothing"
    wait_until(lambda: len(c.describe_topic("stuck")[0]["isr"]) == 3, 60, "the killed replica back in the ISR")
    assert c.admin().elect_leaders([TopicPartition("stuck", 0)]) == {TopicPartition("stuck", 0): None}
    back = wait_until(lambda: (p := c.describe_topic("stuck")[0])["leader"] == preferred and p, 30, "the preferred leader")
    assert back["leader_epoch"] > moved["leader_epoch"]
    lag_s = FAST_CONFIG["replica.lag.time.max.ms"] / 1000
    deadline = time.monotonic() + 2 * lag_s
    sent = 0
    with c.producer(acks="all", linger_ms=5) as producer:
        while time.monotonic() < deadline or len(c.describe_topic("stuck")[0]["isr"]) < 3:
            assert time.monotonic() < deadline + 30, f"the ISR stayed {c.describe_topic('stuck')[0]['isr']}"
            for i in range(20):
                producer.send("stuck", value=b"after-%d" % (sent + i))
            producer.flush()
            sent += 20
            time.sleep(0.1)
    after = c.describe_topic("stuck")[0]
    assert sorted(after["isr"]) == sorted(before["replicas"]) and after["high_watermark"] == 100 + sent
    for broker_id in before["replicas"]:  # and every replica holds every record
        wait_until(lambda b=broker_id: ray.get(c.replica("stuck", 0, b).describe.remote())["log_end_offset"] == 100 + sent,
                   30, f"broker {broker_id}'s copy")
