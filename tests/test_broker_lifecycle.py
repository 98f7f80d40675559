"""Brokers join and leave a running cluster (Cluster.add_broker / remove_broker, `rayk
brokers`), on one local Ray node, with acks=all records flowing: a new broker registers
and Kafka's clients see it in Metadata; a removed broker's replicas move to the others
first (never below min.insync.replicas), then it stops, its directory goes and it leaves
Metadata; a removal the others cannot hold is refused, changing nothing; started again
on its directory, the cluster has the brokers it stopped with."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import confluent_kafka.admin
import pytest

import rayk
from rayk.cli import main as cli_main
from rayk.client.cluster import brokers_to_start
from rayk.errors import BrokerNotAvailableError, PolicyViolationError
from tests import readme
from tests.cluster_helpers import FAST_CONFIG, shared_local_ray, wait_until
from tests.faults.harness import (
    PARTITIONS, TOPIC, Traffic, check, healthy, lost_and_duplicated, read_partition, run_until_acked,
)

_namespaces = itertools.count()
README_BROKERS = "rayk brokers add        # a new broker joins; the balancer moves its share of the replicas and leaders to it"
CONFIG = {**FAST_CONFIG, "auto.balance.enable": "false"}  # the moves counted here are the decommissioning's alone


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    shared_local_ray()


@pytest.fixture
def cluster(tmp_path, request):
    config = getattr(request, "param", CONFIG)  # (a test may ask for its own: parametrize indirectly)
    c = rayk.start(brokers=3, data_dir=tmp_path, config=config, namespace=f"lifecycle-{next(_namespaces)}")
    yield c
    c.shutdown()


def kafka_brokers(cluster) -> set[int]:
    """The broker ids a Kafka client's Metadata request returns."""
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    return set(admin.list_topics(timeout=20).brokers)


class IsrWatch:
    """The smallest ISR any partition of TOPIC had, sampled until stopped."""

    def __init__(self, cluster) -> None:
        self.cluster, self.smallest, self._stop = cluster, None, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            sizes = [len(p["isr"]) for p in self.cluster.describe_topic(TOPIC)]
            self.smallest = min([*sizes, *([self.smallest] if self.smallest is not None else [])])

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.smallest


def test_a_broker_added_and_another_removed_while_records_flow_loses_nothing(cluster, tmp_path):
    cluster.create_topic(TOPIC, num_partitions=PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
    traffic = Traffic(cluster)
    run_until_acked(traffic, 500)

    added = cluster.add_broker()
    assert added == 3
    assert {b["broker_id"] for b in cluster.brokers()} == {0, 1, 2, 3}
    wait_until(lambda: kafka_brokers(cluster) == {0, 1, 2, 3}, 30, "Kafka's clients to see broker 3")

    watch = IsrWatch(cluster)
    cluster.remove_broker(0, timeout_ms=120_000)
    smallest_isr = watch.stop()
    run_until_acked(traffic, 500)
    assert {b["broker_id"] for b in cluster.brokers()} == {1, 2, 3}
    assert all(0 not in p["replicas"] and len(p["replicas"]) == 3 for p in cluster.describe_topic(TOPIC))
    assert not (Path(tmp_path) / "broker-0").exists(), "its data directory is released"
    wait_until(lambda: kafka_brokers(cluster) == {1, 2, 3}, 30, "Kafka's clients to stop seeing broker 0")
    assert smallest_isr >= 2, f"a partition went below min.insync.replicas: ISR of {smallest_isr}"
    outcome = check(cluster, traffic, "broker 3 added, broker 0 removed", 0.0)
    assert "NOT_ENOUGH_REPLICAS" not in outcome.failed

    # Started again on its directory, the cluster has the brokers it stopped with: 3, not 0.
    cluster.shutdown()
    again = rayk.start(brokers=3, data_dir=tmp_path, config=CONFIG, namespace=cluster.namespace)
    try:
        assert {b["broker_id"] for b in again.brokers()} == {1, 2, 3}
        assert not (Path(tmp_path) / "broker-0").exists(), "no broker 0 formatted anew"
        wait_until(lambda: healthy(again), 90, "every partition led, with its full ISR")
        stored = {p: read_partition(again, p) for p in range(PARTITIONS)}
        lost, duplicated = lost_and_duplicated(traffic, stored)
        assert not lost and not duplicated, f"after the restart: {len(lost)} lost, {len(duplicated)} duplicated"
    finally:
        again.shutdown()


@pytest.mark.parametrize("registered, brokers, started", [
    ([], 3, [0, 1, 2]),  # a new data directory
    ([0, 1, 2], 3, [0, 1, 2]),
    ([1, 2, 3], 3, [1, 2, 3]),  # 3 added, 0 removed
    ([1, 2, 3], 4, [1, 2, 3, 4]),  # one more
    ([0, 2, 5, 7], 3, [0, 2, 5]),  # more registered than asked for: the lowest ids (the rest stay down)
    ([4], 3, [4, 5, 6]),
])
def test_start_brings_back_every_registered_broker_then_adds_new_ids(registered, brokers, started):
    assert brokers_to_start(registered, brokers) == started


def test_a_removal_the_other_brokers_cannot_hold_is_refused_and_changes_nothing(cluster):
    cluster.create_topic("wide", num_partitions=2, replication_factor=3)
    before = cluster.describe_topic("wide")
    with pytest.raises(PolicyViolationError, match="add a broker first"):
        cluster.remove_broker(1)
    assert not any(b["decommissioning"] for b in cluster.brokers())
    assert [p["replicas"] for p in cluster.describe_topic("wide")] == [p["replicas"] for p in before]
    with pytest.raises(BrokerNotAvailableError):
        cluster.remove_broker(7)


@pytest.mark.parametrize("cluster", [FAST_CONFIG], indirect=True, ids=["balancer on"])
def test_the_quickstart_s_broker_commands_run_as_written(cluster, capsys):
    """README's Quickstart grows a cluster in three lines: `rayk brokers add`, `list`,
    `remove 0`, each run as written against this test's cluster (its Ray namespace added),
    with the balancer on, as by default: it gives the new broker its share and moves the
    leaving one's replicas."""
    commands = readme.shell_commands(readme.block(README_BROKERS))
    assert [c[:3] for c in commands] == [["rayk", "brokers", "add"], ["rayk", "brokers", "list"],
                                         ["rayk", "brokers", "remove"]]
    cluster.create_topic(TOPIC, num_partitions=3, replication_factor=3, config={"min.insync.replicas": "2"})
    said = []
    for command in commands:
        assert cli_main([*command[1:], "--namespace", cluster.namespace]) == 0, command
        said.append(capsys.readouterr().out)
    added, listed, removed = said
    assert "broker 3 added" in added
    assert [line.split()[0] for line in listed.splitlines()[1:] if line.strip()] == ["0", "1", "2", "3"], listed
    assert "broker 0 decommissioned" in removed
    assert {b["broker_id"] for b in cluster.brokers()} == {1, 2, 3}
    assert all(0 not in p["replicas"] and len(p["isr"]) == 3 for p in cluster.describe_topic(TOPIC))
    assert cli_main(["brokers", "remove", "7", "--namespace", cluster.namespace]) == 1
    assert "BROKER_NOT_AVAILABLE" in capsys.readouterr().err, "a mistake is one line on stderr"
