"""The futures `Producer.send` returns (Kafka's ProduceRequestResult and FutureRecordMetadata).

A batch completes once, for all its records: `BatchResult` holds that outcome (base
offset and append time, or an error) and the callbacks waiting for it. Each record's
`FutureRecordMetadata` is a few slots pointing at its batch's result and its place in the
batch, so `send()` does not pay for a lock and a condition per record, as a
`concurrent.futures.Future` would (that was a third of the time `send()` took).

FutureRecordMetadata answers like a concurrent.futures.Future (`result`, `exception`,
`done`, `add_done_callback`), plus kafka-python's `get(timeout)`, `succeeded()`, `failed()`.
Callbacks run in the producer's sender thread when the batch completes, in the order the
records were sent (or at once, in the caller's thread, if it already completed); one that
raises is logged and does not stop the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from rayk.client.types import RecordMetadata
from rayk.errors import KafkaTimeoutError

logger = logging.getLogger(__name__)


class BatchResult:
    """The outcome of one batch: set once by `complete` or `fail`."""

    __slots__ = ("topic", "partition", "base_offset", "log_append_time_ms", "error", "_done", "_callbacks", "_lock")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.base_offset = -1
        self.log_append_time_ms = -1
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def complete(self, base_offset: int, log_append_time_ms: int) -> None:
        self.base_offset, self.log_append_time_ms = base_offset, log_append_time_ms
        self._finish()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            assert not self._done.is_set(), "a batch completes once"
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _run(callback)

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None) -> None:
        if not self._done.wait(timeout_s):
            raise KafkaTimeoutError(f"no answer for {self.topic}-{self.partition} within {timeout_s} s")

    def on_done(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        _run(callback)


def _run(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        logger.exception("a send() callback raised")


class FutureRecordMetadata:
    """One record's place in a batch; resolves to its RecordMetadata."""

    __slots__ = ("_batch", "_index", "_timestamp_ms")

    def __init__(self, batch: BatchResult, index: int, timestamp_ms: int) -> None:
        self._batch, self._index, self._timestamp_ms = batch, index, timestamp_ms

    def done(self) -> bool:
        return self._batch.done()

    def succeeded(self) -> bool:
        return self._batch.done() and self._batch.error is None

    def failed(self) -> bool:
        return self._batch.done() and self._batch.error is not None

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """The record's metadata; raises the batch's error, or KafkaTimeoutError after `timeout` s."""
        batch = self._batch
        batch.wait(timeout)
        if batch.error is not None:
            raise batch.error
        offset = batch.base_offset + self._index if batch.base_offset >= 0 else -1
        timestamp = batch.log_append_time_ms if batch.log_append_time_ms >= 0 else self._timestamp_ms
        return RecordMetadata(batch.topic, batch.partition, offset, timestamp)

    get = result  # kafka-python's name

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._batch.wait(timeout)
        return self._batch.error

    def add_done_callback(self, fn: Callable[[FutureRecordMetadata], Any]) -> None:
        """Calls fn(self) once the record is acknowledged or failed."""
        self._batch.on_done(lambda: fn(self))

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self.failed() else "done")
        return f"<FutureRecordMetadata {self._batch.topic}-{self._batch.partition} #{self._index} {state}>"
