"""Process faults on a Ray cluster of a head and 3 broker nodes, under continuous
acks=all idempotent production: SIGKILL of a leader replica, a follower replica, a
broker (ReplicaManager), the Controller; SIGSTOP of a leader replica past the session
timeout (a zombie); and kill -9 of every rayk process at once."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
import ray

from tests.cluster_helpers import shared_broker_node_cluster, wait_until
from tests.faults.harness import (
    PARTITIONS,
    RESUME_BOUND_S,
    SESSION_TIMEOUT_MS,
    TOPIC,
    WITH_LISTENERS,
    Traffic,
    check,
    kill_all,
    live_rayk_actor_pids,
    pid_of,
    run_until_acked,
    signal_actor,
    start_rayk,
)

RUNS_ON = "broker nodes"  # shared_broker_node_cluster: tests/conftest.py runs these modules first


@pytest.fixture(scope="module")
def ray_cluster():
    return shared_broker_node_cluster()


@pytest.fixture
def rayk_cluster(ray_cluster, tmp_path, request):
    c = start_rayk(tmp_path, config=getattr(request, "param", None))
    c.create_topic(TOPIC, num_partitions=PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
    yield c
    try:
        c.shutdown()
    except Exception:
        pass  # the test's fault took it down


def partition_state(c, partition: int = 0) -> dict:
    return c.describe_topic(TOPIC)[partition]


def test_sigkill_of_a_leader_replica_moves_leadership_and_the_replica_comes_back(rayk_cluster):
    c = rayk_cluster
    traffic = Traffic(c)
    run_until_acked(traffic, 2_000)
    # Leadership can move only to another in-sync replica: on a loaded machine a follower
    # may be out of the ISR for a while (CI once had the leader alone in it, and the
    # restarted replica led again).
    wait_until(lambda: len(partition_state(c)["isr"]) == 3, 60, "the full ISR")
    before = partition_state(c)
    signal_actor(c.leader(TOPIC, 0), signal.SIGKILL)
    t0 = time.monotonic()  # after the fault (see wait_resumed)
    resume_s = traffic.wait_resumed(t0)
    after = partition_state(c)
    assert after["leader"] != before["leader"] and after["leader_epoch"] > before["leader_epoch"]
    run_until_acked(traffic, 1_000)
    check(c, traffic, "SIGKILL of a leader replica", resume_s)
    assert not any(b["fenced"] for b in c.brokers()), "a replica failure is not a broker failure"


def test_sigkill_of_a_follower_replica_leaves_the_leader_and_the_replica_comes_back(rayk_cluster):
    c = rayk_cluster
    traffic = Traffic(c)
    run_until_acked(traffic, 2_000)
    before = partition_state(c)
    follower = next(b for b in before["replicas"] if b != before["leader"])
    signal_actor(c.replica(TOPIC, 0, follower), signal.SIGKILL)
    t0 = time.monotonic()  # after the fault (see wait_resumed)
    resume_s = traffic.wait_resumed(t0)
    assert partition_state(c)["leader"] == before["leader"]
    run_until_acked(traffic, 1_000)
    check(c, traffic, "SIGKILL of a follower replica", resume_s)
    assert not any(b["fenced"] for b in c.brokers())


def test_sigkill_of_a_broker_process_is_restarted_by_ray_and_rejoins(rayk_cluster):
    c = rayk_cluster
    traffic = Traffic(c)
    run_until_acked(traffic, 2_000)
    broker = partition_state(c)["leader"]
    before = ray.get(c.broker(broker).describe.remote())
    signal_actor(c.broker(broker), signal.SIGKILL)
    t0 = time.monotonic()  # after the fault (see wait_resumed)
    resume_s = traffic.wait_resumed(t0)

    def restarted():
        try:
            return ray.get(c.broker(broker).describe.remote(), timeout=5)
        except Exception:
            return None

    after = wait_until(lambda: (d := restarted()) and d["broker_epoch"] > before["broker_epoch"] and d, 60, "the broker to restart")
    assert after["incarnation_id"] != before["incarnation_id"] and not after["clean_shutdown"]
    run_until_acked(traffic, 1_000)
    check(c, traffic, "SIGKILL of a ReplicaManager", resume_s)


def test_sigkill_of_the_controller_is_restarted_by_ray_and_clients_ride_through(rayk_cluster):
    c = rayk_cluster
    traffic = Traffic(c)
    run_until_acked(traffic, 2_000)
    old_pid = pid_of(c.controller)
    signal_actor(c.controller, signal.SIGKILL)
    t0 = time.monotonic()  # after the fault (see wait_resumed)
    wait_until(lambda: pid_of(c.controller) not in (old_pid, None, 0), 60, "Ray to restart the Controller")
    resume_s = traffic.wait_resumed(t0)
    run_until_acked(traffic, 1_000)
    check(c, traffic, "SIGKILL of the Controller", resume_s)
    assert sorted(b["broker_id"] for b in c.brokers() if b["connected"] and not b["fenced"]) == [0, 1, 2]


def test_sigstop_of_a_leader_replica_past_the_session_timeout_then_sigcont(rayk_cluster):
    c = rayk_cluster
    traffic = Traffic(c)
    run_until_acked(traffic, 2_000)
    before = partition_state(c)
    pid = signal_actor(c.leader(TOPIC, 0), signal.SIGSTOP)
    t0 = time.monotonic()  # after the fault (see wait_resumed)
    resume_s = traffic.wait_resumed(t0)
    time.sleep(max(0.0, SESSION_TIMEOUT_MS / 1000 + 2 - (time.monotonic() - t0)))
    try:
        os.kill(pid, signal.SIGCONT)  # the zombie wakes up, if its broker has not killed it
    except ProcessLookupError:
        pass
    after = partition_state(c)
    assert after["leader"] != before["leader"] and after["leader_epoch"] > before["leader_epoch"]
    run_until_acked(traffic, 1_000)
    check(c, traffic, "SIGSTOP of a leader replica, then SIGCONT", resume_s)


# Everything killed at once is not one failure for the session timeout to cover: Ray starts
# every rayk process again (the Controller, which replays its metadata, 3 brokers, their
# listeners and ~16 replicas, 1-2 s of imports each on 2 cores), and a partition takes
# acks=all writes only once a follower is back in its ISR. Measured here on 2026-12-03:
# 26.7-34.4 s at every commit back to before that day's changes (the single-failure bound,
# 18 s, had passed by luck); a hang still fails it.
KILL_ALL_RESUME_BOUND_S = RESUME_BOUND_S + 30


def test_kill_9_of_every_rayk_process_at_once(rayk_cluster):
    c = rayk_cluster
    traffic = Traffic(c)
    run_until_acked(traffic, 2_000)
    pids = live_rayk_actor_pids()
    assert len(pids) >= 1 + 3 + 3 * PARTITIONS, pids  # Controller, brokers, listeners, replicas
    kill_all(pids)
    t0 = time.monotonic()  # after the fault (see wait_resumed)
    resume_s = traffic.wait_resumed(t0, KILL_ALL_RESUME_BOUND_S)
    run_until_acked(traffic, 1_000)
    check(c, traffic, "kill -9 of every rayk process", resume_s)


def accepts(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=1).close()
        return True
    except OSError:
        return False


def live_listener_pids() -> set[int]:
    return {info["Pid"] for info in ray._private.state.actors().values()
            if info["ActorClassName"] == "SocketServerActor" and info["State"] == "ALIVE" and info["Pid"]}  # fmt: skip


@pytest.mark.parametrize("rayk_cluster", [WITH_LISTENERS], indirect=True, ids=["listeners"])
def test_sigkill_of_a_brokers_kafka_listener_brings_it_back_on_its_port_for_clients_bootstrapped_before(rayk_cluster):
    """Listeners on port 0 (any free port): a restarted one used to come back on a new port,
    and clients' bootstrap lists pointed at a closed one."""
    import confluent_kafka

    c = rayk_cluster
    before = {b["broker_id"]: b["endpoints"] for b in c.brokers()}
    bootstrap = c.bootstrap_servers  # what clients were handed before the fault
    pids = wait_until(lambda: found if len(found := live_listener_pids()) == 3 else None, 30, "3 listeners")
    killed = sorted(pids)[0]
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: len(live_listener_pids() - pids) == 1 and len(live_listener_pids()) == 3, 60, "a new listener")
    addresses = [address for endpoints in before.values() for address in endpoints.values()]
    wait_until(lambda: all(accepts(address) for address in addresses), 60, "every listener back on the port it had")
    wait_until(lambda: {b["broker_id"]: b["endpoints"] for b in c.brokers()} == before, 30, "the same addresses advertised")
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    delivered = []
    for p in range(PARTITIONS):  # every broker leads a partition: every listener is used
        producer.produce(TOPIC, value=b"after", partition=p, on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(30) == 0 and delivered == [None] * PARTITIONS
