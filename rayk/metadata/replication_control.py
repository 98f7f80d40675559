"""ReplicationControlManager: topics, partitions and who leads them (Kafka's
ReplicationControlManager).

Owns each topic's id and, per partition, the state `elections.py` reasons about: replicas,
ISR, leader, leader epoch, partition epoch, recovering replicas, eligible leader replicas
(KIP-966's ELR, kept on every change by `elections.track_eligible`) and a reassignment's
adding / removing replicas. Plans, as records: topic creation with replica placement,
new partitions, deletion, AlterPartition (ISR changes), elections (preferred, unclean,
KIP-966's unclean recovery), a replica's failure, reassignments (KIP-455), and what a
broker's registration or fencing means for its partitions. It reads the brokers from the
ClusterControlManager and the topics' configs from the ConfigurationControlManager;
it changes only by replaying its records.

Partition invariants are asserted on replay (`PartitionState.check`): the ISR is a subset
of the replicas, empty only while leaderless; the leader is in the ISR or is NO_LEADER;
the leader epoch grows whenever the leader changes, and the partition epoch grows with
every change. Pure: no I/O, no Ray.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rayk.errors import (
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    InvalidUpdateVersionError,
    NoReassignmentInProgressError,
    NotLeaderOrFollowerError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from rayk.metadata import elections
from rayk.metadata.balancer import BalancerBroker, BalancerPartition, partitions_of, plan_balance
from rayk.metadata.cluster_control import ClusterControlManager, Registration
from rayk.metadata.config_control import ConfigurationControlManager
from rayk.metadata.elections import LogEnd, PartitionState
from rayk.metadata.records import MetadataRecord, PartitionRecord, RemoveTopicRecord, TopicRecord
from rayk.storage.log_manager import is_legal_topic_name


@dataclass(slots=True)
class TopicMetadata:
    """One topic in the Controller's image: its name, its id and each partition's state, by
    partition number."""

    name: str
    topic_id: str
    partitions: dict[int, PartitionState] = field(default_factory=dict)


def assign_replicas(
    num_partitions: int,
    replication_factor: int,
    broker_nodes: Mapping[int, str],
    start_index: int,
    replicas_held: Mapping[int, int] | None = None,
    leaders_held: Mapping[int, int] | None = None,
) -> list[tuple[int, ...]]:
    """Placement that puts a partition's replicas on distinct nodes first, then on the
    brokers holding the fewest replicas (of those, leading the fewest partitions), and
    makes the one of them leading the fewest its preferred leader (its first replica).

    `replicas_held` and `leaders_held` are what each broker holds already (replicas, and
    partitions it is the first replica of), so a new topic keeps a balanced cluster
    balanced as the balancer measures it (metadata/balancer.py: counts within 1 of the
    mean), and fills a broker that joined empty. Ties go round-robin: brokers are ordered
    by interleaving the nodes (first broker of each node, then the second of each, ...),
    and partition p prefers the brokers from position start_index + p on; on an empty
    cluster whose brokers spread evenly over nodes that is the plain round robin.
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
    position = {b: i for i, b in enumerate(ordered)}
    held = Counter({b: (replicas_held or {}).get(b, 0) for b in ordered})
    leading = Counter({b: (leaders_held or {}).get(b, 0) for b in ordered})
    node_held = Counter({node: sum(held[b] for b in brokers) for node, brokers in by_node.items()})
    out = []
    for p in range(num_partitions):
        anchor = start_index + p

        def rank(b: int, used: set[str], first: bool) -> tuple:
            """The first pick, which leads, prefers a broker leading few; the others do
            not, keeping those for the partitions after (one leader each)."""
            node = broker_nodes[b]
            return node in used, held[b], node_held[node], leading[b] if first else 0, (position[b] - anchor) % n

        chosen: list[int] = []
        for _ in range(replication_factor):
            used = {broker_nodes[b] for b in chosen}
            chosen.append(min((b for b in ordered if b not in chosen), key=lambda b: rank(b, used, not chosen)))
        leader = min(chosen, key=lambda b: (leading[b], (position[b] - anchor) % n))
        followers = sorted((b for b in chosen if b != leader), key=lambda b: (position[b] - position[leader]) % n)
        held.update(chosen)
        node_held.update(broker_nodes[b] for b in chosen)
        leading[leader] += 1
        out.append((leader, *followers))
    return out


class ReplicationControlManager:
    """The replication domain of the Controller's image: owns every topic and partition state.
    Reads the brokers from the ClusterControlManager and the configs from the
    ConfigurationControlManager; changes only by replay (ClusterMetadata.apply), asserting
    the partition invariants. Pure; called from the Controller's loop."""

    def __init__(self, cluster: ClusterControlManager, configs: ConfigurationControlManager) -> None:
        self.cluster = cluster
        self.configs = configs
        self.topics: dict[str, TopicMetadata] = {}

    def handlers(self) -> dict[type[MetadataRecord], Callable[[Any, int], None]]:
        return {
            TopicRecord: self._replay_topic,
            RemoveTopicRecord: self._replay_remove_topic,
            PartitionRecord: self._replay_partition,
        }

    def _replay_topic(self, record: TopicRecord, offset: int) -> None:
        self.topics[record.name] = TopicMetadata(record.name, record.topic_id)

    def _replay_remove_topic(self, record: RemoveTopicRecord, offset: int) -> None:
        del self.topics[record.name]

    def _replay_partition(self, record: PartitionRecord, offset: int) -> None:
        state = record.state
        state.check()
        partitions = self.topics[record.topic].partitions
        old = partitions.get(record.partition)
        if old is not None:
            assert state.partition_epoch > old.partition_epoch, "partition epochs only grow"
            assert state.leader_epoch >= old.leader_epoch, "leader epochs only grow"
            assert state.leader == old.leader or state.leader_epoch > old.leader_epoch, "a new leader has a new epoch"
        partitions[record.partition] = state

    def image_records(self) -> list[MetadataRecord]:
        """Each topic (with its configs) followed by its partitions."""
        records: list[MetadataRecord] = []
        for name, topic in self.topics.items():
            records.append(TopicRecord(name, topic.topic_id, self.configs.of(name)))
            records += [PartitionRecord.of(name, p, state) for p, state in topic.partitions.items()]
        return records

    # ------------------------------------------------------------------ reading

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

    def held_by_broker(self) -> tuple[Counter[int], Counter[int]]:
        """Per broker, the replicas it holds and the partitions it is the preferred leader
        of, once the reassignments under way complete (what new partitions are placed by)."""
        targets = [state.target_replicas for meta in self.topics.values() for state in meta.partitions.values()]
        return Counter(b for target in targets for b in target), Counter(target[0] for target in targets)

    def needs_log_comparison(self, topic: str, partition: int) -> bool:
        """Leaderless with every live in-sync copy back but recovering (see `elections`)."""
        return bool(self.copies_to_compare(topic, partition))

    def copies_to_compare(self, topic: str, partition: int) -> tuple[int, ...]:
        """The brokers whose logs decide a leaderless partition (rule 4 of `elections`)."""
        state = self.partition(topic, partition)
        return elections.copies_to_compare(state, self.cluster.live_brokers, self.cluster.attached)

    # ------------------------------------------------------------------ brokers joining and leaving

    def on_broker_registered(
        self, broker_id: int, registration: Registration, clean_shutdown: bool
    ) -> list[MetadataRecord]:
        """The partition records a broker's (re)registration makes, planned before it is
        applied. If it is a new incarnation (a restarted process), its replicas lost their
        in-memory state: where it led, leadership is decided again in a new epoch; after
        an unclean shutdown its ISR memberships become recovering (KIP-966), and with a
        data directory that is not the one registered before (formatted anew: its disk
        was replaced) it also leaves every ISR at once. Then every partition of the broker
        is reconciled: leaderless ones may get their leader back."""
        restarted, data_lost = registration.restarted, registration.data_lost
        records: list[MetadataRecord] = []
        live = self.cluster.live_brokers | {broker_id}
        attached = self.cluster.attached | {broker_id}
        for name, p, state in self.partitions_of_broker(broker_id):
            marked = state
            if restarted and (data_lost or not clean_shutdown):
                marked = elections.mark_recovering(state, broker_id, data_lost)
            new = elections.reconcile(
                marked, live, attached, self.configs.unclean(name), restarted=[broker_id] if restarted else []
            )
            if new is None and marked != state:
                new = elections.successor(state, marked, new_leader_epoch=False)
            if new is not None:
                records.append(self._changed(name, p, marked, new))
        return records

    def on_broker_fenced(self, broker_id: int) -> list[MetadataRecord]:
        """The partition records a broker's fencing makes, planned before it is applied:
        out of every ISR it can leave, leaderships moved."""
        records: list[MetadataRecord] = []
        live, attached = self.cluster.live_brokers - {broker_id}, self.cluster.attached - {broker_id}
        for name, p, state in self.partitions_of_broker(broker_id):
            new = elections.reconcile(state, live, attached, self.configs.unclean(name))
            if new is not None:
                records.append(self._changed(name, p, state, new))
        return records

    # ------------------------------------------------------------------ planning changes

    def _changed(self, topic: str, partition: int, old: PartitionState, new: PartitionState) -> PartitionRecord:
        """The record of a partition's change from `old` to `new`, its ELR kept (KIP-966)."""
        return PartitionRecord.of(topic, partition, elections.track_eligible(old, new, self.configs.min_insync(topic)))

    def plan_replica_failed(self, topic: str, partition: int, broker_id: int) -> list[MetadataRecord]:
        """The broker's replica process of this partition died; its log on disk is intact
        and it is being re-created. It leaves the ISR while another member is ready, and
        if it led, leadership moves (or, as the only copy, it leads again in a new epoch)."""
        state = self.partition(topic, partition)
        if broker_id not in state.replicas:
            raise NotLeaderOrFollowerError(f"broker {broker_id} holds no replica of {topic}-{partition}")
        new = elections.reconcile(
            state, self.cluster.live_brokers, self.cluster.attached, self.configs.unclean(topic), unavailable=[broker_id]
        )
        return [] if new is None else [self._changed(topic, partition, state, new)]

    def plan_reconcile(self, topic: str, partition: int) -> list[MetadataRecord]:
        """The partition made consistent with who is live and attached now (elections'
        rules 1-3); [] if it already is. The Controller's maintenance runs it on every
        leaderless partition, so none waits for an event that may not come."""
        state = self.partition(topic, partition)
        new = elections.reconcile(state, self.cluster.live_brokers, self.cluster.attached, self.configs.unclean(topic))
        return [] if new is None else [self._changed(topic, partition, state, new)]

    def plan_unclean_recovery(self, topic: str, partition: int, ends: Mapping[int, LogEnd]) -> list[MetadataRecord]:
        """Rule 4 of `elections`: elects the ISR member with the most complete log, once every
        live one of them is back and reported its log end (the missing ones fenced). []
        if the partition no longer needs it."""
        state = self.partition(topic, partition)
        copies = elections.copies_to_compare(state, self.cluster.live_brokers, self.cluster.attached)
        if not copies or not set(copies) <= set(ends):
            return []
        chosen = elections.choose_by_log(state, copies, dict(ends))
        return [self._changed(topic, partition, state, elections.recover_uncleanly(state, chosen))]

    def plan_elect_leader(self, topic: str, partition: int, unclean: bool = False) -> list[MetadataRecord]:
        """ElectLeaders for one partition: preferred (or, with `unclean`, an unclean
        election of a leaderless one); raises the election's KafkaError if none happens."""
        state = self.partition(topic, partition)
        elect = elections.elect_unclean if unclean else elections.elect_preferred
        return [self._changed(topic, partition, state, elect(state, self.cluster.live_brokers, self.cluster.attached))]

    def _place(self, name: str, first: int, count: int, replication_factor: int) -> list[tuple[int, ...]]:
        """Where `count` new partitions of `name`, from `first` on, go among the placeable
        brokers (live, not being decommissioned): `assign_replicas`' placement, polished by the balancer's planner
        (metadata/balancer.py) moving only the new partitions, which hold no data yet: a
        new topic leaves the cluster as balanced as its own replicas can make it."""
        nodes = self.cluster.node_of(self.cluster.placeable_brokers)
        start = sum(len(t.partitions) for t in self.topics.values())
        assignment = assign_replicas(count, replication_factor, nodes, start, *self.held_by_broker())
        new = [BalancerPartition(name, first + i, r, r[0], r) for i, r in enumerate(assignment)]
        brokers = [BalancerBroker(b, node) for b, node in sorted(nodes.items())]
        plan = plan_balance(brokers, partitions_of(self.all_partitions()) + new, max_moves_per_broker=count * len(nodes),
                            only={p.key for p in new})
        moved = {m.partition: m.replicas for m in plan.moves}
        return [moved.get(first + i, replicas) for i, replicas in enumerate(assignment)]

    def plan_create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        topic_id: str,
    ) -> list[MetadataRecord]:
        if not is_legal_topic_name(name):
            raise InvalidTopicError(f"illegal topic name {name!r}: use 1-249 characters of [a-zA-Z0-9._-]")
        if name in self.topics:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        if num_partitions < 1:
            raise InvalidPartitionsError(f"a topic needs at least one partition, got {num_partitions}")
        assignment = self._place(name, 0, num_partitions, replication_factor)
        records: list[MetadataRecord] = [TopicRecord(name, topic_id, dict(configs))]
        for p, replicas in enumerate(assignment):
            records.append(PartitionRecord.of(name, p, PartitionState(replicas, replicas, replicas[0], 0, 0)))
        return records

    def plan_create_partitions(self, name: str, total: int) -> list[MetadataRecord]:
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
        assignment = self._place(name, current, total - current, replication_factor)
        return [PartitionRecord.of(name, current + i, PartitionState(r, r, r[0], 0, 0)) for i, r in enumerate(assignment)]

    def plan_delete_topic(self, name: str) -> list[MetadataRecord]:
        if name not in self.topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return [RemoveTopicRecord(name)]

    def plan_alter_partition(
        self,
        topic: str,
        partition: int,
        leader_id: int,
        leader_epoch: int,
        partition_epoch: int,
        new_isr: Iterable[int],
        added_incarnations: Mapping[int, str] | None = None,
    ) -> list[MetadataRecord]:
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
        live = self.cluster.live_brokers
        added = set(isr) - set(state.isr)
        if not added <= live:
            raise IneligibleReplicaError(f"brokers {sorted(added - live)} are fenced and cannot join the ISR")
        for broker in sorted(added):
            sent, registered = (added_incarnations or {}).get(broker, ""), self.cluster.incarnation_of(broker)
            if sent and registered and sent != registered:
                raise IneligibleReplicaError(
                    f"broker {broker} caught up in process {sent}, which is not its registered process {registered}"
                )
        recovering = tuple(r for r in state.recovering if r not in added)
        eligible = tuple(r for r in state.eligible if r not in added)
        changed = replace(
            state, isr=isr, partition_epoch=state.partition_epoch + 1, recovering=recovering, eligible=eligible
        )
        finished = elections.finish_reassignment(changed, live, self.cluster.attached)
        if finished is not None:
            changed = elections.successor(state, finished, new_leader_epoch=False)
            assert changed is not None
        return [self._changed(topic, partition, state, changed)]

    def plan_min_insync_change(self, topic: str) -> list[MetadataRecord]:
        """The topic's min.insync.replicas is about to change: every ELR of it empties, as
        in Kafka, since its members were kept eligible by the HW rule of the old value
        (with a lower one the HW moves again without them)."""
        return [
            self._changed(topic, p, state, elections.successor(state, replace(state, eligible=())))
            for p, state in sorted(self.topics[topic].partitions.items())
            if state.eligible
        ]

    # ------------------------------------------------------------------ reassignments (KIP-455)

    def plan_reassign(self, topic: str, partition: int, target: Sequence[int] | None) -> list[MetadataRecord]:
        """Starts moving a partition to `target` replicas, or cancels its reassignment (None).
        A target equal to the current replicas with none under way changes nothing."""
        state = self.partition(topic, partition)
        if target is None:
            if not (state.adding or state.removing):
                raise NoReassignmentInProgressError(f"{topic}-{partition} has no reassignment to cancel")
            new = elections.cancel_reassignment(state, self.cluster.live_brokers, self.cluster.attached, self.configs.unclean(topic))
            if new is None:
                raise InvalidReplicaAssignmentError(
                    f"{topic}-{partition}: only the new replicas are in sync; let the reassignment finish"
                )
            return [self._changed(topic, partition, state, new)]
        target = list(target)
        if not target or len(set(target)) != len(target):
            raise InvalidReplicaAssignmentError(f"{topic}-{partition}: target {target} must name distinct brokers")
        unknown = [b for b in target if b not in self.cluster.brokers]
        if unknown:
            raise InvalidReplicaAssignmentError(f"{topic}-{partition}: brokers {unknown} are not registered")
        new = elections.start_reassignment(state, target)
        if new is None:
            return []
        finished = elections.finish_reassignment(new, self.cluster.live_brokers, self.cluster.attached)
        if finished is not None:
            new = elections.successor(state, finished, new_leader_epoch=False)
            if new is None:
                return []
        return [self._changed(topic, partition, state, new)]
