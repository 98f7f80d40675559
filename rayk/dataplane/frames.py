"""The data plane's frames: a size prefix, a fixed binary header, and record bytes as they are.

Every frame is `size:u32` followed by `size` bytes. A request's body starts with
`correlation_id:i32` and `kind:i8`, an answer's with the request's `correlation_id` and
`outcome:i8`; the rest is a fixed `struct` per kind, then a tail whose length is what
remains of the frame (an incarnation id, record batches). Numbers are big-endian, as in
Kafka's protocol. An answer's outcome is ANSWERED (the kind's answer below follows) or
FAILED, whatever the kind: the request failed as a whole, and an error answer follows
(`error_size:u16 | error`, see the end), which the peer raises for that request alone.

Why not Kafka's own Fetch: an endpoint serves one partition replica, so Fetch's
topic/partition arrays and tagged fields would be nesting that every frame encodes and
parses in Python for nothing; one `struct.unpack` of a fixed header costs a microsecond,
and the record bytes are never touched (no copy beyond the socket's own, never pickled).

FETCH (a follower's or a consumer's fetch, PartitionReplica.fetch's arguments):
  request  offset:i64 max_bytes:i32 min_bytes:i32 max_wait_ms:i32 replica_id:i32
           leader_epoch:i32 last_fetched_epoch:i32 isolation_level:i8 incarnation_size:u16
           | incarnation id | tail: topic id (UTF-8; empty: none)
  answer   high_watermark:i64 log_end_offset:i64 log_start_offset:i64 last_stable_offset:i64
           diverging:i8 diverging_epoch:i32 diverging_end_offset:i64 error_size:u16
           aborted_count:i32 | error | aborted_count x (producer_id:i64 first_offset:i64)
           | tail: records
  (isolation_level as Kafka's: 0 read_uncommitted, 1 read_committed, which reads below
  the LSO and is answered the aborted transactions of what it read)
PRODUCE (PartitionReplica.produce_requests: requests appended in order, answered together):
  request  count:i32, then per request acks:i16 timeout_ms:i32 size:i32 txn_id_size:i16
           transaction_version:i8
           | tail: per request its transactional id (UTF-8; size -1: none), then its records
  (transaction_version as Kafka's: 2 when the client runs transaction version 2, whose
  Produce v12 adds the partition to the transaction at the leader, KIP-890 part 2; else 1)
  answer   count:i32, then per request base_offset:i64 log_append_time_ms:i64
           log_start_offset:i64 error_size:u16 record_error_count:i32 | error
           | record_error_count x (batch_index:i32 message_size:u16 | message)
  (the record errors are an INVALID_RECORD's, KIP-467: at most MAX_RECORD_ERRORS, each
  message cut to RECORD_ERROR_MESSAGE_MAX_BYTES, so at most ~10 MiB per request)
SHARE_FETCH (a share group member's ShareFetch of the partition, KIP-932, PartitionReplica.share_fetch;
  with max_records 0 it acquires nothing: it only acknowledges, as ShareAcknowledge does, or
  with a max_wait_ms it is a probe, answered once records could be acquired or at the wait's end):
  request  max_records:i32 max_wait_ms:i32 group_size:u16 member_size:u16 ack_count:i32
           | group id | member id | ack_count x (first_offset:i64 last_offset:i64 type:i8)
  answer   acquired_count:i32 acknowledge_error_size:u16 error_size:u16 | acknowledge error
           | error | acquired_count x (first_offset:i64 last_offset:i64 delivery_count:i16)
           | tail: records (the whole batches that hold the acquired ranges)
WRITE_SHARE_STATE (a partition leader's write of a share-partition's state to the share
  group's coordinator, OffsetsPartitionReplica.write_share_state):
  request  partition:i32 leader_epoch:i32 state_epoch:i64 start_offset:i64 create:i8
           group_size:u16 topic_size:u16 batch_count:i32 | group id | topic
           | batch_count x (first_offset:i64 last_offset:i64 state:i8 delivery_count:i16)
  (state_epoch: the coordinator's clock in ms when the group's state began; state: the
  index of the batch's record state in SHARE_RECORD_STATES)
  answer   error_size:u16 | error (empty: written)
`error` is `<class name>\\0<message>` of a rayk.errors class, or empty; `diverging` is 1
when the answer names where the follower's log diverges (whose epoch may be -1: the
leader has no epoch at or below the follower's, and the follower truncates to its HW).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from rayk import errors
from rayk.errors import MAX_RECORD_ERRORS, InvalidRecordError, KafkaError, RecordError, UnknownServerError
from rayk.storage.file_slice import FileSlice
from rayk.storage.log_config import MAX_MESSAGE_BYTES_LIMIT

SIZE = struct.Struct(">I")
REQUEST_HEADER = struct.Struct(">ib")  # correlation_id, kind
ANSWER_HEADER = struct.Struct(">ib")  # correlation_id, outcome
ANSWERED, FAILED = 0, 1  # an answer's outcomes
# The most record bytes one frame carries: a fetch answers at most this much (any larger
# max_bytes is cut to it), and the configs that bound a produce (max.message.bytes,
# socket.request.max.bytes, a Producer's max_request_size) may not exceed it.
MAX_RECORDS_BYTES = MAX_MESSAGE_BYTES_LIMIT
MAX_FRAME_BYTES = MAX_RECORDS_BYTES + (1 << 20)  # the rest: headers. Larger declared sizes close the connection

FETCH = 1
PRODUCE = 2
SHARE_FETCH = 3
WRITE_SHARE_STATE = 4
KINDS = (FETCH, PRODUCE, SHARE_FETCH, WRITE_SHARE_STATE)

_FETCH_REQUEST = struct.Struct(">qiiiiiibH")
_FETCH_ANSWER = struct.Struct(">qqqqbiqHi")
_ABORTED_TXN = struct.Struct(">qq")  # producer id, first offset
READ_UNCOMMITTED, READ_COMMITTED = 0, 1  # Kafka's isolation levels
_COUNT = struct.Struct(">i")
# acks (int16, as Kafka's), timeout_ms, records size, transactional id size, transaction version
_PRODUCE_REQUEST = struct.Struct(">hiihb")
TRANSACTION_VERSIONS = (1, 2)
_PRODUCE_ANSWER = struct.Struct(">qqqHi")  # base offset, log append time, log start, error size, record errors
_RECORD_ERROR = struct.Struct(">iH")  # batch index, message size
RECORD_ERROR_MESSAGE_MAX_BYTES = 1024  # rayk's own messages are a line; a longer one is cut
_SHARE_FETCH_REQUEST = struct.Struct(">iiHHi")  # max_records, max_wait_ms, group id size, member id size, ack count
_SHARE_ACK = struct.Struct(">qqb")  # first offset, last offset, acknowledge type
_SHARE_FETCH_ANSWER = struct.Struct(">iHH")  # acquired count, acknowledge error size, error size
_ACQUIRED = struct.Struct(">qqh")  # first offset, last offset, delivery count
# partition, leader epoch, state epoch, start offset, create, group id size, topic size, batch count
_SHARE_STATE_REQUEST = struct.Struct(">iiqqbHHi")
_STATE_BATCH = struct.Struct(">qqbh")  # first offset, last offset, record state, delivery count
SHARE_RECORD_STATES = ("available", "acquired", "acknowledged", "archived")  # share_partition.RecordState's values
_ERROR_ANSWER = struct.Struct(">H")  # error size


class FrameError(ValueError):
    """A frame that does not parse: the peer is not speaking this protocol (the connection closes)."""


class FetchRequest(NamedTuple):
    """One FETCH of a partition replica (PartitionReplica.fetch's arguments): `replica_id` -1
    for a consumer, else the fetching follower's broker id with its `incarnation_id`;
    `leader_epoch` -1 when the fetcher does not check it."""

    offset: int
    max_bytes: int
    min_bytes: int = 1
    max_wait_ms: int = 500
    replica_id: int = -1
    leader_epoch: int = -1
    last_fetched_epoch: int = -1
    isolation_level: int = READ_UNCOMMITTED
    incarnation_id: str = ""
    topic_id: str | None = None  # a Fetch v13+ names its topic by id


class FetchResult(NamedTuple):
    """What a fetch of one partition replica answers (PartitionReplica.fetch's result)."""

    records: bytes | FileSlice  # a FileSlice only on the leader, for its data plane answer (endpoint.py)
    high_watermark: int
    log_end_offset: int
    log_start_offset: int
    error: KafkaError | None = None
    diverging_epoch: tuple[int, int] | None = None  # (epoch, end offset)
    last_stable_offset: int = -1
    aborted_transactions: tuple[tuple[int, int], ...] = ()  # (producer id, first offset), read_committed


class ProduceResult(NamedTuple):
    """What a produce request to a partition leader answers."""

    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    error: KafkaError | None = None


@dataclass(frozen=True, slots=True)
class ShareFetchRequest:
    """A share group member's fetch of one partition: its acknowledgements
    ((first offset, last offset, AcknowledgeType) ranges) are applied first; `max_records`
    0 acquires nothing (with `max_wait_ms`, a probe: answered once records could be)."""

    group_id: str
    member_id: str
    max_records: int
    max_wait_ms: int
    acknowledgements: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ShareFetchResult:
    """What a share fetch answers: whole batches, and the ranges acquired in them
    (first offset, last offset, delivery count); `acknowledge_error` is the error of the
    acknowledgements it carried (None: all applied and written)."""

    records: bytes = b""
    acquired: tuple[tuple[int, int, int], ...] = ()
    acknowledge_error: KafkaError | None = None
    error: KafkaError | None = None


@dataclass(frozen=True, slots=True)
class ShareStateWrite:
    """A share-partition's state as its leader writes it (OffsetsPartitionReplica.write_share_state's
    arguments): batches are (first offset, last offset, record state, delivery count)."""

    group_id: str
    topic: str
    partition: int
    leader_epoch: int
    state_epoch: int
    start_offset: int
    batches: tuple[tuple[int, int, str, int], ...]
    create: bool = False


class ProduceRequest(NamedTuple):
    """One produce of a partition's records, as a Kafka Produce carries it."""

    records: bytes
    acks: int
    timeout_ms: int
    transactional_id: str | None = None  # a transactional producer's (the leader verifies its first batch)
    transaction_version: int = 1  # 2: the leader adds the partition to the transaction (KIP-890 part 2)


def request_frame(correlation_id: int, kind: int, body: bytes) -> bytes:
    return request_frame_head(correlation_id, kind, len(body)) + body


def request_frame_head(correlation_id: int, kind: int, body_size: int) -> bytes:
    """The size prefix and header of a request whose `body_size` bytes of body follow."""
    assert body_size >= 0
    return SIZE.pack(REQUEST_HEADER.size + body_size) + REQUEST_HEADER.pack(correlation_id, kind)


def answer_frame_head(correlation_id: int, head: bytes, tail_size: int) -> bytes:
    """The size prefix, header and `head` of an answer whose `tail_size` bytes of tail the
    caller writes after it (so that records are not copied into one buffer)."""
    assert tail_size >= 0
    return SIZE.pack(ANSWER_HEADER.size + len(head) + tail_size) + ANSWER_HEADER.pack(correlation_id, ANSWERED) + head


def failed_answer_frame(correlation_id: int, error: KafkaError) -> bytes:
    """The answer to a request of any kind that failed with `error` (its peer's Connection
    raises `error` for that request)."""
    body = encode_error_answer(error)
    assert len(body) > _ERROR_ANSWER.size, "a failed answer names its error (decode_failed_answer needs one)"
    return SIZE.pack(ANSWER_HEADER.size + len(body)) + ANSWER_HEADER.pack(correlation_id, FAILED) + body


def decode_failed_answer(body: bytes | memoryview) -> KafkaError:
    """The error of a FAILED answer's body (after its header)."""
    error = decode_error_answer(body)
    if error is None:
        raise FrameError("a failed answer names no error")
    return error


def parse_request(body: bytes | memoryview) -> tuple[int, int, memoryview]:
    """(correlation id, kind, the rest) of a request frame's body."""
    if len(body) < REQUEST_HEADER.size:
        raise FrameError(f"a request frame of {len(body)} bytes has no header")
    correlation_id, kind = REQUEST_HEADER.unpack_from(body)
    if kind not in KINDS:
        raise FrameError(f"unknown request kind {kind}")
    return correlation_id, kind, memoryview(body)[REQUEST_HEADER.size:]


def encode_fetch_request(r: FetchRequest) -> bytes:
    assert r.isolation_level in (READ_UNCOMMITTED, READ_COMMITTED), f"isolation level {r.isolation_level}"
    incarnation_id = r.incarnation_id.encode()[:0xFFFF]
    return b"".join((
        _FETCH_REQUEST.pack(r.offset, r.max_bytes, r.min_bytes, r.max_wait_ms, r.replica_id, r.leader_epoch,
                            r.last_fetched_epoch, r.isolation_level, len(incarnation_id)),
        incarnation_id,
        (r.topic_id or "").encode(),
    ))


def decode_fetch_request(body: bytes | memoryview) -> FetchRequest:
    if len(body) < _FETCH_REQUEST.size:
        raise FrameError(f"a FETCH request of {len(body)} bytes is shorter than its header")
    *numbers, incarnation_size = _FETCH_REQUEST.unpack_from(body)
    if numbers[-1] not in (READ_UNCOMMITTED, READ_COMMITTED):
        raise FrameError(f"a FETCH request's isolation level {numbers[-1]} is neither 0 nor 1")
    topic_id_at = _FETCH_REQUEST.size + incarnation_size
    if len(body) < topic_id_at:
        raise FrameError(f"a FETCH request of {len(body)} bytes is shorter than its incarnation id")
    incarnation_id = _text(body[_FETCH_REQUEST.size:topic_id_at], "incarnation id")
    return FetchRequest(*numbers, incarnation_id, _text(body[topic_id_at:], "topic id") or None)


def _text(data: bytes | memoryview, what: str) -> str:
    try:
        return bytes(data).decode()
    except UnicodeDecodeError as e:
        raise FrameError(f"a request's {what} is not UTF-8: {e}") from None


def encode_produce_request(requests: list[ProduceRequest]) -> list[bytes]:
    """The request's body as parts to write one after the other (the records are not copied)."""
    head = [_COUNT.pack(len(requests))]
    parts: list[bytes] = []
    for records, acks, timeout_ms, transactional_id, transaction_version in requests:
        assert transaction_version in TRANSACTION_VERSIONS, f"transaction version {transaction_version}"
        txn_id = b"" if transactional_id is None else transactional_id.encode()
        txn_id_size = -1 if transactional_id is None else len(txn_id)
        head.append(_PRODUCE_REQUEST.pack(acks, timeout_ms, len(records), txn_id_size, transaction_version))
        parts += (txn_id, records) if txn_id else (records,)
    assert len(head) == 1 + len(requests) and len(head[0]) == _COUNT.size
    return [b"".join(head), *parts]


def decode_produce_request(body: bytes | memoryview) -> list[ProduceRequest]:
    if len(body) < _COUNT.size:
        raise FrameError(f"a PRODUCE request of {len(body)} bytes has no count")
    (count,) = _COUNT.unpack_from(body)
    at = _COUNT.size + count * _PRODUCE_REQUEST.size
    if count < 0 or len(body) < at:
        raise FrameError(f"a PRODUCE request of {len(body)} bytes cannot hold {count} requests")
    requests = []
    for i in range(count):
        acks, timeout_ms, size, txn_id_size, transaction_version = _PRODUCE_REQUEST.unpack_from(
            body, _COUNT.size + i * _PRODUCE_REQUEST.size
        )
        if transaction_version not in TRANSACTION_VERSIONS:
            raise FrameError(f"request {i} of a PRODUCE request has transaction version {transaction_version}")
        transactional_id = None
        if txn_id_size >= 0:
            if at + txn_id_size > len(body):
                raise FrameError(f"request {i} of a PRODUCE request declares a transactional id past its end")
            transactional_id = _text(body[at:at + txn_id_size], "transactional id")
            at += txn_id_size
        elif txn_id_size != -1:
            raise FrameError(f"request {i} of a PRODUCE request declares a transactional id of {txn_id_size} bytes")
        if size < 0 or at + size > len(body):
            raise FrameError(f"request {i} of a PRODUCE request declares {size} bytes of records past its end")
        requests.append(ProduceRequest(bytes(body[at:at + size]), acks, timeout_ms, transactional_id, transaction_version))
        at += size
    if at != len(body):
        raise FrameError(f"a PRODUCE request has {len(body) - at} bytes after its records")
    return requests


def encode_produce_answer(results: list[ProduceResult]) -> bytes:
    parts = [_COUNT.pack(len(results))]
    for r in results:
        error = _encode_error(r.error)
        record_errors = r.error.record_errors if r.error is not None else ()
        # What decode_produce_answer refuses from a peer, rayk never sends.
        assert not record_errors or isinstance(r.error, InvalidRecordError), "only INVALID_RECORD names records"
        assert len(record_errors) <= MAX_RECORD_ERRORS
        parts += [_PRODUCE_ANSWER.pack(r.base_offset, r.log_append_time_ms, r.log_start_offset, len(error),
                                       len(record_errors)), error]
        for record_error in record_errors:
            message = record_error.message.encode()[:RECORD_ERROR_MESSAGE_MAX_BYTES]
            parts += [_RECORD_ERROR.pack(record_error.batch_index, len(message)), message]
    return b"".join(parts)


def decode_produce_answer(body: bytes | memoryview) -> list[ProduceResult]:
    if len(body) < _COUNT.size:
        raise FrameError(f"a PRODUCE answer of {len(body)} bytes has no count")
    (count,) = _COUNT.unpack_from(body)
    results, at = [], _COUNT.size
    for _ in range(max(count, 0)):
        if len(body) < at + _PRODUCE_ANSWER.size:
            raise FrameError(f"a PRODUCE answer of {len(body)} bytes is shorter than its {count} results")
        base_offset, append_time_ms, log_start, error_size, record_error_count = _PRODUCE_ANSWER.unpack_from(body, at)
        at += _PRODUCE_ANSWER.size
        if len(body) < at + error_size:
            raise FrameError(f"a PRODUCE answer of {len(body)} bytes is shorter than its errors")
        error = _decode_error(body[at:at + error_size])
        at += error_size
        if record_error_count:
            error, at = _decode_record_errors(body, at, error, record_error_count)
        results.append(ProduceResult(base_offset, append_time_ms, log_start, error))
    if at != len(body):
        raise FrameError(f"a PRODUCE answer has {len(body) - at} bytes after its {count} results")
    return results


def _decode_record_errors(
    body: bytes | memoryview, at: int, error: KafkaError | None, count: int
) -> tuple[InvalidRecordError, int]:
    """`error` with the `count` record errors at `at`, and where they end."""
    if not isinstance(error, InvalidRecordError):
        raise FrameError(f"a PRODUCE answer names {count} records at fault for an error that is not INVALID_RECORD")
    if not 0 < count <= MAX_RECORD_ERRORS:
        raise FrameError(f"a PRODUCE answer names {count} records at fault, not 1 to {MAX_RECORD_ERRORS}")
    record_errors = []
    for _ in range(count):
        if len(body) < at + _RECORD_ERROR.size:
            raise FrameError(f"a PRODUCE answer of {len(body)} bytes is shorter than its {count} record errors")
        batch_index, message_size = _RECORD_ERROR.unpack_from(body, at)
        at += _RECORD_ERROR.size
        if len(body) < at + message_size:
            raise FrameError(f"a PRODUCE answer of {len(body)} bytes is shorter than its record errors' messages")
        record_errors.append(RecordError(batch_index, bytes(body[at:at + message_size]).decode(errors="replace")))
        at += message_size
    return type(error)(*error.args, record_errors=record_errors), at


def encode_fetch_answer_head(a: FetchResult) -> bytes:
    """The fixed part and the error of an answer; its records follow as the tail."""
    error = _encode_error(a.error)
    diverging = a.diverging_epoch is not None
    epoch, end = a.diverging_epoch if diverging else (-1, -1)
    aborted = a.aborted_transactions
    head = b"".join((
        _FETCH_ANSWER.pack(a.high_watermark, a.log_end_offset, a.log_start_offset, a.last_stable_offset, diverging,
                           epoch, end, len(error), len(aborted)),
        error, *(_ABORTED_TXN.pack(*txn) for txn in aborted),
    ))
    assert len(head) == _FETCH_ANSWER.size + len(error) + len(aborted) * _ABORTED_TXN.size, "the sizes it declares"
    return head


def decode_fetch_answer(body: bytes | memoryview, copy_records: bool = True) -> FetchResult:
    """A FETCH answer; its records as bytes of their own, or (`copy_records` False) as a
    view of `body`, which a consumer's 1 MiB answers are not copied again for."""
    if len(body) < _FETCH_ANSWER.size:
        raise FrameError(f"a FETCH answer of {len(body)} bytes is shorter than its header")
    hw, leo, log_start, lso, diverging, epoch, end, error_size, aborted_count = _FETCH_ANSWER.unpack_from(body)
    aborted_at = _FETCH_ANSWER.size + error_size
    records_at = aborted_at + max(aborted_count, 0) * _ABORTED_TXN.size
    if aborted_count < 0 or len(body) < records_at:
        raise FrameError(f"a FETCH answer of {len(body)} bytes is shorter than its error and {aborted_count} aborted transactions")
    error = _decode_error(body[_FETCH_ANSWER.size:aborted_at])
    aborted = tuple(_ABORTED_TXN.iter_unpack(body[aborted_at:records_at]))
    records = bytes(body[records_at:]) if copy_records else memoryview(body)[records_at:]
    return FetchResult(records, hw, leo, log_start, error, (epoch, end) if diverging else None, lso, aborted)


def encode_share_fetch_request(r: ShareFetchRequest) -> bytes:
    group, member = r.group_id.encode(), r.member_id.encode()  # (an id over 65,535 bytes: struct.error)
    body = b"".join((
        _SHARE_FETCH_REQUEST.pack(r.max_records, r.max_wait_ms, len(group), len(member), len(r.acknowledgements)),
        group, member, *(_SHARE_ACK.pack(*ack) for ack in r.acknowledgements),
    ))
    # decode_share_fetch_request takes exactly this many bytes, no more.
    assert len(body) == _SHARE_FETCH_REQUEST.size + len(group) + len(member) + len(r.acknowledgements) * _SHARE_ACK.size
    return body


def decode_share_fetch_request(body: bytes | memoryview) -> ShareFetchRequest:
    if len(body) < _SHARE_FETCH_REQUEST.size:
        raise FrameError(f"a SHARE_FETCH request of {len(body)} bytes is shorter than its header")
    max_records, max_wait_ms, group_size, member_size, ack_count = _SHARE_FETCH_REQUEST.unpack_from(body)
    member_at = _SHARE_FETCH_REQUEST.size + group_size
    acks_at = member_at + member_size
    if ack_count < 0 or len(body) != acks_at + ack_count * _SHARE_ACK.size:
        raise FrameError(f"a SHARE_FETCH request of {len(body)} bytes does not hold its ids and {ack_count} acknowledgements")
    return ShareFetchRequest(
        _text(body[_SHARE_FETCH_REQUEST.size:member_at], "group id"), _text(body[member_at:acks_at], "member id"),
        max_records, max_wait_ms, tuple(_SHARE_ACK.iter_unpack(body[acks_at:])),
    )


def encode_share_fetch_answer_head(a: ShareFetchResult) -> bytes:
    """The fixed part, the errors and the acquired ranges of an answer; its records follow as the tail."""
    acknowledge_error, error = _encode_error(a.acknowledge_error), _encode_error(a.error)
    head = b"".join((
        _SHARE_FETCH_ANSWER.pack(len(a.acquired), len(acknowledge_error), len(error)), acknowledge_error, error,
        *(_ACQUIRED.pack(*r) for r in a.acquired),
    ))
    assert len(head) == _SHARE_FETCH_ANSWER.size + len(acknowledge_error) + len(error) + len(a.acquired) * _ACQUIRED.size
    return head


def decode_share_fetch_answer(body: bytes | memoryview) -> ShareFetchResult:
    if len(body) < _SHARE_FETCH_ANSWER.size:
        raise FrameError(f"a SHARE_FETCH answer of {len(body)} bytes is shorter than its header")
    count, acknowledge_error_size, error_size = _SHARE_FETCH_ANSWER.unpack_from(body)
    error_at = _SHARE_FETCH_ANSWER.size + acknowledge_error_size
    acquired_at = error_at + error_size
    records_at = acquired_at + max(count, 0) * _ACQUIRED.size
    if count < 0 or len(body) < records_at:
        raise FrameError(f"a SHARE_FETCH answer of {len(body)} bytes is shorter than its errors and {count} ranges")
    return ShareFetchResult(
        bytes(body[records_at:]), tuple(_ACQUIRED.iter_unpack(body[acquired_at:records_at])),
        _decode_error(body[_SHARE_FETCH_ANSWER.size:error_at]), _decode_error(body[error_at:acquired_at]),
    )


def encode_share_state_write(w: ShareStateWrite) -> bytes:
    group, topic = w.group_id.encode(), w.topic.encode()  # (an id over 65,535 bytes: struct.error)
    try:
        batches = [_STATE_BATCH.pack(first, last, SHARE_RECORD_STATES.index(state), count)
                   for first, last, state, count in w.batches]  # fmt: skip
    except ValueError as e:  # a state that is none of SHARE_RECORD_STATES
        raise struct.error(str(e)) from None
    body = b"".join((
        _SHARE_STATE_REQUEST.pack(w.partition, w.leader_epoch, w.state_epoch, w.start_offset, int(w.create),
                                  len(group), len(topic), len(batches)),
        group, topic, *batches,
    ))  # fmt: skip
    # decode_share_state_write takes exactly this many bytes, no more.
    assert len(body) == _SHARE_STATE_REQUEST.size + len(group) + len(topic) + len(batches) * _STATE_BATCH.size
    return body


def decode_share_state_write(body: bytes | memoryview) -> ShareStateWrite:
    if len(body) < _SHARE_STATE_REQUEST.size:
        raise FrameError(f"a WRITE_SHARE_STATE request of {len(body)} bytes is shorter than its header")
    partition, leader_epoch, state_epoch, start_offset, create, group_size, topic_size, count = (
        _SHARE_STATE_REQUEST.unpack_from(body))
    topic_at = _SHARE_STATE_REQUEST.size + group_size
    batches_at = topic_at + topic_size
    if count < 0 or len(body) != batches_at + count * _STATE_BATCH.size:
        raise FrameError(f"a WRITE_SHARE_STATE request of {len(body)} bytes does not hold its names and {count} batches")
    batches = []
    for first, last, state, delivery_count in _STATE_BATCH.iter_unpack(body[batches_at:]):
        if not 0 <= state < len(SHARE_RECORD_STATES):
            raise FrameError(f"a WRITE_SHARE_STATE batch has record state {state}, not one of 0..{len(SHARE_RECORD_STATES) - 1}")
        batches.append((first, last, SHARE_RECORD_STATES[state], delivery_count))
    return ShareStateWrite(
        _text(body[_SHARE_STATE_REQUEST.size:topic_at], "group id"), _text(body[topic_at:batches_at], "topic"),
        partition, leader_epoch, state_epoch, start_offset, tuple(batches), bool(create),
    )


def encode_error_answer(error: KafkaError | None) -> bytes:
    """An answer that is only an error (empty: done), as WRITE_SHARE_STATE's."""
    encoded = _encode_error(error)
    assert len(encoded) <= 0xFFFF, "an error's size is a u16"
    return _ERROR_ANSWER.pack(len(encoded)) + encoded


def decode_error_answer(body: bytes | memoryview) -> KafkaError | None:
    if len(body) < _ERROR_ANSWER.size or len(body) != _ERROR_ANSWER.size + _ERROR_ANSWER.unpack_from(body)[0]:
        raise FrameError(f"an error answer of {len(body)} bytes does not hold its error")
    return _decode_error(body[_ERROR_ANSWER.size:])


def _encode_error(error: KafkaError | None) -> bytes:
    if error is None:
        return b""
    encoded = f"{type(error).__name__}\0{error.args[0] if error.args else ''}".encode()
    return encoded[:0xFFFF]


def _decode_error(encoded: bytes | memoryview) -> KafkaError | None:
    """The rayk.errors class the peer named (UNKNOWN_SERVER_ERROR for any other name)."""
    if not encoded:
        return None
    name, _, message = bytes(encoded).decode(errors="replace").partition("\0")
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, KafkaError)):
        return UnknownServerError(f"{name}: {message}")
    return cls(message)
