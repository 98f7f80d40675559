"""NativeClient: a Kafka client connection whose socket the listener's native code reads and
writes (rayk._native's ProducePath: native/src/kafka_conns.rs), on a PLAINTEXT listener,
where rayk was built with cargo and the "kafka_conns" path is on (rayk/native_paths.py).

The native side reads each frame once the listener has admitted it (its
`queued.max.requests` slot and `queued.max.request.bytes` pool bytes, `admit`), serves
the plain Produce requests it can alone (acks 1 or -1, not transactional, while the
listener has no authorizer and no client quota) from the socket to the
replicas and back, and writes every answer in request order. Everything else comes here
as the frame it is (`on_request`), into the same Handoff a connection's reading task
fills (socket_server.py), and its answer goes back through `write`, in order: the
SocketServer's processing and writing tasks serve it as for any other connection. A
native request gives back its slot and bytes, and records its TotalTimeMs, once its answer
is ready and its turn has come (`on_freed`), as the writing task does for Python's.

Owned by the SocketServer's task serving the connection; the events come from the
NativeProduce that owns the native object (its `_call`), on the listener's event loop. Not
thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rayk.net.handoff import Handoff
from rayk.net.kafka_channel import ConnectionClosed

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from rayk.net.native_produce import NativeProduce

# A frame read: (frame, monotonic time it was read, pool bytes it holds), or None at EOF.
Frames = Handoff[tuple[bytes, float, int] | None]
# The admission of a frame's slot (`NativeClient.admit`'s size): one served natively, one for Python.
SLOT, SLOT_FOR_PYTHON = -1, -2


class NativeClient:
    """One natively read client connection: what the native side tells of it (`on_*`,
    `admit`) and the writer its Python answers go through (`write`, `drain`)."""

    def __init__(self, native: NativeProduce, fd: int, frames: Frames, queued_max: int, reader_done: asyncio.Event,
                 admit_now: Callable[[int], bool], admit: Callable[[int], asyncio.Future],
                 freed: Callable[[int, float], None]) -> None:  # fmt: skip
        """`admit_now(size)` takes a frame's pool bytes (size -1: its slot) if it can now;
        `admit(size)` waits for them (a task); `freed(size, seconds)` gives back a native
        request's slot and bytes. `reader_done` is set when nothing more will be read (the
        connection's KafkaChannel's: a throttled connection whose client left closes then)."""
        self.native, self.fd, self.frames, self.reader_done = native, fd, frames, reader_done
        self._admit_now, self._admit, self._freed = admit_now, admit, freed
        self.ended: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        # Fails (ConnectionClosed) if a wait for admission does: the connection, paused for
        # it, would never read again; its serving task ends it instead.
        self.failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._admitting: asyncio.Future | None = None
        self.queued_max = queued_max
        self._promised = 0  # frames for Python admitted, their room in `frames` kept, not yet there
        self._flushed = asyncio.Event()  # set while no answer waits for the socket to take it
        self._flushed.set()

    # ------------------------------------------------------------------ the native side's events

    def admit(self, size: int) -> bool:
        try:
            return self._admission(size)
        except Exception:  # a bug: the native side ends the connection
            logger.exception("the admission of a frame failed")
            raise

    def _admission(self, size: int) -> bool:
        """What `_read_frames` takes around a frame's body: its pool bytes (`size`) before
        it; its slot once it is whole (SLOT: a frame served natively; SLOT_FOR_PYTHON: one
        for Python, which also waits for room in `frames`, as `put` does there). Taken now
        (True), or once they come (False: `client_admitted` tells the native side then)."""
        if size >= 0:
            if self._admit_now(size):
                return True
            waiting = self._admit(size)
        else:
            for_python = size == SLOT_FOR_PYTHON
            if self._admit_now(SLOT):
                if not for_python:
                    return True
                if len(self.frames) + self._promised < self.queued_max:
                    self._promised += 1
                    return True
                waiting = asyncio.ensure_future(self._room())
            else:
                waiting = asyncio.ensure_future(self._slot_then_room(self._admit(SLOT), for_python))
        self._admitting = waiting
        waiting.add_done_callback(self._admitted)
        return False

    async def _slot_then_room(self, slot: asyncio.Future, for_python: bool) -> None:
        await slot
        if for_python:
            await self._room()

    async def _room(self) -> None:
        """Waits for room in `frames` for one more frame, and promises it."""
        await self.frames.wait_until_fewer(self.queued_max - self._promised)
        self._promised += 1

    def _admitted(self, admitting: asyncio.Future) -> None:
        self._admitting = None
        if admitting.cancelled() or self.ended.done():
            return
        if (error := admitting.exception()) is None:
            self.native.client_admitted(self.fd)
        elif not self.failed.done():  # a bug: logged, and the connection ends
            logger.error("the admission of a frame failed", exc_info=error)
            self.failed.set_exception(ConnectionClosed(f"the admission of a request failed: {error!r}"))

    def on_request(self, frame: bytes) -> None:
        self._promised -= 1
        assert self._promised >= 0, "a frame for Python had its room promised"
        self.frames.put_nowait((frame, time.monotonic(), len(frame)))

    def on_eof(self) -> None:
        """The client closed its side: what it sent is served, then the connection ends."""
        self.reader_done.set()
        self.frames.put_nowait(None)

    def on_answers_waiting(self, waiting: bool) -> None:
        """Answers wait for the socket to take them (the client reads slowly), or none do."""
        if waiting:
            self._flushed.clear()
        else:
            self._flushed.set()

    def on_freed(self, size: int, seconds: float) -> None:
        self._freed(size, seconds)

    def on_end(self, why: str | None) -> None:
        self.reader_done.set()
        if not self.ended.done():
            self.ended.set_result(why)

    def close(self) -> None:
        """The connection is done with: a wait for admission is given up."""
        self.on_end(None)
        if self._admitting is not None:
            self._admitting.cancel()
        if not self.failed.done():
            self.failed.cancel()
        elif not self.failed.cancelled():
            self.failed.exception()  # seen (raised to the serving task, or it ended first)

    # ------------------------------------------------------------------ the writer of Python's answers

    def write(self, frame: bytes) -> None:
        """Python's answer to its oldest unanswered frame (b"": it has none, acks=0)."""
        self.native.client_answer(self.fd, frame)

    async def drain(self) -> None:
        """Returns once no answer waits for the socket (as a StreamWriter's): the answers
        after it wait in the connection's queue meanwhile, holding their slots."""
        await self._flushed.wait()
