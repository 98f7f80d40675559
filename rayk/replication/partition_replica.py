"""PartitionReplica: one replica of one partition, as an async Ray actor (num_cpus=0).

It owns the partition's `Log` on its node's disk and is either the leader or a follower
for a given leader epoch; whoever manages the broker tells it which (`become_leader`,
`become_follower`). Its public methods are its remote API (other actors call them with
`.remote`); each hands the work to one of the parts the actor is composed of, every part
in a module of its own and owning its own state:

- leader_isr.py      LeaderIsr: the ISR, the HW, isr-expiration and AlterPartition
- leader_produce.py  LeaderProduce: produce requests, transaction verification and markers,
                     acknowledgements (acks=all waits for the HW in the epoch it appended in)
- leader_fetch.py    LeaderFetch: consumers' and followers' fetches (long poll, followers'
                     positions, diverging epochs), ListOffsets, DeleteRecords,
                     OffsetsForLeaderEpoch
- replica_follower.py  ReplicaFollower: the follower's fetcher task (replica_fetcher.py)
- log_lifecycle.py   LogLifecycle: offsets on the broker's board, retention, cleaning,
                     close and delete
What they share (the log, the settings, the role in the leader epoch, the events waiters
wait on, the counters) is the ReplicaContext (replica_context.py); only this actor changes
the role and the epoch. The actor itself keeps the data plane's endpoint and the
share-partitions (share/).

On becoming leader it records the new epoch as starting at its LEO, so followers asking
where an older epoch ends learn that it ends here.

Supervision (see supervision.py): the owning ReplicaManager holds `run_until_stopped`
open and `ping`s the replica when it has neither answered nor published for a while;
`close` and `delete` end the held call normally.

Metrics: as leader it counts Kafka's BrokerTopicMetrics of its produce and fetch calls in
plain ints (rayk/metrics.py), added to Ray's counters at most once a second and at each
publication on the board.

Errors are returned in the result (`error`), as Kafka returns per-partition error codes.
Subclasses (rayk/coordinator) host a coordinator on an internal topic's leader; they
extend the role changes and the produce path, and reach the parts through `_ctx`,
`_produce` and `_log`.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import ray

from rayk.actors import raylet_watch
from rayk.actors.direct_calls import call_methods_directly
from rayk.actors.supervision import Supervised
from rayk import native_paths
from rayk.dataplane import frames
from rayk.dataplane.endpoint import SENDFILE_MIN_BYTES, Endpoint, EndpointAddress
from rayk.dataplane.frames import FetchResult, ProduceRequest, ProduceResult
from rayk.dataplane.native_endpoint import Reply
from rayk.errors import FencedLeaderEpochError, KafkaError, NotCoordinatorError
from rayk.replication import replica_process, storage_failure
from rayk.replication.leader_fetch import CONSUMER_REPLICA_ID, LeaderFetch
from rayk.replication.leader_isr import LeaderIsr
from rayk.replication.leader_produce import LeaderProduce
from rayk.replication.log_lifecycle import LogLifecycle
from rayk.replication.produce_trace import ProduceTrace
from rayk.replication.remote_log_manager import RemoteLogManager
from rayk.replication.replica_board import BoardSlot
from rayk.replication.replica_context import ReplicaConfig, ReplicaContext, Role
from rayk.replication.replica_follower import NO_LEADER, ReplicaFollower
from rayk.replication.replication_throttle import UNTHROTTLED, ThrottleSetting
from rayk.replication.share.share_fetch import Acknowledgement, ShareFetchResult, SharePartitions
from rayk.replication.share.share_state_client import ShareStateClient
from rayk.storage import Log, LogConfig, partition_metadata
from rayk.storage.file_slice import FileSlice
from rayk.storage.leader_epoch_cache import UNDEFINED_EPOCH
from rayk.storage.log_cleaner import CleanableState, CleanResult
from rayk.storage.log_dir_checkpoints import PartitionOffsets

replica_process.keep_libraries_out()  # first thing in a replica's own process (see replica_process.py)

# What callers import from here, wherever it lives now.
__all__ = ["CONSUMER_REPLICA_ID", "NO_LEADER", "FetchResult", "PartitionReplica", "ProduceResult", "ReplicaConfig"]

LOG_LOCK_WAIT_MS = 30_000  # a replica re-created after a crash waits this long for the old process to go


class PartitionReplica(Supervised):
    """One partition replica as a Ray actor: its remote API over the parts it is composed of
    (see the module docstring)."""

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
        log; `isr_manager` is an actor with `alter_partition` (the ReplicaManager);
        `controller` the Controller, through which a leader finds the transaction
        coordinators that verify transactional writes (txn_verification.py): each a
        NamedActor (rayk/actors/named_actor.py) or a handle; `board_slot`
        where this replica publishes its offsets to its broker (replica_board.py)."""
        raylet_watch.start()  # this process goes with its node's raylet (raylet_watch.py)
        call_methods_directly(self)
        self.topic, self.partition, self.broker_id = topic, partition, broker_id
        topic_id = partition_metadata.read(log_dir)  # None for a log without partition.metadata
        offsets = offsets or PartitionOffsets()
        self._log = Log(
            log_dir,
            log_config,
            recovery_point=offsets.recovery_point,
            log_start_offset=offsets.log_start_offset,
            high_watermark=offsets.high_watermark,
            cleaner_offset=offsets.cleaner_offset,
            lock_wait_ms=LOG_LOCK_WAIT_MS,
            on_storage_error=lambda error: storage_failure.end_process(f"{topic}-{partition}", error),
        )
        self._ctx = ctx = ReplicaContext(topic, partition, broker_id, topic_id, self._log,
                                         replica_config or ReplicaConfig())  # fmt: skip
        self._controller = controller
        self._isr = LeaderIsr(ctx, isr_manager)
        self._produce = LeaderProduce(ctx, self._isr, controller)
        self._remote = RemoteLogManager(ctx)
        self._fetches = LeaderFetch(ctx, self._isr, self._remote)
        self._lifecycle = LogLifecycle(ctx, board_slot)
        self._follower = ReplicaFollower(ctx, self._lifecycle.after_follower_progress, self._remote)
        self._endpoint: Endpoint | None = None  # the data plane's, opened at the first data_endpoint call
        self._parked_fetch = self._parked_produce = False  # served without a task (native_paths.py)
        self._shares: SharePartitions | None = None  # while leading, once a share group fetched here
        self._share_states = ShareStateClient(controller)  # the share groups' coordinators (no I/O until used)

    # ------------------------------------------------------------------ role changes

    async def become_leader(
        self, leader_epoch: int, replicas: list[int], isr: list[int], partition_epoch: int = 0,
        throttle: ThrottleSetting = UNTHROTTLED,
    ) -> None:
        """Leads for `leader_epoch`. The same epoch again with a newer `partition_epoch` only
        updates the replicas and the ISR (the Controller changed them: it fenced a
        follower's broker, or a reassignment added or removed replicas). `throttle`: the
        followers a reassignment adds and this replica's share of its broker's
        leader.replication.throttled.rate for them (replication_throttle.py)."""
        ctx = self._ctx
        if leader_epoch < ctx.leader_epoch:
            raise FencedLeaderEpochError(f"become_leader for epoch {leader_epoch} after epoch {ctx.leader_epoch}")
        await self.throttle_replication(throttle)
        if ctx.leads_in(leader_epoch):
            self._isr.update(replicas, isr, partition_epoch)
            return
        await self._follower.stop()
        self._log.assign_leader_epoch(leader_epoch)
        ctx.lead(leader_epoch)
        self._isr.lead(replicas, isr, partition_epoch)
        ctx.events.notify_change()
        self._lifecycle.start_publishing()
        self._remote.start()

    async def become_follower(self, leader_epoch: int, leader_id: int, leader: Any, incarnation_id: str = "",
                              throttle: ThrottleSetting = UNTHROTTLED) -> None:
        """Follows `leader` (an actor handle of the leader's PartitionReplica), or waits for
        one when `leader_id` is NO_LEADER (-1) and `leader` None. `incarnation_id` names
        this broker's process, which every fetch carries (KIP-903); `throttle` its share of
        its broker's follower.replication.throttled.rate while a reassignment adds it."""
        ctx = self._ctx
        if leader_epoch < ctx.leader_epoch:
            raise FencedLeaderEpochError(f"become_follower for epoch {leader_epoch} after epoch {ctx.leader_epoch}")
        await self.throttle_replication(throttle)
        if (ctx.role, ctx.leader_epoch, ctx.leader_id) == (Role.FOLLOWER, leader_epoch, leader_id) and self._follower.fetching:
            return  # already following this leader in this epoch
        await self._follower.stop()
        await self._remote.stop()
        ctx.follow(leader_epoch, leader_id)
        self._isr.stop()
        ctx.events.notify_change()  # parked produces learn they are no longer on the leader
        self._lifecycle.start_publishing()
        self._follower.start(leader_epoch, leader_id, leader, incarnation_id)
        self._remote.start()

    async def throttle_replication(self, setting: ThrottleSetting) -> None:
        """This replica's share of its broker's replication throttles changed (a reassignment
        it takes part in, or another of its broker's, started or completed)."""
        self._fetches.set_throttle(setting.leader_rate_bytes_per_s, setting.adding)
        self._follower.set_throttle(setting.follower_rate_bytes_per_s)

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
        handling it, is that request's error alone (see leader_produce.py)."""
        return self._counted(await self._produce.produce_requests(requests))

    def _counted(self, results: list[ProduceResult]) -> list[ProduceResult]:
        counters = self._ctx.counters
        counters.produce_requests += len(results)
        counters.failed_produce_requests += sum(1 for r in results if r.error is not None)
        counters.maybe_flush()
        return results

    async def write_txn_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timeout_ms: int
    ) -> ProduceResult:
        """The partition leader's side of WriteTxnMarkers: appends a transaction
        coordinator's COMMIT or ABORT marker for the producer (Log.append_txn_marker: its
        epoch checks, TRANSACTION_COORDINATOR_FENCED, INVALID_PRODUCER_EPOCH) and answers
        once the in-sync replicas have it, as an acks=all produce."""
        return await self._produce.write_txn_marker(producer_id, producer_epoch, commit, coordinator_epoch, timeout_ms)

    async def producer_sequence(self, producer_id: int, timeout_ms: int) -> tuple[int, int]:
        """(epoch, next sequence) of an idempotent producer here, once its last batch is
        committed (below the HW), so that the answer cannot be undone by truncation;
        (-1, 0) if the partition knows no batch of it. Kafka's DescribeProducers, which a
        writer resuming that producer's sequences needs (rayk.client.resumable_write).
        Raises NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT if the batch is not committed
        within `timeout_ms`, or NOT_ENOUGH_REPLICAS_AFTER_APPEND if it is below the HW while
        the ISR is smaller than min.insync.replicas (not committed for a resume point)."""
        return await self._produce.producer_sequence(producer_id, timeout_ms)

    async def describe_producers(self) -> list[dict]:
        """Kafka's DescribeProducers for this partition: each producer the leader remembers,
        with its epoch, last sequence and timestamp, the coordinator epoch of its last
        marker and its open transaction's first offset (-1: none)."""
        return self._produce.describe_producers()

    def trace_produce(self, enable: bool) -> list[dict]:
        """Starts noting the stages of each appended batch's acks=all path (ProduceTrace),
        or stops and returns what was noted. For benchmarks/ack_path_bench.py."""
        ctx = self._ctx
        batches = ctx.trace.batches() if ctx.trace is not None else []
        ctx.trace = ProduceTrace() if enable else None
        return batches

    # ------------------------------------------------------------------ leader: fetch and offsets

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
        """Serves consumers up to the HW and followers (`replica_id`) up to the LEO; fewer
        than `min_bytes` wait up to `max_wait_ms` (see leader_fetch.py). A follower's
        `offset` is its LEO, which the leader records, and `last_fetched_epoch` the epoch
        of its last batch: a log that went another way after it is answered with the
        diverging epoch. `topic_id` (a Fetch v13+ names topics by id): INCONSISTENT_TOPIC_ID
        unless it is this log's, so a fetch for a deleted topic never reads one created
        again under its name. `replica_incarnation_id`: a follower's broker process
        (KIP-903, see LeaderReplicaState). A consumer's READ_COMMITTED fetch reads below the
        LSO, not the HW, and is answered the aborted transactions that overlap what it read."""
        return await self._fetch(offset, max_bytes, min_bytes, max_wait_ms, replica_id, leader_epoch,
                                 last_fetched_epoch, topic_id, replica_incarnation_id, isolation_level)  # fmt: skip

    async def _fetch(
        self, offset: int, max_bytes: int, min_bytes: int, max_wait_ms: int, replica_id: int, leader_epoch: int,
        last_fetched_epoch: int, topic_id: str | None, replica_incarnation_id: str, isolation_level: int,
        slice_min_bytes: int | None = None,
    ) -> FetchResult:
        """`fetch`; with `slice_min_bytes`, records of at least that many bytes come as a
        FileSlice of the log (a data plane answer sends them by sendfile), never through Ray."""
        if replica_id == CONSUMER_REPLICA_ID and offset < self._log.log_start_offset:
            try:
                await self._remote.ensure_listed()  # a new leader of a tiered log: what is remote
            except KafkaError as e:
                return self._fetches.fetch_error(e)
        result = await self._fetches.fetch(offset, max_bytes, min_bytes, max_wait_ms, replica_id, leader_epoch,
                                           last_fetched_epoch, topic_id, replica_incarnation_id,
                                           isolation_level == frames.READ_COMMITTED, slice_min_bytes)  # fmt: skip
        counters = self._ctx.counters
        counters.fetch_requests += 1
        if result.error is not None:
            counters.failed_fetch_requests += 1
        elif replica_id == CONSUMER_REPLICA_ID:  # Kafka's BytesOut leaves replication out
            counters.bytes_out += len(result.records)
        counters.maybe_flush()
        return result

    async def list_offset(self, timestamp_ms: int, isolation_level: int = frames.READ_UNCOMMITTED) -> tuple[int, int]:
        """Kafka's ListOffsets for a consumer: (offset, timestamp) of the first record with a
        timestamp >= `timestamp_ms` below the HW, or (-1, -1) if none; -2 (EARLIEST) gives
        the log start offset and -1 (LATEST) the HW, with timestamp -1. READ_COMMITTED reads
        the LSO where the others say the HW.
        OFFSET_NOT_AVAILABLE (retriable) while this leader's HW is below the start of its
        epoch: until its followers fetch from it, a new leader's HW may lag its
        predecessor's, and an end offset a client saw must not go back (KIP-207).
        A tiered log (remote_log_manager.py) answers the whole log's start for EARLIEST,
        the local one for EARLIEST_LOCAL (-4), and its last offset in remote storage for
        LATEST_TIERED (-5)."""
        if self._ctx.role is Role.LEADER and self._remote.enabled:
            await self._remote.ensure_listed()  # a new leader of a tiered log: what is remote
            if timestamp_ms >= 0:
                answer = self._fetches.list_offset(timestamp_ms, isolation_level)  # its checks, and the local answer
                found = await self._remote.offset_for_timestamp(timestamp_ms)
                return answer if found is None else (found[1], found[0])
        return self._fetches.list_offset(timestamp_ms, isolation_level)

    async def delete_records(self, offset: int) -> int:
        """Kafka's DeleteRecords on the leader: the log start offset moves up to `offset`
        (-1: the high watermark) and the new log start (the low watermark) is returned.
        Consumers fetching below it get OFFSET_OUT_OF_RANGE, retention deletes the segments
        wholly below it, the broker's log-start-offset checkpoint keeps it, and followers
        take it from their next fetch's answer. OFFSET_OUT_OF_RANGE for an offset above the
        HW (or below -1), POLICY_VIOLATION unless cleanup.policy includes delete. On a
        tiered log the store records it too, so what is remote below it is not read again
        (remote_log_manager.py), and the whole log's new start is returned."""
        if not (self._remote.enabled and self._ctx.role is Role.LEADER):
            return self._fetches.delete_records(offset)
        target = self._fetches.delete_records_target(offset)  # its checks, and -1 as the HW
        await self._remote.delete_records(target)
        self._fetches.delete_records(max(target, self._log.log_start_offset))
        return self._remote.log_start_offset()

    async def offsets_for_leader_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset): where the leader's log ends for `epoch` (OffsetsForLeaderEpoch)."""
        return self._fetches.offsets_for_leader_epoch(epoch)

    # ------------------------------------------------------------------ leader: share groups (KIP-932)

    async def share_fetch(self, group_id: str, member_id: str, max_records: int = 500, max_wait_ms: int = 500,
                          acknowledgements: list[Acknowledgement] = ()) -> ShareFetchResult:  # fmt: skip
        """A share group member's fetch of this partition (see share_fetch.py), served over
        the data plane (frames.SHARE_FETCH): acknowledgements first, then up to
        `max_records` records acquired for it (0: the acknowledgements only, ShareAcknowledge)."""
        ctx = self._ctx
        if ctx.role is not Role.LEADER:
            error = ctx.not_leader()
            return ShareFetchResult(acknowledge_error=error if acknowledgements else None, error=error)
        result = await self._share_partitions().share_fetch(group_id, member_id, max_records, max_wait_ms,
                                                            list(acknowledgements))  # fmt: skip
        ctx.counters.fetch_requests += 1
        ctx.counters.bytes_out += len(result.records)
        ctx.counters.maybe_flush()
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
            ctx = self._ctx
            self._shares = SharePartitions(self._log, self.topic, self.partition, ctx.leader_epoch,
                                           self._share_states, ctx.config.share)  # fmt: skip
            ctx.events.on_change = self._shares_after_change
        return self._shares

    def _shares_after_change(self) -> None:
        """At every change (replica_events.py): the share-partitions go with the leader
        epoch they were loaded in, and wake while it leads."""
        shares, ctx = self._shares, self._ctx
        assert shares is not None, "called only while there are share-partitions"
        if not ctx.leads_in(shares.leader_epoch):
            shares.close()
            self._shares = None
            ctx.events.on_change = None
        else:
            shares.wake()

    async def _write_share_state_frame(self, write: frames.ShareStateWrite) -> KafkaError | None:
        """A leader's share state write over the data plane: only a group coordinator's
        replica (OffsetsPartitionReplica) takes it."""
        return NotCoordinatorError(f"{self.topic}-{self.partition} is not a partition of the group coordinators' topic")

    # ------------------------------------------------------------------ the data plane

    async def data_endpoint(self, peer_node_id: str | None = None) -> EndpointAddress:
        """Where this replica serves fetches over the data plane, and the secret that
        admits a peer (rayk/dataplane); opened at the first call, with TCP once a peer on
        another node than this one (`peer_node_id`; None: unknown) asks. Only Ray hands it
        out, so only the cluster's own processes can connect."""
        if self._endpoint is None:
            self._parked_fetch = native_paths.enabled("parked_fetch")
            # Never past a subclass's own produce_requests (CoordinatorReplica refuses clients'
            # writes). By name: Ray's worker may hold another copy of this class than the actor's.
            self._parked_produce = (native_paths.enabled("parked_produce")
                                    and type(self).produce_requests.__qualname__ == "PartitionReplica.produce_requests")
            self._endpoint = Endpoint(self._serve_data_plane, f"{self.topic}-{self.partition}",
                                      serve_now=self._serve_data_plane_now)
        config = self._ctx.config
        node_id, node_ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
        host = config.data_plane_host or node_ip
        return await self._endpoint.open(
            node_id, host, tcp=peer_node_id != node_id, node_ip=node_ip, keystore=config.data_plane_keystore
        )

    async def _serve_data_plane(self, kind: int, body: memoryview) -> tuple[bytes, bytes | FileSlice]:
        """A data plane request: (answer head, records); a fetch's records of at least
        SENDFILE_MIN_BYTES come as a slice of the log file, which the endpoint sends by
        sendfile (or reads, on a TLS connection)."""
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
        result = await self._fetch(
            r.offset, max_bytes, r.min_bytes, r.max_wait_ms, r.replica_id, r.leader_epoch, r.last_fetched_epoch,
            r.topic_id, r.incarnation_id, r.isolation_level, slice_min_bytes=SENDFILE_MIN_BYTES,
        )
        return frames.encode_fetch_answer_head(result), result.records

    def _serve_data_plane_now(self, kind: int, body: memoryview, reply: Reply) -> bool:
        """A data plane request served without a task, where it can be (the native endpoint
        asks first), its answer given to `reply`: a fetch, answered now or parked
        (LeaderFetch.fetch_or_park), or a produce call, appended now and answered now or
        once replicated (LeaderProduce.produce_or_park), each where its native path is on
        (rayk/native_paths.py). False for anything else: `_serve_data_plane` serves it."""
        if self._ctx.role is not Role.LEADER:
            return False
        if kind == frames.PRODUCE:
            if not self._parked_produce:
                return False

            def answer_call(results: list[ProduceResult]) -> None:  # counted once answered: an answer
                reply(frames.encode_produce_answer(results), b"")  # that raised is answered again failed
                self._counted(results)

            return self._produce.produce_or_park(frames.decode_produce_request(body), answer_call)
        if kind != frames.FETCH or not self._parked_fetch:
            return False
        r = frames.decode_fetch_request(body)
        counters = self._ctx.counters
        is_consumer = r.replica_id == CONSUMER_REPLICA_ID

        def answer(result: FetchResult) -> None:  # counted as `_fetch` counts, once answered (as above)
            reply(frames.encode_fetch_answer_head(result), result.records)
            counters.fetch_requests += 1
            if result.error is not None:
                counters.failed_fetch_requests += 1
            elif is_consumer:  # Kafka's BytesOut leaves replication out
                counters.bytes_out += len(result.records)
            counters.maybe_flush()

        return self._fetches.fetch_or_park(r, min(r.max_bytes, frames.MAX_RECORDS_BYTES), answer, SENDFILE_MIN_BYTES,
                                           reply)

    async def _close_endpoint(self) -> None:
        self._share_states.close()
        self._fetches.drop_parked()  # their connections close with the endpoint
        self._produce.drop_parked()
        if self._endpoint is not None:
            await self._endpoint.close()
            self._endpoint = None

    # ------------------------------------------------------------------ inspection

    async def describe(self) -> dict[str, Any]:
        ctx, log, state = self._ctx, self._log, self._isr.state
        return {
            "topic": self.topic,
            "partition": self.partition,
            "broker_id": self.broker_id,
            "role": None if ctx.role is None else ctx.role.value,
            "leader_id": ctx.leader_id,
            "leader_epoch": ctx.leader_epoch,
            "partition_epoch": self._isr.partition_epoch,
            "isr": sorted(state.isr) if state else None,
            "pending_isr": sorted(state.pending_isr) if state and state.pending_isr is not None else None,
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
        self._ctx.config = replica_config
        self._isr.after_change()  # a lower min.insync.replicas may let the HW move; parked produces re-check it

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

    # ------------------------------------------------------------------ the log's lifecycle

    async def enforce_retention(self) -> int:
        """Deletes whole segments past retention.ms / retention.bytes; returns how many. A
        tiered log's leader applies its retention in its remote log task instead
        (remote_log_manager.py), after copying; a follower's keeps what is above the
        leader's local log start."""
        if self._remote.enabled and self._ctx.role is Role.LEADER:
            return 0
        return self._lifecycle.enforce_retention()

    async def copy_to_remote(self) -> int:
        """Runs the tiered storage task's pass now (copy, remote and local retention), as
        its timer would; returns how many segments it copied (for tools and tests)."""
        return await self._remote.run_once()

    async def aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[tuple[int, int, int]]:
        """(producer id, first offset, last offset) of the aborted transactions overlapping
        [start_offset, upper_bound_offset), from the remote transaction indexes and the local
        ones: what a read_committed reader of remote segments leaves out (rayk.data)."""
        if self._ctx.role is not Role.LEADER:
            raise self._ctx.not_leader()
        await self._remote.refresh()
        return await self._remote.aborted_transaction_spans(start_offset, upper_bound_offset)

    async def remote_segments(self) -> list[dict[str, Any]]:
        """The remote segments this replica knows of (its last listing), oldest first."""
        await self._remote.refresh()
        return [dataclasses.asdict(s) for s in self._remote.segments]

    async def cleanable_state(self) -> CleanableState | None:
        """How dirty this log is, for the broker's cleaner to choose the filthiest (None:
        the topic is not compacted)."""
        return await self._lifecycle.cleanable_state()

    async def clean_log(self, max_bytes_per_second: float, dedupe_buffer_bytes: int) -> CleanResult | None:
        """Compacts this log (see log_cleaner.py) in a thread, while appends and fetches go
        on; the broker's cleaner calls one replica at a time, which makes the byte rate a
        broker's (log.cleaner.io.max.bytes.per.second)."""
        return await self._lifecycle.clean_log(max_bytes_per_second, dedupe_buffer_bytes)

    async def close(self) -> PartitionOffsets:
        """Stops following, flushes and closes the log (data stays on disk); returns the
        final offsets for the broker's checkpoints."""
        await self._stop()
        offsets = await self._lifecycle.close()
        self._stop_supervision()
        return offsets

    async def delete(self) -> None:
        """The partition was deleted or moved away: stop and remove its directory."""
        await self._stop()
        await self._lifecycle.delete()
        self._stop_supervision()

    async def _stop(self) -> None:
        """Before the log closes: neither leads nor follows again; waiters learn it."""
        await self._follower.stop()
        await self._remote.stop()
        await self._close_endpoint()
        self._ctx.stop()
        self._isr.stop()
        self._ctx.events.notify_change()
