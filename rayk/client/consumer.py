"""Consumer: reads partitions from their leader replicas, alone (`assign`) or as a member
of a consumer group (`subscribe` / `group_id`), in kafka-python's shape.

Fetching is a pipeline (Fetcher): every assigned partition has at most one fetch in
flight to its leader, and the next one is issued as soon as one returns, so the following
records arrive while the application is still processing the current ones. `poll` hands
back at most `max_poll_records` records, advancing the positions; `poll_batch` hands
back the same records as one Arrow RecordBatch per partition, decoded without a Python
object per record (the columnar API, for Ray Data, Spark and numpy users).

`poll(timeout_ms)` never blocks past its timeout (KIP-266): everything it starts (fetches,
the group's JoinGroup / SyncGroup, offset lookups, auto-commits) is a call whose
ObjectRef it keeps, or a fetch over the data plane whose future it keeps, and it waits
for the first of them (calls.ReadyWaiter) within its remaining time, picking up what finished at the next pass or the next poll. Every such call also
has a deadline (`request_timeout_ms`, plus `fetch_max_wait_ms` for fetches) after which it
is cancelled and retried. Blocking methods (`position`, `committed`, `commit`,
`end_offsets`, `offsets_for_times`, `seek_to_beginning`, ...) retry within
`default_api_timeout_ms`, then raise KafkaTimeoutError. No Ray exception reaches the
caller: errors are rayk's typed KafkaError subclasses.

Positions start from the group's committed offset, else from `auto_offset_reset`
("earliest" / "latest"; "none" raises OFFSET_OUT_OF_RANGE). A position that falls out
of the log (retention deleted it) is reset the same way. With `enable_auto_commit` the
consumed positions are committed every `auto_commit_interval_ms` (without waiting),
before a rebalance revokes the partitions (waiting for it, without blocking `poll`)
and on close. Iterating over the consumer hands out one record at a time and moves the
position past each record as it is handed out, so a loop that stops early commits only
what it received (kafka-python's iterator).

The Consumer composes its parts and runs `poll`'s loop: the settings are a ConsumerConfig
(consumer_config.py), the fetches the Fetcher's, the positions and their lookups
Positions' (positions.py), the commits the CommitManager's (commit_manager.py), the group
protocol a GroupMember's or a ConsumerProtocolMember's.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from rayk.client import calls
from rayk.client.commit_manager import CommitManager, commit_payload
from rayk.client.consumer_config import DEFAULTS, ConsumerConfig
from rayk.client.consumer_protocol_member import ConsumerProtocolMember
from rayk.client.fetcher import FetchedChunk, Fetcher
from rayk.client.group_member import GroupMember
from rayk.client.metadata import MetadataCache
from rayk.client.positions import EARLIEST, LATEST, Positions
from rayk.client.serializers import deserializer
from rayk.client.transactions import ConsumerGroupMetadata
from rayk.client.types import ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from rayk.dataplane.frames import READ_COMMITTED
from rayk.errors import InvalidGroupIdError, KafkaError

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_MS = 30_000  # Kafka's default for close()


class Consumer:
    """Reads records from a rayk cluster (kafka-python's KafkaConsumer); make one with
    `cluster.consumer(*topics, **settings)`. One thread at a time. Settings, by
    kafka-python's names:

    - `group_id` (None): the consumer group; without one, `assign` partitions.
    - `client_id` ("rayk-consumer"): shown in the group's description.
    - `auto_offset_reset` ("latest"): where a partition without a committed offset
      starts: "earliest", "latest", or "none" (OffsetOutOfRangeError).
    - `enable_auto_commit` (True) every `auto_commit_interval_ms` (5,000 ms).
    - `fetch_min_bytes` (1 byte), `fetch_max_wait_ms` (500 ms): a fetch waits at the
      leader up to `fetch_max_wait_ms` for `fetch_min_bytes`.
    - `isolation_level` ("read_uncommitted"): "read_committed" reads only below the last
      stable offset and never returns a record of an aborted transaction; its end offsets
      (`end_offsets`, a "latest" reset) are the LSO.
    - `max_partition_fetch_bytes` (1 MiB, bytes): what one fetch brings per partition.
    - `max_poll_records` (500): records per `poll`.
    - `session_timeout_ms` (10,000 ms), `heartbeat_interval_ms` (3,000 ms),
      `max_poll_interval_ms` (300,000 ms): group membership, as in Kafka.
    - `request_timeout_ms` (30,000 ms): one call, then it is retried.
    - `default_api_timeout_ms` (60,000 ms): bounds each blocking method.
    - `retry_backoff_ms` (100 ms), `metadata_max_age_ms` (300,000 ms).
    - `partition_assignment_strategy` (("range", "roundrobin")): also "sticky",
      "cooperative-sticky".
    - `group_protocol` ("classic"): "consumer" joins with KIP-848's consumer group
      protocol: the coordinator assigns (`group_remote_assignor`, None: the coordinator's
      "uniform"; or "range"), partitions move without a stop-the-world rebalance (only
      those that change owner are revoked), and the session and heartbeat times are the
      brokers' (`session_timeout_ms`, `heartbeat_interval_ms` and
      `partition_assignment_strategy` are the classic protocol's).
    - `group_instance_id` (None): a static member (Kafka's group.instance.id), with either
      protocol: `close` leaves its partitions assigned until its session times out, and a
      consumer made with the same instance id, in this process or another (a Ray actor
      that Ray restarted), takes them back with no rebalance of the others. A consumer
      whose instance id another took is fenced: `poll` raises FencedInstanceIdError.
    - `key_deserializer`, `value_deserializer` (None: bytes): "msgpack", "str", "bytes"
      or a callable.
    - `consumer_timeout_ms` (infinite): iteration stops after waiting this long for a record.

    Errors are rayk's typed KafkaError subclasses (rayk.errors): blocking methods raise
    KafkaTimeoutError past `default_api_timeout_ms`; `commit` raises the coordinator's
    error (UnknownMemberIdError, IllegalGenerationError, RebalanceInProgressError, ...);
    a partition without a committed offset under `auto_offset_reset="none"` raises
    OffsetOutOfRangeError. Misuse (subscribe without a group_id, seek of a partition not
    assigned) raises ValueError; settings out of range InvalidClientConfigError (a ValueError;
    rayk.client.consumer_config).
    """

    def __init__(
        self,
        cluster: Any,
        *topics: str,
        group_id: str | None = DEFAULTS.group_id,
        client_id: str = DEFAULTS.client_id,
        auto_offset_reset: str = DEFAULTS.auto_offset_reset,
        enable_auto_commit: bool = DEFAULTS.enable_auto_commit,
        auto_commit_interval_ms: int = DEFAULTS.auto_commit_interval_ms,
        fetch_min_bytes: int = DEFAULTS.fetch_min_bytes,
        fetch_max_wait_ms: int = DEFAULTS.fetch_max_wait_ms,
        max_partition_fetch_bytes: int = DEFAULTS.max_partition_fetch_bytes,
        max_poll_records: int = DEFAULTS.max_poll_records,
        session_timeout_ms: int = DEFAULTS.session_timeout_ms,
        heartbeat_interval_ms: int = DEFAULTS.heartbeat_interval_ms,
        max_poll_interval_ms: int = DEFAULTS.max_poll_interval_ms,
        request_timeout_ms: int = DEFAULTS.request_timeout_ms,
        default_api_timeout_ms: int = DEFAULTS.default_api_timeout_ms,
        retry_backoff_ms: int = DEFAULTS.retry_backoff_ms,
        metadata_max_age_ms: int = DEFAULTS.metadata_max_age_ms,
        partition_assignment_strategy: tuple[str, ...] = DEFAULTS.partition_assignment_strategy,
        key_deserializer: Any = DEFAULTS.key_deserializer,
        value_deserializer: Any = DEFAULTS.value_deserializer,
        consumer_timeout_ms: float = DEFAULTS.consumer_timeout_ms,
        isolation_level: str = DEFAULTS.isolation_level,
        group_protocol: str = DEFAULTS.group_protocol,
        group_remote_assignor: str | None = DEFAULTS.group_remote_assignor,
        group_instance_id: str | None = DEFAULTS.group_instance_id,
    ) -> None:
        config = ConsumerConfig(
            group_id=group_id,
            client_id=client_id,
            auto_offset_reset=auto_offset_reset,
            enable_auto_commit=enable_auto_commit,
            auto_commit_interval_ms=auto_commit_interval_ms,
            fetch_min_bytes=fetch_min_bytes,
            fetch_max_wait_ms=fetch_max_wait_ms,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            max_poll_records=max_poll_records,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            max_poll_interval_ms=max_poll_interval_ms,
            request_timeout_ms=request_timeout_ms,
            default_api_timeout_ms=default_api_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            metadata_max_age_ms=metadata_max_age_ms,
            partition_assignment_strategy=partition_assignment_strategy,
            key_deserializer=key_deserializer,
            value_deserializer=value_deserializer,
            consumer_timeout_ms=consumer_timeout_ms,
            isolation_level=isolation_level,
            group_protocol=group_protocol,
            group_remote_assignor=group_remote_assignor,
            group_instance_id=group_instance_id,
        )
        self._start(cluster, config, topics)

    def _start(self, cluster: Any, config: ConsumerConfig, topics: tuple[str, ...]) -> None:
        """Builds the consumer's parts from its checked config; subscribes to `topics`."""
        self._config = config
        self._cluster = cluster
        self._metadata = MetadataCache(
            cluster.controller, config.request_timeout_ms, config.retry_backoff_ms, config.metadata_max_age_ms
        )
        self._waiter = calls.ReadyWaiter()
        self._fetcher = Fetcher(
            self._metadata,
            fetch_min_bytes=config.fetch_min_bytes,
            fetch_max_wait_ms=config.fetch_max_wait_ms,
            max_partition_fetch_bytes=config.max_partition_fetch_bytes,
            request_timeout_ms=config.request_timeout_ms,
            retry_backoff_ms=config.retry_backoff_ms,
            key_deserializer=deserializer(config.key_deserializer),
            value_deserializer=deserializer(config.value_deserializer),
            read_committed=config.isolation == READ_COMMITTED,
        )
        self._max_poll_records = config.max_poll_records
        self._api_timeout_ms = config.default_api_timeout_ms
        self._consumer_timeout_s = config.consumer_timeout_ms / 1000
        self._group = self._membership(cluster, config)
        self._positions = Positions(self._metadata, self._group, config)
        self._commits = CommitManager(self._group, config)
        self._subscription: list[str] = []
        self._assignment: list[TopicPartition] = []
        self._paused: set[TopicPartition] = set()  # assigned, but neither fetched nor handed out
        self._closed = False
        if topics:
            self.subscribe(list(topics))

    def _membership(self, cluster: Any, config: ConsumerConfig) -> GroupMember | ConsumerProtocolMember | None:
        """The consumer's side of its group's protocol (None: no group_id)."""
        if config.group_id is None:
            return None
        if config.group_protocol == "consumer":
            return ConsumerProtocolMember(
                cluster.controller, config.group_id, config.client_id, config.max_poll_interval_ms,
                self._revoke_partitions, config.group_remote_assignor, config.request_timeout_ms,
                config.retry_backoff_ms, config.group_instance_id,
            )  # fmt: skip
        return GroupMember(
            cluster.controller,
            config.group_id,
            config.client_id,
            config.session_timeout_ms,
            config.max_poll_interval_ms,
            config.heartbeat_interval_ms,
            tuple(config.partition_assignment_strategy),
            self._metadata.partition_counts_nowait,
            self._revoke,
            config.request_timeout_ms,
            config.retry_backoff_ms,
            config.group_instance_id,
        )

    # ------------------------------------------------------------------ what to read

    def subscribe(self, topics: Iterable[str]) -> None:
        """Reads `topics` as a member of the consumer group (ValueError without a
        `group_id`); the group's errors come from `poll`."""
        if self._group is None:
            raise ValueError("subscribe needs a group_id; use assign() to read partitions without a group")
        self._subscription = sorted(set(topics))
        self._metadata.request_update(self._subscription)  # the leader's assignment needs the counts
        self._group.request_rejoin()

    def unsubscribe(self) -> None:
        self._subscription = []
        self._set_assignment([])
        if self._group is not None:
            self._group.leave()

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Reads exactly these partitions, outside group management (ValueError while
        subscribed)."""
        if self._subscription:
            raise ValueError("this consumer is subscribed; unsubscribe() before assign()")
        self._set_assignment([TopicPartition(*tp) for tp in partitions])

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def pause(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        """Stops fetching these assigned partitions: `poll` hands out none of their records
        until `resume`, and their positions stay where they are (what was fetched ahead
        for them is dropped and fetched again after `resume`). A rebalance that takes a
        partition away forgets that it was paused, as in Kafka."""
        for tp in self._assigned(partitions, "pause"):
            self._paused.add(tp)
            self._forget(tp)

    def resume(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        """Fetches these paused partitions again, from their positions."""
        self._paused.difference_update(self._assigned(partitions, "resume"))

    def paused(self) -> set[TopicPartition]:
        """The partitions paused by `pause`."""
        return set(self._paused)

    def _assigned(self, partitions: Iterable[TopicPartition | tuple[str, int]], what: str) -> list[TopicPartition]:
        tps = [TopicPartition(*tp) for tp in partitions]
        not_assigned = sorted(set(tps) - set(self._assignment))
        if not_assigned:
            raise ValueError(f"cannot {what} partitions not assigned to this consumer: {not_assigned}")
        return tps

    def subscription(self) -> set[str]:
        return set(self._subscription)

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        keep = set(partitions)
        for tp in set(self._assignment) | set(self._positions.offsets):
            if tp not in keep:
                self._fetcher.forget(tp)
                self._positions.drop(tp)
        self._assignment = sorted(keep)
        self._paused &= keep

    def _forget(self, tp: TopicPartition) -> None:
        """Drops what was fetched or is being fetched for `tp` (after a seek or revocation)."""
        self._fetcher.forget(tp)
        self._positions.cancel_lookup(tp)

    def _revoke(self, lost: bool) -> dict[tuple[str, int], tuple[int, str]] | None:
        """The group takes the partitions back (eager rebalance); returns what to commit
        first. Lost partitions (evicted member) are dropped without a commit."""
        offsets = None
        if lost:
            logger.warning("partitions lost (evicted from the group): %s", self._assignment)
        elif self._commits.auto_commits:
            offsets = self._consumed_offsets()
        self._set_assignment([])
        return offsets

    def _revoke_partitions(self, partitions: list[tuple[str, int]], lost: bool) -> dict[tuple[str, int], tuple[int, str]] | None:
        """The group takes some partitions back (the consumer protocol); returns what to
        commit for them first. Lost partitions (the member was removed) are dropped
        without a commit."""
        gone = {TopicPartition(*tp) for tp in partitions}
        offsets = None
        if not lost and self._commits.auto_commits:
            offsets = {tp: o for tp, o in self._consumed_offsets().items() if TopicPartition(*tp) in gone}
        self._set_assignment([tp for tp in self._assignment if tp not in gone])
        return offsets

    # ------------------------------------------------------------------ positions

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Moves the position of an assigned partition (ValueError if it is not assigned);
        a position outside the log is reset by `auto_offset_reset` at the next fetch."""
        tp = TopicPartition(*partition)
        if tp not in self._assignment:
            raise ValueError(f"{tp} is not assigned to this consumer")
        self._forget(tp)
        self._positions.seek(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """`seek` to each partition's log start (all assigned ones if none is named);
        KafkaTimeoutError if a leader does not answer within default_api_timeout_ms."""
        for tp in partitions or self._assignment:
            self.seek(tp, self._positions.list_offset(TopicPartition(*tp), EARLIEST)[0])

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """`seek` to each partition's high watermark (all assigned ones if none is named);
        KafkaTimeoutError as `seek_to_beginning`."""
        for tp in partitions or self._assignment:
            self.seek(tp, self._positions.list_offset(TopicPartition(*tp), LATEST)[0])

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group, generation and member id, for a transactional producer's
        `send_offsets_to_transaction` (Kafka's groupMetadata()); a zombie member's
        transactional commit is then refused (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID)."""
        if self._group is None:
            raise InvalidGroupIdError("a consumer without a group_id has no group metadata")
        return ConsumerGroupMetadata(self._group.group_id, self._group.generation, self._group.member_id)

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record to hand out (looked up if not known yet, within
        default_api_timeout_ms, then KafkaTimeoutError; OffsetOutOfRangeError for a
        partition with no committed offset under auto_offset_reset "none")."""
        tp = TopicPartition(*partition)
        if tp not in self._positions.offsets:
            self._positions.init([tp])
        return self._positions.offsets[tp]

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition. Each is asked of its leader, looked up
        again while it moves, does not exist or has no leader, until default_api_timeout_ms:
        then KafkaTimeoutError (the same for end_offsets and offsets_for_times)."""
        return {TopicPartition(*tp): self._positions.list_offset(TopicPartition(*tp), EARLIEST)[0] for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition: the offset the next committed record gets
        (KafkaTimeoutError as `beginning_offsets`)."""
        return {TopicPartition(*tp): self._positions.list_offset(TopicPartition(*tp), LATEST)[0] for tp in partitions}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """The earliest offset whose timestamp is >= the given one (ms), or None
        (KafkaTimeoutError as `beginning_offsets`)."""
        out = {}
        for tp, ts in timestamps.items():
            offset, found_ts = self._positions.list_offset(TopicPartition(*tp), ts)
            out[TopicPartition(*tp)] = OffsetAndTimestamp(offset, found_ts) if offset >= 0 else None
        return out

    def partitions_for_topic(self, topic: str) -> set[int]:
        """The topic's partition ids; KafkaTimeoutError if it is not found within
        default_api_timeout_ms."""
        return set(range(self._metadata.partition_count(topic, self._api_timeout_ms)))

    # ------------------------------------------------------------------ commits

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None) -> None:
        """Commits the consumed positions (or `offsets`) to the group, durably; raises the
        coordinator's typed error (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, ... once this
        member lost its partitions), or KafkaTimeoutError after default_api_timeout_ms."""
        self._commits.member("commit")  # ValueError without a group_id
        self._commits.commit(self._consumed_offsets() if offsets is None else commit_payload(offsets))

    def commit_async(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None,
        callback: Callable[[dict[TopicPartition, OffsetAndMetadata], KafkaError | None], None] | None = None,
    ) -> concurrent.futures.Future[None]:
        """`commit` without waiting (kafka-python's and Kafka's commitAsync): the consumed
        positions (or `offsets`, as of this call) are committed in the background, in the
        order of the calls. The future's result is None or the typed error `commit` would
        raise; `callback(offsets, error)` runs when it is known (error None on success).
        `close` waits for the commits still under way."""
        self._commits.member("commit_async")  # ValueError without a group_id
        if self._closed:
            raise RuntimeError("the consumer is closed")
        payload = self._consumed_offsets() if offsets is None else commit_payload(offsets)
        return self._commits.commit_async(payload, callback)

    def _consumed_offsets(self) -> dict[tuple[str, int], tuple[int, str]]:
        positions = self._positions.offsets
        return {(tp.topic, tp.partition): (positions[tp], "") for tp in self._assignment if tp in positions}

    def committed(self, partition: TopicPartition, metadata: bool = False) -> int | OffsetAndMetadata | None:
        """The group's committed offset of `partition` (None if it has none); with
        `metadata`, as OffsetAndMetadata with the string committed along (kafka-python's).
        ValueError without a group_id; KafkaTimeoutError if the coordinator does not
        answer within default_api_timeout_ms."""
        self._commits.member("committed")  # ValueError without a group_id
        tp = TopicPartition(*partition)
        if not metadata:
            return self._positions.committed([tp]).get(tp)
        return self.committed_offsets([tp]).get(tp)

    def committed_offsets(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets and metadata of `partitions`, in one lookup (the
        Java consumer's committed(Set)); partitions with no commit are left out."""
        return self._commits.committed(partitions, "committed_offsets")

    # ------------------------------------------------------------------ polling

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records from the assigned partitions, waiting up to `timeout_ms` for the first;
        returns within `timeout_ms` whatever happens (a rebalance, a leader change, a
        leader not answering: retried at the next poll). Raises OffsetOutOfRangeError for
        a position outside the log under auto_offset_reset "none", what a deserializer
        raises, and RuntimeError once closed."""
        limit = max_records or self._max_poll_records
        return self._poll(timeout_ms, lambda: self._fetcher.drain(self._positions.offsets, limit))

    def poll_batch(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, Any]:
        """`poll` in columns: one pyarrow RecordBatch per partition, with the columns of
        Spark's Kafka source (rayk.client.arrow_batches.SCHEMA: key, value, topic,
        partition, offset, timestamp, timestampType, headers), decoded by compiled code
        with no Python object per record. Keys and values are the stored bytes (the
        deserializers apply to `poll` only). Each partition's batch is what one fetch
        brought (up to `max_partition_fetch_bytes`), from its position; `max_records`
        caps the records of all partitions together. Positions, commits and every
        other behaviour are `poll`'s."""
        if max_records is not None and max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        return self._poll(timeout_ms, lambda: self._fetcher.drain_columns(self._positions.offsets, max_records))

    def _poll(self, timeout_ms: int, drain: Callable[[], Any]) -> Any:
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
        now = time.monotonic()
        deadline = now + timeout_ms / 1000
        ready: set[Any] = set()
        while True:
            self._advance(ready, now)
            records = drain()
            if records:
                return records
            now = time.monotonic()
            if now >= deadline:
                return {}
            wait_s = deadline - now
            wake = self._wake_at_s(now)
            if wake is not None:
                wait_s = min(wait_s, wake - now)
            ready = self._waiter.ready(self._pending(), wait_s)
            now = time.monotonic()

    def _advance(self, ready: set[Any], now: float) -> None:
        """Everything poll does besides handing out records; never blocks."""
        if ready:
            self._metadata.collect(ready)
        if self._group is not None:
            assigned = self._group.poll(self._subscription, ready, now)
            if assigned is not None:
                self._set_assignment([TopicPartition(t, p) for t, ps in assigned.items() for p in ps])
        for tp, fetch_offset, result in self._fetcher.collect(ready, now):
            self._out_of_range(tp, fetch_offset, result)
        self._positions.update(ready, now, self._assignment)
        self._commits.maybe_auto_commit(self._consumed_offsets, now)
        fetched = [tp for tp in self._assignment if tp not in self._paused] if self._paused else self._assignment
        self._fetcher.start_fetches(fetched, self._positions.offsets, now)

    def _pending(self) -> list[Any]:
        refs = self._fetcher.pending()
        refs += self._positions.pending()
        if self._group is not None:
            refs += self._group.pending()
        refs += self._metadata.pending()
        return refs

    def _wake_at_s(self, now: float) -> float | None:
        """The next time something is due (a deadline, a backoff, an auto-commit) that no
        ref would wake `poll` for. Times already past were acted on, or wait for a ref."""
        times = [self._fetcher.wake_at_s(self._assignment), self._metadata.wake_at_s()]
        times += self._positions.wake_times(self._assignment)
        if self._group is not None:
            times.append(self._group.wake_at_s())
        if self._commits.auto_commits and self._assignment:
            times.append(self._commits.next_auto_commit_s)
        due = [t for t in times if t is not None and t > now]
        return min(due) if due else None

    def _out_of_range(self, tp: TopicPartition, fetch_offset: int, result: Any) -> None:
        """A fetch at `fetch_offset` was answered OFFSET_OUT_OF_RANGE. At the position, the
        position fell out of the log (retention deleted it): auto_offset_reset. Elsewhere
        it was a fetch ahead of a chunk still buffered, and is stale, as Kafka's consumer
        discards it: those records go out first (the log start may have passed the
        read-ahead after they were fetched), then the partition fetches at its position,
        whose answer resets it if the position is out of range too."""
        if self._positions.offsets.get(tp) != fetch_offset:
            logger.debug("%s: the fetch ahead at %d is out of range; the records before it go first", tp, fetch_offset)
            self._fetcher.hold_read_ahead(tp)
            return
        offset = self._positions.out_of_range_offset(result)  # raises its error under "none"
        self._forget(tp)
        self._positions.offsets[tp] = offset

    # ------------------------------------------------------------------ iteration, lifecycle

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Records one at a time; each moves the position (and what auto-commit commits)
        past itself as it is handed out. Stops after `consumer_timeout_ms` without records."""
        # The records already fetched go out one at a time by compiled code
        # (rayk.client.hand_out), without poll's pass over the group, lookups and fetches,
        # which runs once nothing is buffered at the positions, as Kafka's iterator polls.
        return self._fetcher.hand_out(self._positions.offsets, self._chunks_to_hand_out())

    def _chunks_to_hand_out(self) -> Generator[FetchedChunk, int | None, None]:
        """The fetched chunks the iteration hands out, polling while none is buffered at a
        position; sent how many records each one gave (rayk.client.hand_out's contract)."""
        fetcher, positions = self._fetcher, self._positions.offsets
        idle_since: float | None = None  # since when it has waited for a record
        while True:
            if self._closed:
                raise RuntimeError("the consumer is closed")
            chunk = fetcher.chunk_at_position(positions)
            if chunk is not None:
                if (yield chunk):  # the number of its records handed out
                    idle_since = None
                continue
            if idle_since is None:
                idle_since = time.monotonic()
            # poll's pass without handing anything out: it stops once a chunk is buffered
            waited_ms = int(min(1.0, self._consumer_timeout_s) * 1000)
            if not self._poll(waited_ms, lambda: fetcher.chunk_at_position(positions)):
                if time.monotonic() - idle_since >= self._consumer_timeout_s:
                    return

    def close(self, autocommit: bool = True, timeout_ms: int | None = CLOSE_TIMEOUT_MS) -> None:
        """Waits for the commits of `commit_async` under way, commits the consumed
        positions (if auto-commit is on and `autocommit`), leaves the group and stops the
        heartbeats, within `timeout_ms` in all (None: CLOSE_TIMEOUT_MS, as kafka-python
        allows); a commit or leave that cannot complete in time (the cluster is away) is
        logged, not raised."""
        if self._closed:
            return
        timeout_ms = CLOSE_TIMEOUT_MS if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        self._commits.close(self._consumed_offsets() if autocommit and self._assignment else None, timeout_ms)
        if self._group is not None:
            self._group.close(max(1, int((deadline - time.monotonic()) * 1000)))
        self._fetcher.close()
        self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

