"""LogConfig: the per-topic storage settings of a log, with Kafka's names and defaults.

Fields use Python names with units (`segment_ms`); `from_properties` and `to_properties`
speak Kafka's dotted topic-config names (`segment.ms`). Values are checked on
construction, so a `Log` never runs with a nonsensical setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from rayk.errors import InvalidConfigurationError
from rayk.storage.records import HEADER_SIZE_BYTES, TimestampType

DAY_MS = 24 * 60 * 60 * 1000
# The largest batch a log accepts whatever max.message.bytes says: one batch must fit in
# one data plane frame, where it travels between rayk's processes as it is
# (rayk/dataplane/frames.py). A new topic config above it is refused (config.py); one that
# an older version stored is kept, and the log accepts batches up to this.
MAX_MESSAGE_BYTES_LIMIT = 127 * 1024 * 1024

# Kafka topic-config name -> LogConfig field.
PROPERTY_FIELDS = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "segment.index.bytes": "segment_index_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "max.message.bytes": "max_message_bytes",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "message.timestamp.type": "message_timestamp_type",
    "cleanup.policy": "cleanup_policy",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "delete.retention.ms": "delete_retention_ms",
    "remote.storage.enable": "remote_storage_enable",
    "local.retention.ms": "local_retention_ms",
    "local.retention.bytes": "local_retention_bytes",
}
# local.retention.ms / .bytes: Kafka's -2, "the same as retention.ms / retention.bytes".
SAME_AS_RETENTION = -2
CLEANUP_POLICIES = ("compact", "delete")
NO_LIMIT_MS = (1 << 63) - 1  # Kafka's Long.MAX_VALUE: "never"


def normalize_cleanup_policy(raw: str | int) -> str:
    """Kafka's list config: "compact", "delete", both, in any order and spacing, or neither
    (the empty list, which Kafka's list validator lets through and Kafka 4.2 documents:
    no retention and no compaction, every record is kept, as with retention.ms and
    retention.bytes -1). The normal form lists them sorted, comma-separated
    ("compact,delete"; "" for neither)."""
    names = {part.strip().lower() for part in str(raw).split(",") if part.strip()}
    if not names <= set(CLEANUP_POLICIES):
        raise InvalidConfigurationError(
            f"cleanup.policy = {raw!r}: must list compact, delete, both, or neither (empty: keep every record)"
        )
    return ",".join(sorted(names))



@dataclass(frozen=True, slots=True)
class LogConfig:
    """One topic's storage settings, immutable and checked on construction
    (InvalidConfigurationError names the Kafka property). A Log holds one; a replica
    builds it from its topic's configs (`from_properties`, via config.log_config_of). Each
    field's docstring says what its topic config does (the documentation's configuration
    reference is generated from them, docs/hooks.py)."""

    segment_bytes: int = 1 << 30
    """A segment rolls when the next batch would not fit in this many bytes."""
    segment_ms: int = 7 * DAY_MS
    """A segment rolls when its records span longer than this."""
    segment_index_bytes: int = 10 * 1024 * 1024
    """Preallocated size of each segment's index files."""
    index_interval_bytes: int = 4096
    """Bytes of records between offset index entries."""
    max_message_bytes: int = 1048588
    """The largest record batch the topic accepts (at most 127 MiB: a batch travels between rayk's
    processes in one frame)."""
    retention_ms: int = 7 * DAY_MS
    """Segments whose records are all older than this are deleted (with cleanup.policy delete); -1:
    kept forever."""
    retention_bytes: int = -1
    """A partition's log is cut to this many bytes by deleting its oldest segments (with cleanup.policy
    delete); -1: no size limit."""
    flush_messages: int | None = None
    """The log is fsynced every this many records; None (as a topic config, Long.MAX_VALUE): flushing
    is left to the OS (fsync on roll and close)."""
    flush_ms: int | None = None
    """The log is fsynced this long after its last flush; None (Long.MAX_VALUE): left to the OS."""
    message_timestamp_type: TimestampType = TimestampType.CREATE_TIME
    """CreateTime (the producer's timestamp) or LogAppendTime (the leader's clock when it appends)."""
    # Log compaction: log_cleaner.py.
    cleanup_policy: str = "delete"
    """delete (retention only), compact (the log cleaner keeps each key's latest record), both
    (compact,delete), or "" (neither: every record is kept; DeleteRecords needs delete)."""
    min_cleanable_dirty_ratio: float = 0.5
    """A compacted log is cleaned when its dirty bytes are this share of its cleanable bytes."""
    min_compaction_lag_ms: int = 0
    """A record stays uncompacted at least this long."""
    max_compaction_lag_ms: int = NO_LIMIT_MS
    """A record is compacted at most this long after it was written, whatever the dirty ratio."""
    delete_retention_ms: int = DAY_MS
    """Tombstones outlive the clean that first reached them by this long."""
    # Tiered storage (KIP-405): rayk/storage/remote/.
    remote_storage_enable: bool = False
    """Rolled segments are copied to the broker's remote log storage (remote.log.storage.uri) once
    below the high watermark and the last stable offset, and local disk keeps only the local
    retention; fetches below it are served from the remote copy. Needs cleanup.policy delete and
    remote.log.storage.system.enable on the brokers."""
    local_retention_ms: int = SAME_AS_RETENTION
    """With remote.storage.enable, local segments already copied are deleted once all their records
    are older than this; -2: retention.ms. retention.ms still bounds the whole log, local and remote."""
    local_retention_bytes: int = SAME_AS_RETENTION
    """With remote.storage.enable, local segments already copied are deleted while the local log
    without them is still at least this many bytes; -2: retention.bytes."""

    def __post_init__(self) -> None:
        def require(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise InvalidConfigurationError(f"{name} = {getattr(self, PROPERTY_FIELDS[name])!r}: {rule}")

        require(self.segment_bytes >= HEADER_SIZE_BYTES, "segment.bytes", f"must be >= {HEADER_SIZE_BYTES}")
        require(self.segment_ms >= 1, "segment.ms", "must be >= 1")
        require(self.segment_index_bytes >= 12, "segment.index.bytes", "must be >= 12 (one time index entry)")
        require(self.index_interval_bytes >= 0, "index.interval.bytes", "must be >= 0")
        require(self.max_message_bytes >= 0, "max.message.bytes", "must be >= 0")
        require(self.retention_ms >= -1, "retention.ms", "must be >= -1")
        require(self.retention_bytes >= -1, "retention.bytes", "must be >= -1")
        require(self.flush_messages is None or self.flush_messages >= 1, "flush.messages", "must be >= 1")
        require(self.flush_ms is None or self.flush_ms >= 0, "flush.ms", "must be >= 0")
        require(0 <= self.min_cleanable_dirty_ratio <= 1, "min.cleanable.dirty.ratio", "must be in [0, 1]")
        require(self.min_compaction_lag_ms >= 0, "min.compaction.lag.ms", "must be >= 0")
        require(self.max_compaction_lag_ms >= 1, "max.compaction.lag.ms", "must be >= 1")
        require(self.delete_retention_ms >= 0, "delete.retention.ms", "must be >= 0")
        require(self.local_retention_ms >= SAME_AS_RETENTION, "local.retention.ms", "must be >= -2")
        require(self.local_retention_bytes >= SAME_AS_RETENTION, "local.retention.bytes", "must be >= -2")
        if self.remote_storage_enable:
            # Kafka's rules (LogConfig.validateRemoteStorageRetentionSize/Time, checked for a
            # tiered topic): the local part of a log cannot outlast the whole.
            require(self.retention_ms == -1 or -1 < self.effective_local_retention_ms <= self.retention_ms,
                    "local.retention.ms", f"must be <= retention.ms ({self.retention_ms}) and not -1 while it is not")
            require(self.retention_bytes == -1 or -1 < self.effective_local_retention_bytes <= self.retention_bytes,
                    "local.retention.bytes",
                    f"must be <= retention.bytes ({self.retention_bytes}) and not -1 while it is not")
        object.__setattr__(self, "message_timestamp_type", TimestampType(self.message_timestamp_type))
        object.__setattr__(self, "cleanup_policy", normalize_cleanup_policy(self.cleanup_policy))
        if self.remote_storage_enable and self.compacts:  # Kafka's rule, as its message says
            raise InvalidConfigurationError(
                f"remote.storage.enable = true: remote log storage is only supported for topics with "
                f"cleanup.policy=delete, not {self.cleanup_policy!r}"
            )

    @property
    def effective_local_retention_ms(self) -> int:
        """local.retention.ms, or retention.ms where it is -2."""
        return self.retention_ms if self.local_retention_ms == SAME_AS_RETENTION else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        """local.retention.bytes, or retention.bytes where it is -2."""
        return self.retention_bytes if self.local_retention_bytes == SAME_AS_RETENTION else self.local_retention_bytes

    def local_retention(self) -> LogConfig:
        """This config with the local retention as its retention: what a tiered log's local
        segments are held to (log_retention.py), once copied."""
        return replace(self, retention_ms=self.effective_local_retention_ms,
                       retention_bytes=self.effective_local_retention_bytes,
                       local_retention_ms=SAME_AS_RETENTION, local_retention_bytes=SAME_AS_RETENTION)

    @property
    def compacts(self) -> bool:
        """Whether the log cleaner keeps only each key's latest record (cleanup.policy compact)."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def deletes(self) -> bool:
        """Whether retention deletes old segments (cleanup.policy delete)."""
        return "delete" in self.cleanup_policy.split(",")

    @property
    def roll_ms(self) -> int:
        """How long a segment may take records: segment.ms, and for a compacted log at most
        max.compaction.lag.ms too, since the active segment is never cleaned (KIP-354)."""
        return min(self.segment_ms, self.max_compaction_lag_ms) if self.compacts else self.segment_ms

    @classmethod
    def from_properties(cls, props: Mapping[str, str | int], base: LogConfig | None = None) -> LogConfig:
        """Builds a config from Kafka topic-config names, over `base` (defaults if None)."""
        changes: dict[str, object] = {}
        for name, raw in props.items():
            if name not in PROPERTY_FIELDS:
                raise InvalidConfigurationError(f"unknown log config {name!r}; known: {', '.join(PROPERTY_FIELDS)}")
            field = PROPERTY_FIELDS[name]
            try:
                if field == "message_timestamp_type":
                    changes[field] = TimestampType.from_name(raw)
                elif field == "cleanup_policy":
                    changes[field] = normalize_cleanup_policy(raw)
                elif field == "min_cleanable_dirty_ratio":
                    changes[field] = float(raw)
                elif field == "remote_storage_enable":
                    changes[field] = _parse_bool(name, raw)
                else:
                    value = int(raw)
                    # Kafka spells "no limit" for flush.* as Long.MAX_VALUE.
                    changes[field] = None if field.startswith("flush_") and value >= NO_LIMIT_MS else value
            except (TypeError, ValueError) as e:
                raise InvalidConfigurationError(f"{name} = {raw!r}: {e}") from None
        return replace(base or cls(), **changes)

    def to_properties(self) -> dict[str, str]:
        values = asdict(self)
        out = {}
        for name, field in PROPERTY_FIELDS.items():
            value = values[field]
            if field == "message_timestamp_type":
                value = "LogAppendTime" if value == TimestampType.LOG_APPEND_TIME else "CreateTime"
            elif value is None:
                value = NO_LIMIT_MS
            elif isinstance(value, bool):
                value = "true" if value else "false"
            out[name] = str(value)
        return out


def _parse_bool(name: str, raw: str | int | bool) -> bool:
    """Kafka's boolean configs: true or false, in any case."""
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise InvalidConfigurationError(f"{name} = {raw!r}: must be true or false")
    return text == "true"
