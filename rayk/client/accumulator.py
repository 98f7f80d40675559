"""RecordAccumulator: the producer's batches between `send` and the sender thread (Kafka's
RecordAccumulator), and the buffer memory they take.

Per partition there is at most one open batch, which `send` appends to, then a queue of
closed batches ready to go. A batch closes when it reaches `batch_size` bytes, or has
lingered `linger_ms` and its partition could send it at once (else it stays open and
keeps filling, as Kafka's does, instead of queueing as a small batch), or when the
producer flushes or closes. The sender takes ready batches (`drain`), at most
`max_in_flight` per partition in flight, and a partition's new batch only while its
batches from the oldest one sent and unsettled on number fewer than that (at most the
leader's 5 remembered batches, see `drain`); a batch to retry goes back to the head of
its queue in sequence order (`reenqueue`) and its partition waits `retry_backoff_ms`.

Calls are sized for Ray, not TCP: when `drain` takes a batch of `send()` records that was
never sent, the batches of the same kind queued behind it ride along in it, up to
`max_request_size` bytes, as one record batch in one call (one CRC, one sequence range).
Each keeps its own result, at its offset within the merged batch, and is due when the
batch it rides in is (an older one: it may expire a little early, never late). So a
partition whose calls are all in flight gathers its small batches (Kafka's 16 KiB
`batch_size`, or batches closed by linger) into one call instead of one call each, while
the leader still sees at most `max_in_flight` batches of the producer at once: it
remembers only the last five for duplicates (Kafka's NUM_BATCHES_TO_RETAIN), which is why
the window stays counted in calls, from the oldest one unsettled. Its byte size is then
up to `max_in_flight` x `max_request_size` per partition, and `buffer_memory` bounds it
for the whole producer.
Batches that `send_batch` encoded are already up to `max_request_size` and go as they are.

Every batch, open, queued or in flight, is due by `delivery_timeout_ms` after its
creation: `expire` hands the sender the batches past it, oldest first. Batches are
created in time order, so the oldest unfinished batch is the next to expire, and a deque
of batches by age (finished ones dropped lazily from its head) finds it in O(1).

Records take `buffer_memory` bytes from `append` until their batch is finished; `append`
blocks while they would take more, up to `max_block_ms`, then raises
BufferExhaustedError. `await_all` (flush) waits until every record is finished.

Thread-safe: one lock, `lock`, a Condition the sender thread waits on for work; `send`
waits on `_space`, flush on `_done`, separate conditions on the same lock, so a notify
meant for the sender never wakes a user thread instead. Methods marked "(lock held)" are
the sender's and expect it to hold `lock`. `append`, once per record, takes the
Condition's RLock itself (`_mutex`): entering a Condition is a Python call around that.

`append` has a compiled twin for its common case, send()'s (rayk.client.send_path,
rayk/client/_send.c): it appends to an open batch that stays under `batch_size`, under
`_mutex` taken without waiting, and reads and writes the attributes `append` does
(`_open`, `_partitioner`'s sticky partitions, `unfinished`, `_buffered_bytes`, a batch's
`records`, `record_count`, `size_bytes` and its result's `_record_callbacks`). A change to
what `append` does to them changes `send_path_reference` and _send.c too;
tests/test_send_path.py holds the three together.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from rayk.client.partitioner import StickyPartitioner
from rayk.client.produce_future import BatchResult, FutureRecordMetadata
from rayk.client.types import TopicPartition
from rayk.errors import BufferExhaustedError, KafkaError, KafkaTimeoutError
from rayk.storage.producer_state import BATCHES_REMEMBERED
from rayk.storage.records import HEADER_SIZE_BYTES, EncodedRecords, RecordToWrite

# What send() appends: (value, key, headers, timestamp_ms), a RecordToWrite with its timestamp.
SentRecord = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int]


class BatchState(enum.Enum):
    """Where a ProducerBatch is between `send` and its end: open to appends, queued for the
    sender (or a retry), in flight, or done."""

    OPEN = "open"  # send() appends to it
    READY = "ready"  # closed, queued for the sender (or for a retry)
    IN_FLIGHT = "in flight"
    DONE = "done"  # acknowledged, failed or expired


@dataclass(slots=True, eq=False)
class ProducerBatch:
    """One batch of a partition's records on its way to the leader: its records or encoded
    body, its size and state, its idempotence stamp once first sent, the call in flight and
    its deadline (monotonic s), and the results of the batches riding in it. Guarded by the
    accumulator's lock."""

    tp: TopicPartition
    created_s: float  # time.monotonic(); the delivery timeout counts from here
    num_partitions: int
    result: BatchResult
    records: list[RecordToWrite] = field(default_factory=list)  # appended by send()
    body: EncodedRecords | None = None  # or encoded already, by send_batch()
    record_count: int = 0
    size_bytes: int = HEADER_SIZE_BYTES
    state: BatchState = BatchState.OPEN
    attempts: int = 0
    encoded: bytes | None = None  # set at the first send, with the idempotence stamp below
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    ref: Any = None  # the produce call in flight
    leader: Any = None  # the leader replica it went to
    request_deadline_s: float = 0.0
    last_error: BaseException | None = None  # why its last attempt failed, if it is being retried
    # The results of batches merged into this one by `drain`, with the offset delta of
    # their first record here; they complete or fail with it.
    riders: list[tuple[BatchResult, int]] = field(default_factory=list)

    @property
    def stamped(self) -> bool:
        return self.base_sequence >= 0


class RecordAccumulator:
    """A producer's batches from `send` until they are done: owns the open batch and the ready
    queue of each partition, the in-flight counts, the batches by age, and the buffer memory
    they take. Made with its Producer, which closes it; thread-safe (one lock, see above).
    Of __slots__: the compiled send path reads and writes its counters in place (_send.c),
    and Python's own reads of them stay as fast as an instance's attributes are."""

    __slots__ = (
        "_batch_size", "_max_request_size", "_linger_s", "delivery_timeout_s", "_buffer_memory", "_max_block_s",
        "max_in_flight", "_window_max", "_partitioner", "_mutex", "lock", "_space", "_done", "_open", "_ready",
        "in_flight", "_sent", "_blocked_until_s", "_by_age", "unfinished", "_buffered_bytes", "_flushing", "closed",
        "abandoned", "_failure",
    )  # fmt: skip

    def __init__(
        self,
        *,
        batch_size: int,
        linger_ms: int,
        delivery_timeout_ms: int,
        buffer_memory: int,
        max_block_ms: int,
        max_in_flight: int,
        max_request_size: int,
    ) -> None:
        assert batch_size <= max_request_size, (batch_size, max_request_size)
        self._batch_size = batch_size
        self._max_request_size = max_request_size
        self._linger_s = linger_ms / 1000
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self._buffer_memory = buffer_memory
        self._max_block_s = max_block_ms / 1000
        self.max_in_flight = max_in_flight
        # How many batches a partition's sent-but-unsettled window may span (see `drain`).
        self._window_max = min(max_in_flight, BATCHES_REMEMBERED)
        self._partitioner = StickyPartitioner()
        self._mutex = threading.RLock()
        self.lock = threading.Condition(self._mutex)
        # Three conditions on one lock (a Condition is a lock as well, which typeshed does not know).
        self._space = threading.Condition(self.lock)  # type: ignore[arg-type]
        self._done = threading.Condition(self.lock)  # type: ignore[arg-type]
        self._open: dict[tuple[str, int], ProducerBatch] = {}
        self._ready: dict[TopicPartition, collections.deque[ProducerBatch]] = collections.defaultdict(collections.deque)
        self.in_flight: collections.Counter[TopicPartition] = collections.Counter()
        # Per partition, its batches sent at least once, in sequence order, from the oldest
        # one not finished on (finished ones leave from the head, lazily): `drain`'s window.
        self._sent: dict[TopicPartition, collections.deque[ProducerBatch]] = collections.defaultdict(
            collections.deque
        )
        self._blocked_until_s: dict[TopicPartition, float] = {}
        self._by_age: collections.deque[ProducerBatch] = collections.deque()
        self.unfinished = 0  # records appended and not yet acknowledged, failed or expired
        self._buffered_bytes = 0  # their size, bounded by buffer_memory
        self._flushing = 0
        self.closed = False
        self.abandoned = False  # closed with records unfinished: the sender fails them and stops
        self._failure: str | None = None  # set if the sender thread failed: no more sends

    # ------------------------------------------------------------------ the user's side

    def append(
        self, topic: str, partition: int | None, num_partitions: int, record: SentRecord, size: int,
        callback: Callable[[FutureRecordMetadata], Any] | None = None,
    ) -> FutureRecordMetadata:
        """Adds a record, a (value, key, headers, timestamp_ms) tuple, to its partition's open
        batch (the sticky partition's if `partition` is None), and its `callback`; blocks
        while the buffer is full. The hot path of send(): kept to dict lookups and counters.

        A send can nest inside another on the same thread, the lock being an RLock: an
        allocation under it can run a collection, whose finalizers and gc.callbacks may
        send (a logging handler that produces, say). So whatever allocates (opening or
        closing a batch, the callback's place) comes before the record's slot is taken,
        which is re-checked after it, and from the check to the counts nothing allocates:
        a nested send finds consistent counts and the outer one never writes stale ones."""
        with self._mutex:
            if self._failure is not None or self.closed:
                self._refuse()
            if partition is None:
                partition = self._partitioner.partition(topic, num_partitions)
            key = (topic, partition)  # a TopicPartition is that tuple
            while True:
                if self._buffered_bytes + size > self._buffer_memory:
                    self._wait_for_room(size)
                    if self._failure is not None or self.closed:  # while it waited
                        self._refuse()
                    continue
                batch = self._open.get(key)
                if batch is None:
                    self._open_batch(topic, partition, num_partitions)
                    continue
                index = batch.record_count
                if index and batch.size_bytes + size > self._batch_size:  # an empty batch takes any record
                    self._close(batch)
                    continue
                if self._open.get(key) is not batch or batch.record_count != index:
                    continue  # a send nested in the allocation above took the slot or closed the batch
                # from here to the counts nothing allocates a tracked object, which
                # test_a_send_nested_in_an_append_by_a_collection_keeps_the_counts holds it to
                batch.records.append(record)
                if callback is not None:
                    batch.result.add_record_callback_while_open(callback, index, record[3])
                batch.record_count = index + 1
                batch.size_bytes += size
                self.unfinished += 1
                self._buffered_bytes += size
                break
            if batch.size_bytes >= self._batch_size:
                self._close(batch)
                self.lock.notify()
        return FutureRecordMetadata(batch.result, index, record[3])

    def _open_batch(self, topic: str, partition: int, num_partitions: int) -> None:
        """Opens the partition's batch, unless a send nested in its allocation did (lock
        held)."""
        tp = TopicPartition(topic, partition)
        batch = ProducerBatch(tp, time.monotonic(), num_partitions, BatchResult(topic, partition))
        if tp in self._open:
            return
        self._open[tp] = batch
        self._by_age.append(batch)
        self.lock.notify()  # the sender learns the new batch's linger deadline

    def _refuse(self) -> None:
        if self._failure is not None:
            raise KafkaError(self._failure)
        raise RuntimeError("the producer is closed")

    def append_encoded(self, tp: TopicPartition, num_partitions: int, records: EncodedRecords) -> BatchResult:
        """Queues a batch encoded by send_batch, ready to go, after whatever `send` put in
        the partition's open batch (which it closes); blocks while the buffer is full."""
        size = len(records.body)
        with self.lock:
            if self._failure is not None or self.closed:
                self._refuse()
            self._wait_for_room(size)
            open_batch = self._open.get(tp)
            if open_batch is not None:
                self._close(open_batch)
            batch = ProducerBatch(
                tp, time.monotonic(), num_partitions, BatchResult(tp.topic, tp.partition),
                body=records, record_count=records.count, size_bytes=HEADER_SIZE_BYTES + size, state=BatchState.READY,
            )
            self._ready[tp].append(batch)
            self._by_age.append(batch)
            self._partitioner.on_new_batch(tp.topic, tp.partition, num_partitions)
            self.unfinished += records.count
            self._buffered_bytes += size
            self.lock.notify()
        return batch.result

    def sticky_partition(self, topic: str, num_partitions: int) -> int:
        """The sticky partition for unkeyed records of `topic` (each queued batch of the
        partition moves it on)."""
        with self.lock:
            return self._partitioner.partition(topic, num_partitions)

    def _wait_for_room(self, size: int) -> None:
        """Blocks until `size` more bytes fit in buffer_memory (lock held)."""
        if self._buffered_bytes + size <= self._buffer_memory:
            return
        deadline = time.monotonic() + self._max_block_s
        self.lock.notify()  # the sender may be lingering on open batches that would free room
        while self._buffered_bytes + size > self._buffer_memory:
            remaining = deadline - time.monotonic()
            if self.closed:
                raise RuntimeError("the producer was closed while send() waited for buffer room")
            if remaining <= 0:
                raise BufferExhaustedError(
                    f"{self._buffered_bytes} bytes of records still wait for acknowledgement after"
                    f" max_block_ms = {int(self._max_block_s * 1000)}; buffer_memory = {self._buffer_memory}"
                )
            self._space.wait(remaining)

    def await_all(self, timeout_s: float | None) -> None:
        """Closes every open batch and waits until each record is finished (flush)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.lock:
            self._flushing += 1
            self.lock.notify()
            try:
                while self.unfinished:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise KafkaTimeoutError(f"flush: {self.unfinished} records still unacknowledged after {timeout_s} s")
                    self._done.wait(remaining)
            finally:
                self._flushing -= 1

    def close(self, abandon: bool = False) -> None:
        """No more records; the sender stops once nothing is unfinished, or at once
        (failing what is) with `abandon`."""
        with self.lock:
            self.closed = True
            self.abandoned = self.abandoned or (abandon and self.unfinished > 0)
            self.lock.notify_all()
            self._space.notify_all()

    def abort(self, reason: str) -> list[ProducerBatch]:
        """The sender cannot go on: refuses further records and takes out every
        unfinished batch for the caller to fail."""
        with self.lock:
            self._failure = reason
            self.closed = True
            self._space.notify_all()
            batches = [b for b in self._by_age if b.state is not BatchState.DONE]
            self._by_age.clear()
            self._open.clear()
            self._ready.clear()
            self._sent.clear()
            return batches

    # ------------------------------------------------------------------ the sender's side

    def _close(self, batch: ProducerBatch) -> None:
        """Moves an open batch to its partition's queue (lock held)."""
        del self._open[batch.tp]
        batch.state = BatchState.READY
        self._ready[batch.tp].append(batch)
        self._partitioner.on_new_batch(batch.tp.topic, batch.tp.partition, batch.num_partitions)

    def close_lingering(self, now: float) -> None:
        """Closes the open batches that have lingered long enough, or all when flushing
        or closing (lock held)."""
        for batch in list(self._open.values()):
            if self._flushing or self.closed or (now - batch.created_s >= self._linger_s and self._can_send_now(batch.tp)):
                self._close(batch)

    def _can_send_now(self, tp: TopicPartition) -> bool:
        return not self._ready.get(tp) and self.in_flight[tp] < self.max_in_flight and self._window_open(tp)

    def sent_batches(self, tp: TopicPartition) -> collections.deque[ProducerBatch]:
        """The partition's batches sent at least once and not all settled: from its oldest
        unfinished one, in sequence order, each in flight, waiting to retry or done (lock held)."""
        sent = self._sent.get(tp)
        if sent is None:
            return collections.deque()
        while sent and sent[0].state is BatchState.DONE:
            sent.popleft()
        return sent

    def _window_open(self, tp: TopicPartition) -> bool:
        """Whether a batch never sent may be sent to `tp` now (lock held; see `drain`)."""
        return len(self.sent_batches(tp)) < self._window_max

    def expire(self, now: float) -> list[ProducerBatch]:
        """Takes out every batch past its delivery timeout, oldest first (lock held); those
        in flight stay counted in `in_flight` until the sender settles them."""
        expired = []
        by_age = self._by_age
        while by_age and (by_age[0].state is BatchState.DONE or by_age[0].created_s + self.delivery_timeout_s <= now):
            batch = by_age.popleft()
            if batch.state is BatchState.OPEN:
                del self._open[batch.tp]
            elif batch.state is BatchState.READY:
                self._ready[batch.tp].remove(batch)
            if batch.state is not BatchState.DONE:
                expired.append(batch)
        return expired

    def drain(
        self, now: float, route: Callable[[ProducerBatch], Any | None], may_pipeline: Callable[[TopicPartition], bool]
    ) -> list[tuple[ProducerBatch, Any]]:
        """Takes the batches to send now with their leaders' handles (lock held). `route`
        gives a batch's leader, or None to hold it back (leader unknown, the producer
        may not stamp new batches yet, or the partition has calls to another leader in
        flight); `may_pipeline(tp)` whether a batch may follow another one in flight to `tp`.

        A batch never sent goes only while the partition's window, its batches from the
        oldest one sent and not finished to the newest, spans fewer than `max_in_flight`
        (at most the leader's BATCHES_REMEMBERED) batches. Counting the calls in flight is
        not enough: answers come in any order, so while one call goes unanswered (its
        answer lost, or held up), the calls after it could be answered and new ones sent
        without end, and once its retry comes after the leader appended 5 batches of the
        producer behind it, the leader no longer knows it for a duplicate and refuses it
        (OUT_OF_ORDER_SEQUENCE_NUMBER) although it holds its records. Kafka's answers come
        in order on a connection, which keeps its producer within 5 batches of the oldest."""
        out = []
        for tp, queue in self._ready.items():
            if not queue or self._blocked_until_s.get(tp, 0) > now:
                continue
            while queue and self.in_flight[tp] < self.max_in_flight and (not self.in_flight[tp] or may_pipeline(tp)):
                first_send = not queue[0].stamped
                if first_send and not self._window_open(tp):
                    break
                leader = route(queue[0])
                if leader is None:
                    break
                batch = queue.popleft()
                if batch.encoded is None and batch.body is None:
                    self._merge_queued(batch, queue)
                if first_send:  # it is stamped when sent, after those drained before it
                    self._sent[tp].append(batch)
                batch.state = BatchState.IN_FLIGHT
                batch.leader = leader
                self.in_flight[tp] += 1
                out.append((batch, leader))
        return out

    def _merge_queued(self, batch: ProducerBatch, queue: collections.deque[ProducerBatch]) -> None:
        """Moves the records of the never-sent `send()` batches at the head of `queue` into
        `batch`, while it stays within `max_request_size` (lock held). A merged batch's
        result becomes one of `batch`'s riders; its records and bytes count as `batch`'s
        from now on, so it leaves the accumulator's books as DONE without `finished`."""
        while queue:
            rider = queue[0]
            if rider.encoded is not None or rider.body is not None:
                break
            if batch.size_bytes + rider.size_bytes - HEADER_SIZE_BYTES > self._max_request_size:
                break
            queue.popleft()
            assert not rider.riders and not rider.stamped, "a queued batch that was never sent carries no riders"
            batch.riders.append((rider.result, batch.record_count))
            batch.records.extend(rider.records)
            batch.record_count += rider.record_count
            batch.size_bytes += rider.size_bytes - HEADER_SIZE_BYTES
            rider.state = BatchState.DONE

    def take_unstamped(self) -> list[ProducerBatch]:
        """Takes out every open or queued batch that was never sent, for the sender to fail
        (lock held); they leave `_by_age` lazily, as DONE."""
        taken = [b for b in self._open.values() if not b.stamped]
        self._open.clear()
        for queue in self._ready.values():
            taken += [b for b in queue if not b.stamped]
            kept = [b for b in queue if b.stamped]
            queue.clear()
            queue.extend(kept)
        return taken

    def reenqueue(self, batch: ProducerBatch, retry_at_s: float) -> None:
        """Puts a batch to retry back at its queue's head, before any batch stamped
        after it or not stamped yet (lock held)."""
        queue = self._ready[batch.tp]
        i = 0
        while i < len(queue) and queue[i].stamped and queue[i].base_sequence < batch.base_sequence:
            i += 1
        queue.insert(i, batch)
        batch.state = BatchState.READY
        self._blocked_until_s[batch.tp] = retry_at_s

    def finished(self, batch: ProducerBatch) -> None:
        """A batch was acknowledged, failed or expired: its records leave the buffer."""
        with self.lock:
            batch.state = BatchState.DONE
            self.unfinished -= batch.record_count
            self._buffered_bytes -= batch.size_bytes - HEADER_SIZE_BYTES
            assert self.unfinished >= 0 and self._buffered_bytes >= 0, (self.unfinished, self._buffered_bytes)
            self.lock.notify()
            self._space.notify_all()
            if not self.unfinished:
                self._done.notify_all()

    def wake_at_s(self, now: float) -> float | None:
        """The next time the sender has something to do without being notified (lock held):
        a linger that ends, a retry backoff that ends, a delivery timeout."""
        times = [b.created_s + self._linger_s for b in self._open.values() if self._can_send_now(b.tp)]
        times += [t for tp, t in self._blocked_until_s.items() if t > now and self._ready.get(tp)]
        for batch in self._by_age:
            if batch.state is not BatchState.DONE:
                times.append(batch.created_s + self.delivery_timeout_s)
                break
        return min(times) if times else None
