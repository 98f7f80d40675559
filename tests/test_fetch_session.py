"""FetchSessionCache (KIP-227): which partitions a fetch reads and which its response
carries, session ids and epochs, errors, and eviction, against Kafka's rules."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.errors import FetchSessionIdNotFoundError, FetchSessionTopicIdError, InvalidFetchSessionEpochError
from rayk.net.fetch_session import FetchPartition, FetchSessionCache, PartitionAnswer


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def part(topic: str, partition: int, offset: int = 0, max_bytes: int = 1 << 20) -> FetchPartition:
    return FetchPartition(topic, partition, offset, max_bytes)


def quiet(hw: int = 10) -> PartitionAnswer:
    return PartitionAnswer(error_code=0, high_watermark=hw, log_start_offset=0, records_bytes=0)


def data(hw: int = 10, size: int = 100) -> PartitionAnswer:
    return PartitionAnswer(error_code=0, high_watermark=hw, log_start_offset=0, records_bytes=size)


def open_session(cache: FetchSessionCache, partitions: list[FetchPartition]) -> int:
    context = cache.new_context(0, 0, partitions, [], uses_topic_ids=False)
    session_id, chosen = context.answer([quiet() for _ in partitions])
    assert session_id != 0 and chosen == list(range(len(partitions)))
    return session_id


def test_a_sessionless_fetch_reads_and_answers_everything_and_creates_no_session():
    cache = FetchSessionCache()
    context = cache.new_context(0, -1, [part("a", 0), part("a", 1)], [], uses_topic_ids=False)
    assert [p.key for p in context.partitions] == [("a", 0), ("a", 1)]
    assert context.answer([quiet(), quiet()]) == (0, [0, 1])
    assert len(cache) == 0


def test_a_full_fetch_with_epoch_zero_creates_a_session_and_answers_everything():
    cache = FetchSessionCache()
    session_id = open_session(cache, [part("a", 0), part("b", 0)])
    assert cache.get(session_id).epoch == 1, "the next incremental fetch carries epoch 1"


def test_an_incremental_fetch_reads_every_session_partition_but_answers_only_changes():
    cache = FetchSessionCache()
    session_id = open_session(cache, [part("a", 0), part("a", 1), part("b", 0)])
    context = cache.new_context(session_id, 1, [], [], uses_topic_ids=False)
    assert [p.key for p in context.partitions] == [("a", 0), ("a", 1), ("b", 0)]
    # a0 unchanged, a1 has records, b0's high watermark moved
    assert context.answer([quiet(10), data(10), quiet(12)]) == (session_id, [1, 2])
    # the client now knows b0's HW 12; nothing changed this time
    context = cache.new_context(session_id, 2, [], [], uses_topic_ids=False)
    hw = {("a", 0): 10, ("a", 1): 10, ("b", 0): 12}
    assert context.answer([quiet(hw[p.key]) for p in context.partitions]) == (session_id, [])


def test_partitions_that_returned_records_move_to_the_end_of_the_session_order():
    cache = FetchSessionCache()
    session_id = open_session(cache, [part("a", 0), part("a", 1), part("a", 2)])
    context = cache.new_context(session_id, 1, [], [], uses_topic_ids=False)
    context.answer([data(), quiet(), quiet()])
    context = cache.new_context(session_id, 2, [], [], uses_topic_ids=False)
    assert [p.key for p in context.partitions] == [("a", 1), ("a", 2), ("a", 0)]


def test_an_incremental_fetch_adds_updates_and_forgets_partitions():
    cache = FetchSessionCache()
    session_id = open_session(cache, [part("a", 0), part("a", 1)])
    context = cache.new_context(session_id, 1, [part("a", 0, offset=50), part("c", 3)], [("a", 1)], uses_topic_ids=False)
    assert [(p.key, p.fetch_offset) for p in context.partitions] == [(("a", 0), 50), (("c", 3), 0)]
    # a new partition is answered the first time whatever it holds: the client knows nothing of it
    assert context.answer([quiet(10), quiet(0)]) == (session_id, [1])


def test_an_error_is_always_answered_and_the_partition_is_answered_again_once_it_clears():
    cache = FetchSessionCache()
    session_id = open_session(cache, [part("a", 0)])
    error = PartitionAnswer(error_code=6, high_watermark=-1, log_start_offset=-1, records_bytes=0)
    for epoch in (1, 2):
        assert cache.new_context(session_id, epoch, [], [], False).answer([error]) == (session_id, [0])
    assert cache.new_context(session_id, 3, [], [], False).answer([quiet(10)]) == (session_id, [0])
    assert cache.new_context(session_id, 4, [], [], False).answer([quiet(10)]) == (session_id, [])


def test_unknown_session_wrong_epoch_and_mixed_topic_naming_are_kafkas_errors():
    cache = FetchSessionCache()
    with pytest.raises(FetchSessionIdNotFoundError):
        cache.new_context(12345, 1, [], [], uses_topic_ids=False)
    session_id = open_session(cache, [part("a", 0)])
    with pytest.raises(InvalidFetchSessionEpochError):
        cache.new_context(session_id, 2, [], [], uses_topic_ids=False)
    with pytest.raises(FetchSessionTopicIdError):
        cache.new_context(session_id, 1, [], [], uses_topic_ids=True)
    cache.new_context(session_id, 1, [], [], uses_topic_ids=False)  # the failed attempts changed nothing


def test_a_fetch_served_after_its_session_moved_on_is_an_epoch_error():
    cache = FetchSessionCache()
    session_id = open_session(cache, [part("a", 0)])
    slow = cache.new_context(session_id, 1, [], [], False)
    cache.new_context(session_id, 2, [], [], False).answer([quiet()])
    with pytest.raises(InvalidFetchSessionEpochError):
        slow.answer([quiet()])


@pytest.mark.parametrize("epoch", [0, -1])
def test_a_full_fetch_naming_a_session_closes_it(epoch):
    cache = FetchSessionCache()
    session_id = open_session(cache, [part("a", 0)])
    context = cache.new_context(session_id, epoch, [part("b", 0)], [], uses_topic_ids=False)
    assert cache.get(session_id) is None
    new_id, _ = context.answer([quiet()])
    assert (new_id != 0) == (epoch == 0) and new_id != session_id


def test_a_full_cache_evicts_only_a_session_idle_for_the_eviction_time():
    clock = Clock()
    cache = FetchSessionCache(max_slots=2, min_eviction_ms=120_000, clock_s=clock)
    first, second = open_session(cache, [part("a", 0)]), open_session(cache, [part("b", 0)])
    clock.now_s += 60
    cache.new_context(second, 1, [], [], False).answer([quiet()])
    assert cache.new_context(0, 0, [part("c", 0)], [], False).answer([quiet()])[0] == 0, "no slot: answered without a session"
    clock.now_s += 61  # `first` idle 121 s, `second` 61 s
    third = cache.new_context(0, 0, [part("c", 0)], [], False).answer([quiet()])[0]
    assert third != 0 and cache.get(first) is None and cache.get(second) is not None


def test_zero_slots_turn_sessions_off():
    cache = FetchSessionCache(max_slots=0)
    assert cache.new_context(0, 0, [part("a", 0)], [], False).answer([quiet()]) == (0, [0])


def test_topic_ids_key_a_session_by_id():
    cache = FetchSessionCache()
    topic_id = uuid.uuid4()
    context = cache.new_context(0, 0, [FetchPartition(topic_id, 0, 5, 100)], [], uses_topic_ids=True)
    session_id, _ = context.answer([quiet()])
    context = cache.new_context(session_id, 1, [], [(topic_id, 0)], uses_topic_ids=True)
    assert context.partitions == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 3), st.integers(0, 2), st.booleans()), min_size=1, max_size=30))
def test_a_client_that_applies_incremental_responses_always_knows_every_high_watermark(steps):
    """The point of KIP-227: a client that keeps what full and incremental responses told it
    ends each round with the broker's true high watermark and log start for every session
    partition, although most rounds omit most partitions."""
    cache = FetchSessionCache()
    partitions = [part("t", p) for p in range(4)]
    session_id = open_session(cache, partitions)
    known = {p.key: (10, 0) for p in partitions}  # what open_session's quiet() answers told the client
    truth = dict(known)
    for epoch, (index, hw_step, start_step, has_error) in enumerate(steps, start=1):
        key = partitions[index].key
        hw, start = truth[key]
        truth[key] = (hw + max(hw_step, 0), start + start_step)
        errored = key if has_error else None
        context = cache.new_context(session_id, epoch, [], [], False)
        answers = [
            PartitionAnswer(6, -1, -1, 0) if p.key == errored else PartitionAnswer(0, *truth[p.key], records_bytes=0)
            for p in context.partitions
        ]
        _, chosen = context.answer(answers)
        for i in chosen:
            if answers[i].error_code == 0:  # a client takes no offsets from an error
                known[context.partitions[i].key] = (answers[i].high_watermark, answers[i].log_start_offset)
        assert {k: v for k, v in known.items() if k != errored} == {k: v for k, v in truth.items() if k != errored}


def test_a_throttled_fetch_answers_no_partition_keeps_an_incremental_session_and_makes_no_new_one():
    cache = FetchSessionCache()
    assert cache.new_context(0, 0, [part("a", 0)], [], uses_topic_ids=False).throttled() == 0, "a full fetch"
    assert len(cache) == 0, "no session for a full fetch that was throttled"
    session_id = open_session(cache, [part("a", 0)])
    throttled = cache.new_context(session_id, 1, [], [], uses_topic_ids=False)
    assert throttled.throttled() == session_id
    after = cache.new_context(session_id, 2, [], [], uses_topic_ids=False)
    assert after.answer([data(hw=12)]) == (session_id, [0]), "the next epoch reads and answers as usual"
    stale = cache.new_context(session_id, 3, [], [], uses_topic_ids=False)
    cache.new_context(session_id, 4, [], [], uses_topic_ids=False)
    with pytest.raises(InvalidFetchSessionEpochError):
        stale.throttled()


def test_an_incremental_fetch_that_forgets_every_partition_closes_its_session():
    cache = FetchSessionCache()
    session_id = open_session(cache, [part("a", 0), part("a", 1)])
    context = cache.new_context(session_id, 1, [], [("a", 0), ("a", 1)], uses_topic_ids=False)
    assert context.partitions == [] and context.answer([]) == (0, []), "answered sessionless, as Kafka does"
    assert cache.get(session_id) is None and len(cache) == 0
    with pytest.raises(FetchSessionIdNotFoundError):
        cache.new_context(session_id, 2, [], [], uses_topic_ids=False)
