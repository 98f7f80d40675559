"""BatchResult / FutureRecordMetadata: what `Producer.send` returns, without Ray."""

from __future__ import annotations

import collections
import gc
import logging
import sys
import threading
from collections.abc import Callable

import pytest

from rayk.client import produce_future
from rayk.client.produce_future import BatchResult, FutureRecordMetadata
from rayk.client.types import RecordMetadata
from rayk.errors import InvalidDifferentRecordError, InvalidRecordError, KafkaTimeoutError, NotEnoughReplicasError


def futures_of(batch: BatchResult, timestamps: list[int]) -> list[FutureRecordMetadata]:
    return [FutureRecordMetadata(batch, i, ts) for i, ts in enumerate(timestamps)]


def test_records_resolve_to_their_offsets_and_create_times():
    batch = BatchResult("t", 2)
    futures = futures_of(batch, [100, 200, 300])
    assert not any(f.done() for f in futures)
    batch.complete(base_offset=40, log_append_time_ms=-1)
    assert [f.result() for f in futures] == [RecordMetadata("t", 2, 40 + i, ts) for i, ts in enumerate([100, 200, 300])]
    assert all(f.succeeded() and not f.failed() and f.exception() is None for f in futures)
    assert futures[0].get(timeout=0) == futures[0].result()


def test_log_append_time_replaces_create_time_and_acks_0_has_no_offset():
    batch = BatchResult("t", 0)
    (future,) = futures_of(batch, [100])
    batch.complete(base_offset=-1, log_append_time_ms=999)
    assert future.result() == RecordMetadata("t", 0, -1, 999)


def test_a_failed_batch_raises_its_error_from_every_record():
    batch = BatchResult("t", 0)
    futures = futures_of(batch, [1, 2])
    error = NotEnoughReplicasError("only 1 in sync")
    batch.fail(error)
    for f in futures:
        assert f.failed() and f.exception() is error
        with pytest.raises(NotEnoughReplicasError):
            f.result()


def test_a_batch_refused_for_named_records_fails_each_record_with_its_own_error():
    batch = BatchResult("t", 0)
    futures = futures_of(batch, [1, 2, 3])
    refusal, others = InvalidRecordError("record 1 has no key"), InvalidDifferentRecordError("send it again")
    batch.fail(refusal, {1: InvalidRecordError("no key")}, others)
    assert [type(f.exception()) for f in futures] == [
        InvalidDifferentRecordError, InvalidRecordError, InvalidDifferentRecordError]
    assert all(f.failed() for f in futures) and batch.error is refusal
    with pytest.raises(InvalidRecordError, match="no key"):
        futures[1].result()


def test_result_times_out_as_a_timeout_error():
    (future,) = futures_of(BatchResult("t", 0), [1])
    with pytest.raises(KafkaTimeoutError):
        future.result(timeout=0.01)
    with pytest.raises(TimeoutError):  # what concurrent.futures users catch
        future.exception(timeout=0.01)


def test_callbacks_run_once_in_send_order_and_late_ones_at_once():
    batch = BatchResult("t", 0)
    futures = futures_of(batch, [1, 2, 3])
    calls = []
    for f in reversed(futures):
        f.add_done_callback(lambda f: calls.append(f.result().offset))
    futures[0].add_done_callback(lambda f: 1 / 0)  # a raising callback is logged, not fatal
    batch.complete(10, -1)
    assert calls == [12, 11, 10], "in registration order"
    futures[1].add_done_callback(lambda f: calls.append(("late", f.result().offset)))
    assert calls[-1] == ("late", 11)
    with pytest.raises(AssertionError):
        batch.complete(20, -1)  # a batch completes once


def test_waiters_in_other_threads_wake_on_completion():
    batch = BatchResult("t", 0)
    (future,) = futures_of(batch, [1])
    results = []
    waiter = threading.Thread(target=lambda: results.append(future.result(timeout=10)))
    waiter.start()
    batch.complete(5, -1)
    waiter.join(timeout=10)
    assert results == [RecordMetadata("t", 0, 5, 1)]


def test_a_callback_gets_a_future_equal_to_the_one_send_returned():
    batch, other = BatchResult("t", 0), BatchResult("t", 0)
    futures = futures_of(batch, [1, 2])
    pending = set(futures)
    seen = []
    for f in futures:
        f.add_done_callback(lambda done: (seen.append(done), pending.discard(done)))
    batch.complete(7, -1)
    assert seen == futures and not pending, "equal, of equal hash: a set of pending futures empties"
    assert [f.result() for f in seen] == [RecordMetadata("t", 0, 7, 1), RecordMetadata("t", 0, 8, 2)]
    assert futures[0] != futures[1] and futures[0] != FutureRecordMetadata(other, 0, 1) and futures[0] != 0


def test_a_callback_does_not_keep_its_records_future_alive():
    """What a batch keeps per record until it completes is the callable and two ints: a
    future kept per record is walked by every full collection (benchmarks/send_gc_bench.py)."""

    batch = BatchResult("t", 0)

    def live_futures() -> int:  # of this batch: other tests' futures may be collected meanwhile
        return sum(isinstance(o, FutureRecordMetadata) and o._batch is batch for o in gc.get_objects())

    calls = []
    for i in range(100):
        FutureRecordMetadata(batch, i, i).add_done_callback(calls.append)
    assert live_futures() == 0
    batch.complete(0, -1)
    assert [f.result().offset for f in calls] == list(range(100))


def test_callbacks_queued_with_the_record_and_added_later_each_get_their_own_record():
    """`send(callback=)` queues under the accumulator's lock, add_done_callback under the
    batch's, so the two may queue at once: each callback, index and timestamp go in whole, and every callback
    gets its own record. The switch interval is made tiny so that the threads change
    places between almost any two bytecodes."""
    switch_interval_s = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(50):
            batch = BatchResult("t", 0)
            wrong: list[tuple[int, int]] = []
            ran = []

            def check(i: int) -> Callable[[FutureRecordMetadata], None]:
                return lambda f: (ran.append(i), f._index != i and wrong.append((i, f._index)))

            later = threading.Thread(target=lambda b=batch: [
                FutureRecordMetadata(b, i, i).add_done_callback(check(i)) for i in range(1, 1000, 2)
            ])  # fmt: skip
            later.start()
            for i in range(0, 1000, 2):
                batch.add_record_callback_while_open(check(i), i, i)
            later.join(timeout=10)
            batch.complete(0, -1)
            assert not wrong and sorted(ran) == list(range(1000))
    finally:
        sys.setswitchinterval(switch_interval_s)


@pytest.fixture(params=["compiled", "python"])
def callback_loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which loop runs a finished batch's record callbacks: rayk.client._send's, or Python's."""
    if request.param == "python":
        monkeypatch.setattr(produce_future, "_run_record_callbacks", None)
    elif produce_future._run_record_callbacks is None:
        pytest.skip("rayk.client._send is not built")
    return request.param


def test_record_callbacks_run_in_order_and_one_that_raises_is_logged(callback_loop, caplog):
    batch = BatchResult("t", 0)
    seen: list[FutureRecordMetadata] = []

    def broken(future: FutureRecordMetadata) -> None:
        raise ValueError(f"record {future._index} broke")

    for i in range(5):
        batch.add_record_callback_while_open(broken if i == 2 else seen.append, i, 100 + i)
    with caplog.at_level(logging.ERROR, logger=produce_future.__name__):
        batch.complete(10, -1)
    assert [f.result() for f in seen] == [RecordMetadata("t", 0, 10 + i, 100 + i) for i in (0, 1, 3, 4)]
    assert all(type(f) is FutureRecordMetadata for f in seen)
    (logged,) = [r for r in caplog.records if "callback raised" in r.getMessage()]
    assert logged.exc_info[0] is ValueError and "record 2 broke" in str(logged.exc_info[1])
    assert logged.exc_info[2] is not None, "with its traceback"


def test_a_base_exception_from_a_record_callback_stops_the_loop_and_propagates(callback_loop):
    """As `except Exception` lets KeyboardInterrupt or SystemExit through."""

    class Stop(BaseException):
        pass

    batch = BatchResult("t", 0)
    seen: list[int] = []

    def stop(future: FutureRecordMetadata) -> None:
        raise Stop()

    for i, fn in enumerate([lambda f: seen.append(f._index), stop, lambda f: seen.append(f._index)]):
        batch.add_record_callback_while_open(fn, i, 1)
    with pytest.raises(Stop):
        batch.complete(0, -1)
    assert seen == [0] and batch.finished


def test_exception_takes_its_timeout_by_position_or_by_name():
    batch = BatchResult("t", 0)
    (future,) = futures_of(batch, [1])
    for call in (lambda: future.exception(0.01), lambda: future.exception(timeout=0.01)):
        with pytest.raises(KafkaTimeoutError):
            call()
    for wrong in (lambda: future.exception(0.01, 1), lambda: future.exception(wait=1)):
        with pytest.raises(TypeError):
            wrong()
    batch.complete(1, -1)
    assert future.exception() is None and future.exception(0) is None and future.exception(timeout=None) is None


def test_the_compiled_callback_loop_makes_futures_of_any_class_it_is_given():
    """run_record_callbacks makes a RecordPlace directly; any other future class it calls."""
    if produce_future._run_record_callbacks is None:
        pytest.skip("rayk.client._send is not built")

    class Place:
        def __init__(self, batch: BatchResult, index: int, timestamp_ms: int) -> None:
            self.where = (batch, index, timestamp_ms)

    batch, seen = BatchResult("t", 0), []
    queued = collections.deque([seen.append, 0, 5, seen.append, 1, 6])
    produce_future._run_record_callbacks(batch, queued, Place, lambda error: None)
    assert [type(f) for f in seen] == [Place, Place] and [f.where for f in seen] == [(batch, 0, 5), (batch, 1, 6)]
    with pytest.raises(ValueError, match="place"):
        produce_future._run_record_callbacks(batch, collections.deque([seen.append, 0]), Place, lambda error: None)
