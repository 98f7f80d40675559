"""Admin: topics, topic configs, records (delete_records), partition reassignments, consumer groups, ACLs and SCRAM
credentials of a rayk cluster (kafka-python's KafkaAdminClient, over the Controller's and the group
coordinators' actor handles). The group calls are GroupAdmin's (group_admin.py), which the
Admin owns with its links to the groups' coordinators.

Every call goes through `rayk.client.calls.ApiCalls`, bounded by `default_api_timeout_ms`
(Kafka's default.api.timeout.ms, 60 s): a Controller (or coordinator) that Ray is
restarting is waited for and the call retried, after `retry_backoff_ms`, within that
time, then KafkaTimeoutError. Only rayk's errors (rayk.errors) are raised, never Ray's;
an error the Controller answers with (UNKNOWN_TOPIC_OR_PARTITION, ...) is raised at once.

As with Kafka's Admin, a call retried after a lost answer may find its work done. Where
that would give the wrong answer, it is corrected: a retried create_topic finds the topic
its lost attempt created and returns it (see there), a retried delete_topics finds the
topic gone, a retried create_partitions finds the count it asked for. Elsewhere the
retry answers for what it found: a repeated reassignment target changes nothing, a
repeated cancel answers NO_REASSIGNMENT_IN_PROGRESS, a repeated delete_acls lists only
what it matched itself, a repeated SCRAM deletion answers RESOURCE_NOT_FOUND, a repeated
election ELECTION_NOT_NEEDED.
"""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from rayk.acls import AclBinding, AclFilter
from rayk.client import calls
from rayk.client.deprecation import deprecated
from rayk.client.descriptions import (
    ConsumerGroupDescription,
    GroupListing,
    LogDirDescription,
    PartitionDescription,
    partition_descriptions,
)
from rayk.client.group_admin import GroupAdmin
from rayk.client.types import PartitionReassignment, TopicPartition, topic_partition_of
from rayk.errors import (
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidTopicError,
    KafkaError,
    KafkaStorageError,
    LeaderNotAvailableError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from rayk.internal_topics import is_internal
from rayk.quotas import QuotaEntity, QuotaFilterComponent
from rayk.scram import DEFAULT_ITERATIONS, ScramCredential, credential_from_password

DEFAULT_API_TIMEOUT_MS = calls.DEFAULT_API_TIMEOUT_MS  # Kafka's default.api.timeout.ms
# Of a creation's time, what is kept for its replicas to start and its answer to come back
# after a wait for brokers from Ray's autoscaler (rayk/controller/autoscaling.py).
SCALE_OUT_ANSWER_MARGIN_MS = 10_000


def _scale_out_timeout_ms(deadline_s: float) -> int:
    """How long the Controller may wait for brokers (with Ray's autoscaler) so that its
    answer, POLICY_VIOLATION naming what was missing, comes before this call's deadline."""
    return max(int((deadline_s - time.monotonic()) * 1000) - SCALE_OUT_ANSWER_MARGIN_MS, 0)


class NewTopic(NamedTuple):
    """-1 (or None) takes the brokers' `num.partitions` / `default.replication.factor`."""

    name: str
    num_partitions: int | None = -1
    replication_factor: int | None = -1
    topic_configs: dict[str, Any] | None = None


class ScramUpsertion(NamedTuple):
    """Set `user`'s credential for `mechanism` (SCRAM-SHA-256 or SCRAM-SHA-512) to one made
    from `password`; the password itself goes nowhere (only the salted keys do)."""

    user: str
    mechanism: str
    password: str
    iterations: int = DEFAULT_ITERATIONS

    def __repr__(self) -> str:  # never the password: tracebacks and logs show reprs
        return f"ScramUpsertion(user={self.user!r}, mechanism={self.mechanism!r}, password=***, iterations={self.iterations})"


class ScramDeletion(NamedTuple):
    """Delete `user`'s credential for `mechanism` (SCRAM-SHA-256 or SCRAM-SHA-512), an
    alteration for `alter_user_scram_credentials`."""

    user: str
    mechanism: str



class Admin:
    """kafka-python's KafkaAdminClient over a Cluster handle; make one with
    `cluster.admin(**settings)`. Calls may run concurrently. Settings, by kafka-python's
    names:

    - `default_api_timeout_ms` (60,000 ms, the Cluster's unless given): bounds each call,
      retries included; then KafkaTimeoutError.
    - `retry_backoff_ms` (100 ms): the pause before a retry.

    Errors are rayk's typed KafkaError subclasses (rayk.errors): every call raises
    KafkaTimeoutError past `default_api_timeout_ms`, and the others a method raises are
    named in its docstring; calls that act on many resources (create_acls, delete_consumer_groups,
    alter_partition_reassignments, ...) answer per resource None or the error that
    refused it, and raise only what stopped the whole call."""

    def __init__(
        self,
        cluster: Any,
        *,
        default_api_timeout_ms: int = DEFAULT_API_TIMEOUT_MS,
        retry_backoff_ms: int = calls.RETRY_BACKOFF_MS,
    ) -> None:
        self._controller = cluster.controller
        self._calls = calls.ApiCalls(default_api_timeout_ms, retry_backoff_ms)
        self._groups = GroupAdmin(self._controller, self._calls)  # consumer and share groups, at their coordinators

    # ------------------------------------------------------------------ ACLs

    def create_acls(self, bindings: Iterable[AclBinding]) -> list[KafkaError | None]:
        """Kafka's CreateAcls (rayk.acls.AclBinding): per binding None, or why it was refused.
        Every listener takes them as the Controller commits them (authorizer.class.name
        must be set for listeners to check them)."""
        bindings = list(bindings)
        return self._calls(lambda: self._controller.create_acls.remote(bindings), "CreateAcls")

    def describe_acls(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        """The bindings `acl_filter` matches (default: all)."""
        acl_filter = acl_filter or AclFilter()
        return self._calls(lambda: self._controller.describe_acls.remote(acl_filter), "DescribeAcls")

    def delete_acls(self, filters: Iterable[AclFilter]) -> list[list[AclBinding]]:
        """Deletes every binding a filter matches; per filter the bindings it matched (a
        call retried after its answer was lost lists only what the retry matched)."""
        filters = list(filters)
        return self._calls(lambda: self._controller.delete_acls.remote(filters), "DeleteAcls")

    # ------------------------------------------------------------------ SCRAM credentials

    def alter_user_scram_credentials(self, alterations: Iterable[ScramUpsertion | ScramDeletion]) -> dict[str, KafkaError | None]:
        """Kafka's AlterUserScramCredentials: per user None, or the error that refused all of
        its changes (UNSUPPORTED_SASL_MECHANISM, UNACCEPTABLE_CREDENTIAL, RESOURCE_NOT_FOUND
        for deleting a credential the user lacks, DUPLICATE_RESOURCE). Credentials are kept
        in the Controller's metadata log, so they survive restarts."""
        deletions, upsertions = [], []
        for alteration in alterations:
            if isinstance(alteration, ScramDeletion):
                deletions.append((alteration.user, alteration.mechanism))
                continue
            try:
                made: ScramCredential | KafkaError = credential_from_password(
                    alteration.mechanism, alteration.password, alteration.iterations)
            except KafkaError as e:
                made = e
            upsertions.append((alteration.user, made))
        return self._calls(
            lambda: self._controller.alter_user_scram_credentials.remote(deletions, upsertions),
            "AlterUserScramCredentials",
        )

    def describe_user_scram_credentials(self, users: list[str] | None = None) -> dict[str, list[tuple[str, int]]]:
        """Per user (every user with a credential, or those named) its (mechanism,
        iterations); RESOURCE_NOT_FOUND if a named user has none."""
        described = self._calls(
            lambda: self._controller.describe_user_scram_credentials.remote(users), "DescribeUserScramCredentials"
        )
        for result in described.values():
            if isinstance(result, KafkaError):
                raise result
        return described

    # ------------------------------------------------------------------ client quotas

    def alter_client_quotas(
        self, alterations: Mapping[QuotaEntity, Mapping[str, float | None]], validate_only: bool = False
    ) -> dict[QuotaEntity, KafkaError | None]:
        """Kafka's AlterClientQuotas: per entity (rayk.quotas.QuotaEntity: a user, a client
        id or both, either of them DEFAULT) the quota keys to set (`producer_byte_rate`,
        `consumer_byte_rate` in bytes/s, `request_percentage`) or, with None, remove. Per
        entity None, or the INVALID_REQUEST that refused all of its changes. Listeners
        enforce them as the Controller commits them; they are kept in its metadata log."""
        entities = list(alterations)
        changes = [(e, list(alterations[e].items())) for e in entities]
        results = self._calls(
            lambda: self._controller.alter_client_quotas.remote(changes, validate_only), "AlterClientQuotas"
        )
        return dict(zip(entities, results))

    def describe_client_quotas(
        self, components: Sequence[QuotaFilterComponent] = (), strict: bool = False
    ) -> dict[QuotaEntity, dict[str, float]]:
        """The quotas of every entity the filter matches (no components: all of them); with
        `strict`, only entities with no entity type besides those the components name."""
        components = list(components)
        return dict(self._calls(
            lambda: self._controller.describe_client_quotas.remote(components, strict), "DescribeClientQuotas"
        ))  # fmt: skip

    # ------------------------------------------------------------------ topics

    def create_topic(
        self,
        name: str,
        num_partitions: int | None = None,
        replication_factor: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> list[PartitionDescription]:
        """Creates a topic and returns its description once every partition has its
        leader and followers. Counts left out take the brokers' `num.partitions` /
        `default.replication.factor`. TOPIC_ALREADY_EXISTS if it exists, except when this
        call's earlier attempt went unanswered (the Controller restarting) and so may have
        created it: a topic of the partition count and replication factor asked for is
        then taken as that attempt's and returned (a concurrent create of the same topic
        with the same counts cannot be told from it), as a retried CreateTopics should
        answer what the first attempt did. On a cluster that follows Ray's autoscaler, a
        topic that does not fit waits for new brokers within this call's timeout
        (default_api_timeout_ms), then POLICY_VIOLATION naming what was missing."""
        deadline_s, unanswered = self._calls.deadline_s(), list[KafkaError]()
        try:
            return partition_descriptions(self._calls(
                lambda: self._controller.create_topic.remote(name, num_partitions, replication_factor, config, False, None,
                                                             _scale_out_timeout_ms(deadline_s)),
                f"CreateTopics {name!r}",
                deadline_s=deadline_s,
                on_retriable=unanswered.append,
            ))  # fmt: skip
        except TopicAlreadyExistsError:
            if not unanswered:
                raise
            described = self._describe_topic(name, deadline_s)
            if num_partitions not in (None, -1) and len(described) != num_partitions:
                raise
            if replication_factor not in (None, -1) and any(len(p["replicas"]) != replication_factor for p in described):
                raise
            return described

    def create_topics(self, new_topics: list[NewTopic]) -> None:
        """`create_topic` of each, in order; the first error stops it (those before stay)."""
        for topic in new_topics:
            self.create_topic(topic.name, topic.num_partitions, topic.replication_factor, topic.topic_configs)

    def create_partitions(self, new_counts: dict[str, int], validate_only: bool = False) -> dict[str, list[PartitionDescription]]:
        """Grows each topic to its new partition count (Kafka's CreatePartitions; partitions
        are only ever added); returns each topic's description. Keyed records of producers
        that learn the new count (metadata.max.age.ms) go to murmur2(key) % new count.
        A call retried after a lost answer that finds the topic at its new count already
        (INVALID_PARTITIONS) returns the description."""
        return {name: self._create_partitions(name, count, validate_only) for name, count in new_counts.items()}

    def _create_partitions(self, name: str, count: int, validate_only: bool) -> list[PartitionDescription]:
        deadline_s, unanswered = self._calls.deadline_s(), list[KafkaError]()
        try:
            return partition_descriptions(self._calls(
                lambda: self._controller.create_partitions.remote(name, count, validate_only,
                                                                  _scale_out_timeout_ms(deadline_s)),
                f"CreatePartitions {name!r}",
                deadline_s=deadline_s,
                on_retriable=unanswered.append,
            ))  # fmt: skip
        except InvalidPartitionsError:
            if not unanswered or validate_only:
                raise
            described = self._describe_topic(name, deadline_s)
            if len(described) != count:
                raise
            return described

    def delete_topics(self, names: list[str]) -> None:
        """Deletes each topic; UNKNOWN_TOPIC_OR_PARTITION for one that does not exist
        (not for one that this call's own unanswered attempt deleted)."""
        for name in names:
            self._delete_topic(name)

    def _delete_topic(self, name: str) -> None:
        unanswered: list[KafkaError] = []
        try:
            self._calls(
                lambda: self._controller.delete_topic.remote(name), f"DeleteTopics {name!r}", on_retriable=unanswered.append
            )
        except UnknownTopicOrPartitionError:
            if not unanswered:  # else the attempt whose answer was lost deleted it
                raise

    def list_topics(self, include_internal: bool = False) -> list[str]:
        """The topics' names; internal ones (`__consumer_offsets`) only with
        `include_internal` (Kafka's listTopics)."""
        names = self._calls(lambda: self._controller.list_topics.remote(), "ListTopics")
        return [n for n in names if include_internal or not is_internal(n)]

    def describe_topics(self, names: list[str] | None = None) -> dict[str, list[PartitionDescription]]:
        """Per topic its partitions (see Cluster.describe_topic); UNKNOWN_TOPIC_OR_PARTITION
        if one does not exist."""
        names = list(names) if names is not None else self.list_topics()
        described = self._calls.retry(
            lambda deadline_s: calls.get_all(
                [self._controller.describe_topic.remote(n) for n in names], deadline_s, "DescribeTopics"
            ),
            "DescribeTopics",
        )
        return {name: partition_descriptions(partitions) for name, partitions in zip(names, described)}

    def _describe_topic(self, name: str, deadline_s: float) -> list[PartitionDescription]:
        return partition_descriptions(self._calls(
            lambda: self._controller.describe_topic.remote(name), f"DescribeTopics {name!r}", deadline_s=deadline_s
        ))  # fmt: skip

    def describe_topic_configs(self, name: str) -> dict[str, str]:
        """The topic's own configs (Kafka names); everything else has the broker default.
        UnknownTopicOrPartitionError if there is no such topic."""
        return self._calls(lambda: self._controller.topic_configs.remote(name), f"DescribeConfigs {name!r}")

    def alter_topic_configs(self, name: str, configs: dict[str, Any]) -> dict[str, str]:
        """Sets configs on top of the topic's current ones; returns the result.
        UnknownTopicOrPartitionError, or InvalidConfigurationError (nothing changed) for
        a name or value Kafka would refuse."""
        merged = {**self.describe_topic_configs(name), **configs}
        return self._calls(lambda: self._controller.alter_topic_configs.remote(name, merged), f"AlterConfigs {name!r}")

    # ------------------------------------------------------------------ records

    def delete_records(self, records_to_delete: Mapping[Any, int]) -> dict[TopicPartition, int]:
        """Kafka's deleteRecords: per (topic, partition), its leader's log start offset moves
        up to the offset given (-1: the high watermark), and the new low watermark is
        returned. Records below it are no longer read (consumers fetching there get
        OFFSET_OUT_OF_RANGE), retention deletes them, and the followers follow. Every
        partition is tried; then the first one's error is raised, if any:
        OffsetOutOfRangeError above the high watermark, PolicyViolationError for a topic
        without cleanup.policy delete, InvalidTopicError for an internal topic,
        UnknownTopicOrPartitionError. A moved leader is looked up again."""
        wanted = {topic_partition_of(key): _deletion_offset(key, offset) for key, offset in records_to_delete.items()}
        deadline_s = self._calls.deadline_s()
        out: dict[TopicPartition, int] = {}
        first_error: KafkaError | None = None
        for tp, offset in wanted.items():
            what = f"DeleteRecords {tp.topic}-{tp.partition}"
            try:
                if tp.topic.startswith("__"):
                    raise InvalidTopicError(f"Cannot delete records of internal topic {tp.topic}")
                out[tp] = calls.retry(
                    functools.partial(self._delete_records, tp, offset, deadline_s, what), deadline_s, what,
                    retry_backoff_ms=self._calls.retry_backoff_ms, retry_if=_leader_moved,
                )  # fmt: skip
            except KafkaError as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return out

    def _delete_records(self, tp: TopicPartition, offset: int, deadline_s: float, what: str) -> int:
        leader = calls.get(self._controller.leader.remote(tp.topic, tp.partition), deadline_s, what)
        return calls.get(leader.delete_records.remote(offset), deadline_s, what)

    # ------------------------------------------------------------------ leader elections (KIP-460)

    def elect_leaders(
        self, partitions: Sequence[Any] | None = None, election_type: str = "preferred"
    ) -> dict[TopicPartition, KafkaError | None]:
        """Elects the preferred leader ("preferred": the first replica, which placement
        spreads over the brokers) or, for a leaderless partition, any live replica
        ("unclean", losing what it lacks) of each partition, or of every partition when
        None (then partitions already led by their preferred replica are left out).
        Per partition None (elected) or its typed error: ElectionNotNeededError,
        PreferredLeaderNotAvailableError, EligibleLeadersNotAvailableError,
        UnknownTopicOrPartitionError (a call retried after its answer was lost may answer
        ElectionNotNeededError for a partition its lost attempt elected)."""
        if election_type not in ("preferred", "unclean"):
            raise ValueError(f"election_type must be 'preferred' or 'unclean', got {election_type!r}")
        wanted = None if partitions is None else [tuple(topic_partition_of(p)) for p in partitions]
        unclean = election_type == "unclean"
        results = self._calls(lambda: self._controller.elect_leaders.remote(wanted, unclean), "ElectLeaders")
        return {TopicPartition(t, p): e for (t, p), e in results.items()}

    # ------------------------------------------------------------------ partition reassignments (KIP-455)

    def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition | tuple[str, int], Sequence[int] | None],
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, KafkaError | None]:
        """Moves each partition to its target replicas (broker ids, the first the preferred
        leader), or cancels its reassignment under way (None), as Kafka's
        Admin.alterPartitionReassignments. The new replicas are added, catch up and join
        the ISR; only then are the others removed and their data deleted. Returns once the
        Controller has committed each change; `list_partition_reassignments` shows progress.

        Per partition, the answer (not raised, as each of Kafka's per-partition futures
        fails on its own): None when its reassignment started, replaced the one under way,
        completed at once or was cancelled, else the typed error that refused it:
        InvalidReplicaAssignmentError (INVALID_REPLICA_ASSIGNMENT) for an empty target, a
        broker named twice, not registered or not an integer, or a cancel that would keep
        only replicas not yet caught up; NoReassignmentInProgressError
        (NO_REASSIGNMENT_IN_PROGRESS) for a cancel with none; UnknownTopicOrPartitionError.
        Raised: InvalidTopicError for a key that is not a (topic, partition) pair (nothing
        is sent), KafkaTimeoutError when the Controller cannot be reached within `timeout_ms`
        (None: default_api_timeout_ms).
        """
        refused: dict[TopicPartition, KafkaError | None] = {}
        targets: dict[tuple[str, int], list[int] | None] = {}
        for key, replicas in reassignments.items():
            tp = topic_partition_of(key)
            try:
                targets[(tp.topic, tp.partition)] = None if replicas is None else _broker_ids(tp, replicas)
            except InvalidReplicaAssignmentError as e:
                refused[tp] = e
        answers: dict = {}
        if targets:
            answers = self._calls(
                lambda: self._controller.alter_partition_reassignments.remote(targets),
                f"AlterPartitionReassignments of {len(targets)} partitions",
                timeout_ms=timeout_ms,
            )
        results = {TopicPartition(*tp): error for tp, error in answers.items()}
        results.update(refused)
        return results

    def list_partition_reassignments(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments under way (Kafka's Admin.listPartitionReassignments): of every
        partition (None), or of those among `partitions` that have one; partitions and
        topics that do not exist are left out. KafkaTimeoutError when the Controller cannot
        be reached within `timeout_ms` (None: default_api_timeout_ms)."""
        wanted = None if partitions is None else [tuple(topic_partition_of(key)) for key in partitions]
        ongoing = self._calls(
            lambda: self._controller.list_partition_reassignments.remote(wanted),
            "ListPartitionReassignments",
            timeout_ms=timeout_ms,
        )
        return {
            TopicPartition(*tp): PartitionReassignment(r["replicas"], r["adding"], r["removing"])
            for tp, r in sorted(ongoing.items())
        }

    # ------------------------------------------------------------------ log directories

    def describe_log_dirs(
        self, broker_ids: Iterable[int] | None = None, timeout_ms: int | None = None
    ) -> dict[int, LogDirDescription]:
        """Each broker's data directory (Kafka's Admin.describeLogDirs; a rayk broker has
        one): of every registered broker (None) or of `broker_ids`; a broker that is not
        registered with the Controller now (restarting, or unknown) is left out. An offline
        directory has `error` KafkaStorageError. KafkaTimeoutError when the Controller
        cannot be reached within `timeout_ms` (None: default_api_timeout_ms)."""
        wanted = (sorted(b["broker_id"] for b in self._calls(lambda: self._controller.brokers.remote(), "DescribeCluster",
                                                             timeout_ms=timeout_ms))
                  if broker_ids is None else sorted(set(broker_ids)))  # fmt: skip
        out: dict[int, LogDirDescription] = {}
        for broker_id in wanted:
            described = self._calls(
                functools.partial(self._controller.broker_log_dirs.remote, broker_id), "DescribeLogDirs", timeout_ms=timeout_ms
            )
            if described is not None:
                error = None if described["error"] is None else KafkaStorageError(described["error"])
                sizes = {TopicPartition(*tp): size for tp, size in sorted(described["partitions"].items())}
                out[broker_id] = LogDirDescription(described["path"], error, described["total_bytes"],
                                                   described["usable_bytes"], sizes)  # fmt: skip
        return out

    # ------------------------------------------------------------------ consumer groups (GroupAdmin)

    def list_consumer_groups(self) -> list[GroupListing]:
        """Every group (GroupListing: group_id, state, protocol_type, group_type), from every
        coordinator (all asked again if one does not answer, as it may have moved)."""
        return self._groups.list_consumer_groups()

    def delete_consumer_groups(self, group_ids: Iterable[str]) -> dict[str, KafkaError | None]:
        """Kafka's DeleteGroups: deletes each group and its committed offsets (tombstones in
        __consumer_offsets). Per group None, or NON_EMPTY_GROUP while it has members,
        GROUP_ID_NOT_FOUND if there is no such group."""
        return self._groups.delete_consumer_groups(group_ids)

    def delete_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, KafkaError | None]:
        """Kafka's deleteConsumerGroupOffsets (OffsetDelete, KIP-496): deletes the group's
        committed offsets of `partitions` (tombstones in __consumer_offsets). Per partition
        None (deleted, or it had none), GroupSubscribedToTopicError for a topic the group's
        members consume, UnknownTopicOrPartitionError for one that does not exist. Raised:
        GroupIdNotFoundError for a group with neither members nor offsets,
        NonEmptyGroupError for a group with members that is not a consumer group."""
        return self._groups.delete_consumer_group_offsets(group_id, partitions)

    def describe_consumer_groups(self, group_ids: Iterable[str]) -> dict[str, ConsumerGroupDescription]:
        """Per group (kafka-python's describe_consumer_groups) its state, members with
        their assignments, and per partition the committed offset, the end offset (high
        watermark) and the lag between them (ConsumerGroupDescription). A partition whose
        leader cannot say its end offset (none, or it does not answer in time) shows None.
        GroupIdNotFoundError for a group with neither members nor committed offsets."""
        return self._groups.describe_consumer_groups(group_ids)

    def describe_consumer_group(self, group_id: str) -> ConsumerGroupDescription:
        """Deprecated: `describe_consumer_groups([group_id])[group_id]`."""
        deprecated("describe_consumer_group(group_id)", "describe_consumer_groups([group_id])[group_id]")
        return self.describe_consumer_groups([group_id])[group_id]

    # ------------------------------------------------------------------ share groups (KIP-932, GroupAdmin)

    def describe_share_groups(self, group_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Per share group: its state ("Empty", "Stable"), group epoch, configs, and
        members with their subscriptions and assignments. GroupIdNotFoundError for one
        that is not a share group."""
        return self._groups.describe_share_groups(group_ids)

    def list_share_group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        """Kafka's listShareGroupOffsets: each share-partition's start offset (SPSO), before
        which every record is done with (accepted, rejected or archived)."""
        return self._groups.list_share_group_offsets(group_id)

    def alter_share_group_offsets(self, group_id: str, start_offsets: Mapping[tuple[str, int], int]) -> None:
        """Kafka's alterShareGroupOffsets: each share-partition starts at its offset, with
        nothing in flight (records before it are never delivered, those from it on are
        delivered again). The group must be empty (NonEmptyGroupError) and exist
        (GroupIdNotFoundError). Nothing changes if a partition does not exist
        (UnknownTopicOrPartitionError) or an offset is not an integer >= 0
        (InvalidRequestError)."""
        self._groups.alter_share_group_offsets(group_id, start_offsets)

    def delete_share_group_offsets(self, group_id: str, topics: Iterable[str]) -> None:
        """Kafka's deleteShareGroupOffsets: the group forgets where it is in these topics,
        and starts them again where its share.auto.offset.reset says. The group must be
        empty and exist; nothing changes if a topic does not exist
        (UnknownTopicOrPartitionError)."""
        self._groups.delete_share_group_offsets(group_id, topics)

    def alter_share_group_config(self, group_id: str, configs: Mapping[str, str]) -> None:
        """Sets share group configs (`share.auto.offset.reset`: "latest", the default, or
        "earliest": where a partition's consumption starts, fixed when the group first
        fetches it); makes the group, without members, if there is none."""
        self._groups.alter_share_group_config(group_id, configs)


def _deletion_offset(key: Any, offset: Any) -> int:
    """A DeleteRecords offset: an integer >= -1 (-1: the high watermark)."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < -1:
        raise OffsetOutOfRangeError(f"{key!r}: the offset to delete records below must be an integer >= -1, got {offset!r}")
    return offset


def _leader_moved(error: KafkaError) -> bool:
    """Worth asking the partition's leader again: unanswered, or it no longer leads."""
    return calls.unanswered(error) or isinstance(error, (NotLeaderOrFollowerError, LeaderNotAvailableError))


def _broker_ids(tp: TopicPartition, replicas: Sequence[int]) -> list[int]:
    """The target replicas as a list of ints; INVALID_REPLICA_ASSIGNMENT if they are not integers."""
    try:
        if isinstance(replicas, (str, bytes)) or any(isinstance(b, bool) for b in replicas):
            raise TypeError
        return [operator.index(b) for b in replicas]
    except TypeError:
        raise InvalidReplicaAssignmentError(
            f"{tp.topic}-{tp.partition}: replicas must be a list of integer broker ids, got {replicas!r}"
        ) from None
