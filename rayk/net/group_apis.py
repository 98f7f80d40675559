"""FindCoordinator (of groups, and of transactional ids: txn_apis.py) and the consumer
group APIs (Join/Sync/Heartbeat/Leave, OffsetCommit, TxnOffsetCommit, OffsetFetch,
ListGroups, DescribeGroups, DeleteGroups, OffsetDelete).

A group's coordinator is the leader of its `__consumer_offsets` partition. The listener
passes group requests to this broker's replica of that partition, whose GroupCoordinator
answers NOT_COORDINATOR when it does not lead it; so a Kafka client and a rayk client in
the same group meet at the same coordinator and share committed offsets.

With an authorizer, as in Kafka: joining, syncing, heartbeats, leaving and committing
need READ on the group (a TxnOffsetCommit WRITE on its transactional id too),
FindCoordinator, OffsetFetch and DescribeGroups DESCRIBE, DeleteGroups and OffsetDelete
DELETE (else GROUP_AUTHORIZATION_FAILED); committing or deleting a topic's offsets needs
READ on the topic and fetching them DESCRIBE (else TOPIC_AUTHORIZATION_FAILED for its
partitions); ListGroups shows the groups the principal may DESCRIBE (all, with DESCRIBE on
the cluster).
"""

from __future__ import annotations

import asyncio
from typing import Any

from rayk.acls import CLUSTER, DELETE, DESCRIBE, GROUP, READ, TOPIC, TRANSACTIONAL_ID, WRITE
from rayk.errors import (
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    InvalidRequestError,
    KafkaError,
    NotCoordinatorError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    UnstableOffsetCommitError,
)
from rayk.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from rayk.net.admin_apis import NO_AUTHORIZED_OPERATIONS
from rayk.net.api_versions import transaction_version_of
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of
from rayk.net.entities import ms
from rayk.net.txn_apis import add_offsets_partition

GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE = 0, 1
TOPIC_LOOKUP_TIMEOUT_MS = 5_000  # an OffsetCommit waits no longer for the Controller to say which partitions exist


# What each coordinator call needs on the group, as in Kafka.
_GROUP_OPERATION = {"join_group": READ, "sync_group": READ, "heartbeat": READ, "leave_group": READ,
                    "consumer_heartbeat": READ, "commit_offsets": READ, "txn_commit_offsets": READ,
                    "fetch_offsets": DESCRIBE, "pending_partitions": DESCRIBE, "describe_group": DESCRIBE,
                    "describe_consumer_group": DESCRIBE, "delete_group": DELETE, "delete_offsets": DELETE,
                    "share_heartbeat": READ, "describe_share_group": DESCRIBE, "share_group_offsets": DESCRIBE,
                    "alter_share_group_offsets": READ, "delete_share_group_offsets": DELETE}


async def coordinator_call(view: BrokerView, request: Any, group_id: str, method: str, *args: Any) -> Any:
    """`method` of the group's coordinator, as the request's principal (GROUP_AUTHORIZATION_FAILED
    without the ACL it needs); NOT_COORDINATOR where this broker holds no replica of its partition."""
    if not view.authorized(request, _GROUP_OPERATION[method], GROUP, group_id):
        raise GroupAuthorizationFailedError(f"{request.context.principal} may not use group {group_id!r}")
    partition = await view.group_partition(group_id)
    try:
        return await view.call(OFFSETS_TOPIC, partition, method, group_id, *args, lost=CoordinatorNotAvailableError)
    except KafkaError as e:
        if e.code == 6:  # this broker holds no replica of the group's partition
            raise NotCoordinatorError(f"broker {view.broker_id} does not coordinate group {group_id!r}") from None
        raise


async def find_coordinator(view: BrokerView, request: Any) -> dict:
    body = request.body
    keys = list(getattr(body, "coordinator_keys", None) or [getattr(body, "key", "")])

    async def one(key: str) -> dict:
        try:
            if body.key_type == GROUP_KEY_TYPE:
                if not view.authorized(request, DESCRIBE, GROUP, key):
                    raise GroupAuthorizationFailedError(f"{request.context.principal} may not describe group {key!r}")
                topic, partition = OFFSETS_TOPIC, await view.group_partition(key)
            elif body.key_type == TRANSACTION_KEY_TYPE:
                if not key:
                    raise InvalidRequestError("a transactional id may not be empty")
                if not view.authorized(request, DESCRIBE, TRANSACTIONAL_ID, key):
                    raise TransactionalIdAuthorizationFailedError(
                        f"{request.context.principal} may not describe transactional id {key!r}"
                    )
                topic, partition = TRANSACTION_STATE_TOPIC, await view.transaction_partition(key)
            else:
                raise InvalidRequestError(f"coordinator key type {body.key_type}: rayk has groups (0) and transactions (1)")
            described = await view.client_metadata([topic])
            leader = described["topics"][topic]["partitions"][partition]["leader"]
            endpoint = described["brokers"].get(leader, {}).get(request.context.listener_name)
            if endpoint is None:
                raise CoordinatorNotAvailableError(f"the coordinator of {key!r} (broker {leader}) is not available")
            return {"key": key, "node_id": leader, "host": endpoint[0], "port": endpoint[1]}
        except Exception as e:
            return {"key": key, "error_code": error_code_of(e), "error_message": error_message_of(e),
                    "node_id": -1, "host": "", "port": -1}

    coordinators = await asyncio.gather(*(one(k) for k in keys))
    return {**coordinators[0], "coordinators": coordinators}  # v0-3 answer at the top level, v4+ in the list


async def join_group(view: BrokerView, request: Any) -> dict:
    body = request.body
    session_ms = ms(body.session_timeout)
    rebalance_ms = ms(getattr(body, "rebalance_timeout", None), session_ms)
    protocols = [(p.name, bytes(p.metadata)) for p in body.protocols]
    try:
        result = await coordinator_call(
            view, request, body.group_id, "join_group", body.member_id, request.client_id or "", session_ms, rebalance_ms,
            body.protocol_type, protocols, getattr(body, "group_instance_id", None),  # v5+ (KIP-345)
        )
    except Exception as e:
        return {"error_code": error_code_of(e), "generation_id": -1, "member_id": body.member_id, "leader": "",
                "protocol_name": None}
    return {
        "generation_id": result.generation,
        "protocol_type": body.protocol_type,
        "protocol_name": result.protocol,
        "leader": result.leader_id,
        "member_id": result.member_id,
        "members": [{"member_id": m, "metadata": metadata} for m, metadata in result.members],
    }


async def sync_group(view: BrokerView, request: Any) -> dict:
    body = request.body
    assignments = {a.member_id: bytes(a.assignment) for a in body.assignments} or None
    try:
        assignment = await coordinator_call(view, request, body.group_id, "sync_group", body.generation_id,
                                             body.member_id, assignments, getattr(body, "group_instance_id", None))
    except Exception as e:
        return {"error_code": error_code_of(e), "assignment": b""}
    return {"protocol_type": getattr(body, "protocol_type", None), "protocol_name": getattr(body, "protocol_name", None),
            "assignment": assignment}


async def heartbeat(view: BrokerView, request: Any) -> dict:
    body = request.body
    try:
        await coordinator_call(view, request, body.group_id, "heartbeat", body.generation_id, body.member_id,
                                getattr(body, "group_instance_id", None))
    except Exception as e:
        return {"error_code": error_code_of(e)}
    return {}


async def leave_group(view: BrokerView, request: Any) -> dict:
    body = request.body
    members = ([(m.member_id, getattr(m, "group_instance_id", None)) for m in body.members]  # v3+: a batch,
               if hasattr(body, "members") else [(body.member_id, None)])  # static members by instance id
    if not view.authorized(request, READ, GROUP, body.group_id):
        return {"error_code": GroupAuthorizationFailedError.code, "members": []}
    answers = []
    for member_id, group_instance_id in members:
        identity = {"member_id": member_id, "group_instance_id": group_instance_id}
        try:
            await coordinator_call(view, request, body.group_id, "leave_group", member_id, group_instance_id)
            answers.append(identity)
        except Exception as e:
            answers.append({**identity, "error_code": error_code_of(e)})
    top = answers[0].get("error_code", 0) if len(answers) == 1 else 0
    return {"error_code": top, "members": answers}


async def offset_commit(view: BrokerView, request: Any) -> dict:
    """Commits the offsets of the partitions that exist, of topics the principal may READ,
    with the leader epoch of the record they follow (v6+, KIP-320; -1 before): as Kafka's
    KafkaApis, the others' partitions get TOPIC_AUTHORIZATION_FAILED, or
    UNKNOWN_TOPIC_OR_PARTITION for a topic or partition that does not exist, and nothing
    is stored for them."""
    body = request.body
    if not view.authorized(request, READ, GROUP, body.group_id):  # the group first, as Kafka: every partition
        return _per_partition(body.topics, lambda t, p: GroupAuthorizationFailedError.code)
    try:
        refused = await _refused_partitions(view, request, body.topics)
    except Exception as e:  # the Controller did not say: nothing is committed, the client retries
        code = error_code_of(e)
        return _per_partition(body.topics, lambda t, p: code)
    offsets = {
        (t.name, p.partition_index): (p.committed_offset, p.committed_metadata or "",
                                      getattr(p, "committed_leader_epoch", -1))
        for t in body.topics for p in t.partitions if (t.name, p.partition_index) not in refused
    }
    code = 0
    if offsets:  # (Kafka does not ask the coordinator when no partition is left)
        try:
            await coordinator_call(view, request, body.group_id, "commit_offsets", body.generation_id_or_member_epoch,
                                    body.member_id, offsets, getattr(body, "group_instance_id", None))
        except Exception as e:
            code = error_code_of(e)
    return _per_partition(body.topics, lambda t, p: refused.get((t, p), code))


async def txn_offset_commit(view: BrokerView, request: Any) -> dict:
    """A transactional producer's commit of a group's offsets (KIP-98, KIP-447): written as
    the producer's transactional records, committed with its transaction. Needs WRITE on the
    transactional id besides what OffsetCommit needs, as in Kafka. v5+ (transaction version
    2, KIP-890) adds the group's offsets partition to the transaction first."""
    body = request.body
    if not view.authorized(request, WRITE, TRANSACTIONAL_ID, body.transactional_id):
        return _per_partition(body.topics, lambda t, p: TransactionalIdAuthorizationFailedError.code)
    if not view.authorized(request, READ, GROUP, body.group_id):
        return _per_partition(body.topics, lambda t, p: GroupAuthorizationFailedError.code)
    try:
        refused = await _refused_partitions(view, request, body.topics)
    except Exception as e:
        code = error_code_of(e)
        return _per_partition(body.topics, lambda t, p: code)
    offsets = {
        (t.name, p.partition_index): (p.committed_offset, p.committed_metadata or "", getattr(p, "committed_leader_epoch", -1))
        for t in body.topics for p in t.partitions if (t.name, p.partition_index) not in refused
    }
    code = 0
    if offsets:
        try:
            if transaction_version_of(request) >= 2:
                await add_offsets_partition(view, body.transactional_id, body.producer_id, body.producer_epoch, body.group_id)
            await coordinator_call(
                view, request, body.group_id, "txn_commit_offsets", body.transactional_id, body.producer_id,
                body.producer_epoch, getattr(body, "generation_id", -1), getattr(body, "member_id", ""), offsets,
                getattr(body, "group_instance_id", None),  # v3+ (KIP-447)
            )  # fmt: skip
        except Exception as e:
            code = error_code_of(e)
    return _per_partition(body.topics, lambda t, p: refused.get((t, p), code))


async def _refused_partitions(view: BrokerView, request: Any, topics: Any) -> dict[tuple[str, int], int]:
    """The error codes of the partitions of `topics` that an offset request may not touch:
    TOPIC_AUTHORIZATION_FAILED for a topic the principal may not READ, else
    UNKNOWN_TOPIC_OR_PARTITION for one that does not exist (KafkaApis' order)."""
    readable = {t.name for t in topics if view.authorized(request, READ, TOPIC, t.name)}
    refused = {(t.name, p.partition_index): TopicAuthorizationFailedError.code
               for t in topics if t.name not in readable for p in t.partitions}
    refused.update(await _missing_partitions(view, [(t.name, p.partition_index) for t in topics
                                                    if t.name in readable for p in t.partitions]))
    return refused


async def _missing_partitions(view: BrokerView, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """UNKNOWN_TOPIC_OR_PARTITION for each of `partitions` that does not exist; a Controller
    that does not answer in time is COORDINATOR_NOT_AVAILABLE (retriable for every client)."""
    if not partitions:
        return {}
    try:
        described = await view.ask_controller("client_metadata", sorted({t for t, _ in partitions}),
                                              timeout_ms=TOPIC_LOOKUP_TIMEOUT_MS)
    except KafkaError as e:
        raise CoordinatorNotAvailableError(f"could not look the topics up: {e}") from None
    topics = described["topics"]
    return {(t, p): UnknownTopicOrPartitionError.code for t, p in partitions
            if t not in topics or p not in topics[t]["partitions"]}


def _per_partition(topics: Any, code_of: Any) -> dict:
    """An answer naming every partition of `topics`, each with `code_of(topic, partition)`."""
    return {"topics": [{"name": t.name, "partitions": [
        {"partition_index": p.partition_index, "error_code": code_of(t.name, p.partition_index)}
        for p in t.partitions]} for t in topics]}


async def offset_fetch(view: BrokerView, request: Any) -> dict:
    body = request.body
    if hasattr(body, "groups"):  # v8+: several groups per request
        groups = [await _fetch_group(view, request, g.group_id, g.topics, getattr(g, "member_id", None),
                                     getattr(g, "member_epoch", -1)) for g in body.groups]  # fmt: skip
        return {"groups": groups}
    answer = await _fetch_group(view, request, body.group_id, body.topics)
    return {"topics": answer["topics"], "error_code": answer["error_code"]}


async def _fetch_group(view: BrokerView, request: Any, group_id: str, topics: Any, member_id: str | None = None,
                       member_epoch: int = -1) -> dict:  # fmt: skip
    """A group's committed offsets: of the topics the principal may DESCRIBE (the others
    are TOPIC_AUTHORIZATION_FAILED when named, left out when all are asked for). With
    require_stable (v7+, KIP-447), a partition whose transactional offsets await their
    marker is UNSTABLE_OFFSET_COMMIT, which the client retries. A consumer-protocol member
    names itself and its epoch (v9+): STALE_MEMBER_EPOCH if that is not its current one."""
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    try:
        committed = await coordinator_call(view, request, group_id, "fetch_offsets", wanted, False, member_id,
                                           member_epoch)  # fmt: skip
        unstable = (await coordinator_call(view, request, group_id, "pending_partitions")
                    if getattr(request.body, "require_stable", False) else set())
    except Exception as e:
        return {"group_id": group_id, "error_code": error_code_of(e), "topics": []}
    if wanted is None:
        wanted = [tp for tp in sorted(committed) if view.authorized(request, DESCRIBE, TOPIC, tp[0])]
    by_topic: dict[str, list[dict]] = {}
    for topic, partition in wanted:
        c = committed.get((topic, partition))
        denied = not view.authorized(request, DESCRIBE, TOPIC, topic)
        code = (TopicAuthorizationFailedError.code if denied
                else UnstableOffsetCommitError.code if (topic, partition) in unstable else 0)
        by_topic.setdefault(topic, []).append({
            "partition_index": partition,
            "committed_offset": c.offset if c and not code else -1,
            "committed_leader_epoch": c.leader_epoch if c and not code else -1,
            "metadata": c.metadata if c and not code else "",
            "error_code": code,
        })
    return {"group_id": group_id, "error_code": 0,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}


async def list_groups(view: BrokerView, request: Any) -> dict:
    """The groups this broker coordinates (as Kafka: an admin client asks every broker),
    of the states and (v5+) types ("classic", "consumer") asked for, if any."""
    states = {s.lower() for s in (getattr(request.body, "states_filter", None) or ())}
    types = {t.lower() for t in (getattr(request.body, "types_filter", None) or ())}
    described = await view.controller.client_metadata.remote([OFFSETS_TOPIC])
    partitions = described["topics"].get(OFFSETS_TOPIC, {}).get("partitions", {})
    mine = [p for p, s in partitions.items() if s["leader"] == view.broker_id]
    found = await asyncio.gather(*(view.call(OFFSETS_TOPIC, p, "list_groups") for p in mine), return_exceptions=True)
    groups = []
    for answer in found:
        if isinstance(answer, BaseException):
            continue  # leadership moved since the metadata was read
        for g in answer:
            visible = view.authorized(request, DESCRIBE, CLUSTER) or view.authorized(request, DESCRIBE, GROUP, g["group_id"])
            if visible and (not states or g["state"].lower() in states) and (not types or g["group_type"] in types):
                groups.append({"group_id": g["group_id"], "protocol_type": g["protocol_type"],
                               "group_state": g["state"], "group_type": g["group_type"]})
    return {"groups": groups}


async def describe_groups(view: BrokerView, request: Any) -> dict:
    async def one(group_id: str) -> dict:
        try:
            g = await coordinator_call(view, request, group_id, "describe_group")
        except Exception as e:
            return {"group_id": group_id, "error_code": error_code_of(e), "error_message": error_message_of(e),
                    "group_state": "", "protocol_type": "", "protocol_data": "",
                    "authorized_operations": NO_AUTHORIZED_OPERATIONS}
        return {
            "group_id": group_id,
            "group_state": g["state"],
            "protocol_type": g["protocol_type"] or "",
            "protocol_data": g["protocol"] or "",
            "members": [{"member_id": m["member_id"], "group_instance_id": m["group_instance_id"],
                         "client_id": m["client_id"], "client_host": "",
                         "member_metadata": m.get("metadata", b""), "member_assignment": m["assignment"] or b""}
                        for m in g["members"]],
            "authorized_operations": view.authorized_operations(request, GROUP, group_id)
            if getattr(request.body, "include_authorized_operations", False) else NO_AUTHORIZED_OPERATIONS,
        }

    return {"groups": list(await asyncio.gather(*(one(g) for g in request.body.groups)))}


async def delete_groups(view: BrokerView, request: Any) -> dict:
    """DeleteGroups: each group at its coordinator, which writes the tombstones; a group
    with members is NON_EMPTY_GROUP, an unknown one GROUP_ID_NOT_FOUND, and without DELETE
    on the group GROUP_AUTHORIZATION_FAILED."""
    async def one(group_id: str) -> dict:
        try:
            await coordinator_call(view, request, group_id, "delete_group")
        except Exception as e:
            return {"group_id": group_id, "error_code": error_code_of(e)}
        return {"group_id": group_id}

    return {"results": list(await asyncio.gather(*(one(g) for g in request.body.groups_names)))}


async def offset_delete(view: BrokerView, request: Any) -> dict:
    """OffsetDelete (KIP-496), as Kafka's KafkaApis: DELETE on the group (else the
    top-level GROUP_AUTHORIZATION_FAILED), READ on each topic (else its partitions'
    TOPIC_AUTHORIZATION_FAILED), UNKNOWN_TOPIC_OR_PARTITION for partitions that do not
    exist; the coordinator tombstones the rest (GroupCoordinator.delete_offsets), and a
    group's error (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP) is the top-level code."""
    body = request.body
    if not view.authorized(request, DELETE, GROUP, body.group_id):
        return {"error_code": GroupAuthorizationFailedError.code, "topics": []}
    try:
        codes = await _refused_partitions(view, request, body.topics)
        wanted = [(t.name, p.partition_index) for t in body.topics for p in t.partitions
                  if (t.name, p.partition_index) not in codes]
        results = await coordinator_call(view, request, body.group_id, "delete_offsets", wanted)
    except Exception as e:
        return {"error_code": error_code_of(e), "topics": []}
    for tp, error in results.items():
        codes[tp] = 0 if error is None else error.code
    return {"error_code": 0, **_per_partition(body.topics, lambda t, p: codes[(t, p)])}
