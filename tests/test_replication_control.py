"""ReplicationControlManager with only the managers it reads (cluster, configs): placement,
what a broker's fencing and return mean for its partitions, and the image. The election
rules themselves are tested through the whole image in test_cluster_metadata.py."""

from __future__ import annotations

import pytest

from rayk.config import BrokerConfig
from rayk.errors import UnknownTopicOrPartitionError
from rayk.metadata.cluster_control import ClusterControlManager
from rayk.metadata.config_control import ConfigurationControlManager
from rayk.metadata.elections import NO_LEADER
from rayk.metadata.records import MetadataRecord, PartitionRecord, TopicRecord
from rayk.metadata.replication_control import ReplicationControlManager


class Domains:
    """The three managers, fed each record at the next offset as ClusterMetadata would."""

    def __init__(self, brokers: dict[int, str]) -> None:
        self.cluster = ClusterControlManager()
        self.configs = ConfigurationControlManager(BrokerConfig())
        self.replication = ReplicationControlManager(self.cluster, self.configs)
        self.offset = 0
        for broker_id, node in brokers.items():
            self.commit(self.cluster.plan_register(broker_id, node, f"p{broker_id}", f"d{broker_id}", True)[0])
            self.cluster.attached.add(broker_id)

    def commit(self, records: list[MetadataRecord]) -> None:
        for record in records:
            for manager in (self.cluster, self.configs, self.replication):
                handler = manager.handlers().get(type(record))
                if handler is not None:
                    handler(record, self.offset)
            self.offset += 1


def test_a_topic_is_placed_on_distinct_nodes_with_leaders_spread():
    d = Domains({1: "a", 2: "b", 3: "c"})
    records = d.replication.plan_create_topic("orders", 3, 2, {"retention.ms": "5"}, "orders-id")
    assert records[0] == TopicRecord("orders", "orders-id", {"retention.ms": "5"})
    d.commit(records)
    states = [d.replication.partition("orders", p) for p in range(3)]
    assert [s.leader for s in states] == [1, 2, 3]
    assert all(len({d.cluster.brokers[b].node_id for b in s.replicas}) == 2 for s in states)
    assert d.configs.of("orders") == {"retention.ms": "5"}


def test_a_fenced_broker_leaves_the_isrs_it_can_and_its_leaderships_move():
    d = Domains({1: "a", 2: "b"})
    d.commit(d.replication.plan_create_topic("t", 2, 2, {}, "t-id"))
    records = d.replication.on_broker_fenced(1)
    assert all(isinstance(r, PartitionRecord) for r in records)
    d.commit(d.cluster.plan_fence(1, None) + records)
    for p in range(2):
        state = d.replication.partition("t", p)
        assert (state.leader, state.isr) == (2, (2,))


def test_the_last_copy_returning_leads_its_leaderless_partition_again():
    d = Domains({1: "a"})
    d.commit(d.replication.plan_create_topic("t", 1, 1, {}, "t-id"))
    d.commit(d.cluster.plan_fence(1, None) + d.replication.on_broker_fenced(1))
    d.cluster.attached.discard(1)
    assert d.replication.partition("t", 0).leader == NO_LEADER
    records, registration = d.cluster.plan_register(1, "a", "p1", "d1", True)
    d.commit(records + d.replication.on_broker_registered(1, registration, True))
    assert d.replication.partition("t", 0).leader == 1


def test_the_image_rebuilds_topics_with_their_configs_and_partitions():
    d = Domains({1: "a", 2: "b"})
    d.commit(d.replication.plan_create_topic("t", 2, 2, {"k": "v"}, "t-id"))
    again = Domains({1: "a", 2: "b"})
    again.commit(d.replication.image_records())
    assert again.replication.topics == d.replication.topics and again.configs.of("t") == {"k": "v"}
    again.commit(again.replication.plan_delete_topic("t"))
    with pytest.raises(UnknownTopicOrPartitionError):
        again.replication.partition("t", 0)
