"""The data plane without Ray: frames (property-based), the handshake, an Endpoint and its
Connections over Unix sockets and TCP on 127.0.0.1, strangers, pipelining, backpressure,
TLS."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import socket
import struct
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayk import errors, native_paths
from rayk.dataplane import endpoint as endpoint_module
from rayk.dataplane import answer_writer, frame_reader, frames, handshake, native_endpoint, tls
from rayk.dataplane.connection import Connection
from rayk.dataplane.endpoint import Endpoint, EndpointAddress, reachable_host
from rayk.dataplane.frames import FetchRequest, FetchResult, ProduceRequest, ProduceResult, ShareFetchRequest, ShareFetchResult
from rayk.dataplane.replica_link import ReplicaLink
from rayk.errors import NetworkError
from rayk.storage.file_slice import FileSlice
from rayk.dataplane import streams

# Ray runs the actors that hold endpoints and listeners on uvloop; these run them on both
# loops, and every endpoint both ways: its connections served in Python and natively.
pytestmark = pytest.mark.usefixtures("each_event_loop", "endpoint_path")


@pytest.fixture(params=["python", "native"])
def endpoint_path(request, monkeypatch):
    """Endpoints serve their plain connections natively (native_endpoint.py) where the
    crate is built, in Python with RAYK_NATIVE=0 (or without it)."""
    if request.param == "native":
        if native_paths._native is None:
            pytest.skip("rayk._native is not built (no cargo): endpoints serve every connection in Python")
        monkeypatch.setenv(native_paths.ENV, "1")
    else:
        monkeypatch.setenv(native_paths.ENV, "0")
    return request.param

NODE = "node-a"
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
ERRORS = [errors.NotLeaderOrFollowerError, errors.FencedLeaderEpochError, errors.OffsetOutOfRangeError,
          errors.UnexpectedAppendOffsetError, errors.UnknownServerError]


@given(st.builds(FetchRequest, i64, i32, i32, i32, i32, i32, i32, st.sampled_from([0, 1]), st.text(max_size=40),
                 st.none() | st.text(min_size=1, max_size=36)))
def test_a_fetch_request_decodes_to_what_was_encoded(request):
    assert frames.decode_fetch_request(frames.encode_fetch_request(request)) == request


@given(st.binary(max_size=300), i64, i64, i64, st.none() | st.tuples(st.sampled_from(ERRORS), st.text(max_size=30)),
       st.none() | st.tuples(st.integers(-1, 2**31 - 1), i64),  # epoch -1: the leader has none at or below
       i64, st.lists(st.tuples(i64, i64), max_size=5).map(tuple))
def test_a_fetch_answer_decodes_to_what_was_encoded(records, hw, leo, log_start, error, diverging, lso, aborted):
    error = None if error is None else error[0](error[1])
    result = FetchResult(records, hw, leo, log_start, error, diverging, lso, aborted)
    body = frames.encode_fetch_answer_head(result) + records
    decoded = frames.decode_fetch_answer(body)
    assert (decoded.records, decoded.high_watermark, decoded.log_end_offset, decoded.log_start_offset,
            decoded.diverging_epoch, decoded.last_stable_offset, decoded.aborted_transactions) == (
        records, hw, leo, log_start, diverging, lso, aborted)
    assert type(decoded.records) is bytes
    assert type(decoded.error) is type(error) and str(decoded.error) == str(error)
    # the consumer's form: the records a view of the frame, the rest the same
    viewed = frames.decode_fetch_answer(memoryview(body), copy_records=False)
    assert isinstance(viewed.records, memoryview) and viewed.records.obj is body and viewed.records == records
    assert viewed._replace(records=records, error=None) == decoded._replace(error=None)


def test_a_fetch_request_with_an_unknown_isolation_level_does_not_parse():
    body = bytearray(frames.encode_fetch_request(FetchRequest(0, 100, isolation_level=1)))
    body[32] = 2  # the isolation level's byte, after seven numbers
    with pytest.raises(frames.FrameError, match="isolation level 2"):
        frames.decode_fetch_request(bytes(body))


produce_requests = st.lists(st.builds(
    ProduceRequest, st.binary(max_size=200), st.integers(-(2**15), 2**15 - 1), i32, st.none() | st.text(max_size=20),
    st.sampled_from(frames.TRANSACTION_VERSIONS)), max_size=8)
record_errors = st.lists(st.builds(errors.RecordError, st.integers(0, 2**31 - 1), st.text(max_size=30)), max_size=12)
produce_results = st.lists(st.builds(
    ProduceResult, i64, i64, i64, st.none() | st.sampled_from(ERRORS).map(lambda cls: cls("why")) | st.builds(
        lambda named: errors.InvalidRecordError("some records have no key", record_errors=named), record_errors)),
    max_size=8)


@given(produce_requests)
def test_produce_requests_decode_to_what_was_encoded(requests):
    assert frames.decode_produce_request(b"".join(frames.encode_produce_request(requests))) == requests


def test_a_produce_request_with_an_unknown_transaction_version_does_not_parse():
    body = bytearray(b"".join(frames.encode_produce_request([ProduceRequest(b"r", -1, 100, "tx", 2)])))
    body[4 + 12] = 3  # the transaction version's byte: after the count, acks, timeout, size and id size
    with pytest.raises(frames.FrameError, match="transaction version 3"):
        frames.decode_produce_request(bytes(body))


@given(produce_results)
def test_produce_answers_decode_to_what_was_encoded(results):
    decoded = frames.decode_produce_answer(frames.encode_produce_answer(results))
    assert [(r.base_offset, r.log_append_time_ms, r.log_start_offset, type(r.error), str(r.error)) for r in decoded] == [
        (r.base_offset, r.log_append_time_ms, r.log_start_offset, type(r.error), str(r.error)) for r in results]
    assert [r.error and r.error.record_errors for r in decoded] == [r.error and r.error.record_errors for r in results]


def test_a_produce_answers_record_error_messages_are_cut_to_their_bound():
    long = errors.InvalidRecordError("no key", record_errors=[errors.RecordError(4, "x" * 5000)])
    (decoded,) = frames.decode_produce_answer(frames.encode_produce_answer([ProduceResult(-1, -1, 0, long)]))
    assert decoded.error.record_errors == (errors.RecordError(4, "x" * frames.RECORD_ERROR_MESSAGE_MAX_BYTES),)


@given(produce_requests, st.data())
def test_a_produce_request_cut_short_or_lengthened_is_a_frame_error(requests, data):
    encoded = b"".join(frames.encode_produce_request(requests))
    cut = data.draw(st.integers(0, len(encoded) - 1))
    for damaged in (encoded[:cut], encoded + b"x"):
        with pytest.raises(frames.FrameError):
            frames.decode_produce_request(damaged)


share_fetch_requests = st.builds(
    ShareFetchRequest, st.text(max_size=30), st.text(max_size=36), i32, i32,
    st.lists(st.tuples(i64, i64, st.integers(-128, 127)), max_size=6).map(tuple))


@given(st.binary(max_size=300), st.lists(st.tuples(i64, i64, st.integers(-(2**15), 2**15 - 1)), max_size=6).map(tuple),
       st.none() | st.sampled_from(ERRORS).map(lambda cls: cls("acks")),
       st.none() | st.sampled_from(ERRORS).map(lambda cls: cls("fetch")))
def test_a_share_fetch_answer_decodes_to_what_was_encoded(records, acquired, acknowledge_error, error):
    result = ShareFetchResult(records, acquired, acknowledge_error, error)
    decoded = frames.decode_share_fetch_answer(frames.encode_share_fetch_answer_head(result) + records)
    assert (decoded.records, decoded.acquired) == (records, acquired)
    for got, sent in ((decoded.acknowledge_error, acknowledge_error), (decoded.error, error)):
        assert type(got) is type(sent) and str(got) == str(sent)


def test_a_share_fetch_request_with_an_id_too_long_for_its_frame_is_invalid():
    link = ReplicaLink(None, NODE, "nobody")
    with pytest.raises(errors.InvalidRequestError, match="out of range"):
        asyncio.run(link.share_fetch(ShareFetchRequest("g" * 70_000, "m", 1, 0)))


share_state_writes = st.builds(
    frames.ShareStateWrite, st.text(max_size=30), st.text(max_size=40), i32, i32, i64, i64,
    st.lists(st.tuples(i64, i64, st.sampled_from(frames.SHARE_RECORD_STATES), st.integers(-(2**15), 2**15 - 1)),
             max_size=6).map(tuple),
    st.booleans())


SHARE_REQUEST_CODECS = {  # a request of one kind: its strategy, encode, decode
    "share fetch": (share_fetch_requests, frames.encode_share_fetch_request, frames.decode_share_fetch_request),
    "share state write": (share_state_writes, frames.encode_share_state_write, frames.decode_share_state_write),
}


@pytest.mark.parametrize("kind", SHARE_REQUEST_CODECS)
@given(data=st.data())
def test_a_share_request_decodes_to_what_was_encoded_and_cut_short_or_lengthened_is_a_frame_error(kind, data):
    requests, encode, decode = SHARE_REQUEST_CODECS[kind]
    request = data.draw(requests)
    encoded = encode(request)
    assert decode(encoded) == request
    cut = data.draw(st.integers(0, len(encoded) - 1))
    for damaged in (encoded[:cut], encoded + b"x"):
        with pytest.raises(frames.FrameError):
            decode(damaged)


def test_a_share_state_writes_record_states_are_the_share_partitions_and_no_other_decodes():
    from rayk.replication.share.share_partition import RecordState

    assert frames.SHARE_RECORD_STATES == tuple(state.value for state in RecordState)
    encoded = bytearray(frames.encode_share_state_write(frames.ShareStateWrite("g", "t", 0, 1, 1, 0, ((0, 9, "archived", 5),))))
    encoded[-3] = len(frames.SHARE_RECORD_STATES)  # the batch's state byte
    with pytest.raises(frames.FrameError, match="record state"):
        frames.decode_share_state_write(bytes(encoded))
    link = ReplicaLink(None, NODE, "nobody")
    with pytest.raises(errors.InvalidRequestError, match="out of range"):
        asyncio.run(link.write_share_state(frames.ShareStateWrite("g", "t", 0, 1, 1, 0, ((0, 9, "lost", 1),))))


@given(st.none() | st.sampled_from(ERRORS + [errors.FencedStateEpochError, errors.NotCoordinatorError]).map(lambda cls: cls("no")))
def test_an_error_answer_decodes_to_what_was_encoded(error):
    decoded = frames.decode_error_answer(frames.encode_error_answer(error))
    assert type(decoded) is type(error) and str(decoded) == str(error)


@given(st.integers(0, 2**31 - 1), st.sampled_from(ERRORS + [errors.InvalidRequestError]), st.text(max_size=30))
def test_a_failed_answer_carries_its_correlation_id_and_error(correlation_id, error_class, message):
    frame = frames.failed_answer_frame(correlation_id, error_class(message))
    assert frames.SIZE.unpack_from(frame)[0] == len(frame) - frames.SIZE.size
    assert frames.ANSWER_HEADER.unpack_from(frame, frames.SIZE.size) == (correlation_id, frames.FAILED)
    error = frames.decode_failed_answer(frame[frames.SIZE.size + frames.ANSWER_HEADER.size:])
    assert type(error) is error_class and str(error) == str(error_class(message))


def test_a_failed_answer_that_names_no_error_does_not_parse():
    with pytest.raises(frames.FrameError):
        frames.decode_failed_answer(frames.encode_error_answer(None))


@given(st.binary(max_size=80))
def test_garbage_never_decodes_to_anything_but_a_frame_error(data):
    for decode in (frames.decode_fetch_request, frames.decode_fetch_answer, frames.parse_request,
                   frames.decode_produce_request, frames.decode_produce_answer, frames.decode_share_fetch_request,
                   frames.decode_share_fetch_answer, frames.decode_share_state_write, frames.decode_error_answer,
                   frames.decode_failed_answer):
        try:
            decode(data)
        except frames.FrameError:
            pass


def test_an_error_class_that_is_not_raykss_is_an_unknown_server_error():
    head = struct.pack(">qqqqbiqHi", 0, 0, 0, 0, 0, -1, -1, 11, 0) + b"ValueError\0"
    assert isinstance(frames.decode_fetch_answer(head).error, errors.UnknownServerError)


class Echo:
    """A handler that answers a request with its body, after `delay_s` (a body starting with
    b"slow" waits 10x longer, one with b"fail" raises), counting how many run at once."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s, self.running, self.most_running, self.calls = delay_s, 0, 0, 0

    async def __call__(self, kind: int, body: memoryview) -> tuple[bytes, bytes]:
        self.calls += 1
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.delay_s * (10 if bytes(body[:4]) == b"slow" else 1))
            if bytes(body[:4]) == b"fail":
                raise OSError("the disk is gone")
            return b"", bytes(body)
        finally:
            self.running -= 1


async def opened(handler, max_in_flight: int = 16) -> tuple[Endpoint, EndpointAddress]:
    endpoint = Endpoint(handler, "test", max_in_flight)
    return endpoint, await endpoint.open(NODE, "127.0.0.1")  # TCP too: node-b peers use it


@pytest.mark.parametrize("node_id", [NODE, "node-b"], ids=["unix socket", "tcp"])
def test_pipelined_requests_each_get_their_own_answer(node_id):
    async def go():
        endpoint, address = await opened(Echo())
        connection = await Connection.open(address, node_id)
        bodies = [f"request {i}".encode() * i for i in range(50)]
        answers = await asyncio.gather(*(connection.request(frames.FETCH, b) for b in bodies))
        assert [bytes(a) for a in answers] == bodies
        connection.close()
        await endpoint.close()

    asyncio.run(go())


def test_a_slow_request_holds_up_no_answer_behind_it():
    async def go():
        endpoint, address = await opened(Echo(delay_s=0.1))
        connection = await Connection.open(address, NODE)
        slow = asyncio.ensure_future(connection.request(frames.FETCH, b"slow"))  # 1 s
        await asyncio.sleep(0.01)
        assert bytes(await asyncio.wait_for(connection.request(frames.FETCH, b"quick"), 0.8)) == b"quick"
        assert not slow.done()
        assert bytes(await slow) == b"slow"
        connection.close()
        await endpoint.close()

    asyncio.run(go())


RAISED_AND_ANSWERED = {  # what a handler raises -> what the peer's request raises
    "unexpected": (ValueError("a record batch the decoder cannot read"), errors.UnknownServerError),
    "kafka error": (errors.NotLeaderOrFollowerError("not the leader"), errors.NotLeaderOrFollowerError),
    "body does not parse": (frames.FrameError("a PRODUCE request of 3 bytes has no count"), errors.InvalidRequestError),
}


@pytest.mark.parametrize("node_id", [NODE, "node-b"], ids=["unix socket", "tcp"])
@pytest.mark.parametrize("raised", RAISED_AND_ANSWERED)
def test_a_request_whose_handler_raises_fails_alone_and_its_connection_serves_on(caplog, node_id, raised):
    exception, answered = RAISED_AND_ANSWERED[raised]
    release = asyncio.Event()

    async def handler(kind: int, body: memoryview) -> tuple[bytes, bytes]:
        if bytes(body) == b"long poll":
            await release.wait()
            return b"", b"records"
        if bytes(body) == b"raise":
            raise exception
        return b"", bytes(body)

    async def go():
        endpoint, address = await opened(handler)
        connection = await Connection.open(address, node_id)
        held = asyncio.ensure_future(connection.request(frames.FETCH, b"long poll"))
        await asyncio.sleep(0.05)
        with pytest.raises(answered) as failed:
            await asyncio.wait_for(connection.request(frames.PRODUCE, b"raise"), 5)
        assert type(failed.value) is answered
        if raised == "unexpected":
            assert "ValueError: a record batch the decoder cannot read" in str(failed.value)
        assert not held.done() and not connection.closed, "the other request and the connection go on"
        release.set()
        assert bytes(await asyncio.wait_for(held, 5)) == b"records"
        assert bytes(await connection.request(frames.FETCH, b"after")) == b"after"
        assert endpoint.authenticated_count == 1
        connection.close()
        await endpoint.close()

    asyncio.run(go())
    logged = [r for r in caplog.records if "failed" in r.getMessage() or "does not parse" in r.getMessage()]
    assert len(logged) == 1, "logged once"
    assert (logged[0].exc_info is not None) == (raised == "unexpected"), "with its traceback if unexpected"


@pytest.mark.parametrize("damage", ["unknown outcome", "failed answer cut short"])
def test_an_answer_that_does_not_parse_breaks_the_connection(damage):
    if damage == "unknown outcome":  # neither ANSWERED nor FAILED
        answer = frames.ANSWER_HEADER.pack(0, 7)
    else:  # an error of 5 bytes, 2 of them there
        answer = frames.ANSWER_HEADER.pack(0, frames.FAILED) + b"\x00\x05ab"

    async def go():
        ours, theirs = socket.socketpair()
        transport, protocol = await asyncio.get_running_loop().create_unix_connection(frame_reader.new_protocol, sock=ours)
        connection = Connection(*frame_reader.streams_of(transport, protocol), "test", max_in_flight=4)
        request = asyncio.ensure_future(connection.request(frames.FETCH, b"x"))
        await asyncio.sleep(0.05)
        theirs.sendall(frames.SIZE.pack(len(answer)) + answer)
        with pytest.raises(NetworkError, match="outcome 7|does not parse"):
            await asyncio.wait_for(request, 5)
        assert connection.closed
        theirs.close()

    asyncio.run(go())


class CountingTransport:
    """A transport that counts the writes it is asked for (each is a send of its own on
    uvloop, and a wake-up of the peer), passing everything on."""

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self._transport, self.writes = transport, 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self._transport.write(data)  # type: ignore[attr-defined]

    def writelines(self, parts: Any) -> None:
        self.writes += 1
        self._transport.writelines(parts)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def counted_socket_pair() -> tuple[CountingTransport, frame_reader.FrameProtocol, socket.socket]:
    """A FrameProtocol connection over a socket pair, its transport's writes counted, and
    the other end (blocking) to read what was written."""
    ours, theirs = socket.socketpair()
    transport, protocol = await asyncio.get_running_loop().create_unix_connection(frame_reader.new_protocol, sock=ours)
    theirs.setblocking(True)
    return CountingTransport(transport), protocol, theirs


def received(sock: socket.socket, size: int) -> bytes:
    got = b""
    while len(got) < size:
        got += sock.recv(1 << 20)
    return got


@pytest.mark.parametrize("record_bytes", [10, 64 * 1024])
def test_a_request_of_several_parts_goes_to_the_socket_in_one_write(record_bytes):
    """A PRODUCE request's parts (its head, its records) are written in one call: one
    buffer when small, the parts as they are (not copied) when large."""
    records = os.urandom(record_bytes)

    async def go() -> tuple[bytes, bytes]:
        counting, protocol, theirs = await counted_socket_pair()
        connection = Connection(*frame_reader.streams_of(counting, protocol), "test", max_in_flight=4)  # type: ignore[arg-type]
        parts = frames.encode_produce_request([ProduceRequest(records, -1, 1000)])
        assert len(parts) == 2
        await connection.request(frames.PRODUCE, parts, answered=False)
        assert counting.writes == 1
        expected = frames.request_frame_head(0, frames.PRODUCE, sum(map(len, parts))) + b"".join(parts)
        got = received(theirs, len(expected))
        connection.close()
        theirs.close()
        return got, expected

    got, expected = asyncio.run(go())
    assert got == expected


@pytest.mark.parametrize("record_bytes", [10, 64 * 1024])
def test_an_answer_and_its_records_go_to_the_socket_in_one_write(record_bytes):
    records = os.urandom(record_bytes)

    async def go() -> tuple[bytes, bytes]:
        counting, protocol, theirs = await counted_socket_pair()
        _, writer = frame_reader.streams_of(counting, protocol)  # type: ignore[arg-type]
        await answer_writer.AnswerWriter(writer).write(7, b"head", records)
        assert counting.writes == 1
        expected = frames.answer_frame_head(7, b"head", len(records)) + records
        got = received(theirs, len(expected))
        writer.close()
        theirs.close()
        return got, expected

    got, expected = asyncio.run(go())
    assert got == expected


@pytest.mark.parametrize("staged", ["end of stream", "an answer to no request"])
def test_what_came_before_the_connection_was_made_breaks_it_quietly(caplog, staged):
    """An endpoint that refuses past its cap sends its proof and closes: the end can be
    staged before the Connection is made, which takes it at once."""

    async def go():
        ours, theirs = socket.socketpair()
        transport, protocol = await asyncio.get_running_loop().create_unix_connection(frame_reader.new_protocol, sock=ours)
        if staged == "end of stream":
            theirs.close()
        else:
            answer = frames.ANSWER_HEADER.pack(7, frames.ANSWERED)
            theirs.sendall(frames.SIZE.pack(len(answer)) + answer)
        await asyncio.sleep(0.05)
        connection = Connection(*frame_reader.streams_of(transport, protocol), "test", max_in_flight=4)
        assert connection.closed
        with pytest.raises(NetworkError, match="endpoint closed|request 7"):
            await connection.request(frames.FETCH, b"x")
        connection.close()
        theirs.close()

    asyncio.run(go())
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_handler_that_raises_frees_its_requests_slot():
    async def go():
        endpoint, address = await opened(Echo(), max_in_flight=1)
        connection = await Connection.open(address, NODE)
        for _ in range(3):  # one slot: each failure gives it back, or the next request would hang
            with pytest.raises(errors.UnknownServerError, match="the disk is gone"):
                await asyncio.wait_for(connection.request(frames.FETCH, b"fail"), 5)
        assert bytes(await asyncio.wait_for(connection.request(frames.FETCH, b"ok"), 5)) == b"ok"
        connection.close()
        await endpoint.close()

    asyncio.run(go())


async def strangers(address: EndpointAddress, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """`count` TCP sockets to the endpoint, from 127.0.0.1 as every peer here, that never say a word."""
    return [await asyncio.open_connection(address.host, address.port) for _ in range(count)]


async def closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """Whether the endpoint closes the connection within `timeout_s` (what it sent before is skipped)."""
    try:
        async with asyncio.timeout(timeout_s):
            while await reader.read(1 << 16):
                pass
        return True
    except TimeoutError:
        return False
    except OSError:  # reset
        return True


def close_all(sockets) -> None:
    for _, writer in sockets:
        writer.close()


@pytest.mark.parametrize("over_tls", [False, True], ids=["plain", "tls"])
def test_only_authenticated_connections_count_against_the_cap_and_one_past_it_is_refused(monkeypatch, keystores, over_tls):
    monkeypatch.setattr(endpoint_module, "MAX_CONNECTIONS", 2)

    async def go():
        endpoint, address = await (opened_over_tls(Echo(), keystores[0]) if over_tls else opened(Echo()))
        idle = await strangers(address, 5)  # more than the cap: they hold none of its places
        first, second = [await Connection.open(address, "node-b") for _ in range(2)]
        for connection in (first, second):
            assert bytes(await connection.request(frames.FETCH, b"in")) == b"in"
        assert endpoint.authenticated_count == 2
        with pytest.raises(NetworkError):  # past the cap: closed before the handshake ends
            await Connection.open(address, "node-b")
        first.close()
        async with asyncio.timeout(5):
            while endpoint.authenticated_count != 1:  # the endpoint reads the close
                await asyncio.sleep(0.01)
        third = await Connection.open(address, "node-b")
        assert bytes(await third.request(frames.FETCH, b"in")) == b"in"
        second.close(), third.close(), close_all(idle)
        await endpoint.close()

    asyncio.run(go())


@pytest.mark.parametrize("over_tls", [False, True], ids=["plain", "tls"])
def test_a_flood_of_idle_sockets_from_the_peers_own_address_does_not_keep_the_peer_out(keystores, over_tls):
    """The attack on the data plane's old cap (256 places, strangers included, held for 5 s):
    300 idle sockets, and more all along, from 127.0.0.1, which the peer connects from too."""

    async def go():
        endpoint, address = await (opened_over_tls(Echo(), keystores[0]) if over_tls else opened(Echo()))
        flood = await strangers(address, 300)

        async def keep_flooding() -> None:
            while True:
                flood.extend(await strangers(address, 1))
                await asyncio.sleep(0.02)

        flooding = asyncio.create_task(keep_flooding())
        try:
            connection = await Connection.open(address, "node-b")
            bodies = [b"request %d" % i for i in range(20)]
            answers = await asyncio.gather(*(connection.request(frames.FETCH, body) for body in bodies))
            assert [bytes(a) for a in answers] == bodies
            assert endpoint.authenticated_count == 1
            assert endpoint.unauthenticated_count <= endpoint_module.MAX_UNAUTHENTICATED_PER_ADDRESS
        finally:
            flooding.cancel()
        assert sum([await closed_within(reader, 0.5) for reader, _ in flood[:290]]) == 290, "the oldest were let go"
        connection.close(), close_all(flood)
        await endpoint.close()

    asyncio.run(go())


@pytest.mark.parametrize("way", ["unix socket", "tcp", "tls", "tls, then silent"])
def test_a_silent_stranger_is_closed_within_about_a_second_or_its_tls_handshakes_few(keystores, way, monkeypatch):
    assert (endpoint_module.HANDSHAKE_TIMEOUT_S, endpoint_module.TLS_HANDSHAKE_TIMEOUT_S) == (1.0, 3.0)
    # Shorter here (24 cases): the deadlines are read when a connection is accepted.
    monkeypatch.setattr(endpoint_module, "HANDSHAKE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(endpoint_module, "TLS_HANDSHAKE_TIMEOUT_S", 1.0)

    async def go():
        endpoint, address = await (opened_over_tls(Echo(), keystores[0]) if way.startswith("tls") else opened(Echo()))
        within_s = endpoint_module.HANDSHAKE_TIMEOUT_S + 1.0  # room for a loaded machine
        if way == "unix socket":
            reader, writer = await streams.open_unix_connection(address.unix_path, limit_bytes=1 << 16)
        elif way == "tls, then silent":  # through TLS, then no proof of the secret
            reader, writer = await asyncio.open_connection(
                address.host, address.port, ssl=tls.client_context(address.tls_certificate), server_hostname="")
        else:
            reader, writer = await asyncio.open_connection(address.host, address.port)
            if way == "tls":  # not even a ClientHello: the TLS handshake's own deadline
                within_s = endpoint_module.TLS_HANDSHAKE_TIMEOUT_S + 1.0
        started = time.monotonic()
        assert await closed_within(reader, within_s)
        deadline_s = endpoint_module.TLS_HANDSHAKE_TIMEOUT_S if way == "tls" else endpoint_module.HANDSHAKE_TIMEOUT_S
        assert time.monotonic() - started >= deadline_s - 0.1, "not closed before its deadline"
        async with asyncio.timeout(1):
            while endpoint.connection_count or endpoint.unauthenticated_count:  # its place is free
                await asyncio.sleep(0.01)
        writer.close()
        await endpoint.close()

    asyncio.run(go())


def test_the_oldest_strangers_of_an_address_past_its_bound_are_let_go_and_a_peer_from_it_gets_in(monkeypatch):
    monkeypatch.setattr(endpoint_module, "HANDSHAKE_TIMEOUT_S", 60.0, raising=False)  # nobody is closed for being slow
    bound = 4
    monkeypatch.setattr(endpoint_module, "MAX_UNAUTHENTICATED_PER_ADDRESS", bound, raising=False)

    async def go():
        endpoint, address = await opened(Echo())
        flood = await strangers(address, bound + 3)
        oldest, newest = flood[:3], flood[3:]
        assert all([await closed_within(reader, 1) for reader, _ in oldest]), "let go at once"
        assert not any([await closed_within(reader, 0.05) for reader, _ in newest])
        assert endpoint.unauthenticated_count == bound
        connection = await Connection.open(address, "node-b")  # from 127.0.0.1 as the flood: it takes a place
        assert bytes(await connection.request(frames.FETCH, b"served")) == b"served"
        assert await closed_within(newest[0][0], 1), "the oldest stranger left made room for the peer"
        assert not any([await closed_within(reader, 0.05) for reader, _ in newest[1:]])
        assert (endpoint.authenticated_count, endpoint.unauthenticated_count) == (1, bound - 1)
        connection.close(), close_all(flood)
        await endpoint.close()

    asyncio.run(go())


def test_a_connection_has_at_most_max_in_flight_requests_started():
    async def go():
        echo = Echo(delay_s=0.01)
        endpoint, address = await opened(echo, max_in_flight=3)
        connection = await Connection.open(address, NODE, max_in_flight=100)
        await asyncio.gather(*(connection.request(frames.FETCH, b"x") for _ in range(30)))
        assert echo.calls == 30 and echo.most_running == 3
        connection.close()
        await endpoint.close()

    asyncio.run(go())


def test_a_wrong_secret_is_refused_before_any_frame_is_read():
    async def go():
        echo = Echo()
        endpoint, address = await opened(echo)
        forged = EndpointAddress(address.node_id, address.unix_path, address.host, address.port, b"x" * 32)
        for node_id in (NODE, "node-b"):
            with pytest.raises(NetworkError):
                await Connection.open(forged, node_id)
        await asyncio.sleep(0.05)
        assert echo.calls == 0 and endpoint.connection_count == 0
        await endpoint.close()

    asyncio.run(go())


def test_a_raw_socket_can_neither_write_nor_read():
    async def go():
        echo = Echo()
        endpoint, address = await opened(echo)
        reader, writer = await asyncio.open_connection(address.host, address.port)
        greeting = await reader.readexactly(len(handshake.MAGIC) + handshake.NONCE_BYTES)
        assert greeting.startswith(handshake.MAGIC)
        body = frames.encode_fetch_request(FetchRequest(0, 1 << 20))
        writer.write(frames.request_frame(1, frames.FETCH, body) * 8)  # frames where the proof should be
        assert await reader.read() == b""  # closed, nothing answered
        assert echo.calls == 0
        writer.close()
        await endpoint.close()

    asyncio.run(go())


def test_an_endpoint_that_cannot_prove_the_secret_is_refused():
    async def go():
        async def impostor(reader, writer):
            writer.write(handshake.MAGIC + b"n" * handshake.NONCE_BYTES)
            await reader.readexactly(handshake.NONCE_BYTES + handshake.PROOF_BYTES)
            writer.write(b"p" * handshake.PROOF_BYTES)
            await writer.drain()

        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(NetworkError, match="data plane connection"):
            await Connection.open(EndpointAddress(NODE, "", "127.0.0.1", port, b"s" * 32), "node-b")
        server.close()

    asyncio.run(go())


def test_an_oversized_or_unknown_frame_closes_the_connection_and_the_endpoint_serves_on(caplog):
    async def go():
        echo = Echo()
        endpoint, address = await opened(echo)
        for frame in (frames.SIZE.pack(frames.MAX_FRAME_BYTES + 1), frames.request_frame(1, 99, b"")):
            connection = await Connection.open(address, NODE)
            connection._writer.write(frame)
            with pytest.raises(NetworkError):
                await asyncio.wait_for(connection.request(frames.FETCH, b"after"), 5)
            assert connection.closed
        good = await Connection.open(address, NODE)
        assert bytes(await good.request(frames.FETCH, b"still serving")) == b"still serving"
        good.close()
        await endpoint.close()

    asyncio.run(go())
    warned = [r.getMessage() for r in caplog.records if "closing the data plane connection" in r.getMessage()]
    assert len(warned) == 2, warned
    assert f"a frame of {frames.MAX_FRAME_BYTES + 1} bytes, over the limit of {frames.MAX_FRAME_BYTES}" in warned[0]
    assert "99" in warned[1]  # the unknown kind


@pytest.mark.parametrize("max_in_flight", [1, 16])
def test_nothing_after_a_frame_that_does_not_parse_is_served_even_once_the_requests_before_it_end(max_in_flight):
    """The frames behind a bad one are never handed to the handler: not when the request
    in flight before it is answered or cancelled (which frees a slot), nor later."""
    async def go():
        echo = Echo(delay_s=0.1)
        endpoint, address = await opened(echo, max_in_flight=max_in_flight)
        connection = await Connection.open(address, NODE)
        in_flight = asyncio.ensure_future(connection.request(frames.FETCH, b"before"))
        await asyncio.sleep(0.02)  # started at the endpoint
        connection._writer.write(frames.request_frame(1, 99, b"") + frames.request_frame(2, frames.FETCH, b"after 1")
                                 + frames.request_frame(3, frames.FETCH, b"after 2"))  # fmt: skip
        if max_in_flight == 1:  # the bad frame is held back until the request before it is answered
            assert bytes(await asyncio.wait_for(in_flight, 5)) == b"before"
        else:  # read at once: the connection closes, the request in flight with it
            with pytest.raises(NetworkError):
                await asyncio.wait_for(in_flight, 5)
        await asyncio.sleep(0.3)  # what the end of the request before would have released
        assert echo.calls == 1, f"{echo.calls - 1} request(s) after the bad frame were served"
        connection.close()
        await endpoint.close()

    asyncio.run(go())


def test_requests_in_flight_fail_with_network_error_when_the_endpoint_goes():
    async def go():
        endpoint, address = await opened(Echo(delay_s=10))
        connection = await Connection.open(address, "node-b")
        waiting = [asyncio.ensure_future(connection.request(frames.FETCH, b"x")) for _ in range(3)]
        await asyncio.sleep(0.05)
        await endpoint.close()
        for request in waiting:
            with pytest.raises(NetworkError):
                await asyncio.wait_for(request, 5)
        with pytest.raises(NetworkError):
            await connection.request(frames.FETCH, b"later")

    asyncio.run(go())


def test_a_request_given_up_on_leaves_the_connection_usable():
    async def go():
        endpoint, address = await opened(Echo(delay_s=0.2))
        connection = await Connection.open(address, NODE)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(connection.request(frames.FETCH, b"slow"), 0.05)
        assert bytes(await connection.request(frames.FETCH, b"next")) == b"next"
        connection.close()
        await endpoint.close()

    asyncio.run(go())



def test_an_endpoint_closes_a_connection_idle_past_its_timeout_and_frees_its_place():
    async def go():
        endpoint = Endpoint(Echo(), "test", idle_timeout_s=0.3)
        address = await endpoint.open(NODE, "127.0.0.1")
        connection = await Connection.open(address, NODE)  # its own idle timeout: 9 minutes
        for _ in range(4):  # in use: requests every 0.1 s keep it open
            assert bytes(await connection.request(frames.FETCH, b"x")) == b"x"
            await asyncio.sleep(0.1)
        assert not connection.closed and endpoint.connection_count == 1
        await asyncio.sleep(0.6)
        assert endpoint.connection_count == 0, "the idle connection's place is free"
        assert connection.closed, "the peer saw the close at once, not at its next request"
        with pytest.raises(NetworkError):
            await connection.request(frames.FETCH, b"late")
        await endpoint.close()

    asyncio.run(go())


def test_a_request_in_flight_longer_than_the_idle_timeout_keeps_its_connection():
    async def go():
        endpoint = Endpoint(Echo(delay_s=0.05), "test", idle_timeout_s=0.2)  # b"slow": 0.5 s, a long poll
        address = await endpoint.open(NODE, "127.0.0.1")
        connection = await Connection.open(address, NODE, idle_timeout_s=0.2)
        assert bytes(await connection.request(frames.FETCH, b"slow")) == b"slow"
        assert not connection.closed and endpoint.connection_count == 1
        connection.close()
        await endpoint.close()

    asyncio.run(go())


def test_a_peer_closes_its_idle_connection_first_and_a_link_opens_a_new_one_when_needed(monkeypatch):
    empty = FetchResult(b"", 0, 0, 0, None, None)

    async def fetch_handler(kind: int, body: memoryview) -> tuple[bytes, bytes]:
        return frames.encode_fetch_answer_head(empty), b""

    opened_connections: list[Connection] = []
    original_open = Connection.open

    async def open_with_a_short_idle_timeout(address, node_id, name=""):
        connection = await original_open(address, node_id, name, idle_timeout_s=0.2)
        opened_connections.append(connection)
        return connection

    monkeypatch.setattr(Connection, "open", open_with_a_short_idle_timeout)

    class Replica:  # what ReplicaLink calls on the replica's actor handle
        def __init__(self, address):
            self.data_endpoint = type("Method", (), {"remote": staticmethod(self._address)})()
            self._value = address

        async def _address(self, node_id):
            return self._value

    async def go():
        endpoint, address = await opened(fetch_handler)  # its idle timeout: 10 minutes
        link = ReplicaLink(Replica(address), NODE, "test-partition")
        request = FetchRequest(0, 1 << 20)
        assert (await link.fetch(request)).high_watermark == 0
        await asyncio.sleep(0.5)
        assert opened_connections[0].closed and endpoint.connection_count == 0, "the peer closed it, idle"
        assert (await link.fetch(request)).high_watermark == 0, "the next request opened a new connection"
        assert len(opened_connections) == 2 and not opened_connections[1].closed
        link.close()
        await endpoint.close()

    asyncio.run(go())


def test_an_endpoint_lookup_that_never_returns_is_given_up_and_the_next_request_asks_again(monkeypatch):
    # The replica's actor never answers the first data_endpoint call (a lost reply, a node
    # cut off that Ray has not declared dead): requests queued behind that lookup must not
    # wait on it for good.
    from rayk.dataplane import replica_link

    monkeypatch.setattr(replica_link, "ENDPOINT_LOOKUP_TIMEOUT_MS", 200)
    empty = FetchResult(b"", 0, 0, 0, None, None)

    async def fetch_handler(kind: int, body: memoryview) -> tuple[bytes, bytes]:
        return frames.encode_fetch_answer_head(empty), b""

    class Replica:  # the first lookup hangs, later ones answer
        def __init__(self, address):
            self.data_endpoint = type("Method", (), {"remote": staticmethod(self._address)})()
            self._value, self.lookups = address, 0

        async def _address(self, node_id):
            self.lookups += 1
            if self.lookups == 1:
                await asyncio.Event().wait()
            return self._value

    async def go():
        endpoint, address = await opened(fetch_handler)
        replica = Replica(address)
        link = ReplicaLink(replica, NODE, "test-partition")
        request = FetchRequest(0, 1 << 20)
        first, queued = link.fetch(request), link.fetch(request)
        outcomes = await asyncio.wait_for(asyncio.gather(first, queued, return_exceptions=True), 5)
        assert isinstance(outcomes[0], NetworkError) and "did not give its data plane endpoint" in str(outcomes[0])
        assert outcomes[1].high_watermark == 0, "the queued request asked again and got through"
        assert replica.lookups == 2
        link.close()
        await endpoint.close()

    asyncio.run(go())


def test_an_endpoint_bound_to_every_address_is_given_out_at_the_nodes_ip():
    assert [reachable_host(h, "10.0.0.7") for h in ("", "0.0.0.0", "::", "127.0.0.1")] == [
        "10.0.0.7", "10.0.0.7", "10.0.0.7", "127.0.0.1"]


# ---------------------------------------------------------------------------- TLS (tls.py)


@pytest.fixture(scope="module")
def keystores(tmp_path_factory):
    """The brokers' keystore (a CA-signed certificate, as a listener's), and another one from
    the same CA, which a peer must not take for it."""
    import trustme

    directory, ca = tmp_path_factory.mktemp("dataplane-tls"), trustme.CA()
    paths = []
    for name in ("brokers.pem", "impostor.pem"):
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(directory / name))
        paths.append(tls.KeyStore(str(directory / name)))
    return paths


async def opened_over_tls(handler, keystore: tls.KeyStore) -> tuple[Endpoint, EndpointAddress]:
    endpoint = Endpoint(handler, "test")
    return endpoint, await endpoint.open(NODE, "127.0.0.1", keystore=keystore)


def test_tcp_goes_over_tls_pinned_to_the_endpoints_certificate_and_unix_sockets_stay_plain(keystores):
    async def go():
        endpoint, address = await opened_over_tls(Echo(), keystores[0])
        assert address.tls_certificate.startswith("-----BEGIN CERTIFICATE-----")
        over_tcp, over_unix = await Connection.open(address, "node-b"), await Connection.open(address, NODE)
        for connection in (over_tcp, over_unix):
            assert bytes(await connection.request(frames.FETCH, b"records")) == b"records"
        assert over_tcp._writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        assert over_unix._writer.get_extra_info("ssl_object") is None
        over_tcp.close(), over_unix.close()
        await endpoint.close()

    asyncio.run(go())


def test_a_peer_refuses_an_endpoint_whose_certificate_is_not_the_one_ray_gave_it(keystores):
    async def go():
        endpoint, address = await opened_over_tls(Echo(), keystores[0])
        impostor, impostor_address = await opened_over_tls(Echo(), keystores[1])
        # The right secret and port, another certificate from the same CA: not the endpoint.
        swapped = dataclasses.replace(address, tls_certificate=impostor_address.tls_certificate)
        with pytest.raises(NetworkError, match="certificate"):
            await Connection.open(swapped, "node-b")
        await endpoint.close(), await impostor.close()

    asyncio.run(go())


def test_a_plain_tcp_peer_gets_neither_the_greeting_nor_an_answer_from_a_tls_endpoint(keystores, caplog):
    async def go():
        echo = Echo()
        endpoint, address = await opened_over_tls(echo, keystores[0])
        reader, writer = await asyncio.open_connection(address.host, address.port)
        writer.write(frames.request_frame(1, frames.FETCH, b"x" * 64) * 4)  # no TLS ClientHello
        received = await asyncio.wait_for(reader.read(), 10)
        assert handshake.MAGIC not in received and echo.calls == 0
        writer.close()
        await endpoint.close()

    asyncio.run(go())
    assert "refused a data plane connection" in caplog.text  # the failed TLS handshake is logged as a refusal


def test_a_keystore_that_does_not_load_or_cannot_be_pinned_is_a_configuration_error(tmp_path, keystores):
    (tmp_path / "broken.pem").write_text("not a key")
    # A leaf labelled TRUSTED CERTIFICATE: the peer must not end up pinning the next certificate (the CA).
    with open(keystores[0].location) as f:
        (tmp_path / "trusted.pem").write_text(f.read().replace("CERTIFICATE-----", "TRUSTED CERTIFICATE-----", 2))
    for name in ("missing.pem", "broken.pem", "trusted.pem"):
        with pytest.raises(errors.InvalidConfigurationError, match="ssl.keystore.location"):
            tls.server_context(tls.KeyStore(str(tmp_path / name)))


def test_the_data_plane_serves_the_first_tls_listeners_keystore(tmp_path):
    from rayk.config import BrokerConfig

    plain = BrokerConfig.from_properties({"listeners": "PLAINTEXT://127.0.0.1:0"})
    assert tls.data_plane_keystore(plain) is None
    (tmp_path / "k.pem").write_text("")
    mixed = BrokerConfig.from_properties({
        "listeners": "PLAINTEXT://127.0.0.1:0,SECURE://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SECURE:SSL",
        "listener.name.secure.ssl.keystore.location": str(tmp_path / "k.pem"),
        "listener.name.secure.ssl.key.password": "pw",
    })
    assert tls.data_plane_keystore(mixed) == tls.KeyStore(str(tmp_path / "k.pem"), "pw")
    assert "pw" not in repr(tls.data_plane_keystore(mixed))


def test_both_ends_of_a_tcp_connection_keep_it_alive_so_a_vanished_node_is_found_out():
    async def go():
        endpoint, address = await opened(Echo())
        connection = await Connection.open(address, "node-b")
        await connection.request(frames.FETCH, b"x")
        (accepted,) = endpoint._connections
        for sock in (connection._writer.get_extra_info("socket"), accepted.get_extra_info("socket")):
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            if hasattr(socket, "TCP_KEEPIDLE"):  # Linux: minutes, not the default 2 hours
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == endpoint_module.KEEPALIVE_IDLE_S
        connection.close()
        await endpoint.close()

    asyncio.run(go())


# ---------------------------------------------------------------------------- sendfile (answer_writer.py)


class SlicedLog:
    """A handler that answers like a leader's fetch: a slice of a real log's file, or a few
    bytes (b"small"). b"cut": the log is then truncated and grown again with other batches,
    as a leader stepping down does (b"cut later": once the answer's send has begun)."""

    def __init__(self, directory, megabytes: int) -> None:
        from rayk.storage import Log

        self.log = Log(directory)
        for _ in range(megabytes * 64):
            self.log.append_as_leader(self.batch(b"old"), 0)
        self.whole = self.log.read(0, megabytes << 21).records
        self.slices: list = []

    @staticmethod
    def batch(tag: bytes) -> bytes:
        from rayk.storage.records import SimpleRecord, build_batch

        return build_batch([SimpleRecord(tag * (16384 // len(tag)))])

    def cut_and_grow(self) -> None:
        end = self.log.log_end_offset
        self.log.truncate_to(end // 2)
        while self.log.log_end_offset <= end:  # a file longer than before: no short read gives it away
            self.log.append_as_leader(self.batch(b"new leader"), 1)

    async def __call__(self, kind: int, body: memoryview) -> tuple[bytes, object]:
        if bytes(body) == b"small":
            return b"head", b"small answer"
        found = self.log.read(0, len(self.whole), slice_min_bytes=1)
        self.slices.append(found.records)
        if bytes(body) == b"cut":
            self.cut_and_grow()
        elif bytes(body) == b"cut later":
            asyncio.get_running_loop().call_soon(self.cut_and_grow)
        return b"head", found.records


@pytest.mark.parametrize("way", ["unix socket", "tcp", "tls", "sendfile off"])
def test_a_log_slice_is_sent_from_the_file_by_sendfile_and_read_where_it_cannot_be(
    tmp_path, keystores, monkeypatch, way, endpoint_path
):
    sendfile_calls, slices_read = [], []
    real_sendfile, real_read = os.sendfile, FileSlice.read
    monkeypatch.setattr(os, "sendfile", lambda *args: sendfile_calls.append(args[3]) or real_sendfile(*args))
    monkeypatch.setattr(FileSlice, "read", lambda self: slices_read.append(len(self)) or real_read(self))

    async def go():
        handler = SlicedLog(tmp_path, megabytes=4)
        if way == "tls":
            endpoint, address = await opened_over_tls(handler, keystores[0])
        else:
            endpoint = Endpoint(handler, "test", sendfile=way != "sendfile off")
            address = await endpoint.open(NODE, "127.0.0.1")
        connection = await Connection.open(address, "node-b" if way in ("tcp", "tls") else NODE)
        answers = await asyncio.gather(*(connection.request(frames.FETCH, b) for b in [b"all", b"small"] * 3))
        assert [bytes(a) for a in answers] == [b"head" + handler.whole, b"headsmall answer"] * 3
        connection.close()
        await endpoint.close()
        handler.log.close()

    asyncio.run(go())
    by_sendfile = way in ("unix socket", "tcp")
    assert bool(slices_read) != by_sendfile  # never read into the process where sendfile can send it
    if endpoint_path == "python":
        assert bool(sendfile_calls) == by_sendfile  # the native side calls sendfile(2) itself


@pytest.mark.parametrize("over_tls", [False, True], ids=["sendfile", "tls"])
def test_a_slice_its_log_truncated_before_it_was_sent_fails_alone_and_the_connection_serves_on(
    tmp_path, keystores, over_tls
):
    """Truncated and grown again with another leader's batches before its send began: the
    request alone fails NOT_LEADER_OR_FOLLOWER, never answered with those batches."""

    async def go():
        handler = SlicedLog(tmp_path, megabytes=1)
        endpoint, address = await (opened_over_tls(handler, keystores[0]) if over_tls else opened(handler))
        connection = await Connection.open(address, "node-b" if over_tls else NODE)
        with pytest.raises(errors.NotLeaderOrFollowerError):
            await asyncio.wait_for(connection.request(frames.FETCH, b"cut"), 10)
        answer = await connection.request(frames.FETCH, b"all")
        assert bytes(answer) == b"head" + handler.log.read(0, len(handler.whole)).records
        assert b"new leader" in bytes(answer)
        connection.close()
        await endpoint.close()
        handler.log.close()

    asyncio.run(go())


def test_a_slice_its_log_truncated_while_it_was_sent_aborts_the_connection_and_nothing_follows_it(tmp_path):
    """Cut part way, the frame is left short and the connection aborted: neither it nor the
    answer queued behind it reaches the peer as a whole frame, and a new connection serves."""

    async def go():
        handler = SlicedLog(tmp_path, megabytes=4)
        endpoint, address = await opened(handler)
        connection = await Connection.open(address, NODE)
        big = asyncio.ensure_future(connection.request(frames.FETCH, b"cut later"))
        await asyncio.sleep(0)
        small = asyncio.ensure_future(connection.request(frames.FETCH, b"small"))
        for request in (big, small):
            with pytest.raises(NetworkError):
                await asyncio.wait_for(request, 10)
        connection.close()
        connection = await Connection.open(address, NODE)
        assert bytes(await connection.request(frames.FETCH, b"small")) == b"headsmall answer"
        connection.close()
        await endpoint.close()
        handler.log.close()
        assert all(s.fd == -1 for s in handler.slices), "every slice's descriptor was given back"

    asyncio.run(go())


@pytest.fixture(scope="module")
def failing_disk(tmp_path_factory):
    """A directory on a disk that fails reads with EIO on demand (tests/faults/failing_fs.py,
    FUSE): (mount point, control file). Needs root and /dev/fuse."""
    import subprocess
    import sys

    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse for a disk that fails on demand (tests/faults/failing_fs.py)")
    pytest.importorskip("mfusepy")
    base = tmp_path_factory.mktemp("failing-disk")
    backing, mountpoint, control = base / "backing", base / "mnt", base / "control"
    backing.mkdir()
    mountpoint.mkdir()
    server = subprocess.Popen([sys.executable, "-m", "tests.faults.failing_fs", str(backing), str(mountpoint),
                               str(control)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint):
            assert server.poll() is None and time.monotonic() < deadline, "the failing disk did not mount"
            time.sleep(0.05)
        yield mountpoint, control
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        server.terminate()
        server.wait(10)


def test_an_io_error_of_the_log_file_during_a_sendfile_is_reported_and_aborts_the_connection(
    tmp_path, failing_disk, endpoint_path
):
    """A log file whose device fails reads (EIO) while its slice is sent: the error is the
    log's to handle (`FileSlice.read_failed`), and the connection is aborted (the answer's
    size is written already). Both the Python and the native sendfile meet a real EIO here:
    the slice's records are on failing_fs.py's disk, in a file it serves with direct I/O
    (".probe"), so that no page cache answers the read in its place."""
    from tests.faults.failing_fs import set_fault

    mountpoint, control = failing_disk
    failures: list[OSError] = []

    async def go():
        handler = SlicedLog(tmp_path, megabytes=1)
        on_disk = mountpoint / f"{endpoint_path}-segment.probe"
        on_disk.write_bytes(handler.log.read(0, 1 << 30).records)  # the slice's bytes at their offsets, and more

        async def reporting(kind, body):
            head, records = await handler(kind, body)
            records.read_failed = failures.append
            os.close(records.fd)
            records.fd = os.open(on_disk, os.O_RDONLY)
            return head, records

        endpoint, address = await opened(reporting)
        connection = await Connection.open(address, NODE)
        set_fault(control, ["read"], on_disk.name)
        await asyncio.sleep(0.3)  # the file system reads its control file every 50 ms
        try:
            with pytest.raises(NetworkError):
                await asyncio.wait_for(connection.request(frames.FETCH, b"all"), 10)
        finally:
            set_fault(control)
        connection.close()
        await endpoint.close()
        handler.log.close()

    asyncio.run(go())
    assert [e.errno for e in failures] == [errno.EIO]
