"""The transaction APIs (KIP-98, KIP-664): InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, DescribeTransactions, ListTransactions and DescribeProducers.

A transactional id's coordinator is the leader of its `__transaction_state` partition
(FindCoordinator with key type 1, group_apis.py). The listener passes a transaction request
to this broker's replica of that partition, whose TransactionCoordinator answers
NOT_COORDINATOR when it does not lead it.

With an authorizer, as in Kafka: the transactional APIs need WRITE on the TransactionalId
(else TRANSACTIONAL_ID_AUTHORIZATION_FAILED), AddPartitionsToTxn WRITE on each topic,
AddOffsetsToTxn READ on the group, DescribeTransactions and ListTransactions DESCRIBE on the
id, DescribeProducers READ on the topic; an idempotent InitProducerId needs
IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679); AddPartitionsToTxn v4+
(the brokers' batched form) CLUSTER_ACTION.

Transaction versions (KIP-890): ApiVersions finalizes `transaction.version` 2, so a client
that knows it (Kafka's Java client from 4.0) runs transaction version 2: it sends no
AddPartitionsToTxn or AddOffsetsToTxn; each partition leader adds a partition to the
transaction when a Produce v12+ writes its first transactional batch, a TxnOffsetCommit
v5+ adds the group's offsets partition first, and EndTxn v5+ bumps the producer's epoch
and answers the new one. A client of transaction version 1 (librdkafka) adds them itself,
and each partition leader verifies its first transactional write with the coordinator
(KIP-890 part 1, replication/txn_verification.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rayk.acls import CLUSTER, CLUSTER_ACTION, DESCRIBE, GROUP, IDEMPOTENT_WRITE, READ, TOPIC, TRANSACTIONAL_ID, WRITE
from rayk.replication import txn_verification
from rayk.coordinator.transaction.transaction_metadata import TransactionMetadata, TxnState
from rayk.errors import (
    ClusterAuthorizationFailedError,
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    InvalidRequestError,
    InvalidTxnStateError,
    KafkaError,
    NotCoordinatorError,
    OperationNotAttemptedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    TransactionalIdNotFoundError,
    UnknownTopicOrPartitionError,
)
from rayk.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from rayk.net.api_versions import transaction_version_of
from rayk.net.broker_view import BrokerView, error_code_of, error_message_of
from rayk.net.entities import ms

TopicPartition = tuple[str, int]
_STATE_NAMES = {s.display_name: s for s in TxnState}

# TxnOffsetCommit carries no timeout: the coordinator's answer is awaited as long as a client
# waits for a request (Kafka's request.timeout.ms), then the client retries.
ADD_OFFSETS_PARTITION_TIMEOUT_MS = 30_000


def _require_write(view: BrokerView, request: Any, transactional_id: str) -> None:
    if not view.authorized(request, WRITE, TRANSACTIONAL_ID, transactional_id):
        raise TransactionalIdAuthorizationFailedError(
            f"{request.context.principal} may not write with transactional id {transactional_id!r}"
        )


async def _coordinator_call(view: BrokerView, transactional_id: str, method: str, *args: Any) -> Any:
    partition = await view.transaction_partition(transactional_id)
    try:
        return await view.call(TRANSACTION_STATE_TOPIC, partition, method, transactional_id, *args,
                               lost=CoordinatorNotAvailableError)
    except KafkaError as e:
        if e.code == UnknownTopicOrPartitionError.code:  # this broker holds no replica of the id's partition
            raise NotCoordinatorError(
                f"broker {view.broker_id} does not coordinate transactional id {transactional_id!r}"
            ) from None
        raise


# ---------------------------------------------------------------------------- producer ids


async def init_producer_id(view: BrokerView, request: Any) -> dict:
    """A producer id and epoch: an idempotent producer's new id (no transactional id), or a
    transactional producer's, whose epoch bump fences its older instances."""
    body = request.body
    transactional_id = body.transactional_id
    if transactional_id is None:
        if not (view.authorized(request, IDEMPOTENT_WRITE, CLUSTER) or view.authorized_on_some(request, WRITE, TOPIC)):
            raise ClusterAuthorizationFailedError(f"{request.context.principal} may write to no topic")
        return {"producer_id": await view.controller.init_producer_id.remote(), "producer_epoch": 0}
    _require_write(view, request, transactional_id)
    producer_id, epoch = getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1)  # v3+ (KIP-360)
    if (producer_id == -1) != (epoch == -1):
        raise InvalidRequestError(f"producer id {producer_id} and epoch {epoch}: give both or neither")
    expected = None if producer_id == -1 else (producer_id, epoch)
    producer_id, epoch = await _coordinator_call(
        view, transactional_id, "init_producer_id", ms(body.transaction_timeout), expected
    )
    return {"producer_id": producer_id, "producer_epoch": epoch}


# ---------------------------------------------------------------------------- AddPartitionsToTxn


async def add_partitions_to_txn(view: BrokerView, request: Any) -> dict:
    """v0-3: one producer's transaction, from the client; v4+: a batch of transactions,
    each possibly verifyOnly (from a broker)."""
    body = request.body
    if request.head.api_version <= 3:
        results = await _add_partitions(
            view, request, body.v3_and_below_transactional_id, body.v3_and_below_producer_id,
            body.v3_and_below_producer_epoch, body.v3_and_below_topics, verify_only=False,
        )  # fmt: skip
        return {"results_by_topic_v3_and_below": results}
    if not view.authorized(request, CLUSTER_ACTION, CLUSTER):
        raise ClusterAuthorizationFailedError("AddPartitionsToTxn v4+ is for brokers (CLUSTER_ACTION)")
    answers = await asyncio.gather(*(
        _add_partitions(view, request, t.transactional_id, t.producer_id, t.producer_epoch, t.topics, t.verify_only)
        for t in body.transactions
    ))
    return {"results_by_transaction": [{"transactional_id": t.transactional_id, "topic_results": results}
                                       for t, results in zip(body.transactions, answers)]}


async def _add_partitions(
    view: BrokerView, request: Any, transactional_id: str, producer_id: int, epoch: int, topics: Any, verify_only: bool
) -> list[dict]:
    """Per topic, each partition's error code (Kafka's: one partition that may not be added
    fails the request, and the others are OPERATION_NOT_ATTEMPTED)."""
    wanted = [(t.name, p) for t in topics for p in t.partitions]
    errors: dict[TopicPartition, int] = {}
    try:
        _require_write(view, request, transactional_id)
        errors = await _unaddable(view, request, {t for t, _ in wanted}, wanted)
        if not errors:
            if verify_only:
                missing = await _coordinator_call(view, transactional_id, "verify_partitions", producer_id, epoch, wanted)
                errors = {(t, p): InvalidTxnStateError.code for t, p in missing}
            else:
                await _coordinator_call(view, transactional_id, "add_partitions_to_txn", producer_id, epoch, wanted)
        else:
            errors |= {tp: OperationNotAttemptedError.code for tp in wanted if tp not in errors}
    except Exception as e:
        errors = {tp: error_code_of(e) for tp in wanted}
    by_topic: dict[str, list[dict]] = {}
    for topic, partition in wanted:
        by_topic.setdefault(topic, []).append({"partition_index": partition,
                                               "partition_error_code": errors.get((topic, partition), 0)})
    return [{"name": t, "results_by_partition": results} for t, results in by_topic.items()]


async def _unaddable(view: BrokerView, request: Any, topics: set[str], wanted: list[TopicPartition]) -> dict[TopicPartition, int]:
    """The partitions that may not join a transaction: topics the principal may not write
    (TOPIC_AUTHORIZATION_FAILED), partitions that do not exist (UNKNOWN_TOPIC_OR_PARTITION)."""
    denied = {t for t in topics if not view.authorized(request, WRITE, TOPIC, t)}
    allowed = sorted(topics - denied)
    described = view.metadata_image.answer(allowed)
    if described is None or any(p not in described["topics"][t]["partitions"] for t, p in wanted if t not in denied):
        described = await view.controller.client_metadata.remote(allowed)  # not held, or partitions added since
    errors = {}
    for topic, partition in wanted:
        if topic in denied:
            errors[(topic, partition)] = TopicAuthorizationFailedError.code
        elif partition not in described["topics"].get(topic, {}).get("partitions", {}):
            errors[(topic, partition)] = UnknownTopicOrPartitionError.code
    return errors


# ---------------------------------------------------------------------------- AddOffsetsToTxn, EndTxn


async def add_offsets_to_txn(view: BrokerView, request: Any) -> dict:
    """Adds the group's `__consumer_offsets` partition to the transaction, so that its
    TxnOffsetCommit is committed or aborted with the transaction's records."""
    body = request.body
    _require_write(view, request, body.transactional_id)
    if not view.authorized(request, READ, GROUP, body.group_id):
        raise GroupAuthorizationFailedError(f"{request.context.principal} may not use group {body.group_id!r}")
    partition = await view.group_partition(body.group_id)
    await _coordinator_call(view, body.transactional_id, "add_partitions_to_txn", body.producer_id,
                            body.producer_epoch, [(OFFSETS_TOPIC, partition)])  # fmt: skip
    return {}


async def end_txn(view: BrokerView, request: Any) -> dict:
    """Commits or aborts: answered once the decision is written; the markers follow. v5+
    (transaction version 2) bumps the producer's epoch and answers the (producer id,
    epoch) its next transaction uses."""
    body = request.body
    _require_write(view, request, body.transactional_id)
    version = transaction_version_of(request)
    producer_id, epoch = await _coordinator_call(view, body.transactional_id, "end_txn", body.producer_id,
                                                 body.producer_epoch, body.committed, version)  # fmt: skip
    return {"producer_id": producer_id, "producer_epoch": epoch} if version >= 2 else {}


async def add_offsets_partition(view: BrokerView, transactional_id: str, producer_id: int, epoch: int, group_id: str) -> None:
    """A TxnOffsetCommit of transaction version 2 first adds the group's `__consumer_offsets`
    partition to the producer's transaction (what AddOffsetsToTxn did), at its transaction
    coordinator wherever that leads, as a partition leader adds its partition: a fenced
    producer gets INVALID_PRODUCER_EPOCH, a coordinator moving NOT_ENOUGH_REPLICAS, which
    the client retries (txn_verification.py)."""
    partition = await view.group_partition(group_id)
    refused = await txn_verification.verify_partition(
        view.txn_coordinators, transactional_id, OFFSETS_TOPIC, partition, producer_id, epoch, transaction_version=2,
        timeout_ms=ADD_OFFSETS_PARTITION_TIMEOUT_MS,
    )
    if refused is not None:
        raise refused


# ---------------------------------------------------------------------------- describing


def _described(md: TransactionMetadata) -> dict:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(md.partitions):
        by_topic.setdefault(topic, []).append(partition)
    return {
        "transactional_id": md.transactional_id,
        "transaction_state": md.state.display_name,
        "transaction_timeout": md.txn_timeout_ms,
        "transaction_start_time": md.txn_start_timestamp_ms,
        "producer_id": md.producer_id,
        "producer_epoch": md.producer_epoch,
        "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
    }


async def describe_transactions(view: BrokerView, request: Any) -> dict:
    async def one(transactional_id: str) -> dict:
        try:
            if not view.authorized(request, DESCRIBE, TRANSACTIONAL_ID, transactional_id):
                raise TransactionalIdAuthorizationFailedError(
                    f"{request.context.principal} may not describe transactional id {transactional_id!r}"
                )
            md = await _coordinator_call(view, transactional_id, "describe_transaction")
            if md is None:
                raise TransactionalIdNotFoundError(f"no transactional id {transactional_id!r}")
            return _described(md)
        except Exception as e:
            return {"transactional_id": transactional_id, "error_code": error_code_of(e), "transaction_state": "",
                    "transaction_timeout": 0, "transaction_start_time": -1, "producer_id": -1, "producer_epoch": -1}

    return {"transaction_states": await asyncio.gather(*(one(t) for t in request.body.transactional_ids))}


async def list_transactions(view: BrokerView, request: Any) -> dict:
    """The transactional ids this broker coordinates (an admin client asks every broker),
    filtered by state, producer id, and (v1+) running longer than `duration_filter` ms."""
    body = request.body
    state_filters = list(body.state_filters or ())
    unknown_states = [s for s in state_filters if s not in _STATE_NAMES]
    states = {_STATE_NAMES[s] for s in state_filters if s in _STATE_NAMES}
    producer_ids = set(body.producer_id_filters or ())
    min_duration_ms = getattr(body, "duration_filter", -1)
    described = await view.controller.client_metadata.remote([TRANSACTION_STATE_TOPIC])
    partitions = described["topics"].get(TRANSACTION_STATE_TOPIC, {}).get("partitions", {})
    mine = [p for p, s in partitions.items() if s["leader"] == view.broker_id]
    found = await asyncio.gather(*(view.call(TRANSACTION_STATE_TOPIC, p, "transactions") for p in mine),
                                 return_exceptions=True)
    now_ms = int(time.time() * 1000)
    listed = []
    for answer in found:
        if isinstance(answer, BaseException):
            continue  # leadership moved since the metadata was read
        for md in answer:
            if state_filters and md.state not in states:
                continue
            if producer_ids and md.producer_id not in producer_ids:
                continue
            if min_duration_ms >= 0 and now_ms - md.txn_start_timestamp_ms <= min_duration_ms:
                continue  # (Kafka's test, whatever the state)
            if view.authorized(request, DESCRIBE, TRANSACTIONAL_ID, md.transactional_id):
                listed.append({"transactional_id": md.transactional_id, "producer_id": md.producer_id,
                               "transaction_state": md.state.display_name})
    return {"unknown_state_filters": unknown_states, "transaction_states": listed}


async def describe_producers(view: BrokerView, request: Any) -> dict:
    """Each partition's active producers, from its leader's producer state."""

    async def one(topic: str, partition: int) -> dict:
        try:
            if not view.authorized(request, READ, TOPIC, topic):
                raise TopicAuthorizationFailedError(f"{request.context.principal} may not read {topic!r}")
            producers = await view.call(topic, partition, "describe_producers")
            return {"partition_index": partition, "active_producers": producers}
        except Exception as e:
            return {"partition_index": partition, "error_code": error_code_of(e), "error_message": error_message_of(e),
                    "active_producers": []}

    topics = request.body.topics
    answers = await asyncio.gather(*(asyncio.gather(*(one(t.name, p) for p in t.partition_indexes)) for t in topics))
    return {"topics": [{"name": t.name, "partitions": list(ps)} for t, ps in zip(topics, answers)]}
