"""ProducerStateManager: per producer id, the sequence numbers a partition has appended
(Kafka's ProducerStateManager, for idempotent producers).

An idempotent producer stamps each batch with its producer id, producer epoch and the
sequence number of its first record (fields of the v2 batch header); sequences count
records per partition from 0. For each producer the partition remembers its epoch, the
next expected sequence and its last `BATCHES_REMEMBERED` batches (sequences and offsets).
`check` classifies an incoming batch:

- APPEND: it continues the producer's sequence (or the producer is unknown and starts at 0);
- DUPLICATE: it is one of the remembered batches (a retry of a batch that was appended):
  answer with the original offsets, append nothing;
- GAP: it is ahead of the expected sequence. Over TCP that means lost batches; over Ray it
  usually means the actor calls arrived out of order (Ray does not order calls to an async
  actor), so the leader waits for the missing batches before deciding;
- or raises OUT_OF_ORDER_SEQUENCE_NUMBER (behind, and not a remembered batch) /
  INVALID_PRODUCER_EPOCH (an older epoch than the partition has seen).

Every replica (leader and followers) `record`s each appended batch, so a new leader knows
the producers already. After a restart or a truncation the state is rebuilt from the
batches still in the log's last segment; a producer older than that is unknown and its
next batch is accepted whatever its sequence. Pure logic, not thread-safe.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from rayk.errors import InvalidProducerEpochError, OutOfOrderSequenceError

BATCHES_REMEMBERED = 5  # Kafka's NUM_BATCHES_TO_RETAIN: a producer has at most 5 in flight


class Verdict(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    GAP = "gap"


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_REMEMBERED))

    @property
    def next_sequence(self) -> int:
        return self.batches[-1].last_sequence + 1 if self.batches else 0


class ProducerStateManager:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def check(self, producer_id: int, epoch: int, first_sequence: int, last_sequence: int) -> tuple[Verdict, BatchMetadata | None]:
        entry = self.producers.get(producer_id)
        if entry is None:
            return (Verdict.APPEND if first_sequence == 0 else Verdict.GAP), None
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(f"producer {producer_id} epoch {epoch} is older than {entry.epoch}")
        if epoch > entry.epoch:
            if first_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} starts epoch {epoch} at sequence {first_sequence}, not 0"
                )
            return Verdict.APPEND, None
        for batch in entry.batches:
            if (batch.first_sequence, batch.last_sequence) == (first_sequence, last_sequence):
                return Verdict.DUPLICATE, batch
        expected = entry.next_sequence
        if first_sequence == expected:
            return Verdict.APPEND, None
        if first_sequence > expected:
            return Verdict.GAP, None
        raise OutOfOrderSequenceError(
            f"producer {producer_id}: sequence {first_sequence} is behind the expected {expected} "
            "and is not a recent batch"
        )

    def record(self, producer_id: int, epoch: int, batch: BatchMetadata) -> None:
        """A batch of this producer was appended (on the leader or a follower)."""
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = self.producers[producer_id] = ProducerEntry(epoch)
        entry.batches.append(batch)

    def clear(self) -> None:
        self.producers.clear()
