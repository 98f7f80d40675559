"""Client connections the listener's native code reads and writes (rayk/net/native_client.py,
native/src/kafka_conns.rs), on a SocketServer run in this process (no Ray) whose produce
path reaches fake replicas over real data plane endpoints (tests/test_native_produce.py).

- The native reading of a Produce request is kio's, for any request of the versions it
  reads, and a frame it does not read whole is left to Python.
- A plain Produce is served without Python's handler; pipelined ones are appended in
  order and answered in order, and any other request waits for them and is answered by
  Python in its place (with the frames read while it is unanswered); Produce requests
  Python must decide (acks=0, transactional, an authorizer, a produce quota) go to Python.
- The client's EOF: what it sent is answered, then the connection closes; its slots
  and pool bytes all go back.
- A native path that fails ends its connections; new ones are served in Python.

The limits (pool bytes reserved at the size prefix, queued.max.requests, read-ahead,
idle and oversized frames, throttled clients) are held by test_socket_server_limits.py
and test_socket_server_backpressure.py, whose connections are read natively here too.
"""

from __future__ import annotations

import asyncio
import logging
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayk import native_paths
from rayk.config import BrokerConfig
from rayk.net import api_versions as keys
from rayk.net.codec import decode_request
from rayk.net.entities import ms
from rayk.net.socket_server import SocketServer
from rayk.quotas import PRODUCER_BYTE_RATE, QuotaEntity
from tests.protocol_helpers import request_frame, sized
from tests.test_native_produce import FakeReplica, partition_answer, started

pytestmark = pytest.mark.skipif(not native_paths.enabled("kafka_conns"), reason="rayk._native is not built here")

if native_paths.built():
    from rayk._native import read_kafka_produce

records_st = st.one_of(st.none(), st.binary(max_size=40))
topics_st = st.lists(st.fixed_dictionaries({
    "name": st.text(max_size=12),
    "partition_data": st.lists(st.fixed_dictionaries({
        "index": st.integers(-(2**31), 2**31 - 1), "records": records_st}), max_size=3),
}), max_size=3)


def produce_frame(version: int, correlation_id: int, topics: list, acks: int = -1, transactional_id: str | None = None,
                  client_id: str | None = "test", timeout_ms: int = 5_000) -> bytes:
    return request_frame(keys.PRODUCE, version, {"transactional_id": transactional_id, "acks": acks,
                                                 "timeout": timeout_ms, "topic_data": topics},
                         correlation_id, client_id)  # fmt: skip


def kio_reads(frame: bytes) -> tuple | None:
    try:
        r = decode_request(frame)
    except Exception:
        return None
    b = r.body
    return (r.head.api_version, r.head.correlation_id, r.client_id, b.transactional_id, b.acks,
            ms(b.timeout),
            [(t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
             for t in b.topic_data])


@settings(max_examples=300, deadline=None)
@given(version=st.integers(3, 12), correlation_id=st.integers(0, 2**31 - 1), topics=topics_st,
       acks=st.sampled_from([-1, 0, 1]), transactional_id=st.one_of(st.none(), st.text(max_size=10)),
       client_id=st.one_of(st.none(), st.text(max_size=10)), timeout_ms=st.integers(0, 2**31 - 1))
def test_a_produce_request_reads_natively_as_kio_reads_it(version, correlation_id, topics, acks, transactional_id,
                                                          client_id, timeout_ms):  # fmt: skip
    frame = produce_frame(version, correlation_id, topics, acks, transactional_id, client_id, timeout_ms)
    assert read_kafka_produce(frame) == kio_reads(frame)


@settings(max_examples=500, deadline=None)
@given(version=st.integers(3, 12), topics=topics_st, data=st.data())
def test_a_damaged_produce_request_is_read_natively_only_as_kio_reads_it(version, topics, data):
    """A flipped byte, a cut or bytes added: where the native reading reads a request at
    all, it is the one kio reads (anything else goes to Python, which answers it)."""
    frame = bytearray(produce_frame(version, 1, topics))
    damage = data.draw(st.sampled_from(["flip", "cut", "extend"]))
    if damage == "flip":
        for _ in range(data.draw(st.integers(1, 3))):
            frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    elif damage == "cut":
        frame = frame[:data.draw(st.integers(0, len(frame) - 1))]
    else:
        frame += data.draw(st.binary(min_size=1, max_size=4))
    native = read_kafka_produce(bytes(frame))
    if native is not None:
        assert native == kio_reads(bytes(frame))


# ---------------------------------------------------------------- a listener reading natively


def produce(correlation_id: int, topic: str = "t", acks: int = -1, transactional_id: str | None = None,
            partitions: tuple[int, ...] = (0,)) -> bytes:
    return sized(produce_frame(9, correlation_id, [{"name": topic, "partition_data": [
        {"index": p, "records": b"r%d" % correlation_id} for p in partitions]}], acks, transactional_id))


def api_versions(correlation_id: int) -> bytes:
    return sized(request_frame(keys.API_VERSIONS, 3, {"client_software_name": "nc", "client_software_version": "1"},
                               correlation_id))


async def answer_frames(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    """The next `count` response frames, size prefix included."""
    out = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readexactly(4), 10)
        out.append(head + await reader.readexactly(struct.unpack(">i", head)[0]))
    return out


def correlation_ids(answers: list[bytes]) -> list[int]:
    return [struct.unpack_from(">i", a, 4)[0] for a in answers]


async def all_given_back(server: SocketServer, connections: int | None = None) -> None:
    """Waits (up to 2 s) until no request holds a slot or pool bytes (and, if given, the
    listener has `connections` connections), then asserts it."""
    async def settled() -> bool:
        return (await server.queued_requests() == 0 and await server.queued_request_bytes() == 0
                and (connections is None or await server.connections() == connections))
    for _ in range(200):
        if await settled():
            return
        await asyncio.sleep(0.01)
    if connections is not None:
        assert await server.connections() == connections
    assert await server.queued_requests() == 0 and await server.queued_request_bytes() == 0


async def serving(replicas: dict, **settings: object):
    """A SocketServer on 127.0.0.1 whose produce path reaches `replicas`, the API keys its
    Python handler was asked (`handled`), and a connect()."""
    config = BrokerConfig(**{"listeners": "PLAINTEXT://127.0.0.1:0", **settings})
    server = SocketServer(0, controller=None, config=config)
    native = await started(replicas)
    server.apis.view._native_produce, server.apis.view._native_tried = native, True
    handled: list[tuple[int, int]] = []
    handle = server.apis.handle

    async def recording_handle(request, throttle=None):
        handled.append((request.head.api_key, request.head.correlation_id))
        return await handle(request, throttle)

    server.apis.handle = recording_handle
    (host, port), = (await server.start()).values()
    return server, handled, lambda: asyncio.open_connection(host, port)


def test_plain_produce_is_served_natively_in_order_and_other_requests_wait_for_it(each_event_loop):
    asyncio.run(_plain_produce_is_served_natively_in_order_and_other_requests_wait_for_it())


async def _plain_produce_is_served_natively_in_order_and_other_requests_wait_for_it():
    replica = FakeReplica()
    server, handled, connect = await serving({("t", 0): replica})
    try:
        reader, writer = await connect()
        writer.write(produce(1))
        (first,) = await answer_frames(reader, 1)
        assert partition_answer(first) == [("t", 0, 0, 0, None)]
        replica.hold.clear()  # the next ones coalesce behind the one in flight
        writer.write(produce(2) + produce(3) + api_versions(4) + produce(5))
        while not replica.frames[1:]:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert handled == [], "ApiVersions waits for the produce requests before it"
        replica.hold.set()
        answers = await answer_frames(reader, 4)
        assert correlation_ids(answers) == [2, 3, 4, 5]
        assert [partition_answer(a) for a in (answers[0], answers[1], answers[3])] == [
            [("t", 0, 0, 1, None)], [("t", 0, 0, 2, None)], [("t", 0, 0, 3, None)]]
        assert replica.log == [b"r1", b"r2", b"r3", b"r5"]
        # Produce 5, read while ApiVersions was Python's and unanswered, went to Python too
        # (Python's order holds among its requests); once nothing is Python's, Produce is native again.
        assert handled == [(keys.API_VERSIONS, 4), (keys.PRODUCE, 5)]
        writer.write(produce(6))
        assert correlation_ids(await answer_frames(reader, 1)) == [6]
        assert handled == [(keys.API_VERSIONS, 4), (keys.PRODUCE, 5)] and replica.log[-1] == b"r6"
        assert await server.queued_requests() == 0 and await server.queued_request_bytes() == 0
        writer.close()
    finally:
        await server.stop()


def test_a_native_answer_ready_before_an_earlier_one_keeps_its_slot_until_its_turn(each_event_loop):
    asyncio.run(_a_native_answer_ready_before_an_earlier_one_keeps_its_slot_until_its_turn())


async def _a_native_answer_ready_before_an_earlier_one_keeps_its_slot_until_its_turn():
    slow, fast = FakeReplica(), FakeReplica()
    server, handled, connect = await serving({("t", 0): slow, ("u", 0): fast})
    try:
        reader, writer = await connect()
        slow.hold.clear()
        writer.write(produce(1, topic="t") + produce(2, topic="u"))
        while not fast.log:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # produce 2's answer is back at the listener, behind produce 1's
        assert handled == [], "both are native"
        assert await server.queued_requests() == 2, "its slot is held until its answer's turn, as Python's writer holds it"
        slow.hold.set()
        assert correlation_ids(await answer_frames(reader, 2)) == [1, 2]
        await all_given_back(server)
        writer.close()
    finally:
        await server.stop()


def test_produce_that_python_must_decide_goes_to_python(each_event_loop):
    asyncio.run(_produce_that_python_must_decide_goes_to_python())


async def _produce_that_python_must_decide_goes_to_python():
    replica = FakeReplica()
    server, handled, connect = await serving({("t", 0): replica})
    try:
        reader, writer = await connect()
        writer.write(produce(1, transactional_id="tx"))
        assert correlation_ids(await answer_frames(reader, 1)) == [1]
        writer.write(produce(2, acks=0))  # not answered
        while len(handled) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        writer.write(produce(3))
        assert correlation_ids(await answer_frames(reader, 1)) == [3]
        assert handled == [(keys.PRODUCE, 1), (keys.PRODUCE, 2)], "the plain one is native"
        server.apis.view.quotas.update(1, {QuotaEntity(client_id="test"): {PRODUCER_BYTE_RATE: 1e9}})
        server._quotas_changed()
        writer.write(produce(4))
        assert correlation_ids(await answer_frames(reader, 1)) == [4]
        assert handled[-1] == (keys.PRODUCE, 4), "a produce quota applies: Python measures the client"
        writer.close()
    finally:
        await server.stop()


def test_the_clients_eof_answers_what_it_sent_then_closes_and_gives_every_slot_back(each_event_loop):
    asyncio.run(_the_clients_eof_answers_what_it_sent_then_closes_and_gives_every_slot_back())


async def _the_clients_eof_answers_what_it_sent_then_closes_and_gives_every_slot_back():
    replica = FakeReplica()
    server, _, connect = await serving({("t", 0): replica})
    try:
        reader, writer = await connect()
        replica.hold.clear()
        writer.write(produce(1) + api_versions(2) + produce(3))
        writer.write_eof()
        await asyncio.sleep(0.2)
        assert await server.connections() == 1
        replica.hold.set()
        assert correlation_ids(await answer_frames(reader, 3)) == [1, 2, 3]
        assert await reader.read() == b"", "closed once everything is answered"
        await all_given_back(server, connections=0)
        writer.close()
    finally:
        await server.stop()


def test_a_failing_native_path_ends_its_connections_and_new_ones_are_served_in_python(each_event_loop, caplog):
    asyncio.run(_a_failing_native_path_ends_its_connections_and_new_ones_are_served_in_python(caplog))


async def _a_failing_native_path_ends_its_connections_and_new_ones_are_served_in_python(caplog):
    replica = FakeReplica()
    server, handled, connect = await serving({("t", 0): replica})
    try:
        reader, writer = await connect()
        writer.write(produce(1))
        assert correlation_ids(await answer_frames(reader, 1)) == [1]
        native = server.apis.view._native_produce
        with caplog.at_level(logging.ERROR), pytest.raises(Exception):
            native._call(native._path._crash_for_tests)
        assert not native.alive
        assert await asyncio.wait_for(reader.read(), 5) == b"", "its connection ended"
        reader, writer = await connect()
        writer.write(api_versions(2))
        assert correlation_ids(await answer_frames(reader, 1)) == [2]
        assert handled[-1] == (keys.API_VERSIONS, 2)
        await all_given_back(server)
        writer.close()
    finally:
        await server.stop()


def test_a_failed_wait_for_admission_ends_the_connection_instead_of_leaving_it_paused(each_event_loop, caplog):
    asyncio.run(_a_failed_wait_for_admission_ends_the_connection_instead_of_leaving_it_paused(caplog))


async def _a_failed_wait_for_admission_ends_the_connection_instead_of_leaving_it_paused(caplog):
    replica = FakeReplica()
    server, _, connect = await serving({("t", 0): replica}, queued_max_requests=1)

    async def failing_admit(connection, size):
        await asyncio.sleep(0)
        raise RuntimeError("injected")

    try:
        reader, writer = await connect()
        replica.hold.clear()  # produce 1 holds the listener's only slot: produce 2 waits for it
        server._admit = failing_admit
        with caplog.at_level(logging.ERROR):
            writer.write(produce(1) + produce(2))
            assert await asyncio.wait_for(reader.read(), 5) == b"", "the connection ended"
        assert "the admission of a frame failed" in caplog.text
        replica.hold.set()
        await all_given_back(server, connections=0)
        assert replica.log in ([], [b"r1"]), "produce 2 was never read whole"
        writer.close()
    finally:
        await server.stop()


def test_an_oversized_frame_ends_the_connection_after_what_came_before_it_is_answered(each_event_loop):
    asyncio.run(_an_oversized_frame_ends_the_connection_after_what_came_before_it_is_answered())


async def _an_oversized_frame_ends_the_connection_after_what_came_before_it_is_answered():
    replica = FakeReplica()
    server, _, connect = await serving({("t", 0): replica}, socket_request_max_bytes=10_000)
    try:
        reader, writer = await connect()
        replica.hold.clear()
        writer.write(produce(1) + api_versions(2) + struct.pack(">i", 20_000) + b"\0" * 100)
        await asyncio.sleep(0.2)
        replica.hold.set()
        assert correlation_ids(await answer_frames(reader, 2)) == [1, 2], "answered, as Python's reader's end does"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert replica.log == [b"r1"]
        writer.close()
    finally:
        await server.stop()


@pytest.mark.parametrize("sent", [b"", b"\0\0"], ids=["nothing", "part of a size"])
def test_a_connection_waiting_for_its_next_request_is_closed_when_idle(each_event_loop, sent):
    asyncio.run(_a_connection_waiting_for_its_next_request_is_closed_when_idle(sent))


async def _a_connection_waiting_for_its_next_request_is_closed_when_idle(sent: bytes):
    server, _, connect = await serving({}, connections_max_idle_ms=600)
    try:
        reader, writer = await connect()
        writer.write(api_versions(1))
        assert correlation_ids(await answer_frames(reader, 1)) == [1]
        writer.write(sent)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        await server.stop()
