"""max.replicas.per.broker: a broker's cap on partition replicas (each one a process),
derived from its node's memory unless set. CreateTopics and CreatePartitions past it fail
with POLICY_VIOLATION naming the limit, over the wire and from Python, and create
nothing; a request that fits still works."""

from __future__ import annotations

from collections import Counter

import pytest
from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
from kafka.errors import PolicyViolationError as KafkaPolicyViolation

import rayk
from rayk.server.replica_capacity import REPLICA_NODE_MEMORY_BYTES, check_replica_caps, derived_cap, replica_caps
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


def test_the_check_names_each_broker_past_its_cap_and_lets_the_others_be():
    check_replica_caps(Counter({0: 5}), [0], {0: 6}, configured=True)
    with pytest.raises(PolicyViolationError, match=r"broker 0 would hold 7 \(cap 6\).*max.replicas.per.broker"):
        check_replica_caps(Counter({0: 5}), [0, 0, 1], {0: 6, 1: 6}, configured=True)
    with pytest.raises(PolicyViolationError, match="derived from node memory"):
        check_replica_caps(Counter(), [0] * 3, {0: 2}, configured=False)
    check_replica_caps(Counter({0: 9}), [1], {0: 6, 1: 6}, configured=True)  # broker 0 gains nothing


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
