"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554), and the SASL
requests on a listener that does not authenticate.

Over the wire, with an authorizer, changing credentials needs ALTER on the cluster and
reading them DESCRIBE, as in Kafka; without one, only a super user (`super.users`, e.g.
`User:ANONYMOUS;User:admin`) may (Kafka would let anyone). Others get
CLUSTER_AUTHORIZATION_FAILED. The Python Admin and `rayk users` change
them through the Controller's actor handle, guarded by Ray's own authentication. Clients
send the salted password, never the password (rayk/scram.py derives the keys kept).

SaslHandshake and SaslAuthenticate are answered by the connection's SaslAuthenticator
(rayk/net/sasl.py) on a SASL listener; anywhere else they get ILLEGAL_SASL_STATE, as in
Kafka.
"""

from __future__ import annotations

from typing import Any

from rayk.acls import ALTER, CLUSTER, DESCRIBE
from rayk.errors import (
    ClusterAuthorizationFailedError,
    DuplicateResourceError,
    IllegalSaslStateError,
    KafkaError,
    UnsupportedSaslMechanismError,
)
from rayk.net.broker_view import BrokerView
from rayk.scram import WIRE_MECHANISMS, ScramCredential, credential_from_salted_password

CONTROLLER_TIMEOUT_MS = 30_000
_WIRE_CODES = {name: code for code, name in WIRE_MECHANISMS.items()}


async def sasl_without_sasl(view: BrokerView, request: Any) -> dict:
    return {"error_code": IllegalSaslStateError.code,
            "error_message": f"listener {request.context.listener_name} does not authenticate with SASL"}


def _authorized(view: BrokerView, request: Any, operation: int) -> bool:
    if view.config.authorizes:
        return view.authorized(request, operation, CLUSTER)
    return request.context.principal in view.config.super_user_set()


async def describe_user_scram_credentials(view: BrokerView, request: Any) -> dict:
    if not _authorized(view, request, DESCRIBE):
        return {"error_code": ClusterAuthorizationFailedError.code, "results": [],
                "error_message": f"{request.context.principal} may not describe credentials"}
    names = [u.name for u in request.body.users] if request.body.users else None  # none named: all, as in Kafka
    unique = None if names is None else sorted({n for n in names if names.count(n) == 1})
    described = await view.ask_controller("describe_user_scram_credentials", unique, timeout_ms=CONTROLLER_TIMEOUT_MS)
    results = []
    for user, found in described.items():
        if isinstance(found, KafkaError):
            results.append({"user": user, "error_code": found.code, "error_message": str(found)})
        else:
            results.append({"user": user, "credential_infos": [
                {"mechanism": _WIRE_CODES[mechanism], "iterations": iterations} for mechanism, iterations in found]})
    for user in sorted({n for n in names or [] if names.count(n) > 1}):
        results.append({"user": user, "error_code": DuplicateResourceError.code,
                        "error_message": f"user {user!r} appears more than once in the request"})
    return {"results": results}


async def alter_user_scram_credentials(view: BrokerView, request: Any) -> dict:
    body = request.body
    users = sorted({d.name for d in body.deletions} | {u.name for u in body.upsertions})
    if not _authorized(view, request, ALTER):
        message = f"{request.context.principal} may not alter credentials"
        return {"results": [{"user": u, "error_code": ClusterAuthorizationFailedError.code, "error_message": message}
                            for u in users]}
    deletions: list[tuple[str, str]] = []
    upsertions: list[tuple[str, ScramCredential | KafkaError]] = []
    for d in body.deletions:
        mechanism = WIRE_MECHANISMS.get(d.mechanism)
        if mechanism is None:
            upsertions.append((d.name, UnsupportedSaslMechanismError(f"unknown SCRAM mechanism type {d.mechanism}")))
        else:
            deletions.append((d.name, mechanism))
    for u in body.upsertions:
        try:
            mechanism = WIRE_MECHANISMS.get(u.mechanism)
            if mechanism is None:
                raise UnsupportedSaslMechanismError(f"unknown SCRAM mechanism type {u.mechanism}")
            made: ScramCredential | KafkaError = credential_from_salted_password(mechanism, u.salt, u.salted_password,
                                                                                 u.iterations)
        except KafkaError as e:
            made = e
        upsertions.append((u.name, made))
    results = await view.ask_controller("alter_user_scram_credentials", deletions, upsertions,
                                        timeout_ms=CONTROLLER_TIMEOUT_MS)
    return {"results": [{"user": user, "error_code": e.code, "error_message": str(e)} if e is not None else {"user": user}
                        for user, e in sorted(results.items())]}
