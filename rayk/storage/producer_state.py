"""ProducerStateManager: per producer id, the sequence numbers a partition has appended
(Kafka's ProducerStateManager, for idempotent producers).

An idempotent producer stamps each batch with its producer id, producer epoch and the
sequence number of its first record (fields of the v2 batch header); sequences count
records per partition from 0. For each producer the partition remembers its epoch, the
next expected sequence and its last `BATCHES_REMEMBERED` batches (sequences, offsets and
max timestamp). `check` classifies an incoming batch:

- APPEND: it continues the producer's sequence (or the producer is unknown and starts at 0);
- DUPLICATE: it is one of the remembered batches (a retry of a batch that was appended):
  answer with the original offsets, append nothing;
- GAP: it is ahead of the expected sequence. Over TCP that means lost batches; over Ray it
  usually means the actor calls arrived out of order (Ray does not order calls to an async
  actor), so the leader waits for the missing batches before deciding;
- or raises OUT_OF_ORDER_SEQUENCE_NUMBER (behind, and not a remembered batch) /
  INVALID_PRODUCER_EPOCH (an older epoch than the partition has seen).

Ownership: the partition's `Log` owns one and `record`s every batch with a producer id
that it appends, as leader or follower, so a new leader knows the producers already.
The Log persists it in `<offset>.snapshot` files (see `producer_snapshot.py`) and
rebuilds it after open or truncation from the newest valid snapshot plus the batches
after it, and drops the batches retention deleted (`remove_batches_below`). The state
is therefore always what feeding every producer batch of the log, from its start, to a
fresh manager gives. Entries compare equal by value.

Pure logic, no I/O. Not thread-safe: the Log mutates it under its lock; the leader's
`check` runs on the same thread as its appends (the replica actor's event loop).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from rayk.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from rayk.storage.records import BatchHeader

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
    timestamp_ms: int = -1  # the batch's max timestamp; -1 if unknown

    @classmethod
    def of(cls, header: BatchHeader) -> BatchMetadata:
        """The metadata of an appended batch (its offsets are the log's)."""
        return cls(
            header.base_sequence,
            header.base_sequence + header.last_offset_delta,
            header.base_offset,
            header.base_offset + header.last_offset_delta,
            header.max_timestamp,
        )


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
            # A new epoch starts at sequence 0; a later batch of it that arrives first (Ray
            # does not order calls to an async actor) waits for that one, as within an epoch.
            return (Verdict.APPEND if first_sequence == 0 else Verdict.GAP), None
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

    def record_batch(self, header: BatchHeader) -> None:
        """`record` for an appended batch header that carries a producer id."""
        assert header.producer_id >= 0, "only batches of idempotent producers have a producer state"
        self.record(header.producer_id, header.producer_epoch, BatchMetadata.of(header))

    def remove_batches_below(self, log_start_offset: int) -> None:
        """Forgets batches that end below the new log start (retention deleted them), and
        producers left with none, so the state stays what the remaining log says."""
        for producer_id in list(self.producers):
            entry = self.producers[producer_id]
            while entry.batches and entry.batches[0].last_offset < log_start_offset:
                entry.batches.popleft()
            if not entry.batches:
                del self.producers[producer_id]

    def clear(self) -> None:
        self.producers.clear()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerStateManager):
            return NotImplemented
        return self.producers == other.producers

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"ProducerStateManager({self.producers!r})"
