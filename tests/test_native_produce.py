"""The native produce path (rayk._native, native/) is held to the Python one it replaces:
its Produce response frames to data_responses.produce_frame (so to kio's), its data plane
PRODUCE frames to frames.py's, and its reading of a replica's answers to frames.py's, for
any values; then, against a real data plane Endpoint, it appends a partition's requests in
the order they were submitted, one frame in flight per partition with the rest coalesced,
answers each partition with its replica's result or error, and survives the replica's
connection breaking and its endpoint lookup failing."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rayk.errors
from rayk.dataplane import frames
from rayk.dataplane.endpoint import Endpoint
from rayk.dataplane.frames import ProduceRequest, ProduceResult
from rayk.errors import InvalidRecordError, KafkaError, NotLeaderOrFollowerError, RecordError, UnknownTopicOrPartitionError
from rayk import native_paths
from rayk.net import native_produce
from rayk.net.api_versions import PRODUCE
from rayk.net.codec import RequestHead
from rayk.net.data_responses import produce_frame
from rayk.net.native_produce import NativeProduce, error_table, with_throttle

_native = pytest.importorskip("rayk._native", reason="rayk._native is built where cargo is installed (setup.py)")

ERROR_CLASSES = sorted(
    (c for c in vars(rayk.errors).values() if isinstance(c, type) and issubclass(c, KafkaError) and c is not KafkaError),
    key=lambda c: c.__name__,
)
int32 = st.integers(-(2**31), 2**31 - 1)
offsets = st.integers(-1, 2**62)
texts = st.text(max_size=30)
names = st.text(min_size=1, max_size=20)

answer = st.one_of(
    st.tuples(int32, st.just(0), st.none(), offsets, st.one_of(st.just(-1), st.integers(0, 2**43)), offsets, st.just([])),
    st.tuples(int32, st.sampled_from([c.code for c in ERROR_CLASSES]), texts, st.just(-1), st.just(-1), st.just(-1),
              st.lists(st.tuples(st.integers(0, 2**31 - 1), texts), max_size=4)),
)


def python_frame(version: int, correlation_id: int, topics: list) -> bytes:
    values = {"responses": [
        {"name": name, "partition_responses": [
            {"index": i, "error_code": code, "error_message": message, "base_offset": base, "log_append_time": time,
             "log_start_offset": start,
             "record_errors": [{"batch_index": b, "batch_index_error_message": m} for b, m in record_errors]}
            for i, code, message, base, time, start, record_errors in partitions]}
        for name, partitions in topics]}
    return produce_frame(RequestHead(PRODUCE, version, correlation_id), values)


@settings(max_examples=300, deadline=None)
@given(st.integers(3, 12), int32, st.lists(st.tuples(names, st.lists(answer, max_size=4)), max_size=3))
def test_the_response_frame_is_the_python_paths_for_every_version(version, correlation_id, topics):
    assert _native.encode_produce_response(version, correlation_id, topics) == python_frame(version, correlation_id, topics)


@given(st.integers(3, 12), st.integers(-(2**31), 2**31 - 1))
def test_the_throttle_time_is_set_in_the_frame_the_native_path_wrote(version, throttle_ms):
    topics = [("t", [(0, 0, None, 5, -1, 0, [])])]
    frame = with_throttle(_native.encode_produce_response(version, 3, topics), version, throttle_ms)
    values = {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "base_offset": 5, "log_append_time": -1, "log_start_offset": 0}]}], "throttle_time": throttle_ms}
    assert frame == produce_frame(RequestHead(PRODUCE, version, 3), values)


def test_versions_the_native_response_does_not_cover_are_refused():
    for version in (2, 13):
        with pytest.raises(ValueError):
            _native.encode_produce_response(version, 1, [])


produce_request = st.tuples(st.binary(max_size=200), st.sampled_from([-1, 0, 1]), st.integers(0, 2**31 - 1),
                            st.one_of(st.none(), st.text(max_size=20)), st.sampled_from([1, 2]))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**31 - 1), st.lists(produce_request, min_size=1, max_size=5))
def test_a_data_plane_produce_frame_is_frames_pys(correlation_id, requests):
    body = frames.encode_produce_request([ProduceRequest(*r) for r in requests])
    expected = frames.request_frame(correlation_id, frames.PRODUCE, b"".join(body))
    assert _native.encode_produce_request(correlation_id, requests) == expected


result = st.one_of(
    st.builds(ProduceResult, offsets, offsets, offsets),
    st.builds(lambda cls, m: ProduceResult(-1, -1, -1, cls(m)), st.sampled_from(ERROR_CLASSES), texts),
    st.builds(lambda m, errs: ProduceResult(-1, -1, -1, InvalidRecordError(m, record_errors=[RecordError(*e) for e in errs])),
              texts, st.lists(st.tuples(st.integers(0, 2**31 - 1), texts), min_size=1, max_size=3)),
)


def as_python_reads(body: bytes, count: int):
    """frames.py's reading of an answer body, in the shape read_produce_answer returns."""
    correlation_id, outcome = frames.ANSWER_HEADER.unpack_from(body)
    rest = body[frames.ANSWER_HEADER.size:]
    if outcome not in (frames.ANSWERED, frames.FAILED):  # connection.py breaks the connection
        raise frames.FrameError(f"outcome {outcome}")
    if outcome == frames.FAILED:
        e = frames.decode_failed_answer(rest)
        return (e.code, str(e))
    results = frames.decode_produce_answer(rest)
    if len(results) != count:
        raise frames.FrameError("count")
    return [(r.base_offset, r.log_append_time_ms, r.log_start_offset, None) if r.error is None else
            (r.error.code, str(r.error), [(e.batch_index, e.message) for e in r.error.record_errors]) for r in results]


def native_reads(body: bytes, count: int):
    return _native.read_produce_answer(body, 7, count, error_table(), rayk.errors.MAX_RECORD_ERRORS)


@settings(max_examples=300, deadline=None)
@given(st.lists(result, min_size=1, max_size=4), st.data())
def test_a_replicas_answer_reads_as_frames_py_reads_it_and_any_damage_is_refused_by_both(results, data):
    body = frames.ANSWER_HEADER.pack(7, frames.ANSWERED) + frames.encode_produce_answer(results)
    assert native_reads(body, len(results)) == as_python_reads(body, len(results))
    damaged = bytearray(body)
    if data.draw(st.booleans()):
        damaged = damaged[:data.draw(st.integers(0, len(body) - 1))]
    else:
        at = data.draw(st.integers(0, len(body) - 1))
        damaged[at] = data.draw(st.integers(0, 255))
    try:
        python = as_python_reads(bytes(damaged), len(results))
    except (frames.FrameError, Exception):
        python = None
    if python is None or bytes(damaged[:4]) != body[:4]:
        with pytest.raises(ValueError):
            native_reads(bytes(damaged), len(results))
    else:
        assert native_reads(bytes(damaged), len(results)) == python


def test_a_failed_answer_and_an_unknown_error_class_read_as_frames_py_reads_them():
    failed = frames.failed_answer_frame(7, NotLeaderOrFollowerError("gone"))[4:]
    assert native_reads(failed, 3) == (6, "NOT_LEADER_OR_FOLLOWER: gone")
    unknown = frames.ANSWER_HEADER.pack(7, frames.FAILED) + b"\x00\x08Bogus\x00hi"
    assert native_reads(unknown, 1) == (-1, str(frames.decode_failed_answer(unknown[5:])))
    with pytest.raises(ValueError, match="not the one in flight"):
        native_reads(frames.ANSWER_HEADER.pack(8, frames.ANSWERED) + frames.encode_produce_answer([]), 0)


# ---------------------------------------------------------------- against an Endpoint


class FakeReplica:
    """A partition replica's data plane: PRODUCE appended in order, answered with the next
    offsets; `hold` keeps its answers back (so requests coalesce behind the one in flight),
    `fail_with` answers every request with an error, `close_next` breaks the connection."""

    def __init__(self) -> None:
        self.log: list[bytes] = []
        self.frames: list[int] = []  # requests per PRODUCE frame
        self.hold = asyncio.Event()
        self.hold.set()
        self.fail_with: KafkaError | None = None  # each request's result
        self.raise_with: KafkaError | None = None  # the whole frame's (a FAILED answer)
        self.endpoint = Endpoint(self.serve, "fake")
        self.lookups = 0

    async def serve(self, kind: int, body: memoryview) -> tuple[bytes, bytes]:
        assert kind == frames.PRODUCE
        requests = frames.decode_produce_request(body)
        self.frames.append(len(requests))
        await self.hold.wait()
        if self.raise_with is not None:
            raise self.raise_with
        results = []
        for r in requests:
            if self.fail_with is not None:
                results.append(ProduceResult(-1, -1, -1, self.fail_with))
            else:
                results.append(ProduceResult(len(self.log), -1, 0))
                self.log.append(bytes(r.records))
        return frames.encode_produce_answer(results), b""

    async def address(self):
        self.lookups += 1
        return await self.endpoint.open("node", "127.0.0.1", tcp=False)


def partition_answer(frame: bytes, version: int = 9) -> list[tuple]:
    from rayk.net.codec import response_class
    from kio.serial import entity_reader
    cls = response_class(PRODUCE, version)
    header, size = entity_reader(cls.__header_schema__)(frame[4:], 0)
    body, _ = entity_reader(cls)(frame[4:], size)
    return [(t.name, p.index, p.error_code, p.base_offset, p.error_message)
            for t in body.responses for p in t.partition_responses]


async def started(replicas: dict[tuple[str, int], FakeReplica]) -> NativeProduce:
    async def resolve(topic: str, partition: int):
        replica = replicas.get((topic, partition))
        if replica is None:
            raise UnknownTopicOrPartitionError(f"no {topic}-{partition}")
        return await replica.address()
    return NativeProduce(1, "node", resolve)


def test_a_partitions_requests_are_appended_in_order_coalesced_behind_the_one_in_flight(each_event_loop):
    asyncio.run(_a_partitions_requests_are_appended_in_order_coalesced_behind_the_one_in_flight())


async def _a_partitions_requests_are_appended_in_order_coalesced_behind_the_one_in_flight():
    replica = FakeReplica()
    native = await started({("t", 0): replica})
    try:
        first = native.submit(9, 1, -1, 5000, None, 1, [("t", [(0, b"r0", 0, None)])])
        assert partition_answer((await first)[0]) == [("t", 0, 0, 0, None)]
        replica.hold.clear()
        answers = [native.submit(9, 10 + i, -1, 5000, None, 1, [("t", [(0, b"r%d" % (i + 1), 0, None)])]) for i in range(20)]
        while not replica.frames[1:]:
            await asyncio.sleep(0.01)
        replica.hold.set()
        results = [partition_answer((await a)[0]) for a in answers]
        assert results == [[("t", 0, 0, i + 1, None)] for i in range(20)]
        assert replica.log == [b"r%d" % i for i in range(21)]
        assert replica.frames[:2] == [1, 1] and sum(replica.frames) == 21 and len(replica.frames) < 21, replica.frames
        assert replica.lookups == 1
    finally:
        native.close()


def test_each_partition_is_answered_with_its_result_or_its_error_and_a_decided_error_reaches_no_replica(each_event_loop):
    asyncio.run(_each_partition_is_answered_with_its_result_or_its_error_and_a_decided_error_reaches_no_replica())


async def _each_partition_is_answered_with_its_result_or_its_error_and_a_decided_error_reaches_no_replica():
    good, failing = FakeReplica(), FakeReplica()
    failing.fail_with = InvalidRecordError("bad batch", record_errors=[RecordError(0, "record 0 is bad")])
    native = await started({("a", 0): good, ("a", 1): failing})
    try:
        frame, failed = await native.submit(9, 4, -1, 5000, None, 1, [
            ("a", [(0, b"x", 0, None), (1, b"y", 0, None), (2, b"z", 0, None)]),
            ("denied", [(0, b"w", 29, "TOPIC_AUTHORIZATION_FAILED: no")]),
        ])
        assert failed
        assert partition_answer(frame) == [
            ("a", 0, 0, 0, None),
            ("a", 1, 87, -1, "INVALID_RECORD: bad batch"),
            ("a", 2, 3, -1, "UNKNOWN_TOPIC_OR_PARTITION: no a-2"),
            ("denied", 0, 29, -1, "TOPIC_AUTHORIZATION_FAILED: no"),
        ]
        assert good.log == [b"x"] and failing.log == []
        # The same frame as the Python path writes for the same results.
        assert frame == python_frame(9, 4, [
            ("a", [(0, 0, None, 0, -1, 0, []), (1, 87, "INVALID_RECORD: bad batch", -1, -1, -1, [(0, "record 0 is bad")]),
                   (2, 3, "UNKNOWN_TOPIC_OR_PARTITION: no a-2", -1, -1, -1, [])]),
            ("denied", [(0, 29, "TOPIC_AUTHORIZATION_FAILED: no", -1, -1, -1, [])]),
        ])
    finally:
        native.close()


def test_a_broken_connection_fails_the_frame_in_flight_and_the_next_request_connects_again(each_event_loop):
    asyncio.run(_a_broken_connection_fails_the_frame_in_flight_and_the_next_request_connects_again())


async def _a_broken_connection_fails_the_frame_in_flight_and_the_next_request_connects_again():
    replica = FakeReplica()
    native = await started({("t", 0): replica})
    try:
        await native.submit(9, 1, -1, 5000, None, 1, [("t", [(0, b"a", 0, None)])])
        replica.hold.clear()
        in_flight = native.submit(9, 2, -1, 5000, None, 1, [("t", [(0, b"b", 0, None)])])
        while len(replica.frames) < 2:
            await asyncio.sleep(0.01)
        await replica.endpoint.close()  # the replica's process went: its connections close
        frame, failed = await in_flight
        assert failed and partition_answer(frame)[0][2] == NotLeaderOrFollowerError.code
        replica.hold.set()
        replica.endpoint = Endpoint(replica.serve, "fake, restarted")  # Ray restarted it: a new endpoint
        frame, failed = await native.submit(9, 3, -1, 5000, None, 1, [("t", [(0, b"c", 0, None)])])
        assert not failed and partition_answer(frame) == [("t", 0, 0, 1, None)]
        assert replica.lookups == 2
    finally:
        native.close()


def test_an_acks_0_request_and_a_request_of_only_decided_errors_are_answered(each_event_loop):
    asyncio.run(_an_acks_0_request_and_a_request_of_only_decided_errors_are_answered())


async def _an_acks_0_request_and_a_request_of_only_decided_errors_are_answered():
    replica = FakeReplica()
    native = await started({("t", 0): replica})
    try:
        _, failed = await native.submit(3, 1, 0, 5000, None, 1, [("t", [(0, b"a", 0, None)])])
        assert not failed and replica.log == [b"a"]
        frame, failed = await native.submit(12, 2, -1, 5000, "txn", 2, [("t", [(0, None, 2, "CORRUPT_MESSAGE: none")])])
        assert failed and partition_answer(frame, 12) == [("t", 0, 2, -1, "CORRUPT_MESSAGE: none")]
        assert replica.log == [b"a"]
    finally:
        native.close()


def test_requests_not_answered_when_the_path_closes_are_cancelled(each_event_loop):
    asyncio.run(_requests_not_answered_when_the_path_closes_are_cancelled())


async def _requests_not_answered_when_the_path_closes_are_cancelled():
    replica = FakeReplica()
    replica.hold.clear()
    native = await started({("t", 0): replica})
    pending = native.submit(9, 1, -1, 5000, None, 1, [("t", [(0, b"a", 0, None)])])
    while not replica.frames:
        await asyncio.sleep(0.01)
    native.close()
    assert pending.cancelled()
    native.close()  # twice is fine


def test_on_where_built_unless_the_environment_turns_it_off(monkeypatch):
    monkeypatch.delenv(native_paths.ENV, raising=False)
    assert native_paths.built() and native_produce.available()
    for off in ("0", "endpoint,client", "-listener"):
        monkeypatch.setenv(native_paths.ENV, off)
        assert not native_produce.available()
    monkeypatch.setenv(native_paths.ENV, "listener")
    assert native_produce.available()


async def _a_native_path_that_panics_fails_its_requests_and_turns_itself_off():
    replica = FakeReplica()
    replica.hold.clear()
    native = await started({("t", 0): replica})
    try:
        pending = native.submit(9, 1, -1, 5000, None, 1, [("t", [(0, b"a", 0, None)])])
        while not replica.frames:
            await asyncio.sleep(0.01)
        with pytest.raises(rayk.errors.UnknownServerError, match="native produce path stopped"):
            native._call(native._path._crash_for_tests)
        with pytest.raises(rayk.errors.UnknownServerError, match="native produce path stopped"):
            await pending
        assert not native.alive and not native._fds, "its sockets were closed"
        with pytest.raises(rayk.errors.UnknownServerError):
            native._call(native._path.on_readable, 0)
    finally:
        replica.hold.set()
        native.close()


def test_a_native_path_that_panics_fails_its_requests_and_turns_itself_off(each_event_loop):
    asyncio.run(_a_native_path_that_panics_fails_its_requests_and_turns_itself_off())


async def _a_transactional_id_too_long_for_the_data_plane_is_refused_before_any_replica():
    replica = FakeReplica()
    native = await started({("t", 0): replica})
    try:
        frame, failed = await native.submit(12, 1, -1, 5000, "x" * 40_000, 2, [("t", [(0, b"a", 0, None)])])
        assert failed and partition_answer(frame, 12)[0][2] == rayk.errors.InvalidRequestError.code
        assert replica.frames == [] and replica.lookups == 0
    finally:
        native.close()


def test_a_transactional_id_too_long_for_the_data_plane_is_refused_before_any_replica(each_event_loop):
    asyncio.run(_a_transactional_id_too_long_for_the_data_plane_is_refused_before_any_replica())


async def _a_replica_answering_a_network_error_is_connected_to_again_as_the_python_path_does():
    replica = FakeReplica()
    replica.raise_with = rayk.errors.NetworkError("its own link broke")
    native = await started({("t", 0): replica})
    try:
        frame, failed = await native.submit(9, 1, -1, 5000, None, 1, [("t", [(0, b"a", 0, None)])])
        assert failed and partition_answer(frame)[0][2] == NotLeaderOrFollowerError.code
        replica.raise_with = None
        frame, failed = await native.submit(9, 2, -1, 5000, None, 1, [("t", [(0, b"b", 0, None)])])
        assert not failed and replica.log == [b"b"] and replica.lookups == 2
    finally:
        native.close()


def test_a_replica_answering_a_network_error_is_connected_to_again_as_the_python_path_does(each_event_loop):
    asyncio.run(_a_replica_answering_a_network_error_is_connected_to_again_as_the_python_path_does())


async def _frames_larger_than_the_sockets_buffer_are_written_as_it_drains():
    replica = FakeReplica()
    native = await started({("t", 0): replica})
    try:
        big = [bytes([i]) * (3 << 20) for i in range(3)]  # 3 MiB each: the socket takes a part at a time
        answers = [native.submit(9, i, -1, 5000, None, 1, [("t", [(0, records, 0, None)])]) for i, records in enumerate(big)]
        results = [partition_answer((await a)[0]) for a in answers]
        assert results == [[("t", 0, 0, i, None)] for i in range(3)]
        assert replica.log == big
    finally:
        native.close()


def test_frames_larger_than_the_sockets_buffer_are_written_as_it_drains(each_event_loop):
    asyncio.run(_frames_larger_than_the_sockets_buffer_are_written_as_it_drains())
