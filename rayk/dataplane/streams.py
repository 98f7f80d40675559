"""Stream servers and Unix connections that behave the same on asyncio's own event loop and
on uvloop, which Ray runs its actors on whenever it is installed.

- **TLS after accept.** The Kafka listener and the data plane endpoint count a connection
  against their caps as it is accepted, before its TLS handshake (as Kafka does), and only
  then start TLS. `StreamWriter.start_tls` cannot do that on uvloop: uvloop starts reading a
  new connection before the accepting callback runs, the client's ClientHello lands in the
  stream's buffer, and start_tls drops that buffer (uvloop#707, cpython#142352), so the
  handshake never ends. `AcceptingServer` hands the callback the accepted socket itself,
  unread, with its peer's address; the callback refuses it or opens its streams, over TLS
  from the first byte, with `loop.connect_accepted_socket`, the API meant for this.
- **Abstract Unix sockets.** uvloop cannot connect to a "\\0..." path by name (EINVAL);
  `open_unix_connection` connects the socket itself and hands it over.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from rayk.dataplane import frame_reader

logger = logging.getLogger(__name__)

BACKLOG = 100  # asyncio.start_server's
# Out of descriptors or memory: accepting again at once would spin (asyncio's own servers wait too).
ACCEPT_RETRY_DELAY_S = 1.0
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


@dataclass(slots=True, eq=False)  # eq=False: hashed by identity, as a connection
class AcceptedSocket:
    """A connection as accepted: nothing read from it yet."""

    sock: socket.socket
    peer: tuple  # the peer's address, as socket.accept gives it

    def refuse(self) -> None:
        self.sock.close()

    async def open_streams(
        self, tls: ssl.SSLContext | None, *, handshake_timeout_s: float, limit_bytes: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The connection's streams, after its TLS handshake (server side) if `tls`. OSError
        or TimeoutError if the handshake fails or takes over `handshake_timeout_s`."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=limit_bytes, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport = await self._connect(protocol, tls, handshake_timeout_s)
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def open_frame_streams(
        self, tls: ssl.SSLContext | None, *, handshake_timeout_s: float
    ) -> tuple[frame_reader.FrameReader, asyncio.StreamWriter]:
        """As `open_streams`, read by a FrameReader (frame_reader.py)."""
        protocol = frame_reader.new_protocol()
        return frame_reader.streams_of(await self._connect(protocol, tls, handshake_timeout_s), protocol)

    async def _connect(self, protocol: asyncio.BaseProtocol, tls: ssl.SSLContext | None,
                       handshake_timeout_s: float) -> asyncio.Transport:  # fmt: skip
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: protocol, self.sock, ssl=tls, ssl_handshake_timeout=handshake_timeout_s if tls is not None else None)
        return transport


class AcceptingServer:
    """Listens on TCP and runs `client_connected(AcceptedSocket)` as a task per connection."""

    def __init__(self, listening: list[socket.socket], client_connected: Callable[[AcceptedSocket], Awaitable[None]]):
        self.sockets = listening
        self._client_connected = client_connected
        self._connections: set[asyncio.Task] = set()
        self._accepting = []
        for sock in listening:
            task = asyncio.create_task(self._accept_forever(sock))
            # Closed once its task is done: after a cancelled sock_accept took its reader off
            # the loop, and even if the task was cancelled before it ever ran.
            task.add_done_callback(lambda _, sock=sock: sock.close())
            self._accepting.append(task)

    def close(self) -> None:
        """Stops accepting; connections already accepted go on."""
        for task in self._accepting:
            task.cancel()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, return_exceptions=True)

    async def _accept_forever(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(listening)
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:
                    logger.error("stopped accepting connections on %s: %s", listening.getsockname(), e)
                    return
                logger.error("cannot accept a connection on %s: %s; trying again in %.0f s",
                             listening.getsockname(), e, ACCEPT_RETRY_DELAY_S)
                await asyncio.sleep(ACCEPT_RETRY_DELAY_S)
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = loop.create_task(self._client_connected(AcceptedSocket(sock, peer)))
            self._connections.add(task)  # a task's only reference, until it ends
            task.add_done_callback(self._connections.discard)


async def start_server(
    client_connected: Callable[[AcceptedSocket], Awaitable[None]], host: str | None, port: int
) -> AcceptingServer:
    """Listens at `host` and `port` (0: any free one), as `asyncio.start_server` does: on
    every address `host` resolves to, or on all interfaces if it is empty or None (one
    dual-stack socket where the OS has them)."""
    if not host and socket.has_dualstack_ipv6():
        listening = [socket.create_server(("", port), family=socket.AF_INET6, backlog=BACKLOG, dualstack_ipv6=True)]
    else:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        listening = []
        try:
            for family, address in dict.fromkeys((info[0], info[4]) for info in infos):
                listening.append(socket.create_server(address, family=family, backlog=BACKLOG))
        except BaseException:
            for sock in listening:
                sock.close()
            raise
    for sock in listening:
        sock.setblocking(False)
    return AcceptingServer(listening, client_connected)


async def open_unix_connection(
    path: str, *, limit_bytes: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """`asyncio.open_unix_connection`, abstract ("\\0...") paths included on uvloop."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, path)
        return await asyncio.open_unix_connection(sock=sock, limit=limit_bytes)
    except BaseException:
        sock.close()
        raise


async def open_unix_frame_streams(path: str) -> tuple[frame_reader.FrameReader, asyncio.StreamWriter]:
    """As `open_unix_connection`, read by a FrameReader (frame_reader.py)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, path)
        transport, protocol = await loop.create_unix_connection(frame_reader.new_protocol, sock=sock)
        return frame_reader.streams_of(transport, protocol)
    except BaseException:
        sock.close()
        raise


async def open_tcp_frame_streams(
    host: str, port: int, tls: ssl.SSLContext | None, *, handshake_timeout_s: float
) -> tuple[frame_reader.FrameReader, asyncio.StreamWriter]:
    """`asyncio.open_connection` (TLS with no host name check if `tls`: the data plane pins
    the endpoint's certificate instead), read by a FrameReader (frame_reader.py)."""
    transport, protocol = await asyncio.get_running_loop().create_connection(
        frame_reader.new_protocol, host, port, ssl=tls, server_hostname="" if tls else None,
        ssl_handshake_timeout=handshake_timeout_s if tls else None)
    return frame_reader.streams_of(transport, protocol)


async def start_unix_frame_server(
    client_connected: Callable[[frame_reader.FrameReader, asyncio.StreamWriter], Coroutine[Any, Any, None]], path: str
) -> asyncio.AbstractServer:
    """`asyncio.start_unix_server`, its connections read by FrameReaders (frame_reader.py):
    `client_connected(reader, writer)` runs as a task per connection."""
    loop = asyncio.get_running_loop()

    def connected(transport: asyncio.BaseTransport, protocol: frame_reader.FrameProtocol) -> None:
        reader, writer = frame_reader.streams_of(transport, protocol)
        protocol.task = loop.create_task(client_connected(reader, writer))  # the task's reference, as asyncio's

    return await loop.create_unix_server(lambda: frame_reader.FrameProtocol(frame_reader.FrameReader(), connected), path)
