"""KafkaApis: one request in, one response (or none) out, for every API the listener serves.

`handle` looks up the handler of the request's API, builds the response message of the
request's version from what the handler returns (see `entities.build`), and turns an
exception into that response with the error code set, so a request is always answered
with something its client can read. Produce and Fetch answers skip the message: their
frames are written straight from the handler's values (data_responses.py). Handlers live by topic in `data_apis`, `group_apis`,
`admin_apis`, `config_apis`, `records_apis`, `consumer_group_apis`, `reassignment_apis`, `election_apis`, `scram_apis`, `acl_apis` and
`quota_apis`, `txn_apis` and `log_dir_apis`; each checks the request's principal against the ACLs
(broker_view.authorized) where Kafka does.

Every answer carries the throttle time its client's quotas call for (client_quotas.py), as
Kafka's KafkaApis does: Produce counts its size against producer_byte_rate, Fetch what it
answered against consumer_byte_rate (in data_apis.fetch), and every request the listener
thread time it took, in its handler and the tasks the handler started, against
request_percentage (not an acks=0 Produce, as in Kafka).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from rayk.net import acl_apis, admin_apis, config_apis, data_apis, election_apis, group_apis, quota_apis, reassignment_apis, scram_apis
from rayk.net import consumer_group_apis, log_dir_apis, records_apis, share_group_apis, share_offsets_apis, txn_apis
from rayk.net import api_versions as keys
from rayk.net.broker_view import BrokerView, error_code_of
from rayk.net.client_quotas import ThreadCost, ThreadTimed
from rayk.net.codec import Request, response_class
from rayk.net.data_responses import FRAME_WRITERS
from rayk.net.entities import build, error_response
from rayk.net.native_produce import with_throttle

logger = logging.getLogger(__name__)

Handler = Callable[[BrokerView, Request], Awaitable[Any]]
CLOSE_CONNECTION = data_apis.CLOSE_CONNECTION
METADATA_REFRESH_TIMEOUT_MS = 1_000  # an admin change's answer waits no longer for the listener's image


def _then_refresh_metadata(handler: Handler) -> Handler:
    """`handler`, answered once this listener's metadata image holds what it changed (a
    client reading Metadata from this listener next sees the topic gone, its new
    partitions, its new leaders), also after an error (a change may have been made). A
    refresh that fails or takes over METADATA_REFRESH_TIMEOUT_MS leaves the image to its
    long poll; a cancelled handler (its connection went) refreshes nothing."""

    async def handle(view: BrokerView, request: Request) -> Any:
        cancelled = False
        try:
            return await handler(view, request)
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            if not cancelled:
                try:
                    async with asyncio.timeout(METADATA_REFRESH_TIMEOUT_MS / 1000):
                        await view.refresh_metadata_image()
                except Exception as e:
                    logger.debug("the metadata image was not refreshed after %s: %r", handler.__name__, e)

    return handle


HANDLERS: dict[int, Handler] = {
    keys.PRODUCE: data_apis.produce,
    keys.FETCH: data_apis.fetch,
    keys.LIST_OFFSETS: data_apis.list_offsets,
    keys.OFFSET_FOR_LEADER_EPOCH: data_apis.offset_for_leader_epoch,
    keys.DELETE_RECORDS: records_apis.delete_records,
    keys.METADATA: admin_apis.metadata,
    keys.API_VERSIONS: admin_apis.api_versions,
    keys.DESCRIBE_CLUSTER: admin_apis.describe_cluster,
    keys.DESCRIBE_LOG_DIRS: log_dir_apis.describe_log_dirs,
    keys.CREATE_TOPICS: admin_apis.create_topics,
    keys.CREATE_PARTITIONS: _then_refresh_metadata(admin_apis.create_partitions),
    keys.ELECT_LEADERS: _then_refresh_metadata(election_apis.elect_leaders),
    keys.DELETE_TOPICS: _then_refresh_metadata(admin_apis.delete_topics),
    keys.DESCRIBE_CONFIGS: admin_apis.describe_configs,
    keys.ALTER_CONFIGS: config_apis.alter_configs,
    keys.INCREMENTAL_ALTER_CONFIGS: config_apis.incremental_alter_configs,
    keys.INIT_PRODUCER_ID: txn_apis.init_producer_id,
    keys.ADD_PARTITIONS_TO_TXN: txn_apis.add_partitions_to_txn,
    keys.ADD_OFFSETS_TO_TXN: txn_apis.add_offsets_to_txn,
    keys.END_TXN: txn_apis.end_txn,
    keys.TXN_OFFSET_COMMIT: group_apis.txn_offset_commit,
    keys.DESCRIBE_TRANSACTIONS: txn_apis.describe_transactions,
    keys.LIST_TRANSACTIONS: txn_apis.list_transactions,
    keys.DESCRIBE_PRODUCERS: txn_apis.describe_producers,
    keys.ALTER_PARTITION_REASSIGNMENTS: _then_refresh_metadata(reassignment_apis.alter_partition_reassignments),
    keys.LIST_PARTITION_REASSIGNMENTS: reassignment_apis.list_partition_reassignments,
    keys.FIND_COORDINATOR: group_apis.find_coordinator,
    keys.JOIN_GROUP: group_apis.join_group,
    keys.SYNC_GROUP: group_apis.sync_group,
    keys.HEARTBEAT: group_apis.heartbeat,
    keys.LEAVE_GROUP: group_apis.leave_group,
    keys.OFFSET_COMMIT: group_apis.offset_commit,
    keys.OFFSET_FETCH: group_apis.offset_fetch,
    keys.LIST_GROUPS: group_apis.list_groups,
    keys.DESCRIBE_GROUPS: group_apis.describe_groups,
    keys.DELETE_GROUPS: group_apis.delete_groups,
    keys.OFFSET_DELETE: group_apis.offset_delete,
    keys.CONSUMER_GROUP_HEARTBEAT: consumer_group_apis.consumer_group_heartbeat,
    keys.CONSUMER_GROUP_DESCRIBE: consumer_group_apis.consumer_group_describe,
    keys.SHARE_GROUP_HEARTBEAT: share_group_apis.share_group_heartbeat,
    keys.SHARE_GROUP_DESCRIBE: share_group_apis.share_group_describe,
    keys.SHARE_FETCH: share_group_apis.share_fetch,
    keys.SHARE_ACKNOWLEDGE: share_group_apis.share_acknowledge,
    keys.DESCRIBE_SHARE_GROUP_OFFSETS: share_offsets_apis.describe_share_group_offsets,
    keys.ALTER_SHARE_GROUP_OFFSETS: share_offsets_apis.alter_share_group_offsets,
    keys.DELETE_SHARE_GROUP_OFFSETS: share_offsets_apis.delete_share_group_offsets,
    keys.SASL_HANDSHAKE: scram_apis.sasl_without_sasl,  # a SASL listener's connections answer these themselves
    keys.SASL_AUTHENTICATE: scram_apis.sasl_without_sasl,
    keys.DESCRIBE_USER_SCRAM_CREDENTIALS: scram_apis.describe_user_scram_credentials,
    keys.ALTER_USER_SCRAM_CREDENTIALS: scram_apis.alter_user_scram_credentials,
    keys.DESCRIBE_ACLS: acl_apis.describe_acls,
    keys.CREATE_ACLS: acl_apis.create_acls,
    keys.DELETE_ACLS: acl_apis.delete_acls,
    keys.DESCRIBE_CLIENT_QUOTAS: quota_apis.describe_client_quotas,
    keys.ALTER_CLIENT_QUOTAS: quota_apis.alter_client_quotas,
}
assert set(HANDLERS) == set(keys.SUPPORTED_VERSIONS), "every served API has a handler"


@dataclass(slots=True)
class Throttle:
    """What a request cost the listener's thread before it was handled (decoding it), and
    then the time its client must wait, which `handle` sets (0: none)."""

    thread_ns: int = 0
    ms: int = 0


class KafkaApis:
    """A listener's dispatcher from a decoded Request to its handler and back to a response
    (errors and throttle time included). Holds only the BrokerView it hands every handler;
    made with its SocketServer; not thread-safe (the listener's event loop)."""

    def __init__(self, view: BrokerView) -> None:
        self.view = view

    async def handle(self, request: Request, throttle: Throttle | None = None) -> Any:
        """The response message, its finished frame (bytes: Produce and Fetch), None
        (acks=0 produce) or CLOSE_CONNECTION; its throttle time goes into it and into
        `throttle`."""
        head = request.head
        cls = response_class(head.api_key, head.api_version)
        throttle = throttle if throttle is not None else Throttle()
        quotas = self.view.quotas
        handling = HANDLERS[head.api_key](self.view, request)
        cost = ThreadCost(throttle.thread_ns) if quotas.measures_request_time else None
        try:
            values = await (handling if cost is None else ThreadTimed(handling, cost))
        except Exception as e:  # error_code_of logs anything that is not a KafkaError
            code = error_code_of(e)
            throttle.ms = self._throttle_ms(request, None, cost)
            return error_response(cls, code, throttle.ms)
        throttle.ms = self._throttle_ms(request, values, cost)
        if values is None or values is CLOSE_CONNECTION:
            return values
        if isinstance(values, data_apis.NativeProduceFrame):
            return with_throttle(values.frame, values.api_version, throttle.ms)
        values["throttle_time"] = throttle.ms
        write_frame = FRAME_WRITERS.get(head.api_key)
        building_started_ns = time.thread_time_ns() if cost is not None else 0  # a system call: only if measured
        response = build(cls, values) if write_frame is None else write_frame(head, values)
        if cost is not None:  # counted for the requests after this one
            quotas.record_request_time(request.context, request.client_id, time.thread_time_ns() - building_started_ns)
        return response

    def _throttle_ms(self, request: Request, values: Any, cost: ThreadCost | None) -> int:
        """The longest of the request's byte-rate and request-time throttles."""
        quotas, context, client_id = self.view.quotas, request.context, request.client_id
        api_key = request.head.api_key
        throttle_ms = 0
        if api_key == keys.PRODUCE:
            throttle_ms = quotas.produce_throttle_ms(context, client_id, request.size_bytes)
        elif api_key == keys.FETCH and isinstance(values, dict):
            throttle_ms = values.get("throttle_time", 0)  # data_apis.fetch recorded what it answered
        if cost is not None and not (api_key == keys.PRODUCE and request.body.acks == 0):
            throttle_ms = max(throttle_ms, quotas.request_throttle_ms(context, client_id, cost.ns))
        return throttle_ms
