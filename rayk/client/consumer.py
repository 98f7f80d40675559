"""Consumer: reads partitions from their leader replicas, alone (`assign`) or as a member
of a consumer group (`subscribe` / `group_id`), in kafka-python's shape.

Fetching is a pipeline: every assigned partition has at most one fetch in flight to its
leader (long-polled there: `fetch_min_bytes`, `fetch_max_wait_ms`), and the next fetch is
issued as soon as one returns, so the following records arrive while the application is
still processing the current ones. `poll` waits (with `ray.wait`, no sleeping) until some
fetch returns or its timeout passes, decodes the batches (any codec the storage layer
reads) and hands back at most `max_poll_records` records, advancing the positions.

Positions start from the group's committed offset, else from `auto_offset_reset`
("earliest" / "latest"; "none" raises OFFSET_OUT_OF_RANGE). A position that falls out
of the log (retention deleted it) is reset the same way. With `enable_auto_commit` the
consumed positions are committed every `auto_commit_interval_ms`, before a rebalance
and on close.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from rayk.client.group_member import GroupMember
from rayk.client.metadata import MetadataCache
from rayk.client.serializers import deserializer
from rayk.client.types import ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from rayk.errors import KafkaError, OffsetOutOfRangeError
from rayk.storage.records import iter_batches

EARLIEST, LATEST = -2, -1
FETCH_RETRY_BACKOFF_MS = 100


class Consumer:
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
        partition_assignment_strategy: tuple[str, ...] = ("range", "roundrobin"),
        key_deserializer: Any = None,
        value_deserializer: Any = None,
        consumer_timeout_ms: float = float("inf"),
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', got {auto_offset_reset!r}")
        self._cluster = cluster
        self._metadata = MetadataCache(cluster.controller)
        self._reset = auto_offset_reset
        self._auto_commit = enable_auto_commit and group_id is not None
        self._auto_commit_interval_s = auto_commit_interval_ms / 1000
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
        self._fetch_min_bytes = fetch_min_bytes
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._max_partition_fetch_bytes = max_partition_fetch_bytes
        self._max_poll_records = max_poll_records
        self._max_poll_interval_s = max_poll_interval_ms / 1000
        self._key_deserializer = deserializer(key_deserializer)
        self._value_deserializer = deserializer(value_deserializer)
        self._consumer_timeout_s = consumer_timeout_ms / 1000
        self._group: GroupMember | None = None
        if group_id is not None:
            self._group = GroupMember(
                cluster.controller,
                group_id,
                client_id,
                session_timeout_ms,
                max_poll_interval_ms,
                heartbeat_interval_ms,
                tuple(partition_assignment_strategy),
                lambda ts: {t: self._metadata.partition_count(t) for t in ts},
            )
        self._subscription: list[str] = []
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}  # next offset to hand to the application
        self._fetch_offsets: dict[TopicPartition, int] = {}  # next offset to fetch
        self._in_flight: dict[Any, TopicPartition] = {}  # fetch ObjectRef -> partition
        self._buffer: deque[tuple[TopicPartition, deque[ConsumerRecord]]] = deque()
        self._retry_at: dict[TopicPartition, float] = {}
        self._last_poll = time.monotonic()
        self._closed = False
        if topics:
            self.subscribe(list(topics))

    # ------------------------------------------------------------------ what to read

    def subscribe(self, topics: Iterable[str]) -> None:
        """Reads `topics` as a member of the consumer group (needs `group_id`)."""
        if self._group is None:
            raise ValueError("subscribe needs a group_id; use assign() to read partitions without a group")
        self._subscription = sorted(set(topics))
        self._group.request_rejoin()

    def unsubscribe(self) -> None:
        self._subscription = []
        self._set_assignment([])
        if self._group is not None:
            self._group.leave()

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Reads exactly these partitions, outside group management."""
        if self._subscription:
            raise ValueError("this consumer is subscribed; unsubscribe() before assign()")
        self._set_assignment([TopicPartition(*tp) for tp in partitions])

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def subscription(self) -> set[str]:
        return set(self._subscription)

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        keep = set(partitions)
        for tp in list(self._positions):
            if tp not in keep:
                self._forget(tp)
                self._positions.pop(tp, None)
        self._assignment = sorted(keep)

    def _forget(self, tp: TopicPartition) -> None:
        """Drops what was fetched or is being fetched for `tp` (after a seek or revocation)."""
        self._fetch_offsets.pop(tp, None)
        self._buffer = deque((p, recs) for p, recs in self._buffer if p != tp)
        for ref, p in list(self._in_flight.items()):
            if p == tp:
                del self._in_flight[ref]

    # ------------------------------------------------------------------ positions

    def seek(self, partition: TopicPartition, offset: int) -> None:
        tp = TopicPartition(*partition)
        if tp not in self._assignment:
            raise ValueError(f"{tp} is not assigned to this consumer")
        self._forget(tp)
        self._positions[tp] = offset

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or self._assignment:
            self.seek(tp, self._list_offset(TopicPartition(*tp), EARLIEST)[0])

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or self._assignment:
            self.seek(tp, self._list_offset(TopicPartition(*tp), LATEST)[0])

    def position(self, partition: TopicPartition) -> int:
        tp = TopicPartition(*partition)
        if tp not in self._positions:
            self._init_positions([tp])
        return self._positions[tp]

    def _list_offset(self, tp: TopicPartition, timestamp_ms: int) -> tuple[int, int]:
        return ray.get(self._metadata.leader(tp.topic, tp.partition).list_offset.remote(timestamp_ms))

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {TopicPartition(*tp): self._list_offset(TopicPartition(*tp), EARLIEST)[0] for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition: the offset the next committed record gets."""
        return {TopicPartition(*tp): self._list_offset(TopicPartition(*tp), LATEST)[0] for tp in partitions}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """The earliest offset whose timestamp is >= the given one (ms), or None."""
        out = {}
        for tp, ts in timestamps.items():
            offset, found_ts = self._list_offset(TopicPartition(*tp), ts)
            out[TopicPartition(*tp)] = OffsetAndTimestamp(offset, found_ts) if offset >= 0 else None
        return out

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self._metadata.partition_count(topic)))

    def _init_positions(self, partitions: list[TopicPartition]) -> None:
        missing = [tp for tp in partitions if tp not in self._positions]
        if not missing:
            return
        committed = self._group.committed(missing) if self._group is not None else {}
        for tp in missing:
            found = committed.get(tp) or committed.get((tp.topic, tp.partition))
            if found is not None and found.offset >= 0:
                self._positions[tp] = found.offset
            elif self._reset == "none":
                raise OffsetOutOfRangeError(f"{tp} has no committed offset and auto_offset_reset is 'none'")
            else:
                self._positions[tp] = self._list_offset(tp, EARLIEST if self._reset == "earliest" else LATEST)[0]

    # ------------------------------------------------------------------ commits

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None) -> None:
        """Commits the consumed positions (or `offsets`) to the group, durably."""
        if self._group is None:
            raise ValueError("commit needs a group_id")
        if offsets is None:
            offsets = {tp: self._positions[tp] for tp in self._assignment if tp in self._positions}
        payload = {}
        for tp, value in offsets.items():
            offset, metadata = (value, "") if isinstance(value, int) else (value.offset, value.metadata)
            payload[(tp[0], tp[1])] = (offset, metadata)
        if payload:
            self._group.commit(payload)

    def committed(self, partition: TopicPartition) -> int | None:
        if self._group is None:
            raise ValueError("committed needs a group_id")
        found = self._group.committed([(partition[0], partition[1])])
        value = next(iter(found.values()), None)
        return None if value is None else value.offset

    def _maybe_auto_commit(self) -> None:
        if self._auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
            self._commit_quietly()

    def _commit_quietly(self) -> None:
        try:
            self.commit()
        except KafkaError:
            pass  # the group is rebalancing; the positions are committed after the rejoin

    # ------------------------------------------------------------------ polling

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records from the assigned partitions, waiting up to `timeout_ms` for the first."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        self._last_poll = time.monotonic()
        self._ensure_assignment()
        self._maybe_auto_commit()
        limit = max_records or self._max_poll_records
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._start_fetches()
            records = self._drain(limit)
            if records:
                return records
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return {}
            if self._in_flight:
                done, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=remaining_s)
                self._collect(done)
            else:
                time.sleep(min(remaining_s, FETCH_RETRY_BACKOFF_MS / 1000))
            if self._group is not None and self._group.needs_join:
                return {}

    def _ensure_assignment(self) -> None:
        if self._group is None or not self._subscription:
            self._init_positions(self._assignment)
            return
        if self._group.needs_join:
            if self._auto_commit and self._assignment:
                self._commit_quietly()  # before the partitions may move to another member
            assigned = self._group.ensure_active(self._subscription)
            if assigned is not None:
                self._set_assignment([TopicPartition(t, p) for t, ps in assigned.items() for p in ps])
        self._init_positions(self._assignment)

    def _start_fetches(self) -> None:
        # One fetch in flight per partition, and at most one more chunk waiting behind the
        # one being consumed: the next records arrive while the application works.
        buffered = Counter(tp for tp, _ in self._buffer)
        busy = set(self._in_flight.values()) | {tp for tp, n in buffered.items() if n > 1}
        now = time.monotonic()
        for tp in self._assignment:
            if tp in busy or self._retry_at.get(tp, 0) > now or tp not in self._positions:
                continue
            offset = self._fetch_offsets.setdefault(tp, self._positions[tp])
            try:
                leader = self._metadata.leader(tp.topic, tp.partition)
            except KafkaError:
                self._retry_at[tp] = now + FETCH_RETRY_BACKOFF_MS / 1000
                continue
            ref = leader.fetch.remote(offset, self._max_partition_fetch_bytes, self._fetch_min_bytes, self._fetch_max_wait_ms)
            self._in_flight[ref] = tp

    def _collect(self, done: list[Any]) -> None:
        for ref in done:
            tp = self._in_flight.pop(ref, None)
            if tp is None:
                continue  # forgotten (seek, revocation) while in flight
            try:
                result = ray.get(ref)
            except (RayActorError, RayError):
                self._metadata.invalidate(tp.topic)
                self._retry_at[tp] = time.monotonic() + FETCH_RETRY_BACKOFF_MS / 1000
                continue
            if result.error is not None:
                self._handle_fetch_error(tp, result)
                continue
            records = self._decode(tp, result.records, self._fetch_offsets.get(tp, 0))
            if records:
                self._fetch_offsets[tp] = records[-1].offset + 1
                self._buffer.append((tp, deque(records)))

    def _handle_fetch_error(self, tp: TopicPartition, result: Any) -> None:
        if isinstance(result.error, OffsetOutOfRangeError) and self._reset != "none":
            offset = result.log_start_offset if self._reset == "earliest" else result.high_watermark
            self._forget(tp)
            self._positions[tp] = offset
            return
        if isinstance(result.error, OffsetOutOfRangeError):
            raise result.error
        self._metadata.invalidate(tp.topic)
        self._retry_at[tp] = time.monotonic() + FETCH_RETRY_BACKOFF_MS / 1000

    def _decode(self, tp: TopicPartition, data: bytes, from_offset: int) -> list[ConsumerRecord]:
        out = []
        for batch in iter_batches(data):
            timestamp_type = int(batch.header.timestamp_type)
            for r in batch.records():
                if r.offset < from_offset:
                    continue  # a batch that starts before the requested offset
                out.append(
                    ConsumerRecord(
                        tp.topic,
                        tp.partition,
                        r.offset,
                        r.timestamp_ms,
                        timestamp_type,
                        self._key_deserializer(r.key),
                        self._value_deserializer(r.value),
                        list(r.headers),
                        -1 if r.key is None else len(r.key),
                        -1 if r.value is None else len(r.value),
                    )
                )
        return out

    def _drain(self, limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        taken = 0
        while self._buffer and taken < limit:
            tp, records = self._buffer[0]
            if self._positions.get(tp) is None:
                self._buffer.popleft()
                continue
            chunk = []
            while records and taken < limit:
                record = records.popleft()
                if record.offset >= self._positions[tp]:
                    chunk.append(record)
                    taken += 1
            if chunk:
                out.setdefault(tp, []).extend(chunk)
                self._positions[tp] = chunk[-1].offset + 1
            if not records:
                self._buffer.popleft()
        return out

    # ------------------------------------------------------------------ iteration, lifecycle

    def __iter__(self) -> Iterator[ConsumerRecord]:
        idle_since = time.monotonic()
        while True:
            batch = self.poll(timeout_ms=int(min(1.0, self._consumer_timeout_s) * 1000))
            if not batch:
                if time.monotonic() - idle_since >= self._consumer_timeout_s:
                    return
                continue
            idle_since = time.monotonic()
            for records in batch.values():
                yield from records

    def close(self, autocommit: bool = True) -> None:
        if self._closed:
            return
        if autocommit and self._auto_commit:
            self._commit_quietly()
        if self._group is not None:
            self._group.close()
        self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
