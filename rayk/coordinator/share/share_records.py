"""The share coordinator's records in `__consumer_offsets` (KIP-932), as ShareCoordinator
writes them and a new coordinator reads them back (group_records.decode_record dispatches
here):

- key ["share_group", group] -> value {"group_epoch", "partition_counts", "members",
  "configs", "state_epoch"} (a share group, written whenever it changed, before the member
  is answered), or None (deleted); each member: its id, member and previous epoch,
  subscribed topics, assignment, client id and host, and rack;
- key ["share_state", group, topic, partition] -> value {"leader_epoch", "state_epoch",
  "start_offset", "batches"} (a share-partition's delivery state, written by its leader
  through the coordinator, Kafka's ShareSnapshot/ShareUpdate in `__share_group_state`):
  the epoch of the leader that wrote it, the state's epoch (new when the state is
  deleted), SPSO, and [first offset, last offset, state, delivery count] batches of
  in-flight records, none before SPSO; or None (deleted with its group). Kafka keeps these
  in a topic and coordinator of their own; here they sit beside the group they belong to,
  so that a group and its share state are deleted together and described by one
  coordinator. The record is rayk.replication.share.share_state.ShareStateRecord, which
  the leaders speak too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from rayk.coordinator.group.record_schema import MalformedGroupRecordError, excerpt, has_type, is_int, unpack
from rayk.replication.share.share_state import ShareStateRecord

SHARE_GROUP_KIND, SHARE_STATE_KIND = "share_group", "share_state"
SHARE_RECORD_STATES = ("available", "acknowledged", "archived")  # share_partition.RecordState values a record stores


@dataclass(frozen=True, slots=True)
class ShareMemberRecord:
    """One member as a share group's record stores it (see the module docstring): what a new
    coordinator needs to restore the ShareMember."""

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


def decode_share_group(key: list[Any], value: bytes | None) -> ShareGroupRecord:
    """The record of a "share_group" key's fields and its value."""
    if len(key) != 2 or not isinstance(key[1], str):
        raise MalformedGroupRecordError(f"a share group key is [kind, group], not {excerpt(key)}")
    group_id = key[1]
    if value is None:
        return ShareGroupRecord(group_id, None)
    meta = unpack(value, "value")
    ok = (isinstance(meta, dict) and set(meta) == {"group_epoch", "partition_counts", "members", "configs", "state_epoch"}
          and is_int(meta["group_epoch"]) and is_int(meta["state_epoch"]) and isinstance(meta["members"], list)
          and isinstance(meta["partition_counts"], dict)
          and all(isinstance(t, str) and is_int(n) for t, n in meta["partition_counts"].items())
          and isinstance(meta["configs"], dict)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in meta["configs"].items()))  # fmt: skip
    if not ok:
        raise MalformedGroupRecordError(f"a share group value's fields: {excerpt(meta)}")
    members = []
    for fields in meta["members"]:
        if not isinstance(fields, dict) or set(fields) != set(_SHARE_MEMBER_TYPES) or not all(
                has_type(fields[n], t) for n, t in _SHARE_MEMBER_TYPES.items()):  # fmt: skip
            raise MalformedGroupRecordError(f"a share group member: {excerpt(fields)}")
        members.append(ShareMemberRecord(**{**fields, "subscribed_topics": tuple(fields["subscribed_topics"]),
                                            "assignment": tuple(map(tuple, fields["assignment"]))}))  # fmt: skip
    return ShareGroupRecord(group_id, meta["group_epoch"], meta["partition_counts"], tuple(members), meta["configs"],
                            meta["state_epoch"])


def decode_share_state(key: list[Any], value: bytes | None) -> ShareStateRecord:
    """The record of a "share_state" key's fields and its value."""
    if len(key) != 4 or not (isinstance(key[1], str) and isinstance(key[2], str) and is_int(key[3])):
        raise MalformedGroupRecordError(f"a share state key is [kind, group, topic, partition], not {excerpt(key)}")
    group_id, topic, partition = key[1], key[2], key[3]
    if value is None:
        return ShareStateRecord(group_id, topic, partition, None)
    meta = unpack(value, "value")
    ok = (isinstance(meta, dict) and set(meta) == {"leader_epoch", "state_epoch", "start_offset", "batches"}
          and all(is_int(meta[n]) for n in ("leader_epoch", "state_epoch", "start_offset"))
          and has_type(meta["batches"], [(int, int, str, int)])
          and all(b[2] in SHARE_RECORD_STATES and meta["start_offset"] <= b[0] <= b[1] for b in meta["batches"]))  # fmt: skip
    if not ok:
        raise MalformedGroupRecordError(f"a share state value's fields: {excerpt(meta)}")
    return ShareStateRecord(group_id, topic, partition, meta["leader_epoch"], meta["state_epoch"], meta["start_offset"],
                            tuple(tuple(b) for b in meta["batches"]))  # fmt: skip
