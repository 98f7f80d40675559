"""SASL on a SocketServer run in this process (no Ray; credentials from a stand-in for
the Controller): before authenticating a client may send only ApiVersions and the SASL
requests; after it, the session lasts connections.max.reauth.ms (KIP-368), which
SaslAuthenticate v1+ tells the client; re-authenticating in time keeps the connection,
and the first request after the session ended closes it."""

from __future__ import annotations

import asyncio
import struct

import scramp
from kio.serial import entity_reader

from rayk.net import api_versions as keys
from rayk.net.codec import response_class
from rayk.scram import credential_from_password
from tests.protocol_helpers import request_frame, sized
from tests.test_socket_server_backpressure import run_with_gated_server

REAUTH_MS = 600
CREDENTIALS = {"alice": {"SCRAM-SHA-512": credential_from_password("SCRAM-SHA-512", "alice-pw", 4096)}}
DESCRIBE = (keys.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": None})  # answered without a Controller: not a super user


async def call(reader, writer, api_key: int, version: int, values: dict, correlation_id: int = 1):
    writer.write(sized(request_frame(api_key, version, values, correlation_id)))
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    frame = await reader.readexactly(size)
    cls = response_class(api_key, version)
    _, header_size = entity_reader(cls.__header_schema__)(frame, 0)
    return entity_reader(cls)(frame, header_size)[0]


async def login(reader, writer) -> int:
    """SCRAM-SHA-512 as alice; the session lifetime the broker gave, in ms."""
    client = scramp.ScramClient(["SCRAM-SHA-512"], "alice", "alice-pw")
    assert (await call(reader, writer, keys.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"})).error_code.value == 0
    first = await call(reader, writer, keys.SASL_AUTHENTICATE, 2, {"auth_bytes": client.get_client_first().encode()})
    client.set_server_first(first.auth_bytes.decode())
    final = await call(reader, writer, keys.SASL_AUTHENTICATE, 2, {"auth_bytes": client.get_client_final().encode()})
    assert final.error_code.value == 0, final.error_message
    client.set_server_final(final.auth_bytes.decode())
    return int(final.session_lifetime.total_seconds() * 1000)


async def closed(reader) -> bool:
    return await asyncio.wait_for(reader.read(1), 5) == b""


def run_sasl_server(body, answer=None) -> None:
    async def with_credentials(server, gate, connect):
        async def credentials(user: str) -> dict:
            return CREDENTIALS.get(user, {})

        server._scram_credentials = credentials
        await body(server, connect)

    run_with_gated_server(500, with_credentials, answer, listeners="SASL_PLAINTEXT://127.0.0.1:0",
                          sasl_enabled_mechanisms="SCRAM-SHA-512", connections_max_reauth_ms=REAUTH_MS)


def test_nothing_but_sasl_before_authentication():
    async def body(server, connect):
        reader, writer = await connect()
        versions = await call(reader, writer, keys.API_VERSIONS, 3,
                              {"client_software_name": "t", "client_software_version": "1"})
        assert versions.error_code.value == 0
        writer.write(sized(request_frame(*DESCRIBE)))
        assert await closed(reader)
        writer.close()

        reader, writer = await connect()
        assert await login(reader, writer) == REAUTH_MS
        described = await call(reader, writer, *DESCRIBE)
        assert described.error_code.value == 31  # CLUSTER_AUTHORIZATION_FAILED: alice is no super user
        (context,) = await server.describe_connections()
        assert (context.listener_name, context.principal) == ("SASL_PLAINTEXT", "User:alice")
        writer.close()

    run_sasl_server(body)


def test_a_session_is_kept_by_reauthenticating_and_ends_without():
    async def body(server, connect):
        reader, writer = await connect()
        await login(reader, writer)
        for _ in range(3):  # re-authenticate within each session: the connection lives on
            await asyncio.sleep(REAUTH_MS / 2000)
            assert await login(reader, writer) == REAUTH_MS
            assert (await call(reader, writer, *DESCRIBE)).error_code.value == 31
        await asyncio.sleep(REAUTH_MS / 1000 + 0.2)
        writer.write(sized(request_frame(*DESCRIBE)))
        assert await closed(reader), "the first request after the session ended closes the connection"
        writer.close()

    run_sasl_server(body)


def test_before_authentication_a_large_frame_closes_the_connection_and_reserves_nothing():
    async def body(server, connect):
        reader, writer = await connect()
        writer.write((600 * 1024).to_bytes(4, "big") + b"\0" * 1000)  # over sasl.server.max.receive.size
        assert await closed(reader)
        assert await server.queued_request_bytes() == 0
        writer.close()
        reader, writer = await connect()
        await login(reader, writer)  # after authentication, socket.request.max.bytes applies
        writer.write((600 * 1024).to_bytes(4, "big") + b"\0" * 1000)
        for _ in range(100):
            if await server.queued_request_bytes() == 600 * 1024:
                break
            await asyncio.sleep(0.01)
        assert await server.queued_request_bytes() == 600 * 1024
        writer.close()

    run_sasl_server(body)


def test_nothing_pipelined_after_a_failed_reauthentication_is_served():
    """A failed re-authentication leaves the old principal on the connection until it
    closes: a request pipelined behind it must not be served under that principal."""
    served: list[int] = []

    async def answer(request, handle):
        served.append(request.head.api_key)
        return await handle(request)

    async def body(server, connect):
        reader, writer = await connect()
        await login(reader, writer)
        mallory = scramp.ScramClient(["SCRAM-SHA-512"], "mallory", "guess").get_client_first().encode()
        writer.write(sized(request_frame(keys.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"}, 1))
                     + sized(request_frame(keys.SASL_AUTHENTICATE, 2, {"auth_bytes": mallory}, 2))
                     + sized(request_frame(*DESCRIBE, 3)))
        answered = []
        while (head := await reader.read(4)) and len(head) == 4:
            frame = await reader.readexactly(struct.unpack(">i", head)[0])
            answered.append(struct.unpack_from(">i", frame)[0])
        assert answered == [1, 2], "the handshake and the failed authentication; then the connection closes"
        assert keys.DESCRIBE_USER_SCRAM_CREDENTIALS not in served
        writer.close()

    run_sasl_server(body, answer)
