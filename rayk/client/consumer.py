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
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rayk.client import calls
from rayk.client.fetcher import Fetcher
from rayk.client.consumer_protocol_member import ConsumerProtocolMember
from rayk.client.group_member import GroupMember
from rayk.client.metadata import DEFAULT_METADATA_MAX_AGE_MS, STALE_LEADER_ERRORS, MetadataCache
from rayk.client.serializers import deserializer
from rayk.client.transactions import ConsumerGroupMetadata
from rayk.client.types import ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from rayk.dataplane.frames import READ_COMMITTED, READ_UNCOMMITTED
from rayk.errors import InvalidGroupIdError, KafkaError, OffsetOutOfRangeError

logger = logging.getLogger(__name__)

EARLIEST, LATEST = -2, -1
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
    assigned, settings out of range) raises ValueError.
    """

    def __init__(
        self,
        cluster: Any,
        *topics: str,
        group_id: str | None = None,
        client_id: str = "rayk-consumer",
        auto_offset_reset: str = "latest",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        fetch_min_bytes: int = 1,
        fetch_max_wait_ms: int = 500,
        max_partition_fetch_bytes: int = 1_048_576,
        max_poll_records: int = 500,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        max_poll_interval_ms: int = 300_000,
        request_timeout_ms: int = 30_000,
        default_api_timeout_ms: int = 60_000,
        retry_backoff_ms: int = 100,
        metadata_max_age_ms: int = DEFAULT_METADATA_MAX_AGE_MS,
        partition_assignment_strategy: tuple[str, ...] = ("range", "roundrobin"),
        key_deserializer: Any = None,
        value_deserializer: Any = None,
        consumer_timeout_ms: float = float("inf"),
        isolation_level: str = "read_uncommitted",
        group_protocol: str = "classic",
        group_remote_assignor: str | None = None,
        group_instance_id: str | None = None,
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', got {auto_offset_reset!r}")
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(f"isolation_level must be 'read_uncommitted' or 'read_committed', got {isolation_level!r}")
        self._isolation_level = READ_COMMITTED if isolation_level == "read_committed" else READ_UNCOMMITTED
        if min(request_timeout_ms, default_api_timeout_ms, max_poll_records) < 1 or retry_backoff_ms < 0:
            raise ValueError("request_timeout_ms, default_api_timeout_ms and max_poll_records must be >= 1, retry_backoff_ms >= 0")
        self._cluster = cluster
        self._metadata = MetadataCache(cluster.controller, request_timeout_ms, retry_backoff_ms, metadata_max_age_ms)
        self._waiter = calls.ReadyWaiter()
        self._reset = auto_offset_reset
        self._auto_commit = enable_auto_commit and group_id is not None
        self._auto_commit_interval_s = auto_commit_interval_ms / 1000
        self._next_auto_commit_s = time.monotonic() + self._auto_commit_interval_s
        self._fetcher = Fetcher(
            self._metadata,
            fetch_min_bytes=fetch_min_bytes,
            fetch_max_wait_ms=fetch_max_wait_ms,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            key_deserializer=deserializer(key_deserializer),
            value_deserializer=deserializer(value_deserializer),
            read_committed=self._isolation_level == READ_COMMITTED,
        )
        self._max_poll_records = max_poll_records
        self._request_timeout_ms = request_timeout_ms
        self._api_timeout_ms = default_api_timeout_ms
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._consumer_timeout_s = consumer_timeout_ms / 1000
        if group_protocol not in ("classic", "consumer"):
            raise ValueError(f"group_protocol must be 'classic' or 'consumer', got {group_protocol!r}")
        if group_instance_id is not None and (group_id is None or not group_instance_id):
            raise ValueError("group_instance_id (static membership) needs a group_id, and may not be empty")
        self._group: GroupMember | ConsumerProtocolMember | None = None
        if group_id is not None and group_protocol == "consumer":
            self._group = ConsumerProtocolMember(cluster.controller, group_id, client_id, max_poll_interval_ms,
                                                 self._revoke_partitions, group_remote_assignor, request_timeout_ms,
                                                 retry_backoff_ms, group_instance_id)  # fmt: skip
        elif group_id is not None:
            self._group = GroupMember(
                cluster.controller,
                group_id,
                client_id,
                session_timeout_ms,
                max_poll_interval_ms,
                heartbeat_interval_ms,
                tuple(partition_assignment_strategy),
                self._partition_counts_nowait,
                self._revoke,
                request_timeout_ms,
                retry_backoff_ms,
                group_instance_id,
            )
        self._subscription: list[str] = []
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}  # next offset to hand to the application
        self._retry_at_s: dict[TopicPartition, float] = {}  # offset lookups back off
        self._committed_lookup: tuple[calls.Pending, list[TopicPartition]] | None = None
        self._committed_retry_at_s = 0.0
        self._offset_lookups: dict[TopicPartition, calls.Pending] = {}  # ListOffsets for a reset
        self._needs_reset: set[TopicPartition] = set()  # no committed offset: reset by auto_offset_reset
        self._paused: set[TopicPartition] = set()  # assigned, but neither fetched nor handed out
        self._async_commits: concurrent.futures.ThreadPoolExecutor | None = None  # commit_async, in order
        self._last_async_commit: concurrent.futures.Future[None] | None = None
        self._closed = False
        if topics:
            self.subscribe(list(topics))

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

    @property
    def _member(self) -> GroupMember | ConsumerProtocolMember:
        """The group membership, where the caller knows the consumer has a group_id."""
        assert self._group is not None, "only a consumer with a group_id gets here"
        return self._group

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
        for tp in set(self._assignment) | set(self._positions):
            if tp not in keep:
                self._forget(tp)
                self._positions.pop(tp, None)
                self._needs_reset.discard(tp)
                self._retry_at_s.pop(tp, None)
        self._assignment = sorted(keep)
        self._paused &= keep

    def _forget(self, tp: TopicPartition) -> None:
        """Drops what was fetched or is being fetched for `tp` (after a seek or revocation)."""
        self._fetcher.forget(tp)
        lookup = self._offset_lookups.pop(tp, None)
        if lookup is not None:
            calls.cancel(lookup.ref)

    def _revoke(self, lost: bool) -> dict[tuple[str, int], tuple[int, str]] | None:
        """The group takes the partitions back (eager rebalance); returns what to commit
        first. Lost partitions (evicted member) are dropped without a commit."""
        offsets = None
        if lost:
            logger.warning("partitions lost (evicted from the group): %s", self._assignment)
        elif self._auto_commit:
            offsets = self._consumed_offsets()
        self._set_assignment([])
        return offsets

    def _revoke_partitions(self, partitions: list[tuple[str, int]], lost: bool) -> dict[tuple[str, int], tuple[int, str]] | None:
        """The group takes some partitions back (the consumer protocol); returns what to
        commit for them first. Lost partitions (the member was removed) are dropped
        without a commit."""
        gone = {TopicPartition(*tp) for tp in partitions}
        offsets = None
        if not lost and self._auto_commit:
            offsets = {tp: o for tp, o in self._consumed_offsets().items() if TopicPartition(*tp) in gone}
        self._set_assignment([tp for tp in self._assignment if tp not in gone])
        return offsets

    def _partition_counts_nowait(self, topics: list[str]) -> dict[str, int] | None:
        self._metadata.request_update_if_stale(topics)  # how a group's leader sees a topic grow or go
        counts = {t: self._metadata.cached_partition_count(t) for t in topics}
        unknown = [t for t, n in counts.items() if n is None]
        if unknown:  # looked up again (a topic found absent: every ABSENT_TOPIC_RECHECK_MS, to see it come)
            self._metadata.request_update(unknown)
        # A subscribed topic that does not exist (deleted, or not created yet) has nothing
        # to assign, as in Kafka's assignors; once it exists, its count changes and the
        # group's leader rejoins.
        counts = {t: 0 if n is None and self._metadata.known_absent(t) else n for t, n in counts.items()}
        known = {t: n for t, n in counts.items() if n is not None}
        if len(known) < len(counts):
            return None  # never looked up yet: its metadata is on its way
        return known

    # ------------------------------------------------------------------ positions

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Moves the position of an assigned partition (ValueError if it is not assigned);
        a position outside the log is reset by `auto_offset_reset` at the next fetch."""
        tp = TopicPartition(*partition)
        if tp not in self._assignment:
            raise ValueError(f"{tp} is not assigned to this consumer")
        self._forget(tp)
        self._needs_reset.discard(tp)
        self._positions[tp] = offset

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """`seek` to each partition's log start (all assigned ones if none is named);
        KafkaTimeoutError if a leader does not answer within default_api_timeout_ms."""
        for tp in partitions or self._assignment:
            self.seek(tp, self._list_offset(TopicPartition(*tp), EARLIEST)[0])

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """`seek` to each partition's high watermark (all assigned ones if none is named);
        KafkaTimeoutError as `seek_to_beginning`."""
        for tp in partitions or self._assignment:
            self.seek(tp, self._list_offset(TopicPartition(*tp), LATEST)[0])

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
        if tp not in self._positions:
            self._init_positions([tp])
        return self._positions[tp]

    def _list_offset(self, tp: TopicPartition, timestamp_ms: int) -> tuple[int, int]:
        deadline = time.monotonic() + self._api_timeout_ms / 1000

        def make_call() -> Any:
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            return self._metadata.leader(tp.topic, tp.partition, left_ms).list_offset.remote(
                timestamp_ms, self._isolation_level
            )

        return calls.call(
            make_call,
            deadline,
            f"ListOffsets {tp.topic}-{tp.partition}",
            retry_backoff_ms=int(self._retry_backoff_s * 1000),
            on_retriable=lambda e: self._leader_failed(tp, e),
        )

    def _leader_failed(self, tp: TopicPartition, error: KafkaError) -> None:
        if isinstance(error, STALE_LEADER_ERRORS):
            self._metadata.invalidate(tp.topic, tp.partition)

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition. Each is asked of its leader, looked up
        again while it moves, does not exist or has no leader, until default_api_timeout_ms:
        then KafkaTimeoutError (the same for end_offsets and offsets_for_times)."""
        return {TopicPartition(*tp): self._list_offset(TopicPartition(*tp), EARLIEST)[0] for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition: the offset the next committed record gets
        (KafkaTimeoutError as `beginning_offsets`)."""
        return {TopicPartition(*tp): self._list_offset(TopicPartition(*tp), LATEST)[0] for tp in partitions}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """The earliest offset whose timestamp is >= the given one (ms), or None
        (KafkaTimeoutError as `beginning_offsets`)."""
        out = {}
        for tp, ts in timestamps.items():
            offset, found_ts = self._list_offset(TopicPartition(*tp), ts)
            out[TopicPartition(*tp)] = OffsetAndTimestamp(offset, found_ts) if offset >= 0 else None
        return out

    def partitions_for_topic(self, topic: str) -> set[int]:
        """The topic's partition ids; KafkaTimeoutError if it is not found within
        default_api_timeout_ms."""
        return set(range(self._metadata.partition_count(topic, self._api_timeout_ms)))

    def _init_positions(self, partitions: list[TopicPartition]) -> None:
        """Looks positions up, blocking (within default_api_timeout_ms per lookup)."""
        missing = [tp for tp in partitions if tp not in self._positions]
        if not missing:
            return
        committed = self._committed_offsets(missing) if self._group is not None else {}
        for tp in missing:
            if tp in committed:
                self._positions[tp] = committed[tp]
            else:
                self._positions[tp] = self._reset_offset(tp)
            self._needs_reset.discard(tp)

    def _committed_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        found = self._member.committed([(tp.topic, tp.partition) for tp in partitions], self._api_timeout_ms)
        return _committed_positions(partitions, found)

    def _reset_offset(self, tp: TopicPartition) -> int:
        if self._reset == "none":
            raise OffsetOutOfRangeError(f"{tp} has no committed offset and auto_offset_reset is 'none'")
        return self._list_offset(tp, EARLIEST if self._reset == "earliest" else LATEST)[0]

    def _update_positions(self, ready: set[Any], now: float) -> None:
        """Looks up missing positions without blocking: first the group's committed
        offsets, then ListOffsets (auto_offset_reset) for partitions that have none."""
        if self._committed_lookup is not None:
            pending, partitions = self._committed_lookup
            if pending.ref in ready or pending.expired(now):
                self._committed_lookup = None
                try:
                    committed = _committed_positions(partitions, self._member.answer(pending))
                except KafkaError as e:
                    logger.info("committed offsets of %s: %s; retrying", partitions, e)
                    self._committed_retry_at_s = now + self._retry_backoff_s
                else:
                    for tp in partitions:
                        if tp not in self._assignment or tp in self._positions:
                            continue
                        if tp in committed:
                            self._positions[tp] = committed[tp]
                        else:
                            self._needs_reset.add(tp)
        for tp, pending in list(self._offset_lookups.items()):
            if pending.ref not in ready and not pending.expired(now):
                continue
            del self._offset_lookups[tp]
            try:
                offset, _timestamp = pending.result()
            except KafkaError as e:
                self._leader_failed(tp, e)
                self._retry_at_s[tp] = now + self._retry_backoff_s
                continue
            if tp in self._needs_reset:
                self._positions[tp] = offset
                self._needs_reset.discard(tp)
        missing = [tp for tp in self._assignment if tp not in self._positions and tp not in self._needs_reset]
        if missing and self._group is None:
            self._needs_reset.update(missing)
        elif missing and self._committed_lookup is None and now >= self._committed_retry_at_s:
            lookup = self._member.fetch_committed_async([(tp.topic, tp.partition) for tp in missing], now)
            if lookup is not None:
                self._committed_lookup = (lookup, missing)
        for tp in self._needs_reset:
            if tp in self._offset_lookups or self._retry_at_s.get(tp, 0) > now:
                continue
            if self._reset == "none":
                raise OffsetOutOfRangeError(f"{tp} has no committed offset and auto_offset_reset is 'none'")
            leader = self._metadata.leader_nowait(tp.topic, tp.partition)
            if leader is not None:
                ref = leader.list_offset.remote(EARLIEST if self._reset == "earliest" else LATEST)
                self._offset_lookups[tp] = calls.Pending(ref, now + self._request_timeout_ms / 1000, f"ListOffsets {tp}")

    # ------------------------------------------------------------------ commits

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None) -> None:
        """Commits the consumed positions (or `offsets`) to the group, durably; raises the
        coordinator's typed error (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, ... once this
        member lost its partitions), or KafkaTimeoutError after default_api_timeout_ms."""
        if self._group is None:
            raise ValueError("commit needs a group_id")
        payload = self._consumed_offsets() if offsets is None else _commit_payload(offsets)
        if payload:
            self._group.commit(payload, self._api_timeout_ms)

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
        if self._group is None:
            raise ValueError("commit_async needs a group_id")
        if self._closed:
            raise RuntimeError("the consumer is closed")
        payload = self._consumed_offsets() if offsets is None else _commit_payload(offsets)
        if self._async_commits is None:
            self._async_commits = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rayk-commit-async")
        group, timeout_ms = self._member, self._api_timeout_ms
        future = self._async_commits.submit(lambda: group.commit(payload, timeout_ms) if payload else None)
        self._last_async_commit = future
        if callback is not None:
            done = {TopicPartition(*tp): OffsetAndMetadata(*value) for tp, value in payload.items()}
            future.add_done_callback(lambda f: callback(done, f.exception()))  # type: ignore[arg-type]
        return future

    def _consumed_offsets(self) -> dict[tuple[str, int], tuple[int, str]]:
        return {(tp.topic, tp.partition): (self._positions[tp], "") for tp in self._assignment if tp in self._positions}

    def committed(self, partition: TopicPartition, metadata: bool = False) -> int | OffsetAndMetadata | None:
        """The group's committed offset of `partition` (None if it has none); with
        `metadata`, as OffsetAndMetadata with the string committed along (kafka-python's).
        ValueError without a group_id; KafkaTimeoutError if the coordinator does not
        answer within default_api_timeout_ms."""
        if self._group is None:
            raise ValueError("committed needs a group_id")
        tp = TopicPartition(*partition)
        if not metadata:
            return self._committed_offsets([tp]).get(tp)
        return self.committed_offsets([tp]).get(tp)

    def committed_offsets(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets and metadata of `partitions`, in one lookup (the
        Java consumer's committed(Set)); partitions with no commit are left out."""
        if self._group is None:
            raise ValueError("committed_offsets needs a group_id")
        tps = [TopicPartition(*tp) for tp in partitions]
        found = self._group.committed([(tp.topic, tp.partition) for tp in tps], self._api_timeout_ms)
        out = {}
        for tp in tps:
            value = found.get((tp.topic, tp.partition))
            if value is not None and value.offset >= 0:
                out[tp] = OffsetAndMetadata(value.offset, value.metadata)
        return out

    def _maybe_auto_commit(self, now: float) -> None:
        if self._auto_commit and now >= self._next_auto_commit_s:
            offsets = self._consumed_offsets()
            if not offsets or self._member.commit_async(offsets, now):
                self._next_auto_commit_s = now + self._auto_commit_interval_s

    # ------------------------------------------------------------------ polling

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records from the assigned partitions, waiting up to `timeout_ms` for the first;
        returns within `timeout_ms` whatever happens (a rebalance, a leader change, a
        leader not answering: retried at the next poll). Raises OffsetOutOfRangeError for
        a position outside the log under auto_offset_reset "none", what a deserializer
        raises, and RuntimeError once closed."""
        limit = max_records or self._max_poll_records
        return self._poll(timeout_ms, lambda: self._fetcher.drain(self._positions, limit))

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
        return self._poll(timeout_ms, lambda: self._fetcher.drain_columns(self._positions, max_records))

    def _poll(self, timeout_ms: int, drain: Callable[[], dict]) -> dict:
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
        for tp, result in self._fetcher.collect(ready, now):
            self._reset_out_of_range(tp, result)
        self._update_positions(ready, now)
        self._maybe_auto_commit(now)
        fetched = [tp for tp in self._assignment if tp not in self._paused] if self._paused else self._assignment
        self._fetcher.start_fetches(fetched, self._positions, now)

    def _pending(self) -> list[Any]:
        refs = self._fetcher.pending()
        refs += [p.ref for p in self._offset_lookups.values()]
        if self._committed_lookup is not None:
            refs.append(self._committed_lookup[0].ref)
        if self._group is not None:
            refs += self._group.pending()
        refs += self._metadata.pending()
        return refs

    def _wake_at_s(self, now: float) -> float | None:
        """The next time something is due (a deadline, a backoff, an auto-commit) that no
        ref would wake `poll` for. Times already past were acted on, or wait for a ref."""
        times = [self._fetcher.wake_at_s(self._assignment)]
        times += [p.deadline_s for p in self._offset_lookups.values()]
        times += [t for tp, t in self._retry_at_s.items() if tp in self._assignment]
        times += [self._metadata.wake_at_s(), self._committed_retry_at_s]
        if self._group is not None:
            times.append(self._group.wake_at_s())
        if self._auto_commit and self._assignment:
            times.append(self._next_auto_commit_s)
        due = [t for t in times if t is not None and t > now]
        return min(due) if due else None

    def _reset_out_of_range(self, tp: TopicPartition, result: Any) -> None:
        """The position fell out of the log (retention deleted it): auto_offset_reset."""
        if self._reset == "none":
            raise result.error
        self._forget(tp)
        self._positions[tp] = result.log_start_offset if self._reset == "earliest" else result.high_watermark

    # ------------------------------------------------------------------ iteration, lifecycle

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Records one at a time; each moves the position (and what auto-commit commits)
        past itself as it is handed out. Stops after `consumer_timeout_ms` without records."""
        hand_out, positions = self._fetcher.hand_out, self._positions
        idle_since: float | None = None  # since when it has waited for a record
        while True:
            if self._closed:
                raise RuntimeError("the consumer is closed")
            # Records already fetched go out one at a time, without poll's pass over the
            # group, lookups and fetches (it runs once the buffer is empty, as Kafka's
            # iterator polls), and without a call per record.
            if (yield from hand_out(positions)):
                idle_since = None
                continue
            if idle_since is None:
                idle_since = time.monotonic()
            batch = self.poll(timeout_ms=int(min(1.0, self._consumer_timeout_s) * 1000), max_records=1)
            if not batch:
                if time.monotonic() - idle_since >= self._consumer_timeout_s:
                    return
                continue
            idle_since = None
            for records in batch.values():
                yield from records

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
        if self._async_commits is not None:
            if self._last_async_commit is not None:
                concurrent.futures.wait([self._last_async_commit], timeout=timeout_ms / 1000)
            self._async_commits.shutdown(wait=False, cancel_futures=True)
        if autocommit and self._auto_commit and self._assignment:
            try:
                self._member.commit(self._consumed_offsets(), timeout_ms)
            except KafkaError as e:
                logger.info("commit on close: %s", e)
        if self._group is not None:
            self._group.close(max(1, int((deadline - time.monotonic()) * 1000)))
        self._fetcher.close()
        self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _commit_payload(offsets: dict[TopicPartition, OffsetAndMetadata | int]) -> dict[tuple[str, int], tuple[int, str]]:
    """What `commit` sends for `offsets`: (topic, partition) -> (offset, metadata)."""
    payload = {}
    for tp, value in offsets.items():
        offset, metadata = (value, "") if isinstance(value, int) else (value.offset, value.metadata)
        payload[(tp[0], tp[1])] = (offset, metadata)
    return payload


def _committed_positions(partitions: list[TopicPartition], found: dict) -> dict[TopicPartition, int]:
    """The committed offsets (>= 0) among an OffsetFetch answer, by partition."""
    out = {}
    for tp in partitions:
        value = found.get((tp.topic, tp.partition))
        if value is not None and value.offset >= 0:
            out[tp] = value.offset
    return out
