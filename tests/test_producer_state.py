"""ProducerStateManager: Kafka's idempotent-producer sequence checks, as pure logic."""

from __future__ import annotations

import pytest

from rayk.storage.producer_state import BatchMetadata, ProducerStateManager, Verdict
from rayk.errors import InvalidProducerEpochError, OutOfOrderSequenceError


def appended(state, pid, epoch, first_seq, count, first_offset):
    verdict, _ = state.check(pid, epoch, first_seq, first_seq + count - 1)
    assert verdict is Verdict.APPEND
    state.record(pid, epoch, BatchMetadata(first_seq, first_seq + count - 1, first_offset, first_offset + count - 1))


def test_a_new_producer_starts_at_sequence_zero_and_ahead_is_a_gap():
    state = ProducerStateManager()
    assert state.check(7, 0, 0, 4) == (Verdict.APPEND, None)
    assert state.check(7, 0, 5, 9) == (Verdict.GAP, None), "batch 2 arrived before batch 1"


def test_batches_continue_the_sequence():
    state = ProducerStateManager()
    appended(state, 7, 0, 0, 5, 100)
    assert state.check(7, 0, 5, 9)[0] is Verdict.APPEND
    assert state.check(7, 0, 10, 14)[0] is Verdict.GAP


def test_a_retried_batch_is_a_duplicate_with_its_original_offsets():
    state = ProducerStateManager()
    appended(state, 7, 0, 0, 5, 100)
    appended(state, 7, 0, 5, 5, 105)
    verdict, original = state.check(7, 0, 0, 4)
    assert verdict is Verdict.DUPLICATE and (original.first_offset, original.last_offset) == (100, 104)


def test_only_the_last_five_batches_are_remembered():
    state = ProducerStateManager()
    for i in range(6):
        appended(state, 7, 0, i * 2, 2, i * 2)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(7, 0, 0, 1)
    assert state.check(7, 0, 2, 3)[0] is Verdict.DUPLICATE


def test_an_older_epoch_is_fenced_and_a_newer_one_restarts_at_zero():
    state = ProducerStateManager()
    appended(state, 7, 1, 0, 3, 0)
    with pytest.raises(InvalidProducerEpochError):
        state.check(7, 0, 3, 3)
    # A later batch of the new epoch that arrives before its first waits for it.
    assert state.check(7, 2, 5, 6)[0] is Verdict.GAP
    assert state.check(7, 2, 0, 0)[0] is Verdict.APPEND
    appended(state, 7, 2, 0, 5, 3)
    assert state.check(7, 2, 5, 6)[0] is Verdict.APPEND


def test_producers_are_independent():
    state = ProducerStateManager()
    appended(state, 1, 0, 0, 3, 0)
    assert state.check(2, 0, 0, 0)[0] is Verdict.APPEND
    assert state.check(1, 0, 3, 3)[0] is Verdict.APPEND
