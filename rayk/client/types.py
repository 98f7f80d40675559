"""The small value types of rayk's client API, named and shaped like kafka-python's."""

from __future__ import annotations

from typing import Any, NamedTuple


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
