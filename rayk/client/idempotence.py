"""IdempotenceManager: an idempotent producer's id, epoch and sequence numbers (the
idempotent half of Kafka's TransactionManager, with KIP-360's epoch bump).

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

Ray does not deliver calls to an async actor in order, and a leader answers a higher
epoch that does not start at sequence 0 with OUT_OF_ORDER_SEQUENCE_NUMBER instead of
waiting for the batch before it; so after a bump a partition sends its first batch alone
and pipelines again once that batch is acknowledged (`may_pipeline`).

Not thread-safe: the producer's sender thread owns it.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

from rayk.client.types import TopicPartition

logger = logging.getLogger(__name__)

PRODUCER_EPOCH_MAX = 32767  # the batch header's int16 producerEpoch


class IdempotenceManager:
    def __init__(self, producer_id: int, new_producer_id: Callable[[], int], epoch: int = 0) -> None:
        if not 0 <= epoch <= PRODUCER_EPOCH_MAX:
            raise ValueError(f"a producer epoch is 0..{PRODUCER_EPOCH_MAX}, not {epoch}")
        self.producer_id, self.epoch = producer_id, epoch
        self._new_producer_id = new_producer_id
        self._next_sequence: collections.Counter[TopicPartition] = collections.Counter()
        self._stamped_unfinished = 0  # batches stamped (sent at least once) and not finished
        self._first_batch_unacked: set[TopicPartition] = set()  # after a bump: send one batch, then pipeline
        self.bump_needed = False

    def may_stamp(self) -> bool:
        """Whether a batch not sent yet may be stamped (and sent) now."""
        return not self.bump_needed

    def may_pipeline(self, tp: TopicPartition) -> bool:
        """Whether a second batch may follow one in flight to `tp`."""
        return tp not in self._first_batch_unacked

    def stamp(self, tp: TopicPartition, record_count: int) -> tuple[int, int, int]:
        """(producer id, epoch, base sequence) for a batch sent for the first time."""
        assert not self.bump_needed, "no batch is stamped while the epoch waits to be bumped"
        base_sequence = self._next_sequence[tp]
        self._next_sequence[tp] = (base_sequence + record_count) % (1 << 31)  # int32, wraps as Kafka's
        self._stamped_unfinished += 1
        return self.producer_id, self.epoch, base_sequence

    def acknowledged(self, tp: TopicPartition) -> None:
        self._first_batch_unacked.discard(tp)

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
        if not self.bump_needed or self._stamped_unfinished:
            return False
        if self.epoch < PRODUCER_EPOCH_MAX:
            self.epoch += 1
        else:
            self.producer_id, self.epoch = self._new_producer_id(), 0
        self._first_batch_unacked = set(self._next_sequence)
        self._next_sequence.clear()
        self.bump_needed = False
        logger.info("producer %d now at epoch %d; sequences restart at 0", self.producer_id, self.epoch)
        return True
