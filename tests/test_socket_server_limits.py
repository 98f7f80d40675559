"""The listener's limits on what clients may hold, on a SocketServer run in this process
(no Ray): max.connections and max.connections.per.ip (with overrides) close a connection
past them at once, counted before any TLS handshake; a broken TLS stream or a socket
timeout ends its connection and frees its place; connections.max.idle.ms closes a connection that sends nothing, but
not one whose request is being answered; queued.max.request.bytes is reserved at a
frame's size prefix, so a client that declares a large frame and sends little holds
the other connections' reads back only until it is cut, and no more; a throttled
connection starts nothing until its throttle time has passed, and one whose client
leaves meanwhile is closed then, not at the end of the throttle time."""

from __future__ import annotations

import asyncio
import os
import time
import socket
import ssl

import pytest

from rayk.config import BrokerConfig
from rayk.errors import InvalidConfigurationError
from rayk.net.kafka_channel import KafkaChannel as _Connection
from rayk.net.request_context import PLAINTEXT_CONTEXT
from rayk.net.socket_server import SocketServer
from tests.test_socket_server_backpressure import GATED_FROM, answers, api_versions, run_with_gated_server

# Ray runs the actors that hold endpoints and listeners on uvloop; these run them on both loops.
pytestmark = pytest.mark.usefixtures("each_event_loop")

MiB = 1 << 20


async def closed_by_broker(reader: asyncio.StreamReader, within_s: float = 5) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), within_s) == b""
    except ConnectionError:
        return True


async def reaches(read, expected: int, timeout_s: float = 5) -> None:
    """Waits until `await read()` (a SocketServer gauge) is `expected`."""
    for _ in range(int(timeout_s * 100)):
        if await read() == expected:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{read.__name__} is {await read()}, not {expected}")


def test_connections_past_the_per_ip_limit_are_closed_and_the_first_ones_served():
    async def body(server, gate, connect):
        opened = [await connect() for _ in range(12)]
        await reaches(server.connections, 5)
        refused = [await closed_by_broker(reader) for reader, _ in opened[5:]]
        assert refused == [True] * 7
        for n, (reader, writer) in enumerate(opened[:5]):
            writer.write(api_versions(n))
            assert await answers(reader, 1) == [n]
        opened[0][1].close()  # a slot frees: the next connection is served
        await reaches(server.connections, 4)
        reader, writer = await connect()
        writer.write(api_versions(99))
        assert await answers(reader, 1) == [99]
        for _, writer in opened + [(reader, writer)]:
            writer.close()

    run_with_gated_server(500, body, max_connections_per_ip=5)


def test_a_per_host_override_and_the_brokerwide_limit():
    async def body(server, gate, connect):
        opened = [await connect() for _ in range(5)]
        await reaches(server.connections, 3)  # the override for 127.0.0.1 (3), not 100
        for _, writer in opened:
            writer.close()

    run_with_gated_server(500, body, max_connections_per_ip=100, max_connections_per_ip_overrides="127.0.0.1:3")

    async def brokerwide(server, gate, connect):
        opened = [await connect() for _ in range(4)]
        await reaches(server.connections, 2)
        assert [await closed_by_broker(reader) for reader, _ in opened[2:]] == [True, True]
        for _, writer in opened:
            writer.close()

    run_with_gated_server(500, brokerwide, max_connections=2)


def test_an_idle_connection_is_closed_but_not_one_waiting_for_its_answer():
    async def body(server, gate, connect):
        idle_reader, idle = await connect()
        waiting_reader, waiting = await connect()
        waiting.write(api_versions(GATED_FROM))  # answered only when the gate opens, after 3 idle periods
        assert await closed_by_broker(idle_reader, 3)
        await asyncio.sleep(1)
        assert await server.connections() == 1
        gate.set()
        assert await answers(waiting_reader, 1) == [GATED_FROM]
        answered_s = time.monotonic()
        assert await closed_by_broker(waiting_reader, 3), "idle again after its answer"
        assert time.monotonic() - answered_s > 0.25, "idle counts from the answer written, not from the request read"
        waiting.close()
        idle.close()

    run_with_gated_server(500, body, connections_max_idle_ms=300)


def test_request_bytes_are_reserved_at_the_size_prefix_and_given_back_when_the_sender_is_cut():
    async def body(server, gate, connect):
        _, greedy = await connect()
        greedy.write((2 * MiB).to_bytes(4, "big") + b"\0" * 1000)  # declares 2 MiB, sends 1000 bytes
        await reaches(server.queued_request_bytes, 2 * MiB)
        reader, writer = await connect()
        writer.write(api_versions(1))
        with pytest.raises(TimeoutError):  # the pool is spent: the next frame is not read ...
            await asyncio.wait_for(answers(reader, 1), 0.3)
        assert await server.queued_requests() == 0
        # ... until the greedy client is cut for sending too slowly (connections.max.idle.ms)
        assert await asyncio.wait_for(answers(reader, 1), 5) == [1]
        assert await server.queued_request_bytes() == 0
        writer.close()
        greedy.close()

    run_with_gated_server(500, body, socket_request_max_bytes=2 * MiB, queued_max_request_bytes=2 * MiB,
                          connections_max_idle_ms=1000)


def test_the_request_pool_must_hold_the_largest_request():
    with pytest.raises(InvalidConfigurationError, match="queued.max.request.bytes"):
        BrokerConfig.from_properties({"socket.request.max.bytes": 2 * MiB, "queued.max.request.bytes": MiB})
    BrokerConfig.from_properties({"socket.request.max.bytes": 2 * MiB, "queued.max.request.bytes": -1})
    with pytest.raises(InvalidConfigurationError, match="host:count"):
        BrokerConfig.from_properties({"max.connections.per.ip.overrides": "127.0.0.1"})


# ---------------------------------------------------------------------------- found by review: connections that must not linger


def run_tls_server(tmp_path, body, **settings) -> None:
    """`body(server, host, port, client_context)` against a TLS listener run in this process."""
    from tests.tls_helpers import write_tls_files

    files = write_tls_files(tmp_path)
    client = ssl.create_default_context(cafile=files.truststore)
    client.maximum_version = ssl.TLSVersion.TLSv1_2  # so a forged record after the handshake is read as one

    async def main() -> None:
        config = BrokerConfig.from_properties({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.location": files.keystore,
                                               **settings})
        server = SocketServer(0, controller=None, config=config)
        (host, port), = (await server.start()).values()
        try:
            await asyncio.wait_for(body(server, host, port, client), 60)
        finally:
            await asyncio.wait_for(server.stop(), 10)

    asyncio.run(main())


def test_a_broken_tls_record_after_the_handshake_ends_the_connection_and_frees_its_place(tmp_path):
    def broken_client(host: str, port: int, context: ssl.SSLContext) -> socket.socket:
        tls = context.wrap_socket(socket.create_connection((host, port)), server_hostname="127.0.0.1")
        raw = socket.socket(fileno=tls.detach())
        raw.sendall(b"\x17\x03\x03\x00\x40" + os.urandom(64))  # application data no key decrypts
        return raw

    async def body(server, host, port, context):
        broken = await asyncio.to_thread(broken_client, host, port, context)
        await reaches(server.connections, 0)
        reader, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname="127.0.0.1")
        writer.write(api_versions(1))
        assert await answers(reader, 1) == [1], "max.connections (1) has room again"
        writer.close()
        broken.close()

    run_tls_server(tmp_path, body, **{"max.connections": 1})


def test_on_tls_without_sasl_frames_are_read_from_the_pool_once_the_handshake_is_done(tmp_path):
    """Authenticated by the handshake: no sasl.server.max.receive.size, no one-at-a-time."""
    async def body(server, host, port, context):
        reader, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname="127.0.0.1")
        writer.write(api_versions(1) + (MiB).to_bytes(4, "big") + b"\0" * 10)
        assert await answers(reader, 1) == [1]
        await reaches(server.queued_request_bytes, MiB)
        writer.close()

    run_tls_server(tmp_path, body)


def test_connections_in_their_tls_handshake_count_against_the_limits(tmp_path):
    async def body(server, host, port, context):
        silent = [await asyncio.open_connection(host, port) for _ in range(3)]  # TCP only: no ClientHello yet
        await reaches(server.connections, 2)
        assert await closed_by_broker(silent[2][0]), "past max.connections.per.ip, before any handshake"
        for _, writer in silent:
            writer.close()

    run_tls_server(tmp_path, body, **{"max.connections.per.ip": 2})


def test_a_socket_timeout_ends_the_reading_and_is_not_taken_for_idleness():
    """ETIMEDOUT leaves TimeoutError on the reader: the connection is gone and the reader
    ends at once (an idle check that took it for its own timeout once retried it forever
    without yielding)."""
    class CountingReader(asyncio.StreamReader):
        reads = 0

        async def readexactly(self, n: int) -> bytes:
            self.reads += 1
            assert self.reads < 100, "the reader retried the socket's timeout"  # a loop that never yields
            return await super().readexactly(n)

    async def main() -> None:
        server = SocketServer(0, controller=None, config=BrokerConfig(listeners="PLAINTEXT://127.0.0.1:0"))
        reader = CountingReader()
        reader.set_exception(TimeoutError(110, "Connection timed out"))
        connection = _Connection(PLAINTEXT_CONTEXT, None)
        connection.slots_held = 1  # a request of the connection is being answered
        frames: asyncio.Queue = asyncio.Queue()
        await asyncio.wait_for(server._read_frames(reader, frames, ("127.0.0.1", 1), connection), 5)
        assert await frames.get() is None and connection.reader_done.is_set()
        assert connection.idle_close_reason is None
        assert reader.reads == 1

    asyncio.run(main())


def test_a_throttled_connection_waits_and_one_whose_client_leaves_is_closed_at_once():
    async def body(server, gate, connect):
        server.apis._throttle_ms = lambda *_: 3_000  # every answer throttles its client for 3 s
        reader, writer = await connect()
        writer.write(api_versions(1))
        assert await answers(reader, 1) == [1], "the throttled answer itself goes at once (ApiVersions v3)"
        writer.write(api_versions(2))
        sent_s = time.monotonic()
        assert await answers(reader, 1) == [2]
        assert time.monotonic() - sent_s > 2.5, "the next request waited out the throttle time"

        leaving_reader, leaving = await connect()
        leaving.write(api_versions(3))
        assert await answers(leaving_reader, 1) == [3]
        leaving.write(b"".join(api_versions(4 + i) for i in range(5)))  # queued behind the throttle
        await leaving.drain()
        leaving.close()
        left_s = time.monotonic()
        await reaches(server.connections, 1, timeout_s=2)
        assert time.monotonic() - left_s < 2, "closed when its client left, not after the throttle"
        await reaches(server.queued_requests, 0, timeout_s=2)
        writer.close()

    run_with_gated_server(500, body)
