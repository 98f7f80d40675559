"""What the admin calls describe, as typed records: a topic's partitions
(PartitionDescription), a consumer group (ConsumerGroupDescription, with its members and
each partition's lag), a group in a listing (GroupListing), a broker's data directory
(LogDirDescription) and the cluster's health (ClusterHealth).

Each is a frozen dataclass read by attribute (`p.leader`, `group.partitions`), as
kafka-python's and confluent-kafka's results are, and still reads as the dict it
replaced (`p["leader"]`, `p.get("isr")`, `dict(p)`, `==` a dict of the same fields), so
code written against the dicts keeps working.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from rayk.client.types import TopicPartition
from rayk.errors import KafkaError
from rayk.metrics import BrokerHealth


class ReadsAsDict(Mapping[str, Any]):
    """A dataclass that is also the read-only mapping of its fields."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        if key not in _field_names(type(self)):
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_field_names(type(self)))

    def __len__(self) -> int:
        return len(_field_names(type(self)))


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@dataclasses.dataclass(frozen=True, eq=False)
class PartitionDescription(ReadsAsDict):
    """One partition as the Controller knows it. The offsets are the leader's, None while
    its broker is away (as right after a Controller restart)."""

    topic: str
    topic_id: str
    partition: int
    leader: int  # -1: none (offline)
    replicas: list[int]
    isr: list[int]
    leader_epoch: int
    partition_epoch: int
    recovering: list[int]  # replicas that came back from an unclean shutdown, not yet eligible
    adding_replicas: list[int]  # a reassignment under way
    removing_replicas: list[int]
    eligible_leader_replicas: list[int]  # KIP-966's ELR: out of the ISR, holding every committed record
    high_watermark: int | None
    log_end_offset: int | None
    log_start_offset: int | None

    @classmethod
    def of(cls, described: Mapping[str, Any]) -> PartitionDescription:
        return cls(**described)


def partition_descriptions(described: list[Mapping[str, Any]]) -> list[PartitionDescription]:
    return [PartitionDescription.of(p) for p in described]


@dataclasses.dataclass(frozen=True, eq=False)
class GroupListing(ReadsAsDict):
    """A group as ListGroups shows it; `state` is Kafka's name ("Stable", "Empty", ...),
    `group_type` "classic" or "consumer" (KIP-848's protocol)."""

    group_id: str
    state: str
    protocol_type: str
    group_type: str = "classic"


@dataclasses.dataclass(frozen=True, eq=False)
class MemberDescription(ReadsAsDict):
    """A member of a group: `assignment` and `metadata` are the protocol's bytes."""

    member_id: str
    client_id: str
    group_instance_id: str | None
    assignment: bytes
    metadata: bytes


@dataclasses.dataclass(frozen=True, eq=False)
class PartitionLag(ReadsAsDict):
    """A group's committed offset of a partition, the partition's end offset (high
    watermark; None if its leader could not say) and the lag between them."""

    committed: int
    end_offset: int | None
    lag: int | None


@dataclasses.dataclass(frozen=True, eq=False)
class ConsumerGroupDescription(ReadsAsDict):
    """A consumer group as `describe_consumer_groups` shows it: its state (Kafka's name),
    protocol type and generation, the assignor chosen and the leader, its members, and each
    partition it committed an offset for with that partition's lag."""

    group_id: str
    state: str
    protocol_type: str
    generation: int
    protocol: str | None  # the chosen assignor
    leader: str | None  # the leader's member id
    members: list[MemberDescription]
    partitions: dict[TopicPartition, PartitionLag]  # every partition with a committed offset


@dataclasses.dataclass(frozen=True, eq=False)
class LogDirDescription(ReadsAsDict):
    """A broker's data directory as `describe_log_dirs` shows it (Kafka's
    LogDirDescription): its path, its error (KAFKA_STORAGE_ERROR while its disk fails and
    it is offline; None online), its volume's total and usable bytes (-1 unknown), and the
    size in bytes of each replica's log in it as of the broker's last offset checkpoint
    (none while offline)."""

    path: str
    error: KafkaError | None
    total_bytes: int
    usable_bytes: int
    replica_sizes: dict[TopicPartition, int]


@dataclasses.dataclass(frozen=True, eq=False)
class ClusterHealth(ReadsAsDict):
    """Kafka's health gauges: the Controller's, and each registered broker's (None for
    one that did not answer)."""

    active_controller_count: int
    offline_partitions_count: int
    brokers: dict[int, BrokerHealth | None]
