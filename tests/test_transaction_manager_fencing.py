"""A transactional producer fenced by a newer one raises ProducerFencedError from then on,
whichever request found out first: a partition leader answers INVALID_PRODUCER_EPOCH to a
Produce (its answer has no PRODUCER_FENCED), the coordinator PRODUCER_FENCED. An exactly-once
stream's zombie failed test_data on CI by raising the leader's code at its commit."""

from __future__ import annotations

import pytest

from rayk.client.transactions import TransactionManager
from rayk.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    KafkaError,
    NotEnoughReplicasError,
    ProducerFencedError,
)


def _manager() -> TransactionManager:
    return TransactionManager(None, "txn-fencing", transaction_timeout_ms=60_000, request_timeout_ms=1_000,
                              retry_backoff_ms=10)  # fmt: skip


@pytest.mark.parametrize("failure", [
    InvalidProducerEpochError("transactional id 'txn-fencing' is in epoch 2; epoch 1 is fenced"),
    ProducerFencedError("transactional id 'txn-fencing' is in epoch 2; epoch 1 is fenced"),
])  # fmt: skip
def test_a_record_failed_as_fenced_makes_every_later_call_raise_producer_fenced(failure: KafkaError) -> None:
    manager = _manager()
    manager.record_failed(failure)
    for call in (manager.begin, lambda: manager.end(True, lambda: None, lambda: False, 1_000)):
        with pytest.raises(ProducerFencedError) as raised:
            call()
        assert "epoch 1 is fenced" in str(raised.value)
        assert str(raised.value).count("PRODUCER_FENCED") == 1, str(raised.value)
        if isinstance(failure, InvalidProducerEpochError):
            assert raised.value.__cause__ is failure  # what the leader said stays in the traceback


def test_a_record_failed_otherwise_is_not_fatal() -> None:
    manager = _manager()
    manager.record_failed(NotEnoughReplicasError("retry"))  # not in a transaction: nothing to abort
    with pytest.raises(InvalidTxnStateError):  # "uninitialized", not fenced
        manager.begin()
