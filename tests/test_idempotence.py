"""IdempotenceManager: stamping sequences at first send and KIP-360's epoch bump, without Ray."""

from __future__ import annotations

import pytest

from rayk.client.idempotence import PRODUCER_EPOCH_MAX, IdempotenceManager, ProducerIdentity
from rayk.client.types import TopicPartition

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def no_new_id() -> int:
    raise AssertionError("a new producer id is only needed at the epoch limit")


def test_sequences_count_records_per_partition_from_zero():
    m = IdempotenceManager(7, no_new_id)
    assert m.stamp(A, 3) == (7, 0, 0)
    assert m.stamp(A, 2) == (7, 0, 3)
    assert m.stamp(B, 5) == (7, 0, 0)
    assert m.stamp(A, 1) == (7, 0, 5)


def test_epoch_bump_waits_for_every_stamped_batch_then_restarts_sequences():
    m = IdempotenceManager(7, no_new_id)
    m.stamp(A, 10)
    m.stamp(A, 10)
    m.stamp(B, 4)
    m.fate_unknown("OUT_OF_ORDER_SEQUENCE_NUMBER")
    assert not m.may_stamp(), "no new batch is stamped while stamped ones are unfinished"
    m.finished(stamped=True)
    m.finished(stamped=True)
    assert not m.maybe_bump() and m.epoch == 0, "one stamped batch is still unfinished"
    m.finished(stamped=True)
    assert m.maybe_bump() and m.epoch == 1 and m.may_stamp()
    assert m.stamp(A, 3) == (7, 1, 0) and m.stamp(B, 1) == (7, 1, 0)


def test_every_partition_sends_its_first_batch_of_an_epoch_alone():
    m = IdempotenceManager(7, no_new_id)
    assert not m.may_pipeline(A) and not m.may_pipeline(B), "no leader knows the producer yet"
    m.stamp(A, 1)
    m.acknowledged(A)
    assert m.may_pipeline(A) and not m.may_pipeline(B)
    m.fate_unknown("expired")
    m.finished(stamped=True)
    m.maybe_bump()
    m.stamp(A, 1)
    assert not m.may_pipeline(A), "a leader answers a later batch of a new epoch with OUT_OF_ORDER_SEQUENCE"
    assert not m.may_pipeline(B), "B's leader does not know the producer: a batch behind a refused one could cross the hole"
    m.acknowledged(A)
    assert m.may_pipeline(A) and not m.may_pipeline(B)


def test_at_the_epoch_limit_a_new_producer_id_is_taken():
    ids = iter([8])
    m = IdempotenceManager(7, lambda: next(ids), epoch=PRODUCER_EPOCH_MAX)
    m.stamp(A, 1)
    m.fate_unknown("OUT_OF_ORDER_SEQUENCE_NUMBER")
    m.finished(stamped=True)
    assert m.maybe_bump()
    assert m.stamp(A, 1) == (8, 0, 0)


def test_a_failed_producer_id_request_keeps_the_bump_pending():
    def unavailable() -> int:
        from rayk.errors import KafkaTimeoutError

        raise KafkaTimeoutError("InitProducerId: the Controller did not answer")

    m = IdempotenceManager(7, unavailable, epoch=PRODUCER_EPOCH_MAX)
    m.fate_unknown("OUT_OF_ORDER_SEQUENCE_NUMBER")
    with pytest.raises(TimeoutError):
        m.maybe_bump()
    assert m.bump_needed and not m.may_stamp() and (m.producer_id, m.epoch) == (7, PRODUCER_EPOCH_MAX)


def test_epoch_out_of_int16_range_is_refused():
    with pytest.raises(ValueError):
        IdempotenceManager(7, no_new_id, epoch=PRODUCER_EPOCH_MAX + 1)


def test_a_pinned_manager_continues_the_given_sequences_and_sends_each_first_batch_alone():
    m = IdempotenceManager.pinned(ProducerIdentity(9, 0, {A: 120, B: 0}))
    assert (m.producer_id, m.epoch, m.is_pinned) == (9, 0, True)
    assert not m.may_pipeline(A) and not m.may_pipeline(B), "the leader must know the producer before a 2nd batch"
    assert m.stamp(A, 5) == (9, 0, 120)
    assert m.stamp(B, 5) == (9, 0, 0)
    m.acknowledged(A)
    assert m.may_pipeline(A) and not m.may_pipeline(B)
    assert m.stamp(A, 1) == (9, 0, 125)


def test_a_pinned_manager_never_bumps_and_refuses_partitions_it_was_not_resumed_on():
    m = IdempotenceManager.pinned(ProducerIdentity(9, 3, {A: 7}))
    with pytest.raises(AssertionError, match="not resumed on"):
        m.stamp(B, 1)
    m.stamp(A, 1)
    m.fate_unknown("OUT_OF_ORDER_SEQUENCE_NUMBER")
    m.finished(stamped=True)
    assert m.bump_needed and not m.may_stamp()
    with pytest.raises(AssertionError, match="never bumps"):
        m.maybe_bump()
    assert m.epoch == 3, "still the epoch it was resumed at"


@pytest.mark.parametrize("sequence", [-1, 1 << 31])
def test_a_pinned_sequence_is_an_int32(sequence):
    with pytest.raises(ValueError, match="sequence"):
        IdempotenceManager.pinned(ProducerIdentity(9, 0, {A: sequence}))
