"""ClusterMetadata: the Controller's state and every decision it takes (pure logic).

This is KRaft's metadata image plus the parts of its ReplicationControlManager that
decide: broker registration and fencing, topic creation with replica assignment, leader
election, ISR changes (AlterPartition), reassignments. Nothing here does I/O or knows
Ray; the Controller actor persists records and pushes the results. The per-partition
rules (who leads, who stays in sync, KIP-966's recovering replicas, KIP-455's
reassignments) are in `elections.py`.

Every change is a *record* (`rayk/metadata/records.py`: one typed, versioned kind per
change) and the state changes only by `apply(record, offset)`, which hands each kind to
its handler. A decision is made in two steps, as in KRaft: `plan_*` reads the state and
returns the records that would make the change (raising a typed error if the request is
invalid), the Controller writes them to its metadata log, then applies them. Replaying
the log through `apply` rebuilds exactly the same state after a restart; so does
restoring a snapshot (`image_records`, then the records after it).
`attached` is the one piece of session state: the brokers registered with this
Controller session; the Controller maintains it and it is never replayed.

A broker's epoch is the offset of its registration record, so a newer registration always
has a larger epoch. `acl_version` and `quota_version` are the offsets of the last ACL and
quota changes, which brokers poll to know whether theirs are current.

Partition invariants are asserted by `apply` (`PartitionState.check`): the ISR is a subset
of the replicas, empty only while leaderless; the leader is in the ISR or is NO_LEADER;
the leader epoch grows whenever the leader changes, and the partition epoch grows with
every change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayk.actors import elections
from rayk.actors.elections import NO_LEADER, LogEnd, PartitionState
from rayk.config import BrokerConfig, unclean_election_enabled
from rayk.errors import (
    DuplicateResourceError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    InvalidUpdateVersionError,
    KafkaError,
    NoReassignmentInProgressError,
    NotLeaderOrFollowerError,
    ResourceNotFoundError,
    StaleBrokerEpochError,
    TopicAlreadyExistsError,
    UnacceptableCredentialError,
    UnknownTopicOrPartitionError,
)
from rayk.acls import AclBinding, AclFilter
from rayk.quotas import QuotaEntity, check_quota_key, check_quota_value
from rayk.scram import ScramCredential
from rayk.storage.log_manager import is_legal_topic_name
from rayk.metadata.records import (
    RECORD_KINDS,
    AclRecord,
    ClientQuotaRecord,
    ClusterIdRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveAclRecord,
    RemoveScramCredentialRecord,
    RemoveTopicRecord,
    ScramCredentialRecord,
    TopicConfigsRecord,
    TopicRecord,
)
from rayk.metadata.snapshot import MetadataSnapshot

__all__ = ["NO_LEADER", "BrokerRegistration", "ClusterMetadata", "LogEnd", "PartitionState", "Record", "assign_replicas"]

Record = MetadataRecord


@dataclass(slots=True)
class BrokerRegistration:
    broker_id: int
    epoch: int  # offset of the registration record
    node_id: str  # Ray node id (hex) the broker last ran on
    incarnation_id: str = ""  # the broker process that registered ("" in older records)
    directory_id: str = ""  # its data directory's meta.properties directory.id
    fenced: bool = False


@dataclass(slots=True)
class TopicMetadata:
    name: str
    topic_id: str
    configs: dict[str, str]
    partitions: dict[int, PartitionState] = field(default_factory=dict)


def assign_replicas(
    num_partitions: int, replication_factor: int, broker_nodes: Mapping[int, str], start_index: int
) -> list[tuple[int, ...]]:
    """Round-robin assignment that puts a partition's replicas on distinct nodes first.

    Brokers are ordered by interleaving the nodes (first broker of each node, then the
    second of each, ...), so any `replication_factor` consecutive brokers in that cyclic
    order sit on distinct nodes whenever the nodes hold equal numbers of brokers.
    Partition p gets the brokers at positions start_index + p, + 1, ...; its first
    replica is its preferred leader, so leaders spread too.
    """
    by_node: dict[str, list[int]] = {}
    for broker_id in sorted(broker_nodes):
        by_node.setdefault(broker_nodes[broker_id], []).append(broker_id)
    columns = [by_node[node] for node in sorted(by_node)]
    ordered = [col[i] for i in range(max(map(len, columns), default=0)) for col in columns if i < len(col)]
    n = len(ordered)
    if not 1 <= replication_factor <= n:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} needs that many live brokers; {n} are live"
        )
    return [tuple(ordered[(start_index + p + j) % n] for j in range(replication_factor)) for p in range(num_partitions)]


class ClusterMetadata:
    def __init__(self, broker_config: BrokerConfig | None = None) -> None:
        self.broker_config = broker_config or BrokerConfig()
        self.cluster_id: str | None = None
        self.brokers: dict[int, BrokerRegistration] = {}
        self.topics: dict[str, TopicMetadata] = {}
        self.next_producer_id = 0
        self.scram_credentials: dict[str, dict[str, ScramCredential]] = {}  # user -> mechanism -> credential
        self.acls: dict[AclBinding, None] = {}  # in the order they were created
        self.acl_version = -1  # offset of the last ACL change
        self.client_quotas: dict[QuotaEntity, dict[str, float]] = {}  # entity -> key -> value
        self.quota_version = -1  # offset of the last client quota change
        self.last_offset = -1
        self.attached: set[int] = set()  # session state, kept by the Controller; never replayed
        self._handlers: dict[type[MetadataRecord], Callable[[Any, int], None]] = {
            ClusterIdRecord: self._apply_cluster_id,
            RegisterBrokerRecord: self._apply_register_broker,
            FenceBrokerRecord: self._apply_fence_broker,
            TopicRecord: self._apply_topic,
            TopicConfigsRecord: self._apply_topic_configs,
            RemoveTopicRecord: self._apply_remove_topic,
            PartitionRecord: self._apply_partition,
            ProducerIdsRecord: self._apply_producer_ids,
            AclRecord: self._apply_acl,
            RemoveAclRecord: self._apply_remove_acl,
            ScramCredentialRecord: self._apply_scram_credential,
            RemoveScramCredentialRecord: self._apply_remove_scram_credential,
            ClientQuotaRecord: self._apply_client_quota,
        }
        assert set(self._handlers) == set(RECORD_KINDS.values()), "every record kind has its handler"

    # ------------------------------------------------------------------ applying records

    def apply(self, record: MetadataRecord, offset: int) -> None:
        """Applies one record at its offset in the metadata log."""
        assert offset > self.last_offset, f"metadata offsets only grow: {offset} after {self.last_offset}"
        handler = self._handlers.get(type(record))
        if handler is None:
            raise TypeError(f"not a metadata record: {record!r:.200}")
        self.last_offset = offset
        handler(record, offset)

    def _apply_cluster_id(self, record: ClusterIdRecord, offset: int) -> None:
        self.cluster_id = record.cluster_id

    def _apply_register_broker(self, record: RegisterBrokerRecord, offset: int) -> None:
        epoch = offset if record.epoch < 0 else record.epoch
        self.brokers[record.broker_id] = BrokerRegistration(
            record.broker_id, epoch, record.node_id, record.incarnation_id, record.directory_id
        )

    def _apply_fence_broker(self, record: FenceBrokerRecord, offset: int) -> None:
        self.brokers[record.broker_id].fenced = record.fenced

    def _apply_topic(self, record: TopicRecord, offset: int) -> None:
        self.topics[record.name] = TopicMetadata(record.name, record.topic_id, dict(record.configs))

    def _apply_topic_configs(self, record: TopicConfigsRecord, offset: int) -> None:
        self.topics[record.name].configs = dict(record.configs)

    def _apply_remove_topic(self, record: RemoveTopicRecord, offset: int) -> None:
        del self.topics[record.name]

    def _apply_partition(self, record: PartitionRecord, offset: int) -> None:
        state = record.state
        state.check()
        partitions = self.topics[record.topic].partitions
        old = partitions.get(record.partition)
        if old is not None:
            assert state.partition_epoch > old.partition_epoch, "partition epochs only grow"
            assert state.leader_epoch >= old.leader_epoch, "leader epochs only grow"
            assert state.leader == old.leader or state.leader_epoch > old.leader_epoch, "a new leader has a new epoch"
        partitions[record.partition] = state

    def _apply_producer_ids(self, record: ProducerIdsRecord, offset: int) -> None:
        assert record.next > self.next_producer_id, "producer id blocks only move forward"
        self.next_producer_id = record.next

    def _apply_acl(self, record: AclRecord, offset: int) -> None:
        self.acls[record.binding] = None
        self.acl_version = offset

    def _apply_remove_acl(self, record: RemoveAclRecord, offset: int) -> None:
        del self.acls[record.binding]
        self.acl_version = offset

    def _apply_scram_credential(self, record: ScramCredentialRecord, offset: int) -> None:
        self.scram_credentials.setdefault(record.user, {})[record.mechanism] = record.credential

    def _apply_remove_scram_credential(self, record: RemoveScramCredentialRecord, offset: int) -> None:
        held = self.scram_credentials[record.user]
        del held[record.mechanism]
        if not held:
            del self.scram_credentials[record.user]

    def _apply_client_quota(self, record: ClientQuotaRecord, offset: int) -> None:
        entity = record.quota_entity
        values = self.client_quotas.setdefault(entity, {})
        if record.value is None:
            values.pop(record.key, None)
        else:
            values[record.key] = record.value
        if not values:
            del self.client_quotas[entity]
        self.quota_version = offset

    # ------------------------------------------------------------------ snapshots

    def image_records(self) -> list[MetadataRecord]:
        """Records that rebuild this state when applied to an empty one (`restore`): each
        broker's registration with its epoch, then its fencing; topics with their
        partitions; the producer id block; ACLs in the order they were created; SCRAM
        credentials; client quotas."""
        records: list[MetadataRecord] = [] if self.cluster_id is None else [ClusterIdRecord(self.cluster_id)]
        for broker_id, reg in self.brokers.items():
            records.append(RegisterBrokerRecord(broker_id, reg.node_id, reg.incarnation_id, reg.directory_id,
                                                epoch=reg.epoch))
            if reg.fenced:
                records.append(FenceBrokerRecord(broker_id, fenced=True))
        for name, topic in self.topics.items():
            records.append(TopicRecord(name, topic.topic_id, dict(topic.configs)))
            records += [PartitionRecord.of(name, p, state) for p, state in topic.partitions.items()]
        if self.next_producer_id:
            records.append(ProducerIdsRecord(self.next_producer_id))
        records += [AclRecord.of(binding) for binding in self.acls]
        for user, held in self.scram_credentials.items():
            records += [ScramCredentialRecord.of(user, credential) for credential in held.values()]
        for entity, values in self.client_quotas.items():
            records += [ClientQuotaRecord.of(entity, key, value) for key, value in values.items()]
        return records

    def snapshot(self, epoch: int = 0) -> MetadataSnapshot:
        """The whole state as of its last applied offset."""
        return MetadataSnapshot(self.last_offset + 1, epoch, self.acl_version, self.quota_version,
                                tuple(self.image_records()))

    def restore(self, snapshot: MetadataSnapshot) -> None:
        """Makes this (empty) state the snapshot's; the records after it are applied next."""
        assert self.last_offset == -1 and not self.brokers and not self.topics, "a snapshot is restored into an empty state"
        offset = snapshot.end_offset - 1
        for record in snapshot.records:
            self._handlers[type(record)](record, offset)
        self.last_offset = offset
        self.acl_version, self.quota_version = snapshot.acl_version, snapshot.quota_version

    # ------------------------------------------------------------------ reading

    @property
    def live_brokers(self) -> set[int]:
        return {b for b, reg in self.brokers.items() if not reg.fenced}

    def partition(self, topic: str, partition: int) -> PartitionState:
        meta = self.topics.get(topic)
        if meta is None or partition not in meta.partitions:
            raise UnknownTopicOrPartitionError(f"{topic}-{partition} does not exist")
        return meta.partitions[partition]

    def partitions_of_broker(self, broker_id: int) -> list[tuple[str, int, PartitionState]]:
        return [
            (name, p, state)
            for name, meta in self.topics.items()
            for p, state in meta.partitions.items()
            if broker_id in state.replicas
        ]

    def all_partitions(self) -> list[tuple[str, int, PartitionState]]:
        return [(name, p, state) for name, meta in self.topics.items() for p, state in meta.partitions.items()]

    def needs_log_comparison(self, topic: str, partition: int) -> bool:
        """Leaderless with every live in-sync copy back but recovering (see `elections`)."""
        return bool(self.copies_to_compare(topic, partition))

    def copies_to_compare(self, topic: str, partition: int) -> tuple[int, ...]:
        """The brokers whose logs decide a leaderless partition (rule 4 of `elections`)."""
        state = self.partition(topic, partition)
        return elections.copies_to_compare(state, self.live_brokers, self.attached)

    def _unclean(self, topic: str) -> bool:
        return unclean_election_enabled(self.topics[topic].configs, self.broker_config)

    # ------------------------------------------------------------------ planning changes

    def plan_register_broker(
        self,
        broker_id: int,
        node_id: str,
        incarnation_id: str = "",
        directory_id: str = "",
        clean_shutdown: bool = True,
    ) -> list[Record]:
        """A broker (re)joins. If it is a new incarnation (a restarted process), its replicas
        lost their in-memory state: where it led, leadership is decided again in a new epoch;
        after an unclean shutdown its ISR memberships become recovering (KIP-966), and with
        a data directory that is not the one registered before (formatted anew: its disk was
        replaced) it also leaves every ISR at once. Then every partition of the broker is
        reconciled: leaderless ones may get their leader back."""
        previous = self.brokers.get(broker_id)
        restarted = previous is not None and previous.incarnation_id != incarnation_id
        data_lost = (
            previous is not None and bool(previous.directory_id) and previous.directory_id != directory_id
        )
        records: list[Record] = [
            RegisterBrokerRecord(broker_id, node_id, incarnation_id, directory_id, clean_shutdown)
        ]
        live = self.live_brokers | {broker_id}
        attached = self.attached | {broker_id}
        for name, p, state in self.partitions_of_broker(broker_id):
            marked = state
            if restarted and (data_lost or not clean_shutdown):
                marked = elections.mark_recovering(state, broker_id, data_lost)
            new = elections.reconcile(
                marked, live, attached, self._unclean(name), restarted=[broker_id] if restarted else []
            )
            if new is None and marked != state:
                new = elections.successor(state, marked, new_leader_epoch=False)
            if new is not None:
                records.append(PartitionRecord.of(name, p, new))
        return records

    def plan_fence_broker(self, broker_id: int, broker_epoch: int | None = None) -> list[Record]:
        """A broker lost its session: out of every ISR it can leave, leaderships moved."""
        reg = self.brokers.get(broker_id)
        if reg is None or reg.fenced:
            return []
        if broker_epoch is not None and broker_epoch != reg.epoch:
            raise StaleBrokerEpochError(f"broker {broker_id} epoch {broker_epoch} is not current ({reg.epoch})")
        records: list[Record] = [FenceBrokerRecord(broker_id, fenced=True)]
        live, attached = self.live_brokers - {broker_id}, self.attached - {broker_id}
        for name, p, state in self.partitions_of_broker(broker_id):
            new = elections.reconcile(state, live, attached, self._unclean(name))
            if new is not None:
                records.append(PartitionRecord.of(name, p, new))
        return records

    def plan_replica_failed(self, topic: str, partition: int, broker_id: int) -> list[Record]:
        """The broker's replica process of this partition died; its log on disk is intact
        and it is being re-created. It leaves the ISR while another member is ready, and
        if it led, leadership moves (or, as the only copy, it leads again in a new epoch)."""
        state = self.partition(topic, partition)
        if broker_id not in state.replicas:
            raise NotLeaderOrFollowerError(f"broker {broker_id} holds no replica of {topic}-{partition}")
        new = elections.reconcile(
            state, self.live_brokers, self.attached, self._unclean(topic), unavailable=[broker_id]
        )
        return [] if new is None else [PartitionRecord.of(topic, partition, new)]

    def plan_reconcile(self, topic: str, partition: int) -> list[Record]:
        """The partition made consistent with who is live and attached now (elections'
        rules 1-3); [] if it already is. The Controller's maintenance runs it on every
        leaderless partition, so none waits for an event that may not come."""
        state = self.partition(topic, partition)
        new = elections.reconcile(state, self.live_brokers, self.attached, self._unclean(topic))
        return [] if new is None else [PartitionRecord.of(topic, partition, new)]

    def plan_unclean_recovery(self, topic: str, partition: int, ends: Mapping[int, LogEnd]) -> list[Record]:
        """Rule 4 of `elections`: elects the ISR member with the most complete log, once every
        live one of them is back and reported its log end (the missing ones fenced). []
        if the partition no longer needs it."""
        state = self.partition(topic, partition)
        copies = elections.copies_to_compare(state, self.live_brokers, self.attached)
        if not copies or not set(copies) <= set(ends):
            return []
        chosen = elections.choose_by_log(state, copies, dict(ends))
        return [PartitionRecord.of(topic, partition, elections.recover_uncleanly(state, chosen))]

    def plan_elect_leader(self, topic: str, partition: int, unclean: bool = False) -> list[Record]:
        """ElectLeaders for one partition: preferred (or, with `unclean`, an unclean
        election of a leaderless one); raises the election's KafkaError if none happens."""
        state = self.partition(topic, partition)
        elect = elections.elect_unclean if unclean else elections.elect_preferred
        return [PartitionRecord.of(topic, partition, elect(state, self.live_brokers, self.attached))]

    def plan_create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        topic_id: str,
    ) -> list[Record]:
        if not is_legal_topic_name(name):
            raise InvalidTopicError(f"illegal topic name {name!r}: use 1-249 characters of [a-zA-Z0-9._-]")
        if name in self.topics:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        if num_partitions < 1:
            raise InvalidPartitionsError(f"a topic needs at least one partition, got {num_partitions}")
        live = self.live_brokers
        start = sum(len(t.partitions) for t in self.topics.values())
        assignment = assign_replicas(
            num_partitions, replication_factor, {b: self.brokers[b].node_id for b in live}, start
        )
        records: list[Record] = [TopicRecord(name, topic_id, dict(configs))]
        for p, replicas in enumerate(assignment):
            records.append(PartitionRecord.of(name, p, PartitionState(replicas, replicas, replicas[0], 0, 0)))
        return records

    def plan_create_partitions(self, name: str, total: int) -> list[Record]:
        """Kafka's CreatePartitions: partitions len(current)..total-1, with the topic's
        replication factor, placed as a new topic's are (replicas on distinct nodes first,
        each partition's first replica its preferred leader). Partitions are only added."""
        meta = self.topics.get(name)
        if meta is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        current = len(meta.partitions)
        if total <= current:
            raise InvalidPartitionsError(
                f"topic {name!r} has {current} partitions; the new count must be larger, got {total}"
            )
        replication_factor = len(meta.partitions[0].target_replicas)  # not the replicas a reassignment drops
        start = sum(len(t.partitions) for t in self.topics.values())
        live = self.live_brokers
        assignment = assign_replicas(
            total - current, replication_factor, {b: self.brokers[b].node_id for b in live}, start
        )
        return [PartitionRecord.of(name, current + i, PartitionState(r, r, r[0], 0, 0)) for i, r in enumerate(assignment)]

    def plan_allocate_producer_ids(self, count: int) -> list[Record]:
        """Hands out ids [next_producer_id, next_producer_id + count)."""
        return [ProducerIdsRecord(self.next_producer_id + count)]

    def plan_create_acls(self, bindings: Sequence[AclBinding]) -> tuple[list[Record], list[KafkaError | None]]:
        """CreateAcls: per binding None or why it is refused; one that exists already is
        created again as a no-op, as in Kafka."""
        results: list[KafkaError | None] = []
        records: list[Record] = []
        new: set[AclBinding] = set()
        for binding in bindings:
            try:
                binding.check()
            except KafkaError as e:
                results.append(e)
                continue
            results.append(None)
            if binding not in self.acls and binding not in new:
                new.add(binding)
                records.append(AclRecord.of(binding))
        return records, results

    def plan_delete_acls(self, filters: Sequence[AclFilter]) -> tuple[list[Record], list[list[AclBinding]]]:
        """DeleteAcls: per filter the bindings it matches (a binding matched by two filters
        is deleted once)."""
        matched = [[b for b in self.acls if f.matches(b)] for f in filters]
        gone = dict.fromkeys(b for found in matched for b in found)
        return [RemoveAclRecord.of(b) for b in gone], matched

    def plan_alter_scram_credentials(
        self, deletions: Sequence[tuple[str, str]], upsertions: Sequence[tuple[str, ScramCredential | KafkaError]]
    ) -> tuple[list[Record], dict[str, KafkaError | None]]:
        """Kafka's AlterUserScramCredentials: the records, and per user None or the error
        that refused every change asked for that user (an empty name, a credential that
        could not be made, a mechanism named twice, deleting one the user lacks)."""
        results: dict[str, KafkaError | None] = {}
        seen: set[tuple[str, str]] = set()
        for user, mechanism in [*deletions, *((u, c.mechanism) for u, c in upsertions if isinstance(c, ScramCredential))]:
            if (user, mechanism) in seen:
                results[user] = DuplicateResourceError(f"{mechanism} for user {user!r} appears twice in the request")
            seen.add((user, mechanism))
        for user, credential in upsertions:
            if isinstance(credential, KafkaError):
                results.setdefault(user, credential)
        for user, mechanism in deletions:
            if mechanism not in self.scram_credentials.get(user, {}):
                results.setdefault(user, ResourceNotFoundError(f"user {user!r} has no {mechanism} credential"))
        for user in {u for u, _ in [*deletions, *upsertions]}:
            if not user:
                results[user] = UnacceptableCredentialError("a SCRAM credential needs a user name")
            results.setdefault(user, None)
        records: list[Record] = [
            RemoveScramCredentialRecord(user, mechanism)
            for user, mechanism in deletions if results[user] is None
        ]
        records += [
            ScramCredentialRecord.of(user, c)
            for user, c in upsertions if results[user] is None
        ]
        return records, results

    def plan_alter_client_quotas(
        self, alterations: Sequence[tuple[QuotaEntity | KafkaError, Sequence[tuple[str, float | None]]]]
    ) -> tuple[list[Record], list[KafkaError | None]]:
        """Kafka's AlterClientQuotas: the records, and per entry None or why all of its
        changes were refused (an entity that did not parse, an unknown key, a value that
        is not a positive number, a key named twice). Removing a key that is not set is
        no error."""
        records: list[Record] = []
        results: list[KafkaError | None] = []
        for entity, ops in alterations:
            try:
                if isinstance(entity, KafkaError):
                    raise entity
                keys = [key for key, _ in ops]
                if len(set(keys)) != len(keys):
                    raise InvalidRequestError(f"a quota key is named twice for {entity}")
                for key, value in ops:
                    check_quota_key(key)
                    if value is not None:
                        check_quota_value(key, value)
            except KafkaError as e:
                results.append(e)
                continue
            results.append(None)
            records += [ClientQuotaRecord.of(entity, key, value) for key, value in ops]
        return records, results

    def plan_delete_topic(self, name: str) -> list[Record]:
        if name not in self.topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return [RemoveTopicRecord(name)]

    def plan_alter_topic_configs(self, name: str, configs: Mapping[str, str]) -> list[Record]:
        if name not in self.topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return [TopicConfigsRecord(name, dict(configs))]

    def plan_alter_partition(
        self,
        topic: str,
        partition: int,
        leader_id: int,
        leader_epoch: int,
        partition_epoch: int,
        new_isr: Iterable[int],
        added_incarnations: Mapping[int, str] | None = None,
    ) -> list[Record]:
        """A leader's ISR change (Kafka's AlterPartition), checked against the current state.

        `added_incarnations` names, per added replica, the broker process whose fetch showed
        it caught up: one that is not the broker's registered process (a fetch sent before
        the broker restarted, maybe with a longer log than it has now) cannot add it, as
        KIP-903's broker epochs in AlterPartition prevent (INELIGIBLE_REPLICA). Unnamed
        ("" or absent) is not checked.

        A request for the ISR the partition already has succeeds with no records, whatever
        its partition epoch: the leader retrying a change whose answer it never got learns
        that it was committed. A replica added to the ISR has caught up: it stops
        recovering, and a reassignment whose new replicas are now all in sync completes."""
        state = self.partition(topic, partition)
        if leader_id != state.leader:
            raise NotLeaderOrFollowerError(f"broker {leader_id} is not the leader of {topic}-{partition}")
        if leader_epoch != state.leader_epoch:
            raise FencedLeaderEpochError(f"leader epoch {leader_epoch} is not current ({state.leader_epoch})")
        wanted = set(new_isr)
        isr = tuple(r for r in state.replicas if r in wanted)
        if leader_id not in isr or len(isr) != len(wanted):
            raise IneligibleReplicaError(f"ISR {sorted(wanted)} must hold the leader and only replicas {state.replicas}")
        if set(isr) == set(state.isr):
            return []
        if partition_epoch != state.partition_epoch:
            raise InvalidUpdateVersionError(f"partition epoch {partition_epoch} is not current ({state.partition_epoch})")
        live = self.live_brokers
        added = set(isr) - set(state.isr)
        if not added <= live:
            raise IneligibleReplicaError(f"brokers {sorted(added - live)} are fenced and cannot join the ISR")
        for broker in sorted(added):
            sent, registered = (added_incarnations or {}).get(broker, ""), self.brokers[broker].incarnation_id
            if sent and registered and sent != registered:
                raise IneligibleReplicaError(
                    f"broker {broker} caught up in process {sent}, which is not its registered process {registered}"
                )
        recovering = tuple(r for r in state.recovering if r not in added)
        changed = PartitionState(
            state.replicas, isr, state.leader, state.leader_epoch, state.partition_epoch + 1,
            recovering, state.adding, state.removing,
        )
        finished = elections.finish_reassignment(changed, live, self.attached)
        if finished is not None:
            changed = elections.successor(state, finished, new_leader_epoch=False)
            assert changed is not None
        return [PartitionRecord.of(topic, partition, changed)]

    # ------------------------------------------------------------------ reassignments (KIP-455)

    def plan_reassign(self, topic: str, partition: int, target: Sequence[int] | None) -> list[Record]:
        """Starts moving a partition to `target` replicas, or cancels its reassignment (None).
        A target equal to the current replicas with none under way changes nothing."""
        state = self.partition(topic, partition)
        if target is None:
            if not (state.adding or state.removing):
                raise NoReassignmentInProgressError(f"{topic}-{partition} has no reassignment to cancel")
            new = elections.cancel_reassignment(state, self.live_brokers, self.attached, self._unclean(topic))
            if new is None:
                raise InvalidReplicaAssignmentError(
                    f"{topic}-{partition}: only the new replicas are in sync; let the reassignment finish"
                )
            return [PartitionRecord.of(topic, partition, new)]
        target = list(target)
        if not target or len(set(target)) != len(target):
            raise InvalidReplicaAssignmentError(f"{topic}-{partition}: target {target} must name distinct brokers")
        unknown = [b for b in target if b not in self.brokers]
        if unknown:
            raise InvalidReplicaAssignmentError(f"{topic}-{partition}: brokers {unknown} are not registered")
        new = elections.start_reassignment(state, target)
        if new is None:
            return []
        finished = elections.finish_reassignment(new, self.live_brokers, self.attached)
        if finished is not None:
            new = elections.successor(state, finished, new_leader_epoch=False)
            if new is None:
                return []
        return [PartitionRecord.of(topic, partition, new)]
