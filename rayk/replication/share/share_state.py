"""ShareStateRecord: a share-partition's durable state, as its leader hands it to the share
group's coordinator and reads it back (what Kafka's Persister carries between a
SharePartition and the share coordinator): the epoch of the leader that wrote it, the
state's epoch, the share-partition start offset and the in-flight batches. The leader
(share_fetch.py, share_state_client.py) and the coordinator, which stores it in
`__consumer_offsets` (coordinator/share/share_records.py), both speak it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ShareStateRecord:
    """A share-partition's durable state, or its deletion (`leader_epoch` None)."""

    group_id: str
    topic: str
    partition: int
    leader_epoch: int | None
    state_epoch: int = 0
    start_offset: int = 0
    batches: tuple[tuple[int, int, str, int], ...] = ()  # (first offset, last offset, state, delivery count)
