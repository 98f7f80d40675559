"""SegmentFlusher: fsyncs rolled segments off the append path (Kafka schedules a
`flush-log` task on roll instead of flushing inline).

A roll closes the active segment. Its bytes must reach the disk before the log's recovery
point may move past them, but an inline fsync of a segment (up to `segment.bytes`, 1 GiB
by default) stalls every produce to the partition for as long as the disk takes: 35 ms
for 48 MiB on the benchmark machine. The log hands the flusher duplicates of the closed
segment's file descriptors; one background thread fsyncs and closes them, in roll order,
then calls back with the offset the segment ended at, and the log moves its recovery
point there unless it was truncated in between. A crash before that only means more
segments are re-read on recovery, as in Kafka. An fsync that fails is kept and
re-raised (as KafkaStorageError) by the log's next append or flush, and reported at once
to `on_failed` (the replica ends its process: rayk/replication/storage_failure.py); it is
never tried again.

The thread starts with the first roll and stops at `close`, which waits for it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger(__name__)


class SegmentFlusher:
    """One log's background fsync of rolled segments (the Log makes it, its LocalLog
    submits to it): owns the single flush thread (started on the first `submit`, joined by
    `close`) and the first fsync error, which the Log re-raises. `submit` runs under the
    Log's lock; the callback runs on the flush thread."""

    def __init__(self, name: str, on_flushed: Callable[[int, int], None],
                 on_failed: Callable[[OSError], None] | None = None) -> None:
        self._name = name
        self._on_flushed = on_flushed  # called with (end offset, tag) of each flushed segment
        self._on_failed = on_failed  # called, on the flush thread, with the first failed fsync
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.error: OSError | None = None  # the first failed fsync

    def submit(self, fds: list[int], end_offset: int, tag: int) -> None:
        """Fsyncs and closes `fds` (this object owns them now), then reports
        (`end_offset`, `tag`); the log tags a flush with its truncation count."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"rayk-flush-{self._name}")
            self._executor.submit(self._flush, fds, end_offset, tag)

    def _flush(self, fds: list[int], end_offset: int, tag: int) -> None:
        try:
            for fd in fds:
                os.fsync(fd)
        except OSError as e:
            logger.error("fsync of a rolled segment of %s failed: %s", self._name, e)
            first = self.error is None
            self.error = self.error or e
            if first and self._on_failed is not None:
                self._on_failed(e)
            return
        finally:
            for fd in fds:
                os.close(fd)
        self._on_flushed(end_offset, tag)

    def close(self) -> None:
        """Waits for the flushes submitted so far. Call it without holding the log's lock:
        the callback takes it."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
