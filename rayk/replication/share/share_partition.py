"""SharePartition: one partition's delivery state in a share group (KIP-932), as pure state
(no I/O, no clock of its own), which the partition's leader hosts (share_fetch.py).

A share group's members consume a partition together, record by record, instead of
owning it. The partition keeps, as Kafka's SharePartition does:
- the share-partition start offset (SPSO): every record before it is done with;
- the end offset (SPEO): the next record never handed out yet;
- for each record in between (the in-flight records), its state and delivery count:
  AVAILABLE (to be handed out again), ACQUIRED (by one member, until its acquisition
  lock expires at `lock_deadline_ms`), ACKNOWLEDGED (accepted) or ARCHIVED (rejected, or
  delivered `delivery_count_limit` times without being accepted).

`acquire` hands a member the AVAILABLE in-flight records first, oldest first, then new ones
from SPEO up to the log end, at most `max_records` and never more than `max_in_flight`
past SPSO; each delivery counts. `acquire_batch` takes new records up to a given offset at
once, past the window if SPEO is inside it: a leader takes whole log batches (as Kafka's
aligns acquisitions to batches), so that a fetch answers few records that are not the
member's.

The in-flight records are kept as runs of consecutive records in one state (`Run`, Kafka's
InFlightBatch), split where an acknowledgement or an expiry makes them differ and joined
where they agree again, so a fetch of a 10,000-record batch costs one run, not 10,000
records. `in_flight` shows them record by record (for tests and inspection). `acknowledge` settles records the member holds: ACCEPT
(done), RELEASE (available again) or REJECT (archived); a record it does not hold is
INVALID_RECORD_STATE, and nothing of that acknowledgement is applied. A lock that expires
(`expire_locks`), or a member that leaves (`release_member`), makes its records available
again; a record released, rejected or expired at its delivery limit is archived instead
(Kafka's group.share.delivery.count.limit, 5). SPSO then moves past every record that is
done, so the window slides on.

What is durable (Kafka's share-group state: a start offset and batches of delivery states
and counts) is `snapshot`: an ACQUIRED record is stored as AVAILABLE with its count, so a
new leader hands it out again, and counts the delivery already made.

Invariants, asserted where the state changes: the runs cover [SPSO, SPEO) in order, and
the record at SPSO is not done; SPSO and SPEO only move forward; an ACQUIRED record has an
owner, and no other record has an owner or a lock; an AVAILABLE record has been delivered
fewer than `delivery_count_limit` times, an ACQUIRED one at least once and at most that
many (a DONE one may have more: a state restored under a lower limit). What a fetch or an
acknowledgement does (per request) is checked where it changes a run (handed out, settled,
appended at SPEO) and at both ends of the runs, in constant time; the rarer changes (a
restore, a start moved by retention, locks expired, a member gone) are followed by
`_check`, which walks every run.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rayk.errors import InvalidRecordStateError

DEFAULT_DELIVERY_COUNT_LIMIT = 5  # group.share.delivery.count.limit
DEFAULT_LOCK_DURATION_MS = 30_000  # group.share.record.lock.duration.ms
DEFAULT_MAX_IN_FLIGHT = 2_000  # group.share.partition.max.record.locks


class RecordState(enum.Enum):
    """What has become of one in-flight record of a share-partition: available to hand out,
    acquired by a member, or done (acknowledged, or archived)."""

    AVAILABLE = "available"
    ACQUIRED = "acquired"
    ACKNOWLEDGED = "acknowledged"
    ARCHIVED = "archived"


class AcknowledgeType(enum.IntEnum):
    """ShareAcknowledge's acknowledge types (Kafka's codes)."""

    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


DONE = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


@dataclass(slots=True)
class InFlightRecord:
    """One in-flight record's state as `SharePartition.in_flight` shows it (for tests and
    inspection): the runs it belongs to, one record at a time."""

    state: RecordState
    delivery_count: int
    member_id: str | None = None  # who holds it, while ACQUIRED
    lock_deadline_ms: int = 0


@dataclass(frozen=True, slots=True)
class AcquiredRange:
    """Consecutive records acquired together, all in the same delivery."""

    first_offset: int
    last_offset: int
    delivery_count: int  # this delivery included (1: the first)

    @property
    def offsets(self) -> range:
        return range(self.first_offset, self.last_offset + 1)


@dataclass(slots=True)
class Run:
    """Consecutive in-flight records in the same state (Kafka's InFlightBatch): the
    partition splits a run where records come to differ, and joins runs that agree again."""

    first: int
    last: int
    state: RecordState
    delivery_count: int
    member_id: str | None = None
    lock_deadline_ms: int = 0

    def agrees_with(self, other: Run) -> bool:
        return (self.state, self.delivery_count, self.member_id, self.lock_deadline_ms) == (
            other.state, other.delivery_count, other.member_id, other.lock_deadline_ms)


@dataclass(frozen=True, slots=True)
class StateBatch:
    """Consecutive in-flight records with one durable state and delivery count."""

    first_offset: int
    last_offset: int
    state: RecordState  # never ACQUIRED
    delivery_count: int


@dataclass(frozen=True, slots=True)
class ShareState:
    """What survives a leader move: SPSO and the in-flight records' batches."""

    start_offset: int
    batches: tuple[StateBatch, ...]


class SharePartition:
    """One share group's delivery state of one partition: owns SPSO, SPEO and the runs of
    in-flight records between them. Hosted by the leader's SharePartitions, rebuilt from the
    coordinator's state (`restore`) after a leader move; pure (the caller passes the clock)
    and not thread-safe."""

    def __init__(self, start_offset: int, delivery_count_limit: int = DEFAULT_DELIVERY_COUNT_LIMIT,
                 lock_duration_ms: int = DEFAULT_LOCK_DURATION_MS, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:  # fmt: skip
        assert start_offset >= 0 and delivery_count_limit >= 1 and lock_duration_ms > 0 and max_in_flight > 0
        self.start_offset = start_offset  # SPSO
        self.end_offset = start_offset  # SPEO
        self.delivery_count_limit = delivery_count_limit
        self.lock_duration_ms = lock_duration_ms
        self.max_in_flight = max_in_flight
        self.runs: list[Run] = []  # covering [SPSO, SPEO) in order

    # ------------------------------------------------------------------ delivering

    def acquire(self, member_id: str, max_records: int, log_end_offset: int, now_ms: int) -> list[AcquiredRange]:
        """Up to `max_records` records for `member_id`, locked until now + lock duration:
        available in-flight records first (redeliveries), then new ones, all below
        `log_end_offset` (the high watermark, or the LSO under read_committed: a new
        leader's may be below records its predecessor handed out)."""
        acquired: list[AcquiredRange] = []
        remaining = max_records
        i = 0
        while i < len(self.runs) and remaining > 0:
            run = self.runs[i]
            if run.state is RecordState.AVAILABLE and run.first < log_end_offset:
                self._cut(i, min(run.last, log_end_offset - 1, run.first + remaining - 1) + 1)
                acquired.append(self._lock(run, member_id, now_ms))
                remaining -= run.last - run.first + 1
            i += 1
        limit = min(log_end_offset, self.start_offset + self.max_in_flight)
        if remaining > 0 and self.end_offset < limit:
            acquired.append(self._take_new(member_id, min(limit, self.end_offset + remaining), now_ms))
        self._join()
        return acquired

    def acquire_batch(self, member_id: str, end_offset: int, now_ms: int) -> AcquiredRange | None:
        """The new records from SPEO up to `end_offset` (the end of a log batch), whole, if
        SPEO is inside the in-flight window; else None."""
        if end_offset <= self.end_offset or self.end_offset >= self.start_offset + self.max_in_flight:
            return None
        return self._take_new(member_id, end_offset, now_ms)

    def _take_new(self, member_id: str, end_offset: int, now_ms: int) -> AcquiredRange:
        run = Run(self.end_offset, end_offset - 1, RecordState.AVAILABLE, 0)
        self._append_run(run)
        return self._lock(run, member_id, now_ms)

    def _lock(self, run: Run, member_id: str, now_ms: int) -> AcquiredRange:
        assert run.state is RecordState.AVAILABLE and run.delivery_count < self.delivery_count_limit, (
            f"only an available record below its delivery limit is handed out: {run}")
        run.state, run.member_id = RecordState.ACQUIRED, member_id
        run.delivery_count += 1
        run.lock_deadline_ms = now_ms + self.lock_duration_ms
        return AcquiredRange(run.first, run.last, run.delivery_count)

    def pass_over(self, end_offset: int) -> None:
        """The offsets from SPEO up to `end_offset` hold nothing to deliver (a control
        batch, or a gap that compaction left): they count as done."""
        if end_offset > self.end_offset:
            self._append_run(Run(self.end_offset, end_offset - 1, RecordState.ARCHIVED, 0))
        self._advance()

    def move_start(self, log_start_offset: int) -> None:
        """The log no longer holds records before `log_start_offset` (retention deleted
        them): SPSO moves there, and whatever was in flight before it is gone."""
        if log_start_offset <= self.start_offset:
            return
        if log_start_offset < self.end_offset:
            self._split(log_start_offset)
        self.runs = [r for r in self.runs if r.first >= log_start_offset]
        self.start_offset = log_start_offset
        self.end_offset = max(self.end_offset, log_start_offset)
        self._advance()
        assert self._check()

    # ------------------------------------------------------------------ settling

    def acknowledge(self, member_id: str, offsets: Iterable[int], kind: AcknowledgeType) -> None:
        """Settles records `member_id` holds (by offset); see `acknowledge_ranges`."""
        ranges: list[tuple[int, int]] = []
        for offset in sorted(set(offsets)):
            if ranges and ranges[-1][1] + 1 == offset:
                ranges[-1] = (ranges[-1][0], offset)
            else:
                ranges.append((offset, offset))
        self.acknowledge_ranges(member_id, ranges, kind)

    def acknowledge_ranges(self, member_id: str, ranges: Iterable[tuple[int, int]], kind: AcknowledgeType) -> None:
        """Settles the records of `ranges` (first, last), which `member_id` must hold;
        INVALID_RECORD_STATE (and nothing applied) if any of them is not ACQUIRED by it."""
        ranges = sorted(ranges)
        for (first, last), following in zip(ranges, ranges[1:] + [(None, None)]):
            if last < first or (following[0] is not None and following[0] <= last):
                raise InvalidRecordStateError(f"acknowledgement ranges {ranges} overlap or are empty")
            if first < self.start_offset or last >= self.end_offset:
                raise InvalidRecordStateError(f"offsets {first}-{last} are not in flight "
                                              f"[{self.start_offset}, {self.end_offset})")  # fmt: skip
            for run in self._overlapping(first, last):
                if run.state is not RecordState.ACQUIRED or run.member_id != member_id:
                    state = f"{run.state.value} by {run.member_id!r}" if run.member_id else run.state.value
                    raise InvalidRecordStateError(f"offsets {max(first, run.first)}-{min(last, run.last)} are {state}, "
                                                  f"not acquired by member {member_id!r}")  # fmt: skip
        for first, last in ranges:
            self._split(first)
            if last + 1 < self.end_offset:
                self._split(last + 1)
            for run in self._overlapping(first, last):
                assert run.state is RecordState.ACQUIRED and run.member_id == member_id, f"checked above: {run}"
                if kind is AcknowledgeType.ACCEPT:
                    self._settle(run, RecordState.ACKNOWLEDGED)
                elif kind is AcknowledgeType.REJECT:
                    self._settle(run, RecordState.ARCHIVED)
                else:
                    self._make_available(run)
        self._join()
        self._advance()

    def expire_locks(self, now_ms: int) -> int:
        """Makes records whose acquisition lock expired available again (or archives them
        at the delivery limit); returns how many."""
        return self._release(lambda run: run.lock_deadline_ms <= now_ms)

    def release_member(self, member_id: str) -> int:
        """A member left the group: its records are available again at once."""
        return self._release(lambda run: run.member_id == member_id)

    def _release(self, which: Any) -> int:
        released = 0
        for run in self.runs:
            if run.state is RecordState.ACQUIRED and which(run):
                released += run.last - run.first + 1
                self._make_available(run)
        if released:
            self._join()
            self._advance()
            assert self._check()
        return released

    def _make_available(self, run: Run) -> None:
        done = run.delivery_count >= self.delivery_count_limit
        self._settle(run, RecordState.ARCHIVED if done else RecordState.AVAILABLE)

    @staticmethod
    def _settle(run: Run, state: RecordState) -> None:
        assert run.state is RecordState.ACQUIRED and state is not RecordState.ACQUIRED, (run, state)
        run.state, run.member_id, run.lock_deadline_ms = state, None, 0

    def _advance(self) -> None:
        """SPSO moves past every record that is done; they leave the in-flight window."""
        done = 0
        while done < len(self.runs) and self.runs[done].state in DONE:
            done += 1
        if done:
            del self.runs[:done]
        start_offset = self.runs[0].first if self.runs else self.end_offset
        assert self.start_offset <= start_offset, f"SPSO {self.start_offset} only moves forward, not to {start_offset}"
        assert not self.runs or self.runs[-1].last + 1 == self.end_offset, f"the runs end at SPEO {self.end_offset}"
        self.start_offset = start_offset

    # ------------------------------------------------------------------ runs

    def _append_run(self, run: Run) -> None:
        """New records from SPEO on (checked here, not by a walk of every run: a fetch
        appends once per log batch)."""
        assert run.first == self.end_offset <= run.last, f"SPEO {self.end_offset} only moves forward, by {run}"
        assert not self.runs or self.runs[-1].last + 1 == run.first, f"the runs cover [SPSO, SPEO) in order: {run}"
        self.runs.append(run)
        self.end_offset = run.last + 1

    def _index(self, offset: int) -> int:
        """The index of the run holding `offset` (SPSO <= offset < SPEO)."""
        return bisect.bisect_right(self.runs, offset, key=lambda r: r.first) - 1

    def _split(self, offset: int) -> None:
        """Makes a run start at `offset` (SPSO <= offset < SPEO)."""
        i = self._index(offset)
        self._cut(i, offset)

    def _cut(self, i: int, offset: int) -> None:
        """Splits run i so that it ends just before `offset` (if it reaches past it)."""
        run = self.runs[i]
        if run.first < offset <= run.last:
            self.runs.insert(i + 1, Run(offset, run.last, run.state, run.delivery_count, run.member_id,
                                        run.lock_deadline_ms))  # fmt: skip
            run.last = offset - 1

    def _overlapping(self, first: int, last: int) -> list[Run]:
        i = self._index(first)
        out = []
        while i < len(self.runs) and self.runs[i].first <= last:
            out.append(self.runs[i])
            i += 1
        return out

    def _join(self) -> None:
        """Adjacent runs that agree become one."""
        joined: list[Run] = []
        for run in self.runs:
            if joined and joined[-1].agrees_with(run):
                joined[-1].last = run.last
            else:
                joined.append(run)
        self.runs = joined
        assert not joined or (joined[0].first == self.start_offset and joined[-1].last + 1 == self.end_offset), (
            f"the runs cover [SPSO {self.start_offset}, SPEO {self.end_offset})")

    def _check(self) -> bool:
        """Asserts the invariants (see the module docstring); True, so that callers write
        `assert self._check()` and `python -O` skips the walk too."""
        assert 0 <= self.start_offset <= self.end_offset, (self.start_offset, self.end_offset)
        assert not self.runs or self.runs[0].state not in DONE, f"SPSO is at a record not done: {self.runs[0]}"
        limit, first = self.delivery_count_limit, self.start_offset
        for run in self.runs:
            assert run.first == first <= run.last, f"the runs cover [SPSO, SPEO) in order: {run} where {first} was due"
            first = run.last + 1
            if run.state is RecordState.ACQUIRED:
                assert run.member_id is not None, f"an acquired record has an owner: {run}"
                assert 1 <= run.delivery_count <= limit, f"an acquired record was delivered 1 to {limit} times: {run}"
            else:
                assert run.member_id is None and not run.lock_deadline_ms, f"only acquired records have an owner: {run}"
                assert run.state is not RecordState.AVAILABLE or 0 <= run.delivery_count < limit, (
                    f"an available record is below its delivery limit {limit}: {run}")
        assert first == self.end_offset, f"the runs end at SPEO {self.end_offset}, not {first}"
        return True

    # ------------------------------------------------------------------ inspection

    @property
    def in_flight(self) -> dict[int, InFlightRecord]:
        """Every in-flight record by offset (a copy, record by record: for tests and inspection)."""
        return {o: InFlightRecord(r.state, r.delivery_count, r.member_id, r.lock_deadline_ms)
                for r in self.runs for o in range(r.first, r.last + 1)}  # fmt: skip

    def acquirable(self, log_end_offset: int) -> bool:
        """Whether `acquire` would find records below `log_end_offset`: an available one in
        flight, or new ones inside the window (which may turn out to be only control
        batches or gaps, passed over when acquired)."""
        if any(r.state is RecordState.AVAILABLE and r.first < log_end_offset for r in self.runs):
            return True
        return self.end_offset < min(log_end_offset, self.start_offset + self.max_in_flight)

    def held_by(self, member_id: str) -> int:
        """How many records `member_id` holds now."""
        return sum(r.last - r.first + 1 for r in self.runs if r.state is RecordState.ACQUIRED and r.member_id == member_id)

    def acquired_count(self) -> int:
        return sum(r.last - r.first + 1 for r in self.runs if r.state is RecordState.ACQUIRED)

    def next_lock_deadline_ms(self) -> int | None:
        """When the first acquisition lock expires (None: nothing is acquired)."""
        return min((r.lock_deadline_ms for r in self.runs if r.state is RecordState.ACQUIRED), default=None)

    # ------------------------------------------------------------------ durability

    def snapshot(self) -> ShareState:
        """The durable state: acquired records as available, with their counts."""
        batches: list[StateBatch] = []
        for run in self.runs:
            state = RecordState.AVAILABLE if run.state is RecordState.ACQUIRED else run.state
            last = batches[-1] if batches else None
            if last is not None and (last.state, last.delivery_count) == (state, run.delivery_count):
                batches[-1] = StateBatch(last.first_offset, run.last, state, run.delivery_count)
            else:
                batches.append(StateBatch(run.first, run.last, state, run.delivery_count))
        return ShareState(self.start_offset, tuple(batches))

    @classmethod
    def restore(cls, state: ShareState, **settings: int) -> SharePartition:
        partition = cls(state.start_offset, **settings)
        for batch in state.batches:
            assert batch.state is not RecordState.ACQUIRED and batch.first_offset == partition.end_offset
            # A record saved while acquired for its last delivery is done: it was delivered
            # as often as it may be (in memory its release would have archived it).
            spent = batch.state is RecordState.AVAILABLE and batch.delivery_count >= partition.delivery_count_limit
            partition.runs.append(Run(batch.first_offset, batch.last_offset,
                                      RecordState.ARCHIVED if spent else batch.state, batch.delivery_count))  # fmt: skip
            partition.end_offset = batch.last_offset + 1
        partition._join()
        partition._advance()
        assert partition._check()
        return partition
