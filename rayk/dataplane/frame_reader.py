"""FrameReader: the data plane's receiving side, read into the buffers its frames end in.

asyncio's StreamReader copies every byte it receives twice after the kernel's copy: the
event loop hands each read as a new `bytes`, `feed_data` appends it to the reader's
`bytearray` (reallocating it as it grows), and `readexactly` slices the frame out of it.
py-spy on a follower at full produce throughput put ~30% of its event loop in those
copies (the leader's ~10%), second only to writing the log. `FrameProtocol` is an
`asyncio.BufferedProtocol` instead, on asyncio's loop and uvloop alike, over TCP, TLS and
Unix sockets: the event loop reads into a buffer the protocol hands it.

- **A read smaller than the staging buffer** (sizes, handshakes, small frames) is served
  from a fixed `staging` bytearray the loop reads into: one copy, out of it.
- **A larger read** (a produce request's or a fetch answer's records) gets a bytearray of
  its own, exactly its size: what is staged is moved into it, and the loop then reads the
  rest straight into it, bounded by the frame's end, so no byte of the next frame lands
  there. It is returned as a read-only memoryview over that bytearray, which nothing else
  holds: no copy after the kernel's.

Flow control as StreamReader's: while the staging buffer is full and nobody reads, the
transport stops reading (the peer's writes then wait on TCP's window); a read resumes it.
A frame's own buffer is never more than the caller asked for, which the callers bound by
`frames.MAX_FRAME_BYTES` before they ask; it is made (zero-filled) when its size is read,
where StreamReader grew as bytes came, and only after the handshake, whose reads are
small. Each connection holds its 64 KiB of staging, from its first read; the endpoint's
admission bounds how many connections there are.

Where StreamReader differs: it buffers up to 128 KiB before it pauses, this 64 KiB, so
a TLS peer that dies without closing TLS while reading is paused leaves less of its
last bytes read (a peer gone that way has no use for its answers). A read cancelled part
way through its own buffer loses those bytes: every later read raises
ConnectionAbortedError (the data plane closes a connection whose read it cancels).

Push mode (`deliver_frames`), what the Connection and the Endpoint use after the
handshake: each whole frame is handed to a callback in the event loop's own callback, as
it comes, with no task woken to read it; `hold_frames` / `release_frames` hold them back
meanwhile (the Endpoint's bound on requests in flight), with the same flow control, and
`stop_frames` ends the delivery for good (the Endpoint stopped serving the connection).

`FrameReader` keeps StreamReader's contract for what the data plane uses: `readexactly`
(raising IncompleteReadError at the end of the stream, or the connection's error),
`exception`, one waiting reader at a time; `FrameProtocol` keeps StreamReaderProtocol's
for StreamWriter (drain's flow control, `wait_closed`), so the writing side is unchanged.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
import typing
from typing import Any

from rayk.dataplane import frames

logger = logging.getLogger(__name__)

STAGING_BYTES = 64 * 1024  # the loop's reads of small frames; a read larger than a quarter of it gets its own buffer
OWN_BUFFER_FROM_BYTES = STAGING_BYTES // 4


class FrameReader:
    """The bytes received on one connection, read with `readexactly`. Fed by its
    FrameProtocol; not thread-safe: one event loop's."""

    def __init__(self) -> None:
        self._staging = bytearray(STAGING_BYTES)
        self._start = self._end = 0  # the staged bytes not read yet: _staging[_start:_end]
        self._own: bytearray | None = None  # the buffer of the read under way that has one
        self._own_filled = 0
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._exception: BaseException | None = None
        self._out_of_step: ConnectionAbortedError | None = None  # set once a read lost part of a frame
        self._transport: asyncio.BaseTransport | None = None
        self._paused = False
        self._into_own = False  # where the loop's last buffer came from
        # Push mode (deliver_frames): whole frames handed to a callback as they come.
        self._on_frame: Callable[[bytes | memoryview], None] | None = None
        self._on_end: Callable[[str], None] | None = None
        self._max_frame_bytes = 0
        self._held = False  # push mode: hand out nothing until release_frames

    # ------------------------------------------------------------------ the reading side

    def exception(self) -> BaseException | None:
        return self._exception

    async def readexactly(self, n: int) -> bytes | memoryview:
        """The next `n` bytes: a read-only memoryview over a buffer of their own if they
        are OWN_BUFFER_FROM_BYTES or more and not all staged yet, else `bytes`.
        IncompleteReadError (with what there was) if the stream ends first; the
        connection's error if it broke. Cancelled while waiting, it loses nothing, unless
        part of a read with a buffer of its own had come (see _read_into_own)."""
        if n < 0:
            raise ValueError("readexactly size can not be less than zero")
        if self._waiter is not None:
            raise RuntimeError("readexactly() called while another coroutine is already waiting for incoming data")
        if self._out_of_step is not None:
            raise self._out_of_step
        if n >= OWN_BUFFER_FROM_BYTES and self._end - self._start < n:
            return await self._read_into_own(n)
        while self._end - self._start < n:
            if self._exception is not None:
                raise self._exception
            if self._eof:
                partial = bytes(memoryview(self._staging)[self._start:self._end])
                self._start = self._end = 0
                raise asyncio.IncompleteReadError(partial, n)
            await self._wait()
        start = self._start
        self._start = end = start + n
        data = bytes(self._staging[start:end]) if n < 512 else bytes(memoryview(self._staging)[start:end])
        if end == self._end:
            self._start = self._end = 0
        if self._paused:
            self._maybe_resume()
        return data

    def deliver_frames(self, on_frame: Callable[[bytes | memoryview], None], on_end: Callable[[str], None],
                       max_frame_bytes: int) -> None:  # fmt: skip
        """From now on, hands each whole frame (its body, after its 4-byte size) to
        `on_frame` in the event loop's callback as soon as it has come, with no task woken
        to read it; `readexactly` is done with. `on_end(why)`, once, when the stream ends,
        breaks or sends a frame whose size is over `max_frame_bytes` (nothing after it is
        read). What is staged already is delivered at once. A callback must
        not raise."""
        assert self._waiter is None and self._own is None, "a read is under way"
        self._on_frame, self._on_end, self._max_frame_bytes = on_frame, on_end, max_frame_bytes
        self._push()

    def hold_frames(self) -> None:
        """Push mode: hands out nothing more until `release_frames` (the caller's bound on
        frames in flight). What comes meanwhile is staged, and once the staging buffer is
        full the transport stops reading, as when nobody reads; the end of the stream is
        told after the frames before it."""
        self._held = True

    def release_frames(self) -> None:
        """Push mode: hands out what came while held, then goes on as it came."""
        if self._held:
            self._held = False
            if self._on_frame is not None:
                self._push()

    def stop_frames(self) -> None:
        """Push mode: hands out nothing more, for good, and tells no end (the caller has
        stopped serving the connection): a `release_frames` after it delivers nothing."""
        self._on_frame = self._on_end = None
        self._held = True

    def detach(self) -> bytes:
        """Ends this reader for good and returns what it staged and nobody read: whoever
        takes the socket over (the native endpoint, native_endpoint.py) reads on from there.
        Called with no read under way and no frames being delivered."""
        assert self._waiter is None and self._own is None and self._on_frame is None, "a read is under way"
        staged = bytes(memoryview(self._staging)[self._start:self._end])
        self._start = self._end = 0
        self._out_of_step = ConnectionAbortedError("the connection was taken over by another reader")
        return staged

    def _push(self) -> None:
        """Hands out every whole frame there is (push mode). A callback that raises all the
        same (a bug) ends the delivery, logged, as a reader task that raised would end."""
        try:
            self._push_frames()
        except Exception as e:
            logger.exception("a data plane frame's callback raised")
            self._end_push(f"a frame that could not be taken: {type(e).__name__}: {e}")

    def _push_frames(self) -> None:
        while (on_frame := self._on_frame) is not None and not self._held:
            own = self._own
            if own is not None:
                if self._own_filled < len(own):
                    break
                self._own = None
                on_frame(memoryview(own).toreadonly())
                continue
            start = self._start
            staged = self._end - start
            if staged < frames.SIZE.size:
                break
            size = frames.SIZE.unpack_from(self._staging, start)[0]
            if size > self._max_frame_bytes:
                self._end_push(f"a frame of {size} bytes")
                return
            if staged - frames.SIZE.size >= size:
                body_start = start + frames.SIZE.size
                self._start = body_start + size
                if self._start == self._end:
                    self._start = self._end = 0
                on_frame(bytes(memoryview(self._staging)[body_start:body_start + size]))
            elif size >= OWN_BUFFER_FROM_BYTES:
                own = self._own = bytearray(size)
                self._own_filled = staged - frames.SIZE.size
                own[:self._own_filled] = memoryview(self._staging)[start + frames.SIZE.size:self._end]
                self._start = self._end = 0
            else:
                break  # the rest of a small frame is still to come
        if self._paused:
            self._maybe_resume()
        if self._held:
            return  # the end, if it came, is told once what came before it is handed out
        if self._exception is not None:
            self._end_push(f"the connection broke: {self._exception or type(self._exception).__name__}")
        elif self._eof:
            self._end_push("the peer closed the connection")

    def _end_push(self, why: str) -> None:
        on_end = self._on_end
        self._on_frame = self._on_end = None
        if on_end is not None:
            on_end(why)

    async def _read_into_own(self, n: int) -> memoryview:
        own = bytearray(n)
        staged = self._end - self._start
        own[:staged] = memoryview(self._staging)[self._start:self._end]
        self._start = self._end = 0
        self._own, self._own_filled = own, staged
        self._maybe_resume()
        try:
            while self._own_filled < n:
                if self._exception is not None:
                    raise self._exception
                if self._eof:
                    raise asyncio.IncompleteReadError(bytes(own[:self._own_filled]), n)
                await self._wait()
        except asyncio.CancelledError:
            # Part of a frame is gone with its buffer: the stream is out of step from here
            # (the data plane closes a connection whose read it cancels).
            self._out_of_step = ConnectionAbortedError("a read was cancelled part way through a frame")
            raise
        finally:
            self._own = None
        return memoryview(own).toreadonly()

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _compact(self) -> None:
        """Moves the staged bytes to the front of the staging buffer. Same-size slice
        assignment: the buffer is never resized, as the loop may hold a view of it."""
        staged = self._end - self._start
        self._staging[:staged] = self._staging[self._start:self._end]
        self._start, self._end = 0, staged

    def _maybe_resume(self) -> None:
        if self._paused and self._transport is not None and (
            (self._own is not None and self._own_filled < len(self._own))  # reads go into it, bounded
            or self._start > 0 or self._end < len(self._staging)
        ):
            self._paused = False
            self._transport.resume_reading()  # type: ignore[attr-defined]

    def _wake(self) -> None:
        if self._on_frame is not None:
            self._push()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------ the protocol's side

    def get_buffer(self) -> memoryview:
        own = self._own
        if own is not None and self._own_filled < len(own):
            self._into_own = True
            return memoryview(own)[self._own_filled:]
        # The loop may read again before the reader has taken a filled frame: what follows
        # it is staged.
        self._into_own = False
        if self._end == len(self._staging):
            if self._start > 0:
                self._compact()
            else:  # full, and read again although reading paused: never hand out an empty buffer
                self._staging = self._staging + bytearray(STAGING_BYTES)
        return memoryview(self._staging)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._into_own:
            assert self._own is not None
            self._own_filled += nbytes
            assert self._own_filled <= len(self._own), "a frame's buffer is filled to its end only"
            if self._own_filled == len(self._own):
                self._wake()
            return
        self._end += nbytes
        if self._end == len(self._staging) and self._start == 0 and self._transport is not None and not self._paused:
            self._paused = True  # staged and unread: the peer waits until it is read
            self._transport.pause_reading()  # type: ignore[attr-defined]
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        self._exception = exc
        self._wake()


class FrameProtocol(asyncio.BufferedProtocol):
    """The protocol of a data plane connection: reads into its FrameReader's buffers, and
    is the StreamWriter's protocol for writing (drain's flow control and `wait_closed`, as
    asyncio's FlowControlMixin does them: that mixin is an `asyncio.Protocol`, which uvloop
    would feed through `data_received` rather than a buffer)."""

    def __init__(
        self, reader: FrameReader,
        connected: Callable[[asyncio.BaseTransport, FrameProtocol], None] | None = None,
    ) -> None:  # fmt: skip
        self._loop = asyncio.get_running_loop()
        self.reader = reader
        self._connected = connected  # a server's: called as each connection is made
        self.task: asyncio.Task | None = None  # the server's task serving the connection
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._writing_paused = False
        self._connection_lost = False
        self._over_tls = False
        self._drain_waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.reader._transport = transport
        self._over_tls = transport.get_extra_info("sslcontext") is not None
        if self._connected is not None:
            self._connected(transport, self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.reader.buffer_updated(nbytes)

    def eof_received(self) -> bool:
        self.reader.feed_eof()
        # As StreamReaderProtocol: a plain connection stays open for writing (the answers to
        # what the peer sent before it shut its side), TLS closes (it has no half-close).
        return not self._over_tls

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self.reader.feed_eof()
        else:
            self.reader.set_exception(exc)
        self.reader._transport = None
        if not self._closed.done():
            if exc is None:
                self._closed.set_result(None)
            else:
                self._closed.set_exception(exc)
                self._closed.exception()  # retrieved: nobody need wait for it
        self._connection_lost = True
        for waiter in self._drain_waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    # ------------------------------------------------------------------ StreamWriter's side

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _drain_helper(self) -> None:
        if self._connection_lost:
            raise ConnectionResetError("Connection lost")
        if not self._writing_paused:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        try:
            await waiter
        finally:
            self._drain_waiters.remove(waiter)

    def _get_close_waiter(self, stream: Any) -> asyncio.Future[None]:
        return self._closed


def streams_of(transport: asyncio.BaseTransport, protocol: FrameProtocol) -> tuple[FrameReader, asyncio.StreamWriter]:
    """The reader and writer of a connection made with a FrameProtocol."""
    # No reader for the writer: StreamWriter takes only a StreamReader, to raise its error in
    # drain(); the protocol's drain raises once the connection is lost anyway.
    writing = typing.cast(asyncio.WriteTransport, transport)  # a stream's transport: read and write
    return protocol.reader, asyncio.StreamWriter(writing, protocol, None, asyncio.get_running_loop())


def new_protocol() -> FrameProtocol:
    return FrameProtocol(FrameReader())
