"""SharePartitions: a partition leader's share-partitions (KIP-932), one per share group
that consumes the partition, and what ShareFetch and ShareAcknowledge do to them (Kafka's
SharePartitionManager).

Each share group's delivery state of this partition is a SharePartition
(share_partition.py). The leader loads it from the group coordinator the first time the
group fetches here in its leader epoch (`read_share_state`); a state never written starts
where the group's `share.auto.offset.reset` says (the high watermark for "latest", the log
start for "earliest"), and that start is written before any record is handed out, so every
later leader starts from the same offset.

`share_fetch` first applies the member's acknowledgements (and starts writing them), then
acquires records for it (`max_records` 0: none; with a wait, it is a probe, answered as soon
as records could be acquired, for a listener waiting on several partitions at once): available ones first (redeliveries), then new ones below the
high watermark, whole log batches at a time while fewer than `max_records` were acquired
(the last batch cut there), as Kafka aligns acquisitions to batches: a batch acquired
whole is answered whole, with no record the member must skip. A control batch, or a gap
that compaction left, holds nothing to deliver and is passed over. A fetch whose
acknowledgements freed records yields first to the fetches that were waiting for them,
or the acknowledging member would take everything it freed again at once. The answer is the log's whole batches that hold the acquired
records, and the acquired ranges with their delivery counts: the client keeps only the
records in those ranges (as Kafka's ShareFetch answers). With nothing to acquire, the
fetch waits up to `max_wait_ms` for the high watermark to move or a lock to expire.

Durability: whenever records are settled (ACCEPT, RELEASE, REJECT), the state is written
to the group coordinator (acks=all there) before the acknowledgement is answered (a
ShareFetch carrying acknowledgements acquires and reads while the write runs); writes
of one share-partition are coalesced, one in flight at a time. Expired locks are applied
at each fetch and written with the next write (a restored record at its delivery limit
is archived, share_partition.restore). Acquisitions are not written: a leader that fails
over hands the records its members held out again, counting the deliveries the state
has. If a write fails, the share-partition is dropped from memory and read again at the
next fetch, so the leader never acts on a state the coordinator does not have; the
records held are then handed out again (at-least-once).

A new leader epoch, or losing leadership, drops every share-partition (`close`): the next
leader reads the state its predecessor wrote, and the coordinator fences the
predecessor's later writes by leader epoch.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from rayk.replication.share.share_state import ShareStateRecord
from rayk.replication.share.share_partition import (
    AcknowledgeType,
    AcquiredRange,
    RecordState,
    SharePartition,
    ShareState,
    StateBatch,
)
from rayk.actors.wakeup import Wakeup
from rayk.dataplane.frames import MAX_RECORDS_BYTES, ShareFetchResult
from rayk.errors import (
    CoordinatorNotAvailableError,
    FencedLeaderEpochError,
    FencedStateEpochError,
    InvalidRecordStateError,
    InvalidRequestError,
    KafkaError,
    NotLeaderOrFollowerError,
)
from rayk.storage.log import Log
from rayk.storage.records import RecordBatch, iter_batches

logger = logging.getLogger(__name__)
T = TypeVar("T")

# What one read of the log takes while acquiring: a poll's worth of small batches (Kafka's
# default 2,000 records of 100 B in 16 KiB batches: ~220 KiB), a larger batch whole.
READ_CHUNK_BYTES = 256 << 10
Acknowledgement = tuple[int, int, int]  # (first offset, last offset, AcknowledgeType)


class ShareStateStore(Protocol):
    """Where the share-partitions' states are kept: the group coordinator's
    OffsetsPartitionReplica.read_share_state / write_share_state (share_state_client.py)."""

    async def read_share_state(self, group_id: str, topic: str, partition: int,
                               leader_epoch: int) -> tuple[ShareStateRecord | None, int, str]: ...  # fmt: skip

    async def write_share_state(self, group_id: str, topic: str, partition: int, leader_epoch: int, state_epoch: int,
                                start_offset: int, batches: list[tuple[int, int, str, int]],
                                create: bool = False) -> None: ...  # fmt: skip


@dataclass(frozen=True, slots=True)
class ShareSettings:
    """A broker's KIP-932 share-group settings, as every share-partition it leads applies
    them: group.share.record.lock.duration.ms, group.share.delivery.count.limit and
    group.share.partition.max.record.locks (the most records in flight past SPSO)."""

    lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    max_in_flight: int = 2_000


@dataclass(slots=True)
class _Hosted:
    partition: SharePartition
    state_epoch: int
    changes: int = 0  # settled changes applied in memory
    written: int = 0  # of those, how many the coordinator holds
    writing: asyncio.Task | None = None
    waiting: int = 0  # fetches waiting for records
    waiters: Wakeup = field(default_factory=Wakeup)  # fired when records come back


def acquired_ranges(acquired: Iterable[AcquiredRange]) -> tuple[tuple[int, int, int], ...]:
    """Acquired ranges as (first, last, delivery count), in offset order, consecutive
    ones of one delivery count joined."""
    runs: list[list[int]] = []
    for r in sorted(acquired, key=lambda r: r.first_offset):
        last = runs[-1] if runs else None
        if last is not None and last[1] + 1 == r.first_offset and last[2] == r.delivery_count:
            last[1] = r.last_offset
        else:
            runs.append([r.first_offset, r.last_offset, r.delivery_count])
    return tuple((a, b, c) for a, b, c in runs)


def to_state(start_offset: int, batches: Iterable[tuple[int, int, str, int]]) -> ShareState:
    return ShareState(start_offset, tuple(StateBatch(a, b, RecordState(s), n) for a, b, s, n in batches))


def from_state(state: ShareState) -> list[tuple[int, int, str, int]]:
    return [(b.first_offset, b.last_offset, b.state.value, b.delivery_count) for b in state.batches]


class SharePartitions:
    """A partition leader's share-partitions in one leader epoch: owns one SharePartition per
    share group fetching here (loaded from its coordinator on first use), its writes in
    flight and its waiting fetches. Made when the replica first serves a share fetch as
    leader, `close`d when the epoch ends; not thread-safe (the replica's event loop)."""

    def __init__(self, log: Log, topic: str, partition: int, leader_epoch: int, states: ShareStateStore,
                 settings: ShareSettings) -> None:  # fmt: skip
        self._log = log
        self.topic, self.partition, self.leader_epoch = topic, partition, leader_epoch
        self._states = states
        self._settings = settings
        self._hosted: dict[str, _Hosted] = {}
        self._loading: dict[str, asyncio.Task] = {}
        self._resets: dict[str, int] = {}  # per group, how often `forget` was told its state was reset
        self._closed = False

    # ------------------------------------------------------------------ the requests

    async def share_fetch(self, group_id: str, member_id: str, max_records: int, max_wait_ms: int,
                          acknowledgements: list[Acknowledgement] = ()) -> ShareFetchResult:  # fmt: skip
        written: asyncio.Future | None = None
        try:
            hosted = await self._hosted_for(group_id)
            ack_error, applied = self._apply(hosted, member_id, acknowledgements)
            if applied:  # written while this fetch acquires and reads; answered once written
                written = asyncio.ensure_future(self._write(group_id, hosted))
                if hosted.waiting:
                    await asyncio.sleep(0)  # the fetches that waited for what these freed acquire first
            deadline = time.monotonic() + max_wait_ms / 1000
            while True:
                hosted = await self._hosted_for(group_id)  # (a failed write dropped it)
                event = hosted.waiters
                read: list[RecordBatch] = []  # the log's batches that the acquisition read
                if max_records > 0:
                    acquired = self._acquire(hosted, member_id, max_records, read)
                    ready = bool(acquired)
                else:  # acknowledgements only (no wait), or a probe: wait for records to acquire
                    acquired, ready = [], max_wait_ms <= 0 or self._acquirable(hosted)
                remaining_s = deadline - time.monotonic()
                if ready or remaining_s <= 0:
                    break
                hosted.waiting += 1
                try:
                    await event.wait(min(remaining_s, self._until_next_expiry_s(hosted.partition)))
                finally:
                    hosted.waiting -= 1
            records = self._batches_of(acquired, read)
            if written is not None:
                ack_error = await _outcome(written) or ack_error
            if self._hosted.get(group_id) is not hosted:  # a write failed meanwhile: the state is read again
                return ShareFetchResult(acknowledge_error=ack_error)  # (what this fetch acquired is available there)
            return ShareFetchResult(records, acquired_ranges(acquired), ack_error)
        except KafkaError as e:
            ack_error = await _outcome(written) if written is not None else None
            return ShareFetchResult(acknowledge_error=(ack_error or e) if acknowledgements else None, error=e)

    async def share_acknowledge(self, group_id: str, member_id: str, acknowledgements: list[Acknowledgement]) -> None:
        """Settles the member's records and writes the state; raises the first error."""
        hosted = await self._hosted_for(group_id)
        error = await self._acknowledge(group_id, hosted, member_id, acknowledgements)
        if error is not None:
            raise error

    async def release_member(self, group_id: str, member_id: str) -> int:
        """The member left the group: what it holds is available at once (not written:
        a restore makes held records available too)."""
        hosted = self._hosted.get(group_id)
        if hosted is None:
            return 0
        released = hosted.partition.release_member(member_id)
        if released:
            hosted.changes += 1
            self._wake(hosted)
        return released

    def forget(self, group_id: str) -> None:
        """The coordinator holds a new state for the group (its offsets were altered or
        deleted): read at the next fetch. A write of the old one still running is fenced there,
        and a read of it still running is not kept (`_load_once`)."""
        self._resets[group_id] = self._resets.get(group_id, 0) + 1
        hosted = self._hosted.pop(group_id, None)
        if hosted is not None:
            self._wake(hosted)

    def describe(self) -> dict[str, dict[str, int]]:
        """Per group: SPSO, SPEO and how many records are in flight (ACQUIRED)."""
        return {g: {"start_offset": h.partition.start_offset, "end_offset": h.partition.end_offset,
                    "acquired": h.partition.acquired_count()} for g, h in self._hosted.items()}  # fmt: skip

    def close(self) -> None:
        """Leadership moved on: the states stay with the coordinator; waiters wake."""
        self._closed = True
        for task in self._loading.values():
            task.cancel()
        for hosted in self._hosted.values():
            if hosted.writing is not None:
                hosted.writing.cancel()
            hosted.waiters.fire()
        self._hosted.clear()

    def _not_leading(self) -> NotLeaderOrFollowerError:
        return NotLeaderOrFollowerError(f"{self.topic}-{self.partition} is not led here in epoch {self.leader_epoch}")

    def wake(self) -> None:
        """New records below the high watermark: waiting fetches look again."""
        for hosted in self._hosted.values():
            self._wake(hosted)

    # ------------------------------------------------------------------ loading

    async def _hosted_for(self, group_id: str) -> _Hosted:
        if self._closed:
            raise self._not_leading()
        hosted = self._hosted.get(group_id)
        if hosted is not None:
            return hosted
        task = self._loading.get(group_id)
        if task is None:
            task = self._loading[group_id] = asyncio.get_running_loop().create_task(self._load(group_id))
            task.add_done_callback(lambda _: self._loading.pop(group_id, None))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if self._closed:  # (close cancelled the load, not our caller)
                raise self._not_leading() from None
            raise

    async def _deposed_if_fenced(self, call: Awaitable[T]) -> T:
        """`call` to the coordinator; a newer leader seen there means this one is deposed
        (NOT_LEADER_OR_FOLLOWER, so that members look the leader up again)."""
        try:
            return await call
        except FencedLeaderEpochError as e:
            raise NotLeaderOrFollowerError(f"{self.topic}-{self.partition}: a newer leader wrote the share state: {e}") from None

    async def _load(self, group_id: str) -> _Hosted:
        for attempt in (1, 2):
            try:
                return await self._load_once(group_id)
            except FencedStateEpochError:  # another leader created the state, or it was reset, meanwhile: read it
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _load_once(self, group_id: str) -> _Hosted:
        resets = self._resets.get(group_id, 0)
        state, state_epoch, reset = await self._deposed_if_fenced(
            self._states.read_share_state(group_id, self.topic, self.partition, self.leader_epoch))
        s = self._settings
        settings = {"delivery_count_limit": s.delivery_count_limit, "lock_duration_ms": s.lock_duration_ms,
                    "max_in_flight": s.max_in_flight}  # fmt: skip
        log = self._log
        if state is not None and state.state_epoch == state_epoch:
            partition = SharePartition.restore(to_state(state.start_offset, state.batches), **settings)
            partition.move_start(log.log_start_offset)
            hosted = _Hosted(partition, state_epoch)
        else:
            start = log.high_watermark if reset == "latest" else log.log_start_offset
            hosted = _Hosted(SharePartition(start, **settings), state_epoch)
            hosted.changes = 1  # the start is written, only if no state came meanwhile, before anything is handed out
        if self._closed:
            raise self._not_leading()
        if hosted.changes:
            await self._write(group_id, hosted, create=state is None or state.state_epoch != state_epoch)
        if self._resets.get(group_id, 0) != resets:  # what was read is no longer the group's state
            raise FencedStateEpochError(f"share group {group_id!r}'s state was reset while it was read")
        self._hosted[group_id] = hosted
        return hosted

    # ------------------------------------------------------------------ acquiring

    def _acquire(self, hosted: _Hosted, member_id: str, max_records: int,
                 read_batches: list[RecordBatch]) -> list[AcquiredRange]:  # fmt: skip
        """Records for the member: redeliveries (at most `max_records`), then new records
        below the high watermark, log batch by log batch (the last one cut at
        `max_records`), while SPEO is inside the window (see the module docstring). The
        batches that new records were acquired from are added to `read_batches`, so that
        the answer need not read them again."""
        log, partition = self._log, hosted.partition
        now_ms = _now_ms()
        partition.move_start(log.log_start_offset)
        if partition.expire_locks(now_ms):
            hosted.changes += 1
        hw = log.high_watermark
        redeliverable, budget_bytes = self._redeliverable(partition, max_records, min(partition.end_offset, hw))
        acquired = partition.acquire(member_id, redeliverable, min(partition.end_offset, hw), now_ms)  # redeliveries
        count = sum(r.last_offset - r.first_offset + 1 for r in acquired)
        while count < max_records and partition.end_offset < min(hw, partition.start_offset + partition.max_in_flight):
            read = log.read(partition.end_offset, READ_CHUNK_BYTES, max_offset=hw)
            progressed = False
            for batch in iter_batches(read.records):
                header = batch.header
                if header.next_offset <= partition.end_offset:
                    continue
                if header.base_offset > partition.end_offset:
                    partition.pass_over(header.base_offset)  # a gap: compacted away
                if header.is_control:
                    partition.pass_over(header.next_offset)
                    progressed = True
                    continue
                if acquired and header.size_bytes > budget_bytes:
                    break
                budget_bytes -= header.size_bytes
                # Whole batches, but no more than max_records: the rest of a batch stays for the next fetch.
                got = partition.acquire_batch(member_id, min(header.next_offset, partition.end_offset + max_records - count),
                                              now_ms)  # fmt: skip
                if got is None:  # the window is full
                    break
                acquired.append(got)
                read_batches.append(batch)
                count += got.last_offset - got.first_offset + 1
                progressed = True
                if count >= max_records:
                    break
            if not progressed:
                break
        return acquired

    def _redeliverable(self, partition: SharePartition, max_records: int, end_offset: int) -> tuple[int, int]:
        """(how many of the available records, oldest first, `acquire` may take, and the
        frame's bytes left after their batches): the answer carries whole batches, and
        must fit one data plane frame (MAX_RECORDS_BYTES; its first batch whatever its size)."""
        ranges = [(r.first, min(r.last, end_offset - 1)) for r in partition.runs
                  if r.state is RecordState.AVAILABLE and r.first < end_offset]  # fmt: skip
        budget_bytes, count, i = MAX_RECORDS_BYTES, 0, 0
        read_from = ranges[0][0] if ranges else end_offset
        while i < len(ranges) and count < max_records:
            start = max(ranges[i][0], read_from)
            read = self._log.read(start, READ_CHUNK_BYTES, max_offset=end_offset)
            for batch in iter_batches(read.records):
                header = batch.header
                while i < len(ranges) and ranges[i][1] < header.base_offset:
                    i += 1
                inside = sum(min(b, header.last_offset) - max(a, header.base_offset) + 1 for a, b in ranges[i:]
                             if a <= header.last_offset)  # fmt: skip
                if i == len(ranges) or inside <= 0:
                    continue
                if count and header.size_bytes > budget_bytes:
                    return count, 0
                budget_bytes -= header.size_bytes
                count += inside
                if count >= max_records:
                    break
            if read.next_offset <= start:
                break  # nothing more to read there
            read_from = read.next_offset
        return max_records, max(budget_bytes, 0)

    def _acquirable(self, hosted: _Hosted) -> bool:
        """Whether a fetch would acquire records now (expired locks applied, as `_acquire` does)."""
        partition = hosted.partition
        partition.move_start(self._log.log_start_offset)
        if partition.expire_locks(_now_ms()):
            hosted.changes += 1
        return partition.acquirable(self._log.high_watermark)

    def _batches_of(self, acquired: list[AcquiredRange], read_batches: list[RecordBatch]) -> bytes:
        """The log's whole batches that hold the acquired offsets, in offset order: those
        among `read_batches` as they are, the others (redeliveries) read from the log."""
        known = sorted(read_batches, key=lambda b: b.header.base_offset)
        bases = [b.header.base_offset for b in known]
        chunks: dict[int, bytes] = {}
        missing: list[tuple[int, int]] = []
        for r in sorted(acquired, key=lambda r: r.first_offset):
            offset = r.first_offset
            while offset <= r.last_offset:
                i = bisect.bisect_right(bases, offset) - 1
                if i < 0 or known[i].header.last_offset < offset:
                    missing.append((offset, r.last_offset))
                    break
                batch = known[i]
                chunks.setdefault(batch.header.base_offset, batch.data)
                offset = batch.header.last_offset + 1
        self._read_batches_of(missing, chunks)
        return b"".join(chunks[k] for k in sorted(chunks))

    def _read_batches_of(self, ranges: list[tuple[int, int]], chunks: dict[int, bytes]) -> None:
        """Adds to `chunks` (base offset -> bytes) the log's batches that hold the offsets
        of `ranges` (sorted, apart)."""
        i, read_from = 0, 0
        while i < len(ranges):
            start = max(ranges[i][0], read_from)
            read = self._log.read(start, READ_CHUNK_BYTES, max_offset=self._log.high_watermark)
            for batch in iter_batches(read.records):
                header = batch.header
                while i < len(ranges) and ranges[i][1] < header.base_offset:
                    i += 1  # not in the log any more
                if i == len(ranges):
                    break
                if ranges[i][0] <= header.last_offset:
                    chunks.setdefault(header.base_offset, bytes(batch.data))
                while i < len(ranges) and ranges[i][1] <= header.last_offset:
                    i += 1
            if read.next_offset <= start:
                break  # nothing more to read there
            read_from = read.next_offset

    # ------------------------------------------------------------------ settling and writing

    async def _acknowledge(self, group_id: str, hosted: _Hosted, member_id: str,
                           acknowledgements: Iterable[Acknowledgement]) -> KafkaError | None:  # fmt: skip
        """Applies the acknowledgements and writes the state; the first error, None if all
        were applied and written."""
        error, applied = self._apply(hosted, member_id, acknowledgements)
        if applied:
            try:
                await self._write(group_id, hosted)
            except KafkaError as e:
                return e
        return error

    def _apply(self, hosted: _Hosted, member_id: str,
               acknowledgements: Iterable[Acknowledgement]) -> tuple[KafkaError | None, bool]:  # fmt: skip
        """Applies the acknowledgements in memory (each range all or nothing;
        INVALID_RECORD_STATE for one naming a record the member does not hold) and wakes
        the fetches waiting for records: (the first error, whether any was applied)."""
        error: KafkaError | None = None
        applied = 0
        for first, last, kind in acknowledgements:
            try:
                if last < first:
                    raise InvalidRequestError(f"acknowledgement range [{first}, {last}] is not a range")
                hosted.partition.acknowledge_ranges(member_id, [(first, last)], AcknowledgeType(kind))
                applied += 1
            except ValueError:
                error = error or InvalidRequestError(f"acknowledge type {kind} is none of ACCEPT, RELEASE, REJECT")
            except (InvalidRecordStateError, InvalidRequestError) as e:
                error = error or e
        if applied:
            hosted.changes += 1
            self._wake(hosted)
        return error, applied > 0

    async def _write(self, group_id: str, hosted: _Hosted, create: bool = False) -> None:
        """Returns once the coordinator holds every change applied before the call; with
        `create`, FENCED_STATE_EPOCH if a state was written since this one was read."""
        target = hosted.changes
        while hosted.written < target:
            if not create and self._hosted.get(group_id) is not hosted:  # a failed write dropped it
                raise CoordinatorNotAvailableError(f"share state of group {group_id!r} in {self.topic}-{self.partition} "
                                                   "was not written; it is read again")  # fmt: skip
            if hosted.writing is None:
                hosted.writing = asyncio.get_running_loop().create_task(self._write_once(group_id, hosted, create))
            try:
                await asyncio.shield(hosted.writing)
            except asyncio.CancelledError:
                if self._closed:
                    raise self._not_leading() from None
                raise

    async def _write_once(self, group_id: str, hosted: _Hosted, create: bool = False) -> None:
        changes = hosted.changes
        state = hosted.partition.snapshot()
        try:
            await self._deposed_if_fenced(self._states.write_share_state(
                group_id, self.topic, self.partition, self.leader_epoch, hosted.state_epoch, state.start_offset,
                from_state(state), create))  # fmt: skip
        except KafkaError as e:
            if self._hosted.get(group_id) is hosted:
                del self._hosted[group_id]  # memory must not run ahead of the coordinator: read again
                self._wake(hosted)
            logger.warning("%s-%d: share state of group %s not written (%s); it is read again", self.topic,
                           self.partition, group_id, e)  # fmt: skip
            raise
        finally:
            hosted.writing = None
        hosted.written = max(hosted.written, changes)

    # ------------------------------------------------------------------ waiting

    @staticmethod
    def _wake(hosted: _Hosted) -> None:
        event, hosted.waiters = hosted.waiters, Wakeup()
        event.fire()

    @staticmethod
    def _until_next_expiry_s(partition: SharePartition) -> float:
        deadline = partition.next_lock_deadline_ms()
        return float("inf") if deadline is None else max((deadline - _now_ms()) / 1000, 0.001)


async def _outcome(write: asyncio.Future) -> KafkaError | None:
    """A state write's error, None once it is written."""
    try:
        await write
    except KafkaError as e:
        return e
    return None


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
