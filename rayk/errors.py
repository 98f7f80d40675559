"""rayk's error types, one class per Kafka error code.

Every error a layer of rayk raises on purpose is a `KafkaError` subclass carrying the
Kafka protocol code (`code`), Kafka's upper-case name (`name`) and whether a client may
simply retry (`retriable`), so the Python API, the wire protocol listener and the actors
speak the same vocabulary. Conditions with no wire code of their own (for example a
follower append that does not continue the log) use code -1, UNKNOWN_SERVER_ERROR, which
is what Kafka sends for an exception it has no mapping for.

The classes take a single message argument so they pickle across Ray actor calls;
InvalidRecordError also takes the records at fault as a keyword (`record_errors`, KIP-467),
which pickling keeps as the instance's state.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

# Kafka's ProduceResponse names every record at fault; rayk names at most this many per
# refused batch, which bounds what carries them (a data plane frame, a Ray reply, a
# ProduceResponse) to about MAX_RECORD_ERRORS x (a message + 6 bytes). It covers a whole
# batch of librdkafka's default batch.num.messages (10,000); a record at fault beyond it
# fails as a "different record" with the others and is refused again when resent.
MAX_RECORD_ERRORS = 10_000


@dataclass(frozen=True, slots=True)
class RecordError:
    """One record that made a leader refuse its batch (KIP-467): the record's index within
    its batch (0 for the batch's first record) and why."""

    batch_index: int
    message: str


class KafkaError(Exception):
    """Base of all rayk errors. `code` and `name` are Kafka's; see the protocol guide."""

    code: int = -1
    name: str = "UNKNOWN_SERVER_ERROR"
    retriable: bool = False
    # The records of a produced batch at fault, if the error names any (see InvalidRecordError).
    record_errors: tuple[RecordError, ...] = ()

    def __str__(self) -> str:
        message = super().__str__()
        return f"{self.name}: {message}" if message else self.name


class UnknownServerError(KafkaError):
    """An exception with no Kafka code of its own (a bug in a handler, an actor that raised a
    plain Python exception or could not start), wrapped so only KafkaErrors escape; not retried."""

    code, name = -1, "UNKNOWN_SERVER_ERROR"


class OffsetOutOfRangeError(KafkaError):
    """A read outside the log's [log start, LEO] (or a DeleteRecords above the HW); not
    retried: a consumer resets its position (auto_offset_reset), a follower truncates to the
    leader's range."""

    code, name = 1, "OFFSET_OUT_OF_RANGE"


class CorruptRecordError(KafkaError):
    """Bytes that do not decode: a batch failing its CRC-32C or framing, an undecompressable body,
    a malformed control or metadata record. Retriable, as in Kafka (a resend may arrive intact)."""

    code, name, retriable = 2, "CORRUPT_MESSAGE", True


class UnknownTopicOrPartitionError(KafkaError):
    """The topic or partition does not exist (or has no log on this broker). Retriable: a topic
    being created or moved appears once metadata catches up."""

    code, name, retriable = 3, "UNKNOWN_TOPIC_OR_PARTITION", True


class InvalidFetchSizeError(KafkaError):
    """A read with a negative `max_bytes`; not retried."""

    code, name = 4, "INVALID_FETCH_SIZE"


class LeaderNotAvailableError(KafkaError):
    """The partition has no leader ready (mid-election, or a topic auto-created by this very
    Metadata request); retriable after a metadata refresh."""

    code, name, retriable = 5, "LEADER_NOT_AVAILABLE", True


class NotLeaderOrFollowerError(KafkaError):
    """This replica does not lead the partition (or holds none of it) in the epoch asked for, or
    its leader could not be reached; retriable after a metadata refresh finds the new leader."""

    code, name, retriable = 6, "NOT_LEADER_OR_FOLLOWER", True


class RequestTimedOutError(KafkaError):
    """No answer within the request's timeout: an acks=all write not replicated in time, a
    leader or the Controller silent, a client call past its deadline. Retriable; the work
    may still land."""

    code, name, retriable = 7, "REQUEST_TIMED_OUT", True


class RecordTooLargeError(KafkaError):
    """A batch is larger than `max.message.bytes` (Kafka: MESSAGE_TOO_LARGE)."""

    code, name = 10, "MESSAGE_TOO_LARGE"


class KafkaTimeoutError(KafkaError, TimeoutError):
    """A client-side wait ran out (a future's `result(timeout)`, `flush(timeout_s)`); the
    operation may still complete. Also a TimeoutError, as concurrent.futures raises."""

    code, name, retriable = -1, "KAFKA_TIMEOUT", True


class BufferExhaustedError(KafkaTimeoutError):
    """The producer's `buffer_memory` stayed full for `max_block_ms` (raised by `send`, on the
    client; Kafka's BufferExhaustedException). Nothing was queued: retry later or slow down."""

    code, name, retriable = -1, "BUFFER_EXHAUSTED", True


class RecordBatchTooLargeError(KafkaError):
    """A batch is larger than a whole segment can hold (Kafka: RECORD_LIST_TOO_LARGE)."""

    code, name = 18, "RECORD_LIST_TOO_LARGE"


class NetworkError(KafkaError):
    """The peer (an actor or a socket) went away mid-request; retry after a metadata refresh."""

    code, name, retriable = 13, "NETWORK_EXCEPTION", True


class OffsetMetadataTooLargeError(KafkaError):
    """An offset commit whose metadata string exceeds offset.metadata.max.bytes; not retried."""

    code, name = 12, "OFFSET_METADATA_TOO_LARGE"


class CoordinatorLoadInProgressError(KafkaError):
    """The coordinator cannot answer yet: rayk raises it while a classic group rebalances before
    its online upgrade to the consumer protocol. Retriable after a backoff."""

    code, name, retriable = 14, "COORDINATOR_LOAD_IN_PROGRESS", True


class CoordinatorNotAvailableError(KafkaError):
    """The group's or transactional id's coordinator cannot serve now (its partition's leader
    unreachable or restarting, its records not replicated); retriable after finding it again."""

    code, name, retriable = 15, "COORDINATOR_NOT_AVAILABLE", True


class NotCoordinatorError(KafkaError):
    """This replica does not (or no longer) coordinate the group: find the coordinator again."""

    code, name, retriable = 16, "NOT_COORDINATOR", True


class NotEnoughReplicasError(KafkaError):
    """An acks=all write refused before appending: the ISR is below min.insync.replicas (or a
    transactional write could not be verified with its coordinator, as Kafka maps it). Retriable."""

    code, name, retriable = 19, "NOT_ENOUGH_REPLICAS", True


class NotEnoughReplicasAfterAppendError(KafkaError):
    """An acks=all write was appended but the ISR shrank below min.insync.replicas before it was
    committed; retriable, but a resend without idempotence may duplicate it."""

    code, name, retriable = 20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", True


class InvalidRequiredAcksError(KafkaError):
    """A produce with acks other than 0, 1 or -1 (all); not retried."""

    code, name = 21, "INVALID_REQUIRED_ACKS"


class IllegalGenerationError(KafkaError):
    """The member's generation is not the group's current one: it must rejoin."""

    code, name = 22, "ILLEGAL_GENERATION"


class InconsistentGroupProtocolError(KafkaError):
    """A JoinGroup whose protocol type or protocols do not match the group's members (or whose
    subscription is malformed for a consumer-protocol group); not retried."""

    code, name = 23, "INCONSISTENT_GROUP_PROTOCOL"


class InvalidGroupIdError(KafkaError):
    """A group request with an empty group id (or a group call of a consumer without a
    group_id); not retried."""

    code, name = 24, "INVALID_GROUP_ID"


class UnknownMemberIdError(KafkaError):
    """The coordinator does not know this member (it timed out or the coordinator moved): rejoin."""

    code, name = 25, "UNKNOWN_MEMBER_ID"


class InvalidSessionTimeoutError(KafkaError):
    """A JoinGroup whose session timeout is outside the broker's
    [group.min.session.timeout.ms, group.max.session.timeout.ms]; not retried."""

    code, name = 26, "INVALID_SESSION_TIMEOUT"


class RebalanceInProgressError(KafkaError):
    """The group is rebalancing: rejoin to get the new assignment."""

    code, name = 27, "REBALANCE_IN_PROGRESS"


class InvalidTopicError(KafkaError):
    """A topic name that is not 1-249 of [a-zA-Z0-9._-], or an internal topic used wrongly."""

    code, name = 17, "INVALID_TOPIC_EXCEPTION"


class InvalidTimestampError(KafkaError):
    """A ListOffsets timestamp that is neither >= 0 nor -1 (latest) / -2 (earliest); not retried."""

    code, name = 32, "INVALID_TIMESTAMP"


class UnsupportedVersionError(KafkaError):
    """A request of an API or version this broker does not serve, or a metadata record of a
    newer version than this rayk reads (upgrade rayk); not retried."""

    code, name = 35, "UNSUPPORTED_VERSION"


class NotControllerError(KafkaError):
    """The Controller could not be reached (Ray is restarting it): refresh metadata and retry."""

    code, name, retriable = 41, "NOT_CONTROLLER", True


class InvalidRequestError(KafkaError):
    """A request that parses but makes no sense (an empty transactional id, a key named twice,
    a field missing that its version requires), or bytes that do not parse; not retried."""

    code, name = 42, "INVALID_REQUEST"


class TopicAlreadyExistsError(KafkaError):
    """CreateTopics of a name that exists; not retried (callers that only want the topic to
    exist treat it as success)."""

    code, name = 36, "TOPIC_ALREADY_EXISTS"


class InvalidPartitionsError(KafkaError):
    """A partition count below 1 at creation, or CreatePartitions to a count that is not larger
    than the current one; not retried."""

    code, name = 37, "INVALID_PARTITIONS"


class InvalidReplicationFactorError(KafkaError):
    """More replicas asked for than there are live brokers, or fewer than one."""

    code, name = 38, "INVALID_REPLICATION_FACTOR"


class InvalidConfigurationError(KafkaError):
    """A config value is malformed or out of range (Kafka: INVALID_CONFIG)."""

    code, name = 40, "INVALID_CONFIG"


class InvalidClientConfigError(InvalidConfigurationError, ValueError):
    """A client's setting out of range (a Producer's, a Consumer's: rayk.client's
    *_config.py): INVALID_CONFIG, and a ValueError, as the clients raised before their
    settings were typed."""


class PolicyViolationError(KafkaError):
    """A request breaks a limit the cluster sets, e.g. more partition replicas than the
    brokers may hold (Kafka: POLICY_VIOLATION)."""

    code, name = 44, "POLICY_VIOLATION"


class TopicAuthorizationFailedError(KafkaError):
    """The principal may not do this to the topic (Kafka: TOPIC_AUTHORIZATION_FAILED)."""

    code, name = 29, "TOPIC_AUTHORIZATION_FAILED"


class GroupAuthorizationFailedError(KafkaError):
    """The principal may not do this to the consumer group (Kafka: GROUP_AUTHORIZATION_FAILED)."""

    code, name = 30, "GROUP_AUTHORIZATION_FAILED"


class SecurityDisabledError(KafkaError):
    """An ACL request to a cluster without an authorizer (Kafka: SECURITY_DISABLED)."""

    code, name = 54, "SECURITY_DISABLED"


class ClusterAuthorizationFailedError(KafkaError):
    """The principal may not do this to the cluster (Kafka: CLUSTER_AUTHORIZATION_FAILED)."""

    code, name = 31, "CLUSTER_AUTHORIZATION_FAILED"


class UnsupportedSaslMechanismError(KafkaError):
    """The client asked for a SASL mechanism the listener does not enable
    (Kafka: UNSUPPORTED_SASL_MECHANISM)."""

    code, name = 33, "UNSUPPORTED_SASL_MECHANISM"


class IllegalSaslStateError(KafkaError):
    """A SASL request out of order, e.g. SaslAuthenticate before SaslHandshake
    (Kafka: ILLEGAL_SASL_STATE)."""

    code, name = 34, "ILLEGAL_SASL_STATE"


class SaslAuthenticationFailedError(KafkaError):
    """Wrong credentials, or an unknown user (Kafka: SASL_AUTHENTICATION_FAILED)."""

    code, name = 58, "SASL_AUTHENTICATION_FAILED"


class ResourceNotFoundError(KafkaError):
    """E.g. deleting a SCRAM credential the user does not have (Kafka: RESOURCE_NOT_FOUND)."""

    code, name = 91, "RESOURCE_NOT_FOUND"


class DuplicateResourceError(KafkaError):
    """A request names one resource twice (Kafka: DUPLICATE_RESOURCE)."""

    code, name = 92, "DUPLICATE_RESOURCE"


class UnacceptableCredentialError(KafkaError):
    """A SCRAM credential with an empty user name or iterations out of range
    (Kafka: UNACCEPTABLE_CREDENTIAL)."""

    code, name = 93, "UNACCEPTABLE_CREDENTIAL"


class UnsupportedForMessageFormatError(KafkaError):
    """A batch uses a record format other than v2 (magic 2), which is all rayk stores."""

    code, name = 43, "UNSUPPORTED_FOR_MESSAGE_FORMAT"


class KafkaStorageError(KafkaError):
    """The disk under a log failed or its files are unusable."""

    code, name, retriable = 56, "KAFKA_STORAGE_ERROR", True


class OffsetMovedToTieredStorageError(KafkaError):
    """A follower fetched below its leader's local log start, where the records are only in
    remote storage (KIP-405): it rebuilds its log's start from the remote copy and fetches
    from the leader's local log start (Kafka: OFFSET_MOVED_TO_TIERED_STORAGE)."""

    code, name = 109, "OFFSET_MOVED_TO_TIERED_STORAGE"


class NonEmptyGroupError(KafkaError):
    """A group that still has members was asked to be deleted or to have its offsets changed;
    not retried (it may succeed once the members have left)."""

    code, name = 68, "NON_EMPTY_GROUP"


class GroupIdNotFoundError(KafkaError):
    """The group does not exist, or is not of the kind the request is for (a share group asked
    as a consumer group, a classic group that cannot be upgraded); not retried."""

    code, name = 69, "GROUP_ID_NOT_FOUND"


class GroupMaxSizeReachedError(KafkaError):
    """A member would join a group that has group.consumer.max.size / group.share.max.size members."""

    code, name = 81, "GROUP_MAX_SIZE_REACHED"


class TransactionalIdAuthorizationFailedError(KafkaError):
    """The principal may not use the transactional id (WRITE, or DESCRIBE for lookups)."""

    code, name = 53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


class OperationNotAttemptedError(KafkaError):
    """A batched request's other items failed, so this one was not tried (AddPartitionsToTxn)."""

    code, name = 55, "OPERATION_NOT_ATTEMPTED"


class UnstableOffsetCommitError(KafkaError):
    """OffsetFetch with require_stable of a partition whose transactional offsets await their marker."""

    code, name, retriable = 88, "UNSTABLE_OFFSET_COMMIT", True


class TransactionalIdNotFoundError(KafkaError):
    """DescribeTransactions of an id its coordinator does not know."""

    code, name = 105, "TRANSACTIONAL_ID_NOT_FOUND"


class GroupSubscribedToTopicError(KafkaError):
    """OffsetDelete of a topic that the group's members consume (KIP-496)."""

    code, name = 86, "GROUP_SUBSCRIBED_TO_TOPIC"


class StaleBrokerEpochError(KafkaError):
    """A broker spoke with the epoch of an older registration (an old incarnation)."""

    code, name = 77, "STALE_BROKER_EPOCH"


class FencedLeaderEpochError(KafkaError):
    """A request carries a leader epoch older than the replica's (a stale leader's write, a
    fetch or state change from an older epoch); retriable after a metadata refresh."""

    code, name, retriable = 74, "FENCED_LEADER_EPOCH", True


class UnknownLeaderEpochError(KafkaError):
    """A fetch carries a leader epoch newer than the leader knows yet (it has not heard of its
    own election); retriable."""

    code, name, retriable = 75, "UNKNOWN_LEADER_EPOCH", True


class OffsetNotAvailableError(KafkaError):
    """A new leader's high watermark is still below the start of its epoch (KIP-207):
    the end offsets it would answer could be lower than its predecessor's; retry."""

    code, name, retriable = 78, "OFFSET_NOT_AVAILABLE", True


class UnsupportedCompressionTypeError(KafkaError):
    """An unknown codec name, or a codec whose Python package is not installed (the message
    names what to pip install); not retried."""

    code, name = 76, "UNSUPPORTED_COMPRESSION_TYPE"


class InvalidRecordError(KafkaError):
    """A batch's framing or records are malformed although its CRC may be valid.

    When particular records are at fault (Kafka's LogValidator: a record without a key for
    a compacted topic), `record_errors` names them, the first MAX_RECORD_ERRORS of them,
    and a Produce v8+ answer carries them (KIP-467): a client fails those records and may
    send the batch's other records again; nothing of the batch was written."""

    code, name = 87, "INVALID_RECORD"

    def __init__(self, *args: object, record_errors: Iterable[RecordError] = ()) -> None:
        super().__init__(*args)
        self.record_errors = tuple(itertools.islice(record_errors, MAX_RECORD_ERRORS))


class InvalidDifferentRecordError(KafkaError):
    """The Python producer's: a record that was sound but rode in a batch the leader refused
    for other records of it (named in the batch's INVALID_RECORD). Nothing of the batch was
    written; the record may be sent again. librdkafka's _INVALID_DIFFERENT_RECORD (Kafka's
    Java producer fails it with a plain KafkaException); no wire code."""

    code, name = -1, "INVALID_DIFFERENT_RECORD"


class OutOfOrderSequenceError(KafkaError):
    """An idempotent producer's batch does not continue its sequence (records were lost)."""

    code, name = 45, "OUT_OF_ORDER_SEQUENCE_NUMBER"


class InvalidProducerEpochError(KafkaError):
    """A newer instance of this producer (higher epoch) has written: this one is fenced."""

    code, name = 47, "INVALID_PRODUCER_EPOCH"


class InvalidTxnStateError(KafkaError):
    """The request does not fit the transaction's state (a commit with none open, ...)."""

    code, name = 48, "INVALID_TXN_STATE"


class InvalidProducerIdMappingError(KafkaError):
    """The producer id is not the one the transactional id has (or the id is unknown)."""

    code, name = 49, "INVALID_PRODUCER_ID_MAPPING"


class InvalidTransactionTimeoutError(KafkaError):
    """transaction.timeout.ms above the broker's transaction.max.timeout.ms."""

    code, name = 50, "INVALID_TRANSACTION_TIMEOUT"


class ConcurrentTransactionsError(KafkaError):
    """The transactional id is completing a transaction: retry after a backoff."""

    code, name, retriable = 51, "CONCURRENT_TRANSACTIONS", True


class ProducerFencedError(KafkaError):
    """A newer instance of this transactional producer (a higher epoch) took over."""

    code, name = 90, "PRODUCER_FENCED"


class TransactionCoordinatorFencedError(KafkaError):
    """A transaction marker from a coordinator older (lower coordinator epoch) than one
    whose marker the partition already took: a zombie coordinator."""

    code, name = 52, "TRANSACTION_COORDINATOR_FENCED"


class FencedInstanceIdError(KafkaError):
    """Another instance with this one's identity took over (Kafka: a static member's
    group.instance.id; rayk also: a stream whose group another stream committed to)."""

    code, name = 82, "FENCED_INSTANCE_ID"


class InvalidUpdateVersionError(KafkaError):
    """An AlterPartition carried a partition epoch that is no longer current."""

    code, name = 95, "INVALID_UPDATE_VERSION"


class IneligibleReplicaError(KafkaError):
    """An AlterPartition would add a fenced or unknown broker to the ISR."""

    code, name = 107, "INELIGIBLE_REPLICA"


class FencedMemberEpochError(KafkaError):
    """A consumer-protocol member (KIP-848) heartbeats with an epoch the coordinator no
    longer accepts: it must give up its partitions and rejoin with epoch 0."""

    code, name = 110, "FENCED_MEMBER_EPOCH"


class UnsupportedAssignorError(KafkaError):
    """A consumer-protocol member names a server-side assignor the coordinator does not have."""

    code, name = 112, "UNSUPPORTED_ASSIGNOR"


class UnreleasedInstanceIdError(KafkaError):
    """A static member joins with an instance id another member still holds (it has not
    left with epoch -2, nor timed out)."""

    code, name = 111, "UNRELEASED_INSTANCE_ID"


class StaleMemberEpochError(KafkaError):
    """A consumer-protocol member commits or fetches offsets with an epoch older than its
    current one: it retries once its heartbeat has brought the new epoch."""

    code, name = 113, "STALE_MEMBER_EPOCH"  # (not a RetriableException in Kafka: the client retries with its new epoch)


class InvalidRegularExpressionError(KafkaError):
    """A consumer-protocol member subscribes with a regular expression that does not compile."""

    code, name = 128, "INVALID_REGULAR_EXPRESSION"


class InvalidRecordStateError(KafkaError):
    """A share-group acknowledgement names a record its member does not hold (KIP-932)."""

    code, name = 121, "INVALID_RECORD_STATE"


class ShareSessionNotFoundError(KafkaError):
    """A ShareFetch or ShareAcknowledge continues a share session this broker does not have
    (never opened, closed, or evicted): the client opens a new one (epoch 0)."""

    code, name, retriable = 122, "SHARE_SESSION_NOT_FOUND", True


class InvalidShareSessionEpochError(KafkaError):
    """A ShareFetch or ShareAcknowledge carries another epoch than its share session's next."""

    code, name, retriable = 123, "INVALID_SHARE_SESSION_EPOCH", True


class FencedStateEpochError(KafkaError):
    """A share-partition leader writes its share state in a state epoch the group
    coordinator has left (the group's state was deleted or reset meanwhile): it reads the
    state again."""

    code, name = 124, "FENCED_STATE_EPOCH"


class InvalidReplicaAssignmentError(KafkaError):
    """A reassignment names no replica, the same broker twice, or an unknown broker."""

    code, name = 39, "INVALID_REPLICA_ASSIGNMENT"


class NoReassignmentInProgressError(KafkaError):
    """A reassignment was cancelled where none is under way."""

    code, name = 85, "NO_REASSIGNMENT_IN_PROGRESS"


class PreferredLeaderNotAvailableError(KafkaError):
    """The preferred replica may not lead now (not live, not in sync, or recovering)."""

    code, name, retriable = 80, "PREFERRED_LEADER_NOT_AVAILABLE", True


class EligibleLeadersNotAvailableError(KafkaError):
    """An unclean election found no live replica to elect."""

    code, name, retriable = 83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", True


class ElectionNotNeededError(KafkaError):
    """The preferred replica already leads (or, for an unclean election, a leader exists)."""

    code, name = 84, "ELECTION_NOT_NEEDED"


class FetchSessionIdNotFoundError(KafkaError):
    """An incremental fetch names a session this broker does not hold (KIP-227)."""

    code, name, retriable = 70, "FETCH_SESSION_ID_NOT_FOUND", True


class InvalidFetchSessionEpochError(KafkaError):
    """An incremental fetch carries another epoch than its session's next one."""

    code, name, retriable = 71, "INVALID_FETCH_SESSION_EPOCH", True


class UnknownTopicIdError(KafkaError):
    """A request names a topic id no topic of this cluster has."""

    code, name, retriable = 100, "UNKNOWN_TOPIC_ID", True


class InconsistentTopicIdError(KafkaError):
    """A request's topic id is not the id of the partition's log (a topic recreated)."""

    code, name, retriable = 103, "INCONSISTENT_TOPIC_ID", True


class FetchSessionTopicIdError(KafkaError):
    """An incremental fetch uses topic ids where its session used names, or the reverse."""

    code, name, retriable = 106, "FETCH_SESSION_TOPIC_ID_ERROR", True


class InconsistentClusterIdError(KafkaStorageError):
    """A data directory's meta.properties names another cluster or another broker id."""

    code, name, retriable = 104, "INCONSISTENT_CLUSTER_ID", False


class UnexpectedAppendOffsetError(KafkaError):
    """A follower batch does not start at the log end offset (no wire code in Kafka)."""

    code, name = -1, "UNKNOWN_SERVER_ERROR"


class LogClosedError(KafkaStorageError):
    """An operation was attempted on a `Log` after `close()`."""


class BrokerNotAvailableError(KafkaError):
    """The broker a request names is not registered (removing or describing a broker id
    that left the cluster, or never joined it)."""

    code, name = 8, "BROKER_NOT_AVAILABLE"
