"""The balancer's planner (rayk/metadata/balancer.py), pure: Cruise Control's goals in
order, never a higher goal made worse, the bound on moves per broker, a fixed point when
plans are applied one after another, nothing to do on a balanced cluster."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayk.metadata.balancer import (
    DISK_BALANCE_MIN_GAP_BYTES,
    BalancePlan,
    BalancerBroker,
    BalancerPartition,
    REPLICAS,
    Move,
    partitions_of,
    plan_balance,
    score_of,
)
from rayk.metadata.cluster_metadata import ClusterMetadata
from rayk.metadata.records import ClusterIdRecord

MAX_ROUNDS = 200  # far more than any generated cluster needs to settle


@st.composite
def clusters(draw, leaving: bool = True, moving: bool = True, sizes: bool = True, caps: bool = True):
    """(brokers, partitions, bound): up to 7 brokers on up to 3 nodes, some leaving, some
    with caps; up to 16 partitions placed anyhow (not balanced), some under reassignment,
    some not in sync or leaderless."""
    n = draw(st.integers(1, 7))
    nodes = draw(st.lists(st.sampled_from("abc"), min_size=n, max_size=n))
    leaving_ids = set(draw(st.sets(st.integers(0, n - 1), max_size=n - 1))) if leaving else set()
    brokers = [
        BalancerBroker(b, nodes[b], draw(st.none() | st.integers(2, 12)) if caps else None, b in leaving_ids)
        for b in range(n)
    ]
    partitions = []
    for p in range(draw(st.integers(0, 16))):
        rf = draw(st.integers(1, n))
        replicas = tuple(draw(st.permutations(range(n)))[:rf])
        size = draw(st.sampled_from([0, 1, 5, 20, 80, 300])) * 2**20 if sizes else 0
        kind = draw(st.sampled_from(["steady"] * 6 + ["out of sync", "leaderless"] + (["moving"] if moving else [])))
        if kind == "moving" and rf > 1:
            partitions.append(BalancerPartition("t", p, replicas, replicas[0], replicas, adding=replicas[:1],
                                                removing=replicas[-1:], size_bytes=size))
        elif kind == "out of sync" and rf > 1:
            partitions.append(BalancerPartition("t", p, replicas, replicas[0], replicas[:1], size_bytes=size))
        elif kind == "leaderless":
            partitions.append(BalancerPartition("t", p, replicas, -1, replicas, size_bytes=size))
        else:
            partitions.append(BalancerPartition("t", p, replicas, replicas[0], replicas, size_bytes=size))
    return brokers, partitions, draw(st.integers(1, 5))


def applied(partitions: list[BalancerPartition], moves: tuple[Move, ...]) -> list[BalancerPartition]:
    """The partitions once every move completed (and its preferred leader was elected)."""
    targets = {(m.topic, m.partition): m.replicas for m in moves}
    out = []
    for p in partitions:
        new = targets.get(p.key)
        out.append(p if new is None else BalancerPartition(p.topic, p.partition, new, new[0], new, size_bytes=p.size_bytes))
    return out


def completed(partitions: list[BalancerPartition]) -> list[BalancerPartition]:
    """Every reassignment under way completed, every partition led and in sync."""
    return [BalancerPartition(p.topic, p.partition, p.target, p.target[0], p.target, size_bytes=p.size_bytes)
            for p in partitions]


def shortfall(brokers: list[BalancerBroker], replicas: tuple[int, ...]) -> int:
    node = {b.broker_id: b.node_id for b in brokers}
    placeable_nodes = {b.node_id for b in brokers if not b.leaving}
    return max(0, min(len(replicas), len(placeable_nodes)) - len({node[r] for r in replicas}))


PROPERTIES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTIES
@given(clusters())
def test_a_plan_never_makes_a_higher_goal_worse_and_its_score_is_what_the_moves_give(cluster):
    brokers, partitions, bound = cluster
    plan = plan_balance(brokers, partitions, bound)
    assert plan.score_before == score_of(brokers, partitions)
    assert plan.score_after == score_of(brokers, applied(partitions, plan.moves))
    assert plan.score_after < plan.score_before if plan.moves else plan.score_after == plan.score_before


@PROPERTIES
@given(clusters())
def test_moves_respect_the_bound_leave_moving_partitions_alone_and_go_only_to_placeable_brokers(cluster):
    brokers, partitions, bound = cluster
    plan = plan_balance(brokers, partitions, bound)
    by_key = {p.key: p for p in partitions}
    in_flight = Counter(b for p in partitions for b in (*p.adding, *p.removing))
    touches = in_flight.copy()
    leaving = {b.broker_id for b in brokers if b.leaving}
    for move in plan.moves:
        before = by_key[(move.topic, move.partition)]
        assert not before.moving and before.leader != -1, f"{move} moves a partition being reassigned or leaderless"
        assert move.previous == before.target and len(set(move.replicas)) == len(move.replicas) == len(move.previous)
        added = set(move.replicas) - set(move.previous)
        assert not added & leaving, f"{move} puts a replica on a leaving broker"
        if not set(move.previous) & leaving:
            assert before.steady, f"{move} moves a partition not in sync for a goal after 'leaving'"
        touches.update(set(move.replicas) ^ set(move.previous))
    for b, n in touches.items():
        assert n <= max(bound, in_flight[b]), f"broker {b} touched by {n} moves, bound {bound}"


@PROPERTIES
@given(clusters())
def test_capacity_is_never_exceeded_and_node_diversity_never_broken(cluster):
    brokers, partitions, bound = cluster
    plan = plan_balance(brokers, partitions, bound)
    before = Counter(b for p in partitions for b in p.target)
    after = Counter(b for p in applied(partitions, plan.moves) for b in p.target)
    for broker in brokers:
        if broker.capacity is not None:
            assert after[broker.broker_id] <= max(broker.capacity, before[broker.broker_id])
    leaving = {b.broker_id for b in brokers if b.leaving}
    for move in plan.moves:
        if not set(move.previous) & leaving:
            assert shortfall(brokers, move.replicas) <= shortfall(brokers, move.previous), move


@PROPERTIES
@given(clusters())
def test_plans_applied_one_after_another_reach_a_fixed_point_with_the_score_falling_each_time(cluster):
    brokers, partitions, bound = cluster
    partitions = completed(partitions)
    scores = []
    for _ in range(MAX_ROUNDS):
        plan = plan_balance(brokers, partitions, bound)
        if not plan.moves:
            break
        scores.append(plan.score_after)
        partitions = applied(partitions, plan.moves)
    else:
        raise AssertionError(f"no fixed point after {MAX_ROUNDS} plans; scores {scores[-5:]}")
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores), "the score fell every round"
    assert not plan_balance(brokers, partitions, bound).moves, "a settled cluster stays settled"


@PROPERTIES
@given(clusters(leaving=False, caps=False, sizes=False), st.randoms(use_true_random=False))
def test_the_plan_is_deterministic_whatever_the_order_of_the_partitions(cluster, rnd):
    brokers, partitions, bound = cluster
    shuffled = list(partitions)
    rnd.shuffle(shuffled)
    assert plan_balance(brokers, partitions, bound) == plan_balance(brokers, shuffled, bound)


@PROPERTIES
@given(st.integers(1, 6), st.integers(1, 3), st.integers(0, 30), st.integers(0, 10_000))
def test_a_balanced_cluster_gives_no_moves(brokers_count, rf, partitions_count, seed):
    """Counts within 1 of the mean (replicas and preferred leaders), one node per broker."""
    rf = min(rf, brokers_count)
    brokers = [BalancerBroker(b, f"node-{b}") for b in range(brokers_count)]
    order = list(range(brokers_count))
    random.Random(seed).shuffle(order)
    # Partition i on consecutive brokers of a shuffled ring: leaders i, i+1, ...; replicas
    # spread evenly for every i once partitions_count is a multiple of the broker count
    partitions_count -= partitions_count % brokers_count
    partitions = []
    for i in range(partitions_count):
        replicas = tuple(order[(i + j) % brokers_count] for j in range(rf))
        partitions.append(BalancerPartition("t", i, replicas, replicas[0], replicas))
    plan = plan_balance(brokers, partitions)
    assert plan.moves == () and plan.score_before == (0, 0, 0, 0, 0, 0)


def steady(topic: str, partition: int, replicas: tuple[int, ...], size_bytes: int = 0) -> BalancerPartition:
    return BalancerPartition(topic, partition, replicas, replicas[0], replicas, size_bytes=size_bytes)


def test_a_new_broker_of_three_takes_its_share_of_replicas_and_leaders_five_moves_at_a_time():
    partitions = [steady("t", p, tuple((p + j) % 3 for j in range(3))) for p in range(12)]
    brokers = [BalancerBroker(b, "node") for b in range(4)]
    first = plan_balance(brokers, partitions)
    assert sum(m.moves_data for m in first.moves) == 5 and first.incomplete, "five moves touch broker 3; more later"
    assert all(3 in m.replicas for m in first.moves if m.moves_data)
    settled = applied(partitions, first.moves)
    second = plan_balance(brokers, settled)
    settled = applied(settled, second.moves)
    assert not plan_balance(brokers, settled).moves
    assert Counter(b for p in settled for b in p.replicas) == {0: 9, 1: 9, 2: 9, 3: 9}
    assert Counter(p.replicas[0] for p in settled) == {0: 3, 1: 3, 2: 3, 3: 3}


def test_a_leaving_brokers_replicas_go_first_to_other_nodes_and_internal_topics_move_last():
    brokers = [BalancerBroker(0, "a"), BalancerBroker(1, "a"), BalancerBroker(2, "b"), BalancerBroker(3, "b", leaving=True)]
    partitions = [steady("__consumer_offsets", 0, (3, 0)), steady("t", 0, (3, 0)), steady("t", 1, (1, 2))]
    plan = plan_balance(brokers, partitions, max_moves_per_broker=1)
    assert plan.moves == (Move("t", 0, (2, 0), (3, 0)),), "the user topic first, to broker 2 on the other node"
    assert plan.incomplete
    then = plan_balance(brokers, applied(partitions, plan.moves), max_moves_per_broker=1)
    assert [(m.topic, set(m.replicas)) for m in then.moves if m.moves_data] == [("__consumer_offsets", {2, 0})]


def test_replicas_leave_a_broker_past_its_cap_and_none_go_to_a_full_one():
    brokers = [BalancerBroker(0, "a", capacity=2), BalancerBroker(1, "b", capacity=4), BalancerBroker(2, "c", capacity=2)]
    partitions = [steady("t", p, (0,)) for p in range(4)] + [steady("u", 0, (2,)), steady("u", 1, (2,))]
    plan = plan_balance(brokers, partitions)
    after = Counter(b for p in applied(partitions, plan.moves) for b in p.replicas)
    assert after == {0: 2, 1: 2, 2: 2}


def test_replicas_spread_over_nodes_before_counts_are_evened_out():
    brokers = [BalancerBroker(0, "a"), BalancerBroker(1, "a"), BalancerBroker(2, "b")]
    partitions = [steady("t", 0, (0, 1))]
    plan = plan_balance(brokers, partitions)
    assert [m.replicas for m in plan.moves] == [(0, 2)] or [m.replicas for m in plan.moves] == [(2, 1)]


def test_leaders_spread_by_reordering_replicas_without_moving_data():
    brokers = [BalancerBroker(b, f"n{b}") for b in range(3)]
    partitions = [steady("t", p, (0, 1, 2)) for p in range(3)]
    plan = plan_balance(brokers, partitions)
    assert plan.moves and not any(m.moves_data for m in plan.moves)
    assert Counter(p.replicas[0] for p in applied(partitions, plan.moves)) == {0: 1, 1: 1, 2: 1}


def test_bytes_even_out_by_swaps_once_the_gap_is_worth_a_copy_and_not_before():
    brokers = [BalancerBroker(0, "a"), BalancerBroker(1, "b")]
    big, small = 4 * DISK_BALANCE_MIN_GAP_BYTES, DISK_BALANCE_MIN_GAP_BYTES // 8
    partitions = [steady("t", 0, (0,), big), steady("t", 1, (0,), big), steady("t", 2, (1,), small),
                  steady("t", 3, (1,), small)]
    plan = plan_balance(brokers, partitions)
    after = applied(partitions, plan.moves)
    held = Counter({b: sum(p.size_bytes for p in after if b in p.replicas) for b in (0, 1)})
    assert held[0] == held[1] == big + small and Counter(b for p in after for b in p.replicas) == {0: 2, 1: 2}
    close = [steady("t", 0, (0,), small), steady("t", 1, (1,), 1)]
    assert not plan_balance(brokers, close).moves, "a gap below DISK_BALANCE_MIN_GAP_BYTES moves nothing"


def test_a_disk_swap_never_breaks_one_partitions_node_diversity_even_to_mend_anothers():
    """Broker 1 (node b, full at its cap of 1) would swap its small replica of t-5 for
    broker 0's larger one of t-0: t-0 would gain node b and t-5 lose it."""
    gib = 2**30
    brokers = [BalancerBroker(0, "a", capacity=3), BalancerBroker(1, "b", capacity=1), BalancerBroker(2, "a", capacity=3)]
    partitions = [steady("t", 0, (0, 2), gib // 16), steady("t", 1, (0,), gib // 4), steady("t", 2, (0, 2), gib // 16),
                  steady("t", 3, (2, 0), gib // 4), steady("t", 4, (2, 0), gib // 2), steady("t", 5, (2, 1), 0)]
    for move in plan_balance(brokers, partitions).moves:
        assert shortfall(brokers, move.replicas) <= shortfall(brokers, move.previous), move


def metadata_with_brokers(nodes: list[str]) -> ClusterMetadata:
    meta = ClusterMetadata()
    offset = 0
    for records in [[ClusterIdRecord("c")], *(meta.plan_register_broker(b, node) for b, node in enumerate(nodes))]:
        for record in records:
            meta.apply(record, offset)
            offset += 1
    return meta


def plan_of(meta: ClusterMetadata, settle: bool) -> BalancePlan:
    brokers = [BalancerBroker(b, reg.node_id) for b, reg in sorted(meta.brokers.items())]
    return plan_balance(brokers, partitions_of(meta.all_partitions()), settle=settle)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 7), st.sampled_from(["one node", "a node each", "two per node"]),
       st.lists(st.tuples(st.integers(1, 13), st.integers(1, 3)), min_size=1, max_size=6), st.booleans())
def test_topics_placed_by_rayks_own_assignment_leave_the_balancer_nothing_to_do(brokers, layout, topics, one_rf):
    """Never a data move. On up to four brokers with one replication factor for every
    topic, nothing to do at all; otherwise a preferred leader may need a reorder (placed
    one partition at a time, and a topic of RF 1 after ones of RF 3 can only go where the
    replica counts say, a new topic cannot always even the leaders out)."""
    nodes = {"one node": ["n"] * brokers, "a node each": [f"n{b}" for b in range(brokers)],
             "two per node": [f"n{b // 2}" for b in range(brokers)]}[layout]
    if layout == "two per node" and brokers % 2:
        return  # placed one partition at a time, uneven nodes can need a move later (node diversity first)
    meta = metadata_with_brokers(nodes)
    offset = meta.last_offset + 1
    for i, (partitions, rf) in enumerate(topics):
        rf = min(topics[0][1] if one_rf else rf, brokers)
        records = meta.replication.plan_create_topic(f"t{i}", partitions, rf, {}, f"id-{i}")
        for record in records:
            meta.apply(record, offset)
            offset += 1
        plan = plan_of(meta, settle=True)
        assert plan.score_before[REPLICAS] == 0, f"replica counts within 1 of the mean after t{i}"
        assert not any(m.moves_data for m in plan.moves), f"after topic t{i}: {plan.moves}"
        if one_rf and brokers <= 4:
            assert plan.moves == (), f"after topic t{i}: {plan.score_before}, {plan.moves}"


def test_a_leaving_broker_is_never_made_a_preferred_leader_while_leaders_are_spread():
    """Reorders hand preferred leaderships along chains of brokers; a leaving broker must not
    be one of them, or the balancer's preferred election would make it lead."""
    brokers = [BalancerBroker(0, "0"), BalancerBroker(1, "1"), BalancerBroker(2, "2"), BalancerBroker(3, "3", leaving=True)]
    layout = [(3, 2), (2, 3), (0, 3), (0, 3), (1, 3), (0, 3), (3, 0), (3, 1)]
    partitions = [steady("t", i, replicas) for i, replicas in enumerate(layout)]
    for _ in range(MAX_ROUNDS):
        plan = plan_balance(brokers, partitions, max_moves_per_broker=1)
        assert not any(m.replicas[0] == 3 != m.previous[0] for m in plan.moves), plan.moves
        if not plan.moves:
            break
        partitions = applied(partitions, plan.moves)
    assert all(3 not in p.replicas for p in partitions), "and it ends holding nothing"
