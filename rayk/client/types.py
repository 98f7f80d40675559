"""The small value types of rayk's client API, named and shaped like kafka-python's."""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

from rayk.errors import InvalidTopicError


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where a produced record landed; `offset` is -1 with acks=0 (the broker does not answer)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms: the record's CreateTime, or the broker's LogAppendTime


class ConsumerRecord(NamedTuple):
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
    offset: int
    timestamp: int


class OffsetAndMetadata(NamedTuple):
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
