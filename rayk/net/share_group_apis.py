"""Share groups (KIP-932) on the wire: ShareGroupHeartbeat and ShareGroupDescribe (answered
by the group's coordinator, share_coordinator.py), ShareFetch and ShareAcknowledge
(answered by each partition's leader, share_fetch.py, within the listener's share
sessions, share_sessions.py). Partitions travel by topic id, as in Kafka.

ShareFetch: the request's epoch opens, continues or closes the member's share session on
this broker; a session that ends releases what its member holds on its partitions. The
acknowledgements a request carries are applied per partition first (their errors in
`acknowledge_error_code`), then every partition of the session is fetched: at once, and
if nothing was acquired anywhere, again as soon as one of them has records to acquire,
within `max_wait` (a single partition waits at its leader in one call; several are
probed, each probe answered by its leader once records could be acquired there; if
another member took those first, every partition then waits out the rest of max_wait).
Each partition answers its whole batches and the ranges acquired in them; the client
keeps those records. An acknowledgement batch gives one type
for its whole range or one per offset; GAP (0), an offset without a record, settles like
ACCEPT. With an authorizer: READ on the group, and READ on each topic fetched or
acknowledged (TOPIC_AUTHORIZATION_FAILED for that partition); the heartbeat needs READ
on the group and DESCRIBE on the topics it subscribes to, ShareGroupDescribe DESCRIBE on
the group.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

from rayk.acls import DESCRIBE, GROUP, READ, TOPIC
from rayk.coordinator.share.share_group import JOIN_EPOCH, LEAVE_EPOCH
from rayk.replication.share.share_partition import AcknowledgeType
from rayk.dataplane.frames import ShareFetchRequest, ShareFetchResult
from rayk.errors import (
    GroupAuthorizationFailedError,
    InvalidRequestError,
    InvalidShareSessionEpochError,
    KafkaError,
    TopicAuthorizationFailedError,
)
from rayk.net.admin_apis import NO_AUTHORIZED_OPERATIONS
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of
from rayk.net.entities import ms
from rayk.net.group_apis import TOPIC_LOOKUP_TIMEOUT_MS, coordinator_call
from rayk.net.share_sessions import OPEN_EPOCH, Ended

logger = logging.getLogger(__name__)

MAX_SHARE_FETCH_WAIT_MS = 30_000
DEFAULT_MAX_RECORDS = 500
GAP = 0
Partition = tuple[str, int]
Acks = list[tuple[int, int, int]]


# ------------------------------------------------------------------ membership


async def share_group_heartbeat(view: BrokerView, request: Any) -> dict:
    body = request.body
    try:
        if not body.group_id:
            raise InvalidRequestError("GroupId can't be empty.")
        if not body.member_id:
            raise InvalidRequestError("MemberId can't be empty.")
        if body.member_epoch == JOIN_EPOCH and not body.subscribed_topic_names:
            raise InvalidRequestError("SubscribedTopicNames must be set in first request.")
        if body.member_epoch < LEAVE_EPOCH:
            raise InvalidRequestError(f"MemberEpoch {body.member_epoch} is invalid.")
        if not view.authorized(request, READ, GROUP, body.group_id):
            raise GroupAuthorizationFailedError(f"{request.context.principal} may not use group {body.group_id!r}")
        denied = [t for t in body.subscribed_topic_names or () if not view.authorized(request, DESCRIBE, TOPIC, t)]
        if denied:
            raise TopicAuthorizationFailedError(f"{request.context.principal} may not describe topics {denied}")
        topics = (await view.ask_controller("client_metadata", None, timeout_ms=TOPIC_LOOKUP_TIMEOUT_MS))["topics"]
        counts = {name: len(t["partitions"]) for name, t in topics.items()}
        answer = await coordinator_call(
            view, request, body.group_id, "share_heartbeat", body.member_id, body.member_epoch,
            None if body.subscribed_topic_names is None else list(body.subscribed_topic_names),
            request.client_id or "", request.context.client_host, body.rack_id, counts,
        )  # fmt: skip
    except Exception as e:
        return {"error_code": error_code_of(e), "error_message": error_message_of(e), "member_id": body.member_id or None,
                "member_epoch": -1, "heartbeat_interval": 0}  # fmt: skip
    response: dict[str, Any] = {"member_id": answer.member_id, "member_epoch": answer.member_epoch,
                                "heartbeat_interval": answer.heartbeat_interval_ms}  # fmt: skip
    if answer.assignment is not None:
        response["assignment"] = {"topic_partitions": [
            {"topic_id": topics[t]["topic_id"], "partitions": ps} for t, ps in _by_topic(answer.assignment).items()
            if t in topics
        ]}  # fmt: skip
    return response


async def share_group_describe(view: BrokerView, request: Any) -> dict:
    body = request.body
    topics: dict | None = None

    async def one(group_id: str) -> dict:
        nonlocal topics
        try:
            g = await coordinator_call(view, request, group_id, "describe_share_group")
            if topics is None:
                topics = (await view.ask_controller("client_metadata", None, timeout_ms=TOPIC_LOOKUP_TIMEOUT_MS))["topics"]
        except Exception as e:
            return {"group_id": group_id, "error_code": error_code_of(e), "error_message": error_message_of(e),
                    "group_state": "", "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "",
                    "members": [], "authorized_operations": NO_AUTHORIZED_OPERATIONS}  # fmt: skip
        known = topics

        def assignment(partitions: list) -> dict:
            return {"topic_partitions": [{"topic_id": known[t]["topic_id"], "topic_name": t, "partitions": ps}
                                         for t, ps in _by_topic(partitions).items() if t in known]}  # fmt: skip

        return {
            "group_id": group_id, "group_state": g["state"], "group_epoch": g["group_epoch"],
            "assignment_epoch": g["group_epoch"], "assignor_name": "simple",
            "members": [{"member_id": m["member_id"], "rack_id": m["rack_id"], "member_epoch": m["member_epoch"],
                         "client_id": m["client_id"], "client_host": m["client_host"],
                         "subscribed_topic_names": m["subscribed_topics"], "assignment": assignment(m["assignment"])}
                        for m in g["members"]],
            "authorized_operations": view.authorized_operations(request, GROUP, group_id)
            if body.include_authorized_operations else NO_AUTHORIZED_OPERATIONS,
        }  # fmt: skip

    return {"groups": list(await asyncio.gather(*(one(g) for g in body.group_ids)))}


def _by_topic(partitions: Any) -> dict[str, list[int]]:
    topics: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        topics.setdefault(topic, []).append(partition)
    return topics


# ------------------------------------------------------------------ records


def acknowledgements(batches: Any) -> Acks:
    """A partition's acknowledgement batches as (first, last, type) runs; INVALID_REQUEST
    for a batch whose types are neither one nor one per offset, or batches out of order."""
    out: Acks = []
    end = -1
    for batch in batches:
        first, last, types = batch.first_offset, batch.last_offset, list(batch.acknowledge_types)
        if first < 0 or last < first or first <= end or len(types) not in (1, last - first + 1):
            raise InvalidRequestError(f"acknowledgement batch [{first}, {last}] with {len(types)} type(s) is malformed")
        end = last
        for i, kind in enumerate(types if len(types) > 1 else [types[0]]):
            kind = AcknowledgeType.ACCEPT if kind == GAP else kind
            offset = first + i
            if len(types) == 1:
                out.append((first, last, int(kind)))
            elif out and out[-1][1] == offset - 1 and out[-1][2] == kind:
                out[-1] = (out[-1][0], offset, int(kind))
            else:
                out.append((offset, offset, int(kind)))
    return out


async def _names(view: BrokerView, topic_ids: set[uuid.UUID]) -> dict[uuid.UUID, str | KafkaError]:
    return await view.topic_names(topic_ids) if topic_ids else {}


_releasing: set[asyncio.Future] = set()  # releases in the background, held until done


def _session_ended(view: BrokerView, ended: list[Ended]) -> None:
    """What the members of ended sessions held goes back (in the background)."""
    if ended:
        task = asyncio.ensure_future(_release(view, ended))
        _releasing.add(task)
        task.add_done_callback(_releasing.discard)


async def _release(view: BrokerView, ended: list[Ended]) -> None:
    """What the members of ended sessions held on their partitions goes back; a partition
    that does not answer keeps them until their locks expire."""
    calls = [view.call(t, p, "share_release_member", e.group_id, e.member_id) for e in ended for t, p in e.partitions]
    for outcome in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(outcome, BaseException):
            logger.info("a share session's records were not released (their locks expire): %r", outcome)


def _top_error(error: BaseException, extra: dict | None = None) -> dict:
    return {"error_code": error_code_of(error), "error_message": error_message_of(error), "responses": [],
            "node_endpoints": [], **(extra or {})}  # fmt: skip


async def share_fetch(view: BrokerView, request: Any) -> dict:
    body = request.body
    lock_ms = {"acquisition_lock_timeout": view.config.group_share_record_lock_duration_ms}
    try:
        if not body.group_id or not body.member_id:
            raise InvalidRequestError("GroupId and MemberId can't be empty.")
        if not view.authorized(request, READ, GROUP, body.group_id):
            raise GroupAuthorizationFailedError(f"{request.context.principal} may not use group {body.group_id!r}")
        names = await _names(view, {t.topic_id for t in body.topics} | {t.topic_id for t in body.forgotten_topics_data})
        asked = _ShareFetchPartitions.of(body, names)
        session, ended = view.share_sessions.request(body.group_id, body.member_id, body.share_session_epoch,
                                                     asked.added, asked.forgotten, asked.ids)  # fmt: skip
    except Exception as e:
        return _top_error(e, lock_ms)
    own = [e for e in ended if (e.group_id, e.member_id) == (body.group_id, body.member_id)]
    _session_ended(view, [e for e in ended if e not in own])  # evicted: others' sessions
    if session is not None and own:  # the member opened a new session: its old one's records go back first
        await _release(view, own)
    ids = session.topic_ids if session is not None else asked.ids
    wanted = list(session.partitions) if session is not None else []
    for tp in asked.acks:
        if tp not in wanted:
            wanted.append(tp)  # (a close: acknowledgements only)
    max_records = body.max_records if getattr(body, "max_records", 0) > 0 else DEFAULT_MAX_RECORDS
    max_wait_ms = min(max(ms(body.max_wait), 0), MAX_SHARE_FETCH_WAIT_MS)
    read = _ShareReader(view, request, session, max_records).read
    deadline = time.monotonic() + max_wait_ms / 1000
    first_wait = max_wait_ms if len(wanted) == 1 else 0
    results = list(await asyncio.gather(*(read(tp, first_wait, asked.acks.get(tp, [])) for tp in wanted)))
    if session is not None and len(wanted) > 1 and not any(r.acquired or r.error for r in results):
        # Nothing anywhere: wait for the first partition with records to acquire (probes,
        # which acquire nothing, so those not needed are left to end at their leaders), then
        # acquire from every partition again. If that finds nothing (another member was
        # quicker), every partition waits at its leader for what is left of max_wait.
        if await _first_acquirable(view, body.group_id, body.member_id, session.partitions, deadline):
            again = await asyncio.gather(*(read(tp, 0, []) for tp in wanted))
            results = [_merged(r, w) for r, w in zip(results, again)]
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms > 0 and not any(r.acquired or r.error for r in results):
                again = await asyncio.gather(*(read(tp, remaining_ms, []) for tp in wanted))
                results = [_merged(r, w) for r, w in zip(results, again)]
    if session is None:  # closed: what it still holds goes back, once its acknowledgements are applied
        await _release(view, own)
    return {"error_code": 0, "responses": _share_fetch_responses(body, asked, ids, wanted, results),
            "node_endpoints": [], **lock_ms}  # fmt: skip


class _ShareFetchPartitions(NamedTuple):
    """What a ShareFetch names: the partitions it adds to its session and their
    acknowledgements, those it forgets, and those of topic ids that name no topic."""

    acks: dict[Partition, Acks]
    unknown: dict[tuple[uuid.UUID, int], KafkaError]
    added: list[Partition]
    forgotten: list[Partition]
    ids: dict[str, uuid.UUID]  # topic -> its id

    @classmethod
    def of(cls, body: Any, names: dict[uuid.UUID, str | KafkaError]) -> _ShareFetchPartitions:
        """INVALID_REQUEST for acknowledgements on a request that opens a session."""
        acks: dict[Partition, Acks] = {}
        unknown: dict[tuple[uuid.UUID, int], KafkaError] = {}
        added: list[Partition] = []
        for t in body.topics:
            name = names.get(t.topic_id)
            for p in t.partitions:
                if not isinstance(name, str):
                    unknown[(t.topic_id, p.partition_index)] = name
                    continue
                added.append((name, p.partition_index))
                if p.acknowledgement_batches:
                    acks[(name, p.partition_index)] = acknowledgements(p.acknowledgement_batches)
        forgotten = [(names[t.topic_id], p) for t in body.forgotten_topics_data for p in t.partitions
                     if isinstance(names.get(t.topic_id), str)]  # fmt: skip
        if body.share_session_epoch == OPEN_EPOCH and (acks or any(
                p.acknowledgement_batches for t in body.topics for p in t.partitions)):  # fmt: skip
            raise InvalidRequestError("Acknowledge data is present on the initial ShareFetch of a share session.")
        ids = {name: tid for tid, name in names.items() if isinstance(name, str)}
        return cls(acks, unknown, added, forgotten, ids)


class _ShareReader:
    """One ShareFetch request's fetches (and acknowledgements) of its partitions at their
    leaders: what a fetch needs that is the same for every partition of the request."""

    __slots__ = ("_view", "_request", "_session", "_max_records")

    def __init__(self, view: BrokerView, request: Any, session: Any, max_records: int) -> None:
        self._view, self._request, self._session, self._max_records = view, request, session, max_records

    async def read(self, tp: Partition, wait_ms: int, partition_acks: Acks) -> ShareFetchResult:
        """The partition's acknowledgements applied, then records acquired (waiting up to
        `wait_ms`), unless the session no longer has it (closing, or forgotten:
        acknowledgements only); a failure is that partition's error."""
        view, request, session = self._view, self._request, self._session
        body = request.body
        try:
            if not view.authorized(request, READ, TOPIC, tp[0]):
                raise TopicAuthorizationFailedError(f"{request.context.principal} may not read {tp[0]!r}")
            if session is None or tp not in session.partitions:  # closing, or forgotten: acknowledge only
                if not partition_acks:
                    return ShareFetchResult()
                acked = await view.share_fetch(*tp, ShareFetchRequest(body.group_id, body.member_id, 0, 0, tuple(partition_acks)))
                return ShareFetchResult(acknowledge_error=acked.acknowledge_error)
            return await view.share_fetch(*tp, ShareFetchRequest(body.group_id, body.member_id, self._max_records, wait_ms,
                                                                 tuple(partition_acks)))  # fmt: skip
        except KafkaError as e:
            return ShareFetchResult(acknowledge_error=e if partition_acks else None, error=e)
        except Exception as e:  # a replica's unexpected error: this partition's, not the request's
            logger.exception("share fetch of %s-%d", *tp)
            error = KafkaError(str(e))
            return ShareFetchResult(acknowledge_error=error if partition_acks else None, error=error)


def _share_fetch_responses(body: Any, asked: _ShareFetchPartitions, ids: dict[str, uuid.UUID],
                           wanted: list[Partition], results: list[ShareFetchResult]) -> list[dict]:  # fmt: skip
    """A ShareFetch answer's partitions by topic id: those that acquired, failed, were
    acknowledged or added, and those of unknown topic ids."""
    responses: dict[uuid.UUID, list[dict]] = {}
    for tp, r in zip(wanted, results):
        if not (r.acquired or r.error or tp in asked.acks or tp in asked.added):
            continue
        responses.setdefault(ids[tp[0]], []).append(_partition_answer(tp[1], r))
    for (topic_id, partition), error in asked.unknown.items():
        acked = any(p.acknowledgement_batches for t in body.topics if t.topic_id == topic_id for p in t.partitions
                    if p.partition_index == partition)  # fmt: skip
        responses.setdefault(topic_id, []).append(
            _partition_answer(partition, ShareFetchResult(acknowledge_error=error if acked else None, error=error)))
    return [{"topic_id": t, "partitions": ps} for t, ps in responses.items()]


async def _first_acquirable(view: BrokerView, group_id: str, member_id: str, partitions: Iterable[Partition],
                            deadline: float) -> bool:  # fmt: skip
    """Waits, until `deadline` (time.monotonic), for one of the partitions to have records
    the member could acquire; False if none had by then."""
    remaining_ms = int((deadline - time.monotonic()) * 1000)
    if remaining_ms <= 0:
        return False
    probes = [asyncio.ensure_future(view.share_fetch(*tp, ShareFetchRequest(group_id, member_id, 0, remaining_ms)))
              for tp in partitions]  # fmt: skip
    for probe in probes:  # (one that fails after the first answer is not looked at: its error is not logged)
        probe.add_done_callback(lambda p: p.cancelled() or p.exception())
    try:
        for probe in asyncio.as_completed(probes, timeout=remaining_ms / 1000):
            try:
                answer = await probe
            except TimeoutError:  # as_completed's: no probe answered by the deadline
                raise
            except Exception:  # (that partition's fetch reports it)
                return True
            if answer.error is not None or time.monotonic() < deadline:
                return True
    except TimeoutError:
        pass
    finally:
        for probe in probes:
            probe.cancel()  # abandoned: its leader ends it at its wait's end
    return False


def _merged(first: ShareFetchResult, waited: ShareFetchResult) -> ShareFetchResult:
    """The waited fetch's records, with the first one's acknowledgement outcome."""
    return ShareFetchResult(waited.records, waited.acquired, first.acknowledge_error, waited.error)


def _partition_answer(partition: int, r: ShareFetchResult) -> dict:
    return {
        "partition_index": partition,
        "error_code": error_code_of(r.error) if r.error is not None else 0,
        "error_message": error_message_of(r.error) if r.error is not None else None,
        "acknowledge_error_code": error_code_of(r.acknowledge_error) if r.acknowledge_error is not None else 0,
        "acknowledge_error_message": error_message_of(r.acknowledge_error) if r.acknowledge_error is not None else None,
        "current_leader": {"leader_id": -1, "leader_epoch": -1},
        "records": r.records,
        "acquired_records": [{"first_offset": a, "last_offset": b, "delivery_count": n} for a, b, n in r.acquired],
    }


async def share_acknowledge(view: BrokerView, request: Any) -> dict:
    body = request.body
    try:
        if not body.group_id or not body.member_id:
            raise InvalidRequestError("GroupId and MemberId can't be empty.")
        if not view.authorized(request, READ, GROUP, body.group_id):
            raise GroupAuthorizationFailedError(f"{request.context.principal} may not use group {body.group_id!r}")
        if body.share_session_epoch == OPEN_EPOCH:
            raise InvalidShareSessionEpochError("ShareAcknowledge cannot open a share session")
        names = await _names(view, {t.topic_id for t in body.topics})
        wanted: list[tuple[uuid.UUID, int, str | KafkaError, Acks]] = [
            (t.topic_id, p.partition_index, names[t.topic_id], acknowledgements(p.acknowledgement_batches))
            for t in body.topics for p in t.partitions
        ]
        session, ended = view.share_sessions.request(body.group_id, body.member_id, body.share_session_epoch)
    except Exception as e:
        return _top_error(e)

    async def one(name: str | KafkaError, partition: int, acks: Acks) -> dict:
        try:
            if isinstance(name, KafkaError):
                raise name
            if not view.authorized(request, READ, TOPIC, name):
                raise TopicAuthorizationFailedError(f"{request.context.principal} may not read {name!r}")
            acked = await view.share_fetch(name, partition, ShareFetchRequest(body.group_id, body.member_id, 0, 0, tuple(acks)))
            error = acked.acknowledge_error
        except KafkaError as e:
            error = e
        return {"partition_index": partition, "error_code": error_code_of(error) if error else 0,
                "error_message": error_message_of(error) if error else None,
                "current_leader": {"leader_id": -1, "leader_epoch": -1}}  # fmt: skip

    answers = await asyncio.gather(*(one(name, p, acks) for _, p, name, acks in wanted))
    await _release(view, ended)  # (a close: after its acknowledgements)
    responses: dict[uuid.UUID, list[dict]] = {}
    for (topic_id, _, _, _), answer in zip(wanted, answers):
        responses.setdefault(topic_id, []).append(answer)
    return {"error_code": 0, "responses": [{"topic_id": t, "partitions": ps} for t, ps in responses.items()],
            "node_endpoints": []}

