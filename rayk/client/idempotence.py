"""IdempotenceManager: an idempotent producer's id, epoch and sequence numbers (the
idempotent half of Kafka's TransactionManager, with KIP-360's epoch bump; the
transactional half is rayk.client.transactions).

Each batch is stamped with (producer id, producer epoch, base sequence) when it is first
sent, as Kafka's accumulator drain does: sequences count a partition's records from 0
within an epoch, and a batch keeps its stamp through every retry, so the leader
recognises a retry of a batch it appended and answers with the original offsets.

When a batch's fate is unknown, the partition's sequence can no longer be trusted: the
leader answered OUT_OF_ORDER_SEQUENCE_NUMBER, or a batch that had been sent expired by
delivery timeout. Then (KIP-360, for idempotent producers) no batch is stamped until
every stamped batch has finished (acknowledged, failed or expired); then the epoch grows
by one, every partition's sequence restarts at 0, and the leader accepts the higher epoch
from sequence 0. At the int16 epoch limit a new producer id is taken instead
(`new_producer_id`, the Controller's InitProducerId) and the epoch restarts at 0.

A partition's first batch of an epoch goes alone, and the partition pipelines only once
one batch of the epoch is acknowledged there (`may_pipeline`). Until then its leader may
not know the producer (in this epoch): a leader that does not know a producer accepts its
batch at any sequence once its gap wait ends (its earlier batches may be beyond what the
partition remembers, see ProducerStateManager.validate_client_batch), and a leader
answers a higher epoch that does not start at sequence 0 with OUT_OF_ORDER_SEQUENCE_NUMBER.
Were a second batch in flight while the first one is refused retriably before it is
appended (NOT_LEADER_OR_FOLLOWER from a replica the metadata names before it knows that
it leads, NOT_ENOUGH_REPLICAS, a timeout), the second could be appended across the hole
once the leader's gap wait ends, and the first one's retry then be refused, its records
lost ("sequence ... is behind the expected ... and is not a recent batch"). An
acknowledged batch (acks=all) is on every replica that can lead next, so from then on
every leader knows the producer, and a batch ahead of a hole waits or is refused.

A pinned manager (`IdempotenceManager.pinned`) continues the sequences of a producer id
that an earlier process used, from where that producer's committed batches end (a
retried write task resumes its first attempt's writes this way, see
rayk.client.resumable_write). It never bumps: a batch whose fate is unknown leaves it
`bump_needed` for good, and the sender fails every batch not stamped yet instead of
waiting (the task fails, and its next attempt resumes from what the leaders hold). Each
partition's first batch goes alone, so that the leader knows the producer before a
later batch could arrive first and be appended after a hole (a replica that does not
know a producer accepts its batch at any sequence, see ProducerStateManager.validate_client_batch).

A transactional producer's manager (`IdempotenceManager.transactional`) takes its id and
epoch from the transaction coordinator (`reset`, between transactions) and never bumps by
itself either: like a pinned one, it fails the batches not stamped yet once a batch's
fate is unknown, the transaction is aborted, and the coordinator bumps the epoch
(rayk.client.transactions).

Not thread-safe: the producer's sender thread owns it.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass

from rayk.client.types import TopicPartition

logger = logging.getLogger(__name__)

PRODUCER_EPOCH_MAX = 32767  # the batch header's int16 producerEpoch


@dataclass(frozen=True)
class ProducerIdentity:
    """A producer id to continue: its epoch and each partition's next sequence (the
    partitions it will write to; 0 where it wrote nothing yet)."""

    producer_id: int
    epoch: int
    next_sequences: dict[TopicPartition, int]


class IdempotenceManager:
    """An idempotent or transactional producer's identity: owns its producer id and epoch, the
    next sequence of each partition, the count of stamped batches not finished, and whether
    a bump is due. Made with its Producer (plain, pinned or transactional); not
    thread-safe (the sender thread)."""

    def __init__(self, producer_id: int, new_producer_id: Callable[[], int] | None, epoch: int = 0) -> None:
        if not 0 <= epoch <= PRODUCER_EPOCH_MAX:
            raise ValueError(f"a producer epoch is 0..{PRODUCER_EPOCH_MAX}, not {epoch}")
        if producer_id < 0:
            raise ValueError(f"a producer id is >= 0, not {producer_id}")
        self.producer_id, self.epoch = producer_id, epoch
        self._new_producer_id = new_producer_id
        self._next_sequence: collections.Counter[TopicPartition] = collections.Counter()
        self._stamped_unfinished = 0  # batches stamped (sent at least once) and not finished
        self._acknowledged: set[TopicPartition] = set()  # a batch of this epoch acknowledged: may pipeline
        self.bump_needed = False
        self.is_pinned = False
        self.is_transactional = False

    @classmethod
    def pinned(cls, identity: ProducerIdentity) -> IdempotenceManager:
        """A manager that continues `identity`'s sequences and never bumps (see above)."""
        manager = cls(identity.producer_id, None, identity.epoch)
        for tp, sequence in identity.next_sequences.items():
            if not 0 <= sequence < 1 << 31:
                raise ValueError(f"a sequence is 0..2**31-1, not {sequence} (for {tp})")
            manager._next_sequence[tp] = sequence
        manager.is_pinned = True
        return manager

    @classmethod
    def transactional(cls) -> IdempotenceManager:
        """A transactional producer's manager: its id and epoch come from the transaction
        coordinator (`reset`), and it never bumps by itself; a bump goes through the
        coordinator when the transaction is aborted (rayk.client.transactions)."""
        manager = cls(0, None)
        manager.is_transactional = True
        return manager

    @property
    def bumps_itself(self) -> bool:
        return not (self.is_pinned or self.is_transactional)

    def reset(self, producer_id: int, epoch: int) -> None:
        """A transactional producer's id and epoch from its coordinator: sequences restart
        at 0. Only while no batch is stamped and unfinished."""
        assert self.is_transactional and not self._stamped_unfinished, "reset only between transactions"
        self.producer_id, self.epoch = producer_id, epoch
        self._next_sequence.clear()
        self._acknowledged = set()
        self.bump_needed = False

    def may_stamp(self) -> bool:
        """Whether a batch not sent yet may be stamped (and sent) now."""
        return not self.bump_needed

    def may_pipeline(self, tp: TopicPartition) -> bool:
        """Whether a second batch may follow one in flight to `tp`."""
        return tp in self._acknowledged

    def stamp(self, tp: TopicPartition, record_count: int) -> tuple[int, int, int]:
        """(producer id, epoch, base sequence) for a batch sent for the first time."""
        assert not self.bump_needed, "no batch is stamped while the epoch waits to be bumped"
        assert not self.is_pinned or tp in self._next_sequence, f"a pinned producer was not resumed on {tp}"
        base_sequence = self._next_sequence[tp]
        self._next_sequence[tp] = (base_sequence + record_count) % (1 << 31)  # int32, wraps as Kafka's
        self._stamped_unfinished += 1
        return self.producer_id, self.epoch, base_sequence

    def acknowledged(self, tp: TopicPartition) -> None:
        self._acknowledged.add(tp)

    def finished(self, stamped: bool) -> None:
        """A batch was acknowledged, failed or expired."""
        if stamped:
            self._stamped_unfinished -= 1
            assert self._stamped_unfinished >= 0

    def fate_unknown(self, reason: str) -> None:
        """A stamped batch got OUT_OF_ORDER_SEQUENCE_NUMBER or expired after being sent."""
        if not self.bump_needed:
            logger.warning("producer %d epoch %d: %s; bumping the epoch once in-flight batches finish",
                           self.producer_id, self.epoch, reason)
        self.bump_needed = True

    def maybe_bump(self) -> bool:
        """Bumps the epoch if one is needed and no stamped batch is unfinished. Raises the
        KafkaError of `new_producer_id` (the bump stays needed) at the epoch limit."""
        assert self.bumps_itself, "a pinned or transactional producer never bumps its epoch itself"
        if not self.bump_needed or self._stamped_unfinished:
            return False
        if self.epoch < PRODUCER_EPOCH_MAX:
            self.epoch += 1
        else:
            assert self._new_producer_id is not None
            self.producer_id, self.epoch = self._new_producer_id(), 0
        self._acknowledged = set()
        self._next_sequence.clear()
        self.bump_needed = False
        logger.info("producer %d now at epoch %d; sequences restart at 0", self.producer_id, self.epoch)
        return True
