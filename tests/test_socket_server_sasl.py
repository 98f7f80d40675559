"""SASL on a SocketServer run in this process (no Ray; credentials from a stand-in for
the Controller): before authenticating a client may send only ApiVersions and the SASL
requests; after it, the session lasts connections.max.reauth.ms (KIP-368), which
SaslAuthenticate v1+ tells the client; re-authenticating in time keeps the connection,
and the first request after the session ended closes it.

Before authenticating, a connection's frames are read outside queued.max.request.bytes,
one at a time and at most sasl.server.max.receive.size each, and it must authenticate
within sasl.server.authentication.timeout.ms; unauthenticated clients cannot hold back an
authenticated one's requests."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest
import scramp
from kio.serial import entity_reader

from rayk.config import BrokerConfig
from rayk.errors import InvalidConfigurationError
from rayk.net import api_versions as keys
from rayk.net.codec import response_class
from rayk.scram import credential_from_password
from tests.protocol_helpers import request_frame, sized
from tests.test_socket_server_backpressure import answers, api_versions, run_with_gated_server
from tests.test_socket_server_limits import reaches

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


def run_sasl_server(body, answer=None, **settings) -> None:
    """`body(server, connect)` against a SASL_PLAINTEXT listener; `settings` are more
    BrokerConfig fields."""
    async def with_credentials(server, gate, connect):
        async def credentials(user: str) -> dict:
            return CREDENTIALS.get(user, {})

        server._sasl.scram_credentials = credentials
        await body(server, connect)

    run_with_gated_server(500, with_credentials, answer, **{
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl_enabled_mechanisms": "SCRAM-SHA-512",
        "connections_max_reauth_ms": REAUTH_MS, **settings})


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


PREAUTH_MAX_BYTES = 65_536  # sasl.server.max.receive.size's default


def test_unauthenticated_connections_announcing_frames_take_nothing_from_the_request_pool():
    """Twice the pool announced by connections that never send their frames: before the
    fix each reserved its frame and an authenticated client's requests waited for them."""
    pool_bytes = 1 << 20
    hoarders = 2 * pool_bytes // PREAUTH_MAX_BYTES

    async def body(server, connect):
        opened = []
        for n in range(hoarders):
            reader, writer = await connect()
            writer.write(api_versions(n))
            assert await answers(reader, 1) == [n]  # the listener is reading this connection
            writer.write(PREAUTH_MAX_BYTES.to_bytes(4, "big") + b"\0" * 10)  # and the rest never comes
            opened.append((reader, writer))
        await asyncio.sleep(0.3)  # every size prefix read
        assert server._memory.available_bytes == pool_bytes
        assert await server.queued_request_bytes() == 0

        reader, writer = await connect()
        await asyncio.wait_for(login(reader, writer), 5)
        described = await asyncio.wait_for(call(reader, writer, *DESCRIBE), 5)
        assert described.error_code.value == 31
        assert await server.queued_request_bytes() == 0, "its request's bytes were given back"
        for _, w in opened + [(reader, writer)]:
            w.close()

    run_sasl_server(body, socket_request_max_bytes=pool_bytes, queued_max_request_bytes=pool_bytes)


def test_before_authentication_a_frame_over_sasl_server_max_receive_size_closes_the_connection():
    async def body(server, connect):
        reader, writer = await connect()
        writer.write((PREAUTH_MAX_BYTES + 1).to_bytes(4, "big") + b"\0" * 10)
        assert await closed(reader)
        writer.close()

        reader, writer = await connect()
        writer.write(PREAUTH_MAX_BYTES.to_bytes(4, "big") + b"\0" * 10)  # at the limit: read
        await asyncio.sleep(0.5)
        assert not reader.at_eof()
        assert await server.connections() == 1
        writer.close()

    run_sasl_server(body)


def test_sasl_server_max_receive_size_is_set_per_listener():
    override = ("listener.name.sasl_plaintext.sasl.server.max.receive.size", "1024")

    async def body(server, connect):
        reader, writer = await connect()
        writer.write(api_versions(1))
        assert await answers(reader, 1) == [1]
        writer.write((1025).to_bytes(4, "big"))
        assert await closed(reader)
        writer.close()

    run_sasl_server(body, listener_overrides=(override,))


def test_before_authentication_frames_are_read_one_at_a_time():
    release = asyncio.Event()

    async def answer(request, handle):
        await release.wait()
        return await handle(request)

    async def body(server, connect):
        release.clear()
        reader, writer = await connect()
        writer.write(b"".join(api_versions(n) for n in range(4)))
        await reaches(server.queued_requests, 1)
        await asyncio.sleep(0.3)
        assert await server.queued_requests() == 1, "the next frame is read once this one is answered"
        release.set()
        assert await answers(reader, 4) == [0, 1, 2, 3]
        writer.close()

    run_sasl_server(body, answer)


def test_a_connection_that_does_not_authenticate_in_time_is_closed():
    """sasl.server.authentication.timeout.ms: ApiVersions requests keep the connection
    from being idle, not from the deadline; one that authenticated in time stays."""
    timeout_ms = 500

    async def body(server, connect):
        authenticated_reader, authenticated = await connect()
        await login(authenticated_reader, authenticated)
        reader, writer = await connect()
        started_s = time.monotonic()
        n = 0
        while not reader.at_eof() and time.monotonic() - started_s < 5:
            writer.write(api_versions(n))
            try:
                await asyncio.wait_for(answers(reader, 1), 1)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            n += 1
            await asyncio.sleep(0.05)
        closed_after_s = time.monotonic() - started_s
        assert timeout_ms / 1000 * 0.8 <= closed_after_s < timeout_ms / 1000 + 3, closed_after_s
        assert n >= 1, "it was served until then"
        assert (await call(authenticated_reader, authenticated, *DESCRIBE)).error_code.value == 31
        for w in (writer, authenticated):
            w.close()

    run_sasl_server(body, connections_max_reauth_ms=0, sasl_server_authentication_timeout_ms=timeout_ms)


def test_an_authenticated_client_sends_frames_over_the_sasl_limit_from_the_pool():
    release = asyncio.Event()
    users = {"users": [{"name": f"user-{n:06d}" + "x" * 100} for n in range(2_000)]}  # some 230 KiB
    large = request_frame(keys.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, users, 9)
    assert len(large) > 2 * PREAUTH_MAX_BYTES

    async def answer(request, handle):
        if request.head.correlation_id == 9:
            await release.wait()
        return await handle(request)

    async def body(server, connect):
        release.clear()
        reader, writer = await connect()
        await login(reader, writer)
        writer.write(sized(large))
        await reaches(server.queued_request_bytes, len(large))
        release.set()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        assert struct.unpack_from(">i", await reader.readexactly(size))[0] == 9
        await reaches(server.queued_request_bytes, 0)
        writer.close()

    run_sasl_server(body, answer)


def test_without_sasl_every_frame_is_read_from_the_pool_from_the_start():
    async def body(server, gate, connect):
        reader, writer = await connect()
        writer.write((4 * PREAUTH_MAX_BYTES).to_bytes(4, "big") + b"\0" * 10)
        await reaches(server.queued_request_bytes, 4 * PREAUTH_MAX_BYTES)
        writer.close()

    run_with_gated_server(500, body)


def test_the_sasl_listener_settings_are_checked():
    config = BrokerConfig.from_properties({
        "listeners": "SASL_PLAINTEXT://:0,OTHER://:0",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,OTHER:SASL_PLAINTEXT",
        "listener.name.other.sasl.server.max.receive.size": "2048",
        "listener.name.other.sasl.server.authentication.timeout.ms": "1500",
    })
    assert config.sasl_server_max_receive_bytes("SASL_PLAINTEXT") == PREAUTH_MAX_BYTES
    assert config.sasl_server_authentication_timeout_s("SASL_PLAINTEXT") == 30
    assert config.sasl_server_max_receive_bytes("OTHER") == 2048
    assert config.sasl_server_authentication_timeout_s("OTHER") == 1.5
    for bad in ("0", "ten"):
        with pytest.raises(InvalidConfigurationError, match="sasl.server.authentication.timeout.ms"):
            BrokerConfig.from_properties({"listeners": "SASL_PLAINTEXT://:0",
                                          "listener.name.sasl_plaintext.sasl.server.authentication.timeout.ms": bad})
