"""Connection: a peer's persistent, pipelined connection to one data plane Endpoint.

`open` picks the endpoint's Unix socket when both are on the same node and TCP
otherwise (TLS, pinned to the endpoint's certificate, if it has one: tls.py), and proves
the endpoint's secret (handshake.py). `request` sends a frame and returns its answer's
body; up to `max_in_flight` requests may be in flight (more wait), and each answer goes
to its request by correlation id as it comes (the FrameReader hands it over in the event
loop's callback: no reader task), in whatever order the endpoint answers them (a
long-polled fetch holds up no other request).

A request the endpoint answers as FAILED (its handler raised: frames.py) raises that
answer's KafkaError, for that request alone. A connection that breaks (the endpoint's
process died, the socket closed, an answer to no request or that does not parse) fails
every request in flight, and every later one, with NETWORK_EXCEPTION:
the caller opens a new connection, as it would call again after a failed Ray call. A
request cancelled while waiting (a timeout) leaves the connection usable: its answer is
read and dropped.

A connection with no request in flight for `idle_timeout_s` closes itself (Kafka's client
connections.max.idle.ms, 9 minutes: before the endpoint's 10, so a request is never sent
into the endpoint's close); its owner opens a new one when it next needs one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Sequence

from rayk.dataplane import frames, handshake, streams, tls
from rayk.dataplane.endpoint import EndpointAddress, keep_alive
from rayk.dataplane.frame_reader import FrameReader
from rayk.errors import NetworkError

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 16
CONNECT_TIMEOUT_MS = 5_000
SMALL_FRAME_BYTES = 16 * 1024  # a body this small is joined to its header: one write, not two
IDLE_TIMEOUT_S = 540.0  # Kafka's client connections.max.idle.ms; below the endpoint's


class Connection:
    """One open, authenticated connection to an Endpoint: owns the socket, the requests in
    flight by correlation id (at most `max_in_flight`) and the idle-watch task; answers
    come in its FrameReader's callback. Made by `open`; once broken or closed it stays
    so, and its owner (a ReplicaLink) opens another. Not thread-safe: one event loop's."""

    def __init__(
        self, reader: FrameReader, writer: asyncio.StreamWriter, name: str, max_in_flight: int,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self._writer = writer  # the reader hands answers over itself (deliver_frames)
        self._start(name, max_in_flight, idle_timeout_s)
        # Last: what is staged already (an endpoint's end of stream, say) is handed out at once.
        reader.deliver_frames(self._on_answer, self._on_end, frames.MAX_FRAME_BYTES)

    def _start(self, name: str, max_in_flight: int, idle_timeout_s: float) -> None:
        """What every connection keeps, however its bytes are read and written."""
        self.name = name
        # Requests sent and not answered yet, by correlation id; one whose caller stopped
        # waiting stays until its answer comes (and is dropped then).
        self._pending: dict[int, asyncio.Future] = {}
        self._correlation_ids = itertools.count()
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self._broken: NetworkError | None = None
        self._last_active_s = time.monotonic()  # the last request sent or answer read
        self._idle_watch = asyncio.create_task(self._close_when_idle(idle_timeout_s))

    @classmethod
    async def open(
        cls, address: EndpointAddress, node_id: str, name: str = "", max_in_flight: int = MAX_IN_FLIGHT,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> Connection:
        """Connects to `address` from a process on node `node_id`. NETWORK_EXCEPTION if the
        endpoint cannot be reached within CONNECT_TIMEOUT_MS or fails the handshake."""
        where = "its Unix socket" if address.node_id == node_id else f"{address.host}:{address.port}"
        try:
            reader, writer = await open_proven_streams(address, node_id)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
            raise NetworkError(f"cannot open a data plane connection to {name or 'an endpoint'} at {where}: "
                               f"{e or type(e).__name__}") from None
        if cls is Connection and (address.node_id == node_id or not address.tls_certificate):
            from rayk.dataplane import native_connection  # it subclasses this one

            if native_connection.available():  # read and written by rayk._native, where built
                return native_connection.NativeConnection.adopting(reader, writer, name, max_in_flight, idle_timeout_s)
        return cls(reader, writer, name, max_in_flight, idle_timeout_s)

    @property
    def closed(self) -> bool:
        return self._broken is not None

    async def request(self, kind: int, body: bytes | Sequence[bytes], answered: bool = True) -> memoryview | None:
        """The body of the answer (after its correlation id) to a request of `kind`, whose
        body is `body` or the concatenation of its parts (written as they are, not joined).
        With `answered` False, None once the request is written (its answer is dropped)."""
        parts = (body,) if isinstance(body, (bytes, bytearray, memoryview)) else body
        async with self._in_flight:
            if self._broken is not None:
                raise self._broken
            correlation_id = next(self._correlation_ids) & 0x7FFFFFFF
            self._last_active_s = time.monotonic()
            answer = asyncio.get_running_loop().create_future()
            self._pending[correlation_id] = answer
            await self._send(correlation_id, kind, parts)
            if not answered:
                if self._broken is not None:
                    raise self._broken
                answer.cancel()  # its answer is read and dropped
                return None
            return await answer

    async def _send(self, correlation_id: int, kind: int, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Writes the request frame; returns once the socket took it (or the connection broke)."""
        size = sum(map(len, parts))
        head = frames.request_frame_head(correlation_id, kind, size)
        if size < SMALL_FRAME_BYTES:
            self._writer.write(b"".join((head, *parts)))  # one buffer, one syscall
        else:  # the parts as they are (not copied), still in one syscall: a write each
            self._writer.writelines((head, *parts))  # would wake the endpoint for each
        try:
            await self._writer.drain()
        except OSError as e:  # ConnectionError, or ssl.SSLError over TLS
            self._break(f"the connection broke: {e}")

    def _close_socket(self) -> None:
        self._writer.close()

    def close(self) -> None:
        self._break("the connection was closed")

    def _break(self, reason: str) -> None:
        if self._broken is None:
            self._broken = NetworkError(f"data plane connection to {self.name or 'an endpoint'}: {reason}")
            self._close_socket()
            self._idle_watch.cancel()
        pending, self._pending = self._pending, {}
        for answer in pending.values():
            if not answer.done():
                answer.set_exception(self._broken)

    async def _close_when_idle(self, idle_timeout_s: float) -> None:
        while self._broken is None:
            idle_s = time.monotonic() - self._last_active_s
            if idle_s >= idle_timeout_s and not self._pending:
                self._break(f"closed after {idle_s:.0f} s idle")
                return
            # In use (a request in flight, a long poll say) or not idle long enough yet.
            await asyncio.sleep(idle_timeout_s - idle_s if idle_s < idle_timeout_s else idle_timeout_s)

    def _on_answer(self, body: bytes | memoryview) -> None:
        """An answer frame, handed over by the reader as it comes (FrameReader's push
        mode: no task is woken to read it). One that is not an answer to a request in
        flight, or does not parse, breaks the connection."""
        if self._broken is not None:
            return
        if len(body) < frames.ANSWER_HEADER.size:
            self._break(f"an answer frame of {len(body)} bytes")
            return
        correlation_id, outcome = frames.ANSWER_HEADER.unpack_from(body)
        rest = memoryview(body)[frames.ANSWER_HEADER.size:]
        if outcome not in (frames.ANSWERED, frames.FAILED):
            self._break(f"an answer to request {correlation_id} with outcome {outcome}")
            return
        try:  # parsed while the request is still pending: one that does not parse fails it with the rest
            error = frames.decode_failed_answer(rest) if outcome == frames.FAILED else None
        except frames.FrameError as e:
            self._break(f"an answer that does not parse: {e}")
            return
        self._last_active_s = time.monotonic()
        answer = self._pending.pop(correlation_id, None)
        if answer is None:
            self._break(f"an answer to request {correlation_id}, which was not sent or was answered already")
        elif answer.done():  # its caller stopped waiting
            pass
        elif error is not None:  # that request failed; the connection goes on
            answer.set_exception(error)
        else:
            answer.set_result(rest)

    def _on_end(self, why: str) -> None:
        if why == "the peer closed the connection":
            self._break("the endpoint closed the connection")
        elif why.startswith("a frame of "):
            self._break("an answer " + why[2:])  # "an answer frame of N bytes"
        else:
            self._break(why)


async def open_proven_socket(address: EndpointAddress, node_id: str) -> int:
    """A new connection to `address` through its handshake (`open_proven_streams`),
    detached from asyncio: its descriptor, non-blocking, for native code to read and write
    (the caller's to close). The endpoint writes nothing after its proof until a request,
    so nothing was read beyond it. Raises as `open_proven_streams`; ValueError for an
    endpoint behind TLS, which native code does not speak."""
    if address.node_id != node_id and address.tls_certificate:
        raise ValueError("the endpoint is on another node, behind TLS")
    _, writer = await open_proven_streams(address, node_id)
    try:
        fd = os.dup(writer.get_extra_info("socket").fileno())
    finally:
        writer.close()  # the transport's descriptor; the duplicate is the caller's
    os.set_blocking(fd, False)
    return fd


async def open_proven_streams(address: EndpointAddress, node_id: str) -> tuple[FrameReader, asyncio.StreamWriter]:
    """The streams of a new connection to `address` from a process on node `node_id`, the
    endpoint's secret proven both ways (handshake.py): its Unix socket on the same node, TCP
    otherwise (TLS pinned to its certificate, if it has one). Raises OSError (HandshakeError
    is one), TimeoutError past CONNECT_TIMEOUT_MS, or IncompleteReadError; nothing is left open."""
    writer = None
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_MS / 1000):
            if address.node_id == node_id:
                reader, writer = await streams.open_unix_frame_streams(address.unix_path)
            else:
                context = tls.client_context(address.tls_certificate) if address.tls_certificate else None
                reader, writer = await streams.open_tcp_frame_streams(
                    address.host, address.port, context, handshake_timeout_s=tls.HANDSHAKE_TIMEOUT_S)
                keep_alive(writer.get_extra_info("socket"))  # a vanished node is found out, not only by a timeout
            await handshake.connect(reader, writer, address.secret)
    except BaseException:
        if writer is not None:
            writer.close()
        raise
    return reader, writer
