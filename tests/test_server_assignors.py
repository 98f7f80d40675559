"""KIP-848's server-side assignors (rayk.coordinator.group.server_assignors): every partition of a
subscribed topic goes to exactly one of its subscribers; "uniform" balances and sticks,
"range" cuts contiguous ranges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.coordinator.group.server_assignors import range_assign, uniform_assign

TOPICS = ["a", "b", "c"]
members = st.lists(st.sampled_from([f"m{i}" for i in range(6)]), min_size=1, max_size=6, unique=True)
groups = st.builds(
    lambda ms, subs, counts: ({m: sorted(s) for m, s in zip(ms, subs)}, counts),
    members,
    st.lists(st.sets(st.sampled_from(TOPICS), max_size=3), min_size=6, max_size=6),
    st.fixed_dictionaries({t: st.integers(0, 12) for t in TOPICS}),
)


def check_covers_each_subscribed_partition_once(assignment, subscriptions, partitions):
    assert set(assignment) == set(subscriptions)
    owners: dict = {}
    for member, tps in assignment.items():
        for topic, p in tps:
            assert topic in subscriptions[member], f"{member} got {topic} it did not subscribe to"
            assert (topic, p) not in owners, f"{(topic, p)} went to {owners[(topic, p)]} and {member}"
            owners[(topic, p)] = member
    wanted = {(t, p) for subs in subscriptions.values() for t in subs for p in range(partitions.get(t, 0))}
    assert set(owners) == wanted


def check_balanced(assignment, subscriptions):
    """No member holds a partition whose topic another subscriber could take while having
    two or more fewer partitions (Kafka's balance rule for uniform)."""
    for member, tps in assignment.items():
        for topic, _ in tps:
            for other in subscriptions:
                if topic in subscriptions[other]:
                    assert len(assignment[other]) + 1 >= len(tps), (member, other, assignment)


@settings(max_examples=300)
@given(groups, st.data())
def test_uniform_gives_each_partition_to_one_subscriber_balanced_and_sticks(group, data):
    subscriptions, partitions = group
    first = uniform_assign(subscriptions, partitions)
    check_covers_each_subscribed_partition_once(first, subscriptions, partitions)
    check_balanced(first, subscriptions)
    if len({frozenset(s) for s in subscriptions.values()}) == 1:
        counts = [len(tps) for tps in first.values()]
        assert max(counts) - min(counts) <= 1, "identical subscriptions: counts differ by at most one"
    assert uniform_assign(subscriptions, partitions, first) == first, "a balanced assignment is kept as it is"

    # A member leaves: only its partitions move; the others keep theirs.
    leaving = data.draw(st.sampled_from(sorted(subscriptions)))
    rest = {m: s for m, s in subscriptions.items() if m != leaving}
    after = uniform_assign(rest, partitions, first)
    check_covers_each_subscribed_partition_once(after, rest, partitions)
    check_balanced(after, rest)
    if len({frozenset(s) for s in subscriptions.values()}) == 1:
        for member in rest:
            assert first[member] <= after[member], f"{member} lost a partition when {leaving} left"


def test_uniform_moves_to_a_new_member_only_what_balance_needs():
    subscriptions = {"m1": ["a"], "m2": ["a"]}
    before = uniform_assign(subscriptions, {"a": 6})
    after = uniform_assign({**subscriptions, "m3": ["a"]}, {"a": 6}, before)
    assert [len(after[m]) for m in ("m1", "m2", "m3")] == [2, 2, 2]
    assert after["m1"] <= before["m1"] and after["m2"] <= before["m2"], "each kept two of its own"


@settings(max_examples=200)
@given(groups)
def test_range_cuts_each_topic_into_contiguous_ranges_in_member_order(group):
    subscriptions, partitions = group
    assignment = range_assign(subscriptions, partitions)
    check_covers_each_subscribed_partition_once(assignment, subscriptions, partitions)
    for topic in TOPICS:
        subscribers = sorted(m for m in subscriptions if topic in subscriptions[m])
        ranges = [sorted(p for t, p in assignment[m] if t == topic) for m in subscribers]
        assert [p for r in ranges for p in r] == list(range(partitions[topic] if subscribers else 0))
        sizes = [len(r) for r in ranges]
        assert sizes == sorted(sizes, reverse=True) and (not sizes or max(sizes) - min(sizes) <= 1)


def test_a_topic_without_partitions_yet_and_a_str_subscription():
    assert uniform_assign({"m1": ["a", "missing"]}, {"a": 2}) == {"m1": frozenset({("a", 0), ("a", 1)})}
    with pytest.raises(TypeError):
        uniform_assign({"m1": "a"}, {"a": 2})
