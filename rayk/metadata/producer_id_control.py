"""ProducerIdControlManager: idempotent producers' ids (Kafka's ProducerIdControlManager).

Owns `next_producer_id`, the first id never handed out. A block of ids is handed out by
one record that moves it forward, so ids stay unique across Controller restarts. Pure:
no I/O, no Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayk.errors import InvalidRequestError
from rayk.metadata.records import MetadataRecord, ProducerIdsRecord

MAX_PRODUCER_IDS_PER_ALLOCATION = 1 << 20


class ProducerIdControlManager:
    """The producer-id domain of the Controller's image: owns `next_producer_id` and plans each
    allocation of a block as one record. Changes only by replay (ClusterMetadata.apply).
    Pure; called from the Controller's loop."""

    def __init__(self) -> None:
        self.next_producer_id = 0

    def handlers(self) -> dict[type[MetadataRecord], Callable[[Any, int], None]]:
        return {ProducerIdsRecord: self._replay}

    def _replay(self, record: ProducerIdsRecord, offset: int) -> None:
        assert record.next > self.next_producer_id, "producer id blocks only move forward"
        self.next_producer_id = record.next

    def image_records(self) -> list[MetadataRecord]:
        return [ProducerIdsRecord(self.next_producer_id)] if self.next_producer_id else []

    def plan_allocate(self, count: int) -> tuple[list[MetadataRecord], int]:
        """Hands out ids [first, first + count): the record and `first`."""
        if not 1 <= count <= MAX_PRODUCER_IDS_PER_ALLOCATION:
            raise InvalidRequestError(f"producer ids are allocated 1..{MAX_PRODUCER_IDS_PER_ALLOCATION} at a time, not {count}")
        return [ProducerIdsRecord(self.next_producer_id + count)], self.next_producer_id
