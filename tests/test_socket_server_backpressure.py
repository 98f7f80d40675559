"""The listener's back-pressure, on a SocketServer run in this process (no Ray): a client
that pipelines more requests than the bounds allow gets them all answered, in order, but
the broker reads at most QUEUED_PER_CONNECTION (+3: one being answered, one decoded and
waiting for it, one read and waiting for queue room) ahead on that connection and at most
`queued.max.requests` over all of them, while other connections keep being served.

Produce requests are pipelined: one starts while those before it are unanswered, but
they are answered in request order, and any other request waits until all before it are
answered, except a Metadata request behind fewer than METADATA_TOGETHER Metadata
requests and nothing else."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

from rayk.config import BrokerConfig
from rayk.net import api_versions as keys
from rayk.net.codec import response_class
from rayk.net.entities import build
from rayk.net.socket_server import METADATA_TOGETHER, QUEUED_PER_CONNECTION, SocketServer
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


def produce(correlation_id: int, partitions: tuple[int, ...] = (0,)) -> bytes:
    return sized(request_frame(keys.PRODUCE, 9, {"acks": -1, "timeout": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": p, "records": b"\0" * 61} for p in partitions]}]}, correlation_id))


def run_with_gated_server(queued_max_requests: int, body: Callable[..., Awaitable[None]],
                          answer: Callable[..., Awaitable[object]] | None = None, **settings: object) -> None:
    """Runs `body(server, gate, connect)` against a listener whose requests with a
    correlation id >= GATED_FROM wait for `gate`; `answer(request, handle)`, if given,
    answers instead of KafkaApis' `handle`; `settings` are more BrokerConfig fields."""
    async def main() -> None:
        config = BrokerConfig(**{"listeners": "PLAINTEXT://127.0.0.1:0", "queued_max_requests": queued_max_requests,
                                 **settings})
        server = SocketServer(0, controller=None, config=config)
        gate = asyncio.Event()
        handle = server.apis.handle

        async def gated_handle(request, throttle=None):
            if request.head.correlation_id >= GATED_FROM:
                await gate.wait()
            return await (answer(request, handle) if answer else handle(request, throttle))

        server.apis.handle = gated_handle
        (host, port), = (await server.start()).values()
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
        assert await settled(server, QUEUED_PER_CONNECTION + 3) == QUEUED_PER_CONNECTION + 3

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


def test_produce_requests_are_pipelined_answered_in_order_and_other_requests_wait_for_them(monkeypatch):
    """(Python's path: the produce requests are held in its handler; a natively read
    connection's are tested in test_native_client.py.)"""
    monkeypatch.setenv("RAYK_NATIVE", "-kafka_conns")
    started: list[int] = []
    release: dict[int, asyncio.Event] = {}

    async def answer(request, handle):
        cid = request.head.correlation_id
        started.append(cid)
        if request.head.api_key == keys.PRODUCE:
            await release.setdefault(cid, asyncio.Event()).wait()
            return build(response_class(keys.PRODUCE, 9), {"responses": []})
        return await handle(request)

    async def body(server, gate, connect):
        reader, writer = await connect()
        writer.write(produce(1) + produce(2, (0, 1)) + produce(3) + api_versions(4) + produce(5))
        await asyncio.sleep(0.3)
        assert started == [1, 2, 3]  # all three produce requests started; ApiVersions waits for them

        release.setdefault(3, asyncio.Event()).set()  # the last one finishes first ...
        release.setdefault(2, asyncio.Event()).set()
        await asyncio.sleep(0.2)
        assert started == [1, 2, 3]
        release.setdefault(1, asyncio.Event()).set()
        assert await answers(reader, 3) == [1, 2, 3]  # ... but answers go in request order
        assert await answers(reader, 1) == [4]
        await asyncio.sleep(0.1)
        assert started == [1, 2, 3, 4, 5]  # the produce after ApiVersions waited for it
        release.setdefault(5, asyncio.Event()).set()
        assert await answers(reader, 1) == [5]
        assert await server.queued_requests() == 0
        writer.close()

    run_with_gated_server(500, body, answer)


def metadata(correlation_id: int, topics: tuple[str, ...] = ()) -> bytes:
    return sized(request_frame(keys.METADATA, 12, {"topics": [{"name": t} for t in topics],
                                                    "allow_auto_topic_creation": False,
                                                    "include_topic_authorized_operations": False}, correlation_id))


def test_metadata_requests_start_together_but_wait_for_any_other_request_before_them():
    """A new librdkafka client asks for the brokers, then for its topic, on one connection,
    and may close it on the first answer: the second starts without waiting for it. At
    most METADATA_TOGETHER run at once."""
    assert METADATA_TOGETHER == 2  # the sequence below is written for two
    started: list[int] = []
    release: dict[int, asyncio.Event] = {}

    async def answer(request, handle):
        cid = request.head.correlation_id
        started.append(cid)
        await release.setdefault(cid, asyncio.Event()).wait()
        if request.head.api_key == keys.METADATA:
            return build(response_class(keys.METADATA, 12), {"brokers": [], "topics": [], "controller_id": -1})
        if request.head.api_key == keys.PRODUCE:
            return build(response_class(keys.PRODUCE, 9), {"responses": []})
        return await handle(request)

    async def started_now(expected: list[int]) -> None:
        """Those have started (waiting for a loaded machine to get there), and no more."""
        for _ in range(200):
            if len(started) >= len(expected):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        assert started == expected

    async def body(server, gate, connect):
        reader, writer = await connect()
        writer.write(metadata(1) + metadata(2, ("t",)) + metadata(3) + api_versions(4) + metadata(5) + produce(6)
                     + metadata(7))
        await started_now([1, 2])  # two Metadata requests started; the third waits for them

        release.setdefault(2, asyncio.Event()).set()  # the second finishes first ...
        await started_now([1, 2])  # (the third waits for both before it)
        release.setdefault(1, asyncio.Event()).set()
        assert await answers(reader, 2) == [1, 2]  # ... but answers go in request order
        await started_now([1, 2, 3])  # ApiVersions waits for the Metadata before it
        release.setdefault(3, asyncio.Event()).set()
        assert await answers(reader, 1) == [3]
        await started_now([1, 2, 3, 4])  # and the Metadata after ApiVersions waits for it
        release.setdefault(4, asyncio.Event()).set()
        assert await answers(reader, 1) == [4]
        await started_now([1, 2, 3, 4, 5])  # a produce waits for the Metadata before it, as before
        release.setdefault(5, asyncio.Event()).set()
        assert await answers(reader, 1) == [5]
        await started_now([1, 2, 3, 4, 5, 6])  # and a Metadata waits for the produce before it
        release.setdefault(6, asyncio.Event()).set()
        await started_now([1, 2, 3, 4, 5, 6, 7])
        release.setdefault(7, asyncio.Event()).set()
        assert await answers(reader, 2) == [6, 7]
        assert await server.queued_requests() == 0
        writer.close()

    run_with_gated_server(500, body, answer)
