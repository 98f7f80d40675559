"""max.replicas.per.broker: a broker's cap on partition replicas (each one a process),
derived from its node's memory and cores unless set. CreateTopics and CreatePartitions
past it fail with POLICY_VIOLATION naming the limit, over the wire and from Python, and
create nothing; a request that fits still works."""

from __future__ import annotations

from collections import Counter

import pytest
from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
from kafka.errors import PolicyViolationError as KafkaPolicyViolation

import rayk
from rayk.server.replica_capacity import (
    REPLICA_NODE_MEMORY_BYTES, check_replica_caps, derived_cap, node_capacity, replica_caps, replicas_over,
)
from rayk.errors import PolicyViolationError
from tests.cluster_helpers import FAST_CONFIG, shared_local_ray

CAP = 6
GiB = 1 << 30


def test_the_derived_cap_shares_most_of_a_nodes_memory_among_its_brokers():
    assert derived_cap(24 * GiB, 1) == int(24 * GiB * 0.8) // REPLICA_NODE_MEMORY_BYTES == 385
    assert derived_cap(24 * GiB, 3) == 385 // 3
    assert derived_cap(1 << 20, 1) == 1, "every broker may hold a replica"
    caps = replica_caps(-1, {0: 24 * GiB, 1: 24 * GiB, 2: 8 * GiB}, {0: "a", 1: "a", 2: "b"})
    assert caps == {0: 192, 1: 192, 2: 128}
    assert replica_caps(10, {}, {0: "a", 1: "b"}) == {0: 10, 1: 10}


def test_a_nodes_capacity_is_the_smaller_of_what_its_memory_and_its_cores_hold():
    assert node_capacity(24 * GiB, 2) == node_capacity(24 * GiB, 2.0)
    assert (node_capacity(24 * GiB, 2).by_cpu, node_capacity(24 * GiB, 2).replicas) == (60, 60), "30% of 2 cores at 1% each"
    assert node_capacity(24 * GiB, 2).bound == "node CPU"
    assert node_capacity(24 * GiB, 64).replicas == 385 and node_capacity(24 * GiB, 64).bound == "node memory"
    assert node_capacity(24 * GiB, 0).replicas == 385, "a broker that reported no cores: memory alone"
    assert derived_cap(24 * GiB, 3, node_cpus=2) == 20
    caps = replica_caps(-1, {0: 24 * GiB, 1: 24 * GiB, 2: 24 * GiB}, {0: "a", 1: "a", 2: "b"}, {0: 2, 1: 2, 2: 16})
    assert caps == {0: 30, 1: 30, 2: 385}


def test_the_check_names_each_broker_past_its_cap_and_lets_the_others_be():
    check_replica_caps(Counter({0: 5}), [0], {0: 6}, configured=True)
    with pytest.raises(PolicyViolationError, match=r"broker 0 would hold 7 \(cap 6, 1 over\).*max.replicas.per.broker"):
        check_replica_caps(Counter({0: 5}), [0, 0, 1], {0: 6, 1: 6}, configured=True)
    with pytest.raises(PolicyViolationError, match="derived from node memory"):
        check_replica_caps(Counter(), [0] * 3, {0: 2}, configured=False)
    with pytest.raises(PolicyViolationError, match="derived from node CPU"):
        check_replica_caps(Counter(), [0] * 21, {0: 20}, configured=False, bounds={0: node_capacity(24 * GiB, 2)})
    check_replica_caps(Counter({0: 9}), [1], {0: 6, 1: 6}, configured=True)  # broker 0 gains nothing


def test_what_a_placement_misses_is_counted_per_broker_for_whoever_can_add_nodes():
    assert replicas_over(Counter({0: 5, 1: 6}), [0, 0, 0, 1, 2], {0: 6, 1: 6, 2: 6}) == {0: 2, 1: 1}
    assert replicas_over(Counter({0: 9}), [1], {0: 6, 1: 6}) == {}, "over already, but gaining nothing"
    assert replicas_over(Counter(), [0, 1], {0: 1, 1: 1}) == {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    shared_local_ray()
    c = rayk.start(brokers=1, data_dir=tmp_path_factory.mktemp("caps"),
                   config={**FAST_CONFIG, "max.replicas.per.broker": CAP}, namespace="replica-caps")
    yield c
    c.shutdown()


def test_creates_past_the_cap_are_policy_violations_and_create_nothing(cluster):
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.create_topics([NewTopic("four", num_partitions=4, replication_factor=1)])
        for validate_only in (True, False):
            with pytest.raises(KafkaPolicyViolation, match="max.replicas.per.broker"):
                admin.create_topics([NewTopic("three", num_partitions=3, replication_factor=1)], validate_only=validate_only)
        with pytest.raises(KafkaPolicyViolation):
            admin.create_partitions({"four": NewPartitions(total_count=7)})
        with pytest.raises(PolicyViolationError, match="broker 0 would hold 10"):
            cluster.create_topic("from-python", num_partitions=6, replication_factor=1)
        assert sorted(cluster.list_topics()) == ["four"] and len(cluster.describe_topic("four")) == 4
        admin.create_partitions({"four": NewPartitions(total_count=6)})  # exactly the cap
        assert len(cluster.describe_topic("four")) == 6
    finally:
        admin.close()


def test_on_this_machine_three_brokers_refuse_a_topic_past_the_computed_capacity(tmp_path):
    """No cap set: what this machine's memory and cores hold, shared by its 3 brokers (on
    2 cores, CPU binds: 20 replicas each). Up to it, topics are accepted; past it, refused."""
    from ray._private.utils import get_num_cpus, get_system_memory

    shared_local_ray()
    node = node_capacity(get_system_memory(), get_num_cpus())
    cap = derived_cap(get_system_memory(), 3, get_num_cpus())
    c = rayk.start(brokers=3, data_dir=tmp_path, config=FAST_CONFIG, namespace="replica-caps-derived")
    try:
        c.create_topic("within", num_partitions=2, replication_factor=3)
        admin = c.admin()
        admin.create_partitions({"within": cap}, validate_only=True)  # every broker exactly at its cap
        with pytest.raises(PolicyViolationError, match=f"would hold {cap + 1} \\(cap {cap}, 1 over\\).*derived from {node.bound}"):
            c.create_topic("past", num_partitions=cap - 1, replication_factor=3)
        with pytest.raises(PolicyViolationError):
            admin.create_partitions({"within": cap + 1}, validate_only=True)
        assert sorted(c.list_topics()) == ["within"] and len(c.describe_topic("within")) == 2
    finally:
        c.shutdown()
