"""The small value types of rayk's client API, named and shaped like kafka-python's."""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

from rayk.errors import InvalidTopicError


class TopicPartition(NamedTuple):
    """A partition of a topic, by name and number."""

    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where a produced record landed; `offset` is -1 with acks=0 (the broker does not answer)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms: the record's CreateTime, or the broker's LogAppendTime


class ConsumerRecord(NamedTuple):
    """One record as a Consumer hands it out: where it is, its timestamp and what kind, its
    deserialized key and value, its headers, and its key's and value's sizes in bytes as
    stored (-1 for a null)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: Any
    value: Any
    headers: list[tuple[str, bytes | None]]
    serialized_key_size: int
    serialized_value_size: int


class OffsetAndTimestamp(NamedTuple):
    """The answer of `offsets_for_times` for a partition: the earliest offset whose timestamp
    is at or after the one asked for, and that record's timestamp (ms)."""

    offset: int
    timestamp: int


class OffsetAndMetadata(NamedTuple):
    """An offset to commit for a partition (the next record to consume), with the client's
    metadata string."""

    offset: int
    metadata: str = ""


class PartitionReassignment(NamedTuple):
    """A partition's reassignment under way (Kafka's PartitionReassignment): its replicas
    now (the target ones, then those being removed), and which of them are being added
    (catching up) and removed (dropped once every target replica is in sync)."""

    replicas: list[int]
    adding_replicas: list[int]
    removing_replicas: list[int]


def topic_partition_of(key: Any) -> TopicPartition:
    """`key` as a TopicPartition; InvalidTopicError (INVALID_TOPIC_EXCEPTION) if it is not a
    (topic, partition) pair."""
    try:
        topic, partition = key
        if isinstance(topic, str) and not isinstance(partition, bool):
            return TopicPartition(topic, operator.index(partition))
    except (TypeError, ValueError):
        pass
    raise InvalidTopicError(f"{key!r} is not a (topic, partition) pair")
