"""DescribeClientQuotas and AlterClientQuotas (v0-1), to the Controller, which keeps the
client quotas in its metadata log; every listener enforces them from there
(client_quotas.py).

As in Kafka, describing quotas needs DESCRIBE_CONFIGS on the cluster and altering them
ALTER_CONFIGS (CLUSTER_AUTHORIZATION_FAILED otherwise); without an authorizer anyone may.
"""

from __future__ import annotations

from typing import Any

from rayk.acls import ALTER_CONFIGS, CLUSTER, DESCRIBE_CONFIGS
from rayk.errors import ClusterAuthorizationFailedError, KafkaError, UnknownServerError
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of
from rayk.quotas import QuotaEntity, QuotaFilterComponent

CONTROLLER_TIMEOUT_MS = 30_000


def _entity_values(entity: QuotaEntity) -> list[dict]:
    return [{"entity_type": t, "entity_name": n} for t, n in entity.to_wire()]


async def describe_client_quotas(view: BrokerView, request: Any) -> dict:
    body = request.body
    if not view.authorized(request, DESCRIBE_CONFIGS, CLUSTER):
        e = ClusterAuthorizationFailedError(f"{request.context.principal} may not describe client quotas")
        return {"error_code": e.code, "error_message": str(e), "entries": None}
    components = [QuotaFilterComponent(c.entity_type, c.match_type, c.match) for c in body.components]
    try:
        found = await view.ask_controller("describe_client_quotas", components, body.strict,
                                          timeout_ms=CONTROLLER_TIMEOUT_MS)
    except Exception as e:
        return {"error_code": error_code_of(e), "error_message": error_message_of(e), "entries": None}
    return {"entries": [
        {"entity": _entity_values(entity), "values": [{"key": k, "value": v} for k, v in values.items()]}
        for entity, values in found
    ]}


async def alter_client_quotas(view: BrokerView, request: Any) -> dict:
    entries = request.body.entries

    def answer(entry: Any, error: KafkaError | None) -> dict:
        entity = [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]
        if error is None:
            return {"entity": entity}
        return {"error_code": error.code, "error_message": str(error), "entity": entity}

    if not view.authorized(request, ALTER_CONFIGS, CLUSTER):
        refusal = ClusterAuthorizationFailedError(f"{request.context.principal} may not alter client quotas")
        return {"entries": [answer(entry, refusal) for entry in entries]}
    alterations: list[tuple[QuotaEntity | KafkaError, list[tuple[str, float | None]]]] = []
    for entry in entries:
        try:
            entity: QuotaEntity | KafkaError = QuotaEntity.from_wire((e.entity_type, e.entity_name) for e in entry.entity)
        except KafkaError as e:
            entity = e
        alterations.append((entity, [(op.key, None if op.remove else op.value) for op in entry.ops]))
    try:
        results = await view.ask_controller("alter_client_quotas", alterations, request.body.validate_only,
                                            timeout_ms=CONTROLLER_TIMEOUT_MS)
    except Exception as e:  # AlterClientQuotas has no top-level error: every entry carries it
        failure = e if isinstance(e, KafkaError) else UnknownServerError(error_message_of(e))
        error_code_of(e)  # logs what is not a KafkaError
        return {"entries": [answer(entry, failure) for entry in entries]}
    if not request.body.validate_only:
        try:  # this listener takes the change now; the others within their next lookup
            await view.refresh_quotas()
        except KafkaError:
            pass
    return {"entries": [answer(entry, error) for entry, error in zip(entries, results)]}
