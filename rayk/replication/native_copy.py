"""NativeCopy: a follower's copy loop in native code, on a thread of its own, while
nothing unusual comes (rayk._native's FollowerCopy, native/src/follower_copy.rs).

The Python loop (replica_fetcher.py) wakes the follower for each answer: the answer is
read, decoded, appended, and only then is the next fetch sent. At RF=3 that is a Python
wake-up per follower per record, on the path of every acks=all acknowledgement. Here a
thread without the GIL does the steady part: it fetches at the log end, checks the batches
as `append_as_follower` does (framing, CRC-32C, record counts, offsets that continue the
log, the log's latest leader epoch) and writes them at the end of the active segment's
file, then fetches again at once. The leader learns the new position without waiting for
the follower's Python.

Python keeps the Log: the thread signals an eventfd that the event loop watches, at most
every TAKE_IN_INTERVAL_MS, and this module brings the Log up to the bytes written
(`append_as_follower(..., written_at=...)`: the indexes, producer state, LEO, then the HW
and log start the leader sent), many writes in one wake-up. Every byte the Log counts was
checked twice, and a write that the Log does not take in (a bug) ends the process like a
failed disk (storage_failure.py): the log loads from its files again, and they hold only
whole, checked batches.

Whatever is not the steady part ends the run and is handed back, with nothing of it
written: an error, a diverging epoch, a control batch, a batch of a new leader epoch, one
that does not continue the log or fails a check, one that would roll the segment, a FAILED
answer. The fetcher handles that answer as its own loop would (`copy` returns it) and
starts another run. So do a failed connection (NETWORK_EXCEPTION, a new one next time)
and a failed write (KAFKA_STORAGE_ERROR). A run is stopped (and waited for) before the
fetcher ends, before anything else changes the active segment (Log.set_external_writer:
a roll of retention's, a truncation, close), and as soon as a throttle applies (a
reassignment's copy is paced in Python; `stop_run`): when `copy` returns or raises,
nothing writes the log any more and the Log holds all of it.

It runs where rayk._native is built and its "follower" path is on (rayk/native_paths.py),
over a connection of its own that is not TLS (a leader on another node behind TLS is
fetched from in Python). Not thread-safe: the replica's event loop; the thread touches no
Python object.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from rayk import native_paths
from rayk.dataplane import frames
from rayk.dataplane.frames import FetchResult
from rayk.errors import KafkaStorageError, NetworkError
from rayk.native_paths import _native
from rayk.storage import Log

if TYPE_CHECKING:
    from rayk.replication.leader_link import LeaderLink

logger = logging.getLogger(__name__)

HANDED_BACK, FAILED, STORAGE, STOPPED, PANICKED = 0, 1, 2, 3, 4  # FollowerCopy's outcomes
# How often at most the thread wakes the event loop to take its writes in (and at the run's
# end). Nothing waits for it: the leader learns the follower's position from its next
# fetch, sent at once, and whatever changes the log first ends the run and takes all of it
# in. So it only bounds how stale the follower's own LEO and HW look to its readers
# (describe, the broker's board), and it is most of the follower's CPU at a low rate: at
# 1,000 records/s over 3 partitions, each write taken in alone cost the followers
# ~660 µs per record against ~460-540 with 20 ms (benchmarks/latency_cpu_bench.py).
TAKE_IN_INTERVAL_MS = 20


def available() -> bool:
    return native_paths.enabled("follower")


class NativeCopy:
    """One fetcher's native runs (see the module docstring): owns the connection they
    share, reopened after one fails. Not thread-safe: the replica's event loop."""

    def __init__(self, log: Log, name: str, leader: LeaderLink, on_progress: Callable[[], None]) -> None:
        self._log, self.name, self._leader, self._on_progress = log, name, leader, on_progress
        self._sock: int | None = None
        self.unusable = False  # the leader's endpoint is behind TLS: this fetcher copies in Python
        self.runs = 0  # runs started (for tests and benchmarks)
        self._run: object | None = None  # the run under way

    def stop_run(self) -> None:
        """Ends the run under way, if any, at once (a throttle now applies): what it wrote is
        taken in and `copy` returns None. The answer whose write is under way is the last."""
        if self._run is not None:
            self._run.stop()  # its outcome (STOPPED) comes with its signal

    def close(self) -> None:
        if self._sock is not None:
            os.close(self._sock)
            self._sock = None

    async def copy(self, fetch: frames.FetchRequest, timeout_ms: int, keep_running: Callable[[], bool]) -> FetchResult | None:
        """Copies until an answer is handed back (returned, to be handled as the Python
        loop's), or None once `keep_running` says no or the log cannot take a native
        write now (its active segment is empty: it rolls by the clock); `fetch` gives all
        but the offset. Raises NetworkError for a failed connection, KafkaStorageError for a
        failed write, CancelledError; in every case with nothing left running."""
        start = self._log.follower_append_window()
        if start is None:
            return None
        window, log_end_offset, high_watermark, latest_epoch = start
        self._leader.reset()  # the Python loop's connection, if it fetched: one connection to the leader at a time
        if self._sock is None:
            try:
                self._sock = await self._leader.open_socket()
            except ValueError:  # behind TLS
                self.unusable = True
                return None
            # The window may have moved while the connection opened (nothing else writes
            # the log, but a truncation on a new assignment cancels this task first).
            start = self._log.follower_append_window()
            if start is None:
                return None
            window, log_end_offset, high_watermark, latest_epoch = start
        sock = os.dup(self._sock)
        try:
            run = _native.FollowerCopy(
                sock, window.fd, window.position, log_end_offset, high_watermark, latest_epoch, window.segment_bytes,
                window.max_timestamp_ms, window.max_batches, window.max_last_offset, fetch.max_bytes, fetch.min_bytes,
                fetch.max_wait_ms, fetch.replica_id, fetch.leader_epoch, fetch.incarnation_id.encode()[:0xFFFF],
                timeout_ms, frames.MAX_FRAME_BYTES, 0, TAKE_IN_INTERVAL_MS,
            )  # fmt: skip
        except BaseException:
            os.close(sock)
            raise
        self.runs += 1
        self._run = run
        if not keep_running():  # a throttle applied while the connection opened: `stop_run` found no run
            run.stop()
        taken = _TakenIn(window.fd, window.position)
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        signal_fd = run.signal_fd()
        loop.add_reader(signal_fd, self._on_signal, run, signal_fd, taken, ended, keep_running)
        # Whatever else changes the active segment (a retention's roll, a truncation, close)
        # ends the run first, and takes its writes in.
        self._log.set_external_writer(lambda: self._end(run, taken, report=False))
        try:
            await ended
        finally:
            self._run = None
            self._log.set_external_writer(None)
            loop.remove_reader(signal_fd)
            self._end(run, taken)  # raises what the Log refuses: the process ends
            del run  # its eventfds close
        return self._outcome(ended, taken)

    def _end(self, run: object, taken: _TakenIn, report: bool = True) -> None:
        """Stops the run, waits for its thread, and takes in what it wrote."""
        run.stop()
        run.join()  # at once: the thread wakes from its poll, or ends the write under way
        self._take_in(run, taken, report)

    def _on_signal(self, run: object, signal_fd: int, taken: _TakenIn, ended: asyncio.Future[None],
                   keep_running: Callable[[], bool]) -> None:  # fmt: skip
        try:
            os.read(signal_fd, 8)
        except BlockingIOError:
            pass
        if ended.done():
            return
        try:
            self._take_in(run, taken)
        except BaseException as e:
            ended.set_exception(e)
            return
        taken.outcome = run.outcome()
        if taken.outcome is not None:
            ended.set_result(None)
        elif not keep_running():
            run.stop()  # its outcome (STOPPED) comes with the next signal

    def _take_in(self, run: object, taken: _TakenIn, report: bool = True) -> None:
        """Brings the Log up to what the run wrote, then to the HW and log start the leader
        sent; then calls `on_progress` if `report` (not from inside a Log call)."""
        position, log_end_offset, high_watermark, leader_log_start, _ = run.progress()
        log = self._log
        if position > taken.position:
            try:
                data = os.pread(taken.fd, position - taken.position, taken.position)
            except OSError as e:  # the log's disk fails reads
                raise KafkaStorageError(f"{self.name}: reading back what the native copy loop wrote failed: {e}") from e
            if len(data) != position - taken.position:
                raise KafkaStorageError(f"{self.name}: {position - taken.position} bytes written by the native copy "
                                        f"loop at {taken.position} read back as {len(data)}")
            try:
                log.append_as_follower(data, written_at=(taken.fd, taken.position))
            except KafkaStorageError:
                raise
            except Exception as e:  # checked natively already: a bug, and bytes in the file the Log does not hold
                raise KafkaStorageError(f"{self.name}: the log refused what the native copy loop wrote: {e!r}") from e
            taken.position = position
            assert log.log_end_offset == log_end_offset, (log.log_end_offset, log_end_offset)
        new_hw = min(high_watermark, log.log_end_offset)
        if new_hw > log.high_watermark:
            log.high_watermark = new_hw
            taken.changed = True
        # The leader's log start moved past ours: so does ours, as far as our HW (as the Python loop does).
        log_start = min(leader_log_start, log.high_watermark)
        if log_start > log.log_start_offset:
            log.maybe_increment_log_start_offset(log_start)
            taken.changed = True
        if report and (taken.changed or position > taken.reported):
            taken.reported, taken.changed = position, False
            self._on_progress()

    def _outcome(self, ended: asyncio.Future[None], taken: _TakenIn) -> FetchResult | None:
        ended.result()  # what taking in a write raised
        kind, detail = taken.outcome if taken.outcome is not None else (STOPPED, None)
        if kind == HANDED_BACK:
            correlation_id, outcome = frames.ANSWER_HEADER.unpack_from(detail)
            rest = memoryview(detail)[frames.ANSWER_HEADER.size:]
            try:
                if outcome == frames.FAILED:
                    raise frames.decode_failed_answer(rest)  # that fetch failed; the connection goes on
                return frames.decode_fetch_answer(rest)
            except frames.FrameError as e:
                self.close()
                raise NetworkError(f"{self.name}'s leader answered a frame that does not parse: {e}") from None
        if kind == FAILED:
            self.close()
            raise NetworkError(f"data plane connection to {self.name}'s leader: {detail}")
        if kind == STORAGE:
            raise KafkaStorageError(f"{self.name}: {detail}")
        if kind == PANICKED:  # a bug: this fetcher copies in Python from now on
            logger.error("%s: the native copy loop failed (%s); copying in Python", self.name, detail)
            self.unusable = True
        # Stopped (keep_running said no, or the log needed the active segment): a fetch may
        # still be out on the connection, whose answer no later run must take for its own.
        self.close()
        return None


class _TakenIn:
    """Where one run's writes were taken into the Log up to, and how the run ended."""

    __slots__ = ("fd", "position", "reported", "changed", "outcome")

    def __init__(self, fd: int, position: int) -> None:
        self.fd, self.position = fd, position
        self.reported, self.changed = position, False  # what `on_progress` was told of; the HW or start moved since
        self.outcome: tuple[int, object] | None = None
