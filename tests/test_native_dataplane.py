"""Both native ends of the data plane (native_endpoint.py with native/src/endpoint_conns.rs,
native_connection.py with native/src/client_conns.rs), where tests/test_dataplane.py's
tests, which run on both sides, do not reach: frames cut anywhere by the socket, requests
that came with the handshake's last bytes, frames larger than the socket takes at once,
malformed frames at any point, and a native call that fails."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayk import errors, native_paths
from rayk.dataplane import frames, handshake, native_connection, native_endpoint
from rayk.dataplane.connection import Connection
from rayk.dataplane.endpoint import Endpoint, EndpointAddress
from rayk.errors import NetworkError

pytestmark = [
    pytest.mark.usefixtures("each_event_loop"),
    pytest.mark.skipif(native_paths._native is None, reason="rayk._native is not built (no cargo)"),
]

NODE = "node-a"


@pytest.fixture(autouse=True)
def native_on(monkeypatch):
    monkeypatch.setenv(native_paths.ENV, "1")


class Recorder:
    """Answers a request with its body (b"big:N": N bytes), recording what it was asked."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, kind: int, body: memoryview) -> tuple[bytes, bytes]:
        self.bodies.append(bytes(body))
        if bytes(body[:4]) == b"big:":
            return b"head", os.urandom(int(bytes(body[4:])))
        return bytes([kind]), bytes(body)


async def opened(handler, max_in_flight: int = 16) -> tuple[Endpoint, EndpointAddress]:
    endpoint = Endpoint(handler, "test", max_in_flight)
    return endpoint, await endpoint.open(NODE, "127.0.0.1", tcp=False)


async def raw_connection(address: EndpointAddress, then: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A peer that proves the secret by hand, writing `then` in the same write as its proof."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address.unix_path)  # abstract: uvloop's open_unix_connection takes no such path
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    greeting = await reader.readexactly(len(handshake.MAGIC) + handshake.NONCE_BYTES)
    endpoint_nonce, peer_nonce = greeting[len(handshake.MAGIC):], os.urandom(handshake.NONCE_BYTES)
    writer.write(peer_nonce + handshake._proof(address.secret, b"peer", endpoint_nonce, peer_nonce) + then)
    assert await reader.readexactly(handshake.PROOF_BYTES) == handshake._proof(
        address.secret, b"endpoint", endpoint_nonce, peer_nonce)
    return reader, writer


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    """(correlation id, outcome, the rest) of the next answer frame."""
    (size,) = frames.SIZE.unpack(await reader.readexactly(frames.SIZE.size))
    body = await reader.readexactly(size)
    correlation_id, outcome = frames.ANSWER_HEADER.unpack_from(body)
    return correlation_id, outcome, body[frames.ANSWER_HEADER.size:]


def served_natively(endpoint: Endpoint) -> int:
    return len(endpoint._native._served) if endpoint._native is not None else 0


@pytest.mark.parametrize("answered", ["by a task", "at once"])
def test_requests_that_came_with_the_handshakes_last_bytes_are_served_after_its_proof(answered):
    """Answered at once (`serve_now`), their answers still come after the endpoint's proof
    of the secret, which the transport may not have written yet when the socket is taken over."""

    def serve_now(kind, body, reply) -> bool:
        reply(bytes([kind]), bytes(body))
        return True

    async def go():
        handler = Recorder()
        endpoint = Endpoint(handler, "test", serve_now=serve_now if answered == "at once" else None)
        address = await endpoint.open(NODE, "127.0.0.1", tcp=False)
        requests = b"".join(frames.request_frame(i, frames.FETCH, b"req%d" % i) for i in range(3))
        reader, writer = await raw_connection(address, then=requests)  # checks the proof comes first
        answers = sorted([await read_answer(reader) for _ in range(3)])
        assert answers == [(i, frames.ANSWERED, bytes([frames.FETCH]) + b"req%d" % i) for i in range(3)]
        assert served_natively(endpoint) == 1
        writer.close()
        await endpoint.close()

    asyncio.run(go())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bodies=st.lists(st.one_of(st.binary(max_size=64), st.builds(  # past the native side's 16 KiB of own buffer
        lambda n, seed: random.Random(seed).randbytes(n), st.integers(16 * 1024, 80 * 1024), st.integers())),
        min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=40_000), min_size=1, max_size=20),
    kinds=st.lists(st.sampled_from(frames.KINDS), min_size=8, max_size=8),
)
def test_request_frames_cut_anywhere_are_each_served_once_and_answered(bodies, cuts, kinds):
    """However the socket cuts the stream (small frames, frames past the staging chunk,
    pieces of a size prefix), each request reaches the handler once, whole, and its answer
    comes back with its correlation id."""

    async def go():
        handler = Recorder()
        endpoint, address = await opened(handler)
        reader, writer = await raw_connection(address)
        stream = b"".join(frames.request_frame(i, kinds[i], body) for i, body in enumerate(bodies))
        at, pieces = 0, iter(cuts * (len(stream) // min(cuts) + 1))
        while at < len(stream):
            piece = stream[at:at + next(pieces)]
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0)
            at += len(piece)
        answers = {}
        for _ in bodies:
            correlation_id, outcome, rest = await asyncio.wait_for(read_answer(reader), 10)
            answers[correlation_id] = (outcome, rest)
        assert answers == {i: (frames.ANSWERED, bytes([kinds[i]]) + body) for i, body in enumerate(bodies)}
        assert sorted(handler.bodies) == sorted(bodies)
        writer.close()
        await endpoint.close()

    asyncio.run(go())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.integers(min_value=0, max_value=3),
    bad=st.sampled_from(["oversized", "no header", "unknown kind"]),
    split=st.booleans(),
)
def test_a_frame_that_does_not_parse_ends_its_connection_and_nothing_after_it_is_served(before, bad, split):
    async def go():
        handler = Recorder()
        endpoint, address = await opened(handler)
        reader, writer = await raw_connection(address)
        good = b"".join(frames.request_frame(i, frames.FETCH, b"ok%d" % i) for i in range(before))
        broken = {
            "oversized": frames.SIZE.pack(frames.MAX_FRAME_BYTES + 1),
            "no header": frames.SIZE.pack(3) + b"abc",
            "unknown kind": frames.SIZE.pack(5) + struct.pack(">ib", 9, 99),
        }[bad]
        after = frames.request_frame(100, frames.FETCH, b"after")
        stream = good + broken + after
        if split:  # the bad frame's bytes in two reads
            writer.write(stream[:len(good) + 2])
            await writer.drain()
            await asyncio.sleep(0.01)
            stream = stream[len(good) + 2:]
        writer.write(stream)
        await writer.drain()
        # Answers to the requests before it may come or not; then the end of the stream.
        while True:
            try:
                correlation_id, _, _ = await asyncio.wait_for(read_answer(reader), 10)
            except asyncio.IncompleteReadError:
                break
            assert correlation_id < before
        assert b"after" not in handler.bodies
        for _ in range(50):  # the endpoint lets the connection go
            if served_natively(endpoint) == 0:
                break
            await asyncio.sleep(0.01)
        assert served_natively(endpoint) == 0
        writer.close()
        await endpoint.close()

    asyncio.run(go())


def test_answers_larger_than_the_socket_takes_go_whole_and_in_turn_to_a_slow_reader():
    """Answers queue behind one the socket could not take (the writer waits for room):
    each arrives whole, none interleaved with another."""

    async def go():
        handler = Recorder()
        endpoint, address = await opened(handler, max_in_flight=4)
        connection = await Connection.open(address, NODE)
        sizes = [3 << 20, 10, 1 << 20, 5, 2 << 20, 7]
        answers = await asyncio.gather(*(
            asyncio.wait_for(connection.request(frames.FETCH, b"big:%d" % n), 30) for n in sizes))
        assert [len(a) for a in answers] == [len(b"head") + n for n in sizes]
        connection.close()
        await endpoint.close()

    asyncio.run(go())


def test_requests_answered_as_they_are_handed_out_leave_no_connection_held():
    """One request in flight at most, each answered at once by `serve_now` (as a leader
    answers a follower's fetch it can answer): the connection is let go of its hold as each
    answer goes, and reads on, however the events of one read interleave with the answers."""

    def serve_now(kind, body, reply) -> bool:
        reply(b"now", bytes(body))
        return True

    async def go():
        endpoint = Endpoint(Recorder(), "test", 1, serve_now=serve_now)
        address = await endpoint.open(NODE, "127.0.0.1", tcp=False)
        reader, writer = await raw_connection(address)
        n = 3000  # more than Python's recursion limit: each served in turn, not one call inside another
        writer.write(b"".join(frames.request_frame(i, frames.FETCH, b"r%d" % i) for i in range(n)))
        answers = [await asyncio.wait_for(read_answer(reader), 5) for _ in range(n)]
        assert answers == [(i, frames.ANSWERED, b"now" + b"r%d" % i) for i in range(n)]
        assert endpoint._native.alive
        writer.write(frames.request_frame(n, frames.FETCH, b"later"))  # read only if the socket is watched
        assert await asyncio.wait_for(read_answer(reader), 5) == (n, frames.ANSWERED, b"nowlater")
        writer.close()
        await endpoint.close()

    asyncio.run(go())


def test_a_request_served_at_once_is_answered_once_even_when_it_is_answered_again(caplog):
    """`serve_now`'s reply writes one answer per request: a second one (a parked request
    whose answer raised after it was written, answered again with its error) is logged and
    dropped, as is the FAILED frame for a `serve_now` that raised after replying; the
    requests after them are answered in step."""

    def serve_now(kind, body, reply) -> bool:
        reply(b"first", bytes(body))
        if body == b"twice":
            reply(b"second", bytes(body))
        elif body == b"raises":
            raise RuntimeError("after the answer")
        return True

    async def go():
        endpoint = Endpoint(Recorder(), "test", serve_now=serve_now)
        address = await endpoint.open(NODE, "127.0.0.1", tcp=False)
        reader, writer = await raw_connection(address)
        bodies = [b"twice", b"raises", b"once"]
        with caplog.at_level(logging.ERROR):
            writer.write(b"".join(frames.request_frame(i, frames.FETCH, body) for i, body in enumerate(bodies)))
            answers = [await asyncio.wait_for(read_answer(reader), 5) for _ in bodies]
            assert answers == [(i, frames.ANSWERED, b"first" + body) for i, body in enumerate(bodies)]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.readexactly(1), 0.3)  # nothing more
        assert sum("a second answer to request" in r.getMessage() for r in caplog.records) == 2
        assert endpoint._native.alive
        writer.close()
        await endpoint.close()

    asyncio.run(go())


def test_a_handlers_bytes_like_answer_is_written_as_bytes():
    async def handler(kind, body):
        return bytearray(b"head"), memoryview(b"tail")

    async def go():
        endpoint, address = await opened(handler)
        connection = await Connection.open(address, NODE)
        assert bytes(await connection.request(frames.FETCH, b"x")) == b"headtail"
        assert served_natively(endpoint) == 1 and endpoint._native.alive
        connection.close()
        await endpoint.close()

    asyncio.run(go())


def test_a_failing_native_call_ends_its_connections_and_later_ones_are_served_in_python(caplog):
    async def go():
        handler = Recorder()
        endpoint, address = await opened(handler)
        first = await Connection.open(address, NODE)
        assert bytes(await first.request(frames.FETCH, b"a")) == bytes([frames.FETCH]) + b"a"
        native = endpoint._native
        assert native is not None and served_natively(endpoint) == 1
        with caplog.at_level(logging.ERROR):
            native._call(native._conns._crash_for_tests)
        assert not native.alive
        with pytest.raises(NetworkError):
            await asyncio.wait_for(first.request(frames.FETCH, b"b"), 10)
        second = await Connection.open(address, NODE)
        assert bytes(await second.request(frames.FETCH, b"c")) == bytes([frames.FETCH]) + b"c"
        assert served_natively(endpoint) == 0  # in Python: the endpoint goes on
        first.close()
        second.close()
        await endpoint.close()

    asyncio.run(go())
    assert any("native data plane connections failed" in r.getMessage() for r in caplog.records)


def test_a_handler_error_answers_its_request_failed_and_the_connection_serves_on():
    async def go():
        async def handler(kind, body):
            if bytes(body) == b"bad":
                raise errors.NotLeaderOrFollowerError("not here")
            return b"", bytes(body)

        endpoint, address = await opened(handler)
        connection = await Connection.open(address, NODE)
        with pytest.raises(errors.NotLeaderOrFollowerError, match="not here"):
            await connection.request(frames.PRODUCE, b"bad")
        assert bytes(await connection.request(frames.PRODUCE, b"good")) == b"good"
        assert served_natively(endpoint) == 1
        connection.close()
        await endpoint.close()

    asyncio.run(go())


def test_an_endpoint_closing_ends_its_native_connections_and_closes_their_descriptors():
    async def go():
        endpoint, address = await opened(Recorder())
        open_before = len(os.listdir("/proc/self/fd"))  # the endpoint's listening socket among them
        connections = [await Connection.open(address, NODE) for _ in range(3)]
        for c in connections:
            await c.request(frames.FETCH, b"x")
        assert served_natively(endpoint) == 3
        native = endpoint._native
        await endpoint.close()
        for c in connections:
            with pytest.raises(NetworkError):
                await asyncio.wait_for(c.request(frames.FETCH, b"y"), 10)
            c.close()
        for _ in range(100):
            if not native._served:
                break
            await asyncio.sleep(0.01)
        assert not native._served
        await asyncio.sleep(0.05)
        assert len(os.listdir("/proc/self/fd")) <= open_before  # nothing of the 3 connections left open

    asyncio.run(go())


# ---------------------------------------------------------------------------- the connecting side


async def fake_endpoint(answer_stream: bytes, cut: list[int], requests_expected: int):
    """A Unix server that proves the secret by hand, reads `requests_expected` request
    frames and then writes `answer_stream` in pieces of the sizes in `cut`; returns
    (address, the server, the request frames it read)."""
    secret, seen = os.urandom(handshake.SECRET_BYTES), []

    async def serve(reader, writer):
        nonce = os.urandom(handshake.NONCE_BYTES)
        writer.write(handshake.MAGIC + nonce)
        answer = await reader.readexactly(handshake.NONCE_BYTES + handshake.PROOF_BYTES)
        writer.write(handshake._proof(secret, b"endpoint", nonce, answer[:handshake.NONCE_BYTES]))
        for _ in range(requests_expected):
            (size,) = frames.SIZE.unpack(await reader.readexactly(4))
            seen.append(await reader.readexactly(size))
        at, pieces = 0, iter(cut * (len(answer_stream) // min(cut) + 1))
        while at < len(answer_stream):
            piece = answer_stream[at:at + next(pieces)]
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0)
            at += len(piece)
        await reader.read()  # until the peer closes

    path = "\0rayk-test-%s" % os.urandom(6).hex()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    server = await asyncio.start_unix_server(serve, sock=sock)
    return EndpointAddress(NODE, path, "127.0.0.1", 0, secret), server, seen


def test_a_connection_is_native_where_it_is_plain_and_python_where_native_is_off(monkeypatch):
    async def go():
        endpoint, address = await opened(Recorder())
        native = await Connection.open(address, NODE)
        assert isinstance(native, native_connection.NativeConnection)
        monkeypatch.setenv(native_paths.ENV, "0")
        python = await Connection.open(address, NODE)
        assert type(python) is Connection
        for c in (native, python):
            assert bytes(await c.request(frames.PRODUCE, b"p")) == bytes([frames.PRODUCE]) + b"p"
            c.close()
        await endpoint.close()

    asyncio.run(go())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bodies=st.lists(st.one_of(st.binary(max_size=64), st.builds(
        lambda n, seed: random.Random(seed).randbytes(n), st.integers(16 * 1024, 80 * 1024), st.integers())),
        min_size=1, max_size=6),
    cut=st.lists(st.integers(min_value=1, max_value=40_000), min_size=1, max_size=20),
    order=st.randoms(use_true_random=False),
)
def test_answer_frames_cut_anywhere_each_reach_their_request(bodies, cut, order):
    async def go():
        ids = list(range(len(bodies)))
        order.shuffle(ids)  # answered in any order, as an endpoint does
        stream = b"".join(frames.answer_frame_head(i, b"", len(bodies[i])) + bodies[i] for i in ids)
        address, server, seen = await fake_endpoint(stream, cut, len(bodies))
        connection = await Connection.open(address, NODE)
        assert isinstance(connection, native_connection.NativeConnection)
        answers = await asyncio.wait_for(asyncio.gather(*(
            connection.request(frames.FETCH, b"q%d" % i) for i in range(len(bodies)))), 10)
        assert [bytes(a) for a in answers] == bodies
        assert sorted(frames.parse_request(f)[0] for f in seen) == list(range(len(bodies)))
        connection.close()
        server.close()

    asyncio.run(go())


@pytest.mark.parametrize("answer", ["oversized", "to no request", "unknown outcome"])
def test_an_answer_that_cannot_be_taken_breaks_the_connection(answer):
    async def go():
        stream = {
            "oversized": frames.SIZE.pack(frames.MAX_FRAME_BYTES + 1),
            "to no request": frames.answer_frame_head(77, b"", 0),
            "unknown outcome": frames.SIZE.pack(5) + frames.ANSWER_HEADER.pack(0, 9),
        }[answer]
        address, server, _ = await fake_endpoint(stream, [1000], 1)
        connection = await Connection.open(address, NODE)
        with pytest.raises(NetworkError):
            await asyncio.wait_for(connection.request(frames.FETCH, b"q"), 10)
        assert connection.closed
        with pytest.raises(NetworkError):
            await connection.request(frames.FETCH, b"again")
        connection.close()
        server.close()

    asyncio.run(go())


def test_requests_larger_than_the_socket_takes_wait_their_turn_whole():
    async def go():
        handler = Recorder()
        endpoint, address = await opened(handler, max_in_flight=8)
        connection = await Connection.open(address, NODE)
        bodies = [random.randbytes(n) for n in (3 << 20, 5, 2 << 20, 9, 1 << 20)]
        answers = await asyncio.wait_for(asyncio.gather(*(
            connection.request(frames.PRODUCE, [b[:100], memoryview(b)[100:]]) for b in bodies)), 30)
        assert [bytes(a) for a in answers] == [bytes([frames.PRODUCE]) + b for b in bodies]
        connection.close()
        await endpoint.close()

    asyncio.run(go())


def test_a_failing_native_client_breaks_its_connections_and_later_ones_are_python(caplog):
    async def go():
        endpoint, address = await opened(Recorder())
        first = await Connection.open(address, NODE)
        assert isinstance(first, native_connection.NativeConnection)
        client = native_connection.NativeClient.of_running_loop()
        with caplog.at_level(logging.ERROR):
            client.call(client._conns._crash_for_tests)
        with pytest.raises(NetworkError):
            await first.request(frames.FETCH, b"a")
        second = await Connection.open(address, NODE)
        assert type(second) is Connection
        assert bytes(await second.request(frames.FETCH, b"b")) == bytes([frames.FETCH]) + b"b"
        first.close()
        second.close()
        await endpoint.close()

    asyncio.run(go())
    assert any("native data plane connections of this process failed" in r.getMessage() for r in caplog.records)
