"""Kafka's "consumer" embedded protocol: the subscription and assignment blobs of a group.

A consumer group runs JoinGroup/SyncGroup with protocol type "consumer"; the broker
passes the blobs below through untouched and the group leader decodes them to compute
an assignment. They are Kafka's ConsumerProtocolSubscription and
ConsumerProtocolAssignment messages, each prefixed by its version, big-endian, with no
tagged fields (no version of either is "flexible"):

    Subscription v0:  version int16 | topics: count int32, each (length int16 + UTF-8)
                      | user_data: length int32 (-1 = null) + bytes
       v1 appends     owned_partitions: count int32, each (topic string, count int32 +
                      partition int32s)
       v2 appends     generation_id int32
       v3 appends     rack_id: length int16 (-1 = null) + UTF-8
    Assignment v0-3:  version int16 | assigned_partitions: count int32, each (topic
                      string, count int32 + partition int32s) | user_data (as above)

rayk writes version 0 only; every consumer reads it. It reads any version >= 0 the way
Java's ConsumerProtocol does: a version above the highest it knows (3) is parsed as that
one, the v1-v3 subscription fields are checked for framing but not returned, and bytes
after the last known field are ignored (that is how a newer writer stays readable). A
negative version is refused.

Malformed input (a field running past the end, a negative array count, a null topic, a
string that is not UTF-8) raises `UnknownServerError` (Kafka raises SchemaException,
which has no error code of its own). An array's declared count is checked against the
bytes left before anything is allocated, so a hostile count cannot exhaust memory.
Encoding raises ValueError for values the format cannot hold.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rayk.errors import UnknownServerError

__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "CONSUMER_PROTOCOL_V0",
    "HIGHEST_READ_VERSION",
    "Assignment",
    "Subscription",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
]

CONSUMER_PROTOCOL_TYPE = "consumer"  # JoinGroup's protocol_type for these blobs
CONSUMER_PROTOCOL_V0 = 0
HIGHEST_READ_VERSION = 3  # versions above this are read as this one, as Java does

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT16_MAX = (1 << 15) - 1
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1

# The fewest bytes one array element can take, used to bound a declared count.
_STRING_MIN_BYTES = 2  # an empty string: just its int16 length
_TOPIC_PARTITIONS_MIN_BYTES = 6  # an empty topic string + a zero partition count
_PARTITION_BYTES = 4


@dataclass(frozen=True, slots=True)
class Subscription:
    """What a member asks for: its topics, in the order it sent them, and opaque user data;
    from v1 (cooperative rebalancing, KIP-429) also the partitions it still owns."""

    topics: list[str]
    user_data: bytes | None = None
    owned_partitions: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Assignment:
    """What the leader gave a member: topic -> partitions, in wire order, and user data."""

    partitions: dict[str, list[int]] = field(default_factory=dict)
    user_data: bytes | None = None


# ---------------------------------------------------------------------------- encoding


def _append_string(out: bytearray, value: str, what: str) -> None:
    encoded = value.encode("utf-8")
    if len(encoded) > _INT16_MAX:
        raise ValueError(f"{what} of {len(encoded)} UTF-8 bytes exceeds the int16 length limit")
    out += _INT16.pack(len(encoded))
    out += encoded


def _append_nullable_bytes(out: bytearray, data: bytes | bytearray | memoryview | None) -> None:
    if data is None:
        out += _INT32.pack(-1)
        return
    data = memoryview(data).cast("B")
    if len(data) > _INT32_MAX:
        raise ValueError(f"user_data of {len(data)} bytes exceeds the int32 length limit")
    out += _INT32.pack(len(data))
    out += data


def _check_count(count: int, what: str) -> None:
    if count > _INT32_MAX:
        raise ValueError(f"{count} {what} exceed the int32 array count limit")


def encode_subscription(topics: Iterable[str], user_data: bytes | bytearray | memoryview | None = None) -> bytes:
    """Encodes a v0 subscription; topics are written in the order given."""
    if isinstance(topics, str):
        raise TypeError("topics must be a collection of topic names, not one str")
    topics = list(topics)
    _check_count(len(topics), "topics")
    out = bytearray(_INT16.pack(CONSUMER_PROTOCOL_V0))
    out += _INT32.pack(len(topics))
    for topic in topics:
        _append_string(out, topic, "topic name")
    _append_nullable_bytes(out, user_data)
    return bytes(out)


def encode_assignment(
    partitions: Mapping[str, Iterable[int]], user_data: bytes | bytearray | memoryview | None = None
) -> bytes:
    """Encodes a v0 assignment; topics and partitions are written in the order given."""
    out = bytearray(_INT16.pack(CONSUMER_PROTOCOL_V0))
    _check_count(len(partitions), "topics")
    out += _INT32.pack(len(partitions))
    for topic, topic_partitions in partitions.items():
        _append_string(out, topic, "topic name")
        topic_partitions = list(topic_partitions)
        _check_count(len(topic_partitions), "partitions")
        for partition in topic_partitions:
            if not _INT32_MIN <= partition <= _INT32_MAX:
                raise ValueError(f"partition {partition} of topic {topic!r} is outside the int32 range")
        out += _INT32.pack(len(topic_partitions))
        out += struct.pack(f">{len(topic_partitions)}i", *topic_partitions)
    _append_nullable_bytes(out, user_data)
    return bytes(out)


# ---------------------------------------------------------------------------- decoding


class _Reader:
    """A cursor over one blob; every read checks bounds and reports the field it was reading."""

    __slots__ = ("_view", "_pos", "_what")

    def __init__(self, data: bytes | bytearray | memoryview, what: str) -> None:
        self._view = memoryview(data).cast("B")
        self._pos = 0
        self._what = what

    def error(self, message: str) -> UnknownServerError:
        return UnknownServerError(f"malformed consumer protocol {self._what} at byte {self._pos}: {message}")

    def _take(self, size: int, field_name: str) -> memoryview:
        end = self._pos + size
        if end > len(self._view):
            raise self.error(f"{field_name} needs {size} bytes but only {len(self._view) - self._pos} remain")
        chunk = self._view[self._pos : end]
        self._pos = end
        return chunk

    def int16(self, field_name: str) -> int:
        return _INT16.unpack(self._take(2, field_name))[0]

    def int32(self, field_name: str) -> int:
        return _INT32.unpack(self._take(4, field_name))[0]

    def int32_array(self, field_name: str) -> list[int]:
        count = self.count(field_name, _PARTITION_BYTES)
        return list(struct.unpack(f">{count}i", self._take(count * _PARTITION_BYTES, field_name)))

    def skip_int32_array(self, field_name: str) -> None:
        self._take(self.count(field_name, _PARTITION_BYTES) * _PARTITION_BYTES, field_name)

    def count(self, field_name: str, min_element_bytes: int) -> int:
        """An array's element count: not null, and no more than the bytes left could hold."""
        count = self.int32(f"{field_name} count")
        if count < 0:
            raise self.error(f"non-nullable array {field_name} has count {count}")
        left = len(self._view) - self._pos
        if count * min_element_bytes > left:
            raise self.error(f"array {field_name} declares {count} elements but only {left} bytes remain")
        return count

    def string(self, field_name: str) -> str:
        length = self.int16(f"{field_name} length")
        if length < 0:
            raise self.error(f"non-nullable string {field_name} is null (length {length})")
        raw = self._take(length, field_name)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise self.error(f"{field_name} is not UTF-8: {e}") from None

    def skip_string(self, field_name: str, nullable: bool) -> None:
        length = self.int16(f"{field_name} length")
        if length < 0 and not nullable:
            raise self.error(f"non-nullable string {field_name} is null (length {length})")
        self._take(max(length, 0), field_name)

    def nullable_bytes(self, field_name: str) -> bytes | None:
        length = self.int32(f"{field_name} length")
        if length < 0:  # Kafka reads every negative length as null
            return None
        return bytes(self._take(length, field_name))


def _read_version(reader: _Reader) -> int:
    version = reader.int16("version")
    if version < 0:
        raise reader.error(f"unsupported version {version}")
    return min(version, HIGHEST_READ_VERSION)


def decode_subscription(data: bytes | bytearray | memoryview) -> Subscription:
    """Decodes a subscription of any version >= 0; of the v2+ fields (generation, rack)
    only their layout is checked."""
    reader = _Reader(data, "subscription")
    version = _read_version(reader)
    topic_count = reader.count("topics", _STRING_MIN_BYTES)
    topics = [reader.string("topic name") for _ in range(topic_count)]
    user_data = reader.nullable_bytes("user_data")
    owned: dict[str, list[int]] = {}
    if version >= 1:
        for _ in range(reader.count("owned_partitions", _TOPIC_PARTITIONS_MIN_BYTES)):
            topic = reader.string("owned_partitions topic")
            owned.setdefault(topic, []).extend(reader.int32_array("owned_partitions partitions"))
    if version >= 2:
        reader.int32("generation_id")
    if version >= 3:
        reader.skip_string("rack_id", nullable=True)
    return Subscription(topics, user_data, owned)


def decode_assignment(data: bytes | bytearray | memoryview) -> Assignment:
    """Decodes an assignment of any version >= 0 (all share v0's layout).

    A topic listed twice has its partitions concatenated, as Java's flattening to
    TopicPartitions would.
    """
    reader = _Reader(data, "assignment")
    _read_version(reader)
    partitions: dict[str, list[int]] = {}
    for _ in range(reader.count("assigned_partitions", _TOPIC_PARTITIONS_MIN_BYTES)):
        topic = reader.string("topic name")
        partitions.setdefault(topic, []).extend(reader.int32_array("partitions"))
    user_data = reader.nullable_bytes("user_data")
    return Assignment(partitions, user_data)
