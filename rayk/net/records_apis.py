"""DeleteRecords (API key 21, v0-2, as Kafka 4.x serves it): moving partitions' log start
offsets, sent by clients to each partition's leader (`kafka-delete-records`, AdminClient's
deleteRecords).

Per partition, as Kafka's ReplicaManager answers: the new low watermark (the leader's log
start offset) once the leader has moved it (PartitionReplica.delete_records; offset -1
means the high watermark); OFFSET_OUT_OF_RANGE for an offset above the high watermark;
POLICY_VIOLATION for a topic whose cleanup.policy lacks delete; INVALID_TOPIC_EXCEPTION
for an internal topic; NOT_LEADER_OR_FOLLOWER on a broker that does not lead it;
UNKNOWN_TOPIC_OR_PARTITION; TOPIC_AUTHORIZATION_FAILED without DELETE on the topic (with
an authorizer); REQUEST_TIMED_OUT if the leader did not answer within the request's
timeout. Each error comes with low watermark -1.

Unlike Kafka, the answer does not wait for the followers' log starts to reach the offset
(Kafka's low watermark is the least over the live replicas): followers move theirs on
their next fetch, within replica.fetch.wait.max.ms, and never read below the leader's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rayk.acls import DELETE, TOPIC
from rayk.errors import InvalidTopicError, RequestTimedOutError, TopicAuthorizationFailedError
from rayk.internal_topics import is_internal
from rayk.net.broker_view import BrokerView, error_code_of
from rayk.net.entities import controller_timeout_ms

DEFAULT_TIMEOUT_MS = 30_000  # Kafka's AdminClient default for DeleteRecords' timeout
INVALID_LOW_WATERMARK = -1


async def delete_records(view: BrokerView, request: Any) -> dict:
    body = request.body
    timeout_ms = controller_timeout_ms(body.timeout, DEFAULT_TIMEOUT_MS)

    async def one(topic: str, p: Any) -> dict:
        try:
            if not view.authorized(request, DELETE, TOPIC, topic):
                raise TopicAuthorizationFailedError(f"{request.context.principal} may not delete records of {topic!r}")
            if is_internal(topic):
                raise InvalidTopicError(f"Cannot delete records of internal topic {topic}")
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    low_watermark = await view.call(topic, p.partition_index, "delete_records", p.offset)
            except TimeoutError:
                raise RequestTimedOutError(f"the leader of {topic}-{p.partition_index} did not answer within {timeout_ms} ms") from None
        except Exception as e:
            return {"partition_index": p.partition_index, "low_watermark": INVALID_LOW_WATERMARK, "error_code": error_code_of(e)}
        return {"partition_index": p.partition_index, "low_watermark": low_watermark, "error_code": 0}

    topics = body.topics
    results = await asyncio.gather(*(one(t.name, p) for t in topics for p in t.partitions))
    it = iter(results)
    return {"topics": [{"name": t.name, "partitions": [next(it) for _ in t.partitions]} for t in topics]}
