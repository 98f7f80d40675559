"""Transaction verification (KIP-890 part 1): a partition leader asks the transaction
coordinator before it appends a producer's first transactional batch of a transaction.

Without it, a produce that its client gave up on (a timeout, then an abort) could land
after the transaction's marker and open a transaction that no coordinator knows: a
hanging transaction, which holds the partition's last stable offset, and every
read_committed consumer, back for good. So the leader appends a transactional batch only
if the producer's transaction is open in this partition already (its first batch was
verified) or the coordinator says the partition was added to the producer's open
transaction (AddPartitionsToTxn with verifyOnly).

A client of transaction version 2 (KIP-890 part 2) does not add partitions itself: its
Produce v12 asks the leader to, and the leader has the coordinator add the partition
(AddPartitionsToTxn without verifyOnly) instead of verifying it. The producer's epoch
then must be the coordinator's current one, which every commit or abort bumps, so a
produce of an ended transaction that lands late is fenced.

What the produce is answered, as Kafka answers a client of transaction version 1:
- the partition is not in the transaction: INVALID_TXN_STATE;
- another producer id or an older epoch: INVALID_PRODUCER_EPOCH (the producer is fenced);
- the coordinator moving, loading or completing the transaction, unreachable, or not
  answering within the produce's own timeout: NOT_ENOUGH_REPLICAS, which the client
  retries. Every call the verification makes is bounded by that timeout, so a coordinator
  that hangs never holds a produce, nor the requests appended with it, past it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray.exceptions import RayError, RayTaskError

from rayk.actors.named_actor import handle_of
from rayk.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    KafkaError,
    LeaderNotAvailableError,
    NotCoordinatorError,
    NotEnoughReplicasError,
    ProducerFencedError,
    UnknownServerError,
)

logger = logging.getLogger(__name__)

_RETRIABLE = (ConcurrentTransactionsError, CoordinatorLoadInProgressError, CoordinatorNotAvailableError,
              LeaderNotAvailableError, NotCoordinatorError)


class CoordinatorHandles:
    """The transaction coordinators a leader verified with, by transactional id (at most
    MAX_REMEMBERED, the oldest forgotten first), so that a transaction's first batch costs
    one call, not a Controller lookup too; a handle whose call failed is forgotten."""

    MAX_REMEMBERED = 1_000

    def __init__(self, controller: Any) -> None:
        self.controller = controller
        self._handles: dict[str, Any] = {}

    async def get(self, transactional_id: str) -> Any:
        handle = self._handles.get(transactional_id)
        if handle is None:
            controller = await handle_of(self.controller)
            _, handle = await controller.find_transaction_coordinator.remote(transactional_id)
            if len(self._handles) >= self.MAX_REMEMBERED:
                del self._handles[next(iter(self._handles))]
            self._handles[transactional_id] = handle
        return handle

    def forget(self, transactional_id: str) -> None:
        self._handles.pop(transactional_id, None)


async def verify_partition(
    coordinators: CoordinatorHandles, transactional_id: str, topic: str, partition: int, producer_id: int,
    producer_epoch: int, transaction_version: int = 1, *, timeout_ms: int,
) -> KafkaError | None:
    """None if the producer's open transaction holds `topic-partition` (transaction version
    2: once the coordinator added it), else the error its produce is answered (see the
    module docstring), within `timeout_ms`."""
    if coordinators.controller is None:
        return NotEnoughReplicasError("this replica has no Controller to find the transaction coordinator through")
    tp = [(topic, partition)]
    try:
        async with asyncio.timeout(max(timeout_ms, 0) / 1000):
            coordinator = await coordinators.get(transactional_id)
            if transaction_version >= 2:
                await coordinator.add_partitions_to_txn.remote(
                    transactional_id, producer_id, producer_epoch, tp, transaction_version
                )
                missing = []
            else:
                missing = await coordinator.verify_partitions.remote(transactional_id, producer_id, producer_epoch, tp)
    except TimeoutError:
        coordinators.forget(transactional_id)  # it may be gone: found again next time
        return NotEnoughReplicasError(
            f"the transaction coordinator of {transactional_id!r} did not verify the write within {timeout_ms} ms; retry"
        )
    except (KafkaError, RayError) as raised:
        # The coordinator's own refusal comes wrapped in a RayTaskError, which is also an
        # instance of RayError: unwrap it first, or a fenced producer would be told to retry.
        e = raised.cause if isinstance(raised, RayTaskError) else raised
        if isinstance(e, (*_RETRIABLE, RayError)):
            coordinators.forget(transactional_id)  # it may have moved: found again next time
            return _retriable(transactional_id, topic, partition, e)
        if not isinstance(e, KafkaError):  # a defect of the coordinator's, not the producer's
            return UnknownServerError(f"verifying {transactional_id!r}'s write: {type(e).__name__}: {e}")
        if isinstance(e, (ProducerFencedError, InvalidProducerIdMappingError)):
            return InvalidProducerEpochError(*e.args)
        return e
    if missing:
        return InvalidTxnStateError(
            f"{topic}-{partition} is not in the open transaction of {transactional_id!r} (producer {producer_id}, "
            f"epoch {producer_epoch}): add it with AddPartitionsToTxn first"
        )
    return None


def _retriable(transactional_id: str, topic: str, partition: int, error: Exception) -> KafkaError:
    if isinstance(error, RayError):
        logger.info("verifying %r's write to %s-%d: %s", transactional_id, topic, partition, error)
        return NotEnoughReplicasError(f"the transaction coordinator of {transactional_id!r} is not reachable; retry")
    return NotEnoughReplicasError(f"the transaction coordinator of {transactional_id!r} could not verify the write: {error}")

