"""ProducerStateManager: per producer id, the sequence numbers a partition has appended
(Kafka's ProducerStateManager, for idempotent producers).

An idempotent producer stamps each batch with its producer id, producer epoch and the
sequence number of its first record (fields of the v2 batch header); sequences count
records per partition from 0. For each producer the partition remembers its epoch, the
next expected sequence and its last `BATCHES_REMEMBERED` batches (sequences, offsets and
max timestamp). `check` classifies an incoming batch:

- APPEND: it continues the producer's sequence (or the producer is unknown and starts at 0);
- DUPLICATE: it is one of the remembered batches (a retry of a batch that was appended):
  answer with the original offsets, append nothing;
- GAP: it is ahead of the expected sequence. Over TCP that means lost batches; over Ray it
  usually means the actor calls arrived out of order (Ray does not order calls to an async
  actor), so the leader waits for the missing batches before deciding;
- or raises OUT_OF_ORDER_SEQUENCE_NUMBER (behind, and not a remembered batch) /
  INVALID_PRODUCER_EPOCH (an older epoch than the partition has seen).

Ownership: the partition's `Log` owns one and `record`s every batch with a producer id
that it appends, as leader or follower, so a new leader knows the producers already.
The Log persists it in `<offset>.snapshot` files (see `producer_snapshot.py`) and
rebuilds it after open or truncation from the newest valid snapshot plus the batches
after it, and drops the batches retention deleted (`remove_batches_below`). The state
is therefore always what feeding every producer batch of the log, from its start, to a
fresh manager gives. Entries compare equal by value.

Transactions (KIP-98): a producer's first transactional batch opens its transaction
(`current_txn_first_offset`); the transaction stays open, whatever else the producer
writes, until a marker (a control batch, see control_records.py) closes it:
`complete_txn` returns the CompletedTxn, which the Log indexes if it was aborted. Each
marker also records the coordinator epoch that wrote it. A transaction stays unstable
until the HW passes its marker (`on_high_watermark_updated`): its outcome is not final
before, since the marker may yet be truncated. `first_unstable_offset` is the first
offset of the earliest open or unreplicated transaction, what the LSO stops at. A new
producer epoch keeps the open transaction (a KIP-890 marker comes with the next epoch).

A producer's batch on the leader is checked against this state by `validate_client_batch`
(Kafka's ProducerAppendInfo for an append of CLIENT origin), which the Log runs under its
lock right before it writes, so that nothing that happened while the request waited (a
retry appended, a marker written) can be missed:
- its epoch and sequence (INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER, or the
  original batch if it is a duplicate);
- a plain batch while the producer's transaction is open here: INVALID_TXN_STATE ("expected
  a transactional write"), else anyone who guesses a producer id could bump its epoch and
  leave its transaction impossible to end;
- a transaction's first batch here must carry the `VerificationGuard` taken before the
  leader asked the coordinator (KIP-890), and that guard must still be the producer's: a
  marker written meanwhile voids it (INVALID_TXN_STATE), so a verification answered late
  never opens a transaction that the coordinator already ended (a hanging transaction).
Followers and recovery copy what the leader accepted and check nothing (`record`).

Pure logic, no I/O. Not thread-safe: the Log mutates it under its lock; the leader's
`check` runs on the same thread as its appends (the replica actor's event loop).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from rayk.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from rayk.storage.records import BatchHeader

BATCHES_REMEMBERED = 5  # Kafka's NUM_BATCHES_TO_RETAIN: a producer has at most 5 in flight
NO_COORDINATOR_EPOCH = -1
# Verifications in flight whose guards a partition keeps; past it the oldest guard is
# dropped, and its verification's append is refused (INVALID_TXN_STATE): never unbounded.
MAX_VERIFICATION_GUARDS = 10_000


class Verdict(enum.Enum):
    """How `check` classifies an idempotent producer's incoming batch: append it, answer it as
    a duplicate of a remembered batch, or wait for the batches missing before it."""

    APPEND = "append"
    DUPLICATE = "duplicate"
    GAP = "gap"


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One producer batch the partition remembers: its sequence range, its offsets in the log
    and its max timestamp, enough to answer a retry of it with the original offsets."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    timestamp_ms: int = -1  # the batch's max timestamp; -1 if unknown

    @classmethod
    def of(cls, header: BatchHeader) -> BatchMetadata:
        """The metadata of an appended batch (its offsets are the log's)."""
        return cls(
            header.base_sequence,
            header.base_sequence + header.last_offset_delta,
            header.base_offset,
            header.base_offset + header.last_offset_delta,
            header.max_timestamp,
        )


@dataclass(slots=True)
class ProducerEntry:
    """What a partition knows of one producer id: its latest epoch, its last
    BATCHES_REMEMBERED batches (the next sequence follows the newest), the coordinator epoch
    of its last marker, and the first offset of its open transaction."""

    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_REMEMBERED))
    coordinator_epoch: int = NO_COORDINATOR_EPOCH  # of the last marker for this producer
    current_txn_first_offset: int | None = None  # the open transaction's first batch

    @property
    def next_sequence(self) -> int:
        return self.batches[-1].last_sequence + 1 if self.batches else 0


class VerificationGuard:
    """Taken by a leader before it asks a transaction's coordinator about the producer's
    first batch here (KIP-890's VerificationGuard); the append succeeds only if the guard
    is still the producer's then. A marker for the producer, or the transaction opening,
    ends it. Compared by identity."""

    __slots__ = ("producer_id",)

    def __init__(self, producer_id: int) -> None:
        self.producer_id = producer_id

    def __repr__(self) -> str:
        return f"VerificationGuard(producer {self.producer_id}, {id(self):#x})"


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker just ended in this partition: its offset range, marker included,
    and whether it aborted (then the Log adds it to the transaction index)."""

    producer_id: int
    first_offset: int  # the transaction's first batch; the marker's offset if it wrote none
    last_offset: int  # the marker's offset
    is_aborted: bool


class ProducerStateManager:
    """Owns one partition's producer state: a ProducerEntry per producer id, the open and
    not-yet-stable transactions, and the verification guards in flight. Owned by its Log,
    which rebuilds it on open and truncation; pure, and not thread-safe (the Log's lock)."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self._ongoing: dict[int, int] = {}  # first offset -> producer id, of open transactions
        self._unreplicated: dict[int, CompletedTxn] = {}  # first offset -> completed, marker >= HW
        self._guards: dict[int, VerificationGuard] = {}  # producer id -> its verification in flight

    def check(self, producer_id: int, epoch: int, first_sequence: int, last_sequence: int) -> tuple[Verdict, BatchMetadata | None]:
        entry = self.producers.get(producer_id)
        if entry is None:
            return (Verdict.APPEND if first_sequence == 0 else Verdict.GAP), None
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(f"producer {producer_id} epoch {epoch} is older than {entry.epoch}")
        if epoch > entry.epoch:
            # A new epoch starts at sequence 0; a later batch of it that arrives first (Ray
            # does not order calls to an async actor) waits for that one, as within an epoch.
            return (Verdict.APPEND if first_sequence == 0 else Verdict.GAP), None
        for batch in entry.batches:
            if (batch.first_sequence, batch.last_sequence) == (first_sequence, last_sequence):
                return Verdict.DUPLICATE, batch
        expected = entry.next_sequence
        if first_sequence == expected:
            return Verdict.APPEND, None
        if first_sequence > expected:
            return Verdict.GAP, None
        raise OutOfOrderSequenceError(
            f"producer {producer_id}: sequence {first_sequence} is behind the expected {expected} "
            "and is not a recent batch"
        )

    def verification_guard(self, producer_id: int) -> VerificationGuard:
        """The producer's guard for a verification that starts now: the one in flight if
        there is one (a retry shares it), else a new one."""
        guard = self._guards.get(producer_id)
        if guard is None:
            if len(self._guards) >= MAX_VERIFICATION_GUARDS:
                del self._guards[next(iter(self._guards))]  # the oldest
            guard = self._guards[producer_id] = VerificationGuard(producer_id)
        return guard

    def holds_verification(self, guard: VerificationGuard) -> bool:
        """Whether `guard` is still its producer's verification in flight: no marker, and no
        newer verification, voided it since it was taken."""
        return self._guards.get(guard.producer_id) is guard

    def validate_client_batches(self, headers: list[BatchHeader], guard: VerificationGuard | None) -> BatchMetadata | None:
        """`validate_client_batch` for each batch with a producer id of one append, a batch
        checked against the state as the earlier ones of the append leave it. A retry comes
        alone (Kafka's Produce carries one batch per partition): its original is returned."""
        after: dict[int, tuple[int, int, bool]] = {}  # producer id -> (epoch, last sequence, transaction open)
        for header in headers:
            producer_id, epoch = header.producer_id, header.producer_epoch
            if producer_id < 0:
                continue
            earlier = after.get(producer_id)
            if earlier is None:
                duplicate = self.validate_client_batch(header, guard)
                if duplicate is not None:
                    if len(headers) > 1:
                        raise InvalidRecordError(f"producer {producer_id} retries a batch among {len(headers)} batches")
                    return duplicate
                entry = self.producers.get(producer_id)
                txn_open = header.is_transactional or (entry is not None and entry.current_txn_first_offset is not None)
            else:
                earlier_epoch, earlier_last_sequence, txn_open = earlier
                if epoch < earlier_epoch:
                    raise InvalidProducerEpochError(f"producer {producer_id} epoch {epoch} is older than {earlier_epoch}")
                expected = earlier_last_sequence + 1 if epoch == earlier_epoch else 0
                if header.base_sequence != expected:
                    raise OutOfOrderSequenceError(
                        f"producer {producer_id}: sequence {header.base_sequence} after {earlier_last_sequence} "
                        f"in one append (expected {expected})"
                    )
                if txn_open and not header.is_transactional:
                    raise InvalidTxnStateError(f"expected a transactional write from producer {producer_id}")
                txn_open = txn_open or header.is_transactional
            after[producer_id] = (epoch, header.base_sequence + header.last_offset_delta, txn_open)
        return None

    def validate_client_batch(self, header: BatchHeader, guard: VerificationGuard | None) -> BatchMetadata | None:
        """Checks a producer's data batch that the leader is about to append (see the
        module docstring); returns the original batch if it is a duplicate (nothing to
        append), else None. Raises INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER or
        INVALID_TXN_STATE. Changes nothing."""
        assert header.producer_id >= 0 and not header.is_control, "only a producer's data batch is validated"
        producer_id, epoch = header.producer_id, header.producer_epoch
        verdict, duplicate = self.check(
            producer_id, epoch, header.base_sequence, header.base_sequence + header.last_offset_delta
        )
        if verdict is Verdict.DUPLICATE:
            return duplicate
        entry = self.producers.get(producer_id)
        if verdict is Verdict.GAP and entry is not None:
            # (An unknown producer may start anywhere: its earlier batches are beyond what
            # this partition remembers, as Kafka accepts them.)
            raise OutOfOrderSequenceError(
                f"producer {producer_id}: sequence {header.base_sequence} in epoch {epoch} does not continue "
                f"its last batch here (next: {entry.next_sequence if epoch == entry.epoch else 0})"
            )
        open_txn = None if entry is None else entry.current_txn_first_offset
        if open_txn is not None and not header.is_transactional:
            raise InvalidTxnStateError(
                f"expected a transactional write from producer {producer_id}: its transaction is open here "
                f"since offset {open_txn}"
            )
        if header.is_transactional and not (open_txn is not None and entry is not None and entry.epoch == epoch):
            if guard is None or not self.holds_verification(guard):
                raise InvalidTxnStateError(
                    f"producer {producer_id}'s first transactional batch here was not verified with its "
                    "coordinator since the producer's last marker here; the transaction may have ended"
                )
        return None

    def _entry_for(self, producer_id: int, epoch: int) -> ProducerEntry:
        """The producer's entry, new for a new producer or epoch (which forgets the old
        epoch's sequences but keeps its open transaction and coordinator epoch)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(epoch)
        elif epoch > entry.epoch:
            entry = self.producers[producer_id] = ProducerEntry(
                epoch, coordinator_epoch=entry.coordinator_epoch, current_txn_first_offset=entry.current_txn_first_offset
            )
        return entry

    def record(self, producer_id: int, epoch: int, batch: BatchMetadata, transactional: bool = False) -> None:
        """A batch of this producer was appended (on the leader or a follower)."""
        entry = self._entry_for(producer_id, epoch)
        entry.batches.append(batch)
        if transactional and entry.current_txn_first_offset is None:
            entry.current_txn_first_offset = batch.first_offset
            self._ongoing[batch.first_offset] = producer_id
            self._guards.pop(producer_id, None)  # verified: the open transaction is its proof now

    def record_batch(self, header: BatchHeader) -> None:
        """`record` for an appended data batch header that carries a producer id."""
        assert header.producer_id >= 0, "only batches of idempotent producers have a producer state"
        assert not header.is_control, "markers go to complete_txn"
        self.record(header.producer_id, header.producer_epoch, BatchMetadata.of(header), header.is_transactional)

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Refuses a coordinator's marker for `producer_id` before it is written (Kafka's
        ProducerAppendInfo for an append of COORDINATOR origin): INVALID_PRODUCER_EPOCH if the
        producer has written with a newer epoch, TRANSACTION_COORDINATOR_FENCED if a newer
        coordinator already wrote a marker for it."""
        entry = self.producers.get(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"marker of producer {producer_id} in epoch {producer_epoch}, which has written in epoch {entry.epoch}"
            )
        if entry is not None and coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker of producer {producer_id} from coordinator epoch {coordinator_epoch}, after one from "
                f"epoch {entry.coordinator_epoch}"
            )

    def batch_offsets(self) -> set[tuple[int, int]]:
        """(producer id, first offset) of each batch remembered."""
        return {(producer_id, batch.first_offset) for producer_id, entry in self.producers.items()
                for batch in entry.batches}  # fmt: skip

    def complete_txn(self, header: BatchHeader, commit: bool, coordinator_epoch: int) -> CompletedTxn:
        """An appended marker (a control batch, `header`) ends its producer's transaction."""
        assert header.is_control and header.producer_id >= 0, "a transaction marker is a producer's control batch"
        producer_id, marker_offset = header.producer_id, header.base_offset
        self._guards.pop(producer_id, None)  # a verification in flight was for the transaction this ends
        entry = self.producers.get(producer_id)
        first_offset = marker_offset
        if entry is not None:
            if header.producer_epoch > entry.epoch:
                entry = self._entry_for(producer_id, header.producer_epoch)
            if entry.current_txn_first_offset is not None:
                first_offset = entry.current_txn_first_offset
                del self._ongoing[first_offset]
                entry.current_txn_first_offset = None
            entry.coordinator_epoch = coordinator_epoch
        # A marker of a producer with no batch here (none written, or retention took them)
        # leaves no entry: what replaying the log from its start would give.
        txn = CompletedTxn(producer_id, first_offset, marker_offset, not commit)
        self._unreplicated[first_offset] = txn
        return txn

    def last_stable_offset_after(self, txn: CompletedTxn) -> int:
        """The LSO an aborted transaction's index entry records: the first offset of the
        earliest open transaction of another producer, or the marker's offset + 1."""
        others = [first for first, producer_id in self._ongoing.items() if producer_id != txn.producer_id]
        return min(others) if others else txn.last_offset + 1

    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest transaction that is open, or complete with its
        marker at or above the HW; None if there is none."""
        firsts = [*self._ongoing, *self._unreplicated]
        return min(firsts) if firsts else None

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Transactions whose marker is below the HW are final."""
        if self._unreplicated:
            for first, txn in list(self._unreplicated.items()):
                if txn.last_offset < high_watermark:
                    del self._unreplicated[first]

    def remove_batches_below(self, log_start_offset: int) -> None:
        """Forgets batches that end below the new log start (retention deleted them), and
        producers left with none and no open transaction, so the state stays what the
        remaining log says (an open transaction outlives its batches, as in Kafka: the LSO
        then stops at the log start)."""
        for producer_id in list(self.producers):
            entry = self.producers[producer_id]
            while entry.batches and entry.batches[0].last_offset < log_start_offset:
                entry.batches.popleft()
            if not entry.batches and entry.current_txn_first_offset is None:
                del self.producers[producer_id]
        for first, txn in list(self._unreplicated.items()):
            if txn.last_offset < log_start_offset:
                del self._unreplicated[first]

    def replace_with(self, other: ProducerStateManager) -> None:
        """Takes `other`'s state (a rebuilt one) in place, so references to this stay valid.
        Verifications in flight lose their guards: the log they were taken on went back."""
        self.producers, self._ongoing, self._unreplicated = other.producers, other._ongoing, other._unreplicated
        self._guards = other._guards

    def restore_open_txn(self, producer_id: int, first_offset: int) -> None:
        """A snapshot says the producer's transaction is open from `first_offset`."""
        entry = self.producers[producer_id]
        assert entry.current_txn_first_offset is None
        entry.current_txn_first_offset = first_offset
        self._ongoing[first_offset] = producer_id

    def clear(self) -> None:
        self.producers.clear()
        self._ongoing.clear()
        self._unreplicated.clear()
        self._guards.clear()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerStateManager):
            return NotImplemented
        return (self.producers, self._ongoing, self._unreplicated) == (
            other.producers, other._ongoing, other._unreplicated
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"ProducerStateManager({self.producers!r})"
