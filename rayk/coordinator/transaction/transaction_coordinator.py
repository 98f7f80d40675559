"""TransactionCoordinator: the transactional ids of one `__transaction_state` partition
(Kafka's TransactionCoordinator + TransactionStateManager + TransactionMarkerChannelManager).

As with groups, transactional id `t` belongs to partition `coordinator_partition(t, n)` of
`__transaction_state` (`transaction.state.log.num.partitions`, 3: Kafka's 50 would be 50 replica actors), and that partition's
leader coordinates it: the coordinator lives in the leader replica, loads the partition's
records when it starts leading, and its `coordinator_epoch` is that leader epoch, which
every marker it writes carries (a partition refuses a marker of an older coordinator:
TRANSACTION_COORDINATOR_FENCED).

Each request takes its id's lock, computes the transition (transaction_metadata.py),
writes the new metadata (`append`, acks=all through the partition) and only then applies
it and answers, so what a client was told is in the log. A Prepare* state is answered at
once; its markers go out in the background (`write_marker(topic, partition, producer id,
epoch, commit, coordinator epoch)`, the leaders' WriteTxnMarkers), each retried until it
is written or the partition is gone (UNKNOWN_TOPIC_OR_PARTITION), and then Complete* is
written. A request for the id meanwhile waits for that, up to COMPLETION_WAIT_MS (then
gets CONCURRENT_TRANSACTIONS and retries): a producer's next transaction usually starts
while its last one completes, and an answer a few ms late costs it less than its retry
backoff (librdkafka's is 20 ms). Complete* is written without waiting for the ISR: the
id's next state is (acks=all, after it in the log), and a coordinator that loses it in
a failover finds the transaction prepared and writes its markers again. A load
that finds an id in a Prepare* state sends its markers again (a coordinator died between
EndTxn and the markers), as does a new coordinator after a failover.

Timeouts: `abort_timed_out` (every `transaction.abort.timed.out.transaction.cleanup.
interval.ms`) fences and aborts an open transaction past its `transaction.timeout.ms`;
`expire` (every `transactional.id.expiration.ms`'s check) deletes idle ids unused that
long (a tombstone). `close` stops the marker tasks when the replica stops leading.

Clocks: what is written is wall time (`clock_ms`: a transaction's start and last update,
which the next coordinator reads after a failover, and by which idle ids expire, as
offsets do), but a timeout is an elapsed time inside this process: each open
transaction's deadline is held on the monotonic clock (`monotonic_ms`), from its start
here or, for one loaded, from what the wall clocks say is left of it
(transaction_metadata.remaining_timeout_ms). A step of this broker's wall clock neither
aborts a live transaction (an hour forward) nor keeps one past its timeout (an hour
back). Kafka compares the start with its wall clock; this is the stricter rule.

Not thread-safe: the owning actor's event loop calls it.
"""

from __future__ import annotations

import asyncio
import weakref
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from rayk.coordinator.transaction import transaction_metadata as tm
from rayk.coordinator.transaction.transaction_metadata import PREPARE_STATES, TV1, TransactionMetadata, TxnState
from rayk.coordinator.transaction.transaction_records import MalformedTransactionRecordError, decode_record, record_key, record_value
from rayk.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidProducerEpochError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    KafkaError,
    TransactionCoordinatorFencedError,
    UnknownTopicOrPartitionError,
)

logger = logging.getLogger(__name__)

Append = Callable[..., Awaitable[None]]  # (records, acks=-1): appends to the partition
WriteMarker = Callable[[str, int, int, int, bool, int], Awaitable[None]]
MARKER_RETRY_BACKOFF_MS = 100
COMPLETION_WAIT_MS = 1000  # how long a request waits for its id's completion before CONCURRENT_TRANSACTIONS


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    """The broker settings the transaction coordinator applies: the longest
    transaction.timeout.ms a producer may ask for, and how long an idle id lives (ms)."""

    transaction_max_timeout_ms: int = 900_000  # Kafka's transaction.max.timeout.ms
    transactional_id_expiration_ms: int = 604_800_000  # 7 days


class TransactionCoordinator:
    """The coordinator of one `__transaction_state` partition's ids in one coordinator epoch:
    owns each id's TransactionMetadata, a lock per id in use and the marker-writing tasks.
    Loaded by TransactionStatePartitionReplica when it starts leading, `close`d when it stops."""

    def __init__(
        self,
        append: Append,
        write_marker: WriteMarker,
        new_producer_id: Callable[[], Awaitable[int]],
        coordinator_epoch: int,
        config: TransactionConfig | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        monotonic_ms: Callable[[], int] = lambda: int(time.monotonic() * 1000),
    ) -> None:
        self._append = append
        self._write_marker = write_marker
        self._new_producer_id = new_producer_id
        self.coordinator_epoch = coordinator_epoch
        self.config = config or TransactionConfig()
        self._clock_ms = clock_ms  # wall: the timestamps written
        self._monotonic_ms = monotonic_ms  # the timeouts' deadlines
        self._transactions: dict[str, TransactionMetadata] = {}
        self._deadlines_ms: dict[str, int] = {}  # open transaction's id -> its timeout's deadline (monotonic)
        # An id's lock lives while a request holds or awaits it: ids come and go (one per
        # checkpoint with Flink), and a lock per id ever seen would grow without bound.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._completing: dict[str, asyncio.Task] = {}  # id -> its markers being written
        self._closed = False

    # ------------------------------------------------------------------ load, close

    def load(self, records: Iterable[tuple[bytes, bytes | None]]) -> int:
        """Replays the partition's records (oldest first); returns how many it skipped as
        malformed. Call `resume` after, on the event loop, to finish what was prepared."""
        skipped = 0
        for key, value in records:
            try:
                transactional_id, md = decode_record(key, value)
            except MalformedTransactionRecordError as e:
                logger.error("__transaction_state: skipping a record the coordinator cannot read: %s", e)
                skipped += 1
                continue
            if md is None:
                self._transactions.pop(transactional_id, None)
            else:
                self._transactions[transactional_id] = md
        wall_now_ms, now_ms = self._clock_ms(), self._monotonic_ms()
        self._deadlines_ms = {t: now_ms + tm.remaining_timeout_ms(md, wall_now_ms)
                              for t, md in self._transactions.items() if md.state is TxnState.ONGOING}  # fmt: skip
        return skipped

    def resume(self) -> None:
        """Sends the markers of every transaction the log left prepared."""
        for transactional_id, md in self._transactions.items():
            if md.state in PREPARE_STATES:
                self._start_completing(transactional_id)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._completing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def metadata(self, transactional_id: str) -> TransactionMetadata | None:
        return self._transactions.get(transactional_id)

    # ------------------------------------------------------------------ the APIs

    async def init_producer_id(
        self, transactional_id: str, txn_timeout_ms: int, expected: tuple[int, int] | None = None
    ) -> tuple[int, int]:
        """InitProducerId with a transactional id: (producer id, epoch). An open
        transaction is aborted first and the client told CONCURRENT_TRANSACTIONS, to retry."""
        if not transactional_id:
            raise InvalidRequestError("a transactional id may not be empty")
        if not 0 < txn_timeout_ms <= self.config.transaction_max_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction.timeout.ms {txn_timeout_ms} is not in (0, transaction.max.timeout.ms = "
                f"{self.config.transaction_max_timeout_ms}]"
            )
        await self._after_completion(transactional_id)
        async with self._lock(transactional_id):
            self._check_not_completing(transactional_id)
            now_ms = self._clock_ms()
            md = self._transactions.get(transactional_id)
            if md is None:
                md = tm.new_metadata(transactional_id, await self._new_producer_id(), txn_timeout_ms, now_ms)
            new_id = await self._new_producer_id() if md.epoch_exhausted else tm.NO_PRODUCER_ID
            new, aborts_first = tm.init_producer_id(md, txn_timeout_ms, expected, now_ms, new_id)
            await self._write(new)
            if aborts_first:
                self._start_completing(transactional_id)
                raise ConcurrentTransactionsError(
                    f"{transactional_id!r} had a transaction open: it is being aborted; retry"
                )
            return new.producer_id, new.producer_epoch

    async def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Iterable[tuple[str, int]],
        client_transaction_version: int = TV1,
    ) -> None:
        """AddPartitionsToTxn, and AddOffsetsToTxn with the group's offsets partition."""
        await self._after_completion(transactional_id)
        async with self._lock(transactional_id):
            self._check_not_completing(transactional_id)
            md = self._known(transactional_id)
            new = tm.add_partitions(md, producer_id, producer_epoch, frozenset(partitions), self._clock_ms(),
                                    client_transaction_version)  # fmt: skip
            if new is not None:
                await self._write(new)

    async def end_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
        client_transaction_version: int = TV1,
    ) -> tuple[int, int]:
        """EndTxn: answered once the decision is written (its markers follow); the
        (producer id, epoch) the client continues with (TV2 bumps it)."""
        async with self._lock(transactional_id):
            md = self._known(transactional_id)
            next_id = await self._new_producer_id() if md.epoch_exhausted else tm.NO_PRODUCER_ID
            new = tm.end_transaction(md, producer_id, producer_epoch, commit, self._clock_ms(),
                                     client_transaction_version, next_id)  # fmt: skip
            if new is None:  # a retry of an end already done
                return md.producer_id, md.producer_epoch
            await self._write(new)
            self._start_completing(transactional_id)
            return new.producer_id, new.producer_epoch

    async def verify_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Iterable[tuple[str, int]]
    ) -> list[tuple[str, int]]:
        """AddPartitionsToTxn with verifyOnly (KIP-890): the partitions that the producer's
        open transaction does not hold (see transaction_metadata.verify_partitions)."""
        await self._after_completion(transactional_id)
        async with self._lock(transactional_id):
            self._check_not_completing(transactional_id)
            return sorted(tm.verify_partitions(self._known(transactional_id), producer_id, producer_epoch, frozenset(partitions)))

    def transactions(self) -> list[TransactionMetadata]:
        """Every transactional id's metadata here (ListTransactions, DescribeTransactions)."""
        return list(self._transactions.values())

    # ------------------------------------------------------------------ the clock

    async def abort_timed_out(self) -> list[str]:
        """Fences and aborts every open transaction past its timeout; returns their ids."""
        aborted = []
        for transactional_id in [t for t in self._deadlines_ms if self._timed_out(t)]:
            async with self._lock(transactional_id):
                md = self._transactions.get(transactional_id)
                if md is None or not self._timed_out(transactional_id):
                    continue  # ended meanwhile
                await self._write(tm.fence_and_abort(md, self._clock_ms()))
                self._start_completing(transactional_id)
                aborted.append(transactional_id)
        return aborted

    async def expire(self) -> list[str]:
        """Deletes the idle ids unused for `transactional.id.expiration.ms`; returns them."""
        expiration_ms = self.config.transactional_id_expiration_ms
        now_ms = self._clock_ms()
        expired = []
        for transactional_id in [t for t, md in self._transactions.items() if tm.expired(md, now_ms, expiration_ms)]:
            async with self._lock(transactional_id):
                md = self._transactions.get(transactional_id)
                if md is None or not tm.expired(md, self._clock_ms(), expiration_ms):
                    continue
                await self._append([(record_key(transactional_id), None)])
                del self._transactions[transactional_id]
                expired.append(transactional_id)
        return expired

    # ------------------------------------------------------------------ markers

    def _start_completing(self, transactional_id: str) -> None:
        if self._closed or transactional_id in self._completing:
            return
        task = asyncio.get_running_loop().create_task(self._complete(transactional_id))
        self._completing[transactional_id] = task
        task.add_done_callback(lambda _: self._completing.pop(transactional_id, None))

    async def _complete(self, transactional_id: str) -> None:
        """Writes the markers of a prepared transaction, then Complete*. A coordinator a
        partition fenced (a newer one took over) stops: the new one completes it."""
        md = self._transactions[transactional_id]
        assert md.state in PREPARE_STATES, md.state
        commit = md.state is TxnState.PREPARE_COMMIT
        try:
            await asyncio.gather(*(
                self._marker_until_written(topic, partition, md.producer_id, md.producer_epoch, commit)
                for topic, partition in sorted(md.partitions)
            ))
            async with self._lock(transactional_id):
                if self._transactions.get(transactional_id) is md:
                    await self._write(tm.complete(md, self._clock_ms()), acks=1)  # see the module docstring
        except (TransactionCoordinatorFencedError, InvalidProducerEpochError) as e:
            logger.warning("%r: a newer coordinator or producer took over: %s", transactional_id, e)
        except KafkaError as e:  # a marker refused for good, or Complete* not written (no longer leading)
            logger.error("%r: the transaction is left prepared, for the next coordinator: %s", transactional_id, e)

    async def _marker_until_written(self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool) -> None:
        """Retries a retriable refusal (the leader moving, too few in sync) until written;
        a partition that is gone needs none (as Kafka, which drops its markers); any other
        refusal stops the transaction's completion (Kafka's abortSending)."""
        while True:
            try:
                await self._write_marker(topic, partition, producer_id, epoch, commit, self.coordinator_epoch)
                return
            except UnknownTopicOrPartitionError:
                logger.warning("transaction marker for %s-%d: the partition is gone", topic, partition)
                return
            except KafkaError as e:
                if not e.retriable:
                    raise
                logger.info("transaction marker for %s-%d: %s; retrying", topic, partition, e)
            await asyncio.sleep(MARKER_RETRY_BACKOFF_MS / 1000)

    # ------------------------------------------------------------------ helpers

    def _timed_out(self, transactional_id: str) -> bool:
        deadline_ms = self._deadlines_ms.get(transactional_id)
        return deadline_ms is not None and self._monotonic_ms() > deadline_ms

    def _lock(self, transactional_id: str) -> asyncio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = asyncio.Lock()
        return lock

    def _known(self, transactional_id: str) -> TransactionMetadata:
        md = self._transactions.get(transactional_id)
        if md is None:
            raise InvalidProducerIdMappingError(f"transactional id {transactional_id!r} is not known here")
        return md

    async def _after_completion(self, transactional_id: str) -> None:
        """Waits, up to COMPLETION_WAIT_MS, for the id's completion under way (if any)."""
        task = self._completing.get(transactional_id)
        if task is not None:
            await asyncio.wait({task}, timeout=COMPLETION_WAIT_MS / 1000)

    def _check_not_completing(self, transactional_id: str) -> None:
        task = self._completing.get(transactional_id)
        if task is not None and not task.done():
            raise ConcurrentTransactionsError(f"{transactional_id!r} is completing a transaction; retry")

    async def _write(self, md: TransactionMetadata, acks: int = -1) -> None:
        """Writes `md` (acks=all unless told), then makes it the id's state: a failed write
        changes nothing. A transaction that opens with it times out `txn_timeout_ms` after
        (monotonic), counted from before the write as its start timestamp is."""
        now_ms = self._monotonic_ms()
        await self._append([(record_key(md.transactional_id), record_value(md))], acks=acks)
        previous = self._transactions.get(md.transactional_id)
        self._transactions[md.transactional_id] = md
        if md.state is not TxnState.ONGOING:
            self._deadlines_ms.pop(md.transactional_id, None)
        elif previous is None or previous.state is not TxnState.ONGOING:
            self._deadlines_ms[md.transactional_id] = now_ms + md.txn_timeout_ms
