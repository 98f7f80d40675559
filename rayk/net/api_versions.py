"""Which Kafka APIs the listener serves, and over which versions.

The floor is Kafka 4.0's (KIP-896: Produce >= 3, Fetch >= 4, ...), which is also where the
codec's schemas start. Fetch goes to Kafka 4.0's v17: v7+ has fetch sessions and v13+
names topics by id (fetch_session.py). Other ceilings stop below versions whose
semantics rayk does not have: topic ids instead of names (Produce v13, from Kafka 4.1;
OffsetCommit / OffsetFetch v10, DeleteTopics v6), ListOffsets' MAX_TIMESTAMP and tiered
offsets (v7+), two-phase commit producer ids (InitProducerId v6), fenced brokers in
DescribeCluster (v2). Where kio has versions newer than Kafka 4.0 serves
(AlterPartitionReassignments v1, KIP-860, from Kafka 4.1), the ceiling is 4.0's.
"""

from __future__ import annotations

from typing import Any

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, API_VERSIONS = 15, 16, 18
CREATE_TOPICS, DELETE_TOPICS, INIT_PRODUCER_ID = 19, 20, 22
OFFSET_FOR_LEADER_EPOCH, DESCRIBE_CONFIGS, CREATE_PARTITIONS, ELECT_LEADERS = 23, 32, 37, 43
ALTER_PARTITION_REASSIGNMENTS, LIST_PARTITION_REASSIGNMENTS, DESCRIBE_CLUSTER = 45, 46, 60
SASL_HANDSHAKE, SASL_AUTHENTICATE, DESCRIBE_LOG_DIRS = 17, 36, 35
DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
DELETE_GROUPS, OFFSET_DELETE = 42, 47
DELETE_RECORDS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 21, 33, 44
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 61, 65, 66
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 77, 78, 79
DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS = 90, 91, 92

SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 12),
    FETCH: (4, 17),
    LIST_OFFSETS: (1, 6),
    METADATA: (0, 12),
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 9),
    FIND_COORDINATOR: (0, 6),
    JOIN_GROUP: (0, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 6),
    LIST_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 5),
    INIT_PRODUCER_ID: (0, 5),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    DESCRIBE_CONFIGS: (1, 4),
    CREATE_PARTITIONS: (0, 3),
    ELECT_LEADERS: (0, 2),
    ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    LIST_PARTITION_REASSIGNMENTS: (0, 0),
    DESCRIBE_CLUSTER: (0, 1),
    DESCRIBE_LOG_DIRS: (1, 4),  # Kafka 4.0's floor (KIP-896)
    SASL_HANDSHAKE: (0, 1),  # after v0, SASL tokens travel as bare size-prefixed frames (sasl.py)
    SASL_AUTHENTICATE: (0, 2),
    DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    DESCRIBE_ACLS: (1, 3),  # Kafka 4.x's floor; librdkafka up to 2.12 sends v0-1
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
    DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ALTER_CLIENT_QUOTAS: (0, 1),
    DELETE_RECORDS: (0, 2),
    ALTER_CONFIGS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ADD_PARTITIONS_TO_TXN: (0, 4),  # v5 is transaction version 2's (KIP-890 part 2)
    ADD_OFFSETS_TO_TXN: (0, 4),
    END_TXN: (0, 5),  # v5 is transaction version 2's (TRANSACTION_V2_FROM)
    TXN_OFFSET_COMMIT: (0, 5),  # v5 is transaction version 2's
    DESCRIBE_PRODUCERS: (0, 0),
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 1),
    CONSUMER_GROUP_HEARTBEAT: (0, 1),  # v1: member ids made by the client (KIP-1082) and regexes
    CONSUMER_GROUP_DESCRIBE: (0, 1),
    # KIP-932's share groups as Kafka 4.1 made them (v0 was 4.0's early access); ShareFetch and
    # ShareAcknowledge v2 add RENEW acknowledgements (KIP-1222), not served.
    SHARE_GROUP_HEARTBEAT: (1, 1),
    SHARE_GROUP_DESCRIBE: (1, 1),
    SHARE_FETCH: (1, 1),
    SHARE_ACKNOWLEDGE: (1, 1),
    DESCRIBE_SHARE_GROUP_OFFSETS: (0, 0),
    ALTER_SHARE_GROUP_OFFSETS: (0, 0),
    DELETE_SHARE_GROUP_OFFSETS: (0, 0),
}

# KIP-219: from these versions on, a client that reads a throttle time in an answer waits
# that long itself, so the broker answers at once (and mutes the connection); to older
# versions, and APIs not named here, it answers only once the throttle time has passed.
# Kafka's AbstractResponse.shouldClientThrottle; APIs newer than KIP-219 start at 0.
CLIENT_THROTTLES_FROM: dict[int, int] = {
    PRODUCE: 6, FETCH: 8, LIST_OFFSETS: 3, METADATA: 6, OFFSET_COMMIT: 4, OFFSET_FETCH: 4,
    FIND_COORDINATOR: 2, JOIN_GROUP: 3, HEARTBEAT: 2, LEAVE_GROUP: 2, SYNC_GROUP: 2,
    DESCRIBE_GROUPS: 2, LIST_GROUPS: 2, DELETE_GROUPS: 1, OFFSET_DELETE: 0, API_VERSIONS: 2, CREATE_TOPICS: 3, DELETE_TOPICS: 2,
    INIT_PRODUCER_ID: 1, DESCRIBE_CONFIGS: 2, CREATE_PARTITIONS: 1, ELECT_LEADERS: 0,
    ALTER_PARTITION_REASSIGNMENTS: 0, LIST_PARTITION_REASSIGNMENTS: 0, DESCRIBE_CLUSTER: 0, DESCRIBE_LOG_DIRS: 1,
    DESCRIBE_USER_SCRAM_CREDENTIALS: 0, ALTER_USER_SCRAM_CREDENTIALS: 0,
    DESCRIBE_ACLS: 1, CREATE_ACLS: 1, DELETE_ACLS: 1, DESCRIBE_CLIENT_QUOTAS: 0, ALTER_CLIENT_QUOTAS: 0,
    DELETE_RECORDS: 1, ALTER_CONFIGS: 1, INCREMENTAL_ALTER_CONFIGS: 0,
    ADD_PARTITIONS_TO_TXN: 1, ADD_OFFSETS_TO_TXN: 1, END_TXN: 1, TXN_OFFSET_COMMIT: 1,
    DESCRIBE_PRODUCERS: 0, DESCRIBE_TRANSACTIONS: 0, LIST_TRANSACTIONS: 0,
    CONSUMER_GROUP_HEARTBEAT: 0, CONSUMER_GROUP_DESCRIBE: 0,
    SHARE_GROUP_HEARTBEAT: 0, SHARE_GROUP_DESCRIBE: 0, SHARE_FETCH: 0, SHARE_ACKNOWLEDGE: 0,
    DESCRIBE_SHARE_GROUP_OFFSETS: 0, ALTER_SHARE_GROUP_OFFSETS: 0, DELETE_SHARE_GROUP_OFFSETS: 0,
}


# Transaction version 2 (KIP-890 part 2), which rayk finalizes as the cluster's
# `transaction.version` feature: a client that sees it finalized sends these versions and
# up, and expects their semantics (Kafka's LAST_BEFORE_TRANSACTION_V2_VERSION + 1): Produce
# adds each partition to the transaction at its leader, TxnOffsetCommit the group's offsets
# partition, and EndTxn bumps the epoch and answers the new one. Older versions keep
# transaction version 1's (the client adds them with AddPartitionsToTxn / AddOffsetsToTxn).
TRANSACTION_VERSION_FEATURE = "transaction.version"
FINALIZED_TRANSACTION_VERSION = 2
# group.version 1: KIP-848's consumer group protocol is served (ConsumerGroupHeartbeat), as a
# Kafka 4.0 cluster finalizes it.
GROUP_VERSION_FEATURE = "group.version"
FINALIZED_GROUP_VERSION = 1
# share.version 1: KIP-932's share groups are served (ShareGroupHeartbeat, ShareFetch, ...), as a
# Kafka 4.1+ cluster that enables them finalizes it.
SHARE_VERSION_FEATURE = "share.version"
FINALIZED_SHARE_VERSION = 1
FINALIZED_FEATURES = {TRANSACTION_VERSION_FEATURE: FINALIZED_TRANSACTION_VERSION, GROUP_VERSION_FEATURE: FINALIZED_GROUP_VERSION,
                      SHARE_VERSION_FEATURE: FINALIZED_SHARE_VERSION}
TRANSACTION_V2_FROM: dict[int, int] = {PRODUCE: 12, TXN_OFFSET_COMMIT: 5, END_TXN: 5}


def transaction_version_of(request: Any) -> int:
    """2 for a Produce, TxnOffsetCommit or EndTxn of transaction version 2, else 1."""
    first = TRANSACTION_V2_FROM.get(request.head.api_key)
    return 2 if first is not None and request.head.api_version >= first else 1


def client_throttles(api_key: int, api_version: int) -> bool:
    """Whether the client of this answer waits out its throttle time itself (KIP-219)."""
    first = CLIENT_THROTTLES_FROM.get(api_key)
    return first is not None and api_version >= first


def is_supported(api_key: int, api_version: int) -> bool:
    span = SUPPORTED_VERSIONS.get(api_key)
    return span is not None and span[0] <= api_version <= span[1]
