"""ElectLeaders (KIP-460): preferred or unclean leader elections, passed to the Controller.

Kafka 4.0 serves v0-v2; v0 has no election type (it is PREFERRED) and no top-level
error. As Kafka's controller does:
- null topic_partitions elects every partition, and the answer leaves out those whose
  preferred replica already leads; named partitions are each answered: NONE (elected),
  ELECTION_NOT_NEEDED, PREFERRED_LEADER_NOT_AVAILABLE (the preferred replica is not a
  live in-sync replica), ELIGIBLE_LEADERS_NOT_AVAILABLE (unclean: no live replica),
  UNKNOWN_TOPIC_OR_PARTITION;
- a request that fails as a whole (REQUEST_TIMED_OUT after its timeout_ms,
  NOT_CONTROLLER while Ray restarts the Controller) has the error at the top level and
  on every partition it named.
"""

from __future__ import annotations

from typing import Any

from rayk.acls import ALTER, CLUSTER
from rayk.errors import ClusterAuthorizationFailedError, InvalidRequestError
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of
from rayk.net.entities import controller_timeout_ms

PREFERRED, UNCLEAN = 0, 1  # election_type
DEFAULT_TIMEOUT_MS = 60_000

TopicPartition = tuple[str, int]


async def elect_leaders(view: BrokerView, request: Any) -> dict:
    body = request.body
    election_type = getattr(body, "election_type", PREFERRED)
    named = None if body.topic_partitions is None else [(t.topic, int(p)) for t in body.topic_partitions for p in t.partitions]
    try:
        if not view.authorized(request, ALTER, CLUSTER):  # as in Kafka
            raise ClusterAuthorizationFailedError(f"{request.context.principal} may not elect leaders")
        if election_type not in (PREFERRED, UNCLEAN):
            raise InvalidRequestError(f"election type {election_type} is neither 0 (preferred) nor 1 (unclean)")
        results = await view.ask_controller("elect_leaders", named, election_type == UNCLEAN,
                                            timeout_ms=controller_timeout_ms(body.timeout, DEFAULT_TIMEOUT_MS))
        answers = {tp: (0, None) if e is None else (e.code, str(e)) for tp, e in results.items()}
        top = 0
    except Exception as e:
        top, message = error_code_of(e), error_message_of(e)
        answers = {tp: (top, message) for tp in named or []}
    by_topic: dict[str, list[dict]] = {}
    for (topic, partition), (code, message) in answers.items():
        by_topic.setdefault(topic, []).append({"partition_id": partition, "error_code": code, "error_message": message})
    results_out = [{"topic": t, "partition_result": ps} for t, ps in by_topic.items()]
    return {"error_code": top, "replica_election_results": results_out}
