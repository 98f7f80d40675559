"""TransactionMetadata: one transactional id's state at its transaction coordinator, and
the transitions the transaction APIs make (Kafka's TransactionMetadata and the checks of
its TransactionCoordinator, KIP-98 with KIP-360's retries and KIP-890's epoch bumps).

A transactional id maps to a producer id and epoch; each `InitProducerId` bumps the epoch,
which fences every older instance of the producer (PRODUCER_FENCED). A transaction goes

    Empty / CompleteCommit / CompleteAbort --AddPartitions/AddOffsets--> Ongoing
    Ongoing --EndTxn(commit)--> PrepareCommit --all markers written--> CompleteCommit
    Ongoing --EndTxn(abort), timeout, a new InitProducerId--> PrepareAbort --> CompleteAbort

and an idle id in Empty or Complete* expires (Dead: its record is deleted). The coordinator
writes the metadata after each transition to `__transaction_state` before it answers, and
sends the markers of a Prepare* state to every partition of the transaction; once all are
written, `complete` ends the transaction.

Transaction versions (`client_transaction_version`): a client on EndTxn v5+ (Kafka's
TV2, KIP-890) has the epoch bumped at every commit or abort, its markers carry the new
epoch, and it may abort when no transaction is open (it cannot always know). Older clients
(TV1) keep their epoch across transactions.

Kafka keeps a pending state for a transition whose write is in flight; rayk's coordinator
runs one transition per transactional id at a time and applies it after the write, so a
transition is a pure function of the metadata: each one here returns the new metadata or
raises the Kafka error the request is answered with. Kafka's PrepareEpochFence is such a
pending state and is never written: fencing an open transaction writes PrepareAbort with
the bumped epoch directly.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from rayk.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    ProducerFencedError,
)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_PRODUCER_EPOCH = (1 << 15) - 1  # int16
TV1, TV2 = 1, 2  # Kafka's TransactionVersion: 2 bumps the epoch at every end (KIP-890)

TopicPartition = tuple[str, int]


class TxnState(enum.Enum):
    """Kafka's TransactionState: the id stored in the log, the name DescribeTransactions shows."""

    EMPTY = (0, "Empty")
    ONGOING = (1, "Ongoing")
    PREPARE_COMMIT = (2, "PrepareCommit")
    PREPARE_ABORT = (3, "PrepareAbort")
    COMPLETE_COMMIT = (4, "CompleteCommit")
    COMPLETE_ABORT = (5, "CompleteAbort")
    DEAD = (6, "Dead")
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence")

    @property
    def id(self) -> int:
        return self.value[0]

    @property
    def display_name(self) -> str:
        return self.value[1]

    @classmethod
    def from_id(cls, state_id: int) -> TxnState:
        for state in cls:
            if state.id == state_id:
                return state
        raise ValueError(f"unknown transaction state id {state_id}")


S = TxnState
# The states each state may follow (Kafka's validPreviousStates).
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
IDLE_STATES = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})  # no transaction open: may expire
PREPARE_STATES = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})  # markers to send


@dataclass(frozen=True, slots=True)
class TransactionMetadata:
    """One transactional id's state as its record in `__transaction_state` stores it: its
    producer id and epoch, its transaction's state, partitions and timeout (ms). Immutable:
    each transition returns a new one."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition] = frozenset()
    last_producer_epoch: int = NO_PRODUCER_EPOCH  # the epoch before the last bump: a lost answer's retry
    previous_producer_id: int = NO_PRODUCER_ID  # the id before a rotation
    next_producer_id: int = NO_PRODUCER_ID  # TV2: the id after an end that exhausts the epochs
    txn_start_timestamp_ms: int = -1
    txn_last_update_timestamp_ms: int = -1
    client_transaction_version: int = TV1

    def __post_init__(self) -> None:
        assert self.state not in IDLE_STATES or not self.partitions, "no partitions outside a transaction"
        assert NO_PRODUCER_EPOCH <= self.producer_epoch <= MAX_PRODUCER_EPOCH, self.producer_epoch

    @property
    def epoch_exhausted(self) -> bool:
        """No epoch is left to bump to (Kafka keeps the last one for a TV2 end's bump)."""
        return self.producer_epoch >= MAX_PRODUCER_EPOCH - 1

    def _to(self, state: TxnState, **changes: object) -> TransactionMetadata:
        assert self.state in VALID_PREVIOUS[state], f"{self.transactional_id}: {self.state.display_name} -> {state.display_name}"
        return dataclasses.replace(self, state=state, **changes)  # type: ignore[arg-type]

    def check_producer(self, producer_id: int, producer_epoch: int) -> None:
        """INVALID_PRODUCER_ID_MAPPING for another producer id, PRODUCER_FENCED for another epoch."""
        if producer_id != self.producer_id:
            raise InvalidProducerIdMappingError(
                f"transactional id {self.transactional_id!r} has producer id {self.producer_id}, not {producer_id}"
            )
        if producer_epoch != self.producer_epoch:
            raise ProducerFencedError(
                f"transactional id {self.transactional_id!r} is in epoch {self.producer_epoch}; epoch {producer_epoch} is fenced"
            )


# ---------------------------------------------------------------------------- InitProducerId


def new_metadata(transactional_id: str, producer_id: int, txn_timeout_ms: int, now_ms: int) -> TransactionMetadata:
    """An id seen for the first time: Empty, no epoch yet (`init_producer_id` bumps it to 0)."""
    return TransactionMetadata(transactional_id, producer_id, NO_PRODUCER_EPOCH, txn_timeout_ms, S.EMPTY,
                               txn_last_update_timestamp_ms=now_ms)  # fmt: skip


def init_producer_id(
    md: TransactionMetadata, txn_timeout_ms: int, expected: tuple[int, int] | None, now_ms: int, new_producer_id: int
) -> tuple[TransactionMetadata, bool]:
    """InitProducerId: the metadata to write, and whether it aborts an open transaction
    first (then the client is answered CONCURRENT_TRANSACTIONS once the abort is done, and
    retries). `expected` (KIP-360): the (producer id, epoch) a producer already had, which
    it may keep only if nobody else took the id since; `new_producer_id` is used if the
    epochs are exhausted."""
    if expected is not None and not _may_continue(md, *expected):
        raise ProducerFencedError(f"transactional id {md.transactional_id!r} was taken over by another producer")
    if md.state in PREPARE_STATES:
        raise ConcurrentTransactionsError(f"{md.transactional_id!r} is completing a transaction; retry")
    if md.state is S.ONGOING:
        return fence_and_abort(md, now_ms), True
    if md.state not in IDLE_STATES:
        raise InvalidTxnStateError(f"{md.transactional_id!r} is {md.state.display_name}")
    fresh = {"partitions": frozenset(), "txn_timeout_ms": txn_timeout_ms, "txn_start_timestamp_ms": -1,
             "txn_last_update_timestamp_ms": now_ms}  # fmt: skip
    if md.epoch_exhausted and (expected is None or expected[1] == md.producer_epoch):
        return md._to(S.EMPTY, producer_id=new_producer_id, producer_epoch=0, previous_producer_id=md.producer_id,
                      last_producer_epoch=md.producer_epoch if expected is not None else NO_PRODUCER_EPOCH,
                      **fresh), False  # fmt: skip
    if expected is None:
        epoch, last = md.producer_epoch + 1, NO_PRODUCER_EPOCH
    elif md.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == md.producer_epoch:
        epoch, last = md.producer_epoch + 1, md.producer_epoch  # continuing after an error
    elif expected[1] == md.last_producer_epoch:
        epoch, last = md.producer_epoch, md.last_producer_epoch  # a retry whose answer was lost
    else:
        raise ProducerFencedError(
            f"transactional id {md.transactional_id!r} is in epoch {md.producer_epoch}; epoch {expected[1]} is fenced"
        )
    return md._to(S.EMPTY, producer_epoch=epoch, last_producer_epoch=last, **fresh), False


def _may_continue(md: TransactionMetadata, producer_id: int, producer_epoch: int) -> bool:
    """Kafka's isValidProducerId: a new id, the same producer id, or the previous one whose
    epochs ran out (a retry of the rotation)."""
    return (
        md.producer_epoch == NO_PRODUCER_EPOCH
        or producer_id == md.producer_id
        or (producer_id == md.previous_producer_id and producer_epoch >= MAX_PRODUCER_EPOCH - 1)
    )


def fence_and_abort(md: TransactionMetadata, now_ms: int) -> TransactionMetadata:
    """An open transaction is aborted with the epoch bumped, so that its producer, whose
    epoch is now old, can write nothing more (a new InitProducerId, or its timeout)."""
    assert md.state is S.ONGOING
    epoch = min(md.producer_epoch + 1, MAX_PRODUCER_EPOCH)
    return md._to(S.PREPARE_ABORT, producer_epoch=epoch, last_producer_epoch=NO_PRODUCER_EPOCH,
                  txn_last_update_timestamp_ms=now_ms)  # fmt: skip


# ---------------------------------------------------------------------------- AddPartitions, AddOffsets


def add_partitions(
    md: TransactionMetadata, producer_id: int, producer_epoch: int, partitions: frozenset[TopicPartition],
    now_ms: int, client_transaction_version: int = TV1,
) -> TransactionMetadata | None:
    """AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets partition): the
    metadata to write, or None if the transaction has them all already."""
    md.check_producer(producer_id, producer_epoch)
    if md.state in PREPARE_STATES:
        raise ConcurrentTransactionsError(f"{md.transactional_id!r} is completing a transaction; retry")
    if md.state is S.ONGOING and partitions <= md.partitions:
        return None
    if md.state not in IDLE_STATES and md.state is not S.ONGOING:
        raise InvalidTxnStateError(f"{md.transactional_id!r} is {md.state.display_name}")
    started = now_ms if md.state in IDLE_STATES else md.txn_start_timestamp_ms
    return md._to(S.ONGOING, partitions=md.partitions | partitions, txn_start_timestamp_ms=started,
                  txn_last_update_timestamp_ms=now_ms, client_transaction_version=client_transaction_version)  # fmt: skip


def verify_partitions(
    md: TransactionMetadata, producer_id: int, producer_epoch: int, partitions: frozenset[TopicPartition],
) -> frozenset[TopicPartition]:
    """AddPartitionsToTxn with verifyOnly (KIP-890), a partition leader's check before it
    appends a producer's first transactional batch: the partitions of `partitions` that
    the producer's open transaction does NOT hold (each answered INVALID_TXN_STATE, so a
    late write of an ended transaction never opens a hanging one)."""
    md.check_producer(producer_id, producer_epoch)
    if md.state in PREPARE_STATES:
        raise ConcurrentTransactionsError(f"{md.transactional_id!r} is completing a transaction; retry")
    if md.state is not S.ONGOING:
        return partitions
    return partitions - md.partitions


# ---------------------------------------------------------------------------- EndTxn


def end_transaction(
    md: TransactionMetadata, producer_id: int, producer_epoch: int, commit: bool, now_ms: int,
    client_transaction_version: int = TV1, next_producer_id: int = NO_PRODUCER_ID,
) -> TransactionMetadata | None:
    """EndTxn: the Prepare* metadata to write (its markers follow), or None when the
    transaction already ended this way (a retry whose answer was lost: answered with
    success). A TV2 client's epoch is bumped here, so its retry comes with the epoch
    before (`last_producer_epoch`); `next_producer_id` (needed once the epochs are
    exhausted) is the producer id it moves to when the bump takes the last epoch."""
    tv2 = client_transaction_version >= TV2
    if producer_id != md.producer_id:
        raise InvalidProducerIdMappingError(
            f"transactional id {md.transactional_id!r} has producer id {md.producer_id}, not {producer_id}"
        )
    wanted = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
    done = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
    if tv2 and producer_epoch == md.last_producer_epoch != md.producer_epoch and md.state in (wanted, done):
        if md.state is wanted:  # a retry of this very end, which bumped the epoch
            raise ConcurrentTransactionsError(f"{md.transactional_id!r} is completing this transaction; retry")
        return None
    if producer_epoch != md.producer_epoch:
        raise ProducerFencedError(
            f"transactional id {md.transactional_id!r} is in epoch {md.producer_epoch}; epoch {producer_epoch} is fenced"
        )
    if md.state is S.ONGOING or (tv2 and not commit and md.state in IDLE_STATES):  # KIP-890: abort what may be open
        return _prepare_end(md, wanted, now_ms, tv2, next_producer_id)
    if md.state is wanted:
        raise ConcurrentTransactionsError(f"{md.transactional_id!r} is completing this transaction; retry")
    if md.state is done and not tv2:
        return None
    raise InvalidTxnStateError(
        f"{md.transactional_id!r} is {md.state.display_name}: cannot {'commit' if commit else 'abort'}"
    )


def _prepare_end(md: TransactionMetadata, state: TxnState, now_ms: int, tv2: bool, next_producer_id: int) -> TransactionMetadata:
    changes: dict[str, object] = {"txn_last_update_timestamp_ms": now_ms}
    if md.state in IDLE_STATES:  # a TV2 abort with no partition added: it starts now
        changes["txn_start_timestamp_ms"] = now_ms
    if tv2:
        changes["producer_epoch"] = min(md.producer_epoch + 1, MAX_PRODUCER_EPOCH)
        changes["last_producer_epoch"] = md.producer_epoch
        changes["client_transaction_version"] = TV2
        if md.epoch_exhausted:  # this bump takes the last epoch: the next transaction gets a new id
            if next_producer_id == NO_PRODUCER_ID:
                raise ValueError(f"{md.transactional_id!r} has no epoch left: a next producer id is needed")
            changes["next_producer_id"] = next_producer_id
    return md._to(state, **changes)


def complete(md: TransactionMetadata, now_ms: int) -> TransactionMetadata:
    """Every partition of a Prepare* transaction has its marker: CompleteCommit or
    CompleteAbort, no partitions; a TV2 producer whose epochs ran out moves to its next id."""
    assert md.state in PREPARE_STATES, md.state
    state = S.COMPLETE_COMMIT if md.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
    changes: dict[str, object] = {"partitions": frozenset(), "txn_last_update_timestamp_ms": now_ms,
                                  "next_producer_id": NO_PRODUCER_ID}  # fmt: skip
    if md.next_producer_id != NO_PRODUCER_ID:
        changes.update(producer_id=md.next_producer_id, producer_epoch=0, previous_producer_id=md.producer_id)
    return md._to(state, **changes)


# ---------------------------------------------------------------------------- the coordinator's clock


def remaining_timeout_ms(md: TransactionMetadata, wall_now_ms: int) -> int:
    """What is left of an open transaction's timeout by the wall clock, within [0, its
    timeout]: a coordinator that loads it (a failover) counts that long on its monotonic
    clock. Its start is wall time, written by another process, perhaps with another clock:
    the clamp bounds what a step between the two can do to the timeout by the timeout itself."""
    assert md.state is S.ONGOING, md.state
    if md.txn_start_timestamp_ms < 0:  # no start written: the whole timeout from now
        return md.txn_timeout_ms
    elapsed_ms = wall_now_ms - md.txn_start_timestamp_ms
    return min(max(md.txn_timeout_ms - elapsed_ms, 0), md.txn_timeout_ms)


def expired(md: TransactionMetadata, now_ms: int, expiration_ms: int) -> bool:
    """An idle id unused for `transactional.id.expiration.ms`: its record is deleted."""
    return md.state in IDLE_STATES and now_ms - md.txn_last_update_timestamp_ms > expiration_ms
