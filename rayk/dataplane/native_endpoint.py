"""NativeConnections: an Endpoint's proven connections read and written by native code.

`rayk._native.EndpointConnections` (native/src/endpoint_conns.rs) does for a connection
what FrameReader's push mode, the Endpoint's request framing and AnswerWriter do in
Python: it reads the request frames as they come, holds reading back while
`max_in_flight` requests are out, and writes each answer whole as it is given, the records
of a log slice by sendfile. It has no thread: this module drives it from the replica's
event loop (the sockets' readiness callbacks call into it) and does what each call
returns: serve a request (the Endpoint's `serve_now` first, which serves a leader's
fetches, its followers' and the listeners' consumers', and produce calls without a task; else a task running its handler,
whose answer goes back to it), watch a socket for writing or stop reading it, end a connection.

The Endpoint decides which connections come here: every proven connection that is not
TLS, where the module is built and the "endpoint" path is on (`available`,
rayk/native_paths.py). The socket is
taken from its asyncio transport once the handshake is done, with what the transport had
read beyond it (the transport stays open, paused, until the connection ends, so the
Endpoint's bookkeeping of its connections is as for any other). A connection ends as in Python: the peer closed it or it broke (no
warning), a frame that does not parse at the framing level (a warning, as the Endpoint
logs it), idle for the idle timeout, or the endpoint closing; its requests still being
served are cancelled then. A native call that raises (a panic: a bug) ends every
connection served here, logged, and the Endpoint serves later ones in Python: peers
reconnect, as after any broken connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any

from rayk import native_paths
from rayk.dataplane import frames
from rayk.dataplane.frame_reader import FrameReader
from rayk.errors import NotLeaderOrFollowerError
from rayk.storage.file_slice import FileSlice

from rayk.native_paths import _native

logger = logging.getLogger(__name__)

PROOF_FLUSH_TURNS = 100  # turns of the loop the handshake's last write has to leave the transport


def available() -> bool:
    return native_paths.enabled("endpoint")


class Served:
    """One connection served natively: its descriptor, its requests being served, the
    future its serving task waits on (set to why it ended, None: nothing to warn of), and
    the NativeConnections that serves it (its answers go there)."""

    __slots__ = ("fd", "peer", "tasks", "ended", "idle_watch", "native")

    def __init__(self, fd: int, peer: object, ended: asyncio.Future[str | None], native: NativeConnections) -> None:
        self.fd, self.peer, self.ended, self.native = fd, peer, ended, native
        self.tasks: set[asyncio.Task] = set()
        self.idle_watch: asyncio.Task | None = None

    @property
    def open(self) -> bool:
        return not self.ended.done()

    def end(self, why: str | None) -> None:
        if not self.ended.done():
            self.ended.set_result(why)


class Reply:
    """The one answer to a request served without a task (`serve_now`), given to the
    request's parked waiter: the first call writes it (`NativeConnections.answer`); a second
    one (a bug: an answer that raised was answered again with its error) is logged and
    dropped, so no correlation id is answered twice. `wanted` is False once it is given or
    its connection has ended: a parked request then need not be read for."""

    __slots__ = ("_native", "_served", "_correlation_id", "_given")

    def __init__(self, native: NativeConnections, served: Served, correlation_id: int) -> None:
        self._native, self._served, self._correlation_id = native, served, correlation_id
        self._given = False

    @property
    def wanted(self) -> bool:
        return not self._given and self._served.open and self._native.alive

    def __call__(self, head: bytes, tail: bytes | FileSlice) -> None:
        if self._first():
            self._native.answer(self._served, self._correlation_id, head, tail)
        elif isinstance(tail, FileSlice):
            tail.close()

    def failed(self, frame: bytes) -> None:
        """The answer as a whole FAILED frame, unless one was given already."""
        if self._first():
            self._native.answer_frame(self._served, frame)

    def _first(self) -> bool:
        if self._given:
            logger.error("%s: a second answer to request %d from %s dropped", self._native.name, self._correlation_id,
                         self._served.peer)
            return False
        self._given = True
        return True


# (the connection, correlation id, kind, body) -> the coroutine that serves the request and answers it
ServeRequest = Callable[[Served, int, int, memoryview], Coroutine[Any, Any, None]]
# The same, without a task where it can: True if it took the request (and answers it, now or later)
ServeNow = Callable[[Served, int, int, memoryview], bool]


class NativeConnections:
    """The native connections of one Endpoint: owns the native object and the Served
    connections by descriptor. Not thread-safe: the replica's event loop."""

    def __init__(self, name: str, serve_request: ServeRequest, max_in_flight: int, idle_timeout_s: float,
                 serve_now: ServeNow | None = None) -> None:  # fmt: skip
        assert _native is not None, "rayk._native is not built"
        self.name = name
        self._loop = asyncio.get_running_loop()
        self._conns = _native.EndpointConnections(max_in_flight, frames.MAX_FRAME_BYTES)
        self._serve_request, self._serve_now = serve_request, serve_now
        self._idle_timeout_s = idle_timeout_s
        self._served: dict[int, Served] = {}
        self._batches: collections.deque[list[tuple]] = collections.deque()  # events not done yet, per call
        self._draining = False
        self._closed = False
        self.alive = True

    async def serve(self, reader: FrameReader, writer: asyncio.StreamWriter, peer: object) -> str | None:
        """Takes the proven connection over from its streams and serves it until it ends;
        returns why it ended if that is worth a warning."""
        if writer.transport.is_closing() or reader.exception() is not None:
            return None  # gone already: its descriptor may not be its own any more
        # The handshake's proof may still wait in the transport's buffer (uvloop writes at the
        # end of the loop's turn): no answer written natively may overtake it.
        for _ in range(PROOF_FLUSH_TURNS):
            if not writer.transport.get_write_buffer_size() or writer.transport.is_closing():
                break
            await asyncio.sleep(0)
        if writer.transport.get_write_buffer_size() or writer.transport.is_closing() or self._closed or not self.alive:
            return None  # not flushed (a peer that reads nothing), gone, or the endpoint closed meanwhile
        staged = reader.detach()
        writer.transport.pause_reading()  # for good; its owner closes it when the serving ends
        fd = os.dup(writer.get_extra_info("socket").fileno())
        os.set_blocking(fd, False)
        served = Served(fd, peer, self._loop.create_future(), self)
        self._served[fd] = served
        self._loop.add_reader(fd, self._on_readable, fd)
        try:
            served.idle_watch = asyncio.create_task(self._close_when_idle(served))
            self._call(self._conns.adopt, fd, staged)
            return await served.ended
        finally:
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
            if served.idle_watch is not None:
                served.idle_watch.cancel()
            for task in served.tasks:
                task.cancel()
            del self._served[fd]
            if self.alive:
                self._conns.forget(fd)
            os.close(fd)

    def answer(self, served: Served, correlation_id: int, head: bytes, tail: bytes | FileSlice) -> None:
        """The answer to a request of `served`, written as soon as the earlier ones are."""
        if not served.open or not self.alive:
            if isinstance(tail, FileSlice):
                tail.close()
            return
        head = head if type(head) is bytes else bytes(head)  # the native side takes bytes; handlers may give any bytes-like
        if isinstance(tail, FileSlice):
            stale = frames.failed_answer_frame(correlation_id, NotLeaderOrFollowerError(
                "this replica's log was truncated (it is no longer the leader) before the answer was sent"))
            self._call(self._conns.answer_file, served.fd, correlation_id, head, tail, stale)
        else:
            self._call(self._conns.answer, served.fd, correlation_id, head, tail if type(tail) is bytes else bytes(tail))

    def answer_frame(self, served: Served, frame: bytes) -> None:
        """A whole answer frame (a FAILED one) to a request of `served`."""
        if served.open and self.alive:
            self._call(self._conns.answer_frame, served.fd, frame)

    def close(self) -> None:
        """Ends every connection (the endpoint closes): their serving tasks close them."""
        self._closed = True
        for served in list(self._served.values()):
            served.end(None)

    # ------------------------------------------------------------------ the native side's calls

    def _call(self, method: Callable[..., list[tuple]], *args: Any) -> None:
        """Calls into the native side and does what it returns. One that raises (a
        panic: a bug) ends every connection served here; the Endpoint then serves new ones in Python."""
        if not self.alive:
            return
        try:
            events = method(*args)
        except BaseException as e:
            if not native_paths.failure(e):
                raise
            logger.exception("%s: the native data plane connections failed; serving new ones in Python", self.name)
            self.alive = False
            try:
                self._conns.close()  # the log slices of answers it still held go back
            except BaseException as again:
                if not native_paths.failure(again):
                    raise
            for served in list(self._served.values()):
                served.end("the native data plane connections failed")
            return
        # Serving a request may answer it at once: a native call in turn, whose events (a
        # connection no longer held, more requests handed out) must come after these, and
        # not as a recursion as deep as the requests a peer pipelined. So each call's events
        # wait their turn here, and of each call's, what to watch comes before the requests.
        self._batches.append(events)
        if self._draining:
            return
        self._draining = True
        try:
            while self._batches:
                batch = self._batches.popleft()
                for event in batch:
                    if event[0] != _native.REQUEST:
                        self._on_event(event)
                for event in batch:
                    if event[0] == _native.REQUEST:
                        self._on_event(event)
        finally:
            self._draining = False

    def _on_event(self, event: tuple) -> None:
        tag, fd = event[0], event[1]
        served = self._served.get(fd)
        if served is None:
            return
        if tag == _native.REQUEST:
            if not served.open:
                return  # ended meanwhile: nothing more of it is served
            _, _, correlation_id, kind, body = event
            body = memoryview(body)
            if self._serve_now is not None and self._serve_now(served, correlation_id, kind, body):
                return  # served without a task (answered, or to be answered later)
            task = self._loop.create_task(self._serve_request(served, correlation_id, kind, body))
            served.tasks.add(task)
            task.add_done_callback(served.tasks.discard)
        elif tag == _native.END:
            served.end(event[2])
        elif tag == _native.WANT_WRITE:
            if event[2]:
                self._loop.add_writer(fd, self._on_writable, fd)
            else:
                self._loop.remove_writer(fd)
        elif tag == _native.HOLD:
            if event[2]:
                self._loop.remove_reader(fd)
            else:
                self._loop.add_reader(fd, self._on_readable, fd)

    def _on_readable(self, fd: int) -> None:
        self._call(self._conns.on_readable, fd)

    def _on_writable(self, fd: int) -> None:
        self._call(self._conns.on_writable, fd)

    async def _close_when_idle(self, served: Served) -> None:
        """Ends the connection once no request of it is out and nothing was read or
        answered for the idle timeout (as the Python endpoint's watch does)."""
        timeout_s = self._idle_timeout_s
        while served.open:
            idle_s = self._conns.idle_s(served.fd) if self.alive else None
            if idle_s is not None and idle_s >= timeout_s:
                logger.debug("%s: closing the data plane connection from %s: idle for %.0f s",
                             self.name, served.peer, idle_s)
                served.end(None)
                return
            await asyncio.sleep(timeout_s - idle_s if idle_s is not None else timeout_s)
