"""Tests for rayk.consumer_protocol: the "consumer" subscription/assignment blobs.

kafka-python's ConsumerProtocolSubscription / ConsumerProtocolAssignment (generated from
Kafka's own JSON schemas) are the reference: rayk's v0 encodings must equal theirs byte
for byte, and rayk must read every version (0-3) they write. Malformed input of any kind
must end in UnknownServerError, never in IndexError, struct.error or a huge allocation.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment as KafkaAssignment
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as KafkaSubscription

from rayk.consumer_protocol import (
    CONSUMER_PROTOCOL_TYPE,
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from rayk.errors import KafkaError, UnknownServerError

FAST = settings(max_examples=100, deadline=None)
FUZZ = settings(max_examples=400, deadline=None)
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

# ---------------------------------------------------------------------------- strategies

topic_names = st.text(st.characters(codec="utf-8"), max_size=20)  # any UTF-8-encodable text
user_datas = st.none() | st.binary(max_size=64)
partition_ids = st.integers(INT32_MIN, INT32_MAX)
topic_lists = st.lists(topic_names, max_size=8)
assignments = st.dictionaries(topic_names, st.lists(partition_ids, max_size=10), max_size=6)
owned_partitions = st.lists(st.tuples(topic_names, st.lists(partition_ids, max_size=5)), max_size=4)


def _kafka_subscription(version: int, topics, user_data, owned=(), generation_id=-1, rack_id=None) -> bytes:
    tps = [KafkaSubscription.TopicPartition(topic=t, partitions=list(ps)) for t, ps in owned]
    return KafkaSubscription(
        version=version, topics=list(topics), user_data=user_data, owned_partitions=tps,
        generation_id=generation_id, rack_id=rack_id,
    ).encode()


def _kafka_assignment(version: int, partitions: dict[str, list[int]], user_data) -> bytes:
    tps = [KafkaAssignment.TopicPartition(topic=t, partitions=list(ps)) for t, ps in partitions.items()]
    return KafkaAssignment(version=version, assigned_partitions=tps, user_data=user_data).encode()


# ---------------------------------------------------------------------------- known bytes


def test_protocol_type_is_consumer():
    assert CONSUMER_PROTOCOL_TYPE == "consumer"


def test_subscription_v0_layout():
    encoded = encode_subscription(["a", "bb"], b"xy")
    assert encoded.hex() == "0000" "00000002" "0001" "61" "0002" "6262" "00000002" "7879"


def test_null_and_empty_user_data_are_distinct_on_the_wire():
    assert encode_subscription(["a"]).endswith(b"\xff\xff\xff\xff")
    assert encode_subscription(["a"], b"").endswith(b"\x00\x00\x00\x00")
    assert decode_subscription(encode_subscription(["a"])).user_data is None
    assert decode_subscription(encode_subscription(["a"], b"")).user_data == b""


def test_assignment_v0_layout():
    encoded = encode_assignment({"t": [0, 1]}, b"")
    assert encoded.hex() == "0000" "00000001" "0001" "74" "00000002" "00000000" "00000001" "00000000"


def test_empty_subscription_and_assignment():
    assert encode_subscription([]) == bytes.fromhex("0000" "00000000" "ffffffff")
    assert decode_subscription(encode_subscription([])) == Subscription([], None)
    assert decode_assignment(encode_assignment({})) == Assignment({}, None)


def test_topics_keep_their_order_and_partitions_their_order():
    assert decode_subscription(encode_subscription(["z", "a", "m"])).topics == ["z", "a", "m"]
    decoded = decode_assignment(encode_assignment({"z": [3, 1], "a": [2]}))
    assert list(decoded.partitions.items()) == [("z", [3, 1]), ("a", [2])]


def test_decoders_accept_bytearray_and_memoryview():
    sub = encode_subscription(["t"], b"u")
    asg = encode_assignment({"t": [4]}, b"u")
    for wrap in (bytearray, memoryview):
        assert decode_subscription(wrap(sub)) == Subscription(["t"], b"u")
        assert decode_assignment(wrap(asg)) == Assignment({"t": [4]}, b"u")


# ---------------------------------------------------------------------------- round trips


@FAST
@given(topic_lists, user_datas)
def test_subscription_round_trips(topics, user_data):
    assert decode_subscription(encode_subscription(topics, user_data)) == Subscription(topics, user_data)


@FAST
@given(assignments, user_datas)
def test_assignment_round_trips(partitions, user_data):
    assert decode_assignment(encode_assignment(partitions, user_data)) == Assignment(partitions, user_data)


# ---------------------------------------------------------------------------- kafka-python agreement


@FAST
@given(topic_lists, user_datas)
def test_subscription_encoding_equals_kafka_python_v0(topics, user_data):
    assert encode_subscription(topics, user_data) == _kafka_subscription(0, topics, user_data)


@FAST
@given(assignments, user_datas)
def test_assignment_encoding_equals_kafka_python_v0(partitions, user_data):
    assert encode_assignment(partitions, user_data) == _kafka_assignment(0, partitions, user_data)


@FAST
@given(topic_lists, user_datas)
def test_kafka_python_decodes_rayk_subscriptions(topics, user_data):
    decoded = KafkaSubscription.decode(encode_subscription(topics, user_data))
    assert (decoded.version, decoded.topics, decoded.user_data) == (0, topics, user_data)


@FAST
@given(assignments, user_datas)
def test_kafka_python_decodes_rayk_assignments(partitions, user_data):
    decoded = KafkaAssignment.decode(encode_assignment(partitions, user_data))
    assert {tp.topic: tp.partitions for tp in decoded.assigned_partitions} == partitions
    assert decoded.user_data == user_data


@FAST
@given(
    st.integers(0, 3), topic_lists, user_datas, owned_partitions, partition_ids,
    st.none() | st.text(st.characters(codec="utf-8"), max_size=10),
)
def test_subscriptions_of_every_version_kafka_python_writes_decode(version, topics, user_data, owned, generation, rack):
    encoded = _kafka_subscription(version, topics, user_data, owned, generation, rack)
    expected_owned: dict[str, list[int]] = {}
    for topic, partitions in owned if version >= 1 else ():  # (a topic listed twice: its partitions together)
        expected_owned.setdefault(topic, []).extend(partitions)
    assert decode_subscription(encoded) == Subscription(topics, user_data, expected_owned)


@FAST
@given(st.integers(0, 3), assignments, user_datas)
def test_assignments_of_every_version_kafka_python_writes_decode(version, partitions, user_data):
    assert decode_assignment(_kafka_assignment(version, partitions, user_data)) == Assignment(partitions, user_data)


def test_subscription_from_a_newer_version_is_read_as_v3():
    # Java reads a version above its highest as the highest (fields are only ever appended).
    v3 = bytearray(_kafka_subscription(3, ["t"], b"u", [("t", [0])], 5, "rack-a"))
    struct.pack_into(">h", v3, 0, 9)
    assert decode_subscription(bytes(v3) + b"future fields") == Subscription(["t"], b"u", {"t": [0]})


def test_assignment_from_a_newer_version_is_read_as_v0_layout():
    encoded = bytearray(encode_assignment({"t": [1]}, None))
    struct.pack_into(">h", encoded, 0, 12)
    assert decode_assignment(bytes(encoded)) == Assignment({"t": [1]}, None)


def test_bytes_after_the_last_known_field_are_ignored():
    assert decode_subscription(encode_subscription(["t"]) + b"\x01\x02") == Subscription(["t"], None)
    assert decode_assignment(encode_assignment({"t": [0]}) + b"\x01") == Assignment({"t": [0]}, None)


def test_assignment_listing_a_topic_twice_concatenates_its_partitions():
    body = struct.pack(">hi", 0, 2) + b"\x00\x01t" + struct.pack(">ii", 1, 0) + b"\x00\x01t" + struct.pack(">iii", 2, 5, 6)
    assert decode_assignment(body + struct.pack(">i", -1)) == Assignment({"t": [0, 5, 6]}, None)


def test_any_negative_user_data_length_reads_as_null():
    # Kafka's generated readers treat every negative length of a nullable field as null.
    encoded = encode_subscription(["t"])[:-4] + struct.pack(">i", -7)
    assert decode_subscription(encoded).user_data is None


# ---------------------------------------------------------------------------- malformed input


def _sub_with_topics_count(count: int) -> bytes:
    return struct.pack(">hi", 0, count)


@pytest.mark.parametrize(
    "data, message",
    [
        pytest.param(b"", "version", id="empty"),
        pytest.param(b"\x00", "version", id="half-version"),
        pytest.param(struct.pack(">h", -1) + encode_subscription(["t"])[2:], "unsupported version -1", id="negative-version"),
        pytest.param(_sub_with_topics_count(-1), "non-nullable array topics", id="null-topics"),
        pytest.param(_sub_with_topics_count(INT32_MAX), "declares 2147483647 elements", id="huge-topic-count"),
        pytest.param(_sub_with_topics_count(1) + struct.pack(">hi", -1, -1), "non-nullable string", id="null-topic"),
        pytest.param(_sub_with_topics_count(1) + b"\x00\x02\xc3\x28" + struct.pack(">i", -1), "not UTF-8", id="bad-utf8"),
        pytest.param(_sub_with_topics_count(1) + b"\x00\x05ab", "topic name needs 5 bytes", id="short-topic"),
        pytest.param(_sub_with_topics_count(0), "user_data length", id="no-user-data"),
        pytest.param(_sub_with_topics_count(0) + struct.pack(">i", 10) + b"abc", "user_data needs 10 bytes", id="short-user-data"),
        # v1-v3 claim fields they do not carry
        pytest.param(struct.pack(">hii", 1, 0, -1), "owned_partitions count", id="v1-no-owned"),
        pytest.param(
            struct.pack(">hiii", 1, 0, -1, 1) + b"\x00\x01t" + struct.pack(">i", 3), "owned_partitions", id="v1-short-owned"
        ),
        pytest.param(struct.pack(">hiii", 2, 0, -1, 0), "generation_id", id="v2-no-generation"),
        pytest.param(struct.pack(">hiiii", 3, 0, -1, 0, 7) + b"\x00\x05r", "rack_id", id="v3-short-rack"),
    ],
)
def test_malformed_subscription_is_unknown_server_error(data, message):
    with pytest.raises(UnknownServerError, match=message):
        decode_subscription(data)


@pytest.mark.parametrize(
    "data, message",
    [
        pytest.param(b"", "version", id="empty"),
        pytest.param(struct.pack(">h", -3) + encode_assignment({})[2:], "unsupported version -3", id="negative-version"),
        pytest.param(struct.pack(">hi", 0, -5), "non-nullable array assigned_partitions", id="null-topics"),
        pytest.param(struct.pack(">hi", 0, 1 << 30), "declares 1073741824 elements", id="huge-topic-count"),
        pytest.param(
            struct.pack(">hi", 0, 1) + b"\x00\x01t" + struct.pack(">i", INT32_MAX),
            "declares 2147483647 elements",
            id="huge-partition-count",
        ),
        pytest.param(
            struct.pack(">hi", 0, 1) + b"\x00\x01t" + struct.pack(">ii", -1, -1),
            "non-nullable array partitions",
            id="null-partitions",
        ),
        pytest.param(
            struct.pack(">hi", 0, 1) + b"\x00\x01t" + struct.pack(">ii", 2, 0),
            "declares 2 elements but only 4 bytes remain",
            id="short-partitions",
        ),
        pytest.param(struct.pack(">hi", 0, 1) + b"\x00\x01t" + struct.pack(">ii", 1, 0), "user_data length", id="no-user-data"),
    ],
)
def test_malformed_assignment_is_unknown_server_error(data, message):
    with pytest.raises(UnknownServerError, match=message):
        decode_assignment(data)


@FAST
@given(topic_lists.filter(bool), user_datas)
def test_every_truncation_of_a_subscription_is_refused(topics, user_data):
    encoded = encode_subscription(topics, user_data)
    for end in range(len(encoded)):
        with pytest.raises(UnknownServerError):
            decode_subscription(encoded[:end])


@FAST
@given(assignments, user_datas)
def test_every_truncation_of_an_assignment_is_refused(partitions, user_data):
    encoded = encode_assignment(partitions, user_data)
    for end in range(len(encoded)):
        with pytest.raises(UnknownServerError):
            decode_assignment(encoded[:end])


@FUZZ
@given(st.binary(max_size=80))
@example(b"\x00\x00\x7f\xff\xff\xff")
@example(b"\x00\x03\x00\x00\x00\x00\xff\xff\xff\xff\x80\x00\x00\x00")
def test_random_bytes_decode_or_raise_only_unknown_server_error(data):
    for decode in (decode_subscription, decode_assignment):
        try:
            decode(data)
        except UnknownServerError:
            pass


@FUZZ
@given(
    st.integers(0, 3), topic_lists, user_datas, owned_partitions,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_mutated_subscriptions_decode_or_raise_only_unknown_server_error(version, topics, user_data, owned, mutations):
    encoded = bytearray(_kafka_subscription(version, topics, user_data, owned, 1, "r"))
    for position, value in mutations:
        encoded[position % len(encoded)] = value
    try:
        decoded = decode_subscription(bytes(encoded))
    except UnknownServerError:
        return
    assert isinstance(decoded, Subscription)


@FUZZ
@given(assignments, user_datas, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_assignments_decode_or_raise_only_unknown_server_error(partitions, user_data, mutations):
    encoded = bytearray(encode_assignment(partitions, user_data))
    for position, value in mutations:
        encoded[position % len(encoded)] = value
    try:
        decoded = decode_assignment(bytes(encoded))
    except UnknownServerError:
        return
    assert isinstance(decoded, Assignment)


def test_decode_error_is_a_kafka_error_with_unknown_server_error_code():
    with pytest.raises(KafkaError) as info:
        decode_assignment(b"\x00")
    assert info.value.code == -1 and info.value.name == "UNKNOWN_SERVER_ERROR"


# ---------------------------------------------------------------------------- encoding limits


def test_encode_refuses_a_topic_name_longer_than_int16():
    encode_subscription(["x" * 32767])
    with pytest.raises(ValueError, match="int16"):
        encode_subscription(["x" * 32768])
    with pytest.raises(ValueError, match="int16"):
        encode_assignment({"\u00e9" * 16384: [0]})  # 32768 UTF-8 bytes


@pytest.mark.parametrize("partition", [INT32_MAX + 1, INT32_MIN - 1])
def test_encode_refuses_a_partition_outside_int32(partition):
    with pytest.raises(ValueError, match="int32"):
        encode_assignment({"t": [partition]})


def test_encode_subscription_refuses_a_bare_string_for_topics():
    with pytest.raises(TypeError):
        encode_subscription("topic")


def test_encode_accepts_any_iterables():
    assert encode_subscription(iter(["a", "b"])) == encode_subscription(["a", "b"])
    assert encode_assignment({"t": range(3)}, bytearray(b"u")) == encode_assignment({"t": [0, 1, 2]}, b"u")
