"""AlterConfigs (API key 33, v0-2) and IncrementalAlterConfigs (API key 44, v0-1): changing
topic, broker and group configs as Kafka 4.x serves them (`kafka-configs`, admin UIs).

Topics. AlterConfigs replaces a topic's own configs with those given (a config left out
goes back to its default); IncrementalAlterConfigs changes only those named: SET (0) a
value, DELETE (1) the topic's own value (back to the default), APPEND (2) / SUBTRACT (3)
items of a list config (cleanup.policy), starting from the topic's value or else the
default, as Kafka's ConfigurationControlManager does. The result is checked like a
CreateTopics config (rayk/config.py) and committed at the Controller, which pushes it to
the replicas. It is computed here from the topic's configs as the Controller has them, so
two incremental changes of one topic racing each other may lose one (as with the legacy
AlterConfigs, whose clients read, modify and write).

Brokers. rayk's broker settings are fixed when the broker starts (its BrokerConfig is
handed to its actors and listeners at creation), so no broker config is dynamic in
rayk: setting one is refused as Kafka refuses a config that is not dynamic (INVALID_REQUEST,
"Cannot update these configs dynamically"), an unknown one is INVALID_CONFIG, and deleting
one succeeds with nothing to do, since none has a dynamic value (Kafka answers the same).
The resource name is "" (cluster-wide default) or the id of the broker the request came
to, as Kafka requires.

Groups (Kafka's GROUP resource, `kafka-configs --entity-type groups`): a share group's
`share.auto.offset.reset`, set at the group's coordinator (which makes the share group if
there is none; a classic or consumer group's id is GROUP_ID_NOT_FOUND), with ALTER_CONFIGS
on the group (GROUP_AUTHORIZATION_FAILED). Kafka's other group configs (session and
heartbeat times per group) are INVALID_CONFIG: rayk has the broker-wide ones only.

Per resource, with Kafka's codes: INVALID_REQUEST (a resource named twice, a config named
twice, a null value but for DELETE, an unknown operation or resource type, another
broker's id), UNKNOWN_TOPIC_OR_PARTITION, INVALID_CONFIG (unknown config, bad value,
APPEND/SUBTRACT on a config that is not a list), and with an authorizer
TOPIC_AUTHORIZATION_FAILED / CLUSTER_AUTHORIZATION_FAILED without ALTER_CONFIGS on the
topic / the cluster. validate_only checks all of that and changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any

from ray.exceptions import RayActorError

from rayk.acls import ALTER_CONFIGS, CLUSTER, DESCRIBE_CONFIGS, GROUP, TOPIC
from rayk.coordinator.share.share_group import GROUP_CONFIGS, check_group_configs
from rayk.config import LISTENER_PREFIX, BrokerConfig, topic_config_defaults, validate_topic_configs
from rayk.errors import (
    ClusterAuthorizationFailedError,
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    InvalidConfigurationError,
    InvalidRequestError,
    TopicAuthorizationFailedError,
)
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of

TOPIC_RESOURCE, BROKER_RESOURCE, GROUP_RESOURCE = 2, 4, 32
GROUP_CONFIG_SOURCE, DEFAULT_CONFIG_SOURCE = 8, 5  # Kafka's DescribeConfigs config sources
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
OPERATIONS = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}
LIST_TOPIC_CONFIGS = frozenset({"cleanup.policy"})  # Kafka's LIST-typed topic configs that rayk has
ALTER_TIMEOUT_MS = 60_000  # for the Controller to commit and push a topic's new configs


async def alter_configs(view: BrokerView, request: Any) -> dict:
    """Legacy AlterConfigs: each resource's configs become exactly those given."""
    body = request.body

    def plan(r: Any, explicit: dict[str, str], defaults: dict[str, str]) -> dict[str, str]:
        _check_no_duplicates([c.name for c in r.configs])
        nulls = [c.name for c in r.configs if c.value is None]
        if nulls:
            raise InvalidRequestError(f"Null value not supported for : {', '.join(nulls)}")
        return {c.name: c.value for c in r.configs}

    return {"responses": await _alter(view, request, body.resources, body.validate_only, plan)}


async def incremental_alter_configs(view: BrokerView, request: Any) -> dict:
    """IncrementalAlterConfigs: SET, DELETE, APPEND and SUBTRACT per config."""
    body = request.body

    def plan(r: Any, explicit: dict[str, str], defaults: dict[str, str]) -> dict[str, str]:
        ops = [(c.name, int(c.config_operation), c.value) for c in r.configs]
        return apply_incremental(explicit, ops, defaults)

    return {"responses": await _alter(view, request, body.resources, body.validate_only, plan)}


def apply_incremental(
    explicit: dict[str, str], ops: list[tuple[str, int, str | None]], defaults: dict[str, str]
) -> dict[str, str]:
    """The resource's own configs after `ops` (name, operation, value), as Kafka applies
    them: APPEND adds the items not already there, SUBTRACT removes the items named, both
    on the current value or else the default. INVALID_REQUEST / INVALID_CONFIG as the module
    docstring says; `explicit` is not changed."""
    _check_no_duplicates([name for name, _, _ in ops])
    unknown = sorted({op for _, op, _ in ops if op not in OPERATIONS})
    if unknown:
        raise InvalidRequestError(f"Unknown operations type {unknown[0]} (0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT)")
    nulls = [name for name, op, value in ops if op != DELETE and value is None]
    if nulls:
        raise InvalidRequestError(f"Null value not supported for : {', '.join(nulls)}")
    out = dict(explicit)
    for name, op, value in ops:
        if op == SET:
            out[name] = value
        elif op == DELETE:
            out.pop(name, None)
        else:
            if name not in LIST_TOPIC_CONFIGS:
                raise InvalidConfigurationError(
                    f"Can't {OPERATIONS[op]} to key {name} because its type is not LIST."
                )
            current = out.get(name, defaults.get(name, ""))
            items = [i.strip() for i in current.split(",") if i.strip()]
            given = [i.strip() for i in value.split(",") if i.strip()]
            if op == APPEND:
                items += [i for i in given if i not in items]
            else:
                items = [i for i in items if i not in given]
            out[name] = ",".join(items)
    return out


def _check_no_duplicates(names: list[str]) -> None:
    twice = sorted(n for n, count in Counter(names).items() if count > 1)
    if twice:
        raise InvalidRequestError(f"Error due to duplicate config keys: {', '.join(twice)}")


async def _alter(view: BrokerView, request: Any, resources: Any, validate_only: bool, plan: Any) -> list[dict]:
    seen = Counter((r.resource_type, r.resource_name) for r in resources)

    async def one(r: Any) -> dict:
        base = {"resource_type": r.resource_type, "resource_name": r.resource_name}
        try:
            if seen[(r.resource_type, r.resource_name)] > 1:
                raise InvalidRequestError("Each resource must appear at most once.")
            if r.resource_type == TOPIC_RESOURCE:
                await _alter_topic(view, request, r, validate_only, plan)
            elif r.resource_type == BROKER_RESOURCE:
                _alter_broker(view, request, r, plan)
            elif r.resource_type == GROUP_RESOURCE:
                await _alter_group(view, request, r, validate_only, plan)
            else:
                raise InvalidRequestError(f"Unknown resource type {r.resource_type}: rayk has configs of topics (2), "
                                          "brokers (4) and groups (32)")  # fmt: skip
        except Exception as e:
            return {**base, "error_code": error_code_of(e), "error_message": error_message_of(e)}
        return {**base, "error_code": 0, "error_message": None}

    return list(await asyncio.gather(*(one(r) for r in resources)))


async def _alter_topic(view: BrokerView, request: Any, r: Any, validate_only: bool, plan: Any) -> None:
    name = r.resource_name
    if not view.authorized(request, ALTER_CONFIGS, TOPIC, name):
        raise TopicAuthorizationFailedError(f"{request.context.principal} may not alter the configs of topic {name!r}")
    explicit = await view.ask_controller("topic_configs", name, timeout_ms=ALTER_TIMEOUT_MS)  # UNKNOWN_TOPIC_OR_PARTITION
    configs = validate_topic_configs(plan(r, explicit, topic_config_defaults(view.config)), view.config)
    if not validate_only:
        await view.ask_controller("alter_topic_configs", name, configs, timeout_ms=ALTER_TIMEOUT_MS)


async def _alter_group(view: BrokerView, request: Any, r: Any, validate_only: bool, plan: Any) -> None:
    """A share group's configs, at its coordinator (GROUP_AUTHORIZATION_FAILED without
    ALTER_CONFIGS on the group; GROUP_ID_NOT_FOUND for a classic or consumer group)."""
    if not r.resource_name:
        raise InvalidRequestError("a group config resource needs a group id")
    if not view.authorized(request, ALTER_CONFIGS, GROUP, r.resource_name):
        raise GroupAuthorizationFailedError(f"{request.context.principal} may not alter group {r.resource_name!r}'s configs")
    explicit = await _group_coordinator_call(view, r.resource_name, "share_group_configs")
    configs = plan(r, explicit, {})
    check_group_configs(configs)
    if not validate_only:
        await _group_coordinator_call(view, r.resource_name, "alter_share_group_configs", configs, True)


async def describe_group_configs(view: BrokerView, request: Any, group_id: str) -> list[dict]:
    """DescribeConfigs of a GROUP resource: rayk's group configs (a share group's), each
    with its value and source (GROUP_CONFIG where set, else DEFAULT_CONFIG), as Kafka
    answers them for any group id."""
    if not view.authorized(request, DESCRIBE_CONFIGS, GROUP, group_id):
        raise GroupAuthorizationFailedError(f"{request.context.principal} may not describe group {group_id!r}'s configs")
    explicit = await _group_coordinator_call(view, group_id, "share_group_configs")
    return [{"name": name, "value": explicit.get(name, allowed[0]), "read_only": False,
             "config_source": GROUP_CONFIG_SOURCE if name in explicit else DEFAULT_CONFIG_SOURCE,
             "is_sensitive": False, "synonyms": []}
            for name, allowed in sorted(GROUP_CONFIGS.items())]  # fmt: skip


async def _group_coordinator_call(view: BrokerView, group_id: str, method: str, *args: Any) -> Any:
    """`method` of the group's coordinator, wherever it is (a Kafka broker answers config
    requests for any group: group configs are cluster metadata there, the coordinator's
    state here). COORDINATOR_NOT_AVAILABLE while it moves."""
    _, coordinator = await view.ask_controller("find_coordinator", group_id, timeout_ms=ALTER_TIMEOUT_MS)
    try:
        return await getattr(coordinator, method).remote(group_id, *args)
    except RayActorError as e:
        raise CoordinatorNotAvailableError(f"the coordinator of group {group_id!r} is restarting ({type(e).__name__})") from None


def _alter_broker(view: BrokerView, request: Any, r: Any, plan: Any) -> None:
    if not view.authorized(request, ALTER_CONFIGS, CLUSTER):
        raise ClusterAuthorizationFailedError(f"{request.context.principal} may not alter broker configs")
    if r.resource_name:
        try:
            broker_id = int(r.resource_name)
        except ValueError:
            raise InvalidRequestError(f"Node id must be an integer, but it is: {r.resource_name}") from None
        if broker_id != view.broker_id:
            raise InvalidRequestError(f"Unexpected broker id, expected {view.broker_id}, but received {r.resource_name}")
    changed = plan(r, {}, {})  # nothing is set dynamically: what remains is what the request sets
    unknown = sorted(n for n in changed if not is_broker_config(n))
    if unknown:
        raise InvalidConfigurationError(f"Unknown broker config: {', '.join(unknown)}")
    if changed:
        raise InvalidRequestError(
            f"Cannot update these configs dynamically: {', '.join(sorted(changed))} "
            "(rayk's broker configs are set when a broker starts)"
        )


def is_broker_config(name: str) -> bool:
    """Whether `name` is a broker config rayk has (BrokerConfig, or a per-listener one)."""
    if name.startswith(LISTENER_PREFIX):
        return True
    return name in {f.name.replace("_", ".") for f in dataclasses.fields(BrokerConfig) if f.name != "listener_overrides"}
