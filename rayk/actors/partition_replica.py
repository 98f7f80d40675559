"""PartitionReplica: one replica of one partition, as an async Ray actor (num_cpus=0).

It owns the partition's `Log` on its node's disk and is either the leader or a follower
for a given leader epoch; whoever manages the broker tells it which (`become_leader`,
`become_follower`).

Leader:
- `produce(records, acks, timeout_ms)` appends a producer's batches;
  `produce_requests` does so for several requests in one call (a listener's). acks must be 0, 1
  or -1 (else INVALID_REQUIRED_ACKS); acks=-1 is refused with NOT_ENOUGH_REPLICAS
  before appending when the ISR is smaller than `min.insync.replicas`, and otherwise
  waits (Kafka's DelayedProduce) until the HW passes the last appended offset, or answers
  REQUEST_TIMED_OUT after `timeout_ms`.
- `fetch(...)` serves consumers up to the HW and followers up to the LEO. A fetch that
  finds fewer than `min_bytes` waits up to `max_wait_ms` and is answered the moment an
  append or an HW move satisfies it (an asyncio event per change; nothing polls).
  A follower's fetch offset is its LEO: the leader records it, may add the follower to the
  ISR and may advance the HW (`LeaderReplicaState`), then answers.

  A follower's fetch names the epoch of its last batch; if the leader's log went another
  way after that epoch, the answer is the diverging epoch instead of records, and the
  follower's offset is not counted (it is not a position in the leader's log).
- On becoming leader it records the new epoch as starting at its LEO, so followers
  asking where an older epoch ends learn that it ends here.

Follower: a `ReplicaFetcher` task per leader epoch truncates the log where it diverges
from the leader's (KIP-101/279) and copies the leader's batches (see replica_fetcher.py).

ISR expiration (Kafka's isr-expiration task) runs in the leader's own event loop, every
half of replica.lag.time.max.ms while it leads: a timer there costs microseconds, where the
broker's call to each leader for it cost ~1-2 ms of CPU across the two processes, every
5 s, for each partition, idle or not.

ISR changes the leader decides (a follower caught up, or one fell behind) go to the
Controller as AlterPartition through `isr_manager` (the broker's ReplicaManager) and take
effect when it commits them; until then the HW respects the maximal ISR (see
`LeaderReplicaState`). A change the Controller refused is dropped and may be proposed
again; one whose outcome is unknown (no answer: the call failed or timed out, or the
broker's epoch was stale, so an earlier try may have been applied), or that the Controller
refused because this replica's view is stale, stays pending, keeping the larger ISR in the
HW, until an answer or the Controller's next assignment settles it, as Kafka's
AlterPartitionManager does. Without an `isr_manager` (a replica used on its
own) changes commit at once.

The broker's board (replica_board.py): from its first role on, the replica publishes its
log's offsets and size into its slot on a timer of its own; the broker reads them for its
checkpoints and gauges, and takes each publication for a sign of life.

Supervision (see supervision.py): the owning ReplicaManager holds `run_until_stopped`
open and `ping`s the replica when it has neither answered nor published for a while;
`close` and `delete` end the held call normally.

Metrics: as leader it counts Kafka's BrokerTopicMetrics of its produce and fetch calls in
plain ints (rayk/metrics.py), added to Ray's counters at most once a second and at each
publication on the board.

Errors are returned in the result (`error`), as Kafka returns per-partition error codes.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from rayk.actors import replica_process, txn_verification
from rayk.actors.direct_calls import call_methods_directly
from rayk.actors.leader_link import LeaderLink
from rayk.actors.produce_trace import ProduceTrace
from rayk.actors.replica_board import BoardSlot, SlotWriter
from rayk.actors.replica_fetcher import ReplicaFetcher
from rayk.actors.replica_state import LeaderReplicaState
from rayk.actors.share_fetch import Acknowledgement, ShareFetchResult, SharePartitions, ShareSettings
from rayk.actors.share_state_client import ShareStateClient
from rayk.actors.supervision import Supervised
from rayk.actors.wakeup import Wakeup
from rayk.dataplane import frames
from rayk.dataplane.endpoint import Endpoint, EndpointAddress
from rayk.dataplane.frames import FetchResult, ProduceRequest, ProduceResult
from rayk.dataplane.tls import KeyStore
from rayk.errors import (
    FencedLeaderEpochError,
    InconsistentTopicIdError,
    IneligibleReplicaError,
    InvalidRecordError,
    InvalidRequiredAcksError,
    InvalidTimestampError,
    InvalidTxnStateError,
    KafkaError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    OffsetNotAvailableError,
    OffsetOutOfRangeError,
    PolicyViolationError,
    RequestTimedOutError,
    StaleBrokerEpochError,
    UnknownLeaderEpochError,
    UnknownServerError,
)
from rayk.metrics import BrokerTopicCounters
from rayk.storage import Log, LogConfig, log_cleaner, partition_metadata
from rayk.storage.leader_epoch_cache import UNDEFINED_EPOCH
from rayk.storage.log_cleaner import CleanableState, CleanResult
from rayk.storage.log_dir_checkpoints import PartitionOffsets
from rayk.storage.producer_state import VerificationGuard, Verdict
from rayk.storage.records import HEADER_SIZE_BYTES, BatchHeader, iter_batches


replica_process.keep_libraries_out()  # first thing in a replica's own process (see replica_process.py)

logger = logging.getLogger(__name__)

CONSUMER_REPLICA_ID = -1
LATEST_TIMESTAMP = -1  # ListOffsets sentinels
EARLIEST_TIMESTAMP = -2
NO_LEADER = -1
ISR_CHANGE_RETRY_BACKOFF_MS = 100
ISR_CHANGE_TIMEOUT_MS = 10_000  # no answer from the Controller by then: the outcome is unknown
# The Controller definitely did not apply a change it refused with these: drop it.
# Only a per-partition refusal says that the change was not applied, by any Controller,
# before or after (Kafka's Partition.handleAlterPartitionError resets on INELIGIBLE_REPLICA
# alone). STALE_BROKER_EPOCH is about the broker, not the change: an earlier try whose answer
# was lost may have been applied, so the change stays pending and is sent again.
_ISR_CHANGE_REFUSED = (IneligibleReplicaError,)
LOG_LOCK_WAIT_MS = 30_000  # a replica re-created after a crash waits this long for the old process to go
SEQUENCE_GAP_WAIT_MAX_MS = 2_000  # how long a batch ahead of its producer's sequence waits
DELETE_TO_HIGH_WATERMARK = -1  # DeleteRecords' offset for "everything below the high watermark"


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """Replication settings, with Kafka's defaults (names: min.insync.replicas, ...)."""

    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 10_000
    replica_fetch_max_bytes: int = 1 << 20
    replica_fetch_min_bytes: int = 1
    replica_fetch_wait_max_ms: int = 500
    replica_socket_timeout_ms: int = 30_000  # bound on one follower fetch call
    # Where the data plane's TCP endpoint binds (rayk/dataplane): the host of the brokers'
    # first listener, as Kafka replicates over a listener; "": the node's address.
    data_plane_host: str = ""
    # The certificate it serves over TLS (the first TLS listener's); None: plain TCP.
    data_plane_keystore: KeyStore | None = None
    share: ShareSettings = ShareSettings()  # KIP-932's group.share.* settings


@dataclass(frozen=True, slots=True)
class _Appended:
    """A produce's records as the leader appended them: what its acknowledgement waits for."""

    first_offset: int
    last_offset: int
    log_append_time_ms: int
    leader_epoch: int  # appended in: an acknowledgement holds only while this epoch leads


# What `_verify_request` found for a request: None (nothing to verify), the guard to append
# a transaction's first batch with, or the error the request is answered.
_Verification = VerificationGuard | KafkaError | None


def _is_transactional(records: bytes) -> bool:
    return len(records) >= HEADER_SIZE_BYTES and BatchHeader.parse(records).is_transactional


def _now_ms() -> int:
    return int(time.time() * 1000)


class PartitionReplica(Supervised):
    def __init__(
        self,
        topic: str,
        partition: int,
        broker_id: int,
        log_dir: str | Path,
        log_config: LogConfig | None = None,
        replica_config: ReplicaConfig | None = None,
        offsets: PartitionOffsets | None = None,
        isr_manager: Any = None,
        controller: Any = None,
        board_slot: BoardSlot | None = None,
    ) -> None:
        """`offsets` are the broker's checkpointed recovery point, log start and HW for this
        log; `isr_manager` is an actor handle with `alter_partition` (the ReplicaManager);
        `controller` the Controller's, through which a leader finds the transaction
        coordinators that verify transactional writes (txn_verification.py); `board_slot`
        where this replica publishes its offsets to its broker (replica_board.py)."""
        call_methods_directly(self)
        self.topic, self.partition, self.broker_id = topic, partition, broker_id
        self.config = replica_config or ReplicaConfig()
        self.topic_id = partition_metadata.read(log_dir)  # None for a log without partition.metadata
        offsets = offsets or PartitionOffsets()
        self._log = Log(
            log_dir,
            log_config,
            recovery_point=offsets.recovery_point,
            log_start_offset=offsets.log_start_offset,
            high_watermark=offsets.high_watermark,
            cleaner_offset=offsets.cleaner_offset,
            lock_wait_ms=LOG_LOCK_WAIT_MS,
        )
        self._isr_manager = isr_manager
        self._controller = controller
        self._txn_coordinators = txn_verification.CoordinatorHandles(controller)
        self._role: str | None = None  # "leader" | "follower" | None before the first assignment
        self._leader_epoch = -1
        self._partition_epoch = -1
        self._leader_id: int | None = None
        self._leader_state: LeaderReplicaState | None = None
        self._fetcher: asyncio.Task | None = None
        self._changed: Wakeup | None = None  # see _notify_change
        self._appended: Wakeup | None = None
        self._isr_change_retry_at = 0.0  # monotonic seconds
        self._isr_expiration: asyncio.TimerHandle | None = None  # while leading
        self._background: set[asyncio.Task] = set()
        self._trace: ProduceTrace | None = None  # see trace_produce
        self._cleaning: asyncio.Future | None = None  # the log cleaner's thread, while it runs
        self._counters = BrokerTopicCounters(broker_id, topic)
        self._board = None if board_slot is None else SlotWriter(board_slot)
        self._publishing: asyncio.TimerHandle | None = None  # the next publication, while it leads or follows
        self._published: PartitionOffsets | None = None  # the offsets last published
        self._endpoint: Endpoint | None = None  # the data plane's, opened at the first data_endpoint call
        self._shares: SharePartitions | None = None  # while leading, once a share group fetched here
        self._share_states = ShareStateClient(self._controller)  # the share groups' coordinators (no I/O until used)

    # ------------------------------------------------------------------ idempotent producers

    async def _await_earlier_batches(self, header: BatchHeader, timeout_ms: int, epoch: int) -> None:
        """Waits while the batch is ahead of its producer's sequence here, for at most
        SEQUENCE_GAP_WAIT_MAX_MS: calls to an async actor may arrive out of order, so the
        producer's earlier batches may be on their way. Decides nothing: the log's append
        checks the batch against the producer state as it is then (a duplicate, a gap left,
        an epoch fenced)."""
        last_sequence = header.base_sequence + header.last_offset_delta
        deadline = time.monotonic() + min(timeout_ms, SEQUENCE_GAP_WAIT_MAX_MS) / 1000
        while True:
            appended = self._change_event(appends=True)  # the producer's earlier batches
            if not self._leads_in(epoch):
                return
            try:
                verdict, _ = self._log.producer_state.check(
                    header.producer_id, header.producer_epoch, header.base_sequence, last_sequence
                )
            except KafkaError:
                return  # refused whatever comes: the append says so
            remaining_s = deadline - time.monotonic()
            if verdict is not Verdict.GAP or remaining_s <= 0:
                return
            await appended.wait(remaining_s)

    async def producer_sequence(self, producer_id: int, timeout_ms: int) -> tuple[int, int]:
        """(epoch, next sequence) of an idempotent producer here, once its last batch is
        committed (below the HW), so that the answer cannot be undone by truncation;
        (-1, 0) if the partition knows no batch of it. Kafka's DescribeProducers, which a
        writer resuming that producer's sequences needs (rayk.client.resumable_write).
        Raises NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT if the batch is not committed
        within `timeout_ms`, or NOT_ENOUGH_REPLICAS_AFTER_APPEND if it is below the HW while
        the ISR is smaller than min.insync.replicas (not committed for a resume point)."""
        if self._role != "leader":
            raise self._not_leader()
        entry = self._log.producer_state.producers.get(producer_id)
        if entry is None or not entry.batches:
            return -1, 0
        epoch, last = entry.epoch, entry.batches[-1]
        error = await self._wait_for_replication(last.last_offset + 1, self._leader_epoch, timeout_ms)
        if error is not None:
            # NOT_ENOUGH_REPLICAS_AFTER_APPEND too: below the HW, but held by fewer than
            # min.insync.replicas, which is what its producer was told; a resuming writer
            # that skipped it would report as written what the topic's durability setting
            # says is not. The error is retriable: the writer asks again as the ISR grows.
            raise error
        return epoch, (last.last_sequence + 1) % (1 << 31)  # int32, wraps as the producer's

    async def describe_producers(self) -> list[dict]:
        """Kafka's DescribeProducers for this partition: each producer the leader remembers,
        with its epoch, last sequence and timestamp, the coordinator epoch of its last
        marker and its open transaction's first offset (-1: none)."""
        if self._role != "leader":
            raise self._not_leader()
        out = []
        for producer_id, entry in sorted(self._log.producer_state.producers.items()):
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

    # ------------------------------------------------------------------ change notification

    # Two events, as Kafka keys its delayed operations: `_appended` wakes what waits for new
    # records (a follower's fetch, a batch waiting for its producer's earlier sequence), and
    # `_changed` wakes every waiter (the HW, the role or a config moved). A consumer's fetch
    # reads only up to the HW and an acks=all produce waits for it, so an append that leaves
    # the HW where it was wakes neither: at RF=3 that is most appends.

    def _change_event(self, appends: bool = False) -> Wakeup:
        """The event a waiter waits on, taken before it checks its condition; with
        `appends`, one that new records fire too."""
        if appends:
            if self._appended is None:
                self._appended = Wakeup()
            return self._appended
        if self._changed is None:
            self._changed = Wakeup()
        return self._changed

    def _notify_append(self) -> None:
        """Records were appended and the HW did not move: wakes the waiters for records."""
        if self._appended is not None:
            event, self._appended = self._appended, None
            event.fire()

    def _notify_change(self) -> None:
        """Wakes every waiting fetch and produce: the HW, the role or a config moved. The
        share-partitions go with the leader epoch they were loaded in."""
        self._notify_append()
        if self._shares is not None:
            if self._role != "leader" or self._shares.leader_epoch != self._leader_epoch:
                self._shares.close()
                self._shares = None
            else:
                self._shares.wake()
        if self._changed is not None:
            event, self._changed = self._changed, None
            event.fire()

    # ------------------------------------------------------------------ role changes

    async def become_leader(
        self, leader_epoch: int, replicas: list[int], isr: list[int], partition_epoch: int = 0
    ) -> None:
        """Leads for `leader_epoch`. The same epoch again with a newer `partition_epoch` only
        updates the replicas and the ISR (the Controller changed them: it fenced a
        follower's broker, or a reassignment added or removed replicas)."""
        if leader_epoch < self._leader_epoch:
            raise FencedLeaderEpochError(f"become_leader for epoch {leader_epoch} after epoch {self._leader_epoch}")
        if self._role == "leader" and leader_epoch == self._leader_epoch:
            if partition_epoch > self._partition_epoch:
                self._partition_epoch = partition_epoch
                self._leader_state.update_replicas(replicas, _now_ms())
                self._leader_state.commit_isr(isr)
                self._after_isr_change()
            elif partition_epoch == self._partition_epoch and list(replicas) != self._leader_state.replicas:
                # This epoch was learnt from an AlterPartition answer, which carries no replica
                # set (Kafka's makeLeader also takes an equal epoch); the ISR and any pending
                # change stay as they are.
                self._leader_state.update_replicas(replicas, _now_ms())
            return
        await self._stop_fetcher()
        self._log.assign_leader_epoch(leader_epoch)
        self._role, self._leader_epoch, self._leader_id = "leader", leader_epoch, self.broker_id
        self._partition_epoch = partition_epoch
        self._leader_state = LeaderReplicaState(
            self.broker_id, replicas, isr, self._log.high_watermark, self._log.log_end_offset, _now_ms()
        )
        self._maybe_increment_high_watermark()
        self._notify_change()
        self._schedule_isr_expiration()
        self._start_publishing()

    async def become_follower(self, leader_epoch: int, leader_id: int, leader: Any, incarnation_id: str = "") -> None:
        """Follows `leader` (an actor handle of the leader's PartitionReplica), or waits for
        one when `leader_id` is NO_LEADER (-1) and `leader` None. `incarnation_id` names
        this broker's process, which every fetch carries (KIP-903)."""
        if leader_epoch < self._leader_epoch:
            raise FencedLeaderEpochError(f"become_follower for epoch {leader_epoch} after epoch {self._leader_epoch}")
        following = self._fetcher is not None and not self._fetcher.done()
        if (self._role, self._leader_epoch, self._leader_id) == ("follower", leader_epoch, leader_id) and following:
            return  # already following this leader in this epoch
        await self._stop_fetcher()
        self._role, self._leader_epoch, self._leader_id = "follower", leader_epoch, leader_id
        self._leader_state = None
        self._cancel_isr_expiration()
        self._notify_change()  # parked produces learn they are no longer on the leader
        self._start_publishing()
        if leader is not None and leader_id != NO_LEADER:
            name = f"{self.topic}-{self.partition}"
            link = LeaderLink(leader, ray.get_runtime_context().get_node_id(), name)
            fetcher = ReplicaFetcher(
                self._log, name, self.broker_id, link, leader_epoch, self.config, self._after_follower_progress,
                incarnation_id,
            )
            self._fetcher = asyncio.get_running_loop().create_task(fetcher.run())

    async def _stop_fetcher(self) -> None:
        if self._fetcher is not None:
            self._fetcher.cancel()
            try:
                await self._fetcher
            except (asyncio.CancelledError, Exception):
                pass
            self._fetcher = None

    # ------------------------------------------------------------------ leader: produce

    async def produce(self, records: bytes, acks: int, timeout_ms: int) -> ProduceResult:
        return (await self.produce_requests([ProduceRequest(records, acks, timeout_ms)]))[0]

    async def produce_requests(self, requests: list[ProduceRequest]) -> list[ProduceResult]:
        """Several produce requests in one call, as a listener sends the requests for this
        partition that arrived while its call before was in flight
        (rayk/net/produce_coalescer.py): appended in list order, each answered as
        `produce` answers it; the acknowledgements wait together.

        As Kafka's ReplicaManager does, the transactions' first batches are verified with
        their coordinators before any request of the call is appended, and every request is
        appended in the leader epoch the call started in or not at all. Each appended
        request's acknowledgement waits in the epoch it was appended in: if the leadership
        moves on meanwhile, it is NOT_LEADER_OR_FOLLOWER, never an HW of another epoch's log
        (which may have truncated the records away). One request's bad input, or a fault in
        handling it, is that request's error alone."""
        received_s = time.monotonic()
        requests = [r if isinstance(r, ProduceRequest) else ProduceRequest(*r) for r in requests]
        epoch = self._leader_epoch if self._role == "leader" else None
        verified: list[_Verification] = [None] * len(requests)
        if epoch is not None and any(_is_transactional(request.records) for request in requests):
            verified = list(await asyncio.gather(*(self._verify_request(request, epoch) for request in requests)))
        appended = [await self._append_request(request, epoch, v) for request, v in zip(requests, verified)]
        results = list(await asyncio.gather(*(
            self._answer(done, request.acks, request.timeout_ms, received_s) for done, request in zip(appended, requests)
        )))
        counters = self._counters
        counters.produce_requests += len(results)
        counters.failed_produce_requests += sum(1 for r in results if r.error is not None)
        counters.maybe_flush()
        return results

    async def _answer(
        self, appended: ProduceResult | _Appended, acks: int, timeout_ms: int, received_s: float
    ) -> ProduceResult:
        if isinstance(appended, ProduceResult):
            return appended
        if self._trace is not None:
            self._trace.appended(received_s, appended.last_offset + 1)
        result = await self._acknowledge(appended, acks, timeout_ms)
        if self._trace is not None:
            self._trace.answered(appended.last_offset + 1)
        return result

    async def _append_request(
        self, request: ProduceRequest, epoch: int | None, verification: _Verification
    ) -> ProduceResult | _Appended:
        """`_append`, where a fault (a bug: not a KafkaError) fails this request alone,
        with UNKNOWN_SERVER_ERROR, as Kafka answers an unexpected error per partition."""
        try:
            return await self._append(request, epoch, verification)
        except KafkaError as e:
            return self._produce_error(e)
        except Exception as e:
            logger.exception("%s-%d: appending a produce request failed", self.topic, self.partition)
            return self._produce_error(UnknownServerError(f"{type(e).__name__}: {e}"))

    async def _append(
        self, request: ProduceRequest, epoch: int | None, verification: _Verification
    ) -> ProduceResult | _Appended:
        """The checks and the append of one produce in leader epoch `epoch` (None: this
        replica did not lead when the call came): what to acknowledge, or the final answer
        (an error, or a duplicate's first answer). A transactional batch needs its
        producer's `transactional_id`; `verification` is what `_verify_request` found."""
        records, acks, timeout_ms = request.records, request.acks, request.timeout_ms
        if acks not in (0, 1, -1):
            return self._produce_error(InvalidRequiredAcksError(f"acks must be 0, 1 or -1 (all), got {acks}"))
        if epoch is None or not self._leads_in(epoch):
            return self._produce_error(self._not_leader())
        if isinstance(verification, KafkaError):
            self._counters.bytes_rejected += len(records)
            return self._produce_error(verification)
        header = BatchHeader.parse(records) if len(records) >= HEADER_SIZE_BYTES else None
        if header is not None and header.producer_id >= 0:
            if header.size_bytes != len(records):
                self._counters.bytes_rejected += len(records)
                return self._produce_error(InvalidRecordError("an idempotent produce carries exactly one batch"))
            await self._await_earlier_batches(header, timeout_ms, epoch)
            if not self._leads_in(epoch):
                return self._produce_error(self._not_leader())
        if acks == -1 and (too_few := self._too_few_in_sync()) is not None:
            return self._produce_error(too_few)
        transactional = header is not None and header.is_transactional
        if transactional and request.transactional_id is None:
            return self._produce_error(InvalidRecordError("a transactional batch in a produce request without a transactional id"))
        try:
            # No await from here to the append: the epoch checked above is the one written.
            info = self._log.append_as_leader(records, epoch, allow_transactional=transactional,
                                              verification_guard=verification)  # fmt: skip
        except KafkaError as e:
            self._counters.bytes_rejected += len(records)  # too large, corrupt, invalid, out of sequence
            return self._produce_error(e)
        if not info.duplicate:  # (a retry of an appended batch is answered as the first time)
            self._counters.messages_in += info.record_count
            self._counters.bytes_in += info.size_bytes
            self._wake_after_append()
        return _Appended(info.first_offset, info.last_offset, info.log_append_time_ms, epoch)

    def _leads_in(self, epoch: int) -> bool:
        return self._role == "leader" and self._leader_epoch == epoch

    async def _verify_request(self, request: ProduceRequest, epoch: int) -> _Verification:
        """Asks the transaction coordinator about a transactional request whose batch would
        open its producer's transaction here (txn_verification.py), bounded by the request's
        timeout: the guard to append with, the refusal, or None (not transactional, or its
        transaction is open here already: the append checks that it still is)."""
        records = request.records
        if not _is_transactional(records) or request.transactional_id is None:
            return None  # (no transactional id: _append refuses it)
        header = BatchHeader.parse(records)
        entry = self._log.producer_state.producers.get(header.producer_id)
        if entry is not None and entry.epoch == header.producer_epoch and entry.current_txn_first_offset is not None:
            return None
        deadline_s = time.monotonic() + request.timeout_ms / 1000
        for attempt in range(2):
            guard = self._log.verification_guard(header.producer_id)  # taken before asking: a marker meanwhile voids it
            error = await txn_verification.verify_partition(
                self._txn_coordinators, request.transactional_id, self.topic, self.partition, header.producer_id,
                header.producer_epoch, request.transaction_version,
                timeout_ms=int((deadline_s - time.monotonic()) * 1000),
            )  # fmt: skip
            if error is not None:
                return error
            if not self._leads_in(epoch):  # the leadership moved while the coordinator answered
                return self._not_leader()
            if self._log.holds_verification(guard):
                return guard
            # A marker landed while the coordinator answered: the coordinator holds a
            # verification until the producer's previous transaction is complete, so this is
            # most often that transaction's marker, not this one's. Asking once more tells them
            # apart: the transaction this batch is for is fenced or lacks the partition by now.
        return InvalidTxnStateError(
            f"producer {header.producer_id}'s transaction ended here while its coordinator verified the write"
        )

    def _too_few_in_sync(self) -> NotEnoughReplicasError | None:
        """What an acks=all write is refused with while the ISR is below min.insync.replicas."""
        isr_size = len(self._leader_state.isr)
        if isr_size >= self.config.min_insync_replicas:
            return None
        return NotEnoughReplicasError(
            f"{self.topic}-{self.partition} has {isr_size} in-sync replicas, "
            f"min.insync.replicas is {self.config.min_insync_replicas}"
        )

    def _wake_after_append(self) -> None:
        """Wakes what waits for this leader's log: a single-replica ISR moves the HW at once."""
        if self._maybe_increment_high_watermark():
            self._notify_change()
        else:
            self._notify_append()

    async def write_txn_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timeout_ms: int
    ) -> ProduceResult:
        """The partition leader's side of WriteTxnMarkers: appends a transaction
        coordinator's COMMIT or ABORT marker for the producer (Log.append_txn_marker: its
        epoch checks, TRANSACTION_COORDINATOR_FENCED, INVALID_PRODUCER_EPOCH) and answers
        once the in-sync replicas have it, as an acks=all produce."""
        if self._role != "leader":
            return self._produce_error(self._not_leader())
        if (too_few := self._too_few_in_sync()) is not None:
            return self._produce_error(too_few)
        epoch = self._leader_epoch
        try:
            info = self._log.append_txn_marker(producer_id, producer_epoch, commit, coordinator_epoch, epoch)
        except KafkaError as e:
            return self._produce_error(e)
        self._wake_after_append()
        return await self._acknowledge(_Appended(info.first_offset, info.last_offset, -1, epoch), -1, timeout_ms)

    def trace_produce(self, enable: bool) -> list[dict]:
        """Starts noting the stages of each appended batch's acks=all path (ProduceTrace),
        or stops and returns what was noted. For benchmarks/ack_path_bench.py."""
        batches = self._trace.batches() if self._trace is not None else []
        self._trace = ProduceTrace() if enable else None
        return batches

    async def _acknowledge(self, appended: _Appended, acks: int, timeout_ms: int) -> ProduceResult:
        log = self._log
        result = ProduceResult(appended.first_offset, appended.log_append_time_ms, log.log_start_offset)
        if acks != -1:
            return result
        error = await self._wait_for_replication(appended.last_offset + 1, appended.leader_epoch, timeout_ms)
        return result if error is None else ProduceResult(appended.first_offset, -1, log.log_start_offset, error)

    async def _wait_for_replication(self, required_offset: int, epoch: int, timeout_ms: int) -> KafkaError | None:
        """Kafka's DelayedProduce: done when HW >= required_offset, or fails."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            changed = self._change_event()
            if self._role != "leader" or self._leader_epoch != epoch:
                return self._not_leader()
            if len(self._leader_state.isr) < self.config.min_insync_replicas:
                # The HW stands still below min.insync.replicas (strict min ISR): say so now.
                return NotEnoughReplicasAfterAppendError(
                    f"written, but the ISR shrank below min.insync.replicas = {self.config.min_insync_replicas}"
                )
            if self._log.high_watermark >= required_offset:
                return None
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return RequestTimedOutError(
                    f"offset {required_offset - 1} was not replicated to all in-sync replicas within {timeout_ms} ms"
                )
            await changed.wait(remaining_s)

    def _produce_error(self, error: KafkaError) -> ProduceResult:
        return ProduceResult(-1, -1, self._log.log_start_offset, error)

    def _not_leader(self) -> NotLeaderOrFollowerError:
        return NotLeaderOrFollowerError(
            f"broker {self.broker_id} is not the leader of {self.topic}-{self.partition} "
            f"(leader: {self._leader_id}, epoch {self._leader_epoch})"
        )

    def _maybe_increment_high_watermark(self) -> bool:
        state = self._leader_state
        if state is None or not state.maybe_increment_high_watermark(
            self._log.log_end_offset, self.config.min_insync_replicas
        ):
            return False
        self._log.high_watermark = state.high_watermark
        if self._trace is not None:
            self._trace.high_watermark(state.high_watermark)
        return True

    # ------------------------------------------------------------------ leader: fetch

    async def fetch(
        self,
        offset: int,
        max_bytes: int,
        min_bytes: int = 1,
        max_wait_ms: int = 500,
        replica_id: int = CONSUMER_REPLICA_ID,
        leader_epoch: int = -1,
        last_fetched_epoch: int = UNDEFINED_EPOCH,
        topic_id: str | None = None,
        replica_incarnation_id: str = "",
        isolation_level: int = frames.READ_UNCOMMITTED,
    ) -> FetchResult:
        """`topic_id` (a Fetch v13+ names topics by id): INCONSISTENT_TOPIC_ID unless it is
        this log's, so a fetch for a deleted topic never reads one created again under its name.
        `replica_incarnation_id`: a follower's broker process (KIP-903, see LeaderReplicaState).
        A consumer's READ_COMMITTED fetch reads below the LSO, not the HW, and is answered the
        aborted transactions that overlap what it read."""
        result = await self._fetch(offset, max_bytes, min_bytes, max_wait_ms, replica_id, leader_epoch,
                                   last_fetched_epoch, topic_id, replica_incarnation_id,
                                   isolation_level == frames.READ_COMMITTED)
        counters = self._counters
        counters.fetch_requests += 1
        if result.error is not None:
            counters.failed_fetch_requests += 1
        elif replica_id == CONSUMER_REPLICA_ID:  # Kafka's BytesOut leaves replication out
            counters.bytes_out += len(result.records)
        counters.maybe_flush()
        return result

    async def _fetch(
        self, offset: int, max_bytes: int, min_bytes: int, max_wait_ms: int, replica_id: int, leader_epoch: int,
        last_fetched_epoch: int, topic_id: str | None, replica_incarnation_id: str = "", read_committed: bool = False,
    ) -> FetchResult:
        if self._role != "leader":
            return self._fetch_error(self._not_leader())
        if topic_id is not None and topic_id != self.topic_id:
            return self._fetch_error(InconsistentTopicIdError(f"{self.topic}-{self.partition} has topic id {self.topic_id}, not {topic_id}"))
        if leader_epoch >= 0 and leader_epoch != self._leader_epoch:
            cls = FencedLeaderEpochError if leader_epoch < self._leader_epoch else UnknownLeaderEpochError
            return self._fetch_error(cls(f"fetch in epoch {leader_epoch}, leader is in epoch {self._leader_epoch}"))
        is_follower = replica_id != CONSUMER_REPLICA_ID
        if is_follower:
            if replica_id not in self._leader_state.followers:
                return self._fetch_error(NotLeaderOrFollowerError(f"broker {replica_id} is not a replica of this partition"))
            diverging = self._diverging_epoch(offset, last_fetched_epoch)
            if diverging is not None:
                log = self._log
                return FetchResult(b"", log.high_watermark, log.log_end_offset, log.log_start_offset, None, diverging,
                                   log.last_stable_offset)
            if offset > self._log.log_end_offset:  # not a position in this log: it must truncate first
                return self._fetch_error(
                    OffsetOutOfRangeError(f"broker {replica_id} fetches at {offset}, past the log end {self._log.log_end_offset}")
                )
            if self._trace is not None:
                self._trace.fetch_arrived(replica_id, offset)
            self._record_follower_position(replica_id, offset, replica_incarnation_id)
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            changed = self._change_event(appends=is_follower)  # a consumer reads up to the HW
            result = self._read(offset, max_bytes, is_follower, read_committed and not is_follower)
            remaining_s = deadline - time.monotonic()
            if result.error is not None or len(result.records) >= min_bytes or remaining_s <= 0:
                if self._trace is not None and is_follower:
                    for batch in iter_batches(result.records):
                        self._trace.fetch_answered(replica_id, batch.header.next_offset)
                return result
            await changed.wait(remaining_s)
            if self._role != "leader":
                return self._fetch_error(self._not_leader())

    # ------------------------------------------------------------------ leader: share groups (KIP-932)

    async def share_fetch(self, group_id: str, member_id: str, max_records: int = 500, max_wait_ms: int = 500,
                          acknowledgements: list[Acknowledgement] = ()) -> ShareFetchResult:  # fmt: skip
        """A share group member's fetch of this partition (see share_fetch.py), served over
        the data plane (frames.SHARE_FETCH): acknowledgements first, then up to
        `max_records` records acquired for it (0: the acknowledgements only, ShareAcknowledge)."""
        if self._role != "leader":
            error = self._not_leader()
            return ShareFetchResult(acknowledge_error=error if acknowledgements else None, error=error)
        result = await self._share_partitions().share_fetch(group_id, member_id, max_records, max_wait_ms,
                                                            list(acknowledgements))  # fmt: skip
        self._counters.fetch_requests += 1
        self._counters.bytes_out += len(result.records)
        self._counters.maybe_flush()
        return result

    async def share_forget_group(self, group_id: str) -> None:
        """The group's share-partition states were altered or deleted at its coordinator:
        the next fetch reads this one again."""
        if self._shares is not None:
            self._shares.forget(group_id)

    async def share_release_member(self, group_id: str, member_id: str) -> int:
        """A member left its share group: what it holds here goes to the others now."""
        return 0 if self._shares is None else await self._shares.release_member(group_id, member_id)

    def _share_partitions(self) -> SharePartitions:
        if self._shares is None:
            self._shares = SharePartitions(self._log, self.topic, self.partition, self._leader_epoch,
                                           self._share_states, self.config.share)  # fmt: skip
        return self._shares

    async def _write_share_state_frame(self, write: frames.ShareStateWrite) -> KafkaError | None:
        """A leader's share state write over the data plane: only a group coordinator's
        replica (OffsetsPartitionReplica) takes it."""
        return NotCoordinatorError(f"{self.topic}-{self.partition} is not a partition of the group coordinators' topic")

    async def data_endpoint(self, peer_node_id: str | None = None) -> EndpointAddress:
        """Where this replica serves fetches over the data plane, and the secret that
        admits a peer (rayk/dataplane); opened at the first call, with TCP once a peer on
        another node than this one (`peer_node_id`; None: unknown) asks. Only Ray hands it
        out, so only the cluster's own processes can connect."""
        if self._endpoint is None:
            self._endpoint = Endpoint(self._serve_data_plane, f"{self.topic}-{self.partition}")
        node_id, node_ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
        host = self.config.data_plane_host or node_ip
        return await self._endpoint.open(
            node_id, host, tcp=peer_node_id != node_id, node_ip=node_ip, keystore=self.config.data_plane_keystore
        )

    async def _serve_data_plane(self, kind: int, body: memoryview) -> tuple[bytes, bytes]:
        """A data plane request: (answer head, records)."""
        if kind == frames.PRODUCE:
            return frames.encode_produce_answer(await self.produce_requests(frames.decode_produce_request(body))), b""
        if kind == frames.WRITE_SHARE_STATE:
            return frames.encode_error_answer(await self._write_share_state_frame(frames.decode_share_state_write(body))), b""
        if kind == frames.SHARE_FETCH:
            share = frames.decode_share_fetch_request(body)
            answer = await self.share_fetch(share.group_id, share.member_id, share.max_records, share.max_wait_ms,
                                            list(share.acknowledgements))  # fmt: skip
            return frames.encode_share_fetch_answer_head(answer), answer.records
        assert kind == frames.FETCH, kind  # frames.parse_request lets no other kind through
        r = frames.decode_fetch_request(body)
        max_bytes = min(r.max_bytes, frames.MAX_RECORDS_BYTES)  # the answer fits one frame
        result = await self.fetch(
            r.offset, max_bytes, r.min_bytes, r.max_wait_ms, r.replica_id, r.leader_epoch, r.last_fetched_epoch,
            r.topic_id, r.incarnation_id, r.isolation_level,
        )
        return frames.encode_fetch_answer_head(result), result.records

    def _diverging_epoch(self, fetch_offset: int, last_fetched_epoch: int) -> tuple[int, int] | None:
        """(epoch, end offset) where this log's history leaves the follower's, if it does:
        this log has no `last_fetched_epoch`, or it ends before the follower's offset.
        A log with no epochs at all has nothing to compare: the offset check decides."""
        if last_fetched_epoch == UNDEFINED_EPOCH or self._log.latest_epoch == UNDEFINED_EPOCH:
            return None
        epoch, end_offset = self._log.end_offset_for_epoch(last_fetched_epoch)
        if epoch < last_fetched_epoch or end_offset < fetch_offset:
            return epoch, end_offset
        return None

    def _record_follower_position(self, replica_id: int, fetch_offset: int, incarnation_id: str = "") -> None:
        state = self._leader_state
        leo = self._log.log_end_offset
        assert fetch_offset <= leo, f"a follower's position {fetch_offset} is within the leader's log (LEO {leo})"
        state.record_follower_fetch(replica_id, fetch_offset, leo, _now_ms(), incarnation_id)
        proposal = state.isr_expansion(replica_id)
        if proposal is not None and time.monotonic() >= self._isr_change_retry_at:
            self._change_isr(proposal, f"broker {replica_id} caught up")
        if self._maybe_increment_high_watermark():
            self._notify_change()

    def _read(self, offset: int, max_bytes: int, is_follower: bool, read_committed: bool = False) -> FetchResult:
        log = self._log
        try:
            if is_follower:
                max_offset = None
            else:
                max_offset = log.last_stable_offset if read_committed else log.high_watermark
            result = log.read(offset, max_bytes, max_offset=max_offset)
            aborted: tuple[tuple[int, int], ...] = ()
            if read_committed and result.records:
                aborted = tuple(
                    (t.producer_id, t.first_offset) for t in log.aborted_transactions(offset, result.next_offset)
                )
        except KafkaError as e:
            return self._fetch_error(e)
        return FetchResult(result.records, result.high_watermark, result.log_end_offset, result.log_start_offset,
                           last_stable_offset=result.last_stable_offset, aborted_transactions=aborted)

    def _fetch_error(self, error: KafkaError) -> FetchResult:
        log = self._log
        return FetchResult(b"", log.high_watermark, log.log_end_offset, log.log_start_offset, error,
                           last_stable_offset=log.last_stable_offset)

    async def list_offset(self, timestamp_ms: int, isolation_level: int = frames.READ_UNCOMMITTED) -> tuple[int, int]:
        """Kafka's ListOffsets for a consumer: (offset, timestamp) of the first record with a
        timestamp >= `timestamp_ms` below the HW, or (-1, -1) if none; -2 (EARLIEST) gives
        the log start offset and -1 (LATEST) the HW, with timestamp -1. READ_COMMITTED reads
        the LSO where the others say the HW.
        OFFSET_NOT_AVAILABLE (retriable) while this leader's HW is below the start of its
        epoch: until its followers fetch from it, a new leader's HW may lag its
        predecessor's, and an end offset a client saw must not go back (KIP-207)."""
        if self._role != "leader":
            raise self._not_leader()
        log = self._log
        epoch_start_offset = self._leader_state.leader_epoch_start_offset
        if log.high_watermark < epoch_start_offset:
            raise OffsetNotAvailableError(
                f"the high watermark {log.high_watermark} of {self.topic}-{self.partition} lags the start "
                f"{epoch_start_offset} of leader epoch {self._leader_epoch}"
            )
        last_fetchable = log.last_stable_offset if isolation_level == frames.READ_COMMITTED else log.high_watermark
        if timestamp_ms == LATEST_TIMESTAMP:
            return last_fetchable, -1
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return log.log_start_offset, -1
        if timestamp_ms < 0:
            raise InvalidTimestampError(f"timestamp {timestamp_ms} is neither >= 0 nor -1 (latest) / -2 (earliest)")
        found = log.offset_for_timestamp(timestamp_ms)
        if found is None or found.offset >= last_fetchable:
            return -1, -1
        return found.offset, found.timestamp_ms

    async def delete_records(self, offset: int) -> int:
        """Kafka's DeleteRecords on the leader: the log start offset moves up to `offset`
        (-1: the high watermark) and the new log start (the low watermark) is returned.
        Consumers fetching below it get OFFSET_OUT_OF_RANGE, retention deletes the segments
        wholly below it, the broker's log-start-offset checkpoint keeps it, and followers
        take it from their next fetch's answer. OFFSET_OUT_OF_RANGE for an offset above the
        HW (or below -1), POLICY_VIOLATION unless cleanup.policy includes delete."""
        if self._role != "leader":
            raise self._not_leader()
        log = self._log
        if not log.config.deletes:
            raise PolicyViolationError(
                f"records of {self.topic}-{self.partition} cannot be deleted: cleanup.policy is {log.config.cleanup_policy}"
            )
        target = log.high_watermark if offset == DELETE_TO_HIGH_WATERMARK else offset
        if target < 0:
            raise OffsetOutOfRangeError(f"the offset {offset} for {self.topic}-{self.partition} is not valid")
        log.maybe_increment_log_start_offset(target)  # OFFSET_OUT_OF_RANGE above the HW
        return log.log_start_offset

    async def offsets_for_leader_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset): where the leader's log ends for `epoch` (OffsetsForLeaderEpoch)."""
        if self._role != "leader":
            raise self._not_leader()
        return self._log.end_offset_for_epoch(epoch)

    # ------------------------------------------------------------------ leader: ISR expiration

    def _schedule_isr_expiration(self) -> None:
        if self._isr_expiration is None and self._role == "leader":
            self._isr_expiration = asyncio.get_running_loop().call_later(
                self.config.replica_lag_time_max_ms / 2000, self._expire_isr
            )

    def _expire_isr(self) -> None:
        """The timer of Kafka's isr-expiration task, for as long as this replica leads."""
        self._isr_expiration = None
        try:
            self._maybe_shrink_isr()
        finally:
            self._schedule_isr_expiration()

    def _cancel_isr_expiration(self) -> None:
        if self._isr_expiration is not None:
            self._isr_expiration.cancel()
            self._isr_expiration = None

    def _maybe_shrink_isr(self) -> None:
        """Kafka's isr-expiration for this partition: proposes dropping followers that have
        not caught up within replica.lag.time.max.ms."""
        if self._role != "leader":
            return
        state = self._leader_state
        out = state.out_of_sync_replicas(self.config.replica_lag_time_max_ms, _now_ms())
        proposal = state.isr_shrink(out)
        if proposal is not None:
            self._change_isr(proposal, f"brokers {sorted(out)} fell behind")

    def _change_isr(self, proposal: set[int], reason: str) -> None:
        state = self._leader_state
        state.propose_isr(proposal)
        logger.info("%s-%d: proposing ISR %s (%s)", self.topic, self.partition, sorted(proposal), reason)
        if self._isr_manager is None:
            state.commit_isr(proposal)
            self._partition_epoch += 1
            self._after_isr_change()
            return
        # The processes whose fetches put the added followers in: the Controller refuses the
        # change if one of them is no longer its broker's registered process (KIP-903).
        added = state.incarnations_of(proposal - state.isr)
        task = asyncio.get_running_loop().create_task(
            self._alter_partition(proposal, self._leader_epoch, self._partition_epoch, added)
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _alter_partition(
        self, proposal: set[int], epoch: int, partition_epoch_sent: int, added_incarnations: dict[int, str]
    ) -> None:
        """Sends one ISR proposal, made in `partition_epoch_sent`, to the Controller (through
        the ReplicaManager) until its outcome is known, and settles it (see the module
        docstring). A proposal an assignment settled before it went out is not sent."""
        while True:
            state = self._leader_state
            if self._role != "leader" or self._leader_epoch != epoch or state.pending_isr != frozenset(proposal):
                return  # settled by a newer assignment from the Controller
            try:
                async with asyncio.timeout(ISR_CHANGE_TIMEOUT_MS / 1000):
                    isr, partition_epoch = await self._isr_manager.alter_partition.remote(
                        self.topic, self.partition, self.broker_id, epoch, partition_epoch_sent, sorted(proposal),
                        added_incarnations,
                    )
                error = None
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a typed KafkaError from the Controller, or no answer
                error = e
            state = self._leader_state
            if self._role != "leader" or self._leader_epoch != epoch or state.pending_isr != frozenset(proposal):
                return  # settled by a newer assignment from the Controller
            if error is None:
                if partition_epoch >= self._partition_epoch and self.broker_id in isr:
                    self._partition_epoch = partition_epoch
                    state.commit_isr(isr)
                    self._after_isr_change()
                # else: a reassignment that moved the leadership away completed with it;
                # the Controller's assignment, on its way, says what this replica is now.
                return
            if isinstance(error, _ISR_CHANGE_REFUSED):
                logger.warning("%s-%d: ISR change %s refused: %s", self.topic, self.partition, sorted(proposal), error)
                state.abort_isr_change()
                self._isr_change_retry_at = time.monotonic() + ISR_CHANGE_RETRY_BACKOFF_MS / 1000
                self._after_isr_change()
                return
            if isinstance(error, StaleBrokerEpochError):
                logger.info("%s-%d: ISR change %s waits for its broker to register again: %s",
                            self.topic, self.partition, sorted(proposal), error)
                await asyncio.sleep(ISR_CHANGE_RETRY_BACKOFF_MS / 1000)
                continue
            if isinstance(error, KafkaError):
                # This replica's epochs are stale: the Controller has moved on, and its next
                # assignment (already on its way) settles the pending change either way.
                logger.info("%s-%d: ISR change %s waits for the Controller's assignment: %s",
                            self.topic, self.partition, sorted(proposal), error)
                return
            logger.warning("%s-%d: ISR change %s has no answer yet (%s); sending it again",
                           self.topic, self.partition, sorted(proposal), error)
            await asyncio.sleep(ISR_CHANGE_RETRY_BACKOFF_MS / 1000)

    def _after_isr_change(self) -> None:
        self._maybe_increment_high_watermark()  # a smaller ISR, or one back at min.insync.replicas, may let the HW move
        self._notify_change()  # and parked acks=-1 produces re-check min.insync.replicas

    # ------------------------------------------------------------------ inspection, lifecycle


    async def describe(self) -> dict[str, Any]:
        log = self._log
        return {
            "topic": self.topic,
            "partition": self.partition,
            "broker_id": self.broker_id,
            "role": self._role,
            "leader_id": self._leader_id,
            "leader_epoch": self._leader_epoch,
            "partition_epoch": self._partition_epoch,
            "isr": sorted(self._leader_state.isr) if self._leader_state else None,
            "pending_isr": sorted(self._leader_state.pending_isr)
            if self._leader_state and self._leader_state.pending_isr is not None
            else None,
            "high_watermark": log.high_watermark,
            "log_end_offset": log.log_end_offset,
            "log_start_offset": log.log_start_offset,
            "recovery_point": log.recovery_point,
            "latest_epoch": log.latest_epoch,
            "data_plane_connections": self._endpoint.connection_count if self._endpoint else 0,
        }

    async def update_config(self, log_config: LogConfig, replica_config: ReplicaConfig) -> None:
        """The topic's configs changed (min.insync.replicas, retention, ...)."""
        self._log.update_config(log_config)
        self.config = replica_config
        self._after_isr_change()  # a lower min.insync.replicas may let the HW move; parked produces re-check it

    async def read_local(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """This replica's own batches from `offset`, whatever its role (for tools and tests,
        like Kafka's debugging consumer): a follower's copy can be compared with the leader's."""
        return self._log.read(offset, max_bytes, max_offset=max_offset).records

    async def log_size(self) -> tuple[int, int, int]:
        """(log start offset, log end offset, bytes on disk) of this replica's log: what a
        read planner needs to size its tasks (Kafka's DescribeLogDirs gives the size)."""
        log = self._log
        return log.log_start_offset, log.log_end_offset, log.size_bytes

    async def loaded_modules(self) -> list[str]:
        """The modules this replica's process has imported: every replica is a process of
        its own, so whatever it imports beyond Ray's worker and its log costs memory once
        per partition (for tests and diagnosis)."""
        return sorted(name for name, module in sys.modules.items() if module is not None)

    def _start_publishing(self) -> None:
        if self._board is not None and self._publishing is None:
            self._publish()

    def _publish(self) -> None:
        """Publishes now, and again every `publish_interval_ms`, which also tells the broker
        that this replica runs."""
        board = self._board
        if board is None:
            return  # closed meanwhile
        try:
            self._publish_offsets()
        except Exception:  # the next turn tries again: a timer that stopped would freeze the checkpoints
            logger.exception("%s-%d: publishing on the broker's board failed", self.topic, self.partition)
        finally:
            self._publishing = asyncio.get_running_loop().call_later(board.slot.publish_interval_ms / 1000, self._publish)

    def _publish_offsets(self) -> None:
        """The log's offsets and size on the broker's board, and the counts not yet added to
        Ray's counters (an idle partition's last ones would wait else)."""
        assert self._board is not None
        self._counters.flush()
        self._published = _offsets_of(self._log)
        self._board.publish(self._published, self._log.size_bytes)

    def _after_follower_progress(self) -> None:
        """The follower appended, moved its HW, or truncated. A truncation lowers offsets it
        published: those go out at once, so that the broker never checkpoints a recovery
        point or HW above what the log now holds for longer than before (a cleaner offset
        is below the HW, so it is lowered with it). Two comparisons per append."""
        self._notify_change()
        published, log = self._published, self._log
        if published is not None and self._board is not None and (
            log.high_watermark < published.high_watermark or log.recovery_point < published.recovery_point
        ):
            self._publish_offsets()

    def _stop_publishing(self) -> None:
        """Before the log closes (for good: no role starts it again); the last offsets go to
        the broker with close's answer."""
        if self._publishing is not None:
            self._publishing.cancel()
            self._publishing = None
        if self._board is not None:
            self._board.close()
            self._board = None

    async def enforce_retention(self) -> int:
        """Deletes whole segments past retention.ms / retention.bytes; returns how many."""
        return self._log.delete_expired_segments()

    async def cleanable_state(self) -> CleanableState | None:
        """How dirty this log is, for the broker's cleaner to choose the filthiest (None:
        the topic is not compacted)."""
        if not self._log.config.compacts:
            return None
        return await asyncio.to_thread(log_cleaner.cleanable_state, self._log, _now_ms())

    async def clean_log(self, max_bytes_per_second: float, dedupe_buffer_bytes: int) -> CleanResult | None:
        """Compacts this log (see log_cleaner.py) in a thread, while appends and fetches go
        on; the broker's cleaner calls one replica at a time, which makes the byte rate a
        broker's (log.cleaner.io.max.bytes.per.second)."""
        if not self._log.config.compacts or self._cleaning is not None:
            return None
        throttler = log_cleaner.Throttler(max_bytes_per_second)
        self._cleaning = asyncio.ensure_future(
            asyncio.to_thread(
                log_cleaner.clean, self._log, _now_ms(), dedupe_buffer_bytes=dedupe_buffer_bytes, throttler=throttler
            )
        )
        try:
            return await asyncio.shield(self._cleaning)
        finally:
            if self._cleaning is not None and self._cleaning.done():
                self._cleaning = None

    async def _close_endpoint(self) -> None:
        self._share_states.close()
        if self._endpoint is not None:
            await self._endpoint.close()
            self._endpoint = None

    async def _stop_cleaning(self) -> None:
        """Before the log closes: a clean in its thread stops at its next read, and the
        log's files are not touched by it once this returns."""
        cleaning, self._cleaning = self._cleaning, None
        if cleaning is not None:
            self._log.abort_cleaning()
            await asyncio.gather(cleaning, return_exceptions=True)

    async def close(self) -> PartitionOffsets:
        """Stops following, flushes and closes the log (data stays on disk); returns the
        final offsets for the broker's checkpoints."""
        await self._stop_fetcher()
        await self._close_endpoint()
        self._role = None
        self._cancel_isr_expiration()
        self._notify_change()
        self._stop_publishing()
        self._counters.flush()
        await self._stop_cleaning()
        self._log.close()
        self._stop_supervision()
        return _offsets_of(self._log)

    async def delete(self) -> None:
        """The partition was deleted or moved away: stop and remove its directory."""
        await self._stop_fetcher()
        await self._close_endpoint()
        self._role = None
        self._cancel_isr_expiration()
        self._notify_change()
        self._stop_publishing()
        self._counters.flush()
        await self._stop_cleaning()
        self._log.delete()
        self._stop_supervision()


def _offsets_of(log: Log) -> PartitionOffsets:
    """What the broker's checkpoints record for `log`; a cleaner offset only if it compacts, as Kafka."""
    cleaner_offset = log.cleaner_offset if log.config.compacts else None
    return PartitionOffsets(log.recovery_point, log.log_start_offset, log.high_watermark, cleaner_offset)
