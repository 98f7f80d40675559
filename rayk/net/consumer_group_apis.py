"""ConsumerGroupHeartbeat and ConsumerGroupDescribe: KIP-848's consumer group protocol on the
wire (the group itself is rayk.coordinator.group.consumer_protocol_group, hosted by the group
coordinator like the classic groups of group_apis.py).

On the wire partitions are named by topic id; the coordinator keeps topic names. Each
heartbeat looks the cluster's topics up at the Controller (names, ids, partition counts),
so that a topic created or grown since the last one changes the group at once; an owned
partition of a topic id no topic has any more is dropped, as Kafka's coordinator drops it.

Every answer to a member of the group carries its assignment. Kafka's coordinator answers it
only when it changed since the member's last answer, on a join, or when a full request
shows the member does not have it, and leaves it null ("unchanged") otherwise. That relies
on a client whose answer was lost saying so with a full request. librdkafka does not after a
timed-out heartbeat: it asks again with owned partitions null. Whatever the lost answer
said was then never said again: a "give these up" kept the partitions with the member (and
the member waiting for them idle) until the rebalance timeout fenced it, and "these were
released to you" left them unread for good. Clients ignore an assignment equal to the one
they have or are working towards (librdkafka: "Assignment is the same"; Java:
LocalAssignment.updateWith), so the repeat costs a few bytes per heartbeat.

Requests are checked as Kafka's KafkaApis and GroupCoordinatorService check them: a group
id, a member id (made by the client, v1; v0 lets the coordinator make one), and for a join
the rebalance timeout, a subscription (topic names or a regex, v1) and no owned partitions;
epoch -2 needs an instance id. With an authorizer a heartbeat needs READ on the group and
DESCRIBE on every subscribed topic named (else TOPIC_AUTHORIZATION_FAILED);
ConsumerGroupDescribe needs DESCRIBE on the group. A regex is matched against every topic:
the group's target assignment is computed for all its members at once, so it cannot
depend on who sent the heartbeat (Kafka 4 filters a regex's topics by the member's ACLs
when it resolves it; rayk does not yet). Reading an assigned partition still needs READ
on its topic, which Fetch checks.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rayk.acls import DESCRIBE, GROUP, READ, TOPIC
from rayk.coordinator.group.consumer_protocol_group import JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH, ConsumerHeartbeat
from rayk.errors import GroupAuthorizationFailedError, InvalidRequestError, TopicAuthorizationFailedError
from rayk.net.admin_apis import NO_AUTHORIZED_OPERATIONS
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of
from rayk.net.entities import kafka_uuid, ms
from rayk.net.group_apis import TOPIC_LOOKUP_TIMEOUT_MS, coordinator_call

DEFAULT_REBALANCE_TIMEOUT_MS = 300_000  # a member's max.poll.interval.ms, when it does not say


async def consumer_group_heartbeat(view: BrokerView, request: Any) -> dict:
    body = request.body
    try:
        _check_heartbeat(body, request.head.api_version)
        if not view.authorized(request, READ, GROUP, body.group_id):
            raise GroupAuthorizationFailedError(f"{request.context.principal} may not use group {body.group_id!r}")
        denied = [t for t in body.subscribed_topic_names or () if not view.authorized(request, DESCRIBE, TOPIC, t)]
        if denied:
            raise TopicAuthorizationFailedError(f"{request.context.principal} may not describe topics {denied}")
        topics = (await view.ask_controller("client_metadata", None, timeout_ms=TOPIC_LOOKUP_TIMEOUT_MS))["topics"]
        counts = {name: len(t["partitions"]) for name, t in topics.items()}  # every topic: the group's target is one
        names = {kafka_uuid(t["topic_id"]): name for name, t in topics.items()}
        owned = None if body.topic_partitions is None else tuple(
            (names[tp.topic_id], p) for tp in body.topic_partitions if tp.topic_id in names for p in tp.partitions
        )  # fmt: skip
        rebalance_timeout_ms = ms(body.rebalance_timeout)
        heartbeat = ConsumerHeartbeat(
            member_id=body.member_id, member_epoch=body.member_epoch,
            subscribed_topics=None if body.subscribed_topic_names is None else tuple(body.subscribed_topic_names),
            subscribed_regex=getattr(body, "subscribed_topic_regex", None), owned=owned, assignor=body.server_assignor,
            rebalance_timeout_ms=rebalance_timeout_ms if rebalance_timeout_ms >= 0 else DEFAULT_REBALANCE_TIMEOUT_MS,
            instance_id=body.instance_id, client_id=request.client_id or "", client_host=request.context.client_host,
            rack_id=body.rack_id,
        )  # fmt: skip
        answer = await coordinator_call(view, request, body.group_id, "consumer_heartbeat", heartbeat, counts)
    except Exception as e:
        return {"error_code": error_code_of(e), "error_message": error_message_of(e), "member_id": body.member_id or None,
                "member_epoch": -1, "heartbeat_interval": 0}  # fmt: skip
    response: dict[str, Any] = {"member_id": answer.member_id, "member_epoch": answer.member_epoch,
                                "heartbeat_interval": answer.heartbeat_interval_ms}  # fmt: skip
    if answer.assignment is not None:
        ids = {name: t["topic_id"] for name, t in topics.items()}
        response["assignment"] = {"topic_partitions": [
            {"topic_id": ids[topic], "partitions": partitions} for topic, partitions in _by_topic(answer.assignment).items()
            if topic in ids
        ]}  # fmt: skip
    return response


def _check_heartbeat(body: Any, version: int) -> None:
    """INVALID_REQUEST for what Kafka refuses before the coordinator sees it."""
    if not body.group_id:
        raise InvalidRequestError("GroupId can't be empty.")
    if version >= 1 and not body.member_id:
        raise InvalidRequestError("MemberId can't be empty.")
    if body.member_epoch == JOIN_EPOCH:
        if ms(body.rebalance_timeout) == -1:
            raise InvalidRequestError("RebalanceTimeoutMs must be provided in first request.")
        if body.topic_partitions is None or body.topic_partitions:
            raise InvalidRequestError("TopicPartitions must be empty when (re-)joining.")
        if body.subscribed_topic_names is None and getattr(body, "subscribed_topic_regex", None) is None:
            raise InvalidRequestError("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
    elif body.member_epoch == STATIC_LEAVE_EPOCH:
        if body.instance_id is None:
            raise InvalidRequestError("InstanceId can't be null when leaving with epoch -2.")
    elif body.member_epoch < LEAVE_EPOCH:
        raise InvalidRequestError(f"MemberEpoch {body.member_epoch} is invalid.")


def _by_topic(partitions: Any) -> dict[str, list[int]]:
    topics: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        topics.setdefault(topic, []).append(partition)
    return topics


async def consumer_group_describe(view: BrokerView, request: Any) -> dict:
    body = request.body
    topics = None

    async def one(group_id: str) -> dict:
        nonlocal topics
        try:
            if not view.authorized(request, DESCRIBE, GROUP, group_id):
                raise GroupAuthorizationFailedError(f"{request.context.principal} may not describe group {group_id!r}")
            g = await coordinator_call(view, request, group_id, "describe_consumer_group")
            if topics is None:
                topics = (await view.ask_controller("client_metadata", None, timeout_ms=TOPIC_LOOKUP_TIMEOUT_MS))["topics"]
        except Exception as e:
            return {"group_id": group_id, "error_code": error_code_of(e), "error_message": error_message_of(e),
                    "group_state": "", "members": [], "authorized_operations": NO_AUTHORIZED_OPERATIONS}  # fmt: skip

        def assignment(partitions: list) -> dict:
            return {"topic_partitions": [
                {"topic_id": topics[t]["topic_id"], "topic_name": t, "partitions": ps}
                for t, ps in _by_topic(partitions).items() if t in topics
            ]}  # fmt: skip

        return {
            "group_id": group_id, "group_state": g["state"], "group_epoch": g["group_epoch"],
            "assignment_epoch": g["assignment_epoch"], "assignor_name": g["assignor"],
            "members": [{
                "member_id": m["member_id"], "instance_id": m["instance_id"], "rack_id": m["rack_id"],
                "member_epoch": m["member_epoch"], "client_id": m["client_id"], "client_host": m["client_host"],
                "subscribed_topic_names": m["subscribed_topics"], "subscribed_topic_regex": m["subscribed_regex"],
                "assignment": assignment(m["assignment"]), "target_assignment": assignment(m["target"]),
                "member_type": 0 if m["classic"] else 1,  # (v1) a classic member of a mixed group, or not
            } for m in g["members"]],
            "authorized_operations": view.authorized_operations(request, GROUP, group_id)
            if body.include_authorized_operations else NO_AUTHORIZED_OPERATIONS,
        }  # fmt: skip

    return {"groups": list(await asyncio.gather(*(one(g) for g in body.group_ids)))}
