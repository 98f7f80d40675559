"""LeaderFetch: a partition leader's read path (Kafka's Partition.fetchRecords with
ReplicaManager's DelayedFetch, and the leader's ListOffsets, DeleteRecords and
OffsetsForLeaderEpoch).

A fetch serves consumers up to the HW (a READ_COMMITTED one up to the LSO, with the
aborted transactions that overlap what it read) and followers up to the LEO. One that
finds fewer than `min_bytes` waits up to `max_wait_ms` and is answered the moment an append
or an HW move satisfies it (replica_events.py; nothing polls). Answers to the followers
a reassignment adds go at this replica's share of leader.replication.throttled.rate
(replication_throttle.py).

A follower's fetch offset is its LEO: the leader records it, which may add the follower to
the ISR and advance the HW (leader_isr.py), then answers. A follower's fetch names the
epoch of its last batch; if the leader's log went another way after that epoch, the answer
is the diverging epoch instead of records, and the follower's offset is not counted (it is
not a position in the leader's log).

A fetch that comes through the native endpoint (rayk/dataplane/native_endpoint.py) is
served without a task (`fetch_or_park`): checked (and a follower's position recorded) at
once, answered at once if it can be, else parked until an append (a follower's) or a
change (a consumer's: the HW or the LSO moved) satisfies it or its wait is over (one
timer), answered then through a callback; one whose connection ended meanwhile is dropped
unread (its `Waiter`). It is the same fetch as above, without the
task, the wakeup and the turns of the loop each costs; at RF=3 two followers' fetches wait
at the leader after each record, and a consumer's, through its broker's listener, for the
HW. A fetch below the local log start (a tiered log's remote read), a throttled
follower's or a traced one take the async path.

It owns no state beyond those parked fetches: the log, role and epoch are the context's
(replica_context.py), the followers' positions LeaderIsr's. Errors are answered in the
result, as Kafka answers per partition; a read that the disk fails is answered
KAFKA_STORAGE_ERROR and ends the replica's process (storage_failure.py). Not
thread-safe: the replica actor's event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Protocol

from rayk.dataplane import frames
from rayk.dataplane.frames import FetchResult
from rayk.errors import (
    FencedLeaderEpochError,
    InconsistentTopicIdError,
    InvalidTimestampError,
    KafkaError,
    KafkaStorageError,
    NotLeaderOrFollowerError,
    OffsetMovedToTieredStorageError,
    OffsetNotAvailableError,
    OffsetOutOfRangeError,
    PolicyViolationError,
    UnknownLeaderEpochError,
    UnknownServerError,
)
from rayk.replication import storage_failure
from rayk.replication.leader_isr import LeaderIsr
from rayk.replication.parked_requests import ParkedRequests
from rayk.replication.replica_context import ReplicaContext, Role, now_ms
from rayk.replication.replica_events import Appended
from rayk.replication.remote_log_manager import RemoteLogManager
from rayk.replication.replication_throttle import ReplicationThrottle
from rayk.storage.file_slice import FileSlice
from rayk.storage.leader_epoch_cache import UNDEFINED_EPOCH
from rayk.storage.records import iter_batches

logger = logging.getLogger(__name__)

CONSUMER_REPLICA_ID = -1
LATEST_TIMESTAMP = -1  # ListOffsets sentinels
EARLIEST_TIMESTAMP = -2
EARLIEST_LOCAL_TIMESTAMP = -4  # KIP-405 (ListOffsets v8): the local log's start, with tiered storage
LATEST_TIERED_TIMESTAMP = -5  # KIP-1005: the last offset in remote storage (-1: none)
DELETE_TO_HIGH_WATERMARK = -1  # DeleteRecords' offset for "everything below the high watermark"


class Waiter(Protocol):
    """Who waits for a parked fetch's answer: `wanted` is False once no one does (its
    connection ended), and the fetch is then dropped unread (the endpoint's Reply)."""

    @property
    def wanted(self) -> bool: ...


class ParkedFetch:
    """A fetch waiting at the leader without a task (`LeaderFetch.fetch_or_park`): a
    follower's, or a consumer's (`read_committed` only for one of those)."""

    __slots__ = ("offset", "max_bytes", "min_bytes", "slice_min_bytes", "answer", "deadline", "read_committed", "waiter")

    def __init__(self, offset: int, max_bytes: int, min_bytes: int, slice_min_bytes: int | None,
                 answer: Callable[[FetchResult], None], deadline: float, read_committed: bool = False,
                 waiter: Waiter | None = None) -> None:  # fmt: skip
        self.offset, self.max_bytes, self.min_bytes, self.slice_min_bytes = offset, max_bytes, min_bytes, slice_min_bytes
        self.answer, self.deadline = answer, deadline  # on the loop's clock
        self.read_committed = read_committed
        self.waiter = waiter

    @property
    def unwanted(self) -> bool:
        """No one waits for its answer any more: it is dropped, nothing read or counted for it."""
        return self.waiter is not None and not self.waiter.wanted


class LeaderFetch:
    """A leader's fetches, offset lookups and record deletion (see the module docstring)."""

    def __init__(self, ctx: ReplicaContext, isr: LeaderIsr, remote: RemoteLogManager | None = None) -> None:
        self._ctx = ctx
        self._isr = isr
        self._remote = remote  # tiered storage: reads below the local log start
        self._throttle = ReplicationThrottle()  # this replica's share of leader.replication.throttled.rate
        self._throttled_followers: frozenset[int] = frozenset()  # the followers a reassignment adds
        self._parked: ParkedRequests[ParkedFetch] = ParkedRequests(  # followers' fetches waiting without a task
            ctx.name, "a parked follower fetch", self._try_answer,
            lambda fetch, error: fetch.answer(self.fetch_error(error)), lambda fetch: fetch.deadline,
        )  # fmt: skip
        self._parked_consumers: ParkedRequests[ParkedFetch] = ParkedRequests(  # consumers' fetches, likewise
            ctx.name, "a parked consumer fetch", self._try_answer_consumer,
            lambda fetch, error: fetch.answer(self.fetch_error(error)), lambda fetch: fetch.deadline,
        )  # fmt: skip
        ctx.events.on_append = self._on_append
        ctx.events.on_change_fetch = self._parked_consumers.wake
        self._appended: Appended | None = None  # while parked fetches are woken by an append of this leader's

    def set_throttle(self, rate_bytes_per_s: int | None, adding: tuple[int, ...]) -> None:
        """Answers to the `adding` followers' fetches go at most at this rate (None: no limit)."""
        self._throttle.set_rate(rate_bytes_per_s)
        self._throttled_followers = frozenset(adding)

    def fetch_error(self, error: KafkaError) -> FetchResult:
        log = self._ctx.log
        return FetchResult(b"", log.high_watermark, log.log_end_offset, log.log_start_offset, error,
                           last_stable_offset=log.last_stable_offset)

    async def fetch(
        self, offset: int, max_bytes: int, min_bytes: int, max_wait_ms: int, replica_id: int, leader_epoch: int,
        last_fetched_epoch: int, topic_id: str | None, replica_incarnation_id: str = "", read_committed: bool = False,
        slice_min_bytes: int | None = None,
    ) -> FetchResult:
        """One fetch, answered now or once it is satisfiable (see PartitionReplica.fetch);
        records of at least `slice_min_bytes` as a FileSlice of the log (Log.read)."""
        ctx = self._ctx
        if ctx.role is not Role.LEADER:
            return self.fetch_error(ctx.not_leader())
        if topic_id is not None and topic_id != ctx.topic_id:
            return self.fetch_error(InconsistentTopicIdError(f"{ctx.name} has topic id {ctx.topic_id}, not {topic_id}"))
        if leader_epoch >= 0 and leader_epoch != ctx.leader_epoch:
            cls = FencedLeaderEpochError if leader_epoch < ctx.leader_epoch else UnknownLeaderEpochError
            return self.fetch_error(cls(f"fetch in epoch {leader_epoch}, leader is in epoch {ctx.leader_epoch}"))
        is_follower = replica_id != CONSUMER_REPLICA_ID
        remote = self._remote
        if not is_follower and remote is not None and offset < ctx.log.log_start_offset and remote.holds(offset):
            return await self._remote_read(remote, offset, max_bytes, read_committed)
        if is_follower:
            refused = self._follower_fetched(offset, replica_id, last_fetched_epoch, replica_incarnation_id)
            if refused is not None:
                return refused
        throttled = is_follower and replica_id in self._throttled_followers and self._throttle.active
        if throttled:
            max_bytes = self._throttle.max_bytes(max_bytes)
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            changed = ctx.events.change_event(appends=is_follower)  # a consumer reads up to the HW
            if is_follower and min_bytes > 0 and offset == ctx.log.log_end_offset:
                # A follower at the log end (each one, after each record, at RF > 1): there
                # is nothing to read until records come, so no read is made to find that.
                remaining_s = deadline - time.monotonic()
                if remaining_s > 0:
                    await changed.wait(remaining_s)
                    if ctx.role is not Role.LEADER:
                        return self.fetch_error(ctx.not_leader())
                    continue
            result = self._read(offset, max_bytes, is_follower, read_committed and not is_follower, slice_min_bytes)
            remaining_s = deadline - time.monotonic()
            if result.error is not None or len(result.records) >= min_bytes or remaining_s <= 0:
                if throttled and result.records:
                    epoch = ctx.leader_epoch
                    await self._throttle.pace(len(result.records))  # a reassignment's copy, at its rate
                    if not ctx.leads_in(epoch):
                        _close_slice(result)
                        return self.fetch_error(ctx.not_leader())
                if ctx.trace is not None and is_follower:
                    records = result.records
                    for batch in iter_batches(records.read() if isinstance(records, FileSlice) else records):
                        ctx.trace.fetch_answered(replica_id, batch.header.next_offset)
                if not is_follower and remote is not None and remote.enabled:  # the whole log's start
                    result = result._replace(log_start_offset=remote.log_start_offset())
                return result
            _close_slice(result)  # too little: read again once more arrives
            await changed.wait(remaining_s)
            if ctx.role is not Role.LEADER:
                return self.fetch_error(ctx.not_leader())

    def fetch_or_park(
        self, r: frames.FetchRequest, max_bytes: int, answer: Callable[[FetchResult], None],
        slice_min_bytes: int | None = None, waiter: Waiter | None = None,
    ) -> bool:
        """A fetch served without a task: answered through `answer` now, or parked until it
        can be, or until `waiter` no longer wants it (see the module docstring). False, having done nothing, for a fetch the async
        path serves (`fetch`): a consumer's below the local log start; a follower's that is
        throttled, traced or does not wait; any on a replica that is not the leader. (A
        consumer's that does not wait is read and answered at once.)"""
        ctx = self._ctx
        replica_id = r.replica_id
        if ctx.role is not Role.LEADER:
            return False
        is_consumer = replica_id == CONSUMER_REPLICA_ID
        if is_consumer:
            if r.offset < ctx.log.log_start_offset:
                return False  # a tiered log's remote read, or OFFSET_OUT_OF_RANGE after its listing: the async path's
        elif (ctx.trace is not None or replica_id in self._throttled_followers
              or r.min_bytes <= 0 or r.max_wait_ms <= 0):
            return False
        if r.topic_id is not None and r.topic_id != ctx.topic_id:
            answer(self.fetch_error(InconsistentTopicIdError(f"{ctx.name} has topic id {ctx.topic_id}, not {r.topic_id}")))
            return True
        if r.leader_epoch >= 0 and r.leader_epoch != ctx.leader_epoch:
            cls = FencedLeaderEpochError if r.leader_epoch < ctx.leader_epoch else UnknownLeaderEpochError
            answer(self.fetch_error(cls(f"fetch in epoch {r.leader_epoch}, leader is in epoch {ctx.leader_epoch}")))
            return True
        deadline = asyncio.get_running_loop().time() + r.max_wait_ms / 1000
        if is_consumer:
            parked = ParkedFetch(r.offset, max_bytes, r.min_bytes, slice_min_bytes, answer, deadline,
                                 r.isolation_level == frames.READ_COMMITTED, waiter)
            if r.min_bytes <= 0 or r.max_wait_ms <= 0:
                self._parked_consumers.answer_at_once(parked)  # no wait asked (a listener's first read of many)
            else:
                self._parked_consumers.answer_or_park(parked)
            return True
        refused = self._follower_fetched(r.offset, replica_id, r.last_fetched_epoch, r.incarnation_id)
        if refused is not None:
            answer(refused)
            return True
        parked = ParkedFetch(r.offset, max_bytes, r.min_bytes, slice_min_bytes, answer, deadline, waiter=waiter)
        if r.offset == ctx.log.log_end_offset:
            self._parked.park(parked)  # at the log end: nothing to read until records come (as _try_answer finds)
        else:
            self._parked.answer_or_park(parked)
        return True

    def _on_append(self, appended: Appended | None) -> None:
        """An append or a change: the parked fetches that can be answered are, those at the
        start of an append of this leader's with its records as written (`appended`)."""
        self._appended = appended
        try:
            self._parked.wake()
        finally:
            self._appended = None

    def _try_answer(self, parked: ParkedFetch, timed_out: bool) -> bool:
        """Answers a parked fetch if it can be now (as an iteration of `fetch`'s loop does)."""
        if parked.unwanted:
            return True
        ctx = self._ctx
        if ctx.role is not Role.LEADER:
            parked.answer(self.fetch_error(ctx.not_leader()))
            return True
        log = ctx.log
        if not timed_out and parked.offset == log.log_end_offset:
            return False  # nothing to read until records come, so no read is made to find that
        appended = self._appended
        if (appended is not None and parked.offset == appended[0] and len(appended[1]) <= parked.max_bytes
                and (parked.slice_min_bytes is None or len(appended[1]) < parked.slice_min_bytes)):
            # A follower at the log end before this append: what a read would return is
            # what was just written, all of it (one segment, up to the LEO, within max_bytes).
            if len(appended[1]) < parked.min_bytes:
                return False  # too little yet for its replica.fetch.min.bytes, as a read would find
            records = appended[1]
            if type(records) is not bytes:  # made bytes once, for every follower answered with them
                records = bytes(records)
                self._appended = (appended[0], records)
            parked.answer(FetchResult(records, log.high_watermark, log.log_end_offset, log.log_start_offset,
                                      last_stable_offset=log.last_stable_offset))
            return True
        result = self._read(parked.offset, parked.max_bytes, True, False, parked.slice_min_bytes)
        if result.error is not None or len(result.records) >= parked.min_bytes or timed_out:
            parked.answer(result)
            return True
        _close_slice(result)
        return False

    def _try_answer_consumer(self, parked: ParkedFetch, timed_out: bool) -> bool:
        """Answers a parked consumer's fetch if it can be now (as an iteration of `fetch`'s
        loop does for a consumer: a read up to the HW, or the LSO for read_committed)."""
        if parked.unwanted:
            return True
        ctx = self._ctx
        if ctx.role is not Role.LEADER:
            parked.answer(self.fetch_error(ctx.not_leader()))
            return True
        log = ctx.log
        if not timed_out and parked.offset == (log.last_stable_offset if parked.read_committed else log.high_watermark):
            return False  # a consumer caught up: nothing to read until the HW (or the LSO) moves
        result = self._read(parked.offset, parked.max_bytes, False, parked.read_committed, parked.slice_min_bytes)
        if result.error is not None or len(result.records) >= parked.min_bytes or timed_out:
            remote = self._remote
            if remote is not None and remote.enabled:  # the whole log's start, as `fetch` answers it
                result = result._replace(log_start_offset=remote.log_start_offset())
            parked.answer(result)
            return True
        _close_slice(result)
        return False

    def drop_parked(self) -> None:
        """The replica closes: its parked fetches are dropped unanswered (their connections
        close with its endpoint), and no timer of theirs reads the closed log."""
        self._parked.drop()
        self._parked_consumers.drop()

    async def _remote_read(self, remote: RemoteLogManager, offset: int, max_bytes: int, read_committed: bool) -> FetchResult:
        """A consumer's fetch below the local log start, from the remote segment holding it
        (everything remote is below the HW and the LSO)."""
        log = self._ctx.log
        try:
            records, next_offset = await remote.read(offset, max_bytes, log.high_watermark)
            aborted: tuple[tuple[int, int], ...] = ()
            if read_committed and records:
                aborted = await remote.aborted_transactions(offset, next_offset)
        except KafkaError as e:
            return self.fetch_error(e)._replace(log_start_offset=remote.log_start_offset())
        return FetchResult(records, log.high_watermark, log.log_end_offset, remote.log_start_offset(),
                           last_stable_offset=log.last_stable_offset, aborted_transactions=aborted)

    def _follower_fetched(
        self, offset: int, replica_id: int, last_fetched_epoch: int, incarnation_id: str
    ) -> FetchResult | None:
        """Records a follower's position, or the answer that refuses it: not a replica,
        below this tiered log's local start, a diverging epoch, an offset past this log's end."""
        ctx, log = self._ctx, self._ctx.log
        if replica_id not in self._isr.leading().followers:
            return self.fetch_error(NotLeaderOrFollowerError(f"broker {replica_id} is not a replica of this partition"))
        if self._remote is not None and self._remote.enabled and offset < log.log_start_offset:
            return self.fetch_error(OffsetMovedToTieredStorageError(
                f"broker {replica_id} fetches {ctx.name} at {offset}, below the local log start {log.log_start_offset}:"
                " start there from the remote copy"))  # fmt: skip
        diverging = self._diverging_epoch(offset, last_fetched_epoch)
        if diverging is not None:
            return FetchResult(b"", log.high_watermark, log.log_end_offset, log.log_start_offset, None, diverging,
                               log.last_stable_offset)
        if offset > log.log_end_offset:  # not a position in this log: it must truncate first
            return self.fetch_error(
                OffsetOutOfRangeError(f"broker {replica_id} fetches at {offset}, past the log end {log.log_end_offset}")
            )
        if ctx.trace is not None:
            ctx.trace.fetch_arrived(replica_id, offset)
        self._record_follower_position(replica_id, offset, incarnation_id)
        return None

    def _diverging_epoch(self, fetch_offset: int, last_fetched_epoch: int) -> tuple[int, int] | None:
        """(epoch, end offset) where this log's history leaves the follower's, if it does:
        this log has no `last_fetched_epoch`, or it ends before the follower's offset.
        A log with no epochs at all has nothing to compare: the offset check decides."""
        log = self._ctx.log
        if last_fetched_epoch == UNDEFINED_EPOCH or log.latest_epoch == UNDEFINED_EPOCH:
            return None
        epoch, end_offset = log.end_offset_for_epoch(last_fetched_epoch)
        if epoch < last_fetched_epoch or end_offset < fetch_offset:
            return epoch, end_offset
        return None

    def _record_follower_position(self, replica_id: int, fetch_offset: int, incarnation_id: str = "") -> None:
        isr = self._isr
        leo = self._ctx.log.log_end_offset
        assert fetch_offset <= leo, f"a follower's position {fetch_offset} is within the leader's log (LEO {leo})"
        isr.leading().record_follower_fetch(replica_id, fetch_offset, leo, now_ms(), incarnation_id)
        isr.follower_fetched(replica_id)

    def _read(
        self, offset: int, max_bytes: int, is_follower: bool, read_committed: bool = False,
        slice_min_bytes: int | None = None,
    ) -> FetchResult:
        log = self._ctx.log
        try:
            if is_follower:
                max_offset = None
            else:
                max_offset = log.last_stable_offset if read_committed else log.high_watermark
            result = log.read(offset, max_bytes, max_offset=max_offset, slice_min_bytes=slice_min_bytes)
            if isinstance(result.records, FileSlice):  # an EIO when it is sent is a failed read too
                result.records.read_failed = functools.partial(storage_failure.end_process, self._ctx.name)
            aborted: tuple[tuple[int, int], ...] = ()
            if read_committed and result.records:
                aborted = tuple(
                    (t.producer_id, t.first_offset) for t in log.aborted_transactions(offset, result.next_offset)
                )
        except (OSError, KafkaStorageError) as e:  # the log's disk fails reads: storage_failure.py
            storage_failure.end_process(self._ctx.name, e)
            return self.fetch_error(KafkaStorageError(f"{self._ctx.name}: a read of its log failed: {e}"))
        except KafkaError as e:
            return self.fetch_error(e)
        return FetchResult(result.records, result.high_watermark, result.log_end_offset, result.log_start_offset,
                           last_stable_offset=result.last_stable_offset, aborted_transactions=aborted)

    # ------------------------------------------------------------------ offsets

    def list_offset(self, timestamp_ms: int, isolation_level: int) -> tuple[int, int]:
        """Kafka's ListOffsets for a consumer (see PartitionReplica.list_offset)."""
        ctx = self._ctx
        if ctx.role is not Role.LEADER:
            raise ctx.not_leader()
        log = ctx.log
        epoch_start_offset = self._isr.leading().leader_epoch_start_offset
        if log.high_watermark < epoch_start_offset:
            raise OffsetNotAvailableError(
                f"the high watermark {log.high_watermark} of {ctx.name} lags the start "
                f"{epoch_start_offset} of leader epoch {ctx.leader_epoch}"
            )
        last_fetchable = log.last_stable_offset if isolation_level == frames.READ_COMMITTED else log.high_watermark
        if timestamp_ms == LATEST_TIMESTAMP:
            return last_fetchable, -1
        remote = self._remote if self._remote is not None and self._remote.enabled else None
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return (log.log_start_offset if remote is None else remote.log_start_offset()), -1
        if timestamp_ms == EARLIEST_LOCAL_TIMESTAMP:
            return log.log_start_offset, -1
        if timestamp_ms == LATEST_TIERED_TIMESTAMP:
            end = None if remote is None else remote.remote_end_offset
            return (-1 if end is None else end - 1), -1
        if timestamp_ms < 0:
            raise InvalidTimestampError(
                f"timestamp {timestamp_ms} is neither >= 0 nor -1 (latest), -2 (earliest), -4 (earliest local) or "
                "-5 (latest tiered)"
            )
        found = log.offset_for_timestamp(timestamp_ms)
        if found is None or found.offset >= last_fetchable:
            return -1, -1
        return found.offset, found.timestamp_ms

    def delete_records(self, offset: int) -> int:
        """Kafka's DeleteRecords on the leader (see PartitionReplica.delete_records)."""
        target = self.delete_records_target(offset)
        log = self._ctx.log
        log.maybe_increment_log_start_offset(target)
        return log.log_start_offset

    def delete_records_target(self, offset: int) -> int:
        """The offset a DeleteRecords moves the log start to (-1: the HW), checked: NOT_LEADER,
        POLICY_VIOLATION without cleanup.policy delete, OFFSET_OUT_OF_RANGE below 0 or above the HW."""
        ctx = self._ctx
        if ctx.role is not Role.LEADER:
            raise ctx.not_leader()
        log = ctx.log
        if not log.config.deletes:
            raise PolicyViolationError(
                f"records of {ctx.name} cannot be deleted: cleanup.policy is {log.config.cleanup_policy}"
            )
        target = log.high_watermark if offset == DELETE_TO_HIGH_WATERMARK else offset
        if target < 0:
            raise OffsetOutOfRangeError(f"the offset {offset} for {ctx.name} is not valid")
        if target > log.high_watermark:
            raise OffsetOutOfRangeError(
                f"cannot move the log start offset of {ctx.name} to {target}: above the high watermark {log.high_watermark}"
            )
        return target

    def offsets_for_leader_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset): where the leader's log ends for `epoch` (OffsetsForLeaderEpoch)."""
        ctx = self._ctx
        if ctx.role is not Role.LEADER:
            raise ctx.not_leader()
        return ctx.log.end_offset_for_epoch(epoch)


def _close_slice(result: FetchResult) -> None:
    """Gives back the descriptor of a slice a fetch read and will not answer."""
    if isinstance(result.records, FileSlice):
        result.records.close()
