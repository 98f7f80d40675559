"""The classic groups' records of `__consumer_offsets` (Kafka's GroupMetadataKey and
GroupMetadataValue), as ClassicGroupManager writes them (its values are built from the
group, in ClassicGroupManager._group_record) and a new coordinator reads them back
(group_records.decode_record dispatches here):

key ["group", group] -> value {"generation", "protocol_type", "protocol", "leader",
"members", "empty_since_ms", "member_states"} (a settled generation), or None (deleted).
`members` lists the member ids; `member_states` (written since rayk kept members across a
coordinator move; absent in older records) holds each member as Kafka's
GroupMetadataValue does: member and instance id, client id, session and rebalance
timeouts, its protocols' metadata and its assignment, so that a new coordinator takes the
members over and they go on without rejoining.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from rayk.coordinator.group.record_schema import MalformedGroupRecordError, excerpt, is_int, unpack

GROUP_KIND = "group"
_MEMBER_FIELDS = {"member_id", "group_instance_id", "client_id", "session_timeout_ms", "rebalance_timeout_ms",
                  "protocols", "assignment"}


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


def group_key(group_id: str) -> bytes:
    return msgpack.packb([GROUP_KIND, group_id])


def member_state_value(m: MemberState) -> dict[str, Any]:
    return {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
            "session_timeout_ms": m.session_timeout_ms, "rebalance_timeout_ms": m.rebalance_timeout_ms,
            "protocols": [[name, metadata] for name, metadata in m.protocols], "assignment": m.assignment}


def decode_group(key: list[Any], value: bytes | None) -> GroupRecord:
    """The record of a "group" key's fields and its value."""
    if len(key) != 2 or not isinstance(key[1], str):
        raise MalformedGroupRecordError(f"a group key is [kind, group], not {excerpt(key)}")
    if value is None:
        return GroupRecord(key[1], None, None)
    meta = unpack(value, "value")
    if not isinstance(meta, dict) or not is_int(meta.get("generation")):
        raise MalformedGroupRecordError(f"a group value has an int generation: {excerpt(meta)}")
    empty_since_ms = meta.get("empty_since_ms")
    if empty_since_ms is not None and not is_int(empty_since_ms):
        raise MalformedGroupRecordError(f"a group's empty_since_ms is an int or None, not {excerpt(empty_since_ms)}")
    states = meta.get("member_states")
    if states is None:
        return GroupRecord(key[1], meta["generation"], empty_since_ms)
    if not isinstance(states, list):
        raise MalformedGroupRecordError(f"a group's member_states is a list, not {excerpt(states)}")
    for name in ("protocol_type", "protocol", "leader"):
        if meta.get(name) is not None and not isinstance(meta[name], str):
            raise MalformedGroupRecordError(f"a group's {name} is a string or None, not {excerpt(meta[name])}")
    return GroupRecord(key[1], meta["generation"], empty_since_ms, meta.get("protocol_type"), meta.get("protocol"),
                       meta.get("leader"), tuple(_member_state(m) for m in states))


def _member_state(fields: Any) -> MemberState:
    if not isinstance(fields, dict) or set(fields) != _MEMBER_FIELDS:
        raise MalformedGroupRecordError(f"a member state has the fields {sorted(_MEMBER_FIELDS)}: {excerpt(fields)}")
    ok = (
        isinstance(fields["member_id"], str)
        and (fields["group_instance_id"] is None or isinstance(fields["group_instance_id"], str))
        and isinstance(fields["client_id"], str)
        and is_int(fields["session_timeout_ms"])
        and is_int(fields["rebalance_timeout_ms"])
        and isinstance(fields["assignment"], bytes)
        and isinstance(fields["protocols"], list)
        and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], bytes)
                for p in fields["protocols"])
    )
    if not ok:
        raise MalformedGroupRecordError(f"a member state's field types: {excerpt(fields)}")
    return MemberState(fields["member_id"], fields["group_instance_id"], fields["client_id"],
                       fields["session_timeout_ms"], fields["rebalance_timeout_ms"],
                       tuple((name, metadata) for name, metadata in fields["protocols"]), fields["assignment"])
