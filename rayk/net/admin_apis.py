"""ApiVersions, Metadata, DescribeCluster, CreateTopics, DeleteTopics, DescribeConfigs and
InitProducerId: the cluster-wide APIs, answered from (or passed to) the Controller.

Every broker answers them, as in KRaft-mode Kafka, where clients' admin requests reach any
broker and are forwarded to the controller. Metadata lists the live brokers that run a
listener, and each partition's leader, epoch, replicas and ISR as the Controller has them.

With an authorizer, as in Kafka: Metadata shows only topics the principal may DESCRIBE;
creating a topic needs CREATE on the cluster or the topic, adding partitions ALTER on the
topic, deleting it DELETE, reading configs DESCRIBE_CONFIGS on the topic or the cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

from rayk.storage.log_manager import is_legal_topic_name
from rayk.config import topic_config_defaults, validate_topic_configs
from rayk.acls import ALTER, CLUSTER, CREATE, DELETE, DESCRIBE, DESCRIBE_CONFIGS, TOPIC
from rayk.errors import (
    ClusterAuthorizationFailedError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    KafkaError,
    LeaderNotAvailableError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from rayk.internal_topics import is_internal
from rayk.net.api_versions import FINALIZED_FEATURES, SUPPORTED_VERSIONS
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of
from rayk.net.config_apis import describe_group_configs
from rayk.net.entities import controller_timeout_ms, ms

NO_AUTHORIZED_OPERATIONS = -(2**31)
TOPIC_RESOURCE, BROKER_RESOURCE, GROUP_RESOURCE = 2, 4, 32
TOPIC_CONFIG_SOURCE, STATIC_BROKER_CONFIG_SOURCE, DEFAULT_CONFIG_SOURCE = 1, 4, 5
INVALID_REPLICA_ASSIGNMENT = 39
DEFAULT_CONTROLLER_TIMEOUT_MS = 60_000  # CreatePartitions' own default timeout_ms
CONTROLLER_COMMIT_TIMEOUT_MS = 10_000  # past a creation's own wait, for the Controller to answer at all


def api_versions_body(error_code: int = 0) -> dict:
    keys = [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())]
    return {"error_code": error_code, "api_keys": keys}


_ZERO_UUID = uuid.UUID(int=0)

# The finalized features' epoch (Kafka's metadata offset of their last change): rayk's do not
# change while a cluster runs, so any epoch >= 0 (the features are valid) does.
FINALIZED_FEATURES_EPOCH = 0


async def api_versions(view: BrokerView, request: Any) -> dict:
    """The APIs and versions served, and (v3+, KIP-584) the features: transaction.version
    2 finalized, which tells clients to run transaction version 2 (KIP-890 part 2), and
    group.version 1 (KIP-848's consumer protocol, as Kafka 4.0 finalizes it). As
    Kafka answers, v3 leaves out a supported range that starts at 0: clients before Kafka
    3.7 refuse one (their AdminClient thread dies; Spark's connector has kafka-clients 3.4.1)."""
    body = api_versions_body()
    version = request.head.api_version
    if version >= 3:
        supported = [{"name": name, "min_version": 0, "max_version": level} for name, level in FINALIZED_FEATURES.items()]
        body |= {
            "supported_features": supported if version >= 4 else [],
            "finalized_features_epoch": FINALIZED_FEATURES_EPOCH,
            "finalized_features": [{"name": name, "min_version_level": level, "max_version_level": level}
                                   for name, level in FINALIZED_FEATURES.items()],
        }
    return body


def _brokers(described: dict, request: Any) -> list[dict]:
    """The live brokers at their address on the listener the request came on (as Kafka
    answers: a client on an SSL listener is sent to the others' SSL listeners)."""
    listener = request.context.listener_name
    return [{"node_id": b, "broker_id": b, "host": endpoints[listener][0], "port": endpoints[listener][1], "rack": None}
            for b, endpoints in described["brokers"].items() if listener in endpoints]


def _controller_id(brokers: list[dict]) -> int:
    """The broker that clients send controller requests to: any broker forwards them to
    the Controller actor, so the lowest live one."""
    return min((b["node_id"] for b in brokers), default=-1)


async def metadata(view: BrokerView, request: Any) -> dict:
    """Topics the principal may not DESCRIBE are left out of an all-topics answer and
    answered TOPIC_AUTHORIZATION_FAILED when named, as in Kafka. v10+ may name a topic by
    id instead (name null: librdkafka does for the topics of a KIP-848 assignment): an id
    no topic has is UNKNOWN_TOPIC_ID, and a topic named by id is never created."""
    body = request.body
    requested = body.topics
    if requested is not None and request.head.api_version == 0 and not requested:
        requested = None  # v0: an empty list means every topic
    by_id: dict[Any, str | KafkaError] = {}
    if requested is not None and any(t.name is None for t in requested):
        ids = {getattr(t, "topic_id", None) for t in requested if t.name is None}
        if None in ids or _ZERO_UUID in ids:
            raise InvalidRequestError("a Metadata request names each topic by name or by a non-zero topic id")
        by_id = await view.topic_names(ids)
    names = None if requested is None else [t.name for t in requested if t.name is not None] + sorted(
        {n for n in by_id.values() if isinstance(n, str)})
    described = await view.client_metadata(names)
    visible = {name: t for name, t in described["topics"].items() if view.authorized(request, DESCRIBE, TOPIC, name)}
    with_operations = getattr(body, "include_topic_authorized_operations", False)  # KIP-430
    topics = [
        _topic_metadata(name, t, view.authorized_operations(request, TOPIC, name) if with_operations else NO_AUTHORIZED_OPERATIONS)
        for name, t in visible.items()
    ]
    missing = [t.name for t in requested or [] if t.name is not None and t.name not in visible]
    for topic_id, name in by_id.items():
        if not isinstance(name, str) or name not in visible:
            code = name.code if isinstance(name, KafkaError) else (
                TopicAuthorizationFailedError.code if name in described["topics"] else UnknownTopicIdError.code)
            topics.append({"name": None, "topic_id": topic_id, "error_code": code,
                           "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS})
    # Concurrently: each auto-creation is only a commit at the Controller (its replicas
    # start in the background), but a request naming many topics need not wait for each.
    codes = await asyncio.gather(*(
        _missing_topic_code(view, name, request) if name not in described["topics"] else _known(TopicAuthorizationFailedError.code)
        for name in missing
    ))
    for name, code in zip(missing, codes):
        topics.append({"name": name, "error_code": code, "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS})
    brokers = _brokers(described, request)
    answer = {
        "brokers": brokers,
        "cluster_id": described["cluster_id"],
        "controller_id": _controller_id(brokers),
        "topics": topics,
    }
    if getattr(body, "include_cluster_authorized_operations", None) is not None:  # v8-10 (librdkafka asks here)
        answer["cluster_authorized_operations"] = (
            view.authorized_operations(request, CLUSTER) if body.include_cluster_authorized_operations else NO_AUTHORIZED_OPERATIONS
        )
    return answer


def _topic_metadata(name: str, topic: dict, authorized_operations: int) -> dict:
    partitions = []
    for p, s in topic["partitions"].items():
        partitions.append({
            "error_code": 0 if s["leader"] >= 0 else LeaderNotAvailableError.code,
            "partition_index": p,
            "leader_id": s["leader"],
            "leader_epoch": s["leader_epoch"],
            "replica_nodes": s["replicas"],
            "isr_nodes": s["isr"],
            "offline_replicas": [],
        })
    return {"name": name, "topic_id": topic["topic_id"], "is_internal": is_internal(name),
            "partitions": partitions, "topic_authorized_operations": authorized_operations}


async def _known(code: int) -> int:
    return code


async def _missing_topic_code(view: BrokerView, name: str, request: Any) -> int:
    """UNKNOWN_TOPIC_OR_PARTITION, or (auto.create.topics.enable and the client allows it)
    create the topic with the broker defaults and answer LEADER_NOT_AVAILABLE, as Kafka does:
    at once, once the topic is committed, not once its replicas run (a Metadata request
    held up by replica processes starting held up every request behind it on its connection).
    An internal topic is created with its own settings (offsets.topic.*), never the defaults
    for client topics, as Kafka's AutoTopicCreationManager does. A listener whose clients
    authenticate never creates topics this way: they are created on purpose, with CreateTopics."""
    if not view.authorized(request, DESCRIBE, TOPIC, name):
        return TopicAuthorizationFailedError.code
    if not is_legal_topic_name(name):
        return InvalidTopicError.code
    allowed = getattr(request.body, "allow_auto_topic_creation", True) and not request.context.listener_authenticates
    if not (view.config.auto_create_topics_enable and allowed):
        return UnknownTopicOrPartitionError.code
    if not _may_create(view, request, name):
        return TopicAuthorizationFailedError.code  # Kafka's answer to an auto-creation it may not do
    try:
        if is_internal(name):
            await view.controller.create_internal_topic.remote(name, timeout_ms=0)
        else:
            await view.controller.create_topic.remote(name, timeout_ms=0)
    except TopicAlreadyExistsError:
        pass
    except Exception as e:
        return error_code_of(e)
    return LeaderNotAvailableError.code


async def describe_cluster(view: BrokerView, request: Any) -> dict:
    described = await view.client_metadata([])
    brokers = _brokers(described, request)
    return {
        "endpoint_type": 1,
        "cluster_id": described["cluster_id"],
        "controller_id": _controller_id(brokers),
        "brokers": brokers,
        "cluster_authorized_operations": view.authorized_operations(request, CLUSTER)
        if request.body.include_cluster_authorized_operations else NO_AUTHORIZED_OPERATIONS,
    }


async def create_topics(view: BrokerView, request: Any) -> dict:
    """Each topic answers once it is created and its replicas run, or REQUEST_TIMED_OUT at
    the request's timeout_ms while they go on starting; with timeout_ms <= 0, once it is
    created (as Kafka's CreateTopics)."""
    body = request.body
    wait_ms = max(ms(body.timeout, DEFAULT_CONTROLLER_TIMEOUT_MS), 0)

    async def one(t: Any) -> dict:
        configs = {c.name: c.value for c in t.configs}
        try:
            if not _may_create(view, request, t.name):
                raise TopicAuthorizationFailedError(f"{request.context.principal} may not create topic {t.name!r}")
            if t.assignments:
                return {"name": t.name, "error_code": INVALID_REPLICA_ASSIGNMENT,
                        "error_message": "rayk places replicas itself: give num_partitions and replication_factor"}
            if body.validate_only:
                _validate(t.name, t.num_partitions, t.replication_factor, configs)
                await view.controller.create_topic.remote(t.name, t.num_partitions, t.replication_factor, configs, True)
                return {"name": t.name, "num_partitions": t.num_partitions, "replication_factor": t.replication_factor}
            partitions = await view.ask_controller(
                "create_topic", t.name, t.num_partitions, t.replication_factor, configs, False, wait_ms,
                timeout_ms=wait_ms + CONTROLLER_COMMIT_TIMEOUT_MS,
            )
        except Exception as e:
            return {"name": t.name, "error_code": error_code_of(e), "error_message": error_message_of(e),
                    "num_partitions": -1, "replication_factor": -1}
        return {"name": t.name, "topic_id": partitions[0]["topic_id"], "num_partitions": len(partitions),
                "replication_factor": len(partitions[0]["replicas"])}

    return {"topics": list(await asyncio.gather(*(one(t) for t in body.topics)))}


async def create_partitions(view: BrokerView, request: Any) -> dict:
    """Grows topics at the Controller; each topic answers within the request's timeout."""
    body = request.body
    timeout_ms = controller_timeout_ms(body.timeout, DEFAULT_CONTROLLER_TIMEOUT_MS)
    names = [t.name for t in body.topics]

    async def one(t: Any) -> dict:
        try:
            if names.count(t.name) > 1:
                raise InvalidRequestError(f"topic {t.name!r} appears more than once in the request")
            if not view.authorized(request, ALTER, TOPIC, t.name):
                raise TopicAuthorizationFailedError(f"{request.context.principal} may not alter topic {t.name!r}")
            if t.assignments:
                return {"name": t.name, "error_code": INVALID_REPLICA_ASSIGNMENT,
                        "error_message": "rayk places replicas itself: give the new partition count"}
            # a wait for brokers (Ray's autoscaler) leaves the replicas time to start within the request's timeout
            scale_out_timeout_ms = max(timeout_ms - CONTROLLER_COMMIT_TIMEOUT_MS, 0)
            await view.ask_controller("create_partitions", t.name, t.count, body.validate_only, scale_out_timeout_ms,
                                      timeout_ms=timeout_ms)
        except Exception as e:
            return {"name": t.name, "error_code": error_code_of(e), "error_message": error_message_of(e)}
        return {"name": t.name}

    return {"results": list(await asyncio.gather(*(one(t) for t in body.topics)))}


def _may_create(view: BrokerView, request: Any, topic: str) -> bool:
    """CREATE on the cluster or on the topic, as Kafka asks for CreateTopics and auto-creation."""
    return view.authorized(request, CREATE, CLUSTER) or view.authorized(request, CREATE, TOPIC, topic)


def _validate(name: str, num_partitions: int, replication_factor: int, configs: dict) -> None:
    if not is_legal_topic_name(name):
        raise InvalidTopicError(f"illegal topic name {name!r}")
    if num_partitions == 0 or num_partitions < -1:
        raise InvalidPartitionsError(f"num_partitions must be >= 1 (or -1 for the default), got {num_partitions}")
    if replication_factor == 0 or replication_factor < -1:
        raise InvalidReplicationFactorError(f"replication_factor must be >= 1 (or -1), got {replication_factor}")
    validate_topic_configs(configs)


async def delete_topics(view: BrokerView, request: Any) -> dict:
    async def one(name: str) -> dict:
        try:
            if not view.authorized(request, DELETE, TOPIC, name):
                raise TopicAuthorizationFailedError(f"{request.context.principal} may not delete topic {name!r}")
            if name not in await view.controller.list_topics.remote():
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            await view.controller.delete_topic.remote(name)
        except Exception as e:
            return {"name": name, "error_code": error_code_of(e), "error_message": error_message_of(e)}
        return {"name": name}

    return {"responses": list(await asyncio.gather(*(one(n) for n in request.body.topic_names)))}


async def describe_configs(view: BrokerView, request: Any) -> dict:
    async def one(r: Any) -> dict:
        base = {"resource_type": r.resource_type, "resource_name": r.resource_name}
        try:
            if r.resource_type == TOPIC_RESOURCE:
                if not view.authorized(request, DESCRIBE_CONFIGS, TOPIC, r.resource_name):
                    raise TopicAuthorizationFailedError(f"{request.context.principal} may not describe its configs")
                configs = _topic_configs(view, await view.controller.topic_configs.remote(r.resource_name))
            elif r.resource_type == BROKER_RESOURCE:
                if not view.authorized(request, DESCRIBE_CONFIGS, CLUSTER):
                    raise ClusterAuthorizationFailedError(f"{request.context.principal} may not describe broker configs")
                configs = _broker_configs(view)
            elif r.resource_type == GROUP_RESOURCE:
                configs = await describe_group_configs(view, request, r.resource_name)
            else:
                raise InvalidRequestError(f"resource type {r.resource_type} has no configs in rayk (2 topic, 4 broker, 32 group)")
        except Exception as e:
            return {**base, "error_code": error_code_of(e), "error_message": error_message_of(e)}
        keys = set(r.configuration_keys) if r.configuration_keys is not None else None
        return {**base, "configs": [c for c in configs if keys is None or c["name"] in keys]}

    return {"results": list(await asyncio.gather(*(one(r) for r in request.body.resources)))}


def _topic_configs(view: BrokerView, explicit: dict[str, str]) -> list[dict]:
    values = topic_config_defaults(view.config)
    out = []
    for name in sorted(set(values) | set(explicit)):
        source = TOPIC_CONFIG_SOURCE if name in explicit else DEFAULT_CONFIG_SOURCE
        out.append({"name": name, "value": explicit.get(name, values.get(name)), "read_only": False,
                    "config_source": source, "is_sensitive": False, "synonyms": []})
    return out


def _broker_configs(view: BrokerView) -> list[dict]:
    """The broker's settings; passwords are sensitive: named, never shown (as in Kafka)."""
    values = [(f.name.replace("_", "."), _config_text(getattr(view.config, f.name)))
              for f in dataclasses.fields(view.config) if f.name != "listener_overrides"]
    values += list(view.config.listener_overrides)
    return [{"name": name, "value": None if _is_sensitive(name) else value, "read_only": True,
             "config_source": STATIC_BROKER_CONFIG_SOURCE, "is_sensitive": _is_sensitive(name), "synonyms": []}
            for name, value in values]


def _is_sensitive(name: str) -> bool:
    return name.endswith(".password")


def _config_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    return str(getattr(value, "value", value))
