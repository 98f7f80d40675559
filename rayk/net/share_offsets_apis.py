"""A share group's offsets on the wire (KIP-932's admin APIs, what Kafka's Admin
listShareGroupOffsets / alterShareGroupOffsets / deleteShareGroupOffsets and
kafka-share-groups.sh send), answered by the group's coordinator (share_coordinator.py):

- DescribeShareGroupOffsets: per group, each share-partition's start offset (SPSO); the
  partitions asked for (all the group has a state for when the request names no topics),
  -1 for one without a state. DESCRIBE on the group and on each topic.
- AlterShareGroupOffsets: the share-partitions start at the given offsets, with nothing in
  flight. READ on the group and on each topic.
- DeleteShareGroupOffsets: the topics' share-partition states go; the group starts them
  again where its `share.auto.offset.reset` says. DELETE on the group, READ on each topic.

Altering and deleting need an empty group (NON_EMPTY_GROUP), as in Kafka; an unknown group
is GROUP_ID_NOT_FOUND, a topic or partition that does not exist
UNKNOWN_TOPIC_OR_PARTITION, an offset below 0 INVALID_REQUEST, each for its own entry.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rayk.acls import DESCRIBE, READ, TOPIC
from rayk.errors import (
    InvalidRequestError,
    KafkaError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of
from rayk.net.group_apis import TOPIC_LOOKUP_TIMEOUT_MS, coordinator_call

NO_OFFSET = -1
NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # Kafka's Uuid.ZERO_UUID, for a topic that does not exist


async def describe_share_group_offsets(view: BrokerView, request: Any) -> dict:
    topics = await _topics(view)

    async def one(group: Any) -> dict:
        try:
            offsets = await coordinator_call(view, request, group.group_id, "share_group_offsets")
        except KafkaError as e:
            return {"group_id": group.group_id, "topics": [], **_error(e)}
        wanted = _by_topic(offsets) if group.topics is None else {t.topic_name: list(t.partitions) for t in group.topics}
        answered = []
        for name, partitions in wanted.items():
            refused = _refused(view, request, DESCRIBE, topics, name)
            errors = {p: refused or _missing(topics, name, p) for p in partitions}
            answered.append({"topic_name": name, "topic_id": _topic_id(topics, name), "partitions": [
                {"partition_index": p, "start_offset": NO_OFFSET if errors[p] else offsets.get((name, p), NO_OFFSET),
                 "leader_epoch": -1, **_error(errors[p])}
                for p in partitions]})  # fmt: skip
        return {"group_id": group.group_id, "topics": answered, **_error(None)}

    return {"groups": list(await asyncio.gather(*(one(g) for g in request.body.groups)))}


async def alter_share_group_offsets(view: BrokerView, request: Any) -> dict:
    body = request.body
    topics = await _topics(view)
    errors: dict[tuple[str, int], KafkaError | None] = {}
    wanted: dict[tuple[str, int], int] = {}
    for t in body.topics:
        refused = _refused(view, request, READ, topics, t.topic_name)
        for p in t.partitions:
            error = refused or _missing(topics, t.topic_name, p.partition_index) or (
                InvalidRequestError(f"start offset {p.start_offset} is below 0") if p.start_offset < 0 else None)
            errors[(t.topic_name, p.partition_index)] = error
            if error is None:
                wanted[(t.topic_name, p.partition_index)] = p.start_offset
    group_error = await _group_call(view, request, body.group_id, "alter_share_group_offsets", wanted)
    return {**_error(group_error), "responses": [
        {"topic_name": t.topic_name, "topic_id": _topic_id(topics, t.topic_name), "partitions": [
            {"partition_index": p.partition_index,
             **_error(errors[(t.topic_name, p.partition_index)] or group_error)} for p in t.partitions]}
        for t in body.topics]}  # fmt: skip


async def delete_share_group_offsets(view: BrokerView, request: Any) -> dict:
    body = request.body
    topics = await _topics(view)
    errors = {t.topic_name: _refused(view, request, READ, topics, t.topic_name) or _missing(topics, t.topic_name)
              for t in body.topics}  # fmt: skip
    wanted = [name for name, error in errors.items() if error is None]
    group_error = await _group_call(view, request, body.group_id, "delete_share_group_offsets", wanted)
    return {**_error(group_error), "responses": [
        {"topic_name": t.topic_name, "topic_id": _topic_id(topics, t.topic_name), **_error(errors[t.topic_name] or group_error)}
        for t in body.topics]}  # fmt: skip


async def _group_call(view: BrokerView, request: Any, group_id: str, method: str, wanted: Any) -> KafkaError | None:
    """The coordinator's `method` for the group (authorized there, group_apis._GROUP_OPERATION):
    its error, None once done."""
    try:
        await coordinator_call(view, request, group_id, method, wanted)
    except KafkaError as e:
        return e
    return None


async def _topics(view: BrokerView) -> dict[str, dict]:
    return (await view.ask_controller("client_metadata", None, timeout_ms=TOPIC_LOOKUP_TIMEOUT_MS))["topics"]


def _refused(view: BrokerView, request: Any, operation: str, topics: dict, name: str) -> KafkaError | None:
    if view.authorized(request, operation, TOPIC, name):
        return None
    return TopicAuthorizationFailedError(f"{request.context.principal} may not use topic {name!r}")


def _missing(topics: dict, name: str, partition: int | None = None) -> KafkaError | None:
    known = topics.get(name)
    if known is None or (partition is not None and partition not in known["partitions"]):
        where = name if partition is None else f"{name}-{partition}"
        return UnknownTopicOrPartitionError(f"{where} does not exist")
    return None


def _topic_id(topics: dict, name: str) -> str:
    known = topics.get(name)
    return NO_TOPIC_ID if known is None else known["topic_id"]


def _by_topic(offsets: dict[tuple[str, int], int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, []).append(partition)
    return out


def _error(error: KafkaError | None) -> dict:
    return {"error_code": error_code_of(error) if error is not None else 0,
            "error_message": error_message_of(error) if error is not None else None}  # fmt: skip
