"""KafkaApis: one request in, one response (or none) out, for every API the listener serves.

`handle` looks up the handler of the request's API, builds the response message of the
request's version from what the handler returns (see `entities.build`), and turns an
exception into that response with the error code set, so a request is always answered
with something its client can read. Produce and Fetch answers skip the message: their
frames are written straight from the handler's values (data_responses.py). Handlers live by topic in `data_apis`, `group_apis`,
`admin_apis`, `reassignment_apis`, `election_apis`, `scram_apis` and `acl_apis`; each
checks the request's principal against the ACLs (broker_view.authorized) where Kafka does.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from rayk.net import acl_apis, admin_apis, data_apis, election_apis, group_apis, reassignment_apis, scram_apis
from rayk.net import api_versions as keys
from rayk.net.broker_view import BrokerView, error_code_of
from rayk.net.codec import Request, response_class
from rayk.net.data_responses import FRAME_WRITERS
from rayk.net.entities import build, error_response

logger = logging.getLogger(__name__)

Handler = Callable[[BrokerView, Request], Awaitable[Any]]
CLOSE_CONNECTION = data_apis.CLOSE_CONNECTION

HANDLERS: dict[int, Handler] = {
    keys.PRODUCE: data_apis.produce,
    keys.FETCH: data_apis.fetch,
    keys.LIST_OFFSETS: data_apis.list_offsets,
    keys.OFFSET_FOR_LEADER_EPOCH: data_apis.offset_for_leader_epoch,
    keys.METADATA: admin_apis.metadata,
    keys.API_VERSIONS: admin_apis.api_versions,
    keys.DESCRIBE_CLUSTER: admin_apis.describe_cluster,
    keys.CREATE_TOPICS: admin_apis.create_topics,
    keys.CREATE_PARTITIONS: admin_apis.create_partitions,
    keys.ELECT_LEADERS: election_apis.elect_leaders,
    keys.DELETE_TOPICS: admin_apis.delete_topics,
    keys.DESCRIBE_CONFIGS: admin_apis.describe_configs,
    keys.INIT_PRODUCER_ID: admin_apis.init_producer_id,
    keys.ALTER_PARTITION_REASSIGNMENTS: reassignment_apis.alter_partition_reassignments,
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
    keys.SASL_HANDSHAKE: scram_apis.sasl_without_sasl,  # a SASL listener's connections answer these themselves
    keys.SASL_AUTHENTICATE: scram_apis.sasl_without_sasl,
    keys.DESCRIBE_USER_SCRAM_CREDENTIALS: scram_apis.describe_user_scram_credentials,
    keys.ALTER_USER_SCRAM_CREDENTIALS: scram_apis.alter_user_scram_credentials,
    keys.DESCRIBE_ACLS: acl_apis.describe_acls,
    keys.CREATE_ACLS: acl_apis.create_acls,
    keys.DELETE_ACLS: acl_apis.delete_acls,
}
assert set(HANDLERS) == set(keys.SUPPORTED_VERSIONS), "every served API has a handler"


class KafkaApis:
    def __init__(self, view: BrokerView) -> None:
        self.view = view

    async def handle(self, request: Request) -> Any:
        """The response message, its finished frame (bytes: Produce and Fetch), None
        (acks=0 produce) or CLOSE_CONNECTION."""
        head = request.head
        cls = response_class(head.api_key, head.api_version)
        try:
            values = await HANDLERS[head.api_key](self.view, request)
            if values is None or values is CLOSE_CONNECTION:
                return values
            write_frame = FRAME_WRITERS.get(head.api_key)
            return build(cls, values) if write_frame is None else write_frame(head, values)
        except Exception as e:  # error_code_of logs anything that is not a KafkaError
            return error_response(cls, error_code_of(e))
