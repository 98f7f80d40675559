"""ClusterMetadata as a whole, without Ray: the Controller's decisions (assignment, elections,
ISR changes, reassignments) through the composed control managers, replay, and a state
machine over all of it. Each manager alone: test_*_control.py."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rayk.metadata.cluster_metadata import NO_LEADER, ClusterMetadata, PartitionState, assign_replicas
from rayk.metadata.records import (
    ClusterIdRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    pack,
    unpack,
    DecommissionBrokerRecord,
    UnregisterBrokerRecord,
)
from rayk.metadata import elections
from rayk.metadata.elections import LogEnd, reconcile
from rayk.config import MIN_INSYNC_REPLICAS, UNCLEAN_LEADER_ELECTION_ENABLE, BrokerConfig, min_insync_replicas_of
from rayk.errors import (
    BrokerNotAvailableError,
    InvalidRequestError,
    PolicyViolationError,
    ElectionNotNeededError,
    EligibleLeadersNotAvailableError,
    PreferredLeaderNotAvailableError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    InvalidUpdateVersionError,
    NoReassignmentInProgressError,
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
        self.log: list[tuple[int, MetadataRecord]] = []
        self.commit([ClusterIdRecord("test-cluster")])
        for broker_id, node in (brokers or {}).items():
            self.register(broker_id, node)

    def commit(self, records: list[MetadataRecord]) -> list[MetadataRecord]:
        for record in records:
            offset = len(self.log)
            self.meta.apply(record, offset)
            self.log.append((offset, record))
        return records

    def create(self, name: str = "t", partitions: int = 1, rf: int = 3, configs: dict | None = None) -> list[MetadataRecord]:
        return self.commit(self.meta.replication.plan_create_topic(name, partitions, rf, configs or {}, f"id-{name}"))

    def fence(self, broker_id: int) -> list[MetadataRecord]:
        records = self.commit(self.meta.plan_fence_broker(broker_id))
        self.meta.attached.discard(broker_id)  # as the Controller does
        return records

    def register(
        self, broker_id: int, node: str, incarnation: str = "", directory: str = "", clean: bool = True
    ) -> list[MetadataRecord]:
        records = self.commit(self.meta.plan_register_broker(broker_id, node, incarnation, directory, clean))
        self.meta.attached.add(broker_id)
        return records

    def alter(self, topic: str, partition: int, isr: list[int]) -> list[MetadataRecord]:
        s = self.meta.partition(topic, partition)
        return self.commit(
            self.meta.replication.plan_alter_partition(topic, partition, s.leader, s.leader_epoch, s.partition_epoch, isr)
        )

    def state(self, topic: str = "t", partition: int = 0) -> PartitionState:
        return self.meta.partition(topic, partition)


def three_nodes() -> Cluster:
    return Cluster({1: "a", 2: "b", 3: "c"})


def partition_records(records: list[MetadataRecord]) -> list[MetadataRecord]:
    return [r for r in records if isinstance(r, PartitionRecord)]


def replay(log: list[tuple[int, MetadataRecord]], config: BrokerConfig | None = None) -> ClusterMetadata:
    """A fresh ClusterMetadata from the records, each through msgpack as the MetadataLog stores it."""
    meta = ClusterMetadata(config)
    for offset, record in log:
        meta.apply(unpack(pack(record)), offset)
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
    # Nodes a: 1, 2; b: 3, 4; c: 5, 6 -> cyclic order 1, 3, 5, 2, 4, 6. Partition 1 goes to
    # brokers that hold nothing yet (5, 2) rather than on round robin (3, 5): a topic of two
    # partitions would otherwise leave broker 3 with two replicas and brokers 2, 4, 6 none.
    broker_nodes = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    assert assign_replicas(6, 2, broker_nodes, 0) == [(1, 3), (5, 2), (4, 6), (2, 4), (6, 1), (3, 5)]


def test_assign_replicas_on_an_empty_cluster_with_rf_equal_to_the_brokers_is_the_round_robin():
    broker_nodes = {b: f"node-{b}" for b in range(4)}
    assert assign_replicas(5, 4, broker_nodes, 0) == [
        (0, 1, 2, 3), (1, 2, 3, 0), (2, 3, 0, 1), (3, 0, 1, 2), (0, 1, 2, 3)]


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
    records = c.meta.replication.plan_create_topic("orders", 2, 1, {"retention.ms": "1000"}, "the-id")
    assert records[0] == TopicRecord("orders", "the-id", {"retention.ms": "1000"})
    assert [(type(r), r.topic, r.partition) for r in records[1:]] == [
        (PartitionRecord, "orders", 0),
        (PartitionRecord, "orders", 1),
    ]


def test_planning_a_topic_does_not_change_the_state():
    c = three_nodes()
    c.meta.replication.plan_create_topic("orders", 2, 1, {}, "id")
    assert c.meta.topics == {}
    assert c.meta.last_offset == len(c.log) - 1


def test_create_partitions_adds_partitions_with_the_topics_replication_factor_and_keeps_the_old_ones():
    c = three_nodes()
    c.create("orders", partitions=2, rf=2)
    before = dict(c.meta.topics["orders"].partitions)
    records = c.commit(c.meta.replication.plan_create_partitions("orders", 5))
    assert [(r.topic, r.partition) for r in records] == [("orders", 2), ("orders", 3), ("orders", 4)]
    partitions = c.meta.topics["orders"].partitions
    assert {p: partitions[p] for p in before} == before
    for p in (2, 3, 4):
        state = partitions[p]
        assert len(set(state.replicas)) == 2 and state.isr == state.replicas and state.leader == state.replicas[0]
        assert (state.leader_epoch, state.partition_epoch) == (0, 0)


def test_create_partitions_during_a_reassignment_takes_the_target_replication_factor():
    c = three_nodes()
    c.create("orders", partitions=1, rf=2)  # replicas (1, 2)
    c.commit(c.meta.replication.plan_reassign("orders", 0, [3, 1]))
    assert len(c.state("orders", 0).replicas) == 3, "the target plus the replica being removed"
    records = c.commit(c.meta.replication.plan_create_partitions("orders", 2))
    assert len(records[0].replicas) == 2


@pytest.mark.parametrize("total", [0, 1, 2])
def test_create_partitions_never_shrinks_or_keeps_the_count(total):
    c = three_nodes()
    c.create("orders", partitions=2, rf=1)
    with pytest.raises(InvalidPartitionsError, match="must be larger"):
        c.meta.replication.plan_create_partitions("orders", total)


def test_create_partitions_of_a_missing_topic_is_unknown_topic():
    with pytest.raises(UnknownTopicOrPartitionError):
        three_nodes().meta.replication.plan_create_partitions("nope", 3)


def test_preferred_election_gives_leadership_back_to_the_first_replica_once_it_is_in_sync():
    c = three_nodes()
    c.create("t", partitions=1, rf=3)  # replicas (1, 2, 3): broker 1 preferred
    c.fence(1)
    assert c.state().leader == 2 and 1 not in c.state().isr
    with pytest.raises(PreferredLeaderNotAvailableError):
        c.meta.replication.plan_elect_leader("t", 0)  # fenced and out of the ISR: it may not lead
    c.register(1, "a")
    with pytest.raises(PreferredLeaderNotAvailableError):
        c.meta.replication.plan_elect_leader("t", 0)  # back, but not caught up yet
    c.alter("t", 0, [2, 3, 1])
    before = c.state()
    c.commit(c.meta.replication.plan_elect_leader("t", 0))
    after = c.state()
    assert after.leader == 1 and after.isr == before.isr
    assert (after.leader_epoch, after.partition_epoch) == (before.leader_epoch + 1, before.partition_epoch + 1)
    with pytest.raises(ElectionNotNeededError):
        c.meta.replication.plan_elect_leader("t", 0)


def test_unclean_election_elects_a_live_replica_only_for_a_leaderless_partition():
    c = three_nodes()
    c.create("t", partitions=1, rf=2)  # replicas (1, 2)
    with pytest.raises(ElectionNotNeededError):
        c.meta.replication.plan_elect_leader("t", 0, unclean=True)
    c.fence(2)
    c.fence(1)  # the last ISR member: leaderless, ISR kept
    assert c.state().leader == NO_LEADER
    with pytest.raises(EligibleLeadersNotAvailableError):
        c.meta.replication.plan_elect_leader("t", 0, unclean=True)
    c.register(2, "b")  # out of sync, but live
    c.commit(c.meta.replication.plan_elect_leader("t", 0, unclean=True))
    assert (c.state().leader, c.state().isr) == (2, (2,))


def test_imbalance_names_the_partitions_of_brokers_over_the_ratio():
    def state(replicas, leader):
        return PartitionState(replicas, replicas, leader, 0, 0)

    partitions = [("a", state((1, 2), 2)), ("b", state((1, 2), 1)), ("c", state((2, 1), 2)),
                  ("d", state((3, 1), 1)), ("e", state((3, 1), 3)), ("f", state((3, 1), 3))]
    # broker 1: 1 of 2 moved (50%); broker 2: 0 of 1; broker 3: 1 of 3 (33%)
    assert elections.imbalanced(partitions, 0.4) == ["a"]
    assert sorted(elections.imbalanced(partitions, 0.1)) == ["a", "d"]
    assert elections.imbalanced(partitions, 0.5) == []


def test_created_topic_keeps_its_id_and_configs():
    c = three_nodes()
    c.create("orders", rf=1, configs={"retention.ms": "1000"})
    topic = c.meta.topics["orders"]
    assert (topic.name, topic.topic_id, c.meta.configs.of("orders")) == ("orders", "id-orders", {"retention.ms": "1000"})


def test_creating_an_existing_topic_raises_topic_already_exists():
    c = three_nodes()
    c.create("orders")
    with pytest.raises(TopicAlreadyExistsError):
        c.meta.replication.plan_create_topic("orders", 1, 1, {}, "other-id")


@pytest.mark.parametrize("name", ["", "a/b", "x" * 250, ".", "..", "a b", "ü"])
def test_creating_a_topic_with_an_illegal_name_raises_invalid_topic(name):
    c = three_nodes()
    with pytest.raises(InvalidTopicError):
        c.meta.replication.plan_create_topic(name, 1, 1, {}, "id")


@pytest.mark.parametrize("name", ["x" * 249, "a.b-c_D9", "..."])
def test_creating_a_topic_with_a_legal_name_succeeds(name):
    c = three_nodes()
    c.create(name, rf=1)
    assert name in c.meta.topics


@pytest.mark.parametrize("partitions", [0, -1])
def test_creating_a_topic_without_partitions_raises_invalid_partitions(partitions):
    c = three_nodes()
    with pytest.raises(InvalidPartitionsError):
        c.meta.replication.plan_create_topic("orders", partitions, 1, {}, "id")


def test_creating_a_topic_with_more_replicas_than_live_brokers_raises():
    c = three_nodes()
    c.fence(3)
    with pytest.raises(InvalidReplicationFactorError):
        c.meta.replication.plan_create_topic("orders", 1, 3, {}, "id")


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
    assert records[0] == FenceBrokerRecord(2, fenced=True)
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
    assert c.fence(4) == [FenceBrokerRecord(4, fenced=True)]


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
    assert isinstance(c.meta.plan_fence_broker(2, broker_epoch=epoch)[0], FenceBrokerRecord)


def test_fencing_with_the_epoch_of_an_older_incarnation_raises():
    c = three_nodes()
    old_epoch = c.meta.brokers[2].epoch
    c.register(2, "b")
    with pytest.raises(StaleBrokerEpochError):
        c.meta.plan_fence_broker(2, broker_epoch=old_epoch)


# --- elect (the election rule itself) ------------------------------------------------


def test_reconcile_prefers_assignment_order_over_isr_order():
    state = PartitionState((3, 1, 2), (1, 2, 3), 3, 4, 7)
    assert reconcile(state, {1, 2}, {1, 2}, False) == PartitionState((3, 1, 2), (1, 2), 1, 5, 8)


def test_reconcile_skips_in_sync_replicas_that_are_not_live():
    state = PartitionState((1, 2, 3), (1, 2, 3), 1, 0, 0)
    assert reconcile(state, {3}, {3}, False) == PartitionState((1, 2, 3), (3,), 3, 1, 1)


def test_reconcile_returns_none_when_nothing_changes():
    state = PartitionState((1, 2, 3), (1, 2), 1, 0, 0)
    assert reconcile(state, {1, 2}, {1, 2}, False) is None
    assert reconcile(state, {1, 2, 3}, {1, 2, 3}, True) is None


def test_reconcile_keeps_the_isr_whole_while_no_member_is_known_to_be_running():
    # After a Controller restart nobody is attached: a fenced member is not dropped in
    # favour of members whose state is unknown, and none of them is elected.
    state = PartitionState((1, 2, 3), (1, 2, 3), 1, 0, 0)
    assert reconcile(state, {2, 3}, set(), False) == PartitionState((1, 2, 3), (1, 2, 3), NO_LEADER, 1, 1)


def test_reconcile_elects_a_restarted_leader_again_in_a_new_epoch():
    state = PartitionState((1, 2, 3), (1, 2, 3), 1, 4, 4)
    assert reconcile(state, {1, 2, 3}, {1, 2, 3}, False, restarted=[1]) == PartitionState((1, 2, 3), (1, 2, 3), 1, 5, 5)


def test_reconcile_keeps_a_restarted_leader_that_is_not_the_first_replica():
    # Leadership had moved to broker 2 before a whole-cluster restart; broker 1 came back
    # first, then 2: a clean restart does not hand leadership to whoever is listed first.
    state = PartitionState((1, 2, 3), (1, 2, 3), 2, 4, 4)
    assert reconcile(state, {1, 2, 3}, {1, 2, 3}, False, restarted=[2]) == PartitionState((1, 2, 3), (1, 2, 3), 2, 5, 5)


def test_reconcile_moves_leadership_off_a_restarted_leader_that_is_recovering():
    state = replace(PartitionState((1, 2, 3), (1, 2, 3), 2, 4, 4), recovering=(2,))
    assert reconcile(state, {1, 2, 3}, {1, 2, 3}, False, restarted=[2]).leader == 1


def test_reconcile_moves_leadership_off_an_unavailable_replica_and_out_of_the_isr():
    state = PartitionState((1, 2, 3), (1, 2, 3), 1, 4, 4)
    assert reconcile(state, {1, 2, 3}, {1, 2, 3}, False, unavailable=[1]) == PartitionState((1, 2, 3), (2, 3), 2, 5, 5)


def test_reconcile_lets_the_only_copy_lead_again_when_its_replica_failed():
    state = PartitionState((1, 2, 3), (1,), 1, 4, 4)
    assert reconcile(state, {1, 2, 3}, {1, 2, 3}, False, unavailable=[1]) == PartitionState((1, 2, 3), (1,), 1, 5, 5)


# --- plan_register_broker ------------------------------------------------------------


def test_returning_last_isr_member_leads_its_leaderless_partition_again():
    c = three_nodes()
    c.create(rf=2)  # replicas (1, 2)
    c.fence(2)
    c.fence(1)
    records = c.register(1, "a")
    assert partition_records(records) == [PartitionRecord.of("t", 0, PartitionState((1, 2), (1,), 1, 2, 3))]
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


def test_registration_record_names_the_broker_its_node_incarnation_directory_and_shutdown():
    c = three_nodes()
    records = c.meta.plan_register_broker(7, "node-x", "inc-1", "dir-1", False)
    assert records == [RegisterBrokerRecord(7, "node-x", "inc-1", "dir-1", clean_shutdown=False)]


def test_broker_epoch_is_the_offset_of_its_registration_record():
    meta = ClusterMetadata()
    meta.apply(RegisterBrokerRecord(1, "a"), 10)
    meta.apply(RegisterBrokerRecord(2, "b"), 25)
    assert (meta.brokers[1].epoch, meta.brokers[2].epoch) == (10, 25)


def test_each_registration_gives_the_broker_a_larger_epoch():
    c = three_nodes()
    epochs = [c.meta.brokers[1].epoch]
    for _ in range(3):
        c.fence(1)
        c.register(1, "a")
        epochs.append(c.meta.brokers[1].epoch)
    registrations = [o for o, r in c.log if isinstance(r, RegisterBrokerRecord) and r.broker_id == 1]
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
    c.commit([FenceBrokerRecord(2, fenced=False)])
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
        c.meta.replication.plan_alter_partition("t", 0, 2, 0, 0, [2, 3])


def test_alter_partition_with_a_stale_leader_epoch_raises_fenced_leader_epoch():
    c = three_nodes()
    c.create(rf=3)
    c.fence(1)
    c.register(1, "a")  # leader is now 2 at leader epoch 1
    with pytest.raises(FencedLeaderEpochError):
        c.meta.replication.plan_alter_partition("t", 0, 2, 0, c.state().partition_epoch, [2])


def test_alter_partition_with_a_stale_partition_epoch_raises_invalid_update_version():
    c = three_nodes()
    c.create(rf=3)
    c.alter("t", 0, [1, 2])
    with pytest.raises(InvalidUpdateVersionError):
        c.meta.replication.plan_alter_partition("t", 0, 1, 0, 0, [1])


def test_alter_partition_to_an_isr_without_the_leader_raises_ineligible_replica():
    c = three_nodes()
    c.create(rf=3)
    with pytest.raises(IneligibleReplicaError):
        c.meta.replication.plan_alter_partition("t", 0, 1, 0, 0, [2, 3])


def test_alter_partition_to_an_isr_with_a_non_replica_raises_ineligible_replica():
    c = Cluster({1: "a", 2: "b", 3: "c", 4: "d"})
    c.create(rf=3)
    assert 4 not in c.state().replicas
    with pytest.raises(IneligibleReplicaError):
        c.meta.replication.plan_alter_partition("t", 0, 1, 0, 0, [1, 4])


def test_alter_partition_adding_a_fenced_broker_raises_ineligible_replica():
    c = three_nodes()
    c.create(rf=3)
    c.fence(3)
    with pytest.raises(IneligibleReplicaError):
        c.meta.replication.plan_alter_partition("t", 0, 1, 0, 1, [1, 2, 3])


def test_alter_partition_to_the_same_isr_gives_no_records():
    c = three_nodes()
    c.create(rf=3)
    assert c.meta.replication.plan_alter_partition("t", 0, 1, 0, 0, [3, 2, 1]) == []


@pytest.mark.parametrize(("topic", "partition"), [("missing", 0), ("t", 1)])
def test_alter_partition_of_an_unknown_partition_raises(topic, partition):
    c = three_nodes()
    c.create(rf=3)
    with pytest.raises(UnknownTopicOrPartitionError):
        c.meta.replication.plan_alter_partition(topic, partition, 1, 0, 0, [1])


def test_alter_partition_accepts_any_iterable_as_the_new_isr():
    c = three_nodes()
    c.create(rf=3)
    records = c.meta.replication.plan_alter_partition("t", 0, 1, 0, 0, iter([1, 2]))
    assert records == [PartitionRecord.of("t", 0, PartitionState((1, 2, 3), (1, 2), 1, 0, 1))]


# --- topics: delete and configs -----------------------------------------------------


def test_deleting_an_unknown_topic_raises():
    c = three_nodes()
    with pytest.raises(UnknownTopicOrPartitionError):
        c.meta.replication.plan_delete_topic("missing")


def test_altering_configs_of_an_unknown_topic_raises():
    c = three_nodes()
    with pytest.raises(UnknownTopicOrPartitionError):
        c.meta.configs.plan_alter_topic_configs("missing", {"retention.ms": "1"})


def test_deleted_topic_is_gone_and_its_name_can_be_reused_from_epoch_zero():
    c = three_nodes()
    c.create(rf=3)
    c.fence(1)
    c.commit(c.meta.replication.plan_delete_topic("t"))
    assert "t" not in c.meta.topics
    c.create(rf=2)
    assert (c.state().leader_epoch, c.state().partition_epoch) == (0, 0)


def test_altered_topic_configs_replace_the_old_ones():
    c = three_nodes()
    c.create(rf=1, configs={"retention.ms": "1000", "min.insync.replicas": "1"})
    c.commit(c.meta.configs.plan_alter_topic_configs("t", {"retention.ms": "5"}))
    assert c.meta.configs.of("t") == {"retention.ms": "5"}


# --- apply --------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [3, 2])
def test_apply_refuses_an_offset_that_does_not_grow(offset):
    meta = ClusterMetadata()
    meta.apply(ClusterIdRecord("c"), 3)
    with pytest.raises(AssertionError):
        meta.apply(RegisterBrokerRecord(1, "a"), offset)


def test_apply_of_something_that_is_not_a_record_kind_raises():
    meta = ClusterMetadata()
    with pytest.raises(TypeError):
        meta.apply({"type": "cluster", "cluster_id": "c"}, 0)
    with pytest.raises(TypeError):
        meta.apply(MetadataRecord(), 0)
    assert meta.last_offset == -1, "nothing was applied"


def test_apply_refuses_a_partition_with_a_leader_and_an_empty_isr():
    c = three_nodes()
    c.create(rf=3)
    record = PartitionRecord.of("t", 0, PartitionState((1, 2, 3), (), 1, 0, 1))
    with pytest.raises(AssertionError):
        c.meta.apply(record, len(c.log))


def test_apply_refuses_a_leader_change_without_a_new_leader_epoch():
    c = three_nodes()
    c.create(rf=3)
    record = PartitionRecord.of("t", 0, PartitionState((1, 2, 3), (1, 2, 3), 2, 0, 1))
    with pytest.raises(AssertionError):
        c.meta.apply(record, len(c.log))


def test_replaying_the_records_rebuilds_the_same_state():
    c = three_nodes()
    c.create("a", partitions=3, rf=2, configs=UNCLEAN)
    c.create("b", partitions=2, rf=3)
    c.fence(1)
    c.alter("b", 0, [c.state("b", 0).leader])
    c.register(1, "x")
    c.commit(c.meta.replication.plan_delete_topic("a"))
    again = replay(c.log)
    assert again.cluster_id == "test-cluster"
    assert (again.brokers, again.topics, again.last_offset) == (c.meta.brokers, c.meta.topics, c.meta.last_offset)


# --- restarts: new incarnations, clean and unclean shutdowns (KIP-966) ---------------


def restarted(c: Cluster, broker: int, clean: bool, directory: str = "") -> list[MetadataRecord]:
    """Broker `broker` comes back as a new process (a new incarnation id)."""
    incarnation = f"inc-{len(c.log)}"
    return c.register(broker, f"node-{broker}", incarnation, directory, clean)


def test_a_clean_restart_of_the_leader_elects_it_again_in_a_new_epoch_and_keeps_the_isr():
    c = three_nodes()
    c.create(rf=3)
    restarted(c, 1, clean=True)
    assert c.state() == PartitionState((1, 2, 3), (1, 2, 3), 1, 1, 1)


@pytest.mark.parametrize("order", [(1, 2, 3), (1, 3, 2), (2, 1, 3), (2, 3, 1), (3, 1, 2), (3, 2, 1)])
def test_a_clean_whole_cluster_restart_keeps_a_moved_leader_whatever_order_the_brokers_return_in(order):
    # Leadership had moved off the first replica (1) to 2 before every broker shut down
    # cleanly; the Controller restarts too, and each broker returns as a new process.
    c = three_nodes()
    c.create(rf=3)
    c.commit([PartitionRecord.of("t", 0, PartitionState((1, 2, 3), (1, 2, 3), 2, 1, 1))])
    c.meta = replay(c.log)
    for broker in order:
        restarted(c, broker, clean=True)
    assert (c.state().leader, c.state().isr, c.state().leader_epoch) == (2, (1, 2, 3), 2)


def test_an_unclean_restart_of_the_leader_moves_leadership_and_leaves_it_recovering_outside_the_isr():
    c = three_nodes()
    c.create(rf=3)
    restarted(c, 1, clean=False)
    assert c.state() == PartitionState((1, 2, 3), (2, 3), 2, 1, 1, recovering=(1,))


def test_a_recovering_replica_stops_recovering_once_its_leader_adds_it_back_to_the_isr():
    c = three_nodes()
    c.create(rf=3)
    restarted(c, 3, clean=False)
    assert (c.state().isr, c.state().recovering) == ((1, 2), (3,))
    c.alter("t", 0, [1, 2, 3])
    assert (c.state().isr, c.state().recovering) == ((1, 2, 3), ())


def test_the_same_process_registering_again_changes_no_partition():
    c = three_nodes()
    c.create(rf=3)
    before = c.state()
    c.meta = replay(c.log)  # the Controller restarted; broker 1 reattaches with its state intact
    assert partition_records(c.register(1, "a")) == []
    assert c.state() == before


@pytest.mark.parametrize("order", [(1, 2, 3), (1, 3, 2), (2, 1, 3), (2, 3, 1), (3, 1, 2), (3, 2, 1)])
def test_after_a_whole_cluster_crash_the_longest_log_leads_whatever_order_the_brokers_return_in(order):
    # The leader (1) lost most of its unflushed tail; the followers kept everything.
    c = three_nodes()
    c.create(rf=3, configs={"min.insync.replicas": "2"})
    before = c.state()
    c.meta = replay(c.log)  # every process was killed: the Controller too
    ends = {1: LogEnd(0, 5_984), 2: LogEnd(0, 20_000), 3: LogEnd(0, 20_000)}
    for broker in order:
        assert c.meta.replication.plan_unclean_recovery("t", 0, ends) == [] or broker == order[-1]
        restarted(c, broker, clean=False)
        assert c.state().leader in (NO_LEADER, 2, 3) or broker != order[-1]
    assert set(c.state().isr) == {1, 2, 3} and c.meta.replication.needs_log_comparison("t", 0)
    c.commit(c.meta.replication.plan_unclean_recovery("t", 0, ends))
    after = c.state()
    assert after.leader == 2 and after.isr == (2,) and set(after.recovering) == {1, 3}
    assert after.leader_epoch > before.leader_epoch


def test_unclean_recovery_prefers_the_latest_leader_epoch_over_a_longer_log():
    c = three_nodes()
    c.create(rf=3)
    c.meta = replay(c.log)
    for broker in (1, 2, 3):
        restarted(c, broker, clean=False)
    c.commit(c.meta.replication.plan_unclean_recovery("t", 0, {1: LogEnd(3, 10), 2: LogEnd(2, 50), 3: LogEnd(3, 9)}))
    assert c.state().leader == 1


def test_unclean_recovery_waits_for_every_isr_member():
    c = three_nodes()
    c.create(rf=3)
    c.meta = replay(c.log)
    restarted(c, 1, clean=False)
    restarted(c, 2, clean=False)
    assert c.state().leader == NO_LEADER and not c.meta.replication.needs_log_comparison("t", 0)
    assert c.meta.replication.plan_unclean_recovery("t", 0, {1: LogEnd(0, 5), 2: LogEnd(0, 5)}) == []


def test_after_a_whole_cluster_crash_the_live_copies_decide_once_a_node_that_never_returns_is_fenced():
    """Broker 3's node never comes back: waiting for its log would keep the partition
    offline for good. Once its session expires (it is fenced) the live copies decide."""
    c = three_nodes()
    c.create(rf=3, configs={"min.insync.replicas": "2"})
    c.meta = replay(c.log)  # every process was killed: the Controller too
    restarted(c, 1, clean=False)
    restarted(c, 2, clean=False)
    ends = {1: LogEnd(0, 900), 2: LogEnd(0, 1_000)}
    assert not c.meta.replication.needs_log_comparison("t", 0), "broker 3 may still register within its session"
    assert c.meta.replication.plan_unclean_recovery("t", 0, ends) == []
    c.fence(3)
    assert c.state().leader == NO_LEADER and c.meta.replication.copies_to_compare("t", 0) == (1, 2)
    assert c.meta.replication.plan_unclean_recovery("t", 0, {1: ends[1]}) == [], "every live copy reports first"
    c.commit(c.meta.replication.plan_unclean_recovery("t", 0, ends))
    after = c.state()
    assert (after.leader, after.isr, after.recovering) == (2, (2,), (1,))
    c.alter("t", 0, [1, 2])  # broker 1 caught up from the new leader
    assert c.state().isr == (1, 2)


def test_an_isr_expansion_from_a_restarted_brokers_old_process_is_ineligible():
    """A fetch sent by broker 3's old process (before it restarted and lost its tail)
    arrives late at the leader: it must not put the new process in the ISR (KIP-903)."""
    c = three_nodes()
    c.create(rf=3)
    c.register(3, "c", "inc-old")
    s = c.state()
    c.commit(c.meta.replication.plan_alter_partition("t", 0, s.leader, s.leader_epoch, s.partition_epoch, [1, 2]))
    restarted(c, 3, clean=False)  # a new process: "inc-<n>"
    s = c.state()
    with pytest.raises(IneligibleReplicaError, match="inc-old"):
        c.meta.replication.plan_alter_partition("t", 0, s.leader, s.leader_epoch, s.partition_epoch, [1, 2, 3], {3: "inc-old"})
    current = c.meta.brokers[3].incarnation_id
    c.commit(c.meta.replication.plan_alter_partition("t", 0, s.leader, s.leader_epoch, s.partition_epoch, [1, 2, 3], {3: current}))
    assert c.state().isr == (1, 2, 3)


def test_a_broker_on_a_replaced_disk_leaves_every_isr_even_as_its_last_member():
    c = three_nodes()
    c.create(rf=2)  # replicas (1, 2)
    c.register(1, "a", "inc-0", "dir-a")
    c.fence(2)
    assert c.state().isr == (1,)
    c.fence(1)
    restarted(c, 1, clean=True, directory="dir-new")  # the empty directory was formatted anew
    state = c.state()
    assert (state.leader, state.isr, state.recovering) == (NO_LEADER, (), ())
    assert not c.meta.replication.needs_log_comparison("t", 0), "an empty log is never the copy to keep"


def test_a_broker_on_a_replaced_disk_follows_and_does_not_lead_while_another_copy_is_in_sync():
    c = three_nodes()
    c.create(rf=3)
    c.register(1, "a", "inc-0", "dir-a")
    restarted(c, 1, clean=True, directory="dir-new")
    assert (c.state().leader, c.state().isr) == (2, (2, 3))


# --- eligible leader replicas (KIP-966's ELR) -----------------------------------------

MIN_ISR_2 = {MIN_INSYNC_REPLICAS: "2"}


def test_replicas_that_leave_an_isr_below_min_insync_replicas_become_eligible_and_leave_once_it_is_big_enough():
    c = three_nodes()
    c.create(rf=3, configs=MIN_ISR_2)
    c.alter("t", 0, [1, 2])
    assert c.state().eligible == (), "an ISR of min.insync.replicas: the HW moves without broker 3"
    c.alter("t", 0, [1])
    assert c.state().eligible == (2,), "broker 2 left an ISR that is now below min.insync.replicas"
    c.alter("t", 0, [1, 3])
    assert c.state().eligible == (), "the HW moves again without broker 2"
    c.alter("t", 0, [1])
    c.alter("t", 0, [1, 3])
    assert c.state().eligible == ()


def test_with_min_insync_replicas_1_no_replica_is_ever_eligible():
    c = three_nodes()
    c.create(rf=3)
    c.alter("t", 0, [1])
    c.fence(1)
    assert c.state().eligible == () and c.state().leader == NO_LEADER and c.state().isr == (1,)


def test_an_eligible_replica_leads_when_the_last_in_sync_replica_is_fenced():
    """The ISR shrank to the leader alone (its followers stopped fetching), then the
    leader's node is lost: an ELR member holds every committed record, since the HW stood
    still below min.insync.replicas, and leads; the lost leader becomes eligible."""
    c = three_nodes()
    c.create(rf=3, configs=MIN_ISR_2)
    c.alter("t", 0, [1, 2])
    c.alter("t", 0, [1])
    c.fence(1)
    s = c.state()
    assert (s.leader, s.isr, s.eligible, s.leader_epoch) == (2, (2,), (1,), 1)
    assert 3 not in s.eligible, "broker 3 left an ISR of min.insync.replicas: it may lack committed records"


def test_an_eligible_replica_that_restarted_uncleanly_leads_only_after_its_log_is_compared():
    """The issue's crash: every process dies, the in-sync leader's node never returns, the
    eligible replica restarted without a clean shutdown. Once the lost broker is fenced,
    the eligible copy's log decides instead of the partition staying offline for good."""
    c = three_nodes()
    c.create(rf=3, configs=MIN_ISR_2)
    c.alter("t", 0, [1, 3])
    c.fence(1)
    assert (c.state().leader, c.state().eligible) == (3, (1,))
    c.meta.attached.clear()  # a whole-cluster crash: the Controller's new session knows no broker
    c.register(1, "a", incarnation="again", clean=False)  # broker 3 does not come back
    s = c.state()
    assert 1 in s.recovering and s.eligible == (1,)
    assert c.meta.replication.copies_to_compare("t", 0) == (), "broker 3 may still come back"
    c.fence(3)  # its session expired
    s = c.state()
    assert (s.leader, s.isr, s.eligible) == (NO_LEADER, (3,), (1,)), "broker 1 may have lost its tail"
    assert c.meta.replication.copies_to_compare("t", 0) == (1,)
    c.commit(c.meta.replication.plan_unclean_recovery("t", 0, {1: LogEnd(0, 100)}))
    s = c.state()
    assert (s.leader, s.isr, s.eligible) == (1, (1,), (3,)) and 1 not in s.recovering


def test_an_eligible_replica_whose_disk_was_replaced_is_no_longer_eligible():
    c = three_nodes()
    c.create(rf=3, configs=MIN_ISR_2)
    c.register(2, "b", incarnation="first", directory="disk-1")
    c.alter("t", 0, [1])
    assert c.state().eligible == (2, 3)
    c.register(2, "b", incarnation="second", directory="disk-2", clean=False)
    assert c.state().eligible == (3,), "an empty log can never be the copy to keep"


def test_a_new_min_insync_replicas_empties_the_elr():
    c = three_nodes()
    c.create(rf=3, configs=MIN_ISR_2)
    c.alter("t", 0, [1])
    before = c.state()
    assert before.eligible == (2, 3)
    c.commit(c.meta.replication.plan_min_insync_change("t"))
    after = c.state()
    assert after.eligible == () and after.partition_epoch == before.partition_epoch + 1
    assert c.meta.replication.plan_min_insync_change("t") == []


def test_an_unclean_election_empties_the_elr():
    c = three_nodes()
    c.create(rf=3, configs={**MIN_ISR_2, UNCLEAN_LEADER_ELECTION_ENABLE: "true"})
    c.alter("t", 0, [1, 2])
    c.alter("t", 0, [1])
    c.fence(2)
    c.fence(1)
    s = c.state()
    assert (s.leader, s.isr, s.eligible) == (3, (3,), ()), "broker 3 holds less than brokers 1 and 2 did"


def test_the_elr_survives_a_replay_of_the_metadata_log():
    c = three_nodes()
    c.create(rf=3, configs=MIN_ISR_2)
    c.alter("t", 0, [1])
    assert replay(c.log).partition("t", 0) == c.state() and c.state().eligible == (2, 3)


# --- replica failures ----------------------------------------------------------------


def test_a_failed_leader_replica_hands_leadership_to_an_in_sync_follower():
    c = three_nodes()
    c.create(rf=3)
    c.commit(c.meta.replication.plan_replica_failed("t", 0, 1))
    assert c.state() == PartitionState((1, 2, 3), (2, 3), 2, 1, 1)
    assert c.meta.live_brokers == {1, 2, 3}, "a replica failure is not a broker failure"


def test_a_failed_follower_replica_leaves_the_isr_and_the_leader_stays():
    c = three_nodes()
    c.create(rf=3)
    c.commit(c.meta.replication.plan_replica_failed("t", 0, 3))
    assert c.state() == PartitionState((1, 2, 3), (1, 2), 1, 0, 1)


def test_a_failed_replica_that_is_the_only_copy_leads_again_in_a_new_epoch():
    c = three_nodes()
    c.create(rf=3)
    c.alter("t", 0, [1])
    c.commit(c.meta.replication.plan_replica_failed("t", 0, 1))
    assert c.state() == PartitionState((1, 2, 3), (1,), 1, 1, 2)


def test_a_replica_failure_of_a_broker_without_that_replica_is_refused():
    c = Cluster({1: "a", 2: "b", 3: "c", 4: "d"})
    c.create(rf=3)
    with pytest.raises(NotLeaderOrFollowerError):
        c.meta.replication.plan_replica_failed("t", 0, 4)


# --- AlterPartition retries ----------------------------------------------------------


def test_alter_partition_retried_after_it_was_committed_succeeds_with_no_records():
    c = three_nodes()
    c.create(rf=3)
    s = c.state()
    c.alter("t", 0, [1, 2])
    # The same request again, with the partition epoch it was first sent with.
    assert c.meta.replication.plan_alter_partition("t", 0, 1, s.leader_epoch, s.partition_epoch, [1, 2]) == []


# --- reassignments (KIP-455) -----------------------------------------------------------


def test_a_reassignment_adds_the_new_replica_first_and_drops_the_old_one_once_it_is_in_sync():
    c = Cluster({1: "a", 2: "b", 3: "c", 4: "d"})
    c.create(rf=3)  # replicas (1, 2, 3)
    c.commit(c.meta.replication.plan_reassign("t", 0, [4, 2, 3]))
    moving = c.state()
    assert (moving.replicas, moving.adding, moving.removing) == ((4, 2, 3, 1), (4,), (1,))
    assert (moving.leader, moving.isr) == (1, (1, 2, 3))
    c.alter("t", 0, [1, 2, 3, 4])  # broker 4 caught up
    done = c.state()
    assert (done.replicas, done.adding, done.removing) == ((4, 2, 3), (), ())
    assert done.isr == (4, 2, 3) and done.leader == 4 and done.leader_epoch == moving.leader_epoch + 1


def test_cancelling_a_reassignment_reverts_to_the_original_replicas():
    c = Cluster({1: "a", 2: "b", 3: "c", 4: "d"})
    c.create(rf=3)
    c.commit(c.meta.replication.plan_reassign("t", 0, [4, 2, 3]))
    c.commit(c.meta.replication.plan_reassign("t", 0, None))
    state = c.state()
    # As in Kafka, the reverted replica list keeps the reassignment's order (target first).
    assert (set(state.replicas), state.isr, state.leader, state.adding, state.removing) == ({1, 2, 3}, (1, 2, 3), 1, (), ())


def test_replacing_a_reassignment_keeps_the_replicas_it_was_adding_until_the_new_target_is_in_sync():
    # [1, 2] -> [3, 4]; 3 catches up, then 1 and 2 die: 3 is the only in-sync copy. A new
    # target [5, 6] must not drop 3 (nor delete its log) before 5 and 6 have everything.
    c = Cluster({b: f"n{b}" for b in range(1, 7)})
    c.create(rf=2)
    assert c.state().replicas == (1, 2)
    c.commit(c.meta.replication.plan_reassign("t", 0, [3, 4]))
    c.alter("t", 0, [1, 2, 3])
    c.fence(1)
    c.fence(2)
    assert (c.state().leader, c.state().isr) == (3, (3,))
    c.commit(c.meta.replication.plan_reassign("t", 0, [5, 6]))
    state = c.state()
    assert (state.leader, state.isr) == (3, (3,))
    assert set(state.replicas) == {1, 2, 3, 4, 5, 6} and set(state.adding) == {5, 6}
    c.alter("t", 0, [3, 5, 6])
    assert (c.state().replicas, c.state().isr, c.state().leader) == ((5, 6), (5, 6), 5)


def test_unclean_election_waits_while_an_in_sync_replica_lives_though_not_yet_registered_again():
    c = Cluster({1: "a", 2: "b", 3: "c"}, BrokerConfig(unclean_leader_election_enable=True))
    c.create(rf=3)
    c.alter("t", 0, [1, 2])
    c.meta = replay(c.log, c.config)  # a Controller restart: 1 and 2 live but not attached yet
    c.fence(1)
    c.register(3, "c")
    assert c.state().leader == NO_LEADER, "broker 2 may still hold every record"
    c.fence(2)
    assert (c.state().leader, c.state().isr) == (3, (3,))


def test_cancelling_where_no_reassignment_runs_raises():
    c = three_nodes()
    c.create(rf=3)
    with pytest.raises(NoReassignmentInProgressError):
        c.meta.replication.plan_reassign("t", 0, None)


@pytest.mark.parametrize("target", [[], [1, 1], [1, 99]])
def test_an_invalid_reassignment_target_raises(target):
    c = three_nodes()
    c.create(rf=3)
    with pytest.raises(InvalidReplicaAssignmentError):
        c.meta.replication.plan_reassign("t", 0, target)


def test_reassigning_to_the_current_replicas_changes_nothing():
    c = three_nodes()
    c.create(rf=3)
    assert c.meta.replication.plan_reassign("t", 0, [1, 2, 3]) == []


# --- random operations: invariants and replay ----------------------------------------


class ClusterMachine(RuleBasedStateMachine):
    """Random creates, crashes, restarts (clean, unclean, on a new disk), fences, Controller
    restarts, writes, catch-ups, ISR changes, reassignments, replica failures, config
    changes and deletes, against a model of what each replica's log holds.

    The model: per partition the high watermark `hw` (every record below it was
    acknowledged) and per replica its log end offset `leo`. A write needs a running leader
    and every ISR member running, and at least min.insync.replicas of them (the strict min
    ISR of KIP-966), and gives the ISR the new records. A crash without a
    clean shutdown may cut a replica's log to any shorter length; a replaced disk empties
    it. `holders` are the ISR and ELR members that hold every acknowledged record: Kafka's
    promise covers those (a replica that left the ISR may have missed writes, as far as the
    Controller knows, unless it is in the ELR). The safety property, checked after every step: while some holder
    is left, a leader that serves is one of them (unless the topic allows unclean elections).
    """

    @initialize(brokers=st.integers(3, 5), nodes=st.integers(2, 3), unclean_default=st.booleans())
    def start(self, brokers, nodes, unclean_default):
        self.config = BrokerConfig(unclean_leader_election_enable=unclean_default)
        self.nodes = nodes
        self.c = Cluster({b: f"node-{b % nodes}" for b in range(brokers)}, self.config)
        self.broker_ids = list(range(brokers))
        self.running = set(self.broker_ids)  # processes alive, with their in-memory state
        self.crashed: set[int] = set()  # stopped without a clean shutdown
        self.incarnation = dict.fromkeys(self.broker_ids, 0)
        self.directory = dict.fromkeys(self.broker_ids, 0)
        self.next_topic = 0
        self.seen: dict[tuple[str, str, int], PartitionState] = {}  # (topic id, topic, p) -> last state
        self.hw: dict[tuple[str, int], int] = {}  # (topic id, p) -> acknowledged end
        self.leo: dict[tuple[str, int], dict[int, int]] = {}  # (topic id, p) -> broker -> its log end
        self.holders: dict[tuple[str, int], set[int]] = {}  # (topic id, p) -> ISR members with every acked record

    # -- helpers

    def partitions(self) -> list[tuple[str, int, PartitionState]]:
        return [(n, p, s) for n, t in sorted(self.c.meta.topics.items()) for p, s in sorted(t.partitions.items())]

    def key(self, name: str, p: int) -> tuple[str, int]:
        return (self.c.meta.topics[name].topic_id, p)

    def unclean(self, name: str) -> bool:
        raw = self.c.meta.configs.of(name).get(UNCLEAN_LEADER_ELECTION_ENABLE)
        return self.config.unclean_leader_election_enable if raw is None else raw == "true"

    def min_insync(self, name: str) -> int:
        return min_insync_replicas_of(self.c.meta.configs.of(name), self.config)

    def settle(self) -> None:
        """Holders are ISR and ELR members: the previous step's ISR changes take effect
        (after the invariants checked the step against the holders before it)."""
        for name, p, s in self.partitions():
            key = self.key(name, p)
            members = set(s.isr) | set(s.eligible)
            self.holders[key] = {r for r in self.holders[key] & members if self.leo[key].get(r, 0) >= self.hw[key]}

    def register(self, broker: int, clean: bool) -> None:
        self.c.register(
            broker, f"node-{broker % self.nodes}", f"inc-{self.incarnation[broker]}", f"dir-{self.directory[broker]}", clean
        )
        self.running.add(broker)
        self.recover_uncleanly()

    def recover_uncleanly(self) -> None:
        """What the Controller does for partitions whose every in-sync copy restarted uncleanly."""
        for name, p, s in self.partitions():
            if self.c.meta.replication.needs_log_comparison(name, p):
                leo = self.leo[self.key(name, p)]
                ends = {r: LogEnd(0, leo.get(r, 0)) for r in (*s.isr, *s.eligible)}
                self.c.commit(self.c.meta.replication.plan_unclean_recovery(name, p, ends))

    # -- rules

    @rule(
        partitions=st.integers(1, 3),
        rf=st.integers(1, 3),
        unclean=st.sampled_from([None, "true", "false"]),
        min_insync=st.sampled_from([None, 1, 2, 3]),
    )
    def create_topic(self, partitions, rf, unclean, min_insync):
        self.settle()
        name = f"t{self.next_topic}"
        self.next_topic += 1
        configs = {} if unclean is None else {UNCLEAN_LEADER_ELECTION_ENABLE: unclean}
        if min_insync is not None:
            configs[MIN_INSYNC_REPLICAS] = str(min_insync)
        live = self.c.meta.live_brokers
        if rf > len(live):
            with pytest.raises(InvalidReplicationFactorError):
                self.c.meta.replication.plan_create_topic(name, partitions, rf, configs, f"id-{name}")
            return
        self.c.create(name, partitions, rf, configs)
        for p, state in self.c.meta.topics[name].partitions.items():
            assert set(state.replicas) <= live
            assert state.isr == state.replicas and state.leader == state.replicas[0]
            self.hw[self.key(name, p)] = 0
            self.leo[self.key(name, p)] = dict.fromkeys(state.replicas, 0)
            self.holders[self.key(name, p)] = set(state.replicas)

    @rule(data=st.data(), records=st.integers(1, 5))
    def write(self, data, records):
        self.settle()
        writable = [  # the HW moves only with min.insync.replicas in sync (KIP-966's strict min ISR)
            (n, p, s)
            for n, p, s in self.partitions()
            if s.leader != NO_LEADER
            and set(s.isr) <= self.running
            and len(s.isr) >= min(self.min_insync(n), len(s.replicas))
        ]
        if not writable:
            return
        name, p, s = data.draw(st.sampled_from(writable))
        leo = self.leo[self.key(name, p)]
        end = leo[s.leader] + records
        for r in s.isr:
            leo[r] = end
        self.hw[self.key(name, p)] = end
        self.holders[self.key(name, p)] = set(s.isr)

    @rule(data=st.data())
    def catch_up(self, data):
        """A running follower copies the leader's log (after truncating where it diverged)
        and the leader adds it to the ISR."""
        self.settle()
        candidates = [
            (n, p, s, r)
            for n, p, s in self.partitions()
            if s.leader in self.running
            for r in s.replicas
            if r not in s.isr and r in self.running and r in self.c.meta.live_brokers
        ]
        if not candidates:
            return
        name, p, s, r = data.draw(st.sampled_from(candidates))
        leo = self.leo[self.key(name, p)]
        leo[r] = leo[s.leader]
        if s.leader in self.holders[self.key(name, p)]:
            self.holders[self.key(name, p)].add(r)
        self.c.alter(name, p, [*s.isr, r])
        after = self.c.state(name, p)
        if r in after.replicas:  # else a reassignment that was removing it just completed
            assert r in after.isr and r not in after.recovering

    @rule(data=st.data())
    def shrink_isr(self, data):
        """A leader drops the ISR members that stopped fetching (their process is gone)."""
        self.settle()
        candidates = [
            (n, p, s)
            for n, p, s in self.partitions()
            if s.leader in self.running and not set(s.isr) <= self.running
        ]
        if not candidates:
            return
        name, p, s = data.draw(st.sampled_from(candidates))
        self.c.alter(name, p, [r for r in s.isr if r in self.running])

    def lose_tails(self, broker: int, data, disk_lost: bool) -> None:
        """A crash: each of the broker's logs may lose any part of its unflushed tail; a
        replaced disk loses everything."""
        for key, leo in self.leo.items():
            if broker not in leo:
                continue
            if disk_lost:
                leo[broker] = 0
            elif leo[broker] and not data.draw(st.booleans(), label=f"{broker} keeps its tail in {key}"):
                leo[broker] = data.draw(st.integers(0, leo[broker] - 1), label=f"log end of {broker} in {key}")
            if leo[broker] < self.hw[key]:
                self.holders[key].discard(broker)

    @precondition(lambda self: bool(self.running))
    @rule(detected=st.booleans(), disk_lost=st.booleans(), data=st.data())
    def crash(self, detected, disk_lost, data):
        """A broker process (or its node) dies; the Controller notices (fences it) or not yet."""
        self.settle()
        broker = data.draw(st.sampled_from(sorted(self.running)), label="crashing broker")
        self.running.discard(broker)
        self.crashed.add(broker)
        self.lose_tails(broker, data, disk_lost)
        if disk_lost:
            self.directory[broker] += 1
        if detected:
            self.c.fence(broker)

    @rule(data=st.data())
    def whole_cluster_crashes(self, data):
        """Every process dies at once (the Controller too) and every log may lose its tail."""
        self.settle()
        for broker in sorted(self.running):
            self.running.discard(broker)
            self.crashed.add(broker)
            self.lose_tails(broker, data, disk_lost=False)
        self.c.meta = replay(self.c.log, self.config)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def stop_cleanly(self, data):
        """A clean shutdown: logs flushed, the clean-shutdown marker written."""
        self.settle()
        self.running.discard(data.draw(st.sampled_from(sorted(self.running)), label="stopping broker"))

    @precondition(lambda self: set(self.broker_ids) - self.running)
    @rule(data=st.data())
    def restart(self, data):
        """A stopped broker process starts again, with or without its clean-shutdown marker."""
        self.settle()
        broker = data.draw(st.sampled_from(sorted(set(self.broker_ids) - self.running)), label="restarting broker")
        self.incarnation[broker] += 1
        self.register(broker, clean=broker not in self.crashed)
        self.crashed.discard(broker)

    @rule()
    def controller_restarts(self):
        """The Controller replays its log: no broker is attached until it registers again."""
        self.settle()
        self.c.meta = replay(self.c.log, self.config)

    @rule(i=st.integers(0, 4))
    def reattach(self, i):
        """A running broker registers with a restarted Controller (or after being fenced)."""
        self.settle()
        broker = self.broker_ids[i % len(self.broker_ids)]
        if broker in self.running:
            self.register(broker, clean=True)

    @rule(data=st.data())
    def replica_fails(self, data):
        """A replica process dies while its broker runs: its log is intact, it is re-created."""
        self.settle()
        candidates = [(n, p, r) for n, p, s in self.partitions() for r in s.replicas if r in self.c.meta.attached]
        if not candidates:
            return
        name, p, r = data.draw(st.sampled_from(candidates))
        self.c.commit(self.c.meta.replication.plan_replica_failed(name, p, r))

    @precondition(lambda self: bool(self.c.meta.topics))
    @rule(data=st.data(), cancel=st.booleans())
    def reassign(self, data, cancel):
        self.settle()
        name, p, s = data.draw(st.sampled_from(self.partitions()))
        if cancel:
            if s.adding or s.removing:
                try:
                    self.c.commit(self.c.meta.replication.plan_reassign(name, p, None))
                except InvalidReplicaAssignmentError:
                    pass
            return
        target = data.draw(st.lists(st.sampled_from(self.broker_ids), min_size=1, max_size=3, unique=True))
        leo = self.leo[self.key(name, p)]
        for r in target:
            leo.setdefault(r, 0)
        self.c.commit(self.c.meta.replication.plan_reassign(name, p, target))

    @precondition(lambda self: bool(self.c.meta.topics))
    @rule(data=st.data(), stale=st.sampled_from(["leader", "leader_epoch", "partition_epoch"]))
    def stale_alter_partition_is_refused(self, data, stale):
        name, p, s = data.draw(st.sampled_from(self.partitions()))
        leader, leader_epoch, partition_epoch = s.leader, s.leader_epoch, s.partition_epoch
        new_isr = [r for r in s.replicas if r != s.leader] if s.leader != NO_LEADER else list(s.replicas)
        if stale == "leader":
            leader = next(b for b in self.broker_ids if b != s.leader)
            error = NotLeaderOrFollowerError
        elif stale == "leader_epoch":
            leader_epoch -= 1
            error = FencedLeaderEpochError
        else:
            if s.leader == NO_LEADER or set(s.replicas) == set(s.isr):
                return  # the same ISR is answered as committed, whatever the partition epoch
            new_isr = list(s.replicas)
            partition_epoch -= 1
            error = InvalidUpdateVersionError
        with pytest.raises(error):
            self.c.meta.replication.plan_alter_partition(name, p, leader, leader_epoch, partition_epoch, new_isr)

    @precondition(lambda self: bool(self.c.meta.topics))
    @rule(data=st.data(), unclean=st.booleans())
    def elect_leader(self, data, unclean):
        """ElectLeaders (preferred or unclean) on any partition; the invariants must hold
        whatever it elects, and a preferred election never loses acknowledged records."""
        self.settle()
        name, p, s = data.draw(st.sampled_from(self.partitions()))
        try:
            records = self.c.commit(self.c.meta.replication.plan_elect_leader(name, p, unclean))
        except (ElectionNotNeededError, PreferredLeaderNotAvailableError, EligibleLeadersNotAvailableError):
            return
        new = self.c.meta.partition(name, p)
        assert len(records) == 1 and new.leader_epoch == s.leader_epoch + 1
        if unclean:
            self.holders[self.key(name, p)] &= {new.leader}  # what the new leader lacks is gone
            if not self.holders[self.key(name, p)]:
                self.holders[self.key(name, p)] = {new.leader}
                self.hw[self.key(name, p)] = min(self.hw[self.key(name, p)], self.leo[self.key(name, p)].get(new.leader, 0))
        else:
            assert new.leader == s.target_replicas[0] and new.leader in s.isr

    @precondition(lambda self: bool(self.c.meta.topics))
    @rule(data=st.data(), more=st.integers(1, 2))
    def add_partitions(self, data, more):
        self.settle()
        name = data.draw(st.sampled_from(sorted(self.c.meta.topics)))
        before = len(self.c.meta.topics[name].partitions)
        rf = len(self.c.meta.topics[name].partitions[0].target_replicas)  # a reassignment's drops not counted
        if rf > len(self.c.meta.live_brokers):
            with pytest.raises(InvalidReplicationFactorError):
                self.c.meta.replication.plan_create_partitions(name, before + more)
            return
        self.c.commit(self.c.meta.replication.plan_create_partitions(name, before + more))
        for p in range(before, before + more):
            state = self.c.meta.partition(name, p)
            self.hw[self.key(name, p)] = 0
            self.leo[self.key(name, p)] = dict.fromkeys(state.replicas, 0)
            self.holders[self.key(name, p)] = set(state.replicas)

    @precondition(lambda self: bool(self.c.meta.topics))
    @rule(data=st.data(), unclean=st.sampled_from(["true", "false"]), min_insync=st.sampled_from([None, 1, 2, 3]))
    def alter_configs(self, data, unclean, min_insync):
        """As the Controller alters a topic's configs: a new min.insync.replicas empties its ELRs."""
        self.settle()
        name = data.draw(st.sampled_from(sorted(self.c.meta.topics)))
        configs = {UNCLEAN_LEADER_ELECTION_ENABLE: unclean}
        if min_insync is not None:
            configs[MIN_INSYNC_REPLICAS] = str(min_insync)
        records = self.c.meta.configs.plan_alter_topic_configs(name, configs)
        if self.c.meta.configs.of(name).get(MIN_INSYNC_REPLICAS) != configs.get(MIN_INSYNC_REPLICAS):
            records += self.c.meta.replication.plan_min_insync_change(name)
        self.c.commit(records)

    @precondition(lambda self: bool(self.c.meta.topics))
    @rule(data=st.data())
    def delete_topic(self, data):
        self.settle()
        name = data.draw(st.sampled_from(sorted(self.c.meta.topics)))
        self.c.commit(self.c.meta.replication.plan_delete_topic(name))
        assert name not in self.c.meta.topics

    # -- invariants

    @invariant()
    def leaders_hold_every_acknowledged_record(self):
        if not hasattr(self, "c"):
            return
        for name, p, s in self.partitions():
            key = self.key(name, p)
            # A leader that crashed is not serving; it is elected again when it restarts.
            if s.leader in self.running and not self.unclean(name) and self.holders[key]:
                assert s.leader in self.holders[key], (
                    f"{name}-{p}: leader {s.leader} while {sorted(self.holders[key])} hold every acknowledged"
                    f" record: log ends {self.leo[key]}, {self.hw[key]} acknowledged ({s})"
                )

    @invariant()
    def partitions_are_consistent(self):
        if not hasattr(self, "c"):
            return
        live, attached = self.c.meta.live_brokers, self.c.meta.attached
        for name, p, s in self.partitions():
            s.check()
            if s.leader != NO_LEADER:
                assert s.leader in live, f"{name}-{p}: leader {s.leader} is fenced"
                assert s.leader not in s.recovering, f"{name}-{p}: leader {s.leader} is recovering"
            elif set(s.replicas) <= attached and s.isr and not self.unclean(name):
                # Everyone is back: leaderless only while a comparison of logs is pending,
                # or because every in-sync copy is gone.
                assert self.c.meta.replication.needs_log_comparison(name, p) or not (set(s.isr) - set(s.recovering)), (
                    f"{name}-{p}: leaderless with every replica back: {s}"
                )

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


ClusterMachine.TestCase.settings = settings(max_examples=1000, stateful_step_count=25, deadline=None)
test_cluster_metadata_state_machine = ClusterMachine.TestCase


# --- brokers leaving the cluster --------------------------------------------------------


def test_a_decommissioning_broker_gets_no_new_replica_but_keeps_what_it_holds():
    c = Cluster({1: "a", 2: "b", 3: "c", 4: "d"})
    c.create("before", partitions=4, rf=2)
    held = {p: s.replicas for p, s in c.meta.topics["before"].partitions.items()}
    c.commit(c.meta.plan_decommission_broker(4))
    assert c.meta.placeable_brokers == {1, 2, 3} and c.meta.live_brokers == {1, 2, 3, 4}
    c.create("after", partitions=6, rf=3)
    c.commit(c.meta.replication.plan_create_partitions("before", 8))
    assert all(4 not in s.replicas for s in c.meta.topics["after"].partitions.values())
    assert all(4 not in c.state("before", p).replicas for p in (4, 5, 6, 7))
    assert {p: c.state("before", p).replicas for p in held} == held
    assert c.meta.plan_decommission_broker(4) == [], "already leaving"


def test_decommissioning_is_refused_when_the_others_cannot_hold_a_partition_on_brokers_apart():
    c = three_nodes()
    c.create("t", partitions=2, rf=3)
    with pytest.raises(PolicyViolationError, match="t-0 has 3 replicas and only 2 other brokers"):
        c.meta.plan_decommission_broker(1)
    with pytest.raises(BrokerNotAvailableError):
        c.meta.plan_decommission_broker(9)
    c.register(4, "d")
    assert c.commit(c.meta.plan_decommission_broker(1)) == [DecommissionBrokerRecord(1, decommissioning=True)]


def test_a_broker_is_unregistered_only_once_it_holds_nothing_and_a_restart_keeps_it_leaving():
    c = Cluster({1: "a", 2: "b", 3: "c", 4: "d"})
    c.create("t", partitions=1, rf=3)  # on 1, 2, 3
    c.commit(c.meta.plan_decommission_broker(1))
    c.register(1, "a", incarnation="again")
    assert c.meta.brokers[1].decommissioning, "a restart does not end a decommission"
    with pytest.raises(InvalidRequestError, match="still holds replicas of 1 partitions"):
        c.meta.plan_unregister_broker(1)
    c.commit(c.meta.replication.plan_reassign("t", 0, [4, 2, 3]))
    c.alter("t", 0, list(c.state().replicas))  # the new replica caught up: the reassignment completes
    assert c.state().replicas == (4, 2, 3)
    assert c.commit(c.meta.plan_unregister_broker(1)) == [UnregisterBrokerRecord(1)]
    assert 1 not in c.meta.brokers and 1 not in c.meta.attached
    again = replay(c.log)
    assert again.brokers == c.meta.brokers and again.placeable_brokers == {2, 3, 4}


def test_the_image_keeps_a_decommission():
    c = Cluster({1: "a", 2: "b"})
    c.commit(c.meta.plan_decommission_broker(2))
    restored = ClusterMetadata()
    restored.restore(c.meta.snapshot())
    assert restored.brokers[2].decommissioning and restored.placeable_brokers == {1}
