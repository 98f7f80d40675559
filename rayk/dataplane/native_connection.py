"""NativeConnection: a Connection whose bytes rayk._native reads and writes.

`rayk._native.ClientConnections` (native/src/client_conns.rs) does for a connection what
FrameReader's push mode and the StreamWriter do for a Connection in Python: it writes each
request frame whole (one writev where the socket takes it, the rest queued in order) and
reads the answer frames as they come. It has no thread: `NativeClient`, one per event
loop, drives it from the sockets' readiness callbacks and hands each answer frame to its
connection's `_on_answer`, and each end to `_on_end`, as the FrameReader does. Everything
else is the Connection's: requests by correlation id, their futures and bound, what an
answer means, breaking, the idle close.

Connection.open makes one, where rayk._native is built and its "client" path is on
(rayk/native_paths.py), for
every connection that is not TLS, once the handshake is done: the socket is taken from its
asyncio transport with what the transport had read beyond the handshake (the transport
stays open, paused, until the connection breaks). A native call that raises (a panic: a
bug) breaks every native connection of the loop, logged; later connections are Python's,
and their owners (ReplicaLinks) reconnect as after any broken connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from rayk import native_paths
from rayk.dataplane import frames
from rayk.dataplane.connection import Connection
from rayk.dataplane.frame_reader import FrameReader
from rayk.native_paths import _native

logger = logging.getLogger(__name__)

_clients: dict[asyncio.AbstractEventLoop, NativeClient] = {}


def available() -> bool:
    if not native_paths.enabled("client"):
        return False
    client = _clients.get(asyncio.get_running_loop())
    return client is None or client.alive


class NativeClient:
    """One event loop's native connections: owns the native object and the connections by
    descriptor. Not thread-safe: its loop's."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        assert _native is not None, "rayk._native is not built"
        self._loop = loop
        self._conns = _native.ClientConnections(frames.MAX_FRAME_BYTES)
        self._connections: dict[int, NativeConnection] = {}
        self.alive = True

    @classmethod
    def of_running_loop(cls) -> NativeClient:
        loop = asyncio.get_running_loop()
        client = _clients.get(loop)
        if client is None:
            client = _clients[loop] = cls(loop)
            if len(_clients) > 1:  # loops of tests that ended: their clients go
                for other in [other for other in _clients if other.is_closed()]:
                    del _clients[other]
        return client

    def adopt(self, connection: NativeConnection, staged: bytes) -> None:
        fd = connection.fd
        self._connections[fd] = connection
        self._loop.add_reader(fd, self._call, self._conns.on_readable, fd)
        self.call(self._conns.adopt, fd, staged)

    def send(self, connection: NativeConnection, correlation_id: int, kind: int,
             parts: Sequence[bytes | bytearray | memoryview]) -> bool:  # fmt: skip
        """Writes the frame; True if part of what was sent waits for the socket."""
        self.call(self._conns.send, connection.fd, correlation_id, kind, list(parts))
        return self.alive and connection.fd in self._connections and self._conns.queued(connection.fd)

    def release(self, connection: NativeConnection) -> None:
        """The connection broke or closed: its descriptor is let go and closed."""
        fd = connection.fd
        if self._connections.get(fd) is connection:
            del self._connections[fd]
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
            if self.alive:
                self._conns.forget(fd)
            os.close(fd)

    def call(self, method: Callable[..., list[tuple]], *args: Any) -> None:
        self._call(method, *args)

    def _call(self, method: Callable[..., list[tuple]], *args: Any) -> None:
        """Calls into the native side and does what it returns. One that raises (a panic:
        a bug) breaks every native connection of the loop; later ones are Python's."""
        if not self.alive:
            return
        try:
            events = method(*args)
        except BaseException as e:
            if not native_paths.failure(e):
                raise
            logger.exception("the native data plane connections of this process failed; opening new ones in Python")
            self.alive = False
            for connection in list(self._connections.values()):
                connection._break("the native data plane connections failed")
            return
        for event in events:
            connection = self._connections.get(event[1])
            if connection is None:
                continue
            tag = event[0]
            if tag == _native.ANSWER:
                connection._on_answer(event[2])
            elif tag == _native.END:
                connection._on_end(event[2])
            elif tag == _native.WANT_WRITE:
                if event[2]:
                    self._loop.add_writer(connection.fd, self._on_writable, connection)
                else:
                    self._loop.remove_writer(connection.fd)
                    connection._drained()

    def _on_writable(self, connection: NativeConnection) -> None:
        self._call(self._conns.on_writable, connection.fd)


class NativeConnection(Connection):
    """A Connection (see connection.py) whose socket rayk._native reads and writes."""

    def __init__(self, client: NativeClient, fd: int, writer: asyncio.StreamWriter, name: str, max_in_flight: int,
                 idle_timeout_s: float) -> None:  # fmt: skip
        self._client, self.fd = client, fd
        self._writer = writer  # its transport, paused for good: closed when the connection breaks
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._start(name, max_in_flight, idle_timeout_s)

    @classmethod
    def adopting(cls, reader: FrameReader, writer: asyncio.StreamWriter, name: str, max_in_flight: int,
                 idle_timeout_s: float) -> Connection:  # fmt: skip
        """Takes a proven connection over from its streams (one that broke already stays a
        Python Connection: its descriptor may not be its own any more)."""
        if writer.transport.is_closing() or reader.exception() is not None:
            return Connection(reader, writer, name, max_in_flight, idle_timeout_s)
        client = NativeClient.of_running_loop()
        staged = reader.detach()
        writer.transport.pause_reading()
        fd = os.dup(writer.get_extra_info("socket").fileno())
        os.set_blocking(fd, False)
        connection = cls(client, fd, writer, name, max_in_flight, idle_timeout_s)
        client.adopt(connection, staged)
        return connection

    async def _send(self, correlation_id: int, kind: int, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        if self._client.send(self, correlation_id, kind, parts) and self._broken is None:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter  # the socket took what waited (or the connection broke)

    def _drained(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _close_socket(self) -> None:
        self._client.release(self)
        self._writer.close()
        self._drained()
