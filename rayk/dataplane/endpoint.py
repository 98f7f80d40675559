"""Endpoint: where a rayk process (a partition replica) serves data plane requests.

It listens on a Unix domain socket for peers on its node (an abstract one on Linux, so
nothing is left on disk when the process dies) and, from the first time a peer on
another node asks for it, on TCP at its node's address (or the host the brokers'
listeners bind to). Its secret is made when it opens; the owner hands `EndpointAddress`
(addresses and secret) to its peers through Ray.

Per connection, after the handshake (handshake.py; a stranger is closed before any
frame is read): a reader reads request frames and starts a handler task for each, and a
writer writes their answers in request order. At most `max_in_flight` requests of a
connection are started and unanswered; past that the reader stops reading and the
socket's buffers push back on the peer. The writer waits for the peer to take each answer
(`drain`), so a slow follower or consumer never makes the endpoint buffer without bound.
A frame that does not parse, or declares more than MAX_FRAME_BYTES, closes the
connection, as does a handler that raises (the peer sees a failed request, and retries as
after any lost connection). Idle, an endpoint costs nothing: no thread, no timer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from rayk.dataplane import frames, handshake

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT_PER_CONNECTION = 16
STREAM_LIMIT_BYTES = 1 << 16
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
SMALL_ANSWER_BYTES = 16 * 1024  # records this small are joined to their answer's head: one write

# (kind, the request's body after its header) -> (answer head, answer tail)
Handler = Callable[[int, memoryview], Awaitable[tuple[bytes, bytes]]]


@dataclass(frozen=True, slots=True)
class EndpointAddress:
    """How to reach an endpoint: its Unix socket from `node_id`, TCP from anywhere else."""

    node_id: str
    unix_path: str  # "\0..." for an abstract socket
    host: str
    port: int  # 0 until a peer on another node asked for TCP
    secret: bytes = field(repr=False)


def _unix_path() -> str:
    name = f"rayk-dataplane-{os.getpid()}-{secrets.token_hex(8)}"
    if sys.platform == "linux":
        return "\0" + name  # abstract: gone with the process
    return os.path.join(tempfile.gettempdir(), name + ".sock")


def reachable_host(bind_host: str, node_ip: str) -> str:
    """Where peers reach an endpoint bound to `bind_host`: the node's IP for a wildcard."""
    return node_ip if bind_host in WILDCARD_HOSTS and node_ip else bind_host


class Endpoint:
    def __init__(self, handler: Handler, name: str, max_in_flight: int = MAX_IN_FLIGHT_PER_CONNECTION) -> None:
        """`name` is for the logs (the partition, say)."""
        self._handler, self.name, self._max_in_flight = handler, name, max_in_flight
        self._secret = handshake.new_secret()
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[asyncio.StreamWriter] = set()
        self._address: EndpointAddress | None = None
        self._opening = asyncio.Lock()

    async def open(self, node_id: str, host: str, tcp: bool = True, node_ip: str = "") -> EndpointAddress:
        """Listens on a Unix socket and, with `tcp` (a peer on another node asked), on TCP at
        `host`; a wildcard host ("", 0.0.0.0, ::) is given out as `node_ip`. Later calls give
        the same address, with TCP added once asked for."""
        async with self._opening:
            try:
                if self._address is None:
                    unix_path = _unix_path()
                    self._servers.append(await asyncio.start_unix_server(self._serve, unix_path, limit=STREAM_LIMIT_BYTES))
                    self._address = EndpointAddress(node_id, unix_path, reachable_host(host, node_ip), 0, self._secret)
                if tcp and self._address.port == 0:
                    server = await asyncio.start_server(self._serve, host or None, 0, limit=STREAM_LIMIT_BYTES)
                    self._servers.append(server)
                    self._address = replace(self._address, port=server.sockets[0].getsockname()[1])
            except BaseException:
                await self.close()
                raise
            return self._address

    async def close(self) -> None:
        """Stops listening and closes every connection."""
        for server in self._servers:
            server.close()
        for writer in list(self._connections):
            writer.close()
        for server in self._servers:
            await server.wait_closed()
        if self._address is not None and not self._address.unix_path.startswith("\0"):
            try:
                os.unlink(self._address.unix_path)
            except FileNotFoundError:
                pass
        self._servers.clear()
        self._address = None

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or "a local process"
        self._connections.add(writer)
        try:
            try:
                await handshake.accept(reader, writer, self._secret)
            except (handshake.HandshakeError, TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
                logger.warning("%s: refused a data plane connection from %s: %s", self.name, peer, e or type(e).__name__)
                return
            await self._serve_requests(reader, writer, peer)
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _serve_requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object) -> None:
        answers: asyncio.Queue[tuple[int, asyncio.Task]] = asyncio.Queue()  # bounded by in_flight
        in_flight = asyncio.Semaphore(self._max_in_flight)
        writing = asyncio.create_task(self._write_answers(answers, in_flight, writer, peer))
        writing.add_done_callback(lambda _: writer.close())  # ends the reader's wait too
        started: set[asyncio.Task] = set()
        try:
            while True:
                await in_flight.acquire()  # released when the answer is written
                size = frames.SIZE.unpack(await reader.readexactly(frames.SIZE.size))[0]
                if size > frames.MAX_FRAME_BYTES:
                    raise frames.FrameError(f"a frame of {size} bytes is over the limit of {frames.MAX_FRAME_BYTES}")
                correlation_id, kind, body = frames.parse_request(await reader.readexactly(size))
                task = asyncio.create_task(self._handler(kind, body))
                started.add(task)
                task.add_done_callback(started.discard)
                answers.put_nowait((correlation_id, task))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the peer went away (or the writer closed the connection)
        except frames.FrameError as e:
            logger.warning("%s: closing the data plane connection from %s: %s", self.name, peer, e)
        finally:
            writing.cancel()
            for task in started:
                task.cancel()

    async def _write_answers(
        self, answers: asyncio.Queue, in_flight: asyncio.Semaphore, writer: asyncio.StreamWriter, peer: object
    ) -> None:
        while True:
            correlation_id, task = await answers.get()
            try:
                head, tail = await task
            except frames.FrameError as e:
                logger.warning("%s: closing the data plane connection from %s: %s", self.name, peer, e)
                return
            except Exception:
                logger.exception("%s: a data plane request from %s failed; closing its connection", self.name, peer)
                return
            if len(tail) < SMALL_ANSWER_BYTES:
                writer.write(frames.answer_frame_head(correlation_id, head, len(tail)) + tail)  # one syscall
            else:
                writer.write(frames.answer_frame_head(correlation_id, head, len(tail)))
                writer.write(tail)  # its own write: the records are not copied into one buffer
            try:
                await writer.drain()
            except ConnectionError:
                return
            in_flight.release()
