"""The futures `Producer.send` returns (Kafka's ProduceRequestResult and FutureRecordMetadata).

A batch completes once, for all its records: `BatchResult` holds that outcome (base
offset and append time, or an error) and the callbacks waiting for it; a batch the leader
refused for some of its records (KIP-467) fails those with their own errors and the rest
with another (`fail`'s `named` and `others`). Each record's `FutureRecordMetadata` is a
few slots pointing at its batch's result and its place in the batch, so `send()` does not
pay for a lock and a condition per record, as a `concurrent.futures.Future` would (that
was a third of the time `send()` took).
`send_batch` returns one `FutureSendBatch` for all the batches of a call.

A batch waiting for its acknowledgement keeps, per record with a callback, the callable
and the record's place (two ints), not its future: `add_done_callback` does not keep the
future alive, and the sender hands each callback a new future for the same record (equal
to the one `send` returned, and of equal hash). Objects that live until their batch is
acknowledged outlive two of Python's young collections, and every full collection then
walks all of them: with a producer's buffer full of records, a future and a
(callable, future) pair kept per record were two thirds of the objects those collections
walked, and the collections were more than half of `send()`'s CPU
(`benchmarks/send_gc_bench.py`). The user's callable is the one object per record left.
A callback given to `send` itself (`callback=`, Kafka's send(record, callback)) is queued
as the record is appended, under the accumulator's lock, with no lock of the batch's: one
lock per record less than `send(...).add_done_callback(fn)`.

FutureRecordMetadata answers like a concurrent.futures.Future (`result`, `exception`,
`done`, `add_done_callback`), plus kafka-python's `get(timeout)`, `succeeded()`, `failed()`.
Callbacks run in the producer's sender thread when the batch completes, in the order the
records were sent (or at once, in the caller's thread, if it already completed); one that
raises is logged and does not stop the others.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from rayk.client.types import RecordMetadata
from rayk.errors import KafkaTimeoutError

logger = logging.getLogger(__name__)


class BatchResult:
    """The outcome of one batch: set once by `complete` or `fail`."""

    __slots__ = (
        "topic", "partition", "base_offset", "log_append_time_ms", "error", "finished",
        "_named", "_others", "_done", "_callbacks", "_record_callbacks", "_lock",
    )  # fmt: skip

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.base_offset = -1
        self.log_append_time_ms = -1
        self.error: BaseException | None = None
        self._named: Mapping[int, BaseException] | None = None  # see `fail`
        self._others: BaseException | None = None
        # Set with `_done`: what a record's callback asks first (done? failed?) is then an
        # attribute read, not a call of Event.is_set, once per record.
        self.finished = False
        self._done = threading.Event()
        self._callbacks: list[tuple[Callable[[Any], None], Any]] = []
        # Record callbacks, each followed by its record's index and timestamp_ms: ints, no
        # object per record for Python's collector to count or walk. Each three queued
        # under `_lock`, or by the compiled send path under the accumulator's lock with no
        # Python code between them (CPython lets no other thread run there), so threes
        # queued by two threads at once never interleave.
        self._record_callbacks: collections.deque[Callable[[FutureRecordMetadata], Any] | int] = collections.deque()
        self._lock = threading.Lock()

    def complete(self, base_offset: int, log_append_time_ms: int) -> None:
        self.base_offset, self.log_append_time_ms = base_offset, log_append_time_ms
        self._finish()

    def fail(
        self, error: BaseException, named: Mapping[int, BaseException] | None = None, others: BaseException | None = None
    ) -> None:
        """Fails every record with `error`; or, when the leader named the records at fault
        (`error`'s record errors), the record at index i with `named[i]` and the others
        with `others`. `error` stays the batch's (what `send_batch`'s future raises)."""
        assert (named is None) == (others is None), "named records need an error for the others"
        self.error, self._named, self._others = error, named, others
        self._finish()

    def error_of(self, index: int) -> BaseException | None:
        """The error of the batch's record at `index` (None: none, or not finished)."""
        if self._named is None:
            return self.error
        return self._named.get(index, self._others)

    def _finish(self) -> None:
        with self._lock:
            assert not self.finished, "a batch completes once"
            self.finished = True
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
            record_callbacks, self._record_callbacks = self._record_callbacks, collections.deque()
        for callback, arg in callbacks:  # no lambda or call per record: a batch may carry 10,000
            try:
                callback(arg)
            except Exception:
                logger.exception("a send() callback raised")
        if _run_record_callbacks is not None:  # the same loop, compiled
            _run_record_callbacks(self, record_callbacks, FutureRecordMetadata, _report_callback_error)
            return
        queued: Iterator[Any] = iter(record_callbacks)  # a callable, then its record's index and timestamp
        for fn in queued:
            index, timestamp_ms = next(queued), next(queued)
            try:
                fn(FutureRecordMetadata(self, index, timestamp_ms))
            except Exception:
                logger.exception("a send() callback raised")

    def add_record_callback_while_open(self, fn: Callable[[FutureRecordMetadata], Any], index: int, timestamp_ms: int) -> None:
        """Queues a record's callback, its index and its timestamp as the accumulator appends
        the record (`send`'s `callback`), under the accumulator's lock, to its partition's
        open batch: such a batch cannot finish before it is closed, which takes that lock
        too. Three appends under `_lock`, not one `extend`: these allocate no object the
        collector tracks (an extend makes an iterator), which the accumulator's append relies
        on (see RecordAccumulator.append); the lock keeps a later add_done_callback on
        another thread from coming between them."""
        lock, queue = self._lock, self._record_callbacks
        lock.acquire()
        try:
            queue.append(fn)
            queue.append(index)
            queue.append(timestamp_ms)
        finally:
            lock.release()

    def done(self) -> bool:
        return self.finished

    def wait(self, timeout_s: float | None) -> None:
        if not self.finished and not self._done.wait(timeout_s):
            raise KafkaTimeoutError(f"no answer for {self.topic}-{self.partition} within {timeout_s} s")

    def on_done(self, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Calls callback(arg) once the batch completes (at once if it has)."""
        with self._lock:
            if not self.finished:
                self._callbacks.append((callback, arg))
                return
        _run(lambda: callback(arg))


def _report_callback_error(error: Exception) -> None:
    logger.error("a send() callback raised", exc_info=error)


def _run(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        logger.exception("a send() callback raised")


class _RecordPlaceReference:
    """A record's place in its batch, FutureRecordMetadata's three slots: compiled as
    rayk.client._send.RecordPlace (no Python __init__ per record), this where it is not."""

    __slots__ = ("_batch", "_index", "_timestamp_ms")

    def __init__(self, batch: BatchResult, index: int, timestamp_ms: int) -> None:
        self._batch, self._index, self._timestamp_ms = batch, index, timestamp_ms


try:  # built from _send.c by pip install
    from rayk.client._send import RecordPlace as _RecordPlace
    from rayk.client._send import run_record_callbacks as _run_record_callbacks
except ImportError:  # pragma: no cover - no C compiler at install time (send_path.py says so)
    _RecordPlace = _RecordPlaceReference
    _run_record_callbacks = None


class FutureRecordMetadata(_RecordPlace):
    """One record's place in a batch; resolves to its RecordMetadata. Two futures of the
    same record are equal (a callback gets one of its own; see the module docstring)."""

    __slots__ = ()
    _batch: BatchResult
    _index: int
    _timestamp_ms: int

    def __reduce__(self) -> tuple[Any, ...]:  # copy.copy, as with the slots of a Python class
        return (FutureRecordMetadata, (self._batch, self._index, self._timestamp_ms))

    def done(self) -> bool:
        return self._batch.finished

    def succeeded(self) -> bool:
        return self._batch.finished and self._batch.error is None

    def failed(self) -> bool:
        return self._batch.finished and self._batch.error is not None

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """The record's metadata; raises its error (`BatchResult.error_of`), or
        KafkaTimeoutError after `timeout` s."""
        batch = self._batch
        batch.wait(timeout)
        error = batch.error_of(self._index)
        if error is not None:
            raise error
        offset = batch.base_offset + self._index if batch.base_offset >= 0 else -1
        timestamp = batch.log_append_time_ms if batch.log_append_time_ms >= 0 else self._timestamp_ms
        return RecordMetadata(batch.topic, batch.partition, offset, timestamp)

    get = result  # kafka-python's name

    def exception(self, timeout: float | None = None) -> BaseException | None:
        batch = self._batch
        if not batch.finished:
            batch.wait(timeout)
        return batch.error_of(self._index)

    if _RecordPlace is not _RecordPlaceReference:  # the same, compiled (_send.c): a callback per record asks it
        exception = _RecordPlace.exception  # noqa: F811

    def add_done_callback(self, fn: Callable[[FutureRecordMetadata], Any]) -> None:
        """Calls fn(a future equal to this one) once the record is acknowledged or failed
        (at once if it has been). Once per record for many callers: the batch's queue is
        appended to here rather than through a method of BatchResult. A callback known
        when the record is sent costs less given to `send` (`callback=`): no lock."""
        batch = self._batch
        with batch._lock:
            if not batch.finished:
                batch._record_callbacks.extend((fn, self._index, self._timestamp_ms))
                return
        _run(lambda: fn(FutureRecordMetadata(batch, self._index, self._timestamp_ms)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FutureRecordMetadata):
            return NotImplemented
        return self._batch is other._batch and self._index == other._index

    def __hash__(self) -> int:
        return hash((id(self._batch), self._index))

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self.failed() else "done")
        return f"<FutureRecordMetadata {self._batch.topic}-{self._batch.partition} #{self._index} {state}>"


class BatchOffsets(NamedTuple):
    """Where one batch of a `send_batch` call landed: offsets base_offset..last_offset of
    its partition (-1 with acks=0)."""

    partition: int
    base_offset: int
    record_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1 if self.base_offset >= 0 else -1


class SendBatchMetadata(NamedTuple):
    """What `send_batch` wrote: an offset range per batch, in the order they were queued,
    and per record of the call (in the caller's order) its partition and offset."""

    topic: str
    batches: list[BatchOffsets]
    partitions: np.ndarray  # int32
    offsets: np.ndarray  # int64; -1 with acks=0


class FutureSendBatch:
    """The outcome of one `send_batch` call: resolves once every batch of it is
    acknowledged, to SendBatchMetadata, or raises the first error of its batches. Answers
    like a concurrent.futures.Future (`result`, `exception`, `done`, `add_done_callback`)."""

    def __init__(self, topic: str, partitions: np.ndarray, parts: list[tuple[BatchResult, int, np.ndarray]]) -> None:
        self._topic = topic
        self._partitions = partitions
        self._parts = parts  # (batch result, partition, the call's rows in it)
        self._lock = threading.Lock()
        self._pending = len(parts)
        self._all_done = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        if not parts:
            self._all_done.set()
        for result, _, _ in parts:
            result.on_done(self._one_done)

    def _one_done(self, _: Any = None) -> None:
        with self._lock:
            self._pending -= 1
            if self._pending:
                return
            self._all_done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _run(callback)

    def done(self) -> bool:
        return self._all_done.is_set()

    def _wait(self, timeout: float | None) -> None:
        if not self._all_done.wait(timeout):
            raise KafkaTimeoutError(f"send_batch to {self._topic}: batches still unacknowledged after {timeout} s")

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return next((r.error for r, _, _ in self._parts if r.error is not None), None)

    def result(self, timeout: float | None = None) -> SendBatchMetadata:
        """The offsets of every record; raises the first batch's error, or
        KafkaTimeoutError after `timeout` s."""
        error = self.exception(timeout)
        if error is not None:
            raise error
        offsets = np.full(len(self._partitions), -1, dtype=np.int64)
        batches = []
        for result, partition, rows in self._parts:
            batches.append(BatchOffsets(partition, result.base_offset, len(rows)))
            if result.base_offset >= 0:
                offsets[rows] = np.arange(result.base_offset, result.base_offset + len(rows), dtype=np.int64)
        return SendBatchMetadata(self._topic, batches, self._partitions, offsets)

    get = result

    def add_done_callback(self, fn: Callable[[FutureSendBatch], Any]) -> None:
        """Calls fn(self) once every batch is acknowledged or failed."""
        with self._lock:
            if not self._all_done.is_set():
                self._callbacks.append(lambda: fn(self))
                return
        _run(lambda: fn(self))

    def __repr__(self) -> str:
        return f"<FutureSendBatch {self._topic} {len(self._partitions)} records {'done' if self.done() else 'pending'}>"
