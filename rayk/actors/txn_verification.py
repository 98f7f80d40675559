"""Transaction verification (KIP-890 part 1): a partition leader asks the transaction
coordinator before it appends a producer's first transactional batch of a transaction.

Without it, a produce that its client gave up on (a timeout, then an abort) could land
after the transaction's marker and open a transaction that no coordinator knows: a
hanging transaction, which holds the partition's last stable offset, and every
read_committed consumer, back for good. So the leader appends a transactional batch only
if the producer's transaction is open in this partition already (its first batch was
verified) or the coordinator says the partition was added to the producer's open
transaction (AddPartitionsToTxn with verifyOnly).

What the produce is answered, as Kafka answers a client of transaction version 1:
- the partition is not in the transaction: INVALID_TXN_STATE;
- another producer id or an older epoch: INVALID_PRODUCER_EPOCH (the producer is fenced);
- the coordinator moving, loading or completing the transaction, or unreachable:
  NOT_ENOUGH_REPLICAS, which the client retries.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.exceptions import RayError

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
)

logger = logging.getLogger(__name__)

_RETRIABLE = (ConcurrentTransactionsError, CoordinatorLoadInProgressError, CoordinatorNotAvailableError,
              LeaderNotAvailableError, NotCoordinatorError)


async def verify_partition(
    controller: Any, transactional_id: str, topic: str, partition: int, producer_id: int, producer_epoch: int
) -> KafkaError | None:
    """None if the producer's open transaction holds `topic-partition`, else the error its
    produce is answered (see the module docstring). `controller` is the Controller's handle."""
    if controller is None:
        return NotEnoughReplicasError("this replica has no Controller to find the transaction coordinator through")
    try:
        _, coordinator = await controller.find_transaction_coordinator.remote(transactional_id)
        missing = await coordinator.verify_partitions.remote(transactional_id, producer_id, producer_epoch, [(topic, partition)])
    except _RETRIABLE as e:
        return NotEnoughReplicasError(f"the transaction coordinator of {transactional_id!r} could not verify the write: {e}")
    except (ProducerFencedError, InvalidProducerIdMappingError) as e:
        return InvalidProducerEpochError(str(e))
    except KafkaError as e:
        return e
    except RayError as e:
        logger.info("verifying %r's write to %s-%d: %s", transactional_id, topic, partition, e)
        return NotEnoughReplicasError(f"the transaction coordinator of {transactional_id!r} is not reachable; retry")
    if missing:
        return InvalidTxnStateError(
            f"{topic}-{partition} is not in the open transaction of {transactional_id!r} (producer {producer_id}, "
            f"epoch {producer_epoch}): add it with AddPartitionsToTxn first"
        )
    return None
