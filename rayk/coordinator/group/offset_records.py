"""The committed-offset records of `__consumer_offsets` (Kafka's OffsetCommitKey and
OffsetCommitValue), as OffsetMetadataManager writes them and a new coordinator reads them
back (group_records.decode_record dispatches here):

key ["offset", group, topic, partition] -> value {"offset", "metadata",
"commit_timestamp_ms", "leader_epoch"} (a committed offset), or None (deleted). Only
"offset" is required: a field a value lacks (written before it was kept) reads as its
default, so an offset committed without a leader epoch reads as -1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from rayk.coordinator.group.record_schema import MalformedGroupRecordError, excerpt, is_int, unpack

OFFSET_KIND = "offset"
_OFFSET_FIELDS = {"offset": int, "metadata": str, "commit_timestamp_ms": int, "leader_epoch": int}


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One group's committed offset of one partition: the offset, the client's metadata
    string, when it was committed (wall-clock ms, -1 if unknown) and the leader epoch of the
    last record consumed, the one before `offset` (-1 if not given)."""

    offset: int
    metadata: str = ""
    commit_timestamp_ms: int = -1
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class OffsetRecord:
    """A committed offset, or its deletion (`committed` None)."""

    group_id: str
    topic: str
    partition: int
    committed: CommittedOffset | None


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return msgpack.packb([OFFSET_KIND, group_id, topic, partition])


def offset_value(c: CommittedOffset) -> bytes:
    return msgpack.packb({
        "offset": c.offset,
        "metadata": c.metadata,
        "commit_timestamp_ms": c.commit_timestamp_ms,
        "leader_epoch": c.leader_epoch,
    })


def decode_offset(key: list[Any], value: bytes | None) -> OffsetRecord:
    """The record of an "offset" key's fields and its value."""
    if len(key) != 4 or not (isinstance(key[1], str) and isinstance(key[2], str) and is_int(key[3])):
        raise MalformedGroupRecordError(f"an offset key is [kind, group, topic, partition], not {excerpt(key)}")
    committed = None if value is None else _committed_offset(unpack(value, "value"))
    return OffsetRecord(key[1], key[2], key[3], committed)


def _committed_offset(fields: Any) -> CommittedOffset:
    if not isinstance(fields, dict) or "offset" not in fields:
        raise MalformedGroupRecordError(f"an offset value is a map with an offset: {excerpt(fields)}")
    for name, value in fields.items():
        expected = _OFFSET_FIELDS.get(name)
        if expected is None or not (is_int(value) if expected is int else isinstance(value, expected)):
            raise MalformedGroupRecordError(f"offset value field {excerpt(name)} = {excerpt(value)}")
    return CommittedOffset(**fields)
