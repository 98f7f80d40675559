"""LeaderProduce: a partition leader's produce path, from a request to its acknowledgement
(Kafka's Partition.appendRecordsToLeader with ReplicaManager's transaction verification
and DelayedProduce).

acks must be 0, 1 or -1 (else INVALID_REQUIRED_ACKS); acks=-1 is refused with
NOT_ENOUGH_REPLICAS before appending when the ISR is smaller than `min.insync.replicas`,
and otherwise waits until the HW passes the last appended offset, or answers
REQUEST_TIMED_OUT after `timeout_ms`. Several requests of one call (a listener's, see
rayk/net/produce_coalescer.py) are appended in list order and their acknowledgements wait
together:
- the leader epoch is taken once per call: every request of it is appended in that epoch
  or not at all;
- the transactions' first batches are verified with their coordinators
  (txn_verification.py, KIP-890) before any request of the call is appended;
- each appended request's acknowledgement waits in the epoch it was appended in: if the
  leadership moves on meanwhile, it is NOT_LEADER_OR_FOLLOWER, never an HW of another
  epoch's log (which may have truncated the records away);
- one request's bad input, or a fault in handling it, is that request's error alone; a
  write to the log that fails (a full or failing disk) is KAFKA_STORAGE_ERROR for it and
  every request after it, and ends the replica's process (storage_failure.py).
Transaction markers (WriteTxnMarkers) and the producer-state queries (DescribeProducers,
a resuming writer's next sequence) go the same way.

It owns the handles of the transaction coordinators that verify; the ISR and HW are
LeaderIsr's (leader_isr.py), the role, epoch, log and counters the context's
(replica_context.py). Errors are answered in the result, as Kafka answers per partition.
Not thread-safe: the replica actor's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from rayk.dataplane.frames import ProduceRequest, ProduceResult
from rayk.errors import (
    InvalidRecordError,
    InvalidRequiredAcksError,
    InvalidTxnStateError,
    KafkaError,
    KafkaStorageError,
    NotEnoughReplicasAfterAppendError,
    UnknownServerError,
)
from rayk.replication import storage_failure, txn_verification
from rayk.replication.delayed_produce import DelayedProduces, ParkedCall, Pending, Reply, replication_timed_out
from rayk.replication.leader_isr import LeaderIsr
from rayk.replication.replica_context import ReplicaContext, Role
from rayk.storage.log import LogAppendInfo
from rayk.storage.producer_state import VerificationGuard, Verdict
from rayk.storage.records import HEADER_SIZE_BYTES, BatchHeader

logger = logging.getLogger(__name__)

SEQUENCE_GAP_WAIT_MAX_MS = 2_000  # how long a batch ahead of its producer's sequence waits


@dataclass(frozen=True, slots=True)
class _Appended:
    """A produce's records as the leader appended them: what its acknowledgement waits for."""

    first_offset: int
    last_offset: int
    log_append_time_ms: int
    leader_epoch: int  # appended in: an acknowledgement holds only while this epoch leads

    def acknowledged(self, log_start_offset: int) -> ProduceResult:
        """Its answer once acknowledged."""
        return ProduceResult(self.first_offset, self.log_append_time_ms, log_start_offset)


class _Replicating:
    """The acknowledgement is still waiting for the in-sync replicas."""


REPLICATING = _Replicating()


# What `_verify_request` found for a request: None (nothing to verify), the guard to append
# a transaction's first batch with, or the error the request is answered.
_Verification = VerificationGuard | KafkaError | None


def _is_transactional(records: bytes) -> bool:
    return len(records) >= HEADER_SIZE_BYTES and BatchHeader.parse(records).is_transactional


class LeaderProduce:
    """A leader's produce and acknowledgement path (see the module docstring)."""

    def __init__(self, ctx: ReplicaContext, isr: LeaderIsr, controller: Any) -> None:
        """`controller`: the Controller's handle, through which the transaction
        coordinators that verify transactional writes are found."""
        self._ctx = ctx
        self._isr = isr
        self._txn_coordinators = txn_verification.CoordinatorHandles(controller)
        self._storage_error: Exception | None = None  # a write to the log failed: this process is ending
        # Calls of the data plane waiting for replication without a task (produce_or_park)
        self._delayed = DelayedProduces(ctx.name, self.replication_outcome, self._failed_after_append)
        self._finishing: set[asyncio.Task] = set()  # such calls that went on the async way
        ctx.events.on_change_produce = self._delayed.on_change

    def produce_error(self, error: KafkaError) -> ProduceResult:
        return ProduceResult(-1, -1, self._ctx.log.log_start_offset, error)

    # ------------------------------------------------------------------ produce

    async def produce_requests(self, requests: list[ProduceRequest]) -> list[ProduceResult]:
        """Appends and acknowledges the requests of one call (see the module docstring)."""
        received_s = time.monotonic()
        ctx = self._ctx
        requests = [r if isinstance(r, ProduceRequest) else ProduceRequest(*r) for r in requests]
        epoch = ctx.leader_epoch if ctx.role is Role.LEADER else None
        verified: list[_Verification] = [None] * len(requests)
        if epoch is not None and any(_is_transactional(request.records) for request in requests):
            verified = list(await asyncio.gather(*(self._verify_request(request, epoch) for request in requests)))
        return await self._answers(requests, await self._append_from(requests, verified, epoch, []), received_s)

    async def _answers(
        self, requests: list[ProduceRequest], appended: list[ProduceResult | _Appended], received_s: float
    ) -> list[ProduceResult]:
        """Each appended request's answer, once acknowledged; the acknowledgements wait together."""
        return list(await asyncio.gather(*(
            self._answer(done, request.acks, request.timeout_ms, received_s) for done, request in zip(appended, requests)
        )))

    async def _append_from(
        self, requests: list[ProduceRequest], verified: list[_Verification], epoch: int | None,
        appended: list[ProduceResult | _Appended],
    ) -> list[ProduceResult | _Appended]:
        """Appends the requests after the first len(`appended`) (done already), in order:
        what to acknowledge of each, or its answer."""
        for request, verification in zip(requests[len(appended):], verified[len(appended):]):
            done = self._append_guarded(request, epoch, verification, may_wait=True)
            if done is None:  # ahead of its producer's sequence: its earlier batches may be on their way
                try:
                    await self._await_earlier_batches(request, epoch)
                except Exception as e:  # a bug: this request alone fails, as in `_append_guarded`
                    logger.exception("%s: waiting for a producer's earlier batches failed", self._ctx.name)
                    done = self.produce_error(UnknownServerError(f"{type(e).__name__}: {e}"))
                else:
                    done = self._append_guarded(request, epoch, verification, may_wait=False)
            assert done is not None
            appended.append(done)
        return appended

    def _append_guarded(
        self, request: ProduceRequest, epoch: int | None, verification: _Verification, may_wait: bool
    ) -> ProduceResult | _Appended | None:
        """`_append`, with what it raises answered: a failed write to the log is
        KAFKA_STORAGE_ERROR for this request and every one after it (and ends the process),
        a KafkaError is the request's error, a bug is UNKNOWN_SERVER_ERROR for it alone."""
        ctx = self._ctx
        if self._storage_error is not None:
            return self.produce_error(KafkaStorageError(f"{ctx.name}: its log's disk failed: {self._storage_error}"))
        try:
            return self._append(request, epoch, verification, may_wait)
        except (OSError, KafkaStorageError) as e:  # the log's disk is full or failing: storage_failure.py
            self._storage_error = e
            storage_failure.end_process(ctx.name, e)
            return self.produce_error(KafkaStorageError(f"{ctx.name}: a write to its log failed: {e}"))
        except KafkaError as e:
            return self.produce_error(e)
        except Exception as e:  # a bug: this request alone fails, as Kafka answers per partition
            logger.exception("%s: appending a produce request failed", ctx.name)
            return self.produce_error(UnknownServerError(f"{type(e).__name__}: {e}"))

    def produce_or_park(self, requests: list[ProduceRequest], reply: Reply) -> bool:
        """The requests of one data plane call served without a task where they can be:
        appended now, as `produce_requests` appends them, then answered through `reply` at
        once or parked until the in-sync replicas have their acks=-1 records
        (delayed_produce.py). False, having done nothing, for a call the async path serves:
        one with a transactional batch (verified with its coordinator first), a traced one,
        or on a replica that is not the leader. If a batch is found ahead of its producer's
        sequence, that request and the rest go on the async way, in a task that answers
        through `reply` all the same."""
        ctx = self._ctx
        if ctx.role is not Role.LEADER or ctx.trace is not None or any(_is_transactional(r.records) for r in requests):
            return False
        received_s, epoch = time.monotonic(), ctx.leader_epoch
        appended: list[ProduceResult | _Appended] = []
        for request in requests:
            done = self._append_guarded(request, epoch, None, may_wait=True)
            if done is None:
                task = asyncio.get_running_loop().create_task(self._finish(requests, epoch, appended, reply, received_s))
                self._finishing.add(task)
                task.add_done_callback(self._finishing.discard)
                return True
            appended.append(done)
        results: list[ProduceResult | None] = []
        pending: list[Pending] = []
        for slot, (done, request) in enumerate(zip(appended, requests)):
            if isinstance(done, ProduceResult):
                results.append(done)
                continue
            replicated = done.acknowledged(ctx.log.log_start_offset)
            results.append(replicated if request.acks != -1 else None)
            if request.acks == -1:
                pending.append(Pending(slot, done.last_offset + 1, done.leader_epoch,
                                       self._delayed.deadline(request.timeout_ms), request.timeout_ms, replicated))
        self._delayed.add(ParkedCall(results, pending, reply))
        return True

    async def _finish(
        self, requests: list[ProduceRequest], epoch: int, appended: list[ProduceResult | _Appended], reply: Reply,
        received_s: float,
    ) -> None:
        """The rest of a call `produce_or_park` began, the async way (a batch of it waits
        for its producer's earlier ones), answered through `reply` as a parked call is."""
        try:
            done = await self._append_from(requests, [None] * len(requests), epoch, appended)
            results: list[ProduceResult | None] = list(await self._answers(requests, done, received_s))
        except Exception as e:  # a bug: the call's requests fail, as their task's would
            logger.exception("%s: a produce call failed", self._ctx.name)
            results = [self.produce_error(UnknownServerError(f"{type(e).__name__}: {e}")) for _ in requests]
        self._delayed.add(ParkedCall(results, [], reply))  # answered at once, a reply that raises as a parked one's

    def drop_parked(self) -> None:
        """The replica closes: the parked calls are dropped, and the calls that went on the
        async way cancelled, unanswered (their connections close)."""
        self._delayed.drop()
        for task in list(self._finishing):
            task.cancel()

    def _failed_after_append(self, base_offset: int, error: KafkaError) -> ProduceResult:
        return ProduceResult(base_offset, -1, self._ctx.log.log_start_offset, error)

    async def _answer(
        self, appended: ProduceResult | _Appended, acks: int, timeout_ms: int, received_s: float
    ) -> ProduceResult:
        if isinstance(appended, ProduceResult):
            return appended
        trace = self._ctx.trace
        if trace is not None:
            trace.appended(received_s, appended.last_offset + 1)
        result = await self._acknowledge(appended, acks, timeout_ms)
        if self._ctx.trace is not None:
            self._ctx.trace.answered(appended.last_offset + 1)
        return result

    def _append(
        self, request: ProduceRequest, epoch: int | None, verification: _Verification, may_wait: bool
    ) -> ProduceResult | _Appended | None:
        """The checks and the append of one produce in leader epoch `epoch` (None: this
        replica did not lead when the call came): what to acknowledge, or the final answer
        (an error, or a duplicate's first answer). A transactional batch needs its
        producer's `transactional_id`; `verification` is what `_verify_request` found.
        None, having done nothing, if `may_wait` and an idempotent batch is ahead of its
        producer's sequence here: the caller waits for the earlier batches
        (`_await_earlier_batches`) and calls again with `may_wait` False."""
        ctx = self._ctx
        records, acks = request.records, request.acks
        if acks not in (0, 1, -1):
            return self.produce_error(InvalidRequiredAcksError(f"acks must be 0, 1 or -1 (all), got {acks}"))
        if epoch is None or not ctx.leads_in(epoch):
            return self.produce_error(ctx.not_leader())
        if isinstance(verification, KafkaError):
            ctx.counters.bytes_rejected += len(records)
            return self.produce_error(verification)
        header = BatchHeader.parse(records) if len(records) >= HEADER_SIZE_BYTES else None
        if header is not None and header.producer_id >= 0:
            if header.size_bytes != len(records):
                ctx.counters.bytes_rejected += len(records)
                return self.produce_error(InvalidRecordError("an idempotent produce carries exactly one batch"))
            if may_wait and self._ahead_of_sequence(header):
                return None
        if acks == -1 and (too_few := self._isr.too_few_in_sync()) is not None:
            return self.produce_error(too_few)
        transactional = header is not None and header.is_transactional
        if transactional and request.transactional_id is None:
            return self.produce_error(InvalidRecordError("a transactional batch in a produce request without a transactional id"))
        log = ctx.log
        end_before = log.log_end_offset
        # No await from here to the append: the epoch checked above is the one written.
        assert ctx.leads_in(epoch), f"appended as the leader of epoch {epoch}"
        try:
            info = log.append_as_leader(records, epoch, allow_transactional=transactional, verification_guard=verification)
        except KafkaError as e:
            ctx.counters.bytes_rejected += len(records)  # too large, corrupt, invalid, out of sequence
            return self.produce_error(e)
        if not info.duplicate:  # (a retry of an appended batch is answered as the first time)
            assert end_before <= info.first_offset <= info.last_offset < log.log_end_offset, "offsets only grow"
            ctx.counters.messages_in += info.record_count
            ctx.counters.bytes_in += info.size_bytes
            self._wake_after_append(info)
        return _Appended(info.first_offset, info.last_offset, info.log_append_time_ms, epoch)

    async def _verify_request(self, request: ProduceRequest, epoch: int) -> _Verification:
        """Asks the transaction coordinator about a transactional request whose batch would
        open its producer's transaction here (txn_verification.py), bounded by the request's
        timeout: the guard to append with, the refusal, or None (not transactional, or its
        transaction is open here already: the append checks that it still is)."""
        records, ctx = request.records, self._ctx
        if not _is_transactional(records) or request.transactional_id is None:
            return None  # (no transactional id: _append refuses it)
        header = BatchHeader.parse(records)
        entry = ctx.log.producer_state.producers.get(header.producer_id)
        if entry is not None and entry.epoch == header.producer_epoch and entry.current_txn_first_offset is not None:
            return None
        deadline_s = time.monotonic() + request.timeout_ms / 1000
        for _ in range(2):
            guard = ctx.log.verification_guard(header.producer_id)  # taken before asking: a marker meanwhile voids it
            error = await txn_verification.verify_partition(
                self._txn_coordinators, request.transactional_id, ctx.topic, ctx.partition, header.producer_id,
                header.producer_epoch, request.transaction_version,
                timeout_ms=int((deadline_s - time.monotonic()) * 1000),
            )  # fmt: skip
            if error is not None:
                return error
            if not ctx.leads_in(epoch):  # the leadership moved while the coordinator answered
                return ctx.not_leader()
            if ctx.log.holds_verification(guard):
                return guard
            # A marker landed while the coordinator answered: the coordinator holds a
            # verification until the producer's previous transaction is complete, so this is
            # most often that transaction's marker, not this one's. Asking once more tells them
            # apart: the transaction this batch is for is fenced or lacks the partition by now.
        return InvalidTxnStateError(
            f"producer {header.producer_id}'s transaction ended here while its coordinator verified the write"
        )

    def _ahead_of_sequence(self, header: BatchHeader) -> bool:
        """Whether an idempotent batch is ahead of its producer's sequence here (a gap)."""
        try:
            verdict, _ = self._ctx.log.producer_state.check(
                header.producer_id, header.producer_epoch, header.base_sequence,
                header.base_sequence + header.last_offset_delta,
            )  # fmt: skip
        except KafkaError:
            return False  # refused whatever comes: the append says so
        return verdict is Verdict.GAP

    async def _await_earlier_batches(self, request: ProduceRequest, epoch: int | None) -> None:
        """Waits while the request's batch is ahead of its producer's sequence here, for at
        most SEQUENCE_GAP_WAIT_MAX_MS: calls to an async actor may arrive out of order, so
        the producer's earlier batches may be on their way. Decides nothing: the log's
        append checks the batch against the producer state as it is then (a duplicate, a
        gap left, an epoch fenced), and the epoch again."""
        ctx = self._ctx
        header = BatchHeader.parse(request.records)
        deadline = time.monotonic() + min(request.timeout_ms, SEQUENCE_GAP_WAIT_MAX_MS) / 1000
        while True:
            appended = ctx.events.change_event(appends=True)  # the producer's earlier batches
            if epoch is None or not ctx.leads_in(epoch):
                return
            remaining_s = deadline - time.monotonic()
            if not self._ahead_of_sequence(header) or remaining_s <= 0:
                return
            await appended.wait(remaining_s)

    def _wake_after_append(self, info: LogAppendInfo | None = None) -> None:
        """Wakes what waits for this leader's log: a single-replica ISR moves the HW at once.
        The followers' parked fetches may be answered with `info`'s records, unread."""
        if self._isr.maybe_increment_high_watermark():
            self._ctx.events.notify_change()
        elif info is not None and info.records is not None:
            self._ctx.events.notify_append((info.first_offset, info.records))
        else:
            self._ctx.events.notify_append()

    async def write_txn_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timeout_ms: int
    ) -> ProduceResult:
        """The partition leader's side of WriteTxnMarkers: appends a transaction
        coordinator's COMMIT or ABORT marker for the producer (Log.append_txn_marker: its
        epoch checks, TRANSACTION_COORDINATOR_FENCED, INVALID_PRODUCER_EPOCH) and answers
        once the in-sync replicas have it, as an acks=all produce."""
        ctx = self._ctx
        if ctx.role is not Role.LEADER:
            return self.produce_error(ctx.not_leader())
        if (too_few := self._isr.too_few_in_sync()) is not None:
            return self.produce_error(too_few)
        epoch = ctx.leader_epoch
        try:
            info = ctx.log.append_txn_marker(producer_id, producer_epoch, commit, coordinator_epoch, epoch)
        except KafkaError as e:
            return self.produce_error(e)
        self._wake_after_append()
        return await self._acknowledge(_Appended(info.first_offset, info.last_offset, -1, epoch), -1, timeout_ms)

    # ------------------------------------------------------------------ acknowledgement

    async def _acknowledge(self, appended: _Appended, acks: int, timeout_ms: int) -> ProduceResult:
        log = self._ctx.log
        result = appended.acknowledged(log.log_start_offset)
        if acks != -1:
            return result
        error = await self._wait_for_replication(appended.last_offset + 1, appended.leader_epoch, timeout_ms)
        return result if error is None else self._failed_after_append(appended.first_offset, error)

    async def _wait_for_replication(self, required_offset: int, epoch: int, timeout_ms: int) -> KafkaError | None:
        """Kafka's DelayedProduce: done when HW >= required_offset in `epoch`, or fails."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            changed = self._ctx.events.change_event()
            outcome = self.replication_outcome(required_offset, epoch)
            if not isinstance(outcome, _Replicating):
                return outcome
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return replication_timed_out(required_offset, timeout_ms)
            await changed.wait(remaining_s)

    def replication_outcome(self, required_offset: int, epoch: int) -> KafkaError | None | _Replicating:
        """Where an acks=-1 acknowledgement of the records below `required_offset`, appended
        in `epoch`, stands now: None (the HW passed them in that epoch), the error it is
        answered (the leadership moved on, the ISR is below min.insync.replicas), or
        REPLICATING."""
        ctx = self._ctx
        if not ctx.leads_in(epoch):
            return ctx.not_leader()
        if len(self._isr.leading().isr) < ctx.config.min_insync_replicas:
            # The HW stands still below min.insync.replicas (strict min ISR): say so now.
            return NotEnoughReplicasAfterAppendError(
                f"written, but the ISR shrank below min.insync.replicas = {ctx.config.min_insync_replicas}"
            )
        if ctx.log.high_watermark >= required_offset:
            assert ctx.leader_epoch == epoch, "acknowledged only by the HW of the epoch its records were appended in"
            return None
        return REPLICATING

    # ------------------------------------------------------------------ producer state

    async def producer_sequence(self, producer_id: int, timeout_ms: int) -> tuple[int, int]:
        """(epoch, next sequence) of an idempotent producer here, once its last batch is
        committed (below the HW); (-1, 0) if the partition knows no batch of it (see
        PartitionReplica.producer_sequence)."""
        ctx = self._ctx
        if ctx.role is not Role.LEADER:
            raise ctx.not_leader()
        entry = ctx.log.producer_state.producers.get(producer_id)
        if entry is None or not entry.batches:
            return -1, 0
        epoch, last = entry.epoch, entry.batches[-1]
        error = await self._wait_for_replication(last.last_offset + 1, ctx.leader_epoch, timeout_ms)
        if error is not None:
            # NOT_ENOUGH_REPLICAS_AFTER_APPEND too: below the HW, but held by fewer than
            # min.insync.replicas, which is what its producer was told; a resuming writer
            # that skipped it would report as written what the topic's durability setting
            # says is not. The error is retriable: the writer asks again as the ISR grows.
            raise error
        return epoch, (last.last_sequence + 1) % (1 << 31)  # int32, wraps as the producer's

    def describe_producers(self) -> list[dict]:
        """Kafka's DescribeProducers for this partition (see PartitionReplica.describe_producers)."""
        ctx = self._ctx
        if ctx.role is not Role.LEADER:
            raise ctx.not_leader()
        out = []
        for producer_id, entry in sorted(ctx.log.producer_state.producers.items()):
            last = entry.batches[-1] if entry.batches else None
            out.append({
                "producer_id": producer_id,
                "producer_epoch": entry.epoch,
                "last_sequence": last.last_sequence if last else -1,
                "last_timestamp": last.timestamp_ms if last else -1,
                "coordinator_epoch": entry.coordinator_epoch,
                "current_txn_start_offset": -1 if entry.current_txn_first_offset is None else entry.current_txn_first_offset,
            })
        return out
