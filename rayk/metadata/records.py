"""The metadata log's record kinds: one frozen dataclass per kind, each with a version.

This module owns what a metadata record is and how it is stored, as Kafka's
`metadata/src/main/resources/common/metadata/*.json` schemas and `MetadataRecordSerde`
do for KRaft. Each kind names itself (`KIND`, stored as `type`) and says which version of
its fields it writes (`VERSION`, stored as `version`). Every field is a plain value
msgpack stores as it is (str, int, float, bool, bytes, None, tuples, a str -> str dict).

Versions:
- Version 0 is a record written before records had versions (rayk before the metadata
  snapshots): the same fields, no `version` key, and some fields that came later absent.
  It reads with those fields at their defaults, which are exactly what the old code
  assumed for them (`record.get(...)`), so a cluster's metadata upgrades in place: the
  log is not rewritten, old records are read as what they meant.
- A new field gets a default and the kind's VERSION goes up by one. A record of a newer
  version than this code knows, of an unknown kind, or with fields its kind and version
  do not have is refused (CORRUPT_MESSAGE / UNSUPPORTED_VERSION), never skipped: skipping
  one would silently build a different cluster.

`pack` gives the bytes the log and snapshots store (the `encode`d map in msgpack);
`unpack` reads them back.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

import msgpack

from rayk.acls import AclBinding
from rayk.metadata.elections import PartitionState
from rayk.errors import CorruptRecordError, UnsupportedVersionError
from rayk.quotas import QuotaEntity
from rayk.scram import ScramCredential

__all__ = [
    "AclRecord",
    "ClientQuotaRecord",
    "ClusterIdRecord",
    "DecommissionBrokerRecord",
    "FenceBrokerRecord",
    "MetadataRecord",
    "PartitionRecord",
    "ProducerIdsRecord",
    "RECORD_KINDS",
    "RegisterBrokerRecord",
    "RemoveAclRecord",
    "RemoveScramCredentialRecord",
    "RemoveTopicRecord",
    "ScramCredentialRecord",
    "TopicConfigsRecord",
    "TopicRecord",
    "UnregisterBrokerRecord",
    "decode",
    "encode",
    "pack",
    "unpack",
]


class MetadataRecord:
    """Base of every record kind (a frozen dataclass with KIND and VERSION)."""

    __slots__ = ()
    KIND: ClassVar[str]
    VERSION: ClassVar[int]


@dataclass(frozen=True, slots=True)
class ClusterIdRecord(MetadataRecord):
    """The cluster id, written once, first."""

    KIND = "cluster"
    VERSION = 1
    cluster_id: str


@dataclass(frozen=True, slots=True)
class RegisterBrokerRecord(MetadataRecord):
    """A broker (re)started: its process (incarnation), its data directory's id and whether
    its last shutdown was clean. It is unfenced. Its broker epoch is the record's offset
    in the log; a snapshot, which has no offsets of its own, stores it in `epoch`."""

    KIND = "register_broker"
    VERSION = 1
    broker_id: int
    node_id: str
    incarnation_id: str = ""  # absent in the oldest records
    directory_id: str = ""
    clean_shutdown: bool = True
    epoch: int = -1  # -1: the record's offset

    def __post_init__(self) -> None:
        assert self.epoch >= -1, f"a broker epoch is an offset or -1, got {self.epoch}"


@dataclass(frozen=True, slots=True)
class FenceBrokerRecord(MetadataRecord):
    """A broker lost its session (fenced) or came back."""

    KIND = "fence_broker"
    VERSION = 1
    broker_id: int
    fenced: bool


@dataclass(frozen=True, slots=True)
class DecommissionBrokerRecord(MetadataRecord):
    """A broker is being taken out of the cluster (`decommissioning`), or no longer is: it
    takes no new replicas, its replicas move to the others, and once it holds none it is
    stopped and unregistered."""

    KIND = "decommission_broker"
    VERSION = 1
    broker_id: int
    decommissioning: bool


@dataclass(frozen=True, slots=True)
class UnregisterBrokerRecord(MetadataRecord):
    """A broker left the cluster (Kafka's UnregisterBrokerRecord): it holds no replica, its
    registration is gone, and its id may be given to a new broker."""

    KIND = "unregister_broker"
    VERSION = 1
    broker_id: int


@dataclass(frozen=True, slots=True)
class TopicRecord(MetadataRecord):
    """A topic was created: its name, its id (a Kafka-style UUID, 22 characters of URL-safe
    base64) and the configs set on it (what is not named is at its default)."""

    KIND = "topic"
    VERSION = 1
    name: str
    topic_id: str
    configs: dict[str, str]


@dataclass(frozen=True, slots=True)
class TopicConfigsRecord(MetadataRecord):
    """A topic's configs, all of them (what is not named is at its default)."""

    KIND = "topic_configs"
    VERSION = 1
    name: str
    configs: dict[str, str]


@dataclass(frozen=True, slots=True)
class RemoveTopicRecord(MetadataRecord):
    """A topic was deleted, with its partitions and configs."""

    KIND = "remove_topic"
    VERSION = 1
    name: str


@dataclass(frozen=True, slots=True)
class PartitionRecord(MetadataRecord):
    """The whole state of one partition, created or changed (see `elections`)."""

    KIND = "partition"
    VERSION = 1
    topic: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    recovering: tuple[int, ...] = ()  # absent in records older than KIP-966's recovery
    adding: tuple[int, ...] = ()  # and older than reassignments
    removing: tuple[int, ...] = ()
    eligible: tuple[int, ...] = ()  # and older than KIP-966's ELR

    @classmethod
    def of(cls, topic: str, partition: int, state: PartitionState) -> PartitionRecord:
        return cls(topic, partition, state.replicas, state.isr, state.leader, state.leader_epoch,
                   state.partition_epoch, state.recovering, state.adding, state.removing, state.eligible)

    @property
    def state(self) -> PartitionState:
        return PartitionState(self.replicas, self.isr, self.leader, self.leader_epoch, self.partition_epoch,
                              self.recovering, self.adding, self.removing, self.eligible)


@dataclass(frozen=True, slots=True)
class ProducerIdsRecord(MetadataRecord):
    """A block of idempotent-producer ids was handed out; `next` was never handed out."""

    KIND = "producer_ids"
    VERSION = 1
    next: int


@dataclass(frozen=True, slots=True)
class _AclBindingFields(MetadataRecord):
    """An ACL binding's fields (rayk/acls.py), as AclRecord and RemoveAclRecord store them."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    @classmethod
    def of(cls, binding: AclBinding):
        return cls(**binding.to_record())

    @property
    def binding(self) -> AclBinding:
        return AclBinding(self.resource_type, self.resource_name, self.pattern_type, self.principal, self.host,
                          self.operation, self.permission_type)


@dataclass(frozen=True, slots=True)
class AclRecord(_AclBindingFields):
    """An ACL binding was created."""

    KIND = "acl"
    VERSION = 1


@dataclass(frozen=True, slots=True)
class RemoveAclRecord(_AclBindingFields):
    """An ACL binding was deleted."""

    KIND = "remove_acl"
    VERSION = 1


@dataclass(frozen=True, slots=True)
class ScramCredentialRecord(MetadataRecord):
    """A user's SCRAM credential for one mechanism (never a password) was set."""

    KIND = "scram_credential"
    VERSION = 1
    user: str
    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def of(cls, user: str, credential: ScramCredential) -> ScramCredentialRecord:
        return cls(user, credential.mechanism, credential.salt, credential.stored_key, credential.server_key,
                   credential.iterations)

    @property
    def credential(self) -> ScramCredential:
        return ScramCredential(self.mechanism, self.salt, self.stored_key, self.server_key, self.iterations)


@dataclass(frozen=True, slots=True)
class RemoveScramCredentialRecord(MetadataRecord):
    """A user's SCRAM credential for one mechanism was deleted."""

    KIND = "remove_scram_credential"
    VERSION = 1
    user: str
    mechanism: str


@dataclass(frozen=True, slots=True)
class ClientQuotaRecord(MetadataRecord):
    """One quota key of a user / client-id entity set to a value, or removed (None)."""

    KIND = "client_quota"
    VERSION = 1
    entity: tuple[tuple[str, str | None], ...]  # (entity type, name or None for the default)
    key: str
    value: float | None

    @classmethod
    def of(cls, entity: QuotaEntity, key: str, value: float | None) -> ClientQuotaRecord:
        return cls(tuple((t, n) for t, n in entity.to_record()), key, None if value is None else float(value))

    @property
    def quota_entity(self) -> QuotaEntity:
        return QuotaEntity.from_record(self.entity)


RECORD_KINDS: dict[str, type[MetadataRecord]] = {
    cls.KIND: cls
    for cls in (
        ClusterIdRecord, RegisterBrokerRecord, FenceBrokerRecord, TopicRecord, TopicConfigsRecord,
        RemoveTopicRecord, PartitionRecord, ProducerIdsRecord, AclRecord, RemoveAclRecord,
        ScramCredentialRecord, RemoveScramCredentialRecord, ClientQuotaRecord, DecommissionBrokerRecord,
        UnregisterBrokerRecord,
    )
}
_FIELD_NAMES = {cls: {f.name for f in fields(cls)} for cls in RECORD_KINDS.values()}
_REQUIRED = {cls: {f.name for f in fields(cls) if f.default is MISSING} for cls in RECORD_KINDS.values()}


def encode(record: MetadataRecord) -> dict[str, Any]:
    """The map the metadata log and snapshots store."""
    out: dict[str, Any] = {"type": record.KIND, "version": record.VERSION}
    for name in _FIELD_NAMES[type(record)]:
        out[name] = getattr(record, name)
    return out


def pack(record: MetadataRecord) -> bytes:
    """The record's stored bytes: its `encode`d map in msgpack (tuples become arrays)."""
    return msgpack.packb(encode(record))


def unpack(data: bytes) -> MetadataRecord:
    """The record stored as `data`; arrays read as tuples, as the records hold them."""
    try:
        stored = msgpack.unpackb(data, use_list=False)
    except (ValueError, TypeError) as e:  # msgpack's errors; TypeError: a record without a value
        raise CorruptRecordError(f"a metadata record is not msgpack: {e}") from e
    return decode(stored)


def decode(stored: Any) -> MetadataRecord:
    """The record a stored map holds (its arrays as tuples); CORRUPT_MESSAGE or
    UNSUPPORTED_VERSION if this code cannot read it as what it was written as."""
    if not isinstance(stored, dict) or not isinstance(stored.get("type"), str):
        raise CorruptRecordError(f"a metadata record is a map with a string 'type', got {stored!r:.200}")
    values = dict(stored)  # stored stays as it was
    kind = values.pop("type")
    version = values.pop("version", 0)
    cls = RECORD_KINDS.get(kind)
    if cls is None:  # a well-formed record of a kind added later: a newer rayk wrote it
        raise UnsupportedVersionError(f"unknown metadata record kind {kind!r}: a newer rayk wrote it; upgrade rayk")
    if type(version) is not int or version < 0:
        raise CorruptRecordError(f"metadata record {kind!r} has an invalid version {version!r}")
    if version > cls.VERSION:
        raise UnsupportedVersionError(
            f"metadata record {kind!r} is version {version}; this rayk reads up to {cls.VERSION}: upgrade rayk"
        )
    if values.keys() != _FIELD_NAMES[cls] and (values.keys() - _FIELD_NAMES[cls] or _REQUIRED[cls] - values.keys()):
        unknown, missing = values.keys() - _FIELD_NAMES[cls], _REQUIRED[cls] - values.keys()
        raise CorruptRecordError(
            f"metadata record {kind!r} v{version}: unknown fields {sorted(unknown)}, missing {sorted(missing)}"
        )
    try:
        return cls(**values)
    except (TypeError, AssertionError) as e:
        raise CorruptRecordError(f"metadata record {kind!r} v{version} does not parse: {e}") from e
