"""The records of KIP-848's consumer-protocol groups in `__consumer_offsets`, as
ConsumerProtocolGroupManager writes them (a group's `snapshot()`, consumer_protocol_group.py)
and a new coordinator reads them back (group_records.decode_record dispatches here):

key ["consumer_group", group] -> value {"group_epoch", "target_epoch", "partition_counts",
"members"} (written whenever a heartbeat or an expiry changed the group, before the member
is answered), or None (deleted). Each member: its ids, client id and host, rack, subscribed
topics and regex, server assignor, rebalance timeout, member epoch and reconciliation
state, assigned partitions and those pending revocation, its part of the target
assignment, and whether it is a static member away, and for a classic member (a mixed
group) its session timeout and protocols. Kafka writes the same facts as several record
types (ConsumerGroupMetadata, ...MemberMetadata, ...TargetAssignmentMember,
...CurrentMemberAssignment) so that a change rewrites only what changed; rayk's groups are
small enough that one record per change is simpler and as durable. A member field added
since the first records were written (previous_member_epoch) reads as its default when a
record lacks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from rayk.coordinator.group.record_schema import MalformedGroupRecordError, excerpt, has_type, is_int, unpack

CONSUMER_GROUP_KIND = "consumer_group"


@dataclass(frozen=True, slots=True)
class ConsumerMemberRecord:
    """One member of a consumer-protocol group (see consumer_protocol_group.Member)."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rack_id: str | None
    subscribed_topics: tuple[str, ...]
    subscribed_regex: str | None
    assignor: str | None
    rebalance_timeout_ms: int
    member_epoch: int
    state: str  # a member_reconciliation.MemberState value
    assigned: tuple[tuple[str, int], ...]
    pending_revocation: tuple[tuple[str, int], ...]
    target: tuple[tuple[str, int], ...]
    away: bool
    classic_session_timeout_ms: int = -1  # a classic member's (in a mixed group); -1: a consumer-protocol member
    classic_protocols: tuple[tuple[str, bytes], ...] = ()
    previous_member_epoch: int = -1  # -1: none (or a record written before it was kept)


@dataclass(frozen=True, slots=True)
class ConsumerGroupRecord:
    """A consumer-protocol group as it is after a change, or its deletion (`group_epoch` None)."""

    group_id: str
    group_epoch: int | None
    target_epoch: int = 0
    partition_counts: dict[str, int] = field(default_factory=dict)
    members: tuple[ConsumerMemberRecord, ...] = ()


_CONSUMER_MEMBER_TYPES: dict[str, Any] = {
    "member_id": str, "instance_id": (str, None), "client_id": str, "client_host": str, "rack_id": (str, None),
    "subscribed_topics": [str], "subscribed_regex": (str, None), "assignor": (str, None),
    "rebalance_timeout_ms": int, "member_epoch": int, "state": str, "assigned": [(str, int)],
    "pending_revocation": [(str, int)], "target": [(str, int)], "away": bool,
    "classic_session_timeout_ms": int, "classic_protocols": [(str, bytes)], "previous_member_epoch": int,
}
# Fields added since the first records were written: a record without one has its default.
_CONSUMER_MEMBER_ADDED = {"previous_member_epoch"}
_MEMBER_STATES = {"stable", "unrevoked_partitions", "unreleased_partitions"}


def consumer_group_key(group_id: str) -> bytes:
    return msgpack.packb([CONSUMER_GROUP_KIND, group_id])


def consumer_group_value(record: ConsumerGroupRecord) -> bytes:
    return msgpack.packb({
        "group_epoch": record.group_epoch,
        "target_epoch": record.target_epoch,
        "partition_counts": record.partition_counts,
        "members": [{name: getattr(m, name) for name in _CONSUMER_MEMBER_TYPES} for m in record.members],
    })


def decode_consumer_group(key: list[Any], value: bytes | None) -> ConsumerGroupRecord:
    """The record of a "consumer_group" key's fields and its value."""
    if len(key) != 2 or not isinstance(key[1], str):
        raise MalformedGroupRecordError(f"a consumer group key is [kind, group], not {excerpt(key)}")
    group_id = key[1]
    if value is None:
        return ConsumerGroupRecord(group_id, None)
    meta = unpack(value, "value")
    ok = (isinstance(meta, dict) and set(meta) == {"group_epoch", "target_epoch", "partition_counts", "members"}
          and is_int(meta["group_epoch"]) and is_int(meta["target_epoch"])
          and isinstance(meta["partition_counts"], dict)
          and all(isinstance(t, str) and is_int(n) for t, n in meta["partition_counts"].items())
          and isinstance(meta["members"], list))  # fmt: skip
    if not ok:
        raise MalformedGroupRecordError(f"a consumer group value's fields: {excerpt(meta)}")
    return ConsumerGroupRecord(group_id, meta["group_epoch"], meta["target_epoch"], meta["partition_counts"],
                               tuple(_consumer_member(m) for m in meta["members"]))  # fmt: skip


def _consumer_member(fields: Any) -> ConsumerMemberRecord:
    required, known = set(_CONSUMER_MEMBER_TYPES) - _CONSUMER_MEMBER_ADDED, set(_CONSUMER_MEMBER_TYPES)
    if not isinstance(fields, dict) or not required <= set(fields) <= known:
        raise MalformedGroupRecordError(f"a consumer group member has the fields {sorted(_CONSUMER_MEMBER_TYPES)}: "
                                        f"{excerpt(fields)}")  # fmt: skip
    for name, expected in _CONSUMER_MEMBER_TYPES.items():
        if name in fields and not has_type(fields[name], expected):
            raise MalformedGroupRecordError(f"a consumer group member's {name}: {excerpt(fields[name])}")
    if fields["state"] not in _MEMBER_STATES:
        raise MalformedGroupRecordError(f"a consumer group member's state: {excerpt(fields['state'])}")
    as_tuples = {name: tuple(tuple(v) if isinstance(v, list) else v for v in fields[name])
                 for name in ("subscribed_topics", "assigned", "pending_revocation", "target", "classic_protocols")}  # fmt: skip
    return ConsumerMemberRecord(**{**fields, **as_tuples})
