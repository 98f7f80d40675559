"""Sender: the producer's background thread (Kafka's Sender). It sends ready batches to
their leaders, settles the answers and enforces the producer's timeouts.

Each pass of its loop:
- closes the batches that lingered long enough, and expires those past
  `delivery_timeout_ms` from their creation, wherever they are (open, queued, waiting to
  retry, in flight: the call is cancelled). Their records fail with KafkaTimeoutError
  and their bytes leave `buffer_memory`;
- settles the answered calls, and cancels those unanswered `request_timeout_ms` after
  they were made, with the other calls in flight to their partitions (Kafka drops the
  connection), which then count as a retriable REQUEST_TIMED_OUT;
- looks up again, every LEADER_RECHECK_INTERVAL_S, the leaders of the partitions with a
  call unanswered for LEADER_RECHECK_AFTER_S, and cancels the partition's calls to the
  previous leader once the metadata names another, which then count as a retriable
  NOT_LEADER_OR_FOLLOWER (a partition's batches go to its new leader only once no call
  to the previous one is unsettled, so they reach it in sequence order): a leader
  cut off by the network answers nothing, and waiting out `request_timeout_ms` for it,
  then perhaps again if the Controller had not moved its leadership yet, would hold the
  partition's writes for twice that after the Controller elected another;
- bumps the producer epoch when the idempotence state asks for it (IdempotenceManager),
  or, for a pinned producer id, which cannot bump, fails the batches not sent yet;
- drains the batches that may go now (a partition's small queued batches merged into
  one; a new batch only within 5 batches of the partition's oldest unsettled one, which
  the leader must still know for a duplicate when it is retried: see accumulator.py)
  and sends each as one request to its leader over the data plane
  (rayk.client.data_plane: the records are never pickled nor a Ray call).
Then it waits on the accumulator's condition (nothing polls) until the earliest of a
linger, a retry backoff, a delivery or request deadline or a metadata refresh ends,
unless a send, an answer, a flush or a refresh notifies it first. It never blocks on a
call: a leader not known yet is looked up in the background (MetadataCache) while the
partition's batches wait and the other partitions go on.

Answers: success resolves the batch's futures. A retriable error (NOT_LEADER_OR_FOLLOWER,
REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS, a dead or unreachable leader actor...) forgets
the partition's leader and puts the batch back at its queue's head for another attempt
after `retry_backoff_ms`; it keeps its idempotence stamp, so a leader that did append it
answers with the original offsets. OUT_OF_ORDER_SEQUENCE_NUMBER for a batch behind an
earlier unsettled one of its partition is retried too (the leader's gap wait ended before
the earlier one's retry came: nothing was written; Kafka's canRetry). Anything else fails
the batch with its typed error, OUT_OF_ORDER_SEQUENCE_NUMBER of the partition's oldest
unsettled batch included (resending could write it twice). An INVALID_RECORD
that names the records at fault (KIP-467) fails those with it and the batch's other
records with INVALID_DIFFERENT_RECORD, which the application may send again (librdkafka's
way; none of them was written). A batch that was sent and then fails or expires leaves a
hole in its partition's sequence: the epoch is bumped once every stamped batch has finished.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from rayk.client import calls
from rayk.client.accumulator import BatchState, ProducerBatch, RecordAccumulator
from rayk.client.data_plane import DataPlaneSession
from rayk.client.idempotence import IdempotenceManager
from rayk.client.metadata import STALE_LEADER_ERRORS, MetadataCache
from rayk.errors import (
    InvalidDifferentRecordError,
    KafkaError,
    KafkaTimeoutError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceError,
    RequestTimedOutError,
    UnknownServerError,
)
from rayk.storage.compression import CompressionType
from rayk.storage.records import assemble_batch, build_batch

logger = logging.getLogger(__name__)

# A call unanswered this long has its partition's leader looked up again, at most every
# LEADER_RECHECK_INTERVAL_S while it lasts (one Controller call per producer per interval).
LEADER_RECHECK_AFTER_S = 2.0
LEADER_RECHECK_INTERVAL_S = 1.0


class Sender:
    """A producer's sender thread: owns the thread, the produce calls in flight with their
    deadlines, the answers waiting to be settled and its DataPlaneSession. Made with its
    Producer, `start`ed with it and `join`ed at close. Its state is the thread's own or
    under the accumulator's lock."""

    def __init__(
        self,
        accumulator: RecordAccumulator,
        metadata: MetadataCache,
        idempotence: IdempotenceManager,
        *,
        acks: int,
        compression: CompressionType,
        request_timeout_ms: int,
        retry_backoff_ms: int,
        transactional_id: str | None = None,
        on_failure: Callable[[KafkaError], None] | None = None,
    ) -> None:
        """`transactional_id`: a transactional producer's, whose batches are transactional
        and carry it to their leader; `on_failure` hears of every record that fails."""
        self._acc = accumulator
        self._transactional_id = transactional_id
        self._on_failure = on_failure
        self._metadata = metadata
        self._idempotence = idempotence
        self._acks = acks
        self._compression = compression
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._data_plane = DataPlaneSession("producer")  # batches go to their leaders over it
        # Answers arrive in the data plane's thread and wait here (under the accumulator's lock) for the loop.
        self._completions: collections.deque[tuple[ProducerBatch, int, Any]] = collections.deque()
        # (request deadline, batch, attempt) in send order, so deadlines ascend; entries of
        # calls already settled are dropped when they reach the head. Sender thread only.
        self._calls: collections.deque[tuple[float, ProducerBatch, int]] = collections.deque()
        self._awaiting_leader = False
        self._bump_retry_at_s = 0.0
        self._leader_recheck_at_s = 0.0
        metadata.on_update(self._wake)
        self._thread = threading.Thread(target=self._run, name="rayk-producer-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _wake(self) -> None:
        with self._acc.lock:
            self._acc.lock.notify()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # a bug: fail what waits rather than let flush() hang
            logger.exception("the producer's sender thread failed")
            self._fail_unfinished(UnknownServerError(f"the producer's sender thread failed: {type(e).__name__}: {e}"))
            raise
        finally:
            self._data_plane.close()
        if self._acc.abandoned:
            self._fail_unfinished(KafkaTimeoutError("the producer was closed before these records were acknowledged"))

    def _fail_unfinished(self, error: KafkaError) -> None:
        batches = self._acc.abort(str(error))
        unfinished = [r for b in batches for r in [b.result, *(rider for rider, _ in b.riders)] if not r.done()]
        if unfinished and self._on_failure is not None:
            # First, as for any failed record: a transaction holding them must not commit. (A
            # flush() wakes when the last batch is finished, and its commit would have gone
            # out before it heard of the failure, its records never written.)
            self._on_failure(error)
        for result in unfinished:
            result.fail(error)
        for batch in batches:
            self._acc.finished(batch)

    def _loop(self) -> None:
        while self._step():
            pass

    def _step(self, wait: bool = True) -> bool:
        """One pass of the loop (see the module docstring); False once the sender is done.
        With `wait`, it then waits for work (a test steps it without)."""
        acc = self._acc
        with acc.lock:
            if acc.closed and (not acc.unfinished or acc.abandoned):
                return False
            now = time.monotonic()
            acc.close_lingering(now)
            expired = acc.expire(now)
            completions = list(self._completions)
            self._completions.clear()
        for batch in expired:
            self._expire(batch)
        for batch, attempt, outcome in completions:
            self._complete(batch, attempt, outcome)
        for batch, attempt, error in self._timed_out_calls(now):
            self._complete(batch, attempt, error)
        for batch, attempt in self._calls_to_moved_leaders(now):
            self._complete(batch, attempt, NotLeaderOrFollowerError(
                f"the leader of {batch.tp} changed while a produce call to the previous one went unanswered"))
        self._maybe_bump_epoch(now)
        with acc.lock:
            now = time.monotonic()
            self._awaiting_leader = False
            sendable = acc.drain(now, self._route, self._idempotence.may_pipeline)
            if wait and not sendable and not self._completions:
                acc.lock.wait(self._wait_s(now))
        for batch, leader in sendable:
            self._submit(batch, leader)
        return True

    def _route(self, batch: ProducerBatch) -> Any | None:
        """The batch's leader if it may go now, else None (accumulator lock held). Not
        while calls of its partition to another leader are unsettled: the new leader
        would see this batch before (or without) theirs, and refuse it once its gap wait
        ends, or append batches enough past theirs that their retries are no longer known
        for duplicates. Those calls are settled by their answers, or cancelled at the
        leader recheck (`_calls_to_moved_leaders`), and then go first."""
        if not batch.stamped and not self._idempotence.may_stamp():
            return None  # no new sequences until the epoch is bumped
        leader = self._metadata.leader_nowait(batch.tp.topic, batch.tp.partition)
        if leader is None:
            self._awaiting_leader = True
            return None
        for sent in self._acc.sent_batches(batch.tp):
            if sent.state is BatchState.IN_FLIGHT and not _same_actor(sent.leader, leader):
                return None
        return leader

    def _wait_s(self, now: float) -> float | None:
        times = [self._acc.wake_at_s(now)]
        if self._calls:  # the oldest call's deadline, and when its leader is looked at again
            times.append(self._calls[0][0])
            times.append(max(self._calls[0][0] - self._request_timeout_ms / 1000 + LEADER_RECHECK_AFTER_S,
                             self._leader_recheck_at_s))  # fmt: skip
        if self._awaiting_leader:
            times.append(self._metadata.wake_at_s())
        if self._idempotence.bump_needed and self._bump_retry_at_s > now:
            times.append(self._bump_retry_at_s)
        known = [t for t in times if t is not None]
        return max(0.0, min(known) - now) if known else None

    def _timed_out_calls(self, now: float) -> list[tuple[ProducerBatch, int, KafkaError]]:
        """Cancels the calls past their request deadline, and with each the other calls in
        flight to its partition, as Kafka's client drops the connection of a request that
        timed out and every request on it fails: they go again behind its retry, in
        sequence order, rather than reach the leader before it (a call abandoned before
        it was written would leave them a gap there). Returns (batch, attempt, error)."""
        out: list[tuple[ProducerBatch, int, KafkaError]] = []
        timed_out: set[Any] = set()
        while self._calls:
            deadline, batch, attempt = self._calls[0]
            if batch.state is BatchState.IN_FLIGHT and batch.attempts == attempt:
                if deadline > now:
                    break
                timed_out.add(batch)
                out.append((batch, attempt, RequestTimedOutError(
                    f"no answer from the leader of {batch.tp} within {self._request_timeout_ms} ms")))
            self._calls.popleft()
        if out:
            with self._acc.lock:
                for tp in {batch.tp for batch, _, _ in out}:
                    for other in self._acc.sent_batches(tp):
                        if other.state is BatchState.IN_FLIGHT and other not in timed_out:
                            out.append((other, other.attempts, RequestTimedOutError(
                                f"abandoned with an earlier produce call to the leader of {tp} that went unanswered "
                                f"for {self._request_timeout_ms} ms")))
        for batch, _, _ in out:
            calls.cancel(batch.ref)
        return out

    def _calls_to_moved_leaders(self, now: float) -> list[tuple[ProducerBatch, int]]:
        """Cancels the calls unanswered for LEADER_RECHECK_AFTER_S whose partition the
        metadata now says another replica leads; returns their (batch, attempt). For those
        still waiting, asks for fresh metadata at most every LEADER_RECHECK_INTERVAL_S.
        Call after `_timed_out_calls`, which drops the settled calls at the head."""
        sent_before_s = now - LEADER_RECHECK_AFTER_S + self._request_timeout_ms / 1000  # as a deadline
        if not self._calls or self._calls[0][0] > sent_before_s:
            return []
        moved_to, waiting = {}, set()
        for deadline, batch, attempt in self._calls:
            if deadline > sent_before_s:
                break
            if batch.state is not BatchState.IN_FLIGHT or batch.attempts != attempt:
                continue
            leader = self._metadata.cached_leader(batch.tp.topic, batch.tp.partition)
            if leader is not None and not _same_actor(leader, batch.leader):
                moved_to[batch.tp] = leader
            else:
                waiting.add(batch.tp.topic)
        if waiting and now >= self._leader_recheck_at_s:
            self._leader_recheck_at_s = now + LEADER_RECHECK_INTERVAL_S
            self._metadata.request_update(sorted(waiting))
        # Every call of a moved partition to another leader goes, the recent ones too: the
        # new leader gets none of the partition's batches while any is unsettled (`_route`).
        moved = []
        if moved_to:
            with self._acc.lock:
                for tp, leader in moved_to.items():
                    moved += [(b, b.attempts) for b in self._acc.sent_batches(tp)
                              if b.state is BatchState.IN_FLIGHT and not _same_actor(b.leader, leader)]  # fmt: skip
        for batch, _ in moved:
            calls.cancel(batch.ref)
        return moved

    def _maybe_bump_epoch(self, now: float) -> None:
        if not self._idempotence.bump_needed or now < self._bump_retry_at_s:
            return
        if not self._idempotence.bumps_itself:  # it cannot bump: what was not sent yet fails now
            with self._acc.lock:
                unsent = self._acc.take_unstamped()
            kind = "pinned" if self._idempotence.is_pinned else "transactional: abort the transaction"
            for batch in unsent:
                self._fail(batch, OutOfOrderSequenceError(
                    f"producer {self._idempotence.producer_id} ({kind}) lost track of a partition's sequence"
                    f" after a batch failed; the batch for {batch.tp} was not sent"
                ))  # fmt: skip
            return
        try:
            self._idempotence.maybe_bump()
        except KafkaError as e:  # a new producer id was needed and the Controller did not answer
            logger.warning("could not bump the producer epoch: %s; retrying", e)
            self._bump_retry_at_s = now + self._retry_backoff_s

    # ------------------------------------------------------------------ one batch

    def _submit(self, batch: ProducerBatch, leader: Any) -> None:
        batch.attempts += 1
        attempt = batch.attempts
        try:
            if batch.encoded is None:
                batch.producer_id, batch.producer_epoch, batch.base_sequence = self._idempotence.stamp(
                    batch.tp, batch.record_count
                )
                batch.encoded = self._encode(batch)
            ref = self._data_plane.produce(leader, batch.encoded, self._acks, self._request_timeout_ms,
                                           self._transactional_id)
        except Exception as e:
            self._complete(batch, attempt, calls.translate(e, f"produce to {batch.tp}"))
            return
        # With acks=0 the request is done once it is written (DataPlaneSession.produce): the
        # offsets are unknown (-1), as Kafka answers nothing; close() waits for that much.
        batch.ref, batch.leader = ref, leader
        batch.request_deadline_s = time.monotonic() + self._request_timeout_ms / 1000
        self._calls.append((batch.request_deadline_s, batch, attempt))
        ref.add_done_callback(lambda f: self._on_done(batch, attempt, f))

    def _encode(self, batch: ProducerBatch) -> bytes:
        stamp: dict[str, Any] = dict(
            compression=self._compression,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
            is_transactional=self._transactional_id is not None,
        )
        if batch.body is not None:  # encoded by send_batch
            return assemble_batch(batch.body, **stamp)
        return build_batch(batch.records, **stamp)

    def _on_done(self, batch: ProducerBatch, attempt: int, future: concurrent.futures.Future) -> None:
        with self._acc.lock:
            self._completions.append((batch, attempt, future))
            self._acc.lock.notify()

    def _complete(self, batch: ProducerBatch, attempt: int, outcome: Any) -> None:
        """Settles one attempt: `outcome` is the call's future, or the error it ended with."""
        if batch.state is not BatchState.IN_FLIGHT or batch.attempts != attempt:
            return  # expired, or timed out and already retried: this answer is stale
        error: BaseException | None
        if isinstance(outcome, BaseException):
            error = outcome
        else:
            try:
                result = outcome.result()
                error = result.error
            except Exception as e:
                error = calls.translate(e, f"produce to {batch.tp}")
        tp = batch.tp
        if error is None:
            with self._acc.lock:
                self._acc.in_flight[tp] -= 1
            self._idempotence.acknowledged(tp)
            self._resolve(batch, result.base_offset, result.log_append_time_ms)
            return
        if not isinstance(error, KafkaError):
            error = UnknownServerError(f"produce to {tp} failed: {type(error).__name__}: {error}")
        now = time.monotonic()
        retriable = (error.retriable or self._behind_an_unsettled_batch(batch, error)) and (
            now < batch.created_s + self._acc.delivery_timeout_s
        )
        if retriable:
            logger.debug("retrying %s after %s", tp, error)
            batch.last_error = error
            if isinstance(error, STALE_LEADER_ERRORS):
                self._metadata.invalidate(tp.topic, tp.partition)
        with self._acc.lock:
            self._acc.in_flight[tp] -= 1
            if retriable:
                self._acc.reenqueue(batch, now + self._retry_backoff_s)
                return
        if error.retriable:  # out of time
            error = self._expiry_error(batch, f"; last error {error}")
        self._fail(batch, error)

    def _behind_an_unsettled_batch(self, batch: ProducerBatch, error: KafkaError) -> bool:
        """Whether `error` is OUT_OF_ORDER_SEQUENCE_NUMBER for a batch that is not its
        partition's oldest unsettled one: it was not appended, and goes again behind the
        earlier one (Kafka's TransactionManager.canRetry retries it so too). The leader
        waits SEQUENCE_GAP_WAIT_MAX_MS for the batches missing before a batch, then refuses
        it; a batch refused retriably before it was appended (NOT_LEADER_OR_FOLLOWER,
        NOT_ENOUGH_REPLICAS...) whose retry comes later than that, as under load, left the
        batches sent behind it refused, and their records lost."""
        if not isinstance(error, OutOfOrderSequenceError):
            return False
        with self._acc.lock:
            sent = self._acc.sent_batches(batch.tp)
            return bool(sent) and sent[0] is not batch

    def _expire(self, batch: ProducerBatch) -> None:
        if batch.state is BatchState.IN_FLIGHT:
            calls.cancel(batch.ref)
            with self._acc.lock:
                self._acc.in_flight[batch.tp] -= 1
        self._fail(batch, self._expiry_error(batch, f"; last error {batch.last_error}" if batch.last_error else ""))

    def _expiry_error(self, batch: ProducerBatch, detail: str) -> KafkaTimeoutError:
        return KafkaTimeoutError(
            f"Expiring {batch.record_count} record(s) for {batch.tp.topic}-{batch.tp.partition}: "
            f"{int(self._acc.delivery_timeout_s * 1000)} ms has passed since batch creation{detail}"
        )

    def _resolve(self, batch: ProducerBatch, base_offset: int, log_append_time_ms: int) -> None:
        batch.result.complete(base_offset, log_append_time_ms)
        for rider, offset_delta in batch.riders:  # offsets are unknown (-1) with acks=0
            rider.complete(base_offset + offset_delta if base_offset >= 0 else -1, log_append_time_ms)
        self._finish(batch)

    def _fail(self, batch: ProducerBatch, error: KafkaError) -> None:
        if batch.stamped:  # its sequences may or may not be in the log: the partition's sequence is unknown
            self._idempotence.fate_unknown(f"a batch sent to {batch.tp} failed ({error.name})")
        if error.record_errors:
            self._fail_named_records(batch, error)
        else:
            batch.result.fail(error)
            for rider, _ in batch.riders:
                rider.fail(error)
        if self._on_failure is not None:
            self._on_failure(error)
        self._finish(batch)

    def _fail_named_records(self, batch: ProducerBatch, error: KafkaError) -> None:
        """Fails the records `error` names with its class and their message, and the batch's
        other records with INVALID_DIFFERENT_RECORD. The names index the batch as sent: its
        own records first, then each rider's from its offset delta on."""
        named = {e.batch_index: type(error)(e.message) for e in error.record_errors}
        others = InvalidDifferentRecordError(
            f"the leader of {batch.tp} refused a batch for {len(named)} other record(s) of it ({error});"
            " this record was not written and may be sent again"
        )
        results = [(batch.result, 0), *batch.riders]
        ends = [start for _, start in batch.riders] + [batch.record_count]
        for (result, start), end in zip(results, ends):
            result.fail(error, {i - start: e for i, e in named.items() if start <= i < end}, others)

    def _finish(self, batch: ProducerBatch) -> None:
        self._idempotence.finished(batch.stamped)
        self._acc.finished(batch)


def _same_actor(a: Any, b: Any) -> bool:
    """Whether two actor handles (each refresh of the metadata makes new ones) are one actor."""
    if a is b:
        return True
    actor_id = getattr(a, "_actor_id", None)
    return actor_id is not None and actor_id == getattr(b, "_actor_id", None)
