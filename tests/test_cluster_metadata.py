"""ClusterMetadata: the Controller's decisions (assignment, elections, ISR changes), without Ray."""

from __future__ import annotations

from collections import Counter

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rayk.actors.cluster_metadata import (
    NO_LEADER,
    ClusterMetadata,
    PartitionState,
    assign_replicas,
    elect,
)
from rayk.config import UNCLEAN_LEADER_ELECTION_ENABLE, BrokerConfig
from rayk.errors import (
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    InvalidUpdateVersionError,
    NotLeaderOrFollowerError,
    StaleBrokerEpochError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

UNCLEAN = {UNCLEAN_LEADER_ELECTION_ENABLE: "true"}


# --- helpers ------------------------------------------------------------------------


class Cluster:
    """A ClusterMetadata plus the records applied to it, at contiguous offsets."""

    def __init__(self, brokers: dict[int, str] | None = None, config: BrokerConfig | None = None) -> None:
        self.config = config
        self.meta = ClusterMetadata(config)
        self.log: list[tuple[int, dict]] = []
        self.commit([{"type": "cluster", "cluster_id": "test-cluster"}])
        for broker_id, node in (brokers or {}).items():
            self.commit(self.meta.plan_register_broker(broker_id, node))

    def commit(self, records: list[dict]) -> list[dict]:
        for record in records:
            offset = len(self.log)
            self.meta.apply(record, offset)
            self.log.append((offset, record))
        return records

    def create(self, name: str = "t", partitions: int = 1, rf: int = 3, configs: dict | None = None) -> list[dict]:
        return self.commit(self.meta.plan_create_topic(name, partitions, rf, configs or {}, f"id-{name}"))

    def fence(self, broker_id: int) -> list[dict]:
        return self.commit(self.meta.plan_fence_broker(broker_id))

    def register(self, broker_id: int, node: str) -> list[dict]:
        return self.commit(self.meta.plan_register_broker(broker_id, node))

    def alter(self, topic: str, partition: int, isr: list[int]) -> list[dict]:
        s = self.meta.partition(topic, partition)
        return self.commit(
            self.meta.plan_alter_partition(topic, partition, s.leader, s.leader_epoch, s.partition_epoch, isr)
        )

    def state(self, topic: str = "t", partition: int = 0) -> PartitionState:
        return self.meta.partition(topic, partition)


def three_nodes() -> Cluster:
    return Cluster({1: "a", 2: "b", 3: "c"})


def partition_records(records: list[dict]) -> list[dict]:
    return [r for r in records if r["type"] == "partition"]


def replay(log: list[tuple[int, dict]], config: BrokerConfig | None = None) -> ClusterMetadata:
    """A fresh ClusterMetadata from the records, each through msgpack as the MetadataLog stores it."""
    meta = ClusterMetadata(config)
    for offset, record in log:
        meta.apply(msgpack.unpackb(msgpack.packb(record)), offset)
    return meta


def brokers_on_nodes(nodes: int, per_node: int) -> dict[int, str]:
    """Broker ids 1.. with `per_node` brokers on each of `nodes` nodes (node of b: (b-1) % nodes)."""
    return {b: f"node-{(b - 1) % nodes}" for b in range(1, nodes * per_node + 1)}


# --- assign_replicas ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "per_node", "rf"),
    [(n, k, rf) for n, k in [(3, 1), (3, 2), (2, 2), (2, 3), (4, 2)] for rf in (1, 2, 3) if rf <= n],
)
def test_assign_replicas_puts_each_partitions_replicas_on_distinct_nodes(nodes, per_node, rf):
    broker_nodes = brokers_on_nodes(nodes, per_node)
    for start in range(len(broker_nodes) + 1):
        for replicas in assign_replicas(2 * len(broker_nodes), rf, broker_nodes, start):
            assert len(replicas) == rf
            assert len({broker_nodes[b] for b in replicas}) == rf, (replicas, start)


@settings(max_examples=100, deadline=None)
@given(
    nodes=st.integers(1, 4),
    per_node=st.integers(1, 3),
    partitions=st.integers(1, 24),
    start=st.integers(0, 50),
    data=st.data(),
)
def test_assign_replicas_property_distinct_nodes_and_distinct_brokers(nodes, per_node, partitions, start, data):
    broker_nodes = brokers_on_nodes(nodes, per_node)
    rf = data.draw(st.integers(1, len(broker_nodes)))
    assignment = assign_replicas(partitions, rf, broker_nodes, start)
    assert len(assignment) == partitions
    for replicas in assignment:
        assert len(set(replicas)) == rf
        assert set(replicas) <= set(broker_nodes)
        assert len({broker_nodes[b] for b in replicas}) == min(rf, nodes)


def test_assign_replicas_interleaves_nodes_in_a_fixed_order():
    # Nodes a: 1, 2; b: 3, 4; c: 5, 6 -> cyclic order 1, 3, 5, 2, 4, 6.
    broker_nodes = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    assert assign_replicas(6, 2, broker_nodes, 0) == [(1, 3), (3, 5), (5, 2), (2, 4), (4, 6), (6, 1)]


def test_assign_replicas_starts_at_the_start_index():
    broker_nodes = {1: "a", 2: "b", 3: "c"}
    assert assign_replicas(2, 3, broker_nodes, 1) == [(2, 3, 1), (3, 1, 2)]
    assert assign_replicas(1, 1, broker_nodes, 5) == [(3,)]


@pytest.mark.parametrize(("nodes", "per_node"), [(3, 1), (3, 2), (2, 3)])
@pytest.mark.parametrize("rf", [1, 2, 3])
def test_assign_replicas_spreads_leaders_and_replicas_evenly_over_brokers(nodes, per_node, rf):
    broker_nodes = brokers_on_nodes(nodes, per_node)
    n = len(broker_nodes)
    assignment = assign_replicas(3 * n, rf, broker_nodes, 4)
    leaders = Counter(replicas[0] for replicas in assignment)
    assert leaders == {b: 3 for b in broker_nodes}
    replica_counts = Counter(b for replicas in assignment for b in replicas)
    assert replica_counts == {b: 3 * rf for b in broker_nodes}


@pytest.mark.parametrize("rf", [4, 7])
def test_assign_replicas_with_more_replicas_than_brokers_raises(rf):
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas(1, rf, {1: "a", 2: "b", 3: "c"}, 0)


@pytest.mark.parametrize("rf", [0, -1])
def test_assign_replicas_with_replication_factor_below_one_raises(rf):
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas(1, rf, {1: "a", 2: "b", 3: "c"}, 0)


def test_assign_replicas_with_no_brokers_raises():
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas(1, 1, {}, 0)


# --- plan_create_topic --------------------------------------------------------------


def test_created_topic_partitions_are_fully_in_sync_led_by_their_first_replica_at_epoch_zero():
    c = three_nodes()
    c.create("orders", partitions=3, rf=2)
    topic = c.meta.topics["orders"]
    assert sorted(topic.partitions) == [0, 1, 2]
    for p, state in topic.partitions.items():
        assert len(state.replicas) == 2 and len(set(state.replicas)) == 2
        assert state.isr == state.replicas
        assert state.leader == state.replicas[0]
        assert (state.leader_epoch, state.partition_epoch) == (0, 0)
    assert [s.replicas for _, s in sorted(topic.partitions.items())] == [(1, 2), (2, 3), (3, 1)]


def test_create_topic_records_are_a_topic_then_one_partition_record_each():
    c = three_nodes()
    records = c.meta.plan_create_topic("orders", 2, 1, {"retention.ms": "1000"}, "the-id")
    assert records[0] == {"type": "topic", "name": "orders", "topic_id": "the-id", "configs": {"retention.ms": "1000"}}
    assert [(r["type"], r["topic"], r["partition"]) for r in records[1:]] == [
        ("partition", "orders", 0),
        ("partition", "orders", 1),
    ]


def test_planning_a_topic_does_not_change_the_state():
    c = three_nodes()
    c.meta.plan_create_topic("orders", 2, 1, {}, "id")
    assert c.meta.topics == {}
    assert c.meta.last_offset == len(c.log) - 1


def test_created_topic_keeps_its_id_and_configs():
    c = three_nodes()
    c.create("orders", rf=1, configs={"retention.ms": "1000"})
    topic = c.meta.topics["orders"]
    assert (topic.name, topic.topic_id, topic.configs) == ("orders", "id-orders", {"retention.ms": "1000"})


def test_creating_an_existing_topic_raises_topic_already_exists():
    c = three_nodes()
    c.create("orders")
    with pytest.raises(TopicAlreadyExistsError):
        c.meta.plan_create_topic("orders", 1, 1, {}, "other-id")


@pytest.mark.parametrize("name", ["", "a/b", "x" * 250, ".", "..", "a b", "ü"])
def test_creating_a_topic_with_an_illegal_name_raises_invalid_topic(name):
    c = three_nodes()
    with pytest.raises(InvalidTopicError):
        c.meta.plan_create_topic(name, 1, 1, {}, "id")


@pytest.mark.parametrize("name", ["x" * 249, "a.b-c_D9", "..."])
def test_creating_a_topic_with_a_legal_name_succeeds(name):
    c = three_nodes()
    c.create(name, rf=1)
    assert name in c.meta.topics


@pytest.mark.parametrize("partitions", [0, -1])
def test_creating_a_topic_without_partitions_raises_invalid_partitions(partitions):
    c = three_nodes()
    with pytest.raises(InvalidPartitionsError):
        c.meta.plan_create_topic("orders", partitions, 1, {}, "id")


def test_creating_a_topic_with_more_replicas_than_live_brokers_raises():
    c = three_nodes()
    c.fence(3)
    with pytest.raises(InvalidReplicationFactorError):
        c.meta.plan_create_topic("orders", 1, 3, {}, "id")


def test_created_topic_is_assigned_only_to_unfenced_brokers():
    c = Cluster({1: "a", 2: "b", 3: "c", 4: "a"})
    c.fence(2)
    c.create("orders", partitions=6, rf=3)
    used = {b for s in c.meta.topics["orders"].partitions.values() for b in s.replicas}
    assert used == {1, 3, 4}


def test_each_new_topic_starts_at_the_next_broker_so_leaders_spread_across_topics():
    c = three_nodes()
    for name in ("a", "b", "c"):
        c.create(name, partitions=1, rf=1)
    assert [c.state(name).leader for name in ("a", "b", "c")] == [1, 2, 3]


def test_a_topics_start_index_counts_the_partitions_of_earlier_topics():
    c = three_nodes()
    c.create("a", partitions=2, rf=1)
    c.create("b", partitions=1, rf=1)
    assert c.state("b").replicas == (3,)


# --- fencing ------------------------------------------------------------------------


def test_fence_record_comes_first_and_marks_the_broker_fenced():
    c = three_nodes()
    records = c.fence(2)
    assert records[0] == {"type": "fence_broker", "broker_id": 2, "fenced": True}
    assert c.meta.brokers[2].fenced
    assert c.meta.live_brokers == {1, 3}


def test_fencing_removes_the_broker_from_every_isr():
    c = three_nodes()
    c.create("a", partitions=3, rf=3)
    c.create("b", partitions=2, rf=2)
    c.fence(2)
    for meta in c.meta.topics.values():
        for state in meta.partitions.values():
            assert 2 not in state.isr
            assert state.leader != 2


def test_fencing_the_leader_moves_leadership_to_the_next_in_sync_replica_and_bumps_both_epochs():
    c = three_nodes()
    c.create(rf=3)
    assert c.state().replicas == (1, 2, 3)
    c.fence(1)
    assert c.state() == PartitionState((1, 2, 3), (2, 3), 2, 1, 1)


def test_fencing_the_leader_skips_replicas_that_are_not_in_the_isr():
    c = three_nodes()
    c.create(rf=3)
    c.alter("t", 0, [1, 3])
    c.fence(1)
    assert c.state() == PartitionState((1, 2, 3), (3,), 3, 1, 2)


def test_fencing_a_follower_keeps_the_leader_epoch_and_bumps_the_partition_epoch():
    c = three_nodes()
    c.create(rf=3)
    c.fence(2)
    assert c.state() == PartitionState((1, 2, 3), (1, 3), 1, 0, 1)


def test_fencing_a_broker_that_holds_no_replica_writes_only_the_fence_record():
    c = Cluster({1: "a", 2: "b", 3: "c", 4: "d"})
    c.create(rf=3)
    assert 4 not in c.state().replicas
    assert c.fence(4) == [{"type": "fence_broker", "broker_id": 4, "fenced": True}]


def test_fencing_the_last_isr_member_leaves_the_partition_leaderless_with_it_kept_in_the_isr():
    c = three_nodes()
    c.create(rf=2)  # replicas (1, 2)
    c.fence(2)
    c.fence(1)
    assert c.state() == PartitionState((1, 2), (1,), NO_LEADER, 1, 2)


def test_fencing_the_only_replica_leaves_the_partition_leaderless():
    c = three_nodes()
    c.create(rf=1)
    c.fence(1)
    assert c.state() == PartitionState((1,), (1,), NO_LEADER, 1, 1)


def test_fencing_an_out_of_sync_replica_of_a_leaderless_partition_changes_nothing():
    c = three_nodes()
    c.create(rf=2)  # replicas (1, 2)
    c.fence(2)
    c.fence(1)
    c.register(2, "b")
    before = c.state()
    assert partition_records(c.fence(2)) == []
    assert c.state() == before


def test_unclean_topic_elects_a_live_out_of_sync_replica_with_an_isr_of_itself():
    c = three_nodes()
    c.create(rf=3, configs=UNCLEAN)
    c.alter("t", 0, [1])
    c.fence(1)
    assert c.state() == PartitionState((1, 2, 3), (2,), 2, 1, 2)


def test_without_unclean_election_the_partition_stays_leaderless():
    c = three_nodes()
    c.create(rf=3)
    c.alter("t", 0, [1])
    c.fence(1)
    assert c.state() == PartitionState((1, 2, 3), (1,), NO_LEADER, 1, 2)


def test_unclean_election_enable_false_on_the_topic_keeps_the_partition_leaderless():
    c = three_nodes()
    c.create(rf=3, configs={UNCLEAN_LEADER_ELECTION_ENABLE: "false"})
    c.alter("t", 0, [1])
    c.fence(1)
    assert c.state().leader == NO_LEADER


def test_broker_default_unclean_election_applies_to_topics_without_the_config():
    c = Cluster({1: "a", 2: "b", 3: "c"}, BrokerConfig(unclean_leader_election_enable=True))
    c.create(rf=3)
    c.alter("t", 0, [1])
    c.fence(1)
    assert (c.state().leader, c.state().isr) == (2, (2,))


def test_topic_config_overrides_the_broker_default_for_unclean_election():
    c = Cluster({1: "a", 2: "b", 3: "c"}, BrokerConfig(unclean_leader_election_enable=True))
    c.create(rf=3, configs={UNCLEAN_LEADER_ELECTION_ENABLE: "false"})
    c.alter("t", 0, [1])
    c.fence(1)
    assert c.state().leader == NO_LEADER


def test_unclean_topic_with_no_live_replica_stays_leaderless():
    c = three_nodes()
    c.create(rf=2, configs=UNCLEAN)  # replicas (1, 2)
    c.fence(2)
    c.fence(1)
    assert (c.state().leader, c.state().isr) == (NO_LEADER, (1,))


def test_fencing_an_already_fenced_broker_gives_no_records():
    c = three_nodes()
    c.create(rf=3)
    c.fence(2)
    assert c.meta.plan_fence_broker(2) == []


def test_fencing_an_unknown_broker_gives_no_records():
    c = three_nodes()
    assert c.meta.plan_fence_broker(99) == []
    assert c.meta.plan_fence_broker(99, broker_epoch=12345) == []


def test_fencing_with_a_stale_broker_epoch_raises():
    c = three_nodes()
    epoch = c.meta.brokers[2].epoch
    with pytest.raises(StaleBrokerEpochError):
        c.meta.plan_fence_broker(2, broker_epoch=epoch - 1)
    assert c.meta.plan_fence_broker(2, broker_epoch=epoch)[0]["type"] == "fence_broker"


def test_fencing_with_the_epoch_of_an_older_incarnation_raises():
    c = three_nodes()
    old_epoch = c.meta.brokers[2].epoch
    c.register(2, "b")
    with pytest.raises(StaleBrokerEpochError):
        c.meta.plan_fence_broker(2, broker_epoch=old_epoch)


# --- elect (the election rule itself) ------------------------------------------------


def test_elect_prefers_assignment_order_over_isr_order():
    state = PartitionState((3, 1, 2), (1, 2, 3), 3, 4, 7)
    assert elect(state, live={1, 2}, unclean=False) == PartitionState((3, 1, 2), (1, 2), 1, 5, 8)


def test_elect_skips_in_sync_replicas_that_are_not_live():
    state = PartitionState((1, 2, 3), (1, 2, 3), 1, 0, 0)
    assert elect(state, live={3}, unclean=False) == PartitionState((1, 2, 3), (3,), 3, 1, 1)


def test_elect_returns_none_when_nothing_changes():
    state = PartitionState((1, 2, 3), (1, 2), 1, 0, 0)
    assert elect(state, live={1, 2}, unclean=False) is None
    assert elect(state, live={1, 2, 3}, unclean=True) is None


# --- plan_register_broker ------------------------------------------------------------


def test_returning_last_isr_member_leads_its_leaderless_partition_again():
    c = three_nodes()
    c.create(rf=2)  # replicas (1, 2)
    c.fence(2)
    c.fence(1)
    records = c.register(1, "a")
    assert partition_records(records) == [PartitionState((1, 2), (1,), 1, 2, 3).to_record("t", 0)]
    assert c.state() == PartitionState((1, 2), (1,), 1, 2, 3)


def test_returning_out_of_sync_replica_does_not_lead_a_leaderless_partition():
    c = three_nodes()
    c.create(rf=2)  # replicas (1, 2)
    c.fence(2)
    c.fence(1)
    assert partition_records(c.register(2, "b")) == []
    assert (c.state().leader, c.state().isr) == (NO_LEADER, (1,))


def test_returning_out_of_sync_replica_leads_a_leaderless_unclean_topic():
    c = three_nodes()
    c.create(rf=2, configs=UNCLEAN)  # replicas (1, 2)
    c.fence(2)
    c.fence(1)
    c.register(2, "b")
    assert c.state() == PartitionState((1, 2), (2,), 2, 2, 3)


def test_returning_follower_does_not_rejoin_the_isr_of_a_led_partition():
    c = three_nodes()
    c.create(rf=3)
    c.fence(2)
    before = c.state()
    assert partition_records(c.register(2, "b")) == []
    assert c.state() == before
    assert 2 in c.meta.live_brokers


def test_registration_record_names_the_broker_and_its_node():
    c = three_nodes()
    records = c.meta.plan_register_broker(7, "node-x")
    assert records == [{"type": "register_broker", "broker_id": 7, "node_id": "node-x"}]


def test_broker_epoch_is_the_offset_of_its_registration_record():
    meta = ClusterMetadata()
    meta.apply({"type": "register_broker", "broker_id": 1, "node_id": "a"}, 10)
    meta.apply({"type": "register_broker", "broker_id": 2, "node_id": "b"}, 25)
    assert (meta.brokers[1].epoch, meta.brokers[2].epoch) == (10, 25)


def test_each_registration_gives_the_broker_a_larger_epoch():
    c = three_nodes()
    epochs = [c.meta.brokers[1].epoch]
    for _ in range(3):
        c.fence(1)
        c.register(1, "a")
        epochs.append(c.meta.brokers[1].epoch)
    registrations = [o for o, r in c.log if r["type"] == "register_broker" and r["broker_id"] == 1]
    assert epochs == registrations
    assert epochs == sorted(set(epochs))


def test_registration_unfences_the_broker_and_records_its_new_node():
    c = three_nodes()
    c.fence(1)
    c.register(1, "z")
    reg = c.meta.brokers[1]
    assert (reg.fenced, reg.node_id) == (False, "z")
    assert c.meta.live_brokers == {1, 2, 3}


def test_a_fence_record_with_fenced_false_unfences_the_broker_and_keeps_its_epoch():
    c = three_nodes()
    epoch = c.meta.brokers[2].epoch
    c.fence(2)
    c.commit([{"type": "fence_broker", "broker_id": 2, "fenced": False}])
    assert (c.meta.brokers[2].fenced, c.meta.brokers[2].epoch) == (False, epoch)


# --- plan_alter_partition ------------------------------------------------------------


def test_alter_partition_changes_the_isr_and_bumps_only_the_partition_epoch():
    c = three_nodes()
    c.create(rf=3)
    records = c.alter("t", 0, [1, 2])
    assert len(records) == 1
    assert c.state() == PartitionState((1, 2, 3), (1, 2), 1, 0, 1)
    c.alter("t", 0, [1, 2, 3])
    assert c.state() == PartitionState((1, 2, 3), (1, 2, 3), 1, 0, 2)


def test_alter_partition_stores_the_isr_in_assignment_order():
    c = three_nodes()
    c.create(rf=3)
    c.alter("t", 0, [1])
    c.alter("t", 0, [3, 1])
    assert c.state().isr == (1, 3)


def test_alter_partition_from_a_non_leader_raises_not_leader_or_follower():
    c = three_nodes()
    c.create(rf=3)
    with pytest.raises(NotLeaderOrFollowerError):
        c.meta.plan_alter_partition("t", 0, 2, 0, 0, [2, 3])


def test_alter_partition_with_a_stale_leader_epoch_raises_fenced_leader_epoch():
    c = three_nodes()
    c.create(rf=3)
    c.fence(1)
    c.register(1, "a")  # leader is now 2 at leader epoch 1
    with pytest.raises(FencedLeaderEpochError):
        c.meta.plan_alter_partition("t", 0, 2, 0, c.state().partition_epoch, [2])


def test_alter_partition_with_a_stale_partition_epoch_raises_invalid_update_version():
    c = three_nodes()
    c.create(rf=3)
    c.alter("t", 0, [1, 2])
    with pytest.raises(InvalidUpdateVersionError):
        c.meta.plan_alter_partition("t", 0, 1, 0, 0, [1])


def test_alter_partition_to_an_isr_without_the_leader_raises_ineligible_replica():
    c = three_nodes()
    c.create(rf=3)
    with pytest.raises(IneligibleReplicaError):
        c.meta.plan_alter_partition("t", 0, 1, 0, 0, [2, 3])


def test_alter_partition_to_an_isr_with_a_non_replica_raises_ineligible_replica():
    c = Cluster({1: "a", 2: "b", 3: "c", 4: "d"})
    c.create(rf=3)
    assert 4 not in c.state().replicas
    with pytest.raises(IneligibleReplicaError):
        c.meta.plan_alter_partition("t", 0, 1, 0, 0, [1, 4])


def test_alter_partition_adding_a_fenced_broker_raises_ineligible_replica():
    c = three_nodes()
    c.create(rf=3)
    c.fence(3)
    with pytest.raises(IneligibleReplicaError):
        c.meta.plan_alter_partition("t", 0, 1, 0, 1, [1, 2, 3])


def test_alter_partition_to_the_same_isr_gives_no_records():
    c = three_nodes()
    c.create(rf=3)
    assert c.meta.plan_alter_partition("t", 0, 1, 0, 0, [3, 2, 1]) == []


@pytest.mark.parametrize(("topic", "partition"), [("missing", 0), ("t", 1)])
def test_alter_partition_of_an_unknown_partition_raises(topic, partition):
    c = three_nodes()
    c.create(rf=3)
    with pytest.raises(UnknownTopicOrPartitionError):
        c.meta.plan_alter_partition(topic, partition, 1, 0, 0, [1])


def test_alter_partition_accepts_any_iterable_as_the_new_isr():
    c = three_nodes()
    c.create(rf=3)
    records = c.meta.plan_alter_partition("t", 0, 1, 0, 0, iter([1, 2]))
    assert records == [PartitionState((1, 2, 3), (1, 2), 1, 0, 1).to_record("t", 0)]


# --- topics: delete and configs -----------------------------------------------------


def test_deleting_an_unknown_topic_raises():
    c = three_nodes()
    with pytest.raises(UnknownTopicOrPartitionError):
        c.meta.plan_delete_topic("missing")


def test_altering_configs_of_an_unknown_topic_raises():
    c = three_nodes()
    with pytest.raises(UnknownTopicOrPartitionError):
        c.meta.plan_alter_topic_configs("missing", {"retention.ms": "1"})


def test_deleted_topic_is_gone_and_its_name_can_be_reused_from_epoch_zero():
    c = three_nodes()
    c.create(rf=3)
    c.fence(1)
    c.commit(c.meta.plan_delete_topic("t"))
    assert "t" not in c.meta.topics
    c.create(rf=2)
    assert (c.state().leader_epoch, c.state().partition_epoch) == (0, 0)


def test_altered_topic_configs_replace_the_old_ones():
    c = three_nodes()
    c.create(rf=1, configs={"retention.ms": "1000", "min.insync.replicas": "1"})
    c.commit(c.meta.plan_alter_topic_configs("t", {"retention.ms": "5"}))
    assert c.meta.topics["t"].configs == {"retention.ms": "5"}


# --- apply --------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [3, 2])
def test_apply_refuses_an_offset_that_does_not_grow(offset):
    meta = ClusterMetadata()
    meta.apply({"type": "cluster", "cluster_id": "c"}, 3)
    with pytest.raises(AssertionError):
        meta.apply({"type": "register_broker", "broker_id": 1, "node_id": "a"}, offset)


def test_apply_of_an_unknown_record_type_raises():
    meta = ClusterMetadata()
    with pytest.raises(ValueError):
        meta.apply({"type": "nonsense"}, 0)


def test_apply_refuses_a_partition_with_an_empty_isr():
    c = three_nodes()
    c.create(rf=3)
    record = PartitionState((1, 2, 3), (), NO_LEADER, 1, 1).to_record("t", 0)
    with pytest.raises(AssertionError):
        c.meta.apply(record, len(c.log))


def test_apply_refuses_a_leader_change_without_a_new_leader_epoch():
    c = three_nodes()
    c.create(rf=3)
    record = PartitionState((1, 2, 3), (1, 2, 3), 2, 0, 1).to_record("t", 0)
    with pytest.raises(AssertionError):
        c.meta.apply(record, len(c.log))


def test_replaying_the_records_rebuilds_the_same_state():
    c = three_nodes()
    c.create("a", partitions=3, rf=2, configs=UNCLEAN)
    c.create("b", partitions=2, rf=3)
    c.fence(1)
    c.alter("b", 0, [c.state("b", 0).leader])
    c.register(1, "x")
    c.commit(c.meta.plan_delete_topic("a"))
    again = replay(c.log)
    assert again.cluster_id == "test-cluster"
    assert (again.brokers, again.topics, again.last_offset) == (c.meta.brokers, c.meta.topics, c.meta.last_offset)


# --- random operations: invariants and replay ----------------------------------------


class ClusterMachine(RuleBasedStateMachine):
    """Random creates, fences, registrations, ISR changes, config changes and deletes."""

    @initialize(brokers=st.integers(3, 5), nodes=st.integers(2, 3), unclean_default=st.booleans())
    def start(self, brokers, nodes, unclean_default):
        self.config = BrokerConfig(unclean_leader_election_enable=unclean_default)
        self.nodes = nodes
        self.c = Cluster({b: f"node-{b % nodes}" for b in range(brokers)}, self.config)
        self.broker_ids = list(range(brokers))
        self.next_topic = 0
        self.seen: dict[tuple[str, str, int], PartitionState] = {}  # (topic id, topic, p) -> last state

    # -- helpers

    def partitions(self) -> list[tuple[str, int, PartitionState]]:
        return [(n, p, s) for n, t in sorted(self.c.meta.topics.items()) for p, s in sorted(t.partitions.items())]

    # -- rules

    @rule(partitions=st.integers(1, 3), rf=st.integers(1, 3), unclean=st.sampled_from([None, "true", "false"]))
    def create_topic(self, partitions, rf, unclean):
        name = f"t{self.next_topic}"
        self.next_topic += 1
        configs = {} if unclean is None else {UNCLEAN_LEADER_ELECTION_ENABLE: unclean}
        live = self.c.meta.live_brokers
        if rf > len(live):
            with pytest.raises(InvalidReplicationFactorError):
                self.c.meta.plan_create_topic(name, partitions, rf, configs, f"id-{name}")
            return
        self.c.create(name, partitions, rf, configs)
        for _, state in self.c.meta.topics[name].partitions.items():
            assert set(state.replicas) <= live
            assert state.isr == state.replicas and state.leader == state.replicas[0]

    @rule(i=st.integers(0, 4))
    def fence(self, i):
        broker = self.broker_ids[i % len(self.broker_ids)]
        was_fenced = self.c.meta.brokers[broker].fenced
        records = self.c.fence(broker)
        assert (records == []) == was_fenced
        assert self.c.meta.brokers[broker].fenced

    @rule(i=st.integers(0, 4), node=st.integers(0, 2))
    def register(self, i, node):
        broker = self.broker_ids[i % len(self.broker_ids)]
        self.c.register(broker, f"node-{node % self.nodes}")
        assert not self.c.meta.brokers[broker].fenced
        assert self.c.meta.brokers[broker].epoch == max(o for o, r in self.c.log if r["type"] == "register_broker")

    @precondition(lambda self: any(s.leader != NO_LEADER for _, _, s in self.partitions()))
    @rule(data=st.data())
    def alter_partition(self, data):
        led = [(n, p, s) for n, p, s in self.partitions() if s.leader != NO_LEADER]
        name, p, s = data.draw(st.sampled_from(led))
        others = data.draw(st.lists(st.sampled_from(s.replicas), unique=True))
        new_isr = [s.leader, *others]
        added = set(new_isr) - set(s.isr)
        if not added <= self.c.meta.live_brokers:
            with pytest.raises(IneligibleReplicaError):
                self.c.meta.plan_alter_partition(name, p, s.leader, s.leader_epoch, s.partition_epoch, new_isr)
            return
        records = self.c.alter(name, p, new_isr)
        assert set(self.c.state(name, p).isr) == set(new_isr)
        assert len(records) == (0 if set(new_isr) == set(s.isr) else 1)

    @precondition(lambda self: bool(self.c.meta.topics))
    @rule(data=st.data(), stale=st.sampled_from(["leader", "leader_epoch", "partition_epoch"]))
    def stale_alter_partition_is_refused(self, data, stale):
        name, p, s = data.draw(st.sampled_from(self.partitions()))
        leader, leader_epoch, partition_epoch = s.leader, s.leader_epoch, s.partition_epoch
        if stale == "leader":
            leader = next(b for b in self.broker_ids if b != s.leader)
            error = NotLeaderOrFollowerError
        elif stale == "leader_epoch":
            leader_epoch -= 1
            error = FencedLeaderEpochError
        else:
            partition_epoch -= 1
            error = InvalidUpdateVersionError
        with pytest.raises(error):
            self.c.meta.plan_alter_partition(name, p, leader, leader_epoch, partition_epoch, list(s.replicas))

    @precondition(lambda self: bool(self.c.meta.topics))
    @rule(data=st.data(), unclean=st.sampled_from(["true", "false"]))
    def alter_configs(self, data, unclean):
        name = data.draw(st.sampled_from(sorted(self.c.meta.topics)))
        self.c.commit(self.c.meta.plan_alter_topic_configs(name, {UNCLEAN_LEADER_ELECTION_ENABLE: unclean}))

    @precondition(lambda self: bool(self.c.meta.topics))
    @rule(data=st.data())
    def delete_topic(self, data):
        name = data.draw(st.sampled_from(sorted(self.c.meta.topics)))
        self.c.commit(self.c.meta.plan_delete_topic(name))
        assert name not in self.c.meta.topics

    # -- invariants

    @invariant()
    def partitions_are_consistent(self):
        if not hasattr(self, "c"):
            return
        live = self.c.meta.live_brokers
        for name, p, s in self.partitions():
            assert s.isr, f"{name}-{p}: empty ISR"
            assert set(s.isr) <= set(s.replicas), f"{name}-{p}: ISR {s.isr} outside replicas {s.replicas}"
            assert len(set(s.replicas)) == len(s.replicas)
            if s.leader == NO_LEADER:
                # Leaderless only when the kept last ISR member is down.
                assert len(s.isr) == 1 and s.isr[0] not in live, f"{name}-{p}: {s} with live {live}"
            else:
                assert s.leader in s.isr, f"{name}-{p}: leader {s.leader} not in ISR {s.isr}"
                assert s.leader in live, f"{name}-{p}: leader {s.leader} is fenced"
                assert set(s.isr) <= live, f"{name}-{p}: fenced brokers in ISR {s.isr}"

    @invariant()
    def epochs_only_grow(self):
        if not hasattr(self, "c"):
            return
        current = {}
        for name, p, s in self.partitions():
            key = (self.c.meta.topics[name].topic_id, name, p)
            current[key] = s
            old = self.seen.get(key)
            if old is None:  # created by the last step
                assert (s.leader_epoch, s.partition_epoch) == (0, 0)
                continue
            assert s.replicas == old.replicas
            assert s.leader_epoch >= old.leader_epoch
            if s.leader != old.leader:
                assert s.leader_epoch > old.leader_epoch, f"{name}-{p}: leader {old.leader}->{s.leader} same epoch"
            if s != old:
                assert s.partition_epoch > old.partition_epoch, f"{name}-{p}: {old} -> {s} same partition epoch"
            else:
                assert s.partition_epoch == old.partition_epoch
        # A topic name reused after a delete gets a new topic id, so it is tracked afresh.
        self.seen = current

    @invariant()
    def replay_gives_the_same_state(self):
        if not hasattr(self, "c"):
            return
        again = replay(self.c.log, self.config)
        assert again.cluster_id == self.c.meta.cluster_id
        assert again.brokers == self.c.meta.brokers
        assert again.topics == self.c.meta.topics
        assert again.last_offset == self.c.meta.last_offset


ClusterMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_cluster_metadata_state_machine = ClusterMachine.TestCase
