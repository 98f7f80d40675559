"""ProducerConfig: a Producer's settings, by kafka-python's names, checked once.

`cluster.producer(**settings)` (and `Producer(cluster, **settings)`) takes these names as
keyword arguments and builds one ProducerConfig from them; the Producer then reads its
settings from it, and pickles it to rebuild itself in another process. Each field's
meaning is in the Producer's class docstring. A setting out of range raises
InvalidClientConfigError (INVALID_CONFIG, and a ValueError) when the config is made, before
anything calls the cluster; an unknown codec raises UnsupportedCompressionTypeError.
Immutable, so one config may be shared between threads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from rayk.client.idempotence import ProducerIdentity
from rayk.client.metadata import DEFAULT_METADATA_MAX_AGE_MS
from rayk.dataplane.frames import MAX_RECORDS_BYTES
from rayk.errors import InvalidClientConfigError
from rayk.storage.compression import CompressionType
from rayk.storage.records import HEADER_SIZE_BYTES

# Not Kafka's 16 KiB: over Ray calls (a batch was an actor call, ~3 with its followers'
# fetches) send() of 100 B records with acks=all, RF=3 ran at 28k rec/s with 16 KiB
# batches and 160k with 1 MiB on the 2-core benchmark machine. Over the data plane,
# producer_settings_bench on 2026-11-29 still gave 16 KiB 167k-178k rec/s flat out against
# 192k-214k for 1 MiB (small batches queued behind a request in flight go merged).
DEFAULT_BATCH_SIZE = 1_048_576
# Kafka's default (KIP-1030). Over Ray calls rayk lingered 10 ms: each batch cost ~3 actor
# calls of ~2 ms of CPU, and at 5 ms that alone kept the 2-core machine 85-95% busy. Over
# the data plane a batch costs no Ray call, and producer_settings_bench with 5 and 10
# alternating in one run (4 pairs, 1 MiB batches, 2026-11-29) gave at 6,000 rec/s a p50
# of 4.9-5.8 ms against 8.2-8.4 and a p99 of 12.5-18.9 against 19.4-21.8, for 2-10 more
# points of CPU busy; flat out 95k-114k rec/s against 102k-116k (the 5s won one pair).
DEFAULT_LINGER_MS = 5


def acks_value(acks: str | int) -> int:
    """`acks` as the number a produce request carries: 0, 1 or -1 ("all")."""
    if acks in ("all", -1, "-1"):
        return -1
    if acks in (0, 1, "0", "1"):
        return int(acks)
    raise InvalidClientConfigError(f"acks must be 0, 1 or 'all' (-1), got {acks!r}")


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """A Producer's settings (kafka-python's names, Kafka's defaults unless said), checked
    on construction; see the Producer's docstring for what each does."""

    acks: str | int = "all"
    linger_ms: int = DEFAULT_LINGER_MS
    batch_size: int = DEFAULT_BATCH_SIZE  # bytes
    compression_type: str | None = None
    key_serializer: Any = None
    value_serializer: Any = None
    max_in_flight_requests_per_connection: int = 5
    request_timeout_ms: int = 30_000
    delivery_timeout_ms: int = 120_000
    retry_backoff_ms: int = 100
    max_request_size: int = 1_048_576  # bytes
    buffer_memory: int = 33_554_432  # bytes
    max_block_ms: int = 60_000
    metadata_max_age_ms: int = DEFAULT_METADATA_MAX_AGE_MS
    identity: ProducerIdentity | None = None  # rayk's own: resume a producer id (resumable_write)
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        if min(self.max_in_flight_requests_per_connection, self.batch_size, self.buffer_memory, self.request_timeout_ms) < 1:
            raise InvalidClientConfigError(
                "max_in_flight_requests_per_connection, batch_size, buffer_memory and request_timeout_ms must be >= 1"
            )
        if self.max_request_size > MAX_RECORDS_BYTES:
            raise InvalidClientConfigError(
                f"max_request_size ({self.max_request_size}) must be <= {MAX_RECORDS_BYTES}: a request travels to its "
                "replica in one data plane frame"
            )
        if min(self.linger_ms, self.max_block_ms, self.retry_backoff_ms) < 0:
            raise InvalidClientConfigError("linger_ms, max_block_ms and retry_backoff_ms must be >= 0")
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:  # Kafka's rule
            raise InvalidClientConfigError(
                f"delivery_timeout_ms ({self.delivery_timeout_ms}) must be >= linger_ms + request_timeout_ms"
                f" ({self.linger_ms} + {self.request_timeout_ms})"
            )
        acks_value(self.acks)
        if self.transactional_id is not None and self.identity is not None:
            raise InvalidClientConfigError("a producer has a transactional_id or an identity to resume, not both")
        CompressionType.from_name(self.compression_type or "none")  # UnsupportedCompressionTypeError

    @property
    def acks_number(self) -> int:
        """`acks` as a produce request carries it: 0, 1 or -1."""
        return acks_value(self.acks)

    @property
    def compression(self) -> CompressionType:
        return CompressionType.from_name(self.compression_type or "none")

    @property
    def max_record_bytes(self) -> int:
        """The largest record body a batch may hold: one batch is one request, and must fit
        in the buffer."""
        return min(self.max_request_size, self.buffer_memory) - HEADER_SIZE_BYTES

    def settings(self) -> dict[str, Any]:
        """The keyword arguments that make this config (`Producer(cluster, **settings)`)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


DEFAULTS = ProducerConfig()  # the Producer's keyword defaults
