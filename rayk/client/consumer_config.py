"""ConsumerConfig: a Consumer's settings, by kafka-python's names, checked once.

`cluster.consumer(*topics, **settings)` (and `Consumer(cluster, *topics, **settings)`)
takes these names as keyword arguments and builds one ConsumerConfig from them; the
Consumer and its parts (Fetcher, Positions, the group membership) read their settings from
it. Each field's meaning is in the Consumer's class docstring. A setting out of range or
not one of its choices raises InvalidClientConfigError (INVALID_CONFIG, and a ValueError)
when the config is made, before anything calls the cluster. Immutable, so one config may be
shared between threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayk.client.metadata import DEFAULT_METADATA_MAX_AGE_MS
from rayk.dataplane.frames import READ_COMMITTED, READ_UNCOMMITTED
from rayk.errors import InvalidClientConfigError

AUTO_OFFSET_RESETS = ("earliest", "latest", "none")
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
GROUP_PROTOCOLS = ("classic", "consumer")


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A Consumer's settings (kafka-python's names, Kafka's defaults unless said), checked
    on construction; see the Consumer's docstring for what each does."""

    group_id: str | None = None
    client_id: str = "rayk-consumer"
    auto_offset_reset: str = "latest"
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    max_partition_fetch_bytes: int = 1_048_576
    max_poll_records: int = 500
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    request_timeout_ms: int = 30_000
    default_api_timeout_ms: int = 60_000
    retry_backoff_ms: int = 100
    metadata_max_age_ms: int = DEFAULT_METADATA_MAX_AGE_MS
    partition_assignment_strategy: tuple[str, ...] = ("range", "roundrobin")
    key_deserializer: Any = None
    value_deserializer: Any = None
    consumer_timeout_ms: float = float("inf")
    isolation_level: str = "read_uncommitted"
    group_protocol: str = "classic"
    group_remote_assignor: str | None = None
    group_instance_id: str | None = None

    def __post_init__(self) -> None:
        if self.auto_offset_reset not in AUTO_OFFSET_RESETS:
            raise InvalidClientConfigError(
                f"auto_offset_reset must be 'earliest', 'latest' or 'none', got {self.auto_offset_reset!r}"
            )
        if self.isolation_level not in ISOLATION_LEVELS:
            raise InvalidClientConfigError(
                f"isolation_level must be 'read_uncommitted' or 'read_committed', got {self.isolation_level!r}"
            )
        if min(self.request_timeout_ms, self.default_api_timeout_ms, self.max_poll_records) < 1 or self.retry_backoff_ms < 0:
            raise InvalidClientConfigError(
                "request_timeout_ms, default_api_timeout_ms and max_poll_records must be >= 1, retry_backoff_ms >= 0"
            )
        if self.group_protocol not in GROUP_PROTOCOLS:
            raise InvalidClientConfigError(f"group_protocol must be 'classic' or 'consumer', got {self.group_protocol!r}")
        if self.group_instance_id is not None and (self.group_id is None or not self.group_instance_id):
            raise InvalidClientConfigError("group_instance_id (static membership) needs a group_id, and may not be empty")

    @property
    def isolation(self) -> int:
        """`isolation_level` as a fetch carries it (READ_UNCOMMITTED, READ_COMMITTED)."""
        return READ_COMMITTED if self.isolation_level == "read_committed" else READ_UNCOMMITTED

    @property
    def auto_commits(self) -> bool:
        """Whether consumed positions are committed on their own (only in a group)."""
        return self.enable_auto_commit and self.group_id is not None


DEFAULTS = ConsumerConfig()  # the Consumer's keyword defaults
