"""ReplicaContext: what the parts of one partition replica share (the fields of Kafka's
`Partition` that its paths all read).

A PartitionReplica (partition_replica.py) is a Ray actor composed of parts, each owning
its own state: the leader's ISR and high watermark (leader_isr.py), its produce path
(leader_produce.py), its fetch path (leader_fetch.py), the follower's fetcher
(replica_follower.py) and the log's lifecycle (log_lifecycle.py). What they all read is
here: the partition's name, its `Log`, its settings, its counters, its events
(replica_events.py), the produce trace while one runs, and its role in its leader epoch.

Who changes what: only the actor changes the role, the leader epoch and the leader
(`lead`, `follow`, `stop`: its role changes, which its broker sends one at a time), the
settings (`update_config`) and the trace (`trace_produce`). Leader epochs only grow. Every
part re-reads the role and the epoch after each of its awaits, since any of them may have
changed meanwhile; `leads_in(epoch)` is that check.

Not thread-safe: used on the replica actor's event loop only (the log cleaner's thread
gets the Log, never this).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from rayk.dataplane.tls import KeyStore
from rayk.errors import NotLeaderOrFollowerError
from rayk.metrics import BrokerTopicCounters
from rayk.replication.produce_trace import ProduceTrace
from rayk.replication.replica_events import ReplicaEvents
from rayk.replication.share.share_fetch import ShareSettings
from rayk.storage import Log
from rayk.storage.remote.remote_log_storage import RemoteStorageSettings


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """Replication settings, with Kafka's defaults (names: min.insync.replicas, ...)."""

    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 10_000
    replica_fetch_max_bytes: int = 1 << 20
    replica_fetch_min_bytes: int = 1
    replica_fetch_wait_max_ms: int = 500
    replica_socket_timeout_ms: int = 30_000  # bound on one follower fetch call
    # Where the data plane's TCP endpoint binds (rayk/dataplane): the host of the brokers'
    # first listener, as Kafka replicates over a listener; "": the node's address.
    data_plane_host: str = ""
    # The certificate it serves over TLS (the first TLS listener's); None: plain TCP.
    data_plane_keystore: KeyStore | None = None
    share: ShareSettings = ShareSettings()  # KIP-932's group.share.* settings
    # Tiered storage (remote_log_manager.py): the brokers' store, None unless
    # remote.log.storage.system.enable; how often a leader copies and expires.
    remote_storage: RemoteStorageSettings | None = None
    remote_log_manager_task_interval_ms: int = 30_000


class Role(enum.Enum):
    """What a replica is in its leader epoch (None before its first assignment and once closed)."""

    LEADER = "leader"
    FOLLOWER = "follower"


def now_ms() -> int:
    """Monotonic milliseconds: the leader's clock of its followers' lag (lastCaughtUpTimeMs
    against replica.lag.time.max.ms). A lag is an elapsed time inside this process, so a
    step of the wall clock must not move it: on the wall clock, a leader whose clock
    stepped an hour back kept a silent follower in the ISR for an hour, and one that
    stepped an hour forward dropped every follower at once."""
    return int(time.monotonic() * 1000)


def wall_clock_ms() -> int:
    """Wall-clock milliseconds: the log cleaner's clock, compared with record timestamps
    (min/max compaction lag, the tombstone horizon), as Kafka's."""
    return int(time.time() * 1000)


class ReplicaContext:
    """One replica's shared state: its partition, log, settings, counters, events, trace,
    and its role in its leader epoch (see the module docstring for who changes what)."""

    __slots__ = ("topic", "partition", "broker_id", "name", "topic_id", "log", "config", "counters", "events",
                 "trace", "role", "leader_epoch", "leader_id")  # fmt: skip

    def __init__(self, topic: str, partition: int, broker_id: int, topic_id: str | None, log: Log,
                 config: ReplicaConfig) -> None:  # fmt: skip
        self.topic, self.partition, self.broker_id = topic, partition, broker_id
        self.name = f"{topic}-{partition}"
        self.topic_id = topic_id  # None for a log without partition.metadata
        self.log = log
        self.config = config
        self.counters = BrokerTopicCounters(broker_id, topic)
        self.events = ReplicaEvents()
        self.trace: ProduceTrace | None = None  # see PartitionReplica.trace_produce
        self.role: Role | None = None  # None before the first assignment, and once closed
        self.leader_epoch = -1
        self.leader_id: int | None = None

    def leads_in(self, epoch: int) -> bool:
        """Whether this replica leads now, in `epoch`."""
        return self.role is Role.LEADER and self.leader_epoch == epoch

    def not_leader(self) -> NotLeaderOrFollowerError:
        return NotLeaderOrFollowerError(
            f"broker {self.broker_id} is not the leader of {self.name} "
            f"(leader: {self.leader_id}, epoch {self.leader_epoch})"
        )

    def lead(self, epoch: int) -> None:
        assert epoch >= self.leader_epoch, f"leader epochs only grow: {epoch} after {self.leader_epoch}"
        self.role, self.leader_epoch, self.leader_id = Role.LEADER, epoch, self.broker_id

    def follow(self, epoch: int, leader_id: int) -> None:
        assert epoch >= self.leader_epoch, f"leader epochs only grow: {epoch} after {self.leader_epoch}"
        self.role, self.leader_epoch, self.leader_id = Role.FOLLOWER, epoch, leader_id

    def stop(self) -> None:
        """Closed or deleted: neither leads nor follows again."""
        self.role = None
