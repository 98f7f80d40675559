"""Positions: where a Consumer reads each assigned partition next, and how a missing
position is found (Kafka's SubscriptionState positions with its OffsetFetcher).

`offsets` maps a partition to the offset of the next record to hand to the application;
the Fetcher advances it as records go out, `seek` sets it. A partition without one is
looked up: first the group's committed offset (OffsetFetch at its coordinator), and where
the group has none, or the consumer has no group, its leader's log start ("earliest") or
high watermark ("latest"; the last stable offset for read_committed) by ListOffsets, as
`auto_offset_reset` says ("none" raises OffsetOutOfRangeError instead).

Two ways to look up, for two kinds of caller, as the MetadataCache has:
- non-blocking (`update`), for `poll`: it starts the lookups as calls whose refs
  `pending()` hands to the poll's wait, and takes their answers when they are ready or
  past their deadline (`request_timeout_ms`); a failed one is tried again after
  `retry_backoff_ms` (`wake_times` says when, so poll wakes for it).
- blocking (`init`, `list_offset`), for `position`, `seek_to_*` and the offset lookups:
  they retry within `default_api_timeout_ms`, then raise KafkaTimeoutError.

Owned by one Consumer and used from its thread only: not thread-safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from rayk.client import calls
from rayk.client.consumer_config import ConsumerConfig
from rayk.client.consumer_protocol_member import ConsumerProtocolMember
from rayk.client.group_member import GroupMember
from rayk.client.metadata import STALE_LEADER_ERRORS, MetadataCache
from rayk.client.types import TopicPartition
from rayk.dataplane.frames import READ_COMMITTED
from rayk.errors import KafkaError, OffsetOutOfRangeError

logger = logging.getLogger(__name__)

EARLIEST, LATEST = -2, -1  # ListOffsets' timestamps for the log start and the end


class Positions:
    """The consumer's positions by partition (`offsets`), and the lookups, committed
    offsets then auto_offset_reset, that find the ones it lacks."""

    def __init__(self, metadata: MetadataCache, group: GroupMember | ConsumerProtocolMember | None,
                 config: ConsumerConfig) -> None:  # fmt: skip
        self.offsets: dict[TopicPartition, int] = {}  # next offset to hand to the application
        self._metadata = metadata
        self._group = group
        self._reset = config.auto_offset_reset
        self._isolation_level = config.isolation
        self._request_timeout_ms = config.request_timeout_ms
        self._api_timeout_ms = config.default_api_timeout_ms
        self._retry_backoff_s = config.retry_backoff_ms / 1000
        self._retry_at_s: dict[TopicPartition, float] = {}  # offset lookups back off
        self._committed_lookup: tuple[calls.Pending, list[TopicPartition]] | None = None
        self._committed_retry_at_s = 0.0
        self._offset_lookups: dict[TopicPartition, calls.Pending] = {}  # ListOffsets for a reset
        self._needs_reset: set[TopicPartition] = set()  # no committed offset: reset by auto_offset_reset

    @property
    def _member(self) -> GroupMember | ConsumerProtocolMember:
        """The group membership, where the caller knows the consumer has a group_id."""
        assert self._group is not None, "only a consumer with a group_id gets here"
        return self._group

    # ------------------------------------------------------------------ changes

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._needs_reset.discard(tp)
        self.offsets[tp] = offset

    def cancel_lookup(self, tp: TopicPartition) -> None:
        """Drops the ListOffsets under way for `tp`, if any (after a seek, a pause or revocation)."""
        lookup = self._offset_lookups.pop(tp, None)
        if lookup is not None:
            calls.cancel(lookup.ref)

    def drop(self, tp: TopicPartition) -> None:
        """Forgets everything about `tp` (it is no longer assigned)."""
        self.cancel_lookup(tp)
        self.offsets.pop(tp, None)
        self._needs_reset.discard(tp)
        self._retry_at_s.pop(tp, None)

    def out_of_range_offset(self, result: Any) -> int:
        """Where a position that fell out of the log (retention deleted it) goes, by
        auto_offset_reset, from a fetch's OFFSET_OUT_OF_RANGE `result`; under "none" its error.
        "latest" is the LSO for read_committed, as ListOffsets answers it: the high
        watermark is past a transaction still open, whose first records would be skipped."""
        if self._reset == "none":
            raise result.error
        if self._reset == "earliest":
            return result.log_start_offset
        if self._isolation_level == READ_COMMITTED and result.last_stable_offset >= 0:  # -1: an answer without one
            return result.last_stable_offset
        return result.high_watermark

    # ------------------------------------------------------------------ blocking lookups

    def init(self, partitions: list[TopicPartition]) -> None:
        """Looks positions up, blocking (within default_api_timeout_ms per lookup)."""
        missing = [tp for tp in partitions if tp not in self.offsets]
        if not missing:
            return
        committed = self.committed(missing) if self._group is not None else {}
        for tp in missing:
            if tp in committed:
                self.offsets[tp] = committed[tp]
            else:
                self.offsets[tp] = self._reset_offset(tp)
            self._needs_reset.discard(tp)

    def committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offsets of `partitions` (those it has), blocking."""
        found = self._member.committed([(tp.topic, tp.partition) for tp in partitions], self._api_timeout_ms)
        return committed_positions(partitions, found)

    def _reset_offset(self, tp: TopicPartition) -> int:
        if self._reset == "none":
            raise OffsetOutOfRangeError(f"{tp} has no committed offset and auto_offset_reset is 'none'")
        return self.list_offset(tp, EARLIEST if self._reset == "earliest" else LATEST)[0]

    def list_offset(self, tp: TopicPartition, timestamp_ms: int) -> tuple[int, int]:
        """(offset, timestamp) of the partition's leader's ListOffsets for `timestamp_ms`
        (EARLIEST, LATEST or a time), retried as the leader moves until default_api_timeout_ms."""
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

    # ------------------------------------------------------------------ non-blocking lookups (poll)

    def update(self, ready: set[Any], now: float, assignment: list[TopicPartition]) -> None:
        """Looks up missing positions without blocking: first the group's committed
        offsets, then ListOffsets (auto_offset_reset) for partitions that have none."""
        self._take_committed(ready, now, assignment)
        self._take_offset_lookups(ready, now)
        missing = [tp for tp in assignment if tp not in self.offsets and tp not in self._needs_reset]
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
                timestamp = EARLIEST if self._reset == "earliest" else LATEST
                ref = leader.list_offset.remote(timestamp, self._isolation_level)  # read_committed: the LSO
                self._offset_lookups[tp] = calls.Pending(ref, now + self._request_timeout_ms / 1000, f"ListOffsets {tp}")

    def _take_committed(self, ready: set[Any], now: float, assignment: list[TopicPartition]) -> None:
        """The group's committed offsets, once their lookup answered (or expired: retried)."""
        if self._committed_lookup is None:
            return
        pending, partitions = self._committed_lookup
        if pending.ref not in ready and not pending.expired(now):
            return
        self._committed_lookup = None
        try:
            committed = committed_positions(partitions, self._member.answer(pending))
        except KafkaError as e:
            logger.info("committed offsets of %s: %s; retrying", partitions, e)
            self._committed_retry_at_s = now + self._retry_backoff_s
            return
        for tp in partitions:
            if tp not in assignment or tp in self.offsets:
                continue
            if tp in committed:
                self.offsets[tp] = committed[tp]
            else:
                self._needs_reset.add(tp)

    def _take_offset_lookups(self, ready: set[Any], now: float) -> None:
        """The ListOffsets answers of resets (a failed one is retried after the backoff)."""
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
                self.offsets[tp] = offset
                self._needs_reset.discard(tp)

    def pending(self) -> list[Any]:
        """The refs of the lookups under way, for poll's wait."""
        refs = [p.ref for p in self._offset_lookups.values()]
        if self._committed_lookup is not None:
            refs.append(self._committed_lookup[0].ref)
        return refs

    def wake_times(self, assignment: Iterable[TopicPartition]) -> list[float]:
        """When a lookup's deadline or backoff ends (poll wakes then; no ref would wake it)."""
        times = [p.deadline_s for p in self._offset_lookups.values()]
        times += [t for tp, t in self._retry_at_s.items() if tp in assignment]
        times.append(self._committed_retry_at_s)
        return times


def committed_positions(partitions: list[TopicPartition], found: dict) -> dict[TopicPartition, int]:
    """The committed offsets (>= 0) among an OffsetFetch answer, by partition."""
    out = {}
    for tp in partitions:
        value = found.get((tp.topic, tp.partition))
        if value is not None and value.offset >= 0:
            out[tp] = value.offset
    return out
