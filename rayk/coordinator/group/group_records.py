"""The records of `__consumer_offsets` (Kafka's GroupMetadataManager key and value schemas):
their keys and offset values, as the group coordinator writes them (its group values are
built from the group, in ClassicGroupManager._group_record), and how a new coordinator reads
them back.

Keys and values are msgpack:
- key ["offset", group, topic, partition] -> value {"offset", "metadata",
  "commit_timestamp_ms", "leader_epoch"} (a committed offset), or None (deleted);
- key ["group", group] -> value {"generation", "protocol_type", "protocol", "leader",
  "members", "empty_since_ms", "member_states"} (a settled generation), or None (deleted).
  `members` lists the member ids; `member_states` (written since rayk kept members across
  a coordinator move; absent in older records) holds each member as Kafka's
  GroupMetadataValue does: member and instance id, client id, session and rebalance
  timeouts, its protocols' metadata and its assignment, so that a new coordinator takes
  the members over and they go on without rejoining;
- key ["consumer_group", group] -> value {"group_epoch", "target_epoch",
  "partition_counts", "members"} (a group of KIP-848's consumer protocol, written whenever
  a heartbeat or an expiry changed it, before the member is answered), or None (deleted).
  Each member: its ids, client id and host, rack, subscribed topics and regex, server
  assignor, rebalance timeout, member epoch and reconciliation state, assigned partitions
  and those pending revocation, its part of the target assignment, and whether it is a
  static member away, and for a classic member (a mixed group) its session timeout and
  protocols. Kafka writes the same facts as several record types
  (ConsumerGroupMetadata, ...MemberMetadata, ...TargetAssignmentMember,
  ...CurrentMemberAssignment) so that a change rewrites only what changed; rayk's groups
  are small enough that one record per change is simpler and as durable.
- key ["share_group", group] -> value {"group_epoch", "partition_counts", "members",
  "configs", "state_epoch"} (a share group of KIP-932, written whenever it changed, before the member is
  answered), or None (deleted); each member: its id, member and previous epoch, subscribed
  topics, assignment, client id and host, and rack;
- key ["share_state", group, topic, partition] -> value {"leader_epoch", "state_epoch",
  "start_offset", "batches"} (a share-partition's delivery state, written by its leader
  through the coordinator, Kafka's ShareSnapshot/ShareUpdate in `__share_group_state`):
  the epoch of the leader that wrote it, the state's epoch (new when the state is
  deleted), SPSO, and [first offset, last offset, state, delivery count] batches of
  in-flight records; or None (deleted with its group). Kafka keeps these in a topic and
  coordinator of their own; here they sit beside the group they belong to, so that a
  group and its share state are deleted together and described by one coordinator.

`decode_record` checks a record against these schemas, fields and types, and raises
MalformedGroupRecordError (a ValueError) for anything else, so that a record the
coordinator did not write (a client's produce before internal topics were refused, or a
corrupt key or value) can be skipped by the load instead of stopping it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from rayk.replication.share.share_state import ShareStateRecord

OFFSET_KIND, GROUP_KIND, CONSUMER_GROUP_KIND = "offset", "group", "consumer_group"
SHARE_GROUP_KIND, SHARE_STATE_KIND = "share_group", "share_state"
KINDS = (OFFSET_KIND, GROUP_KIND, CONSUMER_GROUP_KIND, SHARE_GROUP_KIND, SHARE_STATE_KIND)
RECORDS_PER_APPEND = 1_000  # tombstones or group records: ~60 KB a batch, well under max.message.bytes
SHARE_RECORD_STATES = ("available", "acknowledged", "archived")  # share_partition.RecordState values a record stores
_OFFSET_FIELDS = {"offset": int, "metadata": str, "commit_timestamp_ms": int, "leader_epoch": int}
_MEMBER_FIELDS = {"member_id", "group_instance_id", "client_id", "session_timeout_ms", "rebalance_timeout_ms",
                  "protocols", "assignment"}


class MalformedGroupRecordError(ValueError):
    """A `__consumer_offsets` record that is none of the coordinator's records."""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
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


@dataclass(frozen=True, slots=True)
class MemberState:
    """One member of a settled generation, as a new coordinator needs it to take it over."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A group's settled generation, or the group's deletion (`generation` None)."""

    group_id: str
    generation: int | None
    empty_since_ms: int | None  # None: written while it had members (or deleted)
    protocol_type: str | None = None
    protocol: str | None = None
    leader_id: str | None = None
    members: tuple[MemberState, ...] | None = None  # None: a record written before members were kept


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


@dataclass(frozen=True, slots=True)
class ShareMemberRecord:
    member_id: str
    member_epoch: int
    previous_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: tuple[tuple[str, int], ...]
    client_id: str
    client_host: str
    rack_id: str | None


@dataclass(frozen=True, slots=True)
class ShareGroupRecord:
    """A share group as it is after a change, or its deletion (`group_epoch` None)."""

    group_id: str
    group_epoch: int | None
    partition_counts: dict[str, int] = field(default_factory=dict)
    members: tuple[ShareMemberRecord, ...] = ()
    configs: dict[str, str] = field(default_factory=dict)
    state_epoch: int = 0  # the epoch of its share-partitions' states (when the group came to be, in ms)


_SHARE_MEMBER_TYPES: dict[str, Any] = {
    "member_id": str, "member_epoch": int, "previous_epoch": int, "subscribed_topics": [str],
    "assignment": [(str, int)], "client_id": str, "client_host": str, "rack_id": (str, None),
}


def share_group_key(group_id: str) -> bytes:
    return msgpack.packb([SHARE_GROUP_KIND, group_id])


def share_group_value(record: ShareGroupRecord) -> bytes:
    return msgpack.packb({
        "group_epoch": record.group_epoch,
        "partition_counts": record.partition_counts,
        "members": [{name: getattr(m, name) for name in _SHARE_MEMBER_TYPES} for m in record.members],
        "configs": record.configs,
        "state_epoch": record.state_epoch,
    })


def share_state_key(group_id: str, topic: str, partition: int) -> bytes:
    return msgpack.packb([SHARE_STATE_KIND, group_id, topic, partition])


def share_state_value(record: ShareStateRecord) -> bytes:
    return msgpack.packb({"leader_epoch": record.leader_epoch, "state_epoch": record.state_epoch,
                          "start_offset": record.start_offset, "batches": [list(b) for b in record.batches]})  # fmt: skip


def _share_group(group_id: str, value: bytes | None) -> ShareGroupRecord:
    if value is None:
        return ShareGroupRecord(group_id, None)
    meta = _unpack(value, "value")
    ok = (isinstance(meta, dict) and set(meta) == {"group_epoch", "partition_counts", "members", "configs", "state_epoch"}
          and _is_int(meta["group_epoch"]) and _is_int(meta["state_epoch"]) and isinstance(meta["members"], list)
          and isinstance(meta["partition_counts"], dict)
          and all(isinstance(t, str) and _is_int(n) for t, n in meta["partition_counts"].items())
          and isinstance(meta["configs"], dict)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in meta["configs"].items()))  # fmt: skip
    if not ok:
        raise MalformedGroupRecordError(f"a share group value's fields: {_excerpt(meta)}")
    members = []
    for fields in meta["members"]:
        if not isinstance(fields, dict) or set(fields) != set(_SHARE_MEMBER_TYPES) or not all(
                _has_type(fields[n], t) for n, t in _SHARE_MEMBER_TYPES.items()):  # fmt: skip
            raise MalformedGroupRecordError(f"a share group member: {_excerpt(fields)}")
        members.append(ShareMemberRecord(**{**fields, "subscribed_topics": tuple(fields["subscribed_topics"]),
                                            "assignment": tuple(map(tuple, fields["assignment"]))}))  # fmt: skip
    return ShareGroupRecord(group_id, meta["group_epoch"], meta["partition_counts"], tuple(members), meta["configs"],
                            meta["state_epoch"])


def _share_state(group_id: str, topic: str, partition: int, value: bytes | None) -> ShareStateRecord:
    if value is None:
        return ShareStateRecord(group_id, topic, partition, None)
    meta = _unpack(value, "value")
    ok = (isinstance(meta, dict) and set(meta) == {"leader_epoch", "state_epoch", "start_offset", "batches"}
          and all(_is_int(meta[n]) for n in ("leader_epoch", "state_epoch", "start_offset"))
          and _has_type(meta["batches"], [(int, int, str, int)])
          and all(b[2] in SHARE_RECORD_STATES and meta["start_offset"] <= b[0] <= b[1] for b in meta["batches"]))  # fmt: skip
    if not ok:
        raise MalformedGroupRecordError(f"a share state value's fields: {_excerpt(meta)}")
    return ShareStateRecord(group_id, topic, partition, meta["leader_epoch"], meta["state_epoch"], meta["start_offset"],
                            tuple(tuple(b) for b in meta["batches"]))  # fmt: skip


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


def _consumer_group(group_id: str, value: bytes | None) -> ConsumerGroupRecord:
    if value is None:
        return ConsumerGroupRecord(group_id, None)
    meta = _unpack(value, "value")
    ok = (isinstance(meta, dict) and set(meta) == {"group_epoch", "target_epoch", "partition_counts", "members"}
          and _is_int(meta["group_epoch"]) and _is_int(meta["target_epoch"])
          and isinstance(meta["partition_counts"], dict)
          and all(isinstance(t, str) and _is_int(n) for t, n in meta["partition_counts"].items())
          and isinstance(meta["members"], list))  # fmt: skip
    if not ok:
        raise MalformedGroupRecordError(f"a consumer group value's fields: {_excerpt(meta)}")
    return ConsumerGroupRecord(group_id, meta["group_epoch"], meta["target_epoch"], meta["partition_counts"],
                               tuple(_consumer_member(m) for m in meta["members"]))  # fmt: skip


def _consumer_member(fields: Any) -> ConsumerMemberRecord:
    required, known = set(_CONSUMER_MEMBER_TYPES) - _CONSUMER_MEMBER_ADDED, set(_CONSUMER_MEMBER_TYPES)
    if not isinstance(fields, dict) or not required <= set(fields) <= known:
        raise MalformedGroupRecordError(f"a consumer group member has the fields {sorted(_CONSUMER_MEMBER_TYPES)}: "
                                        f"{_excerpt(fields)}")  # fmt: skip
    for name, expected in _CONSUMER_MEMBER_TYPES.items():
        if name in fields and not _has_type(fields[name], expected):
            raise MalformedGroupRecordError(f"a consumer group member's {name}: {_excerpt(fields[name])}")
    if fields["state"] not in _MEMBER_STATES:
        raise MalformedGroupRecordError(f"a consumer group member's state: {_excerpt(fields['state'])}")
    as_tuples = {name: tuple(tuple(v) if isinstance(v, list) else v for v in fields[name])
                 for name in ("subscribed_topics", "assigned", "pending_revocation", "target", "classic_protocols")}  # fmt: skip
    return ConsumerMemberRecord(**{**fields, **as_tuples})


def _has_type(value: Any, expected: Any) -> bool:
    """`expected`: a type, a tuple of alternatives (None for None), [item type], or a
    tuple of field types for a fixed-length list (a (topic, partition))."""
    if isinstance(expected, list):
        return isinstance(value, list) and all(_has_type(v, expected[0]) for v in value)
    if isinstance(expected, tuple) and None in expected:
        return any(value is None if e is None else _has_type(value, e) for e in expected)
    if isinstance(expected, tuple):
        return isinstance(value, list) and len(value) == len(expected) and all(map(_has_type, value, expected))
    if expected is int:
        return _is_int(value)
    return isinstance(value, expected)


def member_state_value(m: MemberState) -> dict[str, Any]:
    return {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
            "session_timeout_ms": m.session_timeout_ms, "rebalance_timeout_ms": m.rebalance_timeout_ms,
            "protocols": [[name, metadata] for name, metadata in m.protocols], "assignment": m.assignment}


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return msgpack.packb([OFFSET_KIND, group_id, topic, partition])


def group_key(group_id: str) -> bytes:
    return msgpack.packb([GROUP_KIND, group_id])


def offset_value(c: CommittedOffset) -> bytes:
    return msgpack.packb({
        "offset": c.offset,
        "metadata": c.metadata,
        "commit_timestamp_ms": c.commit_timestamp_ms,
        "leader_epoch": c.leader_epoch,
    })


AnyGroupRecord = OffsetRecord | GroupRecord | ConsumerGroupRecord | ShareGroupRecord | ShareStateRecord


def decode_record(key: bytes, value: bytes | None) -> AnyGroupRecord:
    """The coordinator's record that (key, value) encode; MalformedGroupRecordError if none."""
    fields = _unpack(key, "key")
    if not isinstance(fields, list) or not fields or fields[0] not in KINDS:
        raise MalformedGroupRecordError(f"the key is not an offset or group key: {_excerpt(fields)}")
    if fields[0] == SHARE_GROUP_KIND:
        if len(fields) != 2 or not isinstance(fields[1], str):
            raise MalformedGroupRecordError(f"a share group key is [kind, group], not {_excerpt(fields)}")
        return _share_group(fields[1], value)
    if fields[0] == SHARE_STATE_KIND:
        if len(fields) != 4 or not (isinstance(fields[1], str) and isinstance(fields[2], str) and _is_int(fields[3])):
            raise MalformedGroupRecordError(f"a share state key is [kind, group, topic, partition], not {_excerpt(fields)}")
        return _share_state(fields[1], fields[2], fields[3], value)
    if fields[0] == CONSUMER_GROUP_KIND:
        if len(fields) != 2 or not isinstance(fields[1], str):
            raise MalformedGroupRecordError(f"a consumer group key is [kind, group], not {_excerpt(fields)}")
        return _consumer_group(fields[1], value)
    if fields[0] == OFFSET_KIND:
        if len(fields) != 4 or not (isinstance(fields[1], str) and isinstance(fields[2], str) and _is_int(fields[3])):
            raise MalformedGroupRecordError(f"an offset key is [kind, group, topic, partition], not {_excerpt(fields)}")
        committed = None if value is None else _committed_offset(_unpack(value, "value"))
        return OffsetRecord(fields[1], fields[2], fields[3], committed)
    if len(fields) != 2 or not isinstance(fields[1], str):
        raise MalformedGroupRecordError(f"a group key is [kind, group], not {_excerpt(fields)}")
    if value is None:
        return GroupRecord(fields[1], None, None)
    meta = _unpack(value, "value")
    if not isinstance(meta, dict) or not _is_int(meta.get("generation")):
        raise MalformedGroupRecordError(f"a group value has an int generation: {_excerpt(meta)}")
    empty_since_ms = meta.get("empty_since_ms")
    if empty_since_ms is not None and not _is_int(empty_since_ms):
        raise MalformedGroupRecordError(f"a group's empty_since_ms is an int or None, not {_excerpt(empty_since_ms)}")
    states = meta.get("member_states")
    if states is None:
        return GroupRecord(fields[1], meta["generation"], empty_since_ms)
    if not isinstance(states, list):
        raise MalformedGroupRecordError(f"a group's member_states is a list, not {_excerpt(states)}")
    for name in ("protocol_type", "protocol", "leader"):
        if meta.get(name) is not None and not isinstance(meta[name], str):
            raise MalformedGroupRecordError(f"a group's {name} is a string or None, not {_excerpt(meta[name])}")
    return GroupRecord(fields[1], meta["generation"], empty_since_ms, meta.get("protocol_type"), meta.get("protocol"),
                       meta.get("leader"), tuple(_member_state(m) for m in states))


def _member_state(fields: Any) -> MemberState:
    if not isinstance(fields, dict) or set(fields) != _MEMBER_FIELDS:
        raise MalformedGroupRecordError(f"a member state has the fields {sorted(_MEMBER_FIELDS)}: {_excerpt(fields)}")
    ok = (
        isinstance(fields["member_id"], str)
        and (fields["group_instance_id"] is None or isinstance(fields["group_instance_id"], str))
        and isinstance(fields["client_id"], str)
        and _is_int(fields["session_timeout_ms"])
        and _is_int(fields["rebalance_timeout_ms"])
        and isinstance(fields["assignment"], bytes)
        and isinstance(fields["protocols"], list)
        and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], bytes)
                for p in fields["protocols"])
    )
    if not ok:
        raise MalformedGroupRecordError(f"a member state's field types: {_excerpt(fields)}")
    return MemberState(fields["member_id"], fields["group_instance_id"], fields["client_id"],
                       fields["session_timeout_ms"], fields["rebalance_timeout_ms"],
                       tuple((name, metadata) for name, metadata in fields["protocols"]), fields["assignment"])


def _committed_offset(fields: Any) -> CommittedOffset:
    if not isinstance(fields, dict) or "offset" not in fields:
        raise MalformedGroupRecordError(f"an offset value is a map with an offset: {_excerpt(fields)}")
    for name, value in fields.items():
        expected = _OFFSET_FIELDS.get(name)
        if expected is None or not (_is_int(value) if expected is int else isinstance(value, expected)):
            raise MalformedGroupRecordError(f"offset value field {_excerpt(name)} = {_excerpt(value)}")
    return CommittedOffset(**fields)


def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data)
    except (ValueError, msgpack.UnpackException) as e:  # (incomplete, extra bytes, bad UTF-8, ...)
        raise MalformedGroupRecordError(f"the {what} is not msgpack ({e}): {_excerpt(data)}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _excerpt(value: Any, max_chars: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= max_chars else text[:max_chars] + "..."
