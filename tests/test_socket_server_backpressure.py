"""The listener's back-pressure, on a SocketServer run in this process (no Ray): a client
that pipelines more requests than the bounds allow gets them all answered, in order, but
the broker reads at most QUEUED_PER_CONNECTION (+2: one being answered, one waiting for
queue room) ahead on that connection and at most `queued.max.requests` over all of them,
while other connections keep being served."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

from rayk.config import BrokerConfig
from rayk.net import api_versions as keys
from rayk.net.socket_server import QUEUED_PER_CONNECTION, SocketServer
from tests.protocol_helpers import request_frame, sized

GATED_FROM = 1000  # requests with a correlation id from here on wait for the gate


def api_versions(correlation_id: int) -> bytes:
    return sized(request_frame(keys.API_VERSIONS, 3, {"client_software_name": "bp", "client_software_version": "1"},
                               correlation_id))


async def answers(reader: asyncio.StreamReader, count: int) -> list[int]:
    """The correlation ids of the next `count` responses."""
    ids = []
    for _ in range(count):
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        ids.append(struct.unpack_from(">i", await reader.readexactly(size))[0])
    return ids


async def settled(server: SocketServer, expected: int) -> int:
    """Waits until the server has `expected` requests queued, then a while longer, to see
    that it reads no more; returns the count."""
    for _ in range(200):
        if await server.queued_requests() >= expected:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    return await server.queued_requests()


def run_with_gated_server(queued_max_requests: int, body: Callable[..., Awaitable[None]]) -> None:
    async def main() -> None:
        config = BrokerConfig(listeners="PLAINTEXT://127.0.0.1:0", queued_max_requests=queued_max_requests)
        server = SocketServer(0, controller=None, config=config)
        gate = asyncio.Event()
        handle = server.apis.handle

        async def gated_handle(request):
            if request.head.correlation_id >= GATED_FROM:
                await gate.wait()
            return await handle(request)

        server.apis.handle = gated_handle
        host, port = await server.start()
        try:
            await asyncio.wait_for(body(server, gate, lambda: asyncio.open_connection(host, port)), 60)
        finally:
            await server.stop()

    asyncio.run(main())


def test_one_connection_is_read_only_a_bounded_way_ahead_and_answered_in_order():
    sent = 5 * QUEUED_PER_CONNECTION

    async def body(server, gate, connect):
        slow_reader, slow = await connect()
        slow.write(b"".join(api_versions(GATED_FROM + i) for i in range(sent)))
        await slow.drain()
        assert await settled(server, QUEUED_PER_CONNECTION + 2) == QUEUED_PER_CONNECTION + 2

        # Another connection is served meanwhile.
        fast_reader, fast = await connect()
        fast.write(api_versions(1) + api_versions(2))
        assert await answers(fast_reader, 2) == [1, 2]

        gate.set()
        assert await answers(slow_reader, sent) == [GATED_FROM + i for i in range(sent)]
        assert await server.queued_requests() == 0
        for writer in (slow, fast):
            writer.close()

    run_with_gated_server(500, body)


def test_all_connections_together_are_read_at_most_queued_max_requests_ahead():
    bound, per_connection = 5, 10

    async def body(server, gate, connect):
        connections = [await connect() for _ in range(3)]
        for n, (_, writer) in enumerate(connections):
            writer.write(b"".join(api_versions(GATED_FROM + 100 * n + i) for i in range(per_connection)))
        assert await settled(server, bound) == bound

        gate.set()
        for n, (reader, writer) in enumerate(connections):
            assert await answers(reader, per_connection) == [GATED_FROM + 100 * n + i for i in range(per_connection)]
            writer.close()
        assert await server.queued_requests() == 0

    run_with_gated_server(bound, body)


def test_a_client_that_leaves_with_requests_queued_gives_their_slots_back():
    async def body(server, gate, connect):
        _, writer = await connect()
        writer.write(b"".join(api_versions(GATED_FROM + i) for i in range(10)))
        assert await settled(server, 3) == 3
        writer.close()
        gate.set()  # the request being answered when the client left finishes now
        for _ in range(200):
            if await server.connections() == 0:
                break
            await asyncio.sleep(0.01)
        assert await server.connections() == 0 and await server.queued_requests() == 0

        reader, writer = await connect()  # and the broker serves new clients in full
        writer.write(b"".join(api_versions(GATED_FROM + i) for i in range(5)))
        assert await answers(reader, 5) == [GATED_FROM + i for i in range(5)]
        writer.close()

    run_with_gated_server(3, body)
