"""Tests for rayk.client.partitioner: Kafka's key hashing, sticky partitioning and the
Java String.hashCode placement of consumer groups on `__consumer_offsets`.

Reference values come from Kafka's own UtilsTest (murmur2), kafka-python's Java
compatibility test (partition of key among 1000), Java's String.hashCode and a real
Kafka cluster's placement of a group and a transactional id; kafka-python's
DefaultPartitioner is the reference for random keys.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.cluster import ClusterMetadata
from kafka.partitioner.default import DefaultPartitioner
from kafka.partitioner.default import murmur2 as kafka_murmur2

from rayk.internal_topics import coordinator_partition, java_string_hash
from rayk.client.partitioner import StickyPartitioner, murmur2, partition_for_key

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
FAST = settings(max_examples=200, deadline=None)


def _kafka_python_cluster(topic: str, num_partitions: int) -> ClusterMetadata:
    """A kafka-python ClusterMetadata knowing one topic whose partitions all have a leader."""
    cluster = ClusterMetadata()
    cluster._partitions = {topic: {p: SimpleNamespace(leader_id=0) for p in range(num_partitions)}}
    return cluster


def _reference_java_hash(s: str) -> int:
    """String.hashCode spelled out: split each code point into UTF-16 units by hand."""
    h = 0
    for ch in s:
        cp = ord(ch)
        if cp > 0xFFFF:
            units = [0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)]
        else:
            units = [cp]
        for unit in units:
            h = (31 * h + unit) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


# ---------------------------------------------------------------------------- murmur2


@pytest.mark.parametrize(
    "data, expected",
    [  # Kafka's UtilsTest.testMurmur2
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka_java_test_vectors(data, expected):
    assert murmur2(data) == expected


@FAST
@given(st.binary(max_size=200))
def test_murmur2_matches_kafka_python_modulo_sign(data):
    # kafka-python returns the same 32 bits unsigned; Java (and rayk) return them signed.
    ours = murmur2(data)
    assert INT32_MIN <= ours <= INT32_MAX
    assert ours & 0xFFFFFFFF == kafka_murmur2(data)


@pytest.mark.parametrize("length", range(0, 9))
def test_murmur2_covers_every_tail_length(length):
    data = bytes(range(0x80, 0x80 + length))  # high bytes: Java's & 0xff must not sign-extend
    assert murmur2(data) & 0xFFFFFFFF == kafka_murmur2(data)


def test_murmur2_accepts_bytearray_and_memoryview():
    data = b"a-little-bit-longer-string"
    assert murmur2(bytearray(data)) == murmur2(memoryview(data)) == murmur2(data)
    assert murmur2(memoryview(b"xx" + data)[2:]) == murmur2(data)


# ---------------------------------------------------------------------------- keyed partitioning


@pytest.mark.parametrize(
    "key, expected",
    [  # kafka-python's test_murmur2_java_compatibility: Java's partition among 1000
        (b"", 681),
        (b"a", 524),
        (b"ab", 434),
        (b"abc", 107),
        (b"123456789", 566),
        (b"\x00 ", 742),
    ],
)
def test_partition_for_key_matches_java_among_1000_partitions(key, expected):
    assert partition_for_key(key, 1000) == expected


def test_partition_for_key_masks_the_sign_bit_instead_of_taking_abs():
    # murmur2(b"21") is negative; toPositive gives 1173551340, abs would give 973932308.
    assert partition_for_key(b"21", 1000) == 340
    assert partition_for_key(b"21", 1000) != abs(murmur2(b"21")) % 1000


@FAST
@given(st.binary(max_size=64), st.integers(1, 5000))
def test_partition_for_key_agrees_with_kafka_python_default_partitioner(key, num_partitions):
    cluster = _kafka_python_cluster("t", num_partitions)
    expected = DefaultPartitioner().partition("t", None, key, None, None, cluster)
    assert partition_for_key(key, num_partitions) == expected


@FAST
@given(st.binary(max_size=32), st.integers(1, 1 << 31))
def test_partition_for_key_is_in_range(key, num_partitions):
    assert 0 <= partition_for_key(key, num_partitions) < num_partitions


@pytest.mark.parametrize("num_partitions", [0, -1])
def test_partition_for_key_refuses_a_topic_without_partitions(num_partitions):
    with pytest.raises(ValueError):
        partition_for_key(b"k", num_partitions)


# ---------------------------------------------------------------------------- Java String.hashCode


@pytest.mark.parametrize(
    "s, expected",
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("polygenelubricants", INT32_MIN),  # the well-known string hashing to Integer.MIN_VALUE
        ("GydZG_", INT32_MIN),
        ("my-group", -1906497762),
        ("\U0001f600", 31 * 0xD83D + 0xDE00),  # outside the BMP: hashed as its surrogate pair
        ("\u00e9", 0xE9),  # one UTF-16 unit, whatever its UTF-8 length
    ],
)
def test_java_string_hash_known_values(s, expected):
    assert java_string_hash(s) == expected


@FAST
@given(st.text(max_size=40))
def test_java_string_hash_matches_hash_code_over_utf16_units(s):
    assert java_string_hash(s) == _reference_java_hash(s)
    assert INT32_MIN <= java_string_hash(s) <= INT32_MAX


def test_java_string_hash_counts_a_lone_surrogate_as_one_unit():
    assert java_string_hash("\ud83d") == 0xD83D
    assert java_string_hash("\ud83d\ude00") == java_string_hash("\U0001f600")


# ---------------------------------------------------------------------------- coordinator partition


@pytest.mark.parametrize(
    "group_id, expected",
    [  # where a Kafka cluster with 50 partitions put them (kafka-dump-log of __consumer_offsets-12
        # and __transaction_state-30); both hashes are negative
        ("my-group", 12),
        ("kafka-txn-0", 30),
        ("hello", 22),
    ],
)
def test_coordinator_partition_known_placements(group_id, expected):
    assert coordinator_partition(group_id, 50) == expected


def test_coordinator_partition_uses_abs_not_the_sign_mask():
    # Kafka's Utils.abs(-1906497762) = 1906497762 -> 12; the toPositive mask would give 36.
    assert java_string_hash("my-group") < 0
    assert coordinator_partition("my-group", 50) == abs(java_string_hash("my-group")) % 50
    assert coordinator_partition("my-group", 50) != (java_string_hash("my-group") & 0x7FFFFFFF) % 50


@pytest.mark.parametrize("num_partitions", [1, 7, 50, 1000])
def test_coordinator_partition_of_a_min_value_hash_is_zero(num_partitions):
    assert coordinator_partition("polygenelubricants", num_partitions) == 0


@FAST
@given(st.text(max_size=30), st.integers(1, 1000))
def test_coordinator_partition_is_in_range(group_id, num_partitions):
    assert 0 <= coordinator_partition(group_id, num_partitions) < num_partitions


def test_coordinator_partition_refuses_zero_partitions():
    with pytest.raises(ValueError):
        coordinator_partition("g", 0)


# ---------------------------------------------------------------------------- sticky partitioner


def test_sticky_partitioner_keeps_one_partition_until_a_batch_completes():
    sticky = StickyPartitioner(random.Random(1))
    first = sticky.partition("t", 10)
    assert all(sticky.partition("t", 10) == first for _ in range(100))
    second = sticky.on_new_batch("t", first, 10)
    assert second != first
    assert all(sticky.partition("t", 10) == second for _ in range(100))


def test_sticky_partitioner_with_one_partition_stays_on_it():
    sticky = StickyPartitioner(random.Random(1))
    assert sticky.partition("t", 1) == 0
    assert sticky.on_new_batch("t", 0, 1) == 0
    assert sticky.partition("t", 1) == 0


def test_sticky_partitioner_ignores_a_stale_new_batch_event():
    sticky = StickyPartitioner(random.Random(2))
    first = sticky.partition("t", 8)
    moved = sticky.on_new_batch("t", first, 8)
    # A second event for the old partition arrives late: it must not move the topic again.
    assert sticky.on_new_batch("t", first, 8) == moved
    assert sticky.partition("t", 8) == moved


def test_sticky_partitioner_tracks_each_topic_separately():
    sticky = StickyPartitioner(random.Random(3))
    a, b = sticky.partition("a", 100), sticky.partition("b", 100)
    sticky.on_new_batch("a", a, 100)
    assert sticky.partition("b", 100) == b
    assert sticky.partition("a", 100) != a


def test_sticky_partitioner_is_deterministic_for_a_seeded_random():
    def run(seed: int) -> list[int]:
        sticky = StickyPartitioner(random.Random(seed))
        out = []
        for _ in range(50):
            out.append(sticky.partition("t", 12))
            sticky.on_new_batch("t", out[-1], 12)
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_sticky_partitioner_new_batch_moves_to_every_other_partition_in_time():
    sticky = StickyPartitioner(random.Random(4))
    current = sticky.partition("t", 5)
    seen = {current}
    for _ in range(300):
        nxt = sticky.on_new_batch("t", current, 5)
        assert nxt != current
        seen.add(nxt)
        current = nxt
    assert seen == set(range(5))


def test_sticky_partitioner_new_batch_for_an_unseen_topic_picks_a_partition():
    sticky = StickyPartitioner(random.Random(5))
    chosen = sticky.on_new_batch("t", 3, 4)
    assert 0 <= chosen < 4
    assert sticky.partition("t", 4) == chosen


def test_sticky_partitioner_replaces_a_partition_beyond_the_current_count():
    sticky = StickyPartitioner(random.Random(6))
    while sticky.partition("t", 100) < 10:  # get a sticky partition >= 10
        sticky.on_new_batch("t", sticky.partition("t", 100), 100)
    assert 0 <= sticky.partition("t", 10) < 10
    assert 0 <= sticky.on_new_batch("t", 99, 3) < 3


def test_sticky_partitioner_refuses_zero_partitions():
    sticky = StickyPartitioner()
    with pytest.raises(ValueError):
        sticky.partition("t", 0)
    with pytest.raises(ValueError):
        sticky.on_new_batch("t", 0, 0)


@FAST
@given(
    st.integers(0, 2**32),
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.booleans(), st.integers(1, 6)), max_size=40),
)
def test_sticky_partitioner_choices_stay_in_range_and_move_on_new_batch(seed, steps):
    sticky = StickyPartitioner(random.Random(seed))
    for topic, complete_batch, num_partitions in steps:
        current = sticky.partition(topic, num_partitions)
        assert 0 <= current < num_partitions
        if complete_batch:
            moved = sticky.on_new_batch(topic, current, num_partitions)
            assert 0 <= moved < num_partitions
            assert (moved != current) == (num_partitions > 1)
            assert sticky.partition(topic, num_partitions) == moved
