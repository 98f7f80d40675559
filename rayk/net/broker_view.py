"""What one listener knows about its broker and how it reaches the broker's replicas and
the Controller.

Requests on the data and group paths go to this broker's own replica of a partition (the
replica answers NOT_LEADER_OR_FOLLOWER / NOT_COORDINATOR when it does not lead, so clients
refresh their metadata, as with Kafka). Replica handles are looked up at the Controller
once and cached; a handle whose actor died is dropped and looked up again next time.
Produce, fetch and share fetch requests, which carry records, go over the data plane (a
ReplicaLink per replica, a Unix socket: the replicas are on this node, and share fetches
on links of their own); a broken link is treated as a dead actor is.
Partition reassignment requests reach the Controller through `ask_controller`, which
holds them no longer than their own timeout_ms, as Kafka's controller does with a
forwarded request.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import ray
from ray.exceptions import RayActorError

from rayk.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, coordinator_partition
from rayk.replication.txn_verification import CoordinatorHandles
from rayk.config import BrokerConfig
from rayk.dataplane.frames import FetchRequest, FetchResult, ShareFetchRequest, ShareFetchResult
from rayk.dataplane.endpoint import MAX_IN_FLIGHT_PER_CONNECTION
from rayk.dataplane.replica_link import ENDPOINT_LOOKUP_TIMEOUT_MS, ReplicaLink
from rayk.dataplane.endpoint import EndpointAddress
from rayk.errors import (
    KafkaError,
    NetworkError,
    NotControllerError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    UnknownServerError,
    UnknownTopicIdError,
)
from rayk.acls import CLUSTER_NAME, SUPPORTED_OPERATIONS, Authorizer
from rayk.net.client_quotas import ClientQuotas
from rayk.net.entities import kafka_uuid
from rayk.net.share_sessions import ShareSessions
from rayk.net.fetch_session import FetchSessionCache
from rayk.net.metadata_image import MetadataImage
from rayk.net import native_produce
from rayk.net.native_produce import NativeProduce
from rayk.net.parked_fetches import ParkedFetches
from rayk.net.produce_coalescer import ProduceCoalescer

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
TOPIC_ID_LOOKUP_TIMEOUT_MS = 5_000  # a Fetch waits no longer for the Controller to name its topic ids
UNKNOWN_TOPIC_ID_RETRY_MS = 1_000  # an id no topic has is looked up again no sooner
ACL_LOOKUP_TIMEOUT_MS = 5_000
QUOTA_LOOKUP_TIMEOUT_MS = 5_000
METADATA_LOOKUP_TIMEOUT_MS = 5_000
SHARE_LANES = 4  # connections per replica for share fetches: up to 4 x 16 of them waiting there at once


class BrokerView:
    """One listener's view of its broker, shared by every handler: owns the cached replica
    handles and data plane links, the Controller's ACLs and client quotas as last taken, the
    fetch and share sessions, the produce coalescer and the parked-fetch counts. Made with
    its SocketServer, lives as long as it; not thread-safe (the listener's event loop)."""

    def __init__(self, broker_id: int, controller: Any, config: BrokerConfig) -> None:
        self.broker_id = broker_id
        self.controller = controller
        self.config = config
        self._replicas: dict[TopicPartition, Any] = {}
        self._links: dict[tuple[TopicPartition, int], ReplicaLink] = {}  # the data plane to each replica, by lane
        self._in_flight: dict[tuple[TopicPartition, int], int] = {}  # share fetches per share lane
        self._node_id: str | None = None  # this process's Ray node, looked up at the first link
        self._internal_partitions: dict[str, int] = {}  # internal topic -> its partition count (fixed once created)
        self._produce = ProduceCoalescer(self._produce_requests)
        self._native_produce: NativeProduce | None = None  # made at the first Produce, where built
        self._native_tried = False
        self._topic_names: dict[uuid.UUID, str] = {}
        self._unknown_ids: dict[uuid.UUID, float] = {}  # id -> when it may be looked up again
        self.parked_fetches = ParkedFetches()
        self.txn_coordinators = CoordinatorHandles(controller)  # wherever they lead (TxnOffsetCommit v5)
        # Until the Controller's ACLs arrive, only super users are authorized (fail closed,
        # whatever allow.everyone.if.no.acl.found says).
        self._authorizer = Authorizer((), config.super_user_set(), allow_everyone_if_no_acl_found=False)
        self._acl_version = -2
        self.quotas = ClientQuotas(config.quota_window_num, config.quota_window_size_seconds * 1000)
        self.metadata_image = MetadataImage()
        self.share_sessions = ShareSessions()
        self.fetch_sessions = FetchSessionCache(
            config.max_incremental_fetch_session_cache_slots, config.min_incremental_fetch_session_eviction_ms
        )

    # ------------------------------------------------------------------ authorization

    def authorized(self, request: Any, operation: int, resource_type: int, name: str = CLUSTER_NAME) -> bool:
        """Whether the request's principal, from its host, may do `operation` on the
        resource (always, without an authorizer)."""
        if not self.config.authorizes:
            return True
        context = request.context
        return self._authorizer.authorize(context.principal, context.client_host, operation, resource_type, name)

    def authorized_operations(self, request: Any, resource_type: int, name: str = CLUSTER_NAME) -> int:
        """KIP-430: the operations the principal may do on the resource, as a bit field
        (bit n for operation code n), over those its type supports; Kafka's
        authorizedOperations."""
        return sum(1 << op for op in SUPPORTED_OPERATIONS[resource_type]
                   if self.authorized(request, op, resource_type, name))

    def authorized_on_some(self, request: Any, operation: int, resource_type: int) -> bool:
        """Whether the principal may do `operation` on some resource of the type (KIP-679)."""
        if not self.config.authorizes:
            return True
        context = request.context
        return self._authorizer.authorize_by_resource_type(context.principal, context.client_host, operation, resource_type)

    async def refresh_acls(self, wait_ms: int = 0) -> bool:
        """Takes the Controller's ACLs if they are newer than the ones held (a slower,
        older lookup never overwrites a newer one); with `wait_ms`, waits that long at the
        Controller for them to change. Whether it took newer ones."""
        found = await self.ask_controller("acls", self._acl_version, wait_ms, timeout_ms=wait_ms + ACL_LOOKUP_TIMEOUT_MS)
        if found is None or found[0] <= self._acl_version:
            return False
        self._acl_version, bindings = found
        self._authorizer = Authorizer(bindings, self.config.super_user_set(), self.config.allow_everyone_if_no_acl_found)
        return True

    async def refresh_quotas(self, wait_ms: int = 0) -> bool:
        """Takes the Controller's client quotas if they are newer than the ones held; with
        `wait_ms`, waits that long at the Controller for them to change. Whether it took
        newer ones."""
        found = await self.ask_controller("client_quotas", self.quotas.version, wait_ms,
                                          timeout_ms=wait_ms + QUOTA_LOOKUP_TIMEOUT_MS)
        if found is None or found[0] <= self.quotas.version:
            return False
        self.quotas.update(*found)
        return True

    async def refresh_metadata_image(self, wait_ms: int = 0) -> bool:
        """Takes the Controller's `client_metadata` of every topic if it changed since the
        image's version; with `wait_ms`, waits that long at the Controller for a change.
        Whether it took one (not an answer older than the image: MetadataImage.take)."""
        found = await self.ask_controller("client_metadata_image", self.metadata_image.version, wait_ms,
                                          timeout_ms=wait_ms + METADATA_LOOKUP_TIMEOUT_MS)
        return found is not None and self.metadata_image.take(*found)

    async def client_metadata(self, topics: list[str] | None) -> dict[str, Any]:
        """What the Controller's `client_metadata(topics)` answers: from the image where it
        can answer (named topics, all held and led; MetadataImage.answer), else from the
        Controller. Every topic (`topics` None, admin tools listing them) is always asked
        of the Controller, so a listing is never behind a change made through another broker."""
        if topics is not None and (cached := self.metadata_image.answer(topics)) is not None:
            return cached
        return await self.controller.client_metadata.remote(topics)

    async def replica(self, topic: str, partition: int) -> Any:
        """This broker's replica of the partition; UNKNOWN_TOPIC_OR_PARTITION if there is no
        such partition, NOT_LEADER_OR_FOLLOWER if this broker holds no replica of it."""
        tp = (topic, partition)
        handle = self._replicas.get(tp)
        if handle is None:
            handle = await self.controller.replica.remote(topic, partition, self.broker_id)
            if handle is None:
                raise NotLeaderOrFollowerError(f"broker {self.broker_id} holds no replica of {topic}-{partition}")
            self._replicas[tp] = handle
        return handle

    def forget(self, topic: str, partition: int) -> None:
        """Drops a replica handle whose actor is gone, and the topic ids with it: a replica
        goes away when its topic is deleted, so the ids are looked up again next time."""
        self._replicas.pop((topic, partition), None)
        for lane in range(SHARE_LANES + 1):
            link = self._links.pop(((topic, partition), lane), None)
            if link is not None:
                link.close()
        self._topic_names.clear()

    async def topic_names(self, topic_ids: set[uuid.UUID]) -> dict[uuid.UUID, str | KafkaError]:
        """The names of topics by id (Fetch v13+ names topics by id): per id its name, or
        UNKNOWN_TOPIC_ID if no topic has it, or the error of a Controller that did not
        answer within TOPIC_ID_LOOKUP_TIMEOUT_MS. Ids missing from the cache are looked up
        in one Controller call; an id found unknown is not looked up again for
        UNKNOWN_TOPIC_ID_RETRY_MS. An id a replica refused (its topic was deleted and
        created again) is dropped with `forget_topic_id`."""
        now = time.monotonic()
        missing = {i for i in topic_ids if i not in self._topic_names and self._unknown_ids.get(i, 0) <= now}
        failure: KafkaError | None = None
        if missing:
            try:
                described = await self.ask_controller("client_metadata", None, timeout_ms=TOPIC_ID_LOOKUP_TIMEOUT_MS)
                self._topic_names = {kafka_uuid(t["topic_id"]): n for n, t in described["topics"].items()}
                for i in missing - set(self._topic_names):
                    self._unknown_ids[i] = now + UNKNOWN_TOPIC_ID_RETRY_MS / 1000
            except KafkaError as e:
                failure = e
        out: dict[uuid.UUID, str | KafkaError] = {}
        for i in topic_ids:
            name = self._topic_names.get(i)
            out[i] = name if name is not None else (failure or UnknownTopicIdError(f"no topic has id {i}"))
        return out

    def forget_topic_id(self, topic_id: uuid.UUID) -> None:
        self._topic_names.pop(topic_id, None)

    async def call(self, topic: str, partition: int, method: str, *args: Any, lost: type[KafkaError] = NotLeaderOrFollowerError) -> Any:
        """`method(*args)` on this broker's replica; raises `lost` if the replica's actor is gone."""
        handle = await self.replica(topic, partition)
        try:
            return await getattr(handle, method).remote(*args)
        except RayActorError:
            self.forget(topic, partition)
            raise lost(f"the replica of {topic}-{partition} on broker {self.broker_id} is restarting") from None

    async def fetch(self, topic: str, partition: int, request: FetchRequest) -> FetchResult:
        """PartitionReplica.fetch on this broker's replica, over the data plane."""
        return await self._over_data_plane(topic, partition, lambda link: link.fetch(request))

    async def share_fetch(self, topic: str, partition: int, request: ShareFetchRequest) -> ShareFetchResult:
        """PartitionReplica.share_fetch on this broker's replica, over the data plane
        (`max_records` 0: the acknowledgements only, or a probe). Share fetches wait at the
        leader, one per member (an endpoint starts 16 requests per connection at most), so
        they go on connections of their own (`SHARE_LANES`), never holding up a produce or a
        fetch; each goes on the first of those with room, opened when needed."""
        tp = (topic, partition)
        lanes = [self._in_flight.get((tp, lane), 0) for lane in range(1, SHARE_LANES + 1)]
        lane = next((i + 1 for i, n in enumerate(lanes) if n < MAX_IN_FLIGHT_PER_CONNECTION), 1 + lanes.index(min(lanes)))
        self._in_flight[(tp, lane)] = self._in_flight.get((tp, lane), 0) + 1
        abandoned = False
        try:
            return await self._over_data_plane(topic, partition, lambda link: link.share_fetch(request), lane)
        except asyncio.CancelledError:
            # An abandoned request (a probe not needed any more) goes on at the leader until
            # its wait ends, holding its place on the connection: it counts until then.
            abandoned = True
            asyncio.get_running_loop().call_later(request.max_wait_ms / 1000, self._share_request_ended, tp, lane)
            raise
        finally:
            if not abandoned:
                self._share_request_ended(tp, lane)

    def _share_request_ended(self, tp: tuple[str, int], lane: int) -> None:
        self._in_flight[(tp, lane)] -= 1

    async def _over_data_plane(self, topic: str, partition: int, send: Any, lane: int = 0) -> Any:
        """`send(link)` on a data plane link to this broker's replica (lane 0: produce and
        fetch; the others: share fetches); NOT_LEADER_OR_FOLLOWER if the replica's actor is
        gone (it is looked up again next time, and every lane to it closed) or this lane's
        connection broke (the lane connects again next time; the other lanes' requests go on)."""
        tp = (topic, partition)
        handle = await self.replica(topic, partition)
        link = self._links.get((tp, lane))
        if link is None or link.replica is not handle:
            if link is not None:
                link.close()
            link = self._links[(tp, lane)] = ReplicaLink(handle, self._this_node_id(), f"the replica of {topic}-{partition}")
        try:
            return await send(link)
        except (RayActorError, NetworkError) as e:
            if self._links.get((tp, lane)) is link:  # else a newer link replaced it meanwhile
                if isinstance(e, RayActorError):
                    self.forget(topic, partition)
                else:  # (the link dropped its connection; a replaced actor is found at the reconnect)
                    self._links.pop((tp, lane)).close()
            raise NotLeaderOrFollowerError(
                f"the replica of {topic}-{partition} on broker {self.broker_id} is restarting ({e})"
            ) from None

    def native_produce(self) -> NativeProduce | None:
        """The native produce path (native_produce.py), made at the first call on the
        listener's event loop where it is built and on (rayk/native_paths.py); None
        otherwise, or once it stopped."""
        if not self._native_tried:
            self._native_tried = True
            if native_produce.available():
                self._native_produce = NativeProduce(self.broker_id, self._this_node_id(), self._replica_endpoint)
        native = self._native_produce
        return native if native is not None and native.alive else None

    def close(self) -> None:
        """Ends the native produce path (its replica sockets close)."""
        if self._native_produce is not None:
            self._native_produce.close()

    def _this_node_id(self) -> str:
        """This process's Ray node ("" outside Ray, as a listener in a unit test: asking the
        runtime context there would start a Ray instance of its own)."""
        if self._node_id is None:
            self._node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        return self._node_id

    async def _replica_endpoint(self, topic: str, partition: int) -> EndpointAddress:
        """The data plane address of this broker's replica of the partition, for the
        native produce path; errors as `_over_data_plane` turns them."""
        handle = await self.replica(topic, partition)
        try:
            async with asyncio.timeout(ENDPOINT_LOOKUP_TIMEOUT_MS / 1000):
                return await handle.data_endpoint.remote(self._this_node_id())
        except (RayActorError, TimeoutError) as e:
            if isinstance(e, RayActorError) and self._replicas.get((topic, partition)) is handle:
                self.forget(topic, partition)
            raise NotLeaderOrFollowerError(
                f"the replica of {topic}-{partition} on broker {self.broker_id} is restarting ({type(e).__name__})"
            ) from None

    def produce(self, topic: str, partition: int, records: bytes, acks: int, timeout_ms: int,
                transactional_id: str | None = None, transaction_version: int = 1) -> asyncio.Future:
        """Queues one produce request for this broker's replica of the partition (see
        produce_coalescer.py); the future resolves to its ProduceResult."""
        return self._produce.submit(topic, partition, records, acks, timeout_ms, transactional_id, transaction_version)

    async def _produce_requests(self, topic: str, partition: int, requests: list) -> list:
        return await self._over_data_plane(topic, partition, lambda link: link.produce(requests))

    async def ask_controller(self, method: str, *args: Any, timeout_ms: int) -> Any:
        """`method(*args)` on the Controller, answered within `timeout_ms`: REQUEST_TIMED_OUT
        after it (the call is not undone: the change may still be applied, as with Kafka),
        NOT_CONTROLLER while Ray restarts the Controller (Kafka clients then look the
        controller up again and retry). An error the Controller raises comes back as itself."""
        try:
            async with asyncio.timeout(max(timeout_ms, 0) / 1000):
                return await getattr(self.controller, method).remote(*args)
        except KafkaError:
            raise
        except TimeoutError:
            raise RequestTimedOutError(f"the Controller did not answer {method} within {timeout_ms} ms") from None
        except RayActorError as e:
            raise NotControllerError(f"the Controller is unreachable ({type(e).__name__}); retry") from None

    async def group_partition(self, group_id: str) -> int:
        """The __consumer_offsets partition coordinating `group_id` (creating the topic on first use)."""
        return await self.coordinator_partition(OFFSETS_TOPIC, group_id)

    async def transaction_partition(self, transactional_id: str) -> int:
        """The __transaction_state partition coordinating `transactional_id` (creating the topic on first use)."""
        return await self.coordinator_partition(TRANSACTION_STATE_TOPIC, transactional_id)

    async def coordinator_partition(self, topic: str, key: str) -> int:
        count = self._internal_partitions.get(topic)
        if count is None:
            await self.controller.create_internal_topic.remote(topic)
            described = await self.controller.client_metadata.remote([topic])
            count = self._internal_partitions[topic] = len(described["topics"][topic]["partitions"])
        return coordinator_partition(key, count)


def error_code_of(error: BaseException) -> int:
    """Kafka's code for an exception out of a handler (UNKNOWN_SERVER_ERROR for bugs)."""
    if isinstance(error, KafkaError):
        return error.code
    logger.error("unexpected error serving a request", exc_info=error)
    return UnknownServerError.code


def error_message_of(error: BaseException) -> str:
    if isinstance(error, KafkaError):
        return str(getattr(error, "cause", None) or error)
    return f"{type(error).__name__}: {error}"
