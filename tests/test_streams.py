"""rayk/dataplane/streams.py on asyncio's own loop and on uvloop: TLS opened on an accepted socket
the peer wrote to at once, refusal unread, closing, abstract Unix sockets."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import ssl
import sys

import pytest
import trustme

from rayk.dataplane import streams

pytestmark = pytest.mark.usefixtures("each_event_loop")


@pytest.fixture(scope="module")
def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


def test_tls_opens_on_a_socket_whose_client_hello_came_before_the_callback_ran(contexts):
    server_context, client_context = contexts

    async def main() -> None:
        counted = []

        async def accepted(connection: streams.AcceptedSocket) -> None:
            counted.append(connection.peer)  # counted before any handshake
            await asyncio.sleep(0.2)  # the client's ClientHello is in the socket by now
            reader, writer = await connection.open_streams(server_context, handshake_timeout_s=5, limit_bytes=1024)
            writer.write(await reader.readexactly(5))
            await writer.drain()
            writer.close()

        server = await streams.start_server(accepted, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client_context, server_hostname="localhost"), 10)
        writer.write(b"hello")
        assert await asyncio.wait_for(reader.readexactly(5), 10) == b"hello"
        assert len(counted) == 1 and counted[0][0] == "127.0.0.1"
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_a_refused_connection_is_closed_unread_and_the_server_serves_on():
    async def main() -> None:
        served = []

        async def accepted(connection: streams.AcceptedSocket) -> None:
            if not served:
                served.append("refused")
                connection.refuse()
                return
            reader, writer = await connection.open_streams(None, handshake_timeout_s=5, limit_bytes=1024)
            served.append(await reader.readexactly(2))
            writer.close()

        server = await streams.start_server(accepted, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        refused_reader, refused = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(refused_reader.read(), 5) == b"", "closed by the server"
        refused.close()
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ok")
        await writer.drain()
        for _ in range(100):
            if len(served) == 2:
                break
            await asyncio.sleep(0.05)
        assert served == ["refused", b"ok"]
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_a_closed_server_has_closed_its_sockets_even_if_closed_before_it_ever_accepted():
    async def main() -> None:
        async def accepted(connection: streams.AcceptedSocket) -> None:
            connection.refuse()

        for host in ("127.0.0.1", ""):
            server = await streams.start_server(accepted, host, 0)
            port = server.sockets[0].getsockname()[1]
            server.close()  # before its accepting task first ran
            await server.wait_closed()
            assert all(sock.fileno() == -1 for sock in server.sockets)
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", port)

    asyncio.run(main())


@pytest.mark.skipif(sys.platform != "linux", reason="abstract Unix sockets are Linux's")
def test_an_abstract_unix_socket_is_connected_to():
    async def main() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readexactly(3))
            await writer.drain()
            writer.close()

        path = f"\0rayk-test-{os.getpid()}-{secrets.token_hex(4)}"
        server = await asyncio.start_unix_server(echo, path)
        reader, writer = await streams.open_unix_connection(path, limit_bytes=1024)
        writer.write(b"abc")
        assert await asyncio.wait_for(reader.readexactly(3), 5) == b"abc"
        writer.close()
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectionRefusedError):
            await streams.open_unix_connection(path, limit_bytes=1024)

    asyncio.run(main())


def test_a_tcp_socket_it_accepts_has_nagle_off():
    async def main() -> None:
        delays = []

        async def accepted(connection: streams.AcceptedSocket) -> None:
            delays.append(connection.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            connection.refuse()

        server = await streams.start_server(accepted, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        await asyncio.wait_for(reader.read(), 5)
        writer.close()
        server.close()
        await server.wait_closed()
        assert delays and delays[0] != 0

    asyncio.run(main())
