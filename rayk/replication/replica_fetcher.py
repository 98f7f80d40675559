"""ReplicaFetcher: a follower's copy loop for one partition in one leader epoch (Kafka's
ReplicaFetcherThread and the truncation half of AbstractFetcherThread).

Before copying, the follower finds where its log diverges from the leader's and cuts it
there (KIP-101, refined by KIP-279): it asks the leader (OffsetsForLeaderEpoch) where the
epoch of its own last batch ends in the leader's log, retrying until the leader answers,
since copying onto a log that still holds an older leader's unreplicated tail would make
the two logs differ at the same offsets. The leader answers with the largest epoch it
has at or below the one asked for, and where that epoch ends; the follower truncates to
the lesser of that end and its own end of the same epoch. An answer of "no such epoch"
falls back to the follower's high watermark, as in Kafka.

Then it fetches from its log end offset over the data plane (leader_link.py) with min 1 byte / max wait 500 ms
(`replica.fetch.min.bytes`, `replica.fetch.wait.max.ms`), each call bounded by
`replica.socket.timeout.ms`, sending the epoch of its last batch. A leader whose log went
another way after that epoch answers with the diverging epoch and its end instead of
records (the fetch-path check of KIP-320/KIP-595), and the follower truncates the same
way and fetches on. Records are appended with `append_as_follower` (a log that ends
inside the leader's first batch first gives up its part of it, to take the batch whole);
the follower's high watermark becomes min(leader HW, own LEO), and its log start offset
moves up to the leader's (as far as its HW) when that is higher. An out-of-range fetch offset means the leader's
log starts past ours (retention: start over at its log start) or ends before ours (cut
ours back to its end).

Where rayk._native is built, the steady part of the loop runs on a thread of its own
(native_copy.py): it fetches, checks and writes what the leader sends while this loop
waits, and hands back every answer that is not plain records of the log's epoch (an
error, a diverging epoch, a marker, a new epoch, a roll), which this loop handles as its
own, then starts it again. The Log is brought up to what it wrote every few milliseconds.

While a reassignment adds this replica, what it copies is paced to its share of
follower.replication.throttled.rate (replication_throttle.py): it appends a fetch's bytes
once they fit the rate, and each fetch asks for at most a quantum of it.

The loop ends only when cancelled (closing its connection): the replica starts a new
fetcher for every new leader epoch and cancels the old one. A failed fetch (the leader's
process died, the connection broke, a timeout, the leader no longer leads) is retried,
over a new connection, after a backoff until a new assignment arrives.
Not thread-safe: runs on the replica actor's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rayk.dataplane.frames import FetchRequest, FetchResult
from rayk.errors import KafkaError, KafkaStorageError, OffsetMovedToTieredStorageError, OffsetOutOfRangeError
from rayk.replication import native_copy, storage_failure
from rayk.replication.native_copy import NativeCopy
from rayk.replication.replication_throttle import ReplicationThrottle
from rayk.storage import Log
from rayk.storage.leader_epoch_cache import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from rayk.storage.records import BatchHeader

if TYPE_CHECKING:
    from rayk.replication.leader_link import LeaderLink

logger = logging.getLogger(__name__)

FOLLOWER_ERROR_BACKOFF_MS = 100


def truncate_to_epoch_end(log: Log, epoch: int, end_offset: int, name: str = "") -> None:
    """Cuts `log` where the leader said `epoch` ends (KIP-279): at the lesser of
    `end_offset` and this log's own end of that epoch; with no epoch in the answer, at
    this log's high watermark. A cut at the LEO keeps every record and drops the epochs
    that start there (see Log.truncate_to)."""
    if epoch == UNDEFINED_EPOCH or end_offset == UNDEFINED_EPOCH_OFFSET:
        target = log.high_watermark
    else:
        own_epoch, own_end = log.end_offset_for_epoch(epoch)
        target = end_offset if own_end == UNDEFINED_EPOCH_OFFSET else min(end_offset, own_end)
    if target < log.log_end_offset:
        logger.info("%s: truncating divergent log from %d to %d (leader epoch %d ends at %d)",
                    name, log.log_end_offset, target, epoch, end_offset)
    if target <= log.log_end_offset:
        # At the LEO too: no record goes, but an epoch this replica led without appending
        # (an entry starting at the LEO) does. The leader never had it, and kept, it makes
        # every later fetch look diverging, which no truncation above the LEO ever fixes.
        log.truncate_to(target)


class ReplicaFetcher:
    """One follower's copy loop for one leader epoch: owns the LeaderLink and appends to the
    follower's Log what the leader sends, after truncating it to where the two agree. Made
    by the follower side of a replica (replica_follower.py) for each new leader epoch, `run`
    until cancelled; not thread-safe (the replica's event loop)."""

    def __init__(
        self,
        log: Log,
        name: str,
        broker_id: int,
        leader: LeaderLink,
        leader_epoch: int,
        config: Any,
        on_progress: Callable[[], None],
        incarnation_id: str = "",
        throttle: ReplicationThrottle | None = None,
        remote_start_state: Callable[[int], Awaitable[tuple[bytes | None, tuple[tuple[int, int], ...]]]] | None = None,
    ) -> None:
        """`leader` reaches the leader's replica (OffsetsForLeaderEpoch, fetches); `config` a ReplicaConfig;
        `on_progress` is called after every append or high watermark move; `incarnation_id`
        names this broker's process, sent with every fetch (KIP-903); `throttle` paces
        what it copies while a reassignment adds this replica (replication_throttle.py)."""
        self._log, self.name, self.broker_id = log, name, broker_id
        self._leader, self._epoch, self._config = leader, leader_epoch, config
        self._on_progress = on_progress
        self._incarnation_id = incarnation_id
        self._throttle = throttle or ReplicationThrottle()
        # Tiered storage: the producer snapshot and leader epochs of the remote copy that
        # ends at an offset, for a log that starts there (OFFSET_MOVED_TO_TIERED_STORAGE).
        self._remote_start_state = remote_start_state
        self._timeout_s = (config.replica_fetch_wait_max_ms + config.replica_socket_timeout_ms) / 1000
        # The steady part of the loop on a thread, where built and on (native_copy.py).
        self._native = NativeCopy(log, name, leader, on_progress) if native_copy.available() else None

    @property
    def native_copy_runs(self) -> int:
        return self._native.runs if self._native is not None else 0

    def throttle_changed(self) -> None:
        """The throttle's rate was set: one that now applies ends a native run at once, so
        that what comes next is copied at its pace (by the Python loop)."""
        if self._native is not None and self._throttle.active:
            self._native.stop_run()

    async def run(self) -> None:
        """Copies until cancelled. Nothing but a cancellation ends it: an error a step
        raises is logged and the step tried again after a backoff, since a fetcher that
        stopped quietly would leave its partition under-replicated for good; an error of
        the log's disk ends the replica's process instead (storage_failure.py)."""
        try:
            while True:
                try:
                    await self._run()
                except asyncio.CancelledError:
                    raise
                except (OSError, KafkaStorageError) as e:  # its log's disk failed: storage_failure.py
                    storage_failure.end_process(self.name, e)
                    await asyncio.Event().wait()  # appends nothing more while the process ends
                except Exception:
                    logger.exception("%s: the follower's copy loop failed; starting it again", self.name)
                    await asyncio.sleep(FOLLOWER_ERROR_BACKOFF_MS / 1000)
        finally:
            self._leader.close()
            if self._native is not None:
                self._native.close()

    async def _run(self) -> None:
        await self._truncate_to_leader()
        while True:
            try:
                result = await self._next_answer()
            except (asyncio.CancelledError, KafkaStorageError):
                raise  # a failed write of the native loop: the disk's failure, as a Python append's
            except Exception as e:  # the leader's actor died, hung, or is being replaced
                logger.warning("%s: fetch from the leader failed: %s", self.name, e)
                await asyncio.sleep(FOLLOWER_ERROR_BACKOFF_MS / 1000)
                continue
            if result.diverging_epoch is not None:
                end_before = self._log.log_end_offset
                truncate_to_epoch_end(self._log, *result.diverging_epoch, name=self.name)
                self._on_progress()
                if self._log.log_end_offset == end_before:  # nothing left to cut: do not spin
                    await asyncio.sleep(FOLLOWER_ERROR_BACKOFF_MS / 1000)
                continue
            if isinstance(result.error, OffsetMovedToTieredStorageError):
                await self._start_from_remote(result.log_start_offset)
                continue
            if result.error is not None:
                self._handle_error(result)
                await asyncio.sleep(FOLLOWER_ERROR_BACKOFF_MS / 1000)
                continue
            if result.records:
                await self._throttle.pace(len(result.records))  # at the follower's share of its throttle, if any
            try:
                self._append(result)
            except KafkaStorageError:
                raise
            except KafkaError as e:
                logger.error("%s: cannot append what the leader sent: %s", self.name, e)
                await asyncio.sleep(FOLLOWER_ERROR_BACKOFF_MS / 1000)
            self._on_progress()

    def _append(self, result: Any) -> None:
        log = self._log
        if result.records:
            first = BatchHeader.parse(result.records)
            if first.base_offset < log.log_end_offset <= first.last_offset:
                # Our log ends inside the leader's first batch (it was cut at a boundary of
                # ours that is not one of the leader's): take the batch whole.
                log.truncate_to(first.base_offset)
            log.append_as_follower(result.records)
        new_hw = min(result.high_watermark, log.log_end_offset)
        if new_hw > log.high_watermark:
            log.high_watermark = new_hw
        # The leader's log start moved past ours (DeleteRecords, retention): so does ours,
        # as far as our HW, as Kafka's followers do (ReplicaFetcherThread.processPartitionData).
        log_start = min(result.log_start_offset, log.high_watermark)
        if log_start > log.log_start_offset:
            log.maybe_increment_log_start_offset(log_start)

    async def _next_answer(self) -> FetchResult:
        """The next answer to handle: one the native loop handed back after copying what
        came before it (native_copy.py), or, where it does not run, a fetch's."""
        native = self._native
        if native is not None and not native.unusable and not self._throttle.active:
            timeout_ms = int(self._timeout_s * 1000)
            result = await native.copy(self._fetch_request(), timeout_ms, lambda: not self._throttle.active)
            if result is not None:
                return result
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the
        # cancellation that stops this loop when the call completes at that moment.
        async with asyncio.timeout(self._timeout_s):
            return await self._leader.fetch(self._fetch_request())

    def _fetch_request(self) -> FetchRequest:
        c = self._config
        return FetchRequest(
            self._log.log_end_offset,
            self._throttle.max_bytes(c.replica_fetch_max_bytes),
            c.replica_fetch_min_bytes,
            c.replica_fetch_wait_max_ms,
            replica_id=self.broker_id,
            leader_epoch=self._epoch,
            last_fetched_epoch=self._log.latest_epoch,
            incarnation_id=self._incarnation_id,
        )

    async def _truncate_to_leader(self) -> None:
        """OffsetsForLeaderEpoch for this log's latest epoch, retried until answered."""
        while (latest := self._log.latest_epoch) != UNDEFINED_EPOCH:
            try:
                async with asyncio.timeout(self._timeout_s):
                    epoch, end_offset = await self._leader.offsets_for_leader_epoch(latest)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # not reachable yet, or not leading yet: ask again
                logger.info("%s: OffsetsForLeaderEpoch(%d) not answered yet: %s", self.name, latest, e)
                await asyncio.sleep(FOLLOWER_ERROR_BACKOFF_MS / 1000)
                continue
            truncate_to_epoch_end(self._log, epoch, end_offset, self.name)
            self._on_progress()
            return

    async def _start_from_remote(self, local_log_start: int) -> None:
        """Our log ends below the leader's local log start, and what lies between is only in
        remote storage (KIP-405's follower): start our log at the leader's local log start
        with the producer state and leader epochs of the remote copy that ends there, as
        Kafka's follower rebuilds its state from the remote segment's producer snapshot and
        leader-epoch checkpoint. Retried after a backoff while the store cannot be read."""
        snapshot, epochs = None, ()
        if self._remote_start_state is not None:
            try:
                snapshot, epochs = await self._remote_start_state(local_log_start)
            except KafkaError as e:
                logger.warning("%s: cannot read the remote copy's state to start at %d: %s", self.name, local_log_start, e)
                await asyncio.sleep(FOLLOWER_ERROR_BACKOFF_MS / 1000)
                return
        logger.info("%s: starting the log at the leader's local log start %d from its remote copy", self.name, local_log_start)
        self._log.truncate_fully_and_start_at(local_log_start, snapshot, epochs)
        self._on_progress()

    def _handle_error(self, result: Any) -> None:
        log = self._log
        if isinstance(result.error, OffsetOutOfRangeError):
            if log.log_end_offset < result.log_start_offset:
                log.truncate_fully_and_start_at(result.log_start_offset)
            elif log.log_end_offset > result.log_end_offset:
                log.truncate_to(result.log_end_offset)
            self._on_progress()
        elif isinstance(result.error, KafkaError) and not result.error.retriable:
            logger.error("%s: fetch error %s", self.name, result.error)
