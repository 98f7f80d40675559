"""AlterPartitionReassignments and ListPartitionReassignments (KIP-455): moving a
partition's replicas to other brokers, passed to the Controller.

Kafka 4.0 serves v0 of both (AlterPartitionReassignments v1, KIP-860's
allow_replication_factor_change, came with Kafka 4.1). As Kafka's controller does:

- Alter answers every partition it names with an error code of its own: NONE when its
  reassignment started, replaced the one under way, completed at once or was cancelled
  (null replicas cancel); INVALID_REPLICA_ASSIGNMENT for an empty target, a broker named
  twice or not registered, or a cancel that would leave only replicas not yet caught up;
  NO_REASSIGNMENT_IN_PROGRESS for a cancel with none under way;
  UNKNOWN_TOPIC_OR_PARTITION. The answer comes once the change is committed, not once
  the data has moved: List shows the progress.
- List answers with the partitions whose reassignment is under way (replicas, adding,
  removing): all of them for null topics, else those among the named partitions. Topics
  and partitions it does not know are left out, not errors.
- A request that fails as a whole has its error at the top level (and, for Alter, on
  every partition too, as Kafka's error response does): REQUEST_TIMED_OUT when the
  Controller did not answer within the request's timeout_ms (the change may still be
  applied), NOT_CONTROLLER while Ray restarts the Controller (clients retry).

A partition named twice in one Alter is reassigned once, to the last target given, and
both entries carry that answer.
"""

from __future__ import annotations

from typing import Any

from rayk.acls import ALTER, CLUSTER, DESCRIBE
from rayk.errors import ClusterAuthorizationFailedError
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of
from rayk.net.entities import ms

DEFAULT_TIMEOUT_MS = 60_000  # the requests' own default timeout_ms

TopicPartition = tuple[str, int]


async def alter_partition_reassignments(view: BrokerView, request: Any) -> dict:
    body = request.body
    targets: dict[TopicPartition, list[int] | None] = {}
    for topic in body.topics:
        for p in topic.partitions:
            targets[(topic.name, p.partition_index)] = None if p.replicas is None else [int(b) for b in p.replicas]
    try:
        _check_cluster(view, request, ALTER)
        results = await view.ask_controller(
            "alter_partition_reassignments", targets, timeout_ms=ms(body.timeout, DEFAULT_TIMEOUT_MS)
        )
    except Exception as e:  # the whole request failed: Kafka sets its error everywhere
        code, message = error_code_of(e), error_message_of(e)
        return {"error_code": code, "error_message": message,
                "responses": _answers(body, {tp: (code, message) for tp in targets})}  # fmt: skip
    answers = {tp: (0, None) if error is None else (error.code, str(error)) for tp, error in results.items()}
    return {"error_code": 0, "error_message": None, "responses": _answers(body, answers)}


def _check_cluster(view: BrokerView, request: Any, operation: int) -> None:
    """Reassignments need ALTER on the cluster, listing them DESCRIBE, as in Kafka."""
    if not view.authorized(request, operation, CLUSTER):
        raise ClusterAuthorizationFailedError(f"{request.context.principal} may not manage reassignments")


def _answers(body: Any, answers: dict[TopicPartition, tuple[int, str | None]]) -> list[dict]:
    """The response's topics, each partition in the order the request named it."""
    out = []
    for topic in body.topics:
        partitions = []
        for p in topic.partitions:
            code, message = answers[(topic.name, p.partition_index)]
            partitions.append({"partition_index": p.partition_index, "error_code": code, "error_message": message})
        out.append({"name": topic.name, "partitions": partitions})
    return out


async def list_partition_reassignments(view: BrokerView, request: Any) -> dict:
    body = request.body
    wanted = None
    if body.topics is not None:
        wanted = [(t.name, int(p)) for t in body.topics for p in t.partition_indexes]
    try:
        _check_cluster(view, request, DESCRIBE)
        ongoing = await view.ask_controller(
            "list_partition_reassignments", wanted, timeout_ms=ms(body.timeout, DEFAULT_TIMEOUT_MS)
        )
    except Exception as e:
        return {"error_code": error_code_of(e), "error_message": error_message_of(e), "topics": []}
    by_topic: dict[str, list[dict]] = {}
    for (topic, partition), r in sorted(ongoing.items()):
        by_topic.setdefault(topic, []).append({
            "partition_index": partition,
            "replicas": r["replicas"],
            "adding_replicas": r["adding"],
            "removing_replicas": r["removing"],
        })  # fmt: skip
    topics = [{"name": name, "partitions": partitions} for name, partitions in by_topic.items()]
    return {"error_code": 0, "error_message": None, "topics": topics}
