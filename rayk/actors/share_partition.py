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
past SPSO; each delivery counts. `acknowledge` settles records the member holds: ACCEPT
(done), RELEASE (available again) or REJECT (archived); a record it does not hold is
INVALID_RECORD_STATE, and nothing of that acknowledgement is applied. A lock that expires
(`expire_locks`), or a member that leaves (`release_member`), makes its records available
again; a record released, rejected or expired at its delivery limit is archived instead
(Kafka's group.share.delivery.count.limit, 5). SPSO then moves past every record that is
done, so the window slides on.

What is durable (Kafka's share-group state: a start offset and batches of delivery states
and counts) is `snapshot`: an ACQUIRED record is stored as AVAILABLE with its count, so a
new leader hands it out again, and counts the delivery already made.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from rayk.errors import InvalidRecordStateError

DEFAULT_DELIVERY_COUNT_LIMIT = 5  # group.share.delivery.count.limit
DEFAULT_LOCK_DURATION_MS = 30_000  # group.share.record.lock.duration.ms
DEFAULT_MAX_IN_FLIGHT = 2_000  # group.share.partition.max.record.locks


class RecordState(enum.Enum):
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
    state: RecordState
    delivery_count: int
    member_id: str | None = None  # who holds it, while ACQUIRED
    lock_deadline_ms: int = 0


@dataclass(frozen=True, slots=True)
class AcquiredRecord:
    offset: int
    delivery_count: int  # this delivery included (1: the first)


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
    def __init__(self, start_offset: int, delivery_count_limit: int = DEFAULT_DELIVERY_COUNT_LIMIT,
                 lock_duration_ms: int = DEFAULT_LOCK_DURATION_MS, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:  # fmt: skip
        assert start_offset >= 0 and delivery_count_limit >= 1 and lock_duration_ms > 0 and max_in_flight > 0
        self.start_offset = start_offset  # SPSO
        self.end_offset = start_offset  # SPEO
        self.delivery_count_limit = delivery_count_limit
        self.lock_duration_ms = lock_duration_ms
        self.max_in_flight = max_in_flight
        self.in_flight: dict[int, InFlightRecord] = {}  # offset -> record, SPSO <= offset < SPEO

    # ------------------------------------------------------------------ delivering

    def acquire(self, member_id: str, max_records: int, log_end_offset: int, now_ms: int) -> list[AcquiredRecord]:
        """Up to `max_records` records for `member_id`, locked until now + lock duration:
        available in-flight records first (redeliveries), then new ones, all below
        `log_end_offset` (the high watermark, or the LSO under read_committed: a new
        leader's may be below records its predecessor handed out)."""
        acquired: list[AcquiredRecord] = []
        available = (o for o, r in self.in_flight.items() if r.state is RecordState.AVAILABLE and o < log_end_offset)
        for offset in sorted(available):
            if len(acquired) >= max_records:
                return acquired
            acquired.append(self._lock(offset, member_id, now_ms))
        limit = min(log_end_offset, self.start_offset + self.max_in_flight)
        while len(acquired) < max_records and self.end_offset < limit:
            self.in_flight[self.end_offset] = InFlightRecord(RecordState.AVAILABLE, 0)
            acquired.append(self._lock(self.end_offset, member_id, now_ms))
            self.end_offset += 1
        return acquired

    def pass_over(self, end_offset: int) -> None:
        """The offsets from SPEO up to `end_offset` hold nothing to deliver (a control
        batch, or a gap that compaction left): they count as done."""
        while self.end_offset < end_offset:
            self.in_flight[self.end_offset] = InFlightRecord(RecordState.ARCHIVED, 0)
            self.end_offset += 1
        self._advance()

    def move_start(self, log_start_offset: int) -> None:
        """The log no longer holds records before `log_start_offset` (retention deleted
        them): SPSO moves there, and whatever was in flight before it is gone."""
        if log_start_offset <= self.start_offset:
            return
        for offset in range(self.start_offset, min(log_start_offset, self.end_offset)):
            del self.in_flight[offset]
        self.start_offset = log_start_offset
        self.end_offset = max(self.end_offset, log_start_offset)
        self._advance()

    def held_by(self, member_id: str) -> int:
        """How many records `member_id` holds now."""
        return sum(1 for r in self.in_flight.values() if r.state is RecordState.ACQUIRED and r.member_id == member_id)

    def _lock(self, offset: int, member_id: str, now_ms: int) -> AcquiredRecord:
        record = self.in_flight[offset]
        record.state, record.member_id = RecordState.ACQUIRED, member_id
        record.delivery_count += 1
        record.lock_deadline_ms = now_ms + self.lock_duration_ms
        return AcquiredRecord(offset, record.delivery_count)

    # ------------------------------------------------------------------ settling

    def acknowledge(self, member_id: str, offsets: Iterable[int], kind: AcknowledgeType) -> None:
        """Settles records `member_id` holds; INVALID_RECORD_STATE (and nothing applied)
        if any of them is not ACQUIRED by it."""
        offsets = sorted(set(offsets))
        for offset in offsets:
            record = self.in_flight.get(offset)
            if record is None or record.state is not RecordState.ACQUIRED or record.member_id != member_id:
                state = "not in flight" if record is None else f"{record.state.value} by {record.member_id!r}"
                raise InvalidRecordStateError(f"offset {offset} is {state}, not acquired by member {member_id!r}")
        for offset in offsets:
            record = self.in_flight[offset]
            if kind is AcknowledgeType.ACCEPT:
                self._settle(record, RecordState.ACKNOWLEDGED)
            elif kind is AcknowledgeType.REJECT:
                self._settle(record, RecordState.ARCHIVED)
            else:
                self._make_available(record)
        self._advance()

    def expire_locks(self, now_ms: int) -> int:
        """Makes records whose acquisition lock expired available again (or archives them
        at the delivery limit); returns how many."""
        expired = [r for r in self.in_flight.values() if r.state is RecordState.ACQUIRED and r.lock_deadline_ms <= now_ms]
        for record in expired:
            self._make_available(record)
        self._advance()
        return len(expired)

    def release_member(self, member_id: str) -> int:
        """A member left the group: its records are available again at once."""
        held = [r for r in self.in_flight.values() if r.state is RecordState.ACQUIRED and r.member_id == member_id]
        for record in held:
            self._make_available(record)
        self._advance()
        return len(held)

    def _make_available(self, record: InFlightRecord) -> None:
        done = record.delivery_count >= self.delivery_count_limit
        self._settle(record, RecordState.ARCHIVED if done else RecordState.AVAILABLE)

    @staticmethod
    def _settle(record: InFlightRecord, state: RecordState) -> None:
        record.state, record.member_id, record.lock_deadline_ms = state, None, 0

    def _advance(self) -> None:
        """SPSO moves past every record that is done; they leave the in-flight window."""
        while self.start_offset < self.end_offset and self.in_flight[self.start_offset].state in DONE:
            del self.in_flight[self.start_offset]
            self.start_offset += 1
        assert self.start_offset <= self.end_offset and len(self.in_flight) == self.end_offset - self.start_offset

    # ------------------------------------------------------------------ durability

    def snapshot(self) -> ShareState:
        """The durable state: acquired records as available, with their counts."""
        batches: list[StateBatch] = []
        for offset in range(self.start_offset, self.end_offset):
            record = self.in_flight[offset]
            state = RecordState.AVAILABLE if record.state is RecordState.ACQUIRED else record.state
            last = batches[-1] if batches else None
            if last is not None and (last.state, last.delivery_count) == (state, record.delivery_count):
                batches[-1] = StateBatch(last.first_offset, offset, state, record.delivery_count)
            else:
                batches.append(StateBatch(offset, offset, state, record.delivery_count))
        return ShareState(self.start_offset, tuple(batches))

    @classmethod
    def restore(cls, state: ShareState, **settings: int) -> SharePartition:
        partition = cls(state.start_offset, **settings)
        for batch in state.batches:
            assert batch.state is not RecordState.ACQUIRED and batch.first_offset == partition.end_offset
            # A record saved while acquired for its last delivery is done: it was delivered
            # as often as it may be (in memory its release would have archived it).
            spent = batch.state is RecordState.AVAILABLE and batch.delivery_count >= partition.delivery_count_limit
            state = RecordState.ARCHIVED if spent else batch.state
            for offset in range(batch.first_offset, batch.last_offset + 1):
                partition.in_flight[offset] = InFlightRecord(state, batch.delivery_count)
            partition.end_offset = batch.last_offset + 1
        partition._advance()
        return partition
