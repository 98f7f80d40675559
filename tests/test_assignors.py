"""Tests for rayk.client.assignors: Kafka's range and roundrobin partition assignors.

Exact cases come from Kafka's documentation (the assignors' javadoc) and its
RangeAssignorTest / RoundRobinAssignorTest; kafka-python's RangePartitionAssignor and
RoundRobinPartitionAssignor, driven with a ClusterMetadata filled in by hand, are the
reference for random groups.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.cluster import ClusterMetadata
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from rayk.client.assignors import ASSIGNORS, range_assign, round_robin_assign
from rayk.consumer_protocol import encode_assignment

FAST = settings(max_examples=200, deadline=None)
BOTH = pytest.mark.parametrize("assign", [range_assign, round_robin_assign], ids=["range", "roundrobin"])

# ---------------------------------------------------------------------------- strategies

topic_names = st.sampled_from(["t0", "t1", "t2", "orders", "a.b", "x-y", "T"])
partition_counts = st.dictionaries(topic_names, st.integers(0, 12), max_size=5)
# ASCII ids, so Python's and Java's string orders agree and kafka-python is a fair reference.
member_ids = st.text(alphabet="abC019-", min_size=1, max_size=5)
subscriptions = st.dictionaries(member_ids, st.lists(topic_names, unique=True, max_size=5), max_size=6)


def _kafka_python_group(subs: dict[str, list[str]], counts: dict[str, int]) -> tuple[ClusterMetadata, list]:
    """kafka-python's view of a group: metadata knowing `counts`, and JoinGroup members."""
    cluster = ClusterMetadata()
    cluster._partitions = {topic: dict.fromkeys(range(n)) for topic, n in counts.items()}
    members = [
        SimpleNamespace(member_id=m, group_instance_id=None, metadata=SimpleNamespace(topics=topics))
        for m, topics in subs.items()
    ]
    return cluster, members


def _kafka_python_assign(assignor, subs: dict[str, list[str]], counts: dict[str, int]) -> dict[str, dict[str, list[int]]]:
    result = assignor.assign(*_kafka_python_group(subs, counts))
    # kafka-python's range lists a subscribed topic even when the member got none of it.
    return {m: {t: ps for t, ps in a.assigned_partitions if ps} for m, a in result.items()}


def _check_complete_and_exclusive(assignment, subs, counts) -> None:
    assert list(assignment) == list(subs)
    owners = Counter()
    for member, topics in assignment.items():
        for topic, partitions in topics.items():
            assert topic in subs[member], f"{member} got {topic} without subscribing to it"
            assert partitions, "a topic with no partitions for a member must be left out"
            assert partitions == sorted(partitions)
            owners.update((topic, p) for p in partitions)
    subscribed = {t for topics in subs.values() for t in topics if t in counts}
    expected = {(t, p) for t in subscribed for p in range(counts[t])}
    assert set(owners) == expected
    assert all(n == 1 for n in owners.values()), "a partition was assigned twice"


# ---------------------------------------------------------------------------- documented examples


def test_range_javadoc_example():
    subs = {"C0": ["t0", "t1"], "C1": ["t0", "t1"]}
    assert range_assign(subs, {"t0": 3, "t1": 3}) == {
        "C0": {"t0": [0, 1], "t1": [0, 1]},
        "C1": {"t0": [2], "t1": [2]},
    }


def test_round_robin_javadoc_example():
    subs = {"C0": ["t0", "t1"], "C1": ["t0", "t1"]}
    assert round_robin_assign(subs, {"t0": 3, "t1": 3}) == {
        "C0": {"t0": [0, 2], "t1": [1]},
        "C1": {"t0": [1], "t1": [0, 2]},
    }


def test_round_robin_javadoc_example_with_different_subscriptions():
    subs = {"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}
    assert round_robin_assign(subs, {"t0": 1, "t1": 2, "t2": 3}) == {
        "C0": {"t0": [0]},
        "C1": {"t1": [0]},
        "C2": {"t1": [1], "t2": [0, 1, 2]},
    }


def test_range_multiple_consumers_mixed_topics():
    # RangeAssignorTest.testMultipleConsumersMixedTopics
    subs = {"consumer1": ["topic1"], "consumer2": ["topic1", "topic2"], "consumer3": ["topic1"]}
    assert range_assign(subs, {"topic1": 3, "topic2": 2}) == {
        "consumer1": {"topic1": [0]},
        "consumer2": {"topic1": [1], "topic2": [0, 1]},
        "consumer3": {"topic1": [2]},
    }


def test_round_robin_multiple_consumers_mixed_topics():
    # RoundRobinAssignorTest.testMultipleConsumersMixedTopics
    subs = {"consumer1": ["topic1"], "consumer2": ["topic1", "topic2"], "consumer3": ["topic1"]}
    assert round_robin_assign(subs, {"topic1": 3, "topic2": 2}) == {
        "consumer1": {"topic1": [0]},
        "consumer2": {"topic1": [1], "topic2": [0, 1]},
        "consumer3": {"topic1": [2]},
    }


def test_range_more_consumers_than_partitions_leaves_the_last_ones_empty():
    # RangeAssignorTest.testTwoConsumersOneTopicOnePartition, with a third consumer
    subs = {"c1": ["t"], "c2": ["t"], "c3": ["t"]}
    assert range_assign(subs, {"t": 2}) == {"c1": {"t": [0]}, "c2": {"t": [1]}, "c3": {}}


def test_range_gives_the_extra_partitions_to_the_first_members():
    subs = {m: ["t"] for m in ["m3", "m1", "m2"]}
    assert range_assign(subs, {"t": 8}) == {"m3": {"t": [6, 7]}, "m1": {"t": [0, 1, 2]}, "m2": {"t": [3, 4, 5]}}


# ---------------------------------------------------------------------------- edge cases


@BOTH
def test_no_members_is_an_empty_assignment(assign):
    assert assign({}, {"t": 3}) == {}


@BOTH
def test_a_topic_without_metadata_is_skipped(assign):
    # RangeAssignorTest.testOneConsumerNonexistentTopic
    assert assign({"c": ["missing"]}, {}) == {"c": {}}
    assert assign({"c": ["missing", "t"]}, {"t": 1}) == {"c": {"t": [0]}}


@BOTH
def test_only_subscribed_topics_are_assigned(assign):
    # RangeAssignorTest.testOnlyAssignsPartitionsFromSubscribedTopics
    assert assign({"c": ["t"]}, {"t": 3, "other": 3}) == {"c": {"t": [0, 1, 2]}}


@BOTH
def test_every_member_appears_even_with_nothing_to_consume(assign):
    subs = {"a": [], "b": ["t"], "c": ["empty"]}
    assert assign(subs, {"t": 1, "empty": 0}) == {"a": {}, "b": {"t": [0]}, "c": {}}


@BOTH
def test_a_topic_listed_twice_in_a_subscription_counts_once(assign):
    assert assign({"a": ["t", "t"], "b": ["t"]}, {"t": 2}) == {"a": {"t": [0]}, "b": {"t": [1]}}


@BOTH
def test_members_are_ordered_as_strings_not_numbers(assign):
    # "C10" < "C2", so C10 is first and takes partition 0 whatever the input order.
    assert assign({"C2": ["t"], "C10": ["t"]}, {"t": 2}) == {"C2": {"t": [1]}, "C10": {"t": [0]}}


@BOTH
def test_members_are_ordered_by_utf16_code_unit_as_java_does(assign):
    # Python puts U+FFFF before U+10000; Java compares the surrogate D800 with FFFF and
    # puts U+10000 first, so it takes partition 0.
    bmp, astral = "\uffff", "\U00010000"
    assert bmp < astral
    assert assign({bmp: ["t"], astral: ["t"]}, {"t": 2}) == {bmp: {"t": [1]}, astral: {"t": [0]}}


@BOTH
def test_negative_partition_count_is_refused(assign):
    with pytest.raises(ValueError):
        assign({"c": ["t"]}, {"t": -1})


@BOTH
def test_a_bare_string_subscription_is_refused(assign):
    with pytest.raises(TypeError):
        assign({"c": "t0"}, {"t0": 1})


def test_assignors_are_registered_under_kafka_protocol_names():
    assert ASSIGNORS == {"range": range_assign, "roundrobin": round_robin_assign}


# ---------------------------------------------------------------------------- properties


@FAST
@given(subscriptions, partition_counts)
def test_range_assigns_every_subscribed_partition_exactly_once(subs, counts):
    _check_complete_and_exclusive(range_assign(subs, counts), subs, counts)


@FAST
@given(subscriptions, partition_counts)
def test_round_robin_assigns_every_subscribed_partition_exactly_once(subs, counts):
    _check_complete_and_exclusive(round_robin_assign(subs, counts), subs, counts)


@FAST
@given(subscriptions, partition_counts)
def test_range_gives_each_topics_members_contiguous_balanced_ranges_in_order(subs, counts):
    assignment = range_assign(subs, counts)
    for topic, n in counts.items():
        members = sorted(m for m, topics in subs.items() if topic in topics)
        if not members:
            continue
        ranges = [assignment[m].get(topic, []) for m in members]
        assert max(map(len, ranges)) - min(map(len, ranges)) <= 1
        assert [len(r) for r in ranges] == sorted((len(r) for r in ranges), reverse=True)
        assert [p for r in ranges for p in r] == list(range(n))  # contiguous, in member order


@FAST
@given(st.lists(member_ids, unique=True, min_size=1, max_size=6), st.lists(topic_names, unique=True, max_size=4), partition_counts)
def test_round_robin_with_identical_subscriptions_balances_members_within_one(members, topics, counts):
    assignment = round_robin_assign({m: topics for m in members}, counts)
    loads = [sum(map(len, assignment[m].values())) for m in members]
    assert max(loads) - min(loads) <= 1


@FAST
@given(subscriptions, partition_counts)
def test_range_agrees_with_kafka_python(subs, counts):
    assert range_assign(subs, counts) == _kafka_python_assign(RangePartitionAssignor, subs, counts)


# kafka-python 3.0.12's RoundRobinPartitionAssignor raises KeyError whenever it must skip a
# member (its skip loop rebinds member_id to a (group_instance_id, member_id) tuple), so it
# is only a reference for groups whose members all subscribe to the same topics; mixed
# subscriptions are covered by the Java examples above.
identical_subscriptions = st.builds(
    lambda members, topics: {m: list(topics) for m in members},
    st.lists(member_ids, unique=True, max_size=6),
    st.lists(topic_names, unique=True, max_size=5),
)


@FAST
@given(identical_subscriptions, partition_counts)
def test_round_robin_agrees_with_kafka_python(subs, counts):
    assert round_robin_assign(subs, counts) == _kafka_python_assign(RoundRobinPartitionAssignor, subs, counts)


@FAST
@given(identical_subscriptions, partition_counts)
def test_round_robin_assignment_bytes_equal_kafka_python(subs, counts):
    theirs = RoundRobinPartitionAssignor.assign(*_kafka_python_group(subs, counts))
    for member, topics in round_robin_assign(subs, counts).items():
        assert encode_assignment(topics, b"") == theirs[member].encode()
