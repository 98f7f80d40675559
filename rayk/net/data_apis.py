"""Produce, Fetch, ListOffsets and OffsetForLeaderEpoch: the data path.

With an authorizer, producing needs WRITE on the topic (and a transactional produce WRITE
on its TransactionalId), fetching READ, the two offset lookups DESCRIBE; a partition of a
topic the principal may not use gets TOPIC_AUTHORIZATION_FAILED and reaches no replica.

Record batches travel as the bytes the client sent (Produce) and the bytes the log holds
(Fetch): the listener never decodes or re-encodes records; the partition replica validates
and stores them. Each partition of a request goes to this broker's replica of it, all
partitions concurrently.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, NamedTuple

from rayk.acls import DESCRIBE, READ, TOPIC, TRANSACTIONAL_ID, WRITE
from rayk.replication.leader_fetch import CONSUMER_REPLICA_ID
from rayk.dataplane.frames import READ_COMMITTED, READ_UNCOMMITTED, FetchRequest, FetchResult
from rayk.net.api_versions import transaction_version_of
from rayk.errors import (
    CorruptRecordError,
    InconsistentTopicIdError,
    InvalidRequestError,
    KafkaError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of
from rayk.net.entities import ms, topic_id_text
from rayk.net.fetch_session import FetchPartition, PartitionAnswer
from rayk.net import native_produce
from rayk.net.native_produce import NativeProduce
from rayk.storage.leader_epoch_cache import UNDEFINED_EPOCH
from rayk.storage.records import iter_batches

ZERO_TOPIC_ID = uuid.UUID(int=0)
# A longer wait would be answered after the client gave up (librdkafka's and the Java
# client's request timeout is 30 s), holding a replica's call slot all the while.
MAX_FETCH_WAIT_MS = 30_000
CLOSE_CONNECTION = object()  # an acks=0 produce that failed: Kafka closes the connection


async def produce(view: BrokerView, request: Any) -> dict | object | None:
    """Queues every partition's records at the listener's ProduceCoalescer, or on the
    native produce path where it is built (native_produce.py), before anything awaits (so
    a connection's requests are queued in the order they arrived), then answers each
    partition with its result or its error code."""
    body = request.body
    acks, timeout_ms, transactional_id = body.acks, ms(body.timeout), body.transactional_id
    transaction_version = transaction_version_of(request)  # 2: the leaders add the partitions (KIP-890)
    if transactional_id is not None and not view.authorized(request, WRITE, TRANSACTIONAL_ID, transactional_id):
        denied = TransactionalIdAuthorizationFailedError(
            f"{request.context.principal} may not write with transactional id {transactional_id!r}"
        )
    else:
        denied = None

    native = view.native_produce()
    if native is not None and native_produce.MIN_VERSION <= request.head.api_version <= native_produce.MAX_VERSION:
        return await _produce_natively(native, view, request, denied, transaction_version)

    def submit(topic: str, index: int, records: bytes | None) -> asyncio.Future:
        if denied is not None:
            return _failed(denied)
        if not view.authorized(request, WRITE, TOPIC, topic):
            return _failed(TopicAuthorizationFailedError(f"{request.context.principal} may not write to {topic!r}"))
        if records is None:
            return _failed(CorruptRecordError("a produce request without records"))
        return view.produce(topic, index, bytes(records), acks, timeout_ms, transactional_id, transaction_version)

    async def answer(index: int, produced: asyncio.Future) -> dict:
        try:
            result = await produced
            if result.error is not None:
                raise result.error
            return {
                "index": index,
                "base_offset": result.base_offset,
                "log_append_time": result.log_append_time_ms,
                "log_start_offset": result.log_start_offset,
            }
        except Exception as e:  # one partition's failure is that partition's error code
            return {"index": index, "error_code": error_code_of(e), "error_message": error_message_of(e),
                    "base_offset": -1, "log_append_time": -1, "log_start_offset": -1,
                    "record_errors": _record_errors(e)}

    submitted = [[(p.index, submit(t.name, p.index, p.records)) for p in t.partition_data] for t in body.topic_data]
    # Every partition's produce is under way: awaited in turn, they take as long as the
    # slowest, with no task per partition (asyncio.gather's). Cancelled (the connection
    # closed), the ones not awaited yet are cancelled too, as gather's would be.
    try:
        results = [await answer(index, produced) for partitions in submitted for index, produced in partitions]
    except BaseException:
        for partitions in submitted:
            for _, produced in partitions:
                produced.cancel()
        raise
    if acks == 0:
        return CLOSE_CONNECTION if any(r.get("error_code") for r in results) else None
    it = iter(results)
    return {"responses": [{"name": t.name, "partition_responses": [next(it) for _ in t.partition_data]} for t in body.topic_data]}


async def _produce_natively(native: NativeProduce, view: BrokerView, request: Any, denied: KafkaError | None,
                            transaction_version: int) -> NativeProduceFrame | object | None:
    """`produce` on the native path (native_produce.py): the same checks, decided here, the
    rest in native code; the response frame comes back whole."""
    body = request.body
    topics: native_produce.Topics = []
    for t in body.topic_data:
        if denied is None and not view.authorized(request, WRITE, TOPIC, t.name):
            refused: KafkaError | None = TopicAuthorizationFailedError(f"{request.context.principal} may not write to {t.name!r}")
        else:
            refused = denied
        partitions = []
        for p in t.partition_data:
            if refused is not None:
                partitions.append((p.index, None, refused.code, str(refused)))
            elif p.records is None:
                partitions.append((p.index, None, CorruptRecordError.code, str(CorruptRecordError("a produce request without records"))))
            else:
                partitions.append((p.index, native_produce.records_of(p.records), 0, None))
        topics.append((t.name, partitions))
    try:
        frame, failed = await native.submit(request.head.api_version, request.head.correlation_id, body.acks,
                                            ms(body.timeout), body.transactional_id, transaction_version, topics)
    except Exception:  # the native path stopped: an acks=0 client is not answered, its connection closes
        if body.acks == 0:
            return CLOSE_CONNECTION
        raise
    if body.acks == 0:
        return CLOSE_CONNECTION if failed else None
    return NativeProduceFrame(frame, request.head.api_version)


class NativeProduceFrame(NamedTuple):
    """A Produce response frame the native path wrote, its throttle time still to be set
    (KafkaApis.handle sets it: native_produce.with_throttle)."""

    frame: bytes
    api_version: int


def _record_errors(error: Exception) -> list[dict]:
    """The records an INVALID_RECORD names (KIP-467; Produce v8+ answers them)."""
    named = error.record_errors if isinstance(error, KafkaError) else ()
    return [{"batch_index": e.batch_index, "batch_index_error_message": e.message} for e in named]


def _failed(error: Exception) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future


async def fetch(view: BrokerView, request: Any) -> dict:
    """Answers when `min_bytes` are ready over all partitions or `max_wait` has passed:
    first a read of every partition without waiting, then (if that fell short) a wait on
    every partition at once, answered as soon as enough bytes arrived. `max_bytes`
    (fetch.max.bytes) bounds what is read, not only what is answered: each partition may
    read its fair share of it (at most its own partition_max_bytes), and what the others
    left over tops up, in request order, the partitions whose share was cut and that have
    more; a replica returns at least one batch, so what is read exceeds `max_bytes` by at
    most one batch per partition (Kafka: one batch for the first partition). A fetch of one
    partition (a consumer's fetch from a broker that leads one of its partitions) waits at
    the replica in one call. Which partitions are read and answered is the fetch session's
    (fetch_session.py); Fetch v13+ names topics by id. A partition named twice is
    INVALID_REQUEST; max_wait is capped at MAX_FETCH_WAIT_MS, and a partition with too many
    fetches waiting at it already is read without waiting (parked_fetches.py).

    A client over its consumer_byte_rate gets an empty answer at once, with the time it
    must wait (client_quotas.py); one within it reads at most what its quota allows over
    the quota window (Kafka's maxValueInQuotaWindow), and what it is answered counts."""
    body = request.body
    uses_topic_ids = request.head.api_version >= 13
    wanted, forgotten = _fetch_partitions(body, uses_topic_ids)
    if len({p.key for p in wanted}) != len(wanted):  # one partition, one position: else which is the session's?
        return _fetch_refused(InvalidRequestError.code)
    isolation_level = body.isolation_level
    if isolation_level not in (READ_UNCOMMITTED, READ_COMMITTED):  # Kafka's IsolationLevel.forId refuses it too
        return _fetch_refused(InvalidRequestError.code)
    try:  # Fetch v4-v6 have no session fields: (0, -1), a sessionless fetch
        context = view.fetch_sessions.new_context(getattr(body, "session_id", 0), getattr(body, "session_epoch", -1),
                                                  wanted, forgotten, uses_topic_ids)
    except KafkaError as e:
        return _fetch_refused(e.code)
    quotas, context_of_request = view.quotas, request.context
    throttle_ms = quotas.fetch_throttle_ms(context_of_request, request.client_id)
    if throttle_ms:
        try:
            return {"error_code": 0, "session_id": context.throttled(), "responses": [], "throttle_time": throttle_ms}
        except KafkaError as e:
            return {**_fetch_refused(e.code), "throttle_time": throttle_ms}
    quota_max_bytes = quotas.fetch_max_bytes(context_of_request, request.client_id)
    max_bytes = max(body.max_bytes, 1) if quota_max_bytes is None else min(max(body.max_bytes, 1), quota_max_bytes)
    wanted = context.partitions
    names = await view.topic_names({p.topic for p in wanted}) if uses_topic_ids else {p.topic: p.topic for p in wanted}
    max_wait_ms = min(max(ms(body.max_wait), 0), MAX_FETCH_WAIT_MS)
    deadline = time.monotonic() + max_wait_ms / 1000
    min_bytes = max(body.min_bytes, 1)
    read = _PartitionReader(view, request, names, isolation_level, uses_topic_ids).read
    if not wanted:
        answers = []
    elif len(wanted) == 1:  # the replica itself waits for min_bytes: one call, not two
        answers = [await read(wanted[0], max_wait_ms, min_bytes, max_bytes=min(wanted[0].max_bytes, max_bytes))]
    else:
        grants = _fair_shares([p.max_bytes for p in wanted], max_bytes)
        answers = list(await asyncio.gather(*(read(p, 0, max_bytes=g) for p, g in zip(wanted, grants))))
        answers = await _top_up(answers, wanted, grants, max_bytes, read)
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if wanted and _ready_bytes(answers) < min_bytes and remaining_ms > 0 and not any(a["error_code"] for a in answers):
            waits = [asyncio.ensure_future(read(p, remaining_ms, max_bytes=g)) for p, g in zip(wanted, grants)]
            answers = await _wait_for_bytes(answers, waits, min_bytes, remaining_ms)
        _trim_to(answers, max_bytes)
    return _fetch_answer(view, request, context, wanted, answers, uses_topic_ids)


def _fetch_partitions(body: Any, uses_topic_ids: bool) -> tuple[list[FetchPartition], list[tuple[Any, int]]]:
    """The partitions a Fetch names (by topic id from v13), and those it forgets."""
    wanted = [
        FetchPartition(_topic_id(t.topic_id) if uses_topic_ids else t.topic, p.partition, p.fetch_offset,
                       max(p.partition_max_bytes, 0), getattr(p, "current_leader_epoch", -1))
        for t in body.topics for p in t.partitions
    ]
    forgotten = [(_topic_id(t.topic_id) if uses_topic_ids else t.topic, p)
                 for t in getattr(body, "forgotten_topics_data", ()) for p in t.partitions]
    return wanted, forgotten


def _fetch_refused(error_code: int) -> dict:
    """A Fetch answer with a top-level error, outside any session."""
    return {"error_code": error_code, "session_id": 0, "responses": []}


class _PartitionReader:
    """One Fetch request's reads of its partitions at their replicas: what a read needs
    that is the same for every partition of the request."""

    __slots__ = ("_view", "_request", "_names", "_isolation_level", "_uses_topic_ids")

    def __init__(self, view: BrokerView, request: Any, names: dict, isolation_level: int, uses_topic_ids: bool) -> None:
        self._view, self._request, self._names = view, request, names
        self._isolation_level, self._uses_topic_ids = isolation_level, uses_topic_ids

    async def read(self, p: FetchPartition, wait_ms: int, partition_min_bytes: int = 1, max_bytes: int | None = None,
                   offset: int | None = None) -> dict:  # fmt: skip
        """The partition's answer: what its replica read from `offset` (default: the
        fetch's), at most `max_bytes` (default: the partition's), waiting up to `wait_ms`
        for `partition_min_bytes`; or its error code."""
        view, request = self._view, self._request
        try:
            name = self._names[p.topic]
            if isinstance(name, KafkaError):
                raise name
            if not view.authorized(request, READ, TOPIC, name):
                raise TopicAuthorizationFailedError(f"{request.context.principal} may not read {name!r}")
            async with view.parked_fetches.wait_ms(name, p.partition, wait_ms) as granted_wait_ms:
                result = await view.fetch(name, p.partition, FetchRequest(
                    p.fetch_offset if offset is None else offset,
                    p.max_bytes if max_bytes is None else max_bytes, partition_min_bytes, granted_wait_ms,
                    CONSUMER_REPLICA_ID, p.current_leader_epoch, UNDEFINED_EPOCH, self._isolation_level,
                    topic_id=topic_id_text(p.topic) if self._uses_topic_ids else None,
                ))
            if result.error is not None:
                raise result.error
            error = 0
        except KafkaError as e:
            error, result = e.code, None
            if isinstance(e, InconsistentTopicIdError):
                view.forget_topic_id(p.topic)
        except Exception as e:
            error, result = error_code_of(e), None
        return _partition_answer(p, error, result)


def _partition_answer(p: FetchPartition, error: int, result: FetchResult | None) -> dict:
    return {
        "partition_index": p.partition,
        "error_code": error,
        "high_watermark": result.high_watermark if result else -1,
        "last_stable_offset": result.last_stable_offset if result else -1,
        "log_start_offset": result.log_start_offset if result else -1,
        "aborted_transactions": [
            {"producer_id": producer_id, "first_offset": first_offset}
            for producer_id, first_offset in (result.aborted_transactions if result else ())
        ],
        "preferred_read_replica": -1,
        "records": result.records if result else b"",
    }


def _fetch_answer(view: BrokerView, request: Any, context: Any, wanted: list[FetchPartition], answers: list[dict],
                  uses_topic_ids: bool) -> dict:  # fmt: skip
    """The session's answer (its id, the partitions it answers, by topic) and the time
    the client's quota makes it wait for what it is answered."""
    try:
        session_id, chosen = context.answer([
            PartitionAnswer(a["error_code"], a["high_watermark"], a["log_start_offset"], len(a["records"])) for a in answers
        ])
    except KafkaError as e:
        return _fetch_refused(e.code)
    topic_field = "topic_id" if uses_topic_ids else "topic"
    out: list[dict] = []
    for i in chosen:  # a topic whose partitions the session's order split appears once per run, as in Kafka
        topic = wanted[i].topic
        if not out or out[-1][topic_field] != topic:
            out.append({topic_field: topic, "partitions": []})
        out[-1]["partitions"].append(answers[i])
    throttle_ms = view.quotas.fetch_throttle_ms(request.context, request.client_id,
                                                sum(len(answers[i]["records"]) for i in chosen))  # fmt: skip
    return {"error_code": 0, "session_id": session_id, "responses": out, "throttle_time": throttle_ms}


def _check_describe(view: BrokerView, request: Any, topic: str) -> None:
    if not view.authorized(request, DESCRIBE, TOPIC, topic):
        raise TopicAuthorizationFailedError(f"{request.context.principal} may not describe {topic!r}")


def _topic_id(value: uuid.UUID | None) -> uuid.UUID:
    """kio reads the all-zero topic id as None; it is the id no topic has."""
    return value if value is not None else ZERO_TOPIC_ID


def _fair_shares(partition_max_bytes: list[int], max_bytes: int) -> list[int]:
    """Per partition (at least one) what it may read at first: an equal share of
    `max_bytes`, at most its own limit; the shares sum to at most `max_bytes`."""
    share = max(max_bytes // len(partition_max_bytes), 1)
    return [min(limit, share) for limit in partition_max_bytes]


async def _top_up(answers: list[dict], wanted: list[FetchPartition], grants: list[int], max_bytes: int, read: Any) -> list[dict]:
    """Reads more of the partitions whose fair share was cut below their own limit and
    that had data, in request order, from the bytes the others left unused."""
    leftover = max_bytes - _ready_bytes(answers)
    more: list[tuple[int, int, int]] = []  # (answer index, bytes, offset)
    for i, (answer, p, grant) in enumerate(zip(answers, wanted, grants)):
        got = len(answer["records"])
        if leftover <= 0:
            break
        if answer["error_code"] or not got or grant >= p.max_bytes or got >= p.max_bytes:
            continue
        offset = _next_offset(answer["records"])
        if offset >= answer["high_watermark"]:
            continue  # caught up: nothing more to read
        extra = min(p.max_bytes - got, leftover)
        leftover -= extra
        more.append((i, extra, offset))
    if not more:
        return answers
    read_again = await asyncio.gather(*(read(wanted[i], 0, max_bytes=extra, offset=offset) for i, extra, offset in more))
    for (i, extra, _), again in zip(more, read_again):
        fitting = _whole_batches_within(again["records"], extra)  # a replica returns at least one batch
        if not again["error_code"] and fitting:
            answers[i] = {**answers[i], "records": bytes(answers[i]["records"]) + fitting,
                          "high_watermark": again["high_watermark"], "last_stable_offset": again["last_stable_offset"],
                          "log_start_offset": again["log_start_offset"],
                          "aborted_transactions": answers[i]["aborted_transactions"] + again["aborted_transactions"]}
    return answers


def _whole_batches_within(records: bytes, max_bytes: int) -> bytes:
    end = 0
    for batch in iter_batches(records):
        if end + len(batch.data) > max_bytes:
            break
        end += len(batch.data)
    return bytes(records[:end])


def _next_offset(records: bytes) -> int:
    last = None
    for last in iter_batches(records):
        pass
    assert last is not None, "records hold whole batches"
    return last.header.next_offset


def _ready_bytes(answers: list[dict]) -> int:
    return sum(len(a["records"]) for a in answers)


async def _wait_for_bytes(answers: list[dict], waits: list[asyncio.Future], min_bytes: int, remaining_ms: int) -> list[dict]:
    pending = set(waits)
    deadline = time.monotonic() + remaining_ms / 1000
    while pending:
        done, pending = await asyncio.wait(pending, timeout=max(deadline - time.monotonic(), 0),
                                           return_when=asyncio.FIRST_COMPLETED)
        for future in done:
            answers[waits.index(future)] = future.result()
        if not done or _ready_bytes(answers) >= min_bytes or any(a["error_code"] for a in answers):
            break
    for future in pending:  # still parked at their replicas; they return by max_wait anyway
        future.cancel()
    return answers


def _trim_to(answers: list[dict], max_bytes: int) -> None:
    """Kafka's response size limit: partitions in request order until `max_bytes`; the
    first partition with data is always included, so a big batch can make progress."""
    total = 0
    for answer in answers:
        size = len(answer["records"])
        if size and total and total + size > max_bytes:
            answer["records"] = b""
        total += len(answer["records"])


async def list_offsets(view: BrokerView, request: Any) -> dict:
    """ListOffsets; a read_committed request (v2+) is answered the LSO for LATEST."""
    isolation_level = getattr(request.body, "isolation_level", READ_UNCOMMITTED)

    async def one(topic: str, p: Any) -> dict:
        try:
            _check_describe(view, request, topic)
            if isolation_level not in (READ_UNCOMMITTED, READ_COMMITTED):
                raise InvalidRequestError(f"isolation level {isolation_level} is neither 0 nor 1")
            offset, timestamp = await view.call(topic, p.partition_index, "list_offset", p.timestamp, isolation_level)
            return {"partition_index": p.partition_index, "offset": offset, "timestamp": timestamp, "leader_epoch": -1}
        except Exception as e:
            return {"partition_index": p.partition_index, "error_code": error_code_of(e), "offset": -1, "timestamp": -1,
                    "leader_epoch": -1}

    topics = request.body.topics
    results = await asyncio.gather(*(one(t.name, p) for t in topics for p in t.partitions))
    it = iter(results)
    return {"topics": [{"name": t.name, "partitions": [next(it) for _ in t.partitions]} for t in topics]}


async def offset_for_leader_epoch(view: BrokerView, request: Any) -> dict:
    async def one(topic: str, p: Any) -> dict:
        try:
            _check_describe(view, request, topic)
            epoch, end_offset = await view.call(topic, p.partition, "offsets_for_leader_epoch", p.leader_epoch)
            return {"partition": p.partition, "leader_epoch": epoch, "end_offset": end_offset}
        except Exception as e:
            return {"partition": p.partition, "error_code": error_code_of(e), "leader_epoch": -1, "end_offset": -1}

    topics = request.body.topics
    results = await asyncio.gather(*(one(t.topic, p) for t in topics for p in t.partitions))
    it = iter(results)
    return {"topics": [{"topic": t.topic, "partitions": [next(it) for _ in t.partitions]} for t in topics]}
