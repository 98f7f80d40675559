"""The records of `__consumer_offsets` (Kafka's GroupMetadataManager and
OffsetMetadataManager key and value schemas, and its share coordinator's), and the one
place that reads them back: `decode_record`, which dispatches on a key's kind.

Keys and values are msgpack. A key is a list whose first field names its kind; a value of
None is a tombstone, which deletes what its key names:
- ["offset", group, topic, partition]: a committed offset (offset_records.py);
- ["group", group]: a classic group's settled generation (classic_group_records.py);
- ["consumer_group", group]: a KIP-848 consumer-protocol group (consumer_group_records.py);
- ["share_group", group] and ["share_state", group, topic, partition]: a share group and a
  share-partition's delivery state (rayk/coordinator/share/share_records.py).

`decode_record` checks a record against these schemas, fields and types, and raises
MalformedGroupRecordError (a ValueError, record_schema.py) for anything else, so that a
record the coordinator did not write (a client's produce before internal topics were
refused, or a corrupt key or value) can be skipped by the load instead of stopping it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayk.coordinator.group.classic_group_records import GROUP_KIND, GroupRecord, decode_group
from rayk.coordinator.group.consumer_group_records import CONSUMER_GROUP_KIND, ConsumerGroupRecord, decode_consumer_group
from rayk.coordinator.group.offset_records import OFFSET_KIND, OffsetRecord, decode_offset
from rayk.coordinator.group.record_schema import MalformedGroupRecordError, excerpt, unpack
from rayk.coordinator.share.share_records import (
    SHARE_GROUP_KIND,
    SHARE_STATE_KIND,
    ShareGroupRecord,
    decode_share_group,
    decode_share_state,
)
from rayk.replication.share.share_state import ShareStateRecord

RECORDS_PER_APPEND = 1_000  # tombstones or group records: ~60 KB a batch, well under max.message.bytes

AnyGroupRecord = OffsetRecord | GroupRecord | ConsumerGroupRecord | ShareGroupRecord | ShareStateRecord
# kind -> its decoder of (the key's fields, the value)
_DECODERS: dict[str, Callable[[list[Any], bytes | None], AnyGroupRecord]] = {
    OFFSET_KIND: decode_offset,
    GROUP_KIND: decode_group,
    CONSUMER_GROUP_KIND: decode_consumer_group,
    SHARE_GROUP_KIND: decode_share_group,
    SHARE_STATE_KIND: decode_share_state,
}
KINDS = tuple(_DECODERS)


def decode_record(key: bytes, value: bytes | None) -> AnyGroupRecord:
    """The coordinator's record that (key, value) encode; MalformedGroupRecordError if none."""
    fields = unpack(key, "key")
    if not isinstance(fields, list) or not fields or fields[0] not in KINDS:  # (a tuple: an unhashable kind is no kind)
        raise MalformedGroupRecordError(f"the key is not an offset or group key: {excerpt(fields)}")
    return _DECODERS[fields[0]](fields, value)
