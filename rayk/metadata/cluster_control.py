"""ClusterControlManager: the cluster id and its brokers (Kafka's ClusterControlManager).

Owns each broker's registration: the Ray node it runs on, its process (incarnation id,
new at every process start), its data directory's id, its epoch and whether it is
fenced. A broker's epoch is the offset of its registration record, so a newer
registration always has a larger one. `attached` is the one piece of session state: the
brokers registered with this Controller session; the Controller keeps it, it is never
replayed.

Plans a registration and a fencing as this domain's records; what they mean for the
broker's partitions is the ReplicationControlManager's (`on_broker_registered`,
`on_broker_fenced`). Pure: no I/O, no Ray.

Brokers come and go at runtime: a broker being decommissioned (`decommissioning`) keeps
serving what it holds but takes no new replica (`placeable_brokers` leaves it out), and
once the others hold its replicas it is unregistered (its registration removed; a
restart of it would have to register as a new broker). Being decommissioned survives the
broker's restarts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rayk.errors import BrokerNotAvailableError, StaleBrokerEpochError
from rayk.metadata.records import (
    ClusterIdRecord,
    DecommissionBrokerRecord,
    FenceBrokerRecord,
    MetadataRecord,
    RegisterBrokerRecord,
    UnregisterBrokerRecord,
)


@dataclass(slots=True)
class BrokerRegistration:
    """One broker as its latest registration record left it (plus whether it is fenced now):
    where and as which process it runs, its data directory's id, and its broker epoch."""

    broker_id: int
    epoch: int  # offset of the registration record
    node_id: str  # Ray node id (hex) the broker last ran on
    incarnation_id: str = ""  # the broker process that registered ("" in older records)
    directory_id: str = ""  # its data directory's meta.properties directory.id
    fenced: bool = False
    decommissioning: bool = False  # takes no new replicas; leaves once it holds none


@dataclass(frozen=True, slots=True)
class Registration:
    """What a registration means for the broker's replicas."""

    restarted: bool  # a new process: its replicas lost their in-memory state
    data_lost: bool  # on a data directory other than the one registered before


class ClusterControlManager:
    """The cluster domain of the Controller's image: owns the cluster id, each broker's
    BrokerRegistration and the session-only `attached` set. Plans registrations and fencings;
    changes only by replay (ClusterMetadata.apply). Pure; called from the Controller's loop."""

    def __init__(self) -> None:
        self.cluster_id: str | None = None
        self.brokers: dict[int, BrokerRegistration] = {}
        self.attached: set[int] = set()  # session state, kept by the Controller; never replayed

    def handlers(self) -> dict[type[MetadataRecord], Callable[[Any, int], None]]:
        return {
            ClusterIdRecord: self._replay_cluster_id,
            RegisterBrokerRecord: self._replay_register,
            FenceBrokerRecord: self._replay_fence,
            DecommissionBrokerRecord: self._replay_decommission,
            UnregisterBrokerRecord: self._replay_unregister,
        }

    def _replay_cluster_id(self, record: ClusterIdRecord, offset: int) -> None:
        self.cluster_id = record.cluster_id

    def _replay_register(self, record: RegisterBrokerRecord, offset: int) -> None:
        epoch = offset if record.epoch < 0 else record.epoch
        previous = self.brokers.get(record.broker_id)
        assert previous is None or epoch > previous.epoch, "broker epochs only grow"
        self.brokers[record.broker_id] = BrokerRegistration(
            record.broker_id, epoch, record.node_id, record.incarnation_id, record.directory_id,
            decommissioning=previous is not None and previous.decommissioning,
        )

    def _replay_fence(self, record: FenceBrokerRecord, offset: int) -> None:
        self.brokers[record.broker_id].fenced = record.fenced

    def _replay_decommission(self, record: DecommissionBrokerRecord, offset: int) -> None:
        self.brokers[record.broker_id].decommissioning = record.decommissioning

    def _replay_unregister(self, record: UnregisterBrokerRecord, offset: int) -> None:
        del self.brokers[record.broker_id]
        self.attached.discard(record.broker_id)

    def image_records(self) -> list[MetadataRecord]:
        """The cluster id, then each broker's registration with its epoch (and its fencing)."""
        records: list[MetadataRecord] = [] if self.cluster_id is None else [ClusterIdRecord(self.cluster_id)]
        for broker_id, reg in self.brokers.items():
            records.append(RegisterBrokerRecord(broker_id, reg.node_id, reg.incarnation_id, reg.directory_id,
                                                epoch=reg.epoch))
            if reg.fenced:
                records.append(FenceBrokerRecord(broker_id, fenced=True))
            if reg.decommissioning:
                records.append(DecommissionBrokerRecord(broker_id, decommissioning=True))
        return records

    @property
    def live_brokers(self) -> set[int]:
        return {b for b, reg in self.brokers.items() if not reg.fenced}

    @property
    def placeable_brokers(self) -> set[int]:
        """The brokers new replicas may go to: live and not being decommissioned."""
        return {b for b, reg in self.brokers.items() if not reg.fenced and not reg.decommissioning}

    @property
    def decommissioning_brokers(self) -> set[int]:
        return {b for b, reg in self.brokers.items() if reg.decommissioning}

    def node_of(self, broker_ids: set[int]) -> dict[int, str]:
        return {b: self.brokers[b].node_id for b in broker_ids}

    def incarnation_of(self, broker_id: int) -> str:
        return self.brokers[broker_id].incarnation_id

    def plan_register(
        self, broker_id: int, node_id: str, incarnation_id: str, directory_id: str, clean_shutdown: bool
    ) -> tuple[list[MetadataRecord], Registration]:
        """A broker (re)joins: its registration record, and whether it is a new process
        (restarted) on a directory formatted anew (data lost: its disk was replaced)."""
        previous = self.brokers.get(broker_id)
        restarted = previous is not None and previous.incarnation_id != incarnation_id
        data_lost = previous is not None and bool(previous.directory_id) and previous.directory_id != directory_id
        record = RegisterBrokerRecord(broker_id, node_id, incarnation_id, directory_id, clean_shutdown)
        return [record], Registration(restarted, data_lost)

    def plan_fence(self, broker_id: int, broker_epoch: int | None) -> list[MetadataRecord]:
        """A broker lost its session: its fencing, or [] if it is unknown or fenced already;
        STALE_BROKER_EPOCH if `broker_epoch` is not its current one."""
        reg = self.brokers.get(broker_id)
        if reg is None or reg.fenced:
            return []
        if broker_epoch is not None and broker_epoch != reg.epoch:
            raise StaleBrokerEpochError(f"broker {broker_id} epoch {broker_epoch} is not current ({reg.epoch})")
        return [FenceBrokerRecord(broker_id, fenced=True)]

    def plan_decommission(self, broker_id: int) -> list[MetadataRecord]:
        """The broker starts leaving the cluster; [] if it is leaving already.
        BROKER_NOT_AVAILABLE if no broker of that id is registered."""
        reg = self.brokers.get(broker_id)
        if reg is None:
            raise BrokerNotAvailableError(f"no broker {broker_id} is registered")
        return [] if reg.decommissioning else [DecommissionBrokerRecord(broker_id, decommissioning=True)]

    def plan_unregister(self, broker_id: int) -> list[MetadataRecord]:
        """The broker's registration goes (the caller checked it holds nothing)."""
        if broker_id not in self.brokers:
            raise BrokerNotAvailableError(f"no broker {broker_id} is registered")
        return [UnregisterBrokerRecord(broker_id)]
