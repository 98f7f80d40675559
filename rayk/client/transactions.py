"""TransactionManager: a transactional Producer's side of Kafka's transactions (the
transactional half of Kafka's TransactionManager, transaction version 1).

The producer's `transactional_id` belongs to a transaction coordinator (the leader of its
`__transaction_state` partition), reached through a CoordinatorLink that looks it up
again when it moves. `init` takes the id's producer id and a bumped epoch (fencing any
older producer with the id, and aborting its open transaction); then each transaction is

    begin -> send (each partition added to the transaction before its first batch goes)
          -> send_offsets (the group's offsets, committed with the transaction)
          -> commit or abort (EndTxn; the coordinator writes the markers)

A producer fenced by a newer one is in a fatal state: every later call raises
ProducerFencedError. Partition leaders say INVALID_PRODUCER_EPOCH where the coordinator
says PRODUCER_FENCED (a Produce's answer has no other code for it); both mean the same to
this producer, so it raises one type whichever request found out first, as Kafka's client
treats INVALID_PRODUCER_EPOCH like PRODUCER_FENCED in its coordinator requests. A record
that failed in a transaction makes it abortable: `commit` raises the failure and the
caller must `abort`. An abort after a batch
whose fate is unknown bumps the epoch at the coordinator (InitProducerId with the current
producer id and epoch, KIP-360), since the partitions' sequences can no longer be trusted.

Thread-safe: `send` may add partitions from many threads.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rayk.client import calls
from rayk.client.coordinator_link import CoordinatorLink
from rayk.client.types import OffsetAndMetadata, TopicPartition
from rayk.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    KafkaError,
    ProducerFencedError,
)
from rayk.internal_topics import OFFSETS_TOPIC

_FENCED = (ProducerFencedError, InvalidProducerEpochError)


def _as_fenced(error: KafkaError) -> ProducerFencedError:
    """The fatal error a fenced producer raises from then on, whichever code said so."""
    if isinstance(error, ProducerFencedError):
        return error
    fenced = ProducerFencedError(*error.args)
    fenced.__cause__ = error
    return fenced


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """What `send_offsets_to_transaction` needs of a consumer (`Consumer.group_metadata()`):
    its group, and its generation and member id, so that a zombie member's commit is refused."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class TxnState(enum.Enum):
    """Where a transactional producer stands: not initialised, ready to begin, in a
    transaction, in one that must be aborted, or fenced for good (every call raises)."""

    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    ABORTABLE_ERROR = "abortable error"
    FATAL_ERROR = "fatal error"


class TransactionManager:
    """A transactional Producer's side of its transactions: owns the producer id and epoch the
    coordinator gave, the TxnState and its error, the partitions added to the open
    transaction, and the link to the coordinator. Made with its Producer; thread-safe (one
    lock)."""

    def __init__(
        self, controller: Any, transactional_id: str, transaction_timeout_ms: int, request_timeout_ms: int,
        retry_backoff_ms: int,
    ) -> None:
        if not transactional_id:
            raise ValueError("transactional_id may not be empty")
        if transaction_timeout_ms < 1:
            raise ValueError(f"transaction_timeout_ms must be >= 1, got {transaction_timeout_ms}")
        self.transactional_id = transactional_id
        self._controller = controller
        self._transaction_timeout_ms = transaction_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._coordinator = CoordinatorLink(controller, transactional_id, request_timeout_ms, retry_backoff_ms,
                                            transactional=True)  # fmt: skip
        self._lock = threading.Lock()
        self._state = TxnState.UNINITIALIZED
        self._error: KafkaError | None = None  # what made the transaction abortable, or the producer fatal
        self._partitions: set[TopicPartition] = set()  # added to the open transaction
        self._started = False  # the coordinator may know of the open transaction (something was added)
        self.producer_id, self.epoch = -1, -1

    # ------------------------------------------------------------------ states

    @property
    def in_transaction(self) -> bool:
        return self._state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR)

    def _require(self, *states: TxnState) -> None:
        if self._state is TxnState.FATAL_ERROR:
            assert self._error is not None
            raise self._error
        if self._state not in states:
            raise InvalidTxnStateError(
                f"producer {self.transactional_id!r} is {self._state.value}; this needs "
                + " or ".join(s.value for s in states)
            )

    def record_failed(self, error: KafkaError) -> None:
        """A record of the open transaction failed (the Sender says so)."""
        with self._lock:
            if isinstance(error, _FENCED):
                self._state, self._error = TxnState.FATAL_ERROR, _as_fenced(error)
            elif self._state is TxnState.IN_TRANSACTION:
                self._state, self._error = TxnState.ABORTABLE_ERROR, error

    def _call(self, method: str, *args: Any, timeout_ms: int) -> Any:
        try:
            return self._coordinator.call(method, self.transactional_id, *args, timeout_ms=timeout_ms)
        except _FENCED as e:
            fenced = _as_fenced(e)
            with self._lock:
                self._state, self._error = TxnState.FATAL_ERROR, fenced
            if fenced is e:
                raise
            raise fenced from e

    # ------------------------------------------------------------------ the API

    def init(self, timeout_ms: int, expected: tuple[int, int] | None = None) -> tuple[int, int]:
        """InitProducerId: (producer id, epoch); CONCURRENT_TRANSACTIONS (an older
        producer's transaction being aborted) is retried within `timeout_ms`."""
        if expected is None:
            self._require(TxnState.UNINITIALIZED)
        self.producer_id, self.epoch = self._call("init_producer_id", self._transaction_timeout_ms, expected,
                                                  timeout_ms=timeout_ms)  # fmt: skip
        with self._lock:
            self._state, self._error, self._partitions, self._started = TxnState.READY, None, set(), False
        return self.producer_id, self.epoch

    def begin(self) -> None:
        with self._lock:
            self._require(TxnState.READY)
            self._state = TxnState.IN_TRANSACTION

    def add_partition(self, tp: TopicPartition, timeout_ms: int) -> None:
        """AddPartitionsToTxn for a partition the open transaction does not hold yet."""
        with self._lock:
            self._require(TxnState.IN_TRANSACTION)
            if tp in self._partitions:
                return
        self._add(tp, timeout_ms)
        with self._lock:
            self._partitions.add(tp)

    def _add(self, tp: TopicPartition, timeout_ms: int) -> None:
        """AddPartitionsToTxn (or AddOffsetsToTxn, for the offsets topic's partition)."""
        self._started = True  # before the call: a call that fails may have added it
        self._call("add_partitions_to_txn", self.producer_id, self.epoch, [(tp.topic, tp.partition)], timeout_ms=timeout_ms)

    def send_offsets(
        self, offsets: dict[TopicPartition, int | OffsetAndMetadata], group: ConsumerGroupMetadata, timeout_ms: int
    ) -> None:
        """AddOffsetsToTxn, then TxnOffsetCommit at the group's coordinator; an offset may
        carry the metadata string committed along (OffsetAndMetadata)."""
        with self._lock:
            self._require(TxnState.IN_TRANSACTION)
        deadline_s = time.monotonic() + timeout_ms / 1000
        partition, _ = calls.call(lambda: self._controller.find_coordinator.remote(group.group_id), deadline_s,
                                  "FindCoordinator", retry_backoff_ms=self._retry_backoff_ms)  # fmt: skip
        self._add(TopicPartition(OFFSETS_TOPIC, partition), _remaining_ms(deadline_s))
        committed = {
            (tp.topic, tp.partition): (o.offset, o.metadata) if isinstance(o, OffsetAndMetadata) else (o, "")
            for tp, o in offsets.items()
        }
        try:
            CoordinatorLink(self._controller, group.group_id, retry_backoff_ms=self._retry_backoff_ms).call(
                "txn_commit_offsets", group.group_id, self.transactional_id, self.producer_id, self.epoch,
                group.generation_id, group.member_id, committed, group.group_instance_id,
                timeout_ms=_remaining_ms(deadline_s),
            )  # fmt: skip
        except KafkaError as e:
            self.record_failed(e)
            raise

    def end(self, commit: bool, flush: Callable[[], None], needs_new_epoch: Callable[[], bool], timeout_ms: int) -> None:
        """EndTxn after `flush` (every record of the transaction acknowledged or failed).
        A commit of an abortable transaction raises what made it so; an abort after a
        batch whose fate is unknown bumps the epoch (KIP-360)."""
        with self._lock:
            self._require(TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR)
        deadline_s = time.monotonic() + timeout_ms / 1000
        flush()
        with self._lock:
            if commit and self._state is TxnState.ABORTABLE_ERROR:
                assert self._error is not None
                raise self._error
            self._require(TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR)
        if self._started:  # else the coordinator never heard of it: it ends here, as in Kafka's client
            self._call("end_txn", self.producer_id, self.epoch, commit, timeout_ms=_remaining_ms(deadline_s))
        if not commit and needs_new_epoch():
            self.init(_remaining_ms(deadline_s), expected=(self.producer_id, self.epoch))
        with self._lock:
            self._state, self._error, self._partitions, self._started = TxnState.READY, None, set(), False


def _remaining_ms(deadline_s: float) -> int:
    return max(int((deadline_s - time.monotonic()) * 1000), 1)
