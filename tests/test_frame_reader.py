"""FrameReader (rayk/dataplane/frame_reader.py) against the stream it was fed: whatever the
event loop's reads and the reader's sizes, every read gives the next bytes of the stream,
large reads in buffers of their own, and flow control pauses a full reader and resumes it.

The event loop is played by hand here (get_buffer, write into it, buffer_updated), as
uvloop and asyncio's transports do; the data plane's tests run it over real sockets."""

from __future__ import annotations

import asyncio
import os
import random
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.dataplane import frames, streams
from rayk.dataplane.frame_reader import OWN_BUFFER_FROM_BYTES, STAGING_BYTES, FrameProtocol, FrameReader


class FakeTransport:
    def __init__(self) -> None:
        self.reading = True
        self.pauses = 0

    def pause_reading(self) -> None:
        assert self.reading, "paused twice"
        self.reading, self.pauses = False, self.pauses + 1

    def resume_reading(self) -> None:
        assert not self.reading, "resumed while reading"
        self.reading = True

    def get_extra_info(self, name: str) -> None:
        return None


def connected() -> tuple[FrameProtocol, FakeTransport]:
    protocol = FrameProtocol(FrameReader())
    transport = FakeTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport


def deliver(protocol: FrameProtocol, data: bytes) -> None:
    """One read of the loop's that fills `len(data)` bytes of the buffer it is handed."""
    buffer = protocol.get_buffer(-1)
    assert len(buffer) >= len(data)
    buffer[:len(data)] = data
    del buffer  # the loop lets go of the view before it tells the protocol
    protocol.buffer_updated(len(data))


async def feed(protocol: FrameProtocol, transport: FakeTransport, data: bytes, chunks: list[int], yields: list[bool],
               eof: bool = True) -> None:  # fmt: skip
    """What an event loop does: while reading, asks for a buffer and reads up to a chunk
    into it."""
    position, step = 0, 0
    while position < len(data):
        if not transport.reading:
            await asyncio.sleep(0)
            continue
        buffer = protocol.get_buffer(-1)
        assert len(buffer) > 0, "an empty buffer handed to the loop"
        n = min(len(buffer), chunks[step % len(chunks)], len(data) - position)
        buffer[:n] = data[position:position + n]
        del buffer  # the loop lets go of the view before it tells the protocol
        protocol.buffer_updated(n)
        position += n
        if yields[step % len(yields)]:
            await asyncio.sleep(0)
        step += 1
    if eof:
        protocol.eof_received()


sizes = st.one_of(st.integers(0, 64), st.integers(0, OWN_BUFFER_FROM_BYTES + 10), st.integers(0, 3 * STAGING_BYTES))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), reads=st.lists(sizes, min_size=1, max_size=12),
       chunks=st.lists(st.integers(1, 3 * STAGING_BYTES), min_size=1, max_size=6),
       yields=st.lists(st.booleans(), min_size=1, max_size=6), extra=st.integers(-300, 300))  # fmt: skip
def test_reads_give_the_stream_in_order_whatever_the_loops_reads(seed, reads, chunks, yields, extra):
    data = random.Random(seed).randbytes(max(0, sum(reads) + extra))

    async def main() -> tuple[list, asyncio.IncompleteReadError | None, int]:
        protocol, transport = connected()
        feeding = asyncio.ensure_future(feed(protocol, transport, data, chunks, yields))
        got: list = []
        ended = None
        try:
            for n in reads:
                got.append(await protocol.reader.readexactly(n))
        except asyncio.IncompleteReadError as e:
            ended = e
        await feeding
        return got, ended, transport.pauses

    got, ended, _ = asyncio.run(main())
    position = 0
    for n, chunk in zip(reads, got):
        assert bytes(chunk) == data[position:position + n]
        if n >= OWN_BUFFER_FROM_BYTES:
            assert isinstance(chunk, (bytes, memoryview)) and (isinstance(chunk, bytes) or chunk.readonly)
        else:
            assert type(chunk) is bytes
        position += n
    if ended is None:
        assert len(got) == len(reads)
    else:
        assert len(got) < len(reads) and position + reads[len(got)] > len(data)
        assert ended.partial == data[position:] and ended.expected == reads[len(got)]


def test_a_large_read_gets_a_buffer_of_its_own_filled_by_the_loop():
    """The bytes after a large read's end go to staging, not into its buffer."""

    async def main() -> None:
        protocol, transport = connected()
        data = random.Random(1).randbytes(STAGING_BYTES * 2 + 100)
        reading = asyncio.ensure_future(protocol.reader.readexactly(STAGING_BYTES * 2))
        await asyncio.sleep(0)
        assert len(protocol.get_buffer(-1)) == STAGING_BYTES * 2  # its own buffer, sized to its end
        deliver(protocol, data[:STAGING_BYTES * 2])
        deliver(protocol, data[STAGING_BYTES * 2:])  # the loop reads on before the reader has run
        assert bytes(await reading) == data[:STAGING_BYTES * 2]
        assert await protocol.reader.readexactly(100) == data[STAGING_BYTES * 2:]

    asyncio.run(main())


def test_a_full_staging_buffer_pauses_reading_until_it_is_read():
    async def main() -> None:
        protocol, transport = connected()
        assert len(protocol.get_buffer(-1)) == STAGING_BYTES
        deliver(protocol, b"x" * STAGING_BYTES)
        assert not transport.reading
        assert await protocol.reader.readexactly(10) == b"x" * 10
        assert transport.reading
        assert len(protocol.get_buffer(-1)) == 10  # compacted: the 10 bytes read are free again

    asyncio.run(main())


def test_a_read_cancelled_part_way_through_its_own_buffer_leaves_the_stream_broken():
    """Its bytes so far went with its buffer: a later read would be out of step."""

    async def main() -> None:
        protocol, _ = connected()
        reading = asyncio.ensure_future(protocol.reader.readexactly(OWN_BUFFER_FROM_BYTES * 2))
        await asyncio.sleep(0)
        deliver(protocol, b"12345")
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        deliver(protocol, b"the rest of the cancelled frame")
        with pytest.raises(ConnectionAbortedError):
            await protocol.reader.readexactly(4)

    asyncio.run(main())


def test_a_small_read_cancelled_while_waiting_loses_nothing():
    async def main() -> None:
        protocol, _ = connected()
        reading = asyncio.ensure_future(protocol.reader.readexactly(8))
        await asyncio.sleep(0)
        deliver(protocol, b"1234")
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        deliver(protocol, b"5678")
        assert await protocol.reader.readexactly(8) == b"12345678"

    asyncio.run(main())


def test_a_lost_connection_fails_the_read_and_drains_waiting_writers():
    async def main() -> None:
        protocol, _ = connected()
        reading = asyncio.ensure_future(protocol.reader.readexactly(4))
        protocol.pause_writing()
        draining = asyncio.ensure_future(protocol._drain_helper())
        await asyncio.sleep(0)
        protocol.connection_lost(ConnectionResetError("reset"))
        with pytest.raises(ConnectionResetError):
            await reading
        with pytest.raises(ConnectionResetError):
            await draining
        with pytest.raises(ConnectionResetError):
            await protocol._drain_helper()
        with pytest.raises(ConnectionResetError):
            await protocol._get_close_waiter(None)

    asyncio.run(main())


def test_two_readers_at_once_is_a_bug_as_in_asyncio():
    async def main() -> None:
        protocol, _ = connected()
        first = asyncio.ensure_future(protocol.reader.readexactly(4))
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError):
            await protocol.reader.readexactly(4)
        first.cancel()

    asyncio.run(main())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_peer_that_shuts_its_sending_side_still_gets_its_answers(loop):
    """As with StreamReaderProtocol: the end of a plain connection's stream leaves it open
    for writing (uvloop would raise on a write to a transport that closed itself)."""

    async def main() -> bytes:
        answered = asyncio.Event()

        async def serve(reader: FrameReader, writer: asyncio.StreamWriter) -> None:
            request = await reader.readexactly(4)
            await asyncio.sleep(0.01)  # the peer's end of stream has come by now
            writer.write(b"re:" + bytes(request))
            await writer.drain()
            writer.close()
            answered.set()

        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "s")
            server = await streams.start_unix_frame_server(serve, path)
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"ping")
            writer.write_eof()
            answer = await asyncio.wait_for(reader.read(), 5)
            await asyncio.wait_for(answered.wait(), 5)
            writer.close()
            server.close()
            return answer

    if loop == "uvloop":
        import uvloop

        assert uvloop.run(main()) == b"re:ping"
    else:
        assert asyncio.run(main()) == b"re:ping"


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), bodies=st.lists(sizes, min_size=0, max_size=10),
       chunks=st.lists(st.integers(1, 3 * STAGING_BYTES), min_size=1, max_size=6),
       yields=st.lists(st.booleans(), min_size=1, max_size=6), staged_first=st.integers(0, 100),
       ending=st.sampled_from(["eof", "cut", "oversize", "broken"]))  # fmt: skip
def test_frames_pushed_as_they_come_are_the_frames_sent(seed, bodies, chunks, yields, staged_first, ending):
    """deliver_frames: every whole frame to on_frame, in order, then on_end once: at the
    end of the stream, part way through a frame, at a frame over the bound (nothing after
    it), or when the connection breaks."""
    rng = random.Random(seed)
    sent = [rng.randbytes(n) for n in bodies]
    limit = 3 * STAGING_BYTES
    data = b"".join(frames.SIZE.pack(len(b)) + b for b in sent)
    if ending == "cut":
        data += frames.SIZE.pack(100) + b"part"
    elif ending == "oversize":
        data += frames.SIZE.pack(limit + 1) + b"never read" + frames.SIZE.pack(1) + b"x"

    async def main() -> tuple[list[bytes], list[str]]:
        protocol, transport = connected()
        got: list[bytes] = []
        ended: list[str] = []
        first = min(staged_first, len(data))  # some of it staged before push mode starts
        if first:
            deliver(protocol, data[:first])
        protocol.reader.deliver_frames(lambda body: got.append(bytes(body)), ended.append, limit)
        await feed(protocol, transport, data[first:], chunks, yields, eof=False)
        if ending == "broken":
            protocol.connection_lost(ConnectionResetError("reset"))
        elif ending != "oversize":
            protocol.eof_received()
        return got, ended

    got, ended = asyncio.run(main())
    assert got == sent
    assert ended == [{"eof": "the peer closed the connection", "cut": "the peer closed the connection",
                      "oversize": f"a frame of {limit + 1} bytes",
                      "broken": "the connection broke: reset"}[ending]]  # fmt: skip


def test_a_frame_callback_that_raises_ends_the_delivery_logged(caplog):
    async def main() -> tuple[list[bytes], list[str]]:
        protocol, _ = connected()
        got: list[bytes] = []
        ended: list[str] = []

        def take(body: bytes | memoryview) -> None:
            if bytes(body) == b"bad":
                raise ValueError("a bug")
            got.append(bytes(body))

        protocol.reader.deliver_frames(take, ended.append, 1000)
        deliver(protocol, b"".join(frames.SIZE.pack(len(b)) + b for b in [b"one", b"bad", b"never"]))
        return got, ended

    got, ended = asyncio.run(main())
    assert got == [b"one"] and ended == ["a frame that could not be taken: ValueError: a bug"]
    assert "callback raised" in caplog.text


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), bodies=st.lists(sizes, min_size=0, max_size=10),
       chunks=st.lists(st.integers(1, 3 * STAGING_BYTES), min_size=1, max_size=6),
       yields=st.lists(st.booleans(), min_size=1, max_size=6), ending=st.sampled_from(["eof", "broken"]))  # fmt: skip
def test_frames_held_back_come_in_order_once_released_and_the_end_after_them(seed, bodies, chunks, yields, ending):
    """hold_frames / release_frames (the endpoint's bound on requests in flight): nothing is
    handed out while held, every frame comes in order once released (the transport pausing
    while staging is full meanwhile), and the end of the stream is told only once released,
    after the frames that came before it."""
    rng = random.Random(seed)
    sent = [rng.randbytes(n) for n in bodies]
    data = b"".join(frames.SIZE.pack(len(b)) + b for b in sent)

    async def main() -> tuple[list[bytes], list[str]]:
        protocol, transport = connected()
        reader = protocol.reader
        got: list[bytes] = []
        ended: list[str] = []
        held = False

        def take(body: bytes | memoryview) -> None:
            nonlocal held
            assert not held, "a frame handed out while held"
            got.append(bytes(body))
            if rng.random() < 0.5:
                held = True
                reader.hold_frames()

        reader.deliver_frames(take, ended.append, 3 * STAGING_BYTES)
        feeding = asyncio.ensure_future(feed(protocol, transport, data, chunks, yields, eof=False))
        while not feeding.done():  # answers written now and then, each releasing the frames
            await asyncio.sleep(0)
            if held and rng.random() < 0.3:
                held = False
                reader.release_frames()
        await feeding
        if ending == "broken":
            protocol.connection_lost(ConnectionResetError("reset"))
        else:
            protocol.eof_received()
        while held:
            assert ended == [], "the end told while frames are held back"
            held = False
            reader.release_frames()
        return got, ended

    got, ended = asyncio.run(main())
    assert got == sent
    assert ended == ["the connection broke: reset" if ending == "broken" else "the peer closed the connection"]


def test_a_reader_stopped_hands_out_nothing_more_even_when_released():
    """stop_frames (the endpoint stopped serving the connection): the frames staged behind
    it and those that come after are never handed out, a release_frames (an answer the
    endpoint was still writing) included, and no end is told."""
    async def main() -> tuple[list[bytes], list[str]]:
        protocol, _ = connected()
        reader = protocol.reader
        got: list[bytes] = []
        ended: list[str] = []

        def take(body: bytes | memoryview) -> None:
            got.append(bytes(body))
            reader.hold_frames()

        reader.deliver_frames(take, ended.append, 1000)
        deliver(protocol, b"".join(frames.SIZE.pack(len(b)) + b for b in [b"one", b"two"]))
        reader.stop_frames()
        reader.release_frames()
        deliver(protocol, frames.SIZE.pack(5) + b"three")
        protocol.eof_received()
        return got, ended

    assert asyncio.run(main()) == ([b"one"], [])
