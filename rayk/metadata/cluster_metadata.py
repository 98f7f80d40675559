"""ClusterMetadata: the metadata image, as the per-domain control managers keep it.

This is what KRaft's QuorumController holds, without the I/O: one pure manager per domain,
each owning its part of the image, replaying its own record kinds and planning its own
changes as records (Kafka's `controller/*ControlManager.java`):
- `cluster`: the cluster id and the brokers (`cluster_control.py`);
- `configs`: topics' configs (`config_control.py`);
- `replication`: topics, partitions, ISRs, elections, reassignments (`replication_control.py`,
  rules in `elections.py`);
- `acl`, `scram`, `quotas`, `producer_ids`: ACLs, SCRAM credentials, client quotas,
  idempotent producers' ids.

The Controller actor is the shell: it asks a manager to plan a change (`plan_*`, raising a
typed error if the request is invalid), writes the records to its metadata log, then
`apply`s them here, which hands each record to the managers that replay its kind, and
only then pushes the result to brokers. Replaying the log through `apply` rebuilds the
same image after a restart; so does `restore` of a snapshot (`snapshot`: every
manager's `image_records`) followed by the records after it, which is what `load` does
with a MetadataLog.

The two changes that span domains are planned here: a broker's registration and its
fencing (the cluster's record, then what it means for the broker's partitions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rayk.config import BrokerConfig
from rayk.errors import InvalidRequestError, PolicyViolationError
from rayk.metadata.acl_control import AclControlManager
from rayk.metadata.cluster_control import BrokerRegistration, ClusterControlManager
from rayk.metadata.config_control import ConfigurationControlManager
from rayk.metadata.elections import NO_LEADER, LogEnd, PartitionState
from rayk.metadata.producer_id_control import ProducerIdControlManager
from rayk.metadata.quota_control import ClientQuotaControlManager
from rayk.metadata.records import RECORD_KINDS, MetadataRecord
from rayk.metadata.replication_control import ReplicationControlManager, TopicMetadata, assign_replicas
from rayk.metadata.scram_control import ScramControlManager
from rayk.metadata.snapshot import MetadataSnapshot

if TYPE_CHECKING:
    from rayk.metadata.log import MetadataLog

__all__ = [
    "NO_LEADER",
    "BrokerRegistration",
    "ClusterMetadata",
    "LogEnd",
    "PartitionState",
    "Record",
    "TopicMetadata",
    "assign_replicas",
]

Record = MetadataRecord


class ClusterMetadata:
    """The whole metadata image: owns one control manager per domain and the offset of the
    last record applied, and routes each record to the managers that replay its kind. Built
    empty, then `load`ed from the MetadataLog (or `restore`d from a snapshot). The
    Controller actor holds one and changes it only through Controller._commit; not
    thread-safe (the actor's event loop). Invariant: the offsets applied only grow."""

    def __init__(self, broker_config: BrokerConfig | None = None) -> None:
        self.broker_config = broker_config or BrokerConfig()
        self.cluster = ClusterControlManager()
        self.configs = ConfigurationControlManager(self.broker_config)
        self.replication = ReplicationControlManager(self.cluster, self.configs)
        self.acl = AclControlManager()
        self.scram = ScramControlManager()
        self.quotas = ClientQuotaControlManager()
        self.producer_ids = ProducerIdControlManager()
        # In image order: a snapshot lists the managers' records in this order.
        self._managers = (self.cluster, self.configs, self.replication, self.producer_ids, self.acl, self.scram,
                          self.quotas)
        self._handlers: dict[type[MetadataRecord], list[Callable[[Any, int], None]]] = {}
        for manager in self._managers:
            for kind, handler in manager.handlers().items():
                self._handlers.setdefault(kind, []).append(handler)
        assert set(self._handlers) == set(RECORD_KINDS.values()), "every record kind has its manager"
        self.last_offset = -1

    # ------------------------------------------------------------------ applying records

    def apply(self, record: MetadataRecord, offset: int) -> None:
        """Applies one record at its offset in the metadata log."""
        assert offset > self.last_offset, f"metadata offsets only grow: {offset} after {self.last_offset}"
        handlers = self._handlers.get(type(record))
        if handlers is None:
            raise TypeError(f"not a metadata record: {record!r:.200}")
        self.last_offset = offset
        for handler in handlers:
            handler(record, offset)

    # ------------------------------------------------------------------ snapshots

    def image_records(self) -> list[MetadataRecord]:
        """Records that rebuild this image when applied to an empty one (`restore`)."""
        return [record for manager in self._managers for record in manager.image_records()]

    def snapshot(self, epoch: int = 0) -> MetadataSnapshot:
        """The whole image as of its last applied offset."""
        return MetadataSnapshot(self.last_offset + 1, epoch, self.acl.version, self.quotas.version,
                                tuple(self.image_records()))

    def restore(self, snapshot: MetadataSnapshot) -> None:
        """Makes this (empty) image the snapshot's; the records after it are applied next."""
        assert self.last_offset == -1 and not self.brokers and not self.topics, "a snapshot is restored into an empty image"
        offset = snapshot.end_offset - 1
        for record in snapshot.records:
            for handler in self._handlers[type(record)]:
                handler(record, offset)
        self.last_offset = offset
        self.acl.version, self.quotas.version = snapshot.acl_version, snapshot.quota_version

    def load(self, log: MetadataLog) -> None:
        """Makes this (empty) image the log's: its newest usable snapshot, then every record
        after it."""
        snapshot, records = log.load()
        if snapshot is not None:
            self.restore(snapshot)
        for offset, record in records:
            self.apply(record, offset)

    # ------------------------------------------------------------------ reading (the image)

    @property
    def cluster_id(self) -> str | None:
        return self.cluster.cluster_id

    @property
    def brokers(self) -> dict[int, BrokerRegistration]:
        return self.cluster.brokers

    @property
    def live_brokers(self) -> set[int]:
        return self.cluster.live_brokers

    @property
    def placeable_brokers(self) -> set[int]:
        """Live brokers not being decommissioned: where new replicas may go."""
        return self.cluster.placeable_brokers

    @property
    def attached(self) -> set[int]:
        """Session state: the brokers registered with this Controller session (the
        Controller adds and discards them; never replayed)."""
        return self.cluster.attached

    @property
    def topics(self) -> dict[str, TopicMetadata]:
        return self.replication.topics

    def partition(self, topic: str, partition: int) -> PartitionState:
        return self.replication.partition(topic, partition)

    def all_partitions(self) -> list[tuple[str, int, PartitionState]]:
        return self.replication.all_partitions()

    # ------------------------------------------------------------------ changes across domains

    def plan_register_broker(
        self,
        broker_id: int,
        node_id: str,
        incarnation_id: str = "",
        directory_id: str = "",
        clean_shutdown: bool = True,
    ) -> list[MetadataRecord]:
        """A broker (re)joins: its registration, then what it means for its partitions
        (see `ReplicationControlManager.on_broker_registered`)."""
        records, registration = self.cluster.plan_register(broker_id, node_id, incarnation_id, directory_id,
                                                           clean_shutdown)
        return records + self.replication.on_broker_registered(broker_id, registration, clean_shutdown)

    def plan_decommission_broker(self, broker_id: int) -> list[MetadataRecord]:
        """The broker starts leaving: it takes no new replicas (its own move by
        reassignment, see the Controller's BrokerDecommission). POLICY_VIOLATION if the
        other brokers cannot hold a replica of every partition it holds on brokers apart
        (a partition needs as many placeable brokers as it has replicas)."""
        if broker_id in self.cluster.brokers and not self.cluster.brokers[broker_id].decommissioning:
            others = self.cluster.placeable_brokers - {broker_id}
            for topic, partition, state in self.replication.partitions_of_broker(broker_id):
                needed = len(state.target_replicas)
                if needed > len(others):
                    raise PolicyViolationError(
                        f"broker {broker_id} cannot leave: {topic}-{partition} has {needed} replicas and only "
                        f"{len(others)} other brokers ({sorted(others)}) could hold them; add a broker first"
                    )
        return self.cluster.plan_decommission(broker_id)

    def plan_unregister_broker(self, broker_id: int) -> list[MetadataRecord]:
        """The broker leaves the cluster; INVALID_REQUEST while a partition still names it."""
        held = self.replication.partitions_of_broker(broker_id)
        if held:
            names = ", ".join(f"{t}-{p}" for t, p, _ in held[:5]) + (", ..." if len(held) > 5 else "")
            raise InvalidRequestError(f"broker {broker_id} still holds replicas of {len(held)} partitions ({names})")
        return self.cluster.plan_unregister(broker_id)

    def plan_fence_broker(self, broker_id: int, broker_epoch: int | None = None) -> list[MetadataRecord]:
        """A broker lost its session: its fencing, then out of every ISR it can leave and
        leaderships moved; [] if it is unknown or fenced already."""
        records = self.cluster.plan_fence(broker_id, broker_epoch)
        return records + self.replication.on_broker_fenced(broker_id) if records else []
