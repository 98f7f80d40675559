"""ClusterMetadata: the Controller's state and every decision it takes (pure logic).

This is KRaft's metadata image plus the parts of its ReplicationControlManager that
decide: broker registration and fencing, topic creation with replica assignment, leader
election, ISR changes (AlterPartition). Nothing here does I/O or knows Ray; the
Controller actor persists records and pushes the results.

Every change is a *record* (a plain dict, msgpack-friendly) and the state changes only by
`apply(record, offset)`. A decision is made in two steps, as in KRaft: `plan_*` reads the
state and returns the records that would make the change (raising a typed error if the
request is invalid), the Controller writes them to its metadata log, then applies them.
Replaying the log through `apply` rebuilds exactly the same state after a restart.

Records (field `type`):
- `cluster`: the cluster id, written once.
- `register_broker`: a broker (re)started on a Ray node; its epoch is the record's offset,
  so a newer incarnation always has a larger epoch. It is unfenced.
- `fence_broker`: a broker lost its session (`fenced` true) or came back (`fenced` false).
- `topic`, `remove_topic`, `topic_configs`.
- `partition`: the full state of one partition (created or changed).
- `producer_ids`: a block of idempotent-producer ids was handed out; `next` is the first
  id never handed out (KRaft's ProducerIdsRecord).

Partition invariants, asserted by `apply`: the ISR is a non-empty subset of the replicas;
the leader is in the ISR or is NO_LEADER; the leader epoch grows whenever the leader
changes, and the partition epoch grows with every change.

Elections follow Kafka: a new leader is the first replica, in assignment order, that is in
the ISR and unfenced. If there is none, the partition stays leaderless (NO_LEADER) with its
last ISR member kept in the ISR, so that replica (which has every committed record) leads
again when it returns; only a topic with `unclean.leader.election.enable` elects an
out-of-sync replica instead, losing the records it lacks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rayk.config import BrokerConfig, unclean_election_enabled
from rayk.errors import (
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    InvalidUpdateVersionError,
    NotLeaderOrFollowerError,
    StaleBrokerEpochError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from rayk.storage.log_manager import is_legal_topic_name

NO_LEADER = -1
Record = dict[str, Any]


@dataclass(slots=True)
class BrokerRegistration:
    broker_id: int
    epoch: int  # offset of the registration record
    node_id: str  # Ray node id (hex) the broker last ran on
    fenced: bool = False


@dataclass(frozen=True, slots=True)
class PartitionState:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int

    def to_record(self, topic: str, partition: int) -> Record:
        return {
            "type": "partition",
            "topic": topic,
            "partition": partition,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "partition_epoch": self.partition_epoch,
        }


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


def elect(state: PartitionState, live: set[int], unclean: bool) -> PartitionState | None:
    """The partition's state once only `live` brokers count; None if nothing changes."""
    isr = tuple(r for r in state.isr if r in live) or state.isr  # never empty: keep the last member
    leader = state.leader
    if leader not in live or leader not in isr:
        in_sync = [r for r in state.replicas if r in isr and r in live]
        if in_sync:
            leader = in_sync[0]
        elif unclean and (alive := [r for r in state.replicas if r in live]):
            leader, isr = alive[0], (alive[0],)
        else:
            leader = NO_LEADER
    if leader == state.leader and isr == state.isr:
        return None
    return PartitionState(
        state.replicas,
        isr,
        leader,
        state.leader_epoch + (1 if leader != state.leader else 0),
        state.partition_epoch + 1,
    )


class ClusterMetadata:
    def __init__(self, broker_config: BrokerConfig | None = None) -> None:
        self.broker_config = broker_config or BrokerConfig()
        self.cluster_id: str | None = None
        self.brokers: dict[int, BrokerRegistration] = {}
        self.topics: dict[str, TopicMetadata] = {}
        self.next_producer_id = 0
        self.last_offset = -1

    # ------------------------------------------------------------------ applying records

    def apply(self, record: Record, offset: int) -> None:
        assert offset > self.last_offset, f"metadata offsets only grow: {offset} after {self.last_offset}"
        self.last_offset = offset
        kind = record["type"]
        if kind == "cluster":
            self.cluster_id = record["cluster_id"]
        elif kind == "register_broker":
            self.brokers[record["broker_id"]] = BrokerRegistration(record["broker_id"], offset, record["node_id"])
        elif kind == "fence_broker":
            self.brokers[record["broker_id"]].fenced = record["fenced"]
        elif kind == "topic":
            self.topics[record["name"]] = TopicMetadata(record["name"], record["topic_id"], dict(record["configs"]))
        elif kind == "topic_configs":
            self.topics[record["name"]].configs = dict(record["configs"])
        elif kind == "remove_topic":
            del self.topics[record["name"]]
        elif kind == "partition":
            self._apply_partition(record)
        elif kind == "producer_ids":
            assert record["next"] > self.next_producer_id, "producer id blocks only move forward"
            self.next_producer_id = record["next"]
        else:
            raise ValueError(f"unknown metadata record type {kind!r}")

    def _apply_partition(self, record: Record) -> None:
        state = PartitionState(
            tuple(record["replicas"]),
            tuple(record["isr"]),
            record["leader"],
            record["leader_epoch"],
            record["partition_epoch"],
        )
        assert state.isr and set(state.isr) <= set(state.replicas), f"ISR {state.isr} within replicas {state.replicas}"
        assert state.leader == NO_LEADER or state.leader in state.isr, f"leader {state.leader} in ISR {state.isr}"
        partitions = self.topics[record["topic"]].partitions
        old = partitions.get(record["partition"])
        if old is not None:
            assert state.partition_epoch > old.partition_epoch, "partition epochs only grow"
            assert state.leader_epoch >= old.leader_epoch, "leader epochs only grow"
            assert state.leader == old.leader or state.leader_epoch > old.leader_epoch, "a new leader has a new epoch"
        partitions[record["partition"]] = state

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

    # ------------------------------------------------------------------ planning changes

    def plan_register_broker(self, broker_id: int, node_id: str) -> list[Record]:
        """A broker (re)joins: register it, then elect it wherever a partition lacks a leader."""
        records: list[Record] = [{"type": "register_broker", "broker_id": broker_id, "node_id": node_id}]
        return records + self._elections(self.live_brokers | {broker_id}, only_broker=broker_id)

    def plan_fence_broker(self, broker_id: int, broker_epoch: int | None = None) -> list[Record]:
        """A broker lost its session: drop it from every ISR and move its leaderships."""
        reg = self.brokers.get(broker_id)
        if reg is None or reg.fenced:
            return []
        if broker_epoch is not None and broker_epoch != reg.epoch:
            raise StaleBrokerEpochError(f"broker {broker_id} epoch {broker_epoch} is not current ({reg.epoch})")
        records: list[Record] = [{"type": "fence_broker", "broker_id": broker_id, "fenced": True}]
        return records + self._elections(self.live_brokers - {broker_id}, only_broker=broker_id)

    def _elections(self, live: set[int], only_broker: int) -> list[Record]:
        records = []
        for name, p, state in self.partitions_of_broker(only_broker):
            unclean = unclean_election_enabled(self.topics[name].configs, self.broker_config)
            new_state = elect(state, live, unclean)
            if new_state is not None:
                records.append(new_state.to_record(name, p))
        return records

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
        records: list[Record] = [{"type": "topic", "name": name, "topic_id": topic_id, "configs": dict(configs)}]
        for p, replicas in enumerate(assignment):
            records.append(PartitionState(replicas, replicas, replicas[0], 0, 0).to_record(name, p))
        return records

    def plan_allocate_producer_ids(self, count: int) -> list[Record]:
        """Hands out ids [next_producer_id, next_producer_id + count)."""
        return [{"type": "producer_ids", "next": self.next_producer_id + count}]

    def plan_delete_topic(self, name: str) -> list[Record]:
        if name not in self.topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return [{"type": "remove_topic", "name": name}]

    def plan_alter_topic_configs(self, name: str, configs: Mapping[str, str]) -> list[Record]:
        if name not in self.topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return [{"type": "topic_configs", "name": name, "configs": dict(configs)}]

    def plan_alter_partition(
        self,
        topic: str,
        partition: int,
        leader_id: int,
        leader_epoch: int,
        partition_epoch: int,
        new_isr: Iterable[int],
    ) -> list[Record]:
        """A leader's ISR change (Kafka's AlterPartition), checked against the current state."""
        state = self.partition(topic, partition)
        if leader_id != state.leader:
            raise NotLeaderOrFollowerError(f"broker {leader_id} is not the leader of {topic}-{partition}")
        if leader_epoch != state.leader_epoch:
            raise FencedLeaderEpochError(f"leader epoch {leader_epoch} is not current ({state.leader_epoch})")
        if partition_epoch != state.partition_epoch:
            raise InvalidUpdateVersionError(f"partition epoch {partition_epoch} is not current ({state.partition_epoch})")
        wanted = set(new_isr)
        isr = tuple(r for r in state.replicas if r in wanted)
        if leader_id not in isr or len(isr) != len(wanted):
            raise IneligibleReplicaError(f"ISR {sorted(wanted)} must hold the leader and only replicas {state.replicas}")
        live = self.live_brokers
        added = set(isr) - set(state.isr)
        if not added <= live:
            raise IneligibleReplicaError(f"brokers {sorted(added - live)} are fenced and cannot join the ISR")
        if isr == state.isr:
            return []
        new_state = PartitionState(state.replicas, isr, state.leader, state.leader_epoch, state.partition_epoch + 1)
        return [new_state.to_record(topic, partition)]
