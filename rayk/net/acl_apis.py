"""CreateAcls, DescribeAcls and DeleteAcls (v2-3), to the Controller, which keeps the ACLs
in its metadata log; every listener's authorizer takes them from there (broker_view.py).

Creating and deleting ACLs needs ALTER on the cluster, describing them DESCRIBE (a super
user has both). Without an authorizer (`authorizer.class.name` empty) each answers
SECURITY_DISABLED, as Kafka does.
"""

from __future__ import annotations

from typing import Any

from rayk.acls import ALTER, CLUSTER, DESCRIBE, AclBinding, AclFilter
from rayk.errors import ClusterAuthorizationFailedError, KafkaError, SecurityDisabledError
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of

CONTROLLER_TIMEOUT_MS = 30_000


def _refusal(view: BrokerView, request: Any, operation: int) -> KafkaError | None:
    if not view.config.authorizes:
        return SecurityDisabledError("no authorizer is configured (authorizer.class.name)")
    if not view.authorized(request, operation, CLUSTER):
        return ClusterAuthorizationFailedError(f"{request.context.principal} may not manage ACLs")
    return None


def _filter(f: Any) -> AclFilter:
    return AclFilter(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter, f.principal_filter,
                     f.host_filter, f.operation, f.permission_type)


def _binding_values(b: AclBinding) -> dict:
    return {"resource_type": b.resource_type, "resource_name": b.resource_name, "pattern_type": b.pattern_type,
            "principal": b.principal, "host": b.host, "operation": b.operation, "permission_type": b.permission_type}


async def create_acls(view: BrokerView, request: Any) -> dict:
    creations = request.body.creations
    refusal = _refusal(view, request, ALTER)
    if refusal is not None:
        return {"results": [{"error_code": refusal.code, "error_message": str(refusal)} for _ in creations]}
    bindings = [AclBinding(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host, c.operation,
                           c.permission_type) for c in creations]
    try:
        results = await view.ask_controller("create_acls", bindings, timeout_ms=CONTROLLER_TIMEOUT_MS)
    except KafkaError as e:
        return {"results": [{"error_code": e.code, "error_message": str(e)} for _ in creations]}
    await _take_effect_here(view)
    return {"results": [{} if e is None else {"error_code": e.code, "error_message": str(e)} for e in results]}


async def describe_acls(view: BrokerView, request: Any) -> dict:
    refusal = _refusal(view, request, DESCRIBE)
    if refusal is not None:
        return {"error_code": refusal.code, "error_message": str(refusal), "resources": []}
    try:
        found = await view.ask_controller("describe_acls", _filter(request.body), timeout_ms=CONTROLLER_TIMEOUT_MS)
    except Exception as e:
        return {"error_code": error_code_of(e), "error_message": error_message_of(e), "resources": []}
    resources: dict[tuple[int, str, int], list[dict]] = {}
    for b in found:
        resources.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
            {"principal": b.principal, "host": b.host, "operation": b.operation, "permission_type": b.permission_type})
    return {"resources": [{"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
                          for (t, n, p), acls in resources.items()]}


async def delete_acls(view: BrokerView, request: Any) -> dict:
    filters = request.body.filters
    refusal = _refusal(view, request, ALTER)
    if refusal is not None:
        return {"filter_results": [{"error_code": refusal.code, "error_message": str(refusal)} for _ in filters]}
    try:
        matched = await view.ask_controller("delete_acls", [_filter(f) for f in filters], timeout_ms=CONTROLLER_TIMEOUT_MS)
    except KafkaError as e:
        return {"filter_results": [{"error_code": e.code, "error_message": str(e)} for _ in filters]}
    await _take_effect_here(view)
    return {"filter_results": [{"matching_acls": [_binding_values(b) for b in found]} for found in matched]}


async def _take_effect_here(view: BrokerView) -> None:
    """The change is committed: this listener takes it now; the others within their next
    lookup (so does this one, if this lookup fails)."""
    try:
        await view.refresh_acls()
    except KafkaError:
        pass
