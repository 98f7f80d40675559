"""RemoteLogManager: one replica's part in tiered storage (Kafka's RemoteLogManager and its
RLMTask, per partition; the objects themselves are rayk/storage/remote/).

While this replica leads a topic with remote.storage.enable on a broker with remote log
storage, a task runs every `remote.log.manager.task.interval.ms` (on a follower it only
deletes the local segments below the log start, which follows the leader's local start):
1. it lists what the store holds for the partition (a new leader learns what its
   predecessors copied: the listing is the metadata, see remote_segment.py);
2. remote retention: the oldest remote segments past retention.ms, or beyond
   retention.bytes counted over the whole log (remote plus local), are deleted;
3. it copies, oldest first, each rolled segment whose records are all below the high
   watermark and the last stable offset and that ends past what the store holds, with
   its indexes, producer snapshot and leader epochs. A copy commits only if this replica
   still leads in the epoch it started in (a deposed leader's half copy is never listed);
4. only then local retention: segments wholly copied go once past local.retention.ms /
   local.retention.bytes (Log.delete_expired_segments).
The store failing (unreachable, slow) fails the pass, logged: copying falls behind and
catches up at a later pass, local segments stay until copied, produce and local fetches
never wait on it (every store call runs in a worker thread).

Reads: a consumer's fetch below the local log start is answered from the remote segment
that holds it (KAFKA_STORAGE_ERROR, retriable, if the store cannot be read), and the log
start a consumer sees is the remote one (`log_start_offset`). Followers keep fetching
the local log: one below the leader's local start is told OFFSET_MOVED_TO_TIERED_STORAGE
and starts its log there from the remote copy's producer snapshot and leader epochs
(`remote_start_state`).

Not thread-safe: the replica actor's event loop (the store calls' threads touch only the
store and the files a `SegmentToCopy` names).
"""

from __future__ import annotations

import asyncio
import logging
import time

from rayk.errors import KafkaError, OffsetOutOfRangeError
from rayk.replication import replica_process
from rayk.replication.replica_context import ReplicaContext, Role
from rayk.storage.log import SegmentToCopy
from rayk.storage.remote import RemoteLogStorage, RemoteSegmentMetadata, RemoteStorageSettings
from rayk.storage.remote.remote_read import offset_for_timestamp as remote_offset_for_timestamp
from rayk.storage.remote.remote_read import read_batches
from rayk.storage.remote.remote_segment import new_segment_id, partition_prefix
from rayk.storage.transaction_index import decode_entries

logger = logging.getLogger(__name__)

INDEX_CACHE_ENTRIES = 16  # remote .index objects kept for reads (a consumer reads a segment in many fetches)


class RemoteLogManager:
    """One replica's copying, remote retention and remote reads (see the module docstring)."""

    def __init__(self, ctx: ReplicaContext) -> None:
        self._ctx = ctx
        self._storage: RemoteLogStorage | None = None  # opened at first use (imports pyarrow)
        self._prefix = partition_prefix(ctx.topic, ctx.partition, ctx.topic_id)
        self.segments: list[RemoteSegmentMetadata] = []  # as last listed, oldest first
        self.log_start_floor = 0  # a DeleteRecords' offset recorded in the store: nothing below is read
        self._task: asyncio.Task | None = None
        self._indexes: dict[str, bytes] = {}
        self._pass_lock = asyncio.Lock()  # one pass at a time (the timer's, or copy_to_remote's)
        # Changes this replica made to `segments` (a copy, a remote deletion): a listing of
        # the store that overlapped one is taken again (`_list`).
        self._changes = 0
        self._listed_in_epoch = -1  # the leader epoch of the last listing: a new leader lists before it answers

    @property
    def _settings(self) -> RemoteStorageSettings | None:
        return self._ctx.config.remote_storage

    @property
    def enabled(self) -> bool:
        """Whether this replica's log is tiered: the topic asks for it and the broker has a store."""
        return self._settings is not None and self._ctx.log.config.remote_storage_enable

    def _store(self) -> RemoteLogStorage:
        if self._storage is None:
            settings = self._settings
            assert settings is not None, "only a tiered replica uses the store"
            replica_process.let_library_in("pyarrow")  # kept out of replicas that do not tier
            self._storage = settings.open()
        return self._storage

    # ------------------------------------------------------------------ the leader's task

    def start(self) -> None:
        """This replica leads or follows now: its task starts (if the log is tiered)."""
        if self._task is None and self._settings is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"remote-log-{self._ctx.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            role = self._ctx.role
            if self.enabled and role is not None:
                try:
                    if role is Role.LEADER:
                        await self.run_once()
                    else:
                        # A follower's local log follows its leader's local start (the
                        # fetches say it); what falls below goes at this pace, not at the
                        # retention check's.
                        self._ctx.log.delete_expired_segments()
                except asyncio.CancelledError:
                    raise
                except KafkaError as e:
                    logger.warning("%s: tiered storage pass failed (it is retried): %s", self._ctx.name, e)
                except Exception:
                    logger.exception("%s: tiered storage pass failed (it is retried)", self._ctx.name)
            await asyncio.sleep(self._ctx.config.remote_log_manager_task_interval_ms / 1000)

    async def run_once(self) -> int:
        """One pass (see the module docstring); returns how many segments it copied."""
        async with self._pass_lock:
            return await self._pass()

    async def _pass(self) -> int:
        ctx = self._ctx
        epoch = ctx.leader_epoch
        if not (self.enabled and ctx.leads_in(epoch)):
            return 0
        store = self._store()
        await self._list_in_epoch()
        if not ctx.leads_in(epoch):
            return 0  # deposed while listing: remote retention is the new leader's
        await self._expire_remote(epoch)
        log = ctx.log
        copied = 0
        upper = min(log.high_watermark, log.last_stable_offset)
        for segment in log.segments_to_copy(upper, self.remote_end_offset or 0):
            if not ctx.leads_in(epoch):
                break
            done = await asyncio.to_thread(self._copy, store, segment, epoch)
            if done is None:
                break
            self.segments = [*self.segments, done]  # (a new list: readers iterate the old one across awaits)
            self._changes += 1
            copied += 1
        log.delete_expired_segments(copied_end_offset=self.remote_end_offset or log.log_start_offset)
        return copied

    def _copy(self, store: RemoteLogStorage, segment: SegmentToCopy, epoch: int) -> RemoteSegmentMetadata | None:
        """Copies one segment (a worker thread); None if this replica stopped leading in
        `epoch` before the commit, or a file went (a full truncation)."""
        ctx = self._ctx
        metadata = RemoteSegmentMetadata(
            topic=ctx.topic, partition=ctx.partition, topic_id=ctx.topic_id, base_offset=segment.base_offset,
            end_offset=segment.end_offset, max_timestamp_ms=segment.max_timestamp_ms, size_bytes=segment.size_bytes,
            segment_id=new_segment_id(), leader_epochs=segment.leader_epochs, copied_by_broker=ctx.broker_id,
            copied_in_leader_epoch=epoch, created_ms=int(time.time() * 1000),
        )
        files: dict[str, object] = dict(segment.files)
        files["leader-epoch-checkpoint"] = "".join(f"{e} {o}\n" for e, o in segment.leader_epochs).encode()
        try:
            return store.copy_segment(self._prefix, metadata, files, before_commit=lambda: ctx.leads_in(epoch))  # type: ignore[arg-type]
        except FileNotFoundError:
            return None

    async def _expire_remote(self, epoch: int) -> None:
        """Remote retention over the whole log: the oldest remote segments past retention.ms,
        or while the log without them still holds retention.bytes (Kafka's RLM deletion)."""
        config, log = self._ctx.log.config, self._ctx.log
        now_ms = int(time.time() * 1000)
        local_start = log.log_start_offset
        remote_only = sum(s.size_bytes for s in self.segments if s.base_offset < local_start)
        excess = remote_only + log.size_bytes - config.retention_bytes
        doomed = []
        for s in self.segments:
            expired = config.retention_ms >= 0 and now_ms - s.max_timestamp_ms > config.retention_ms
            oversize = config.retention_bytes >= 0 and excess - s.size_bytes >= 0
            deleted = s.end_offset <= self.log_start_floor  # below a DeleteRecords
            if not (expired or oversize or deleted) or s.end_offset > log.high_watermark:
                break
            doomed.append(s)
            if s.base_offset < local_start:
                excess -= s.size_bytes
        store = self._store()
        for s in doomed:
            if not self._ctx.leads_in(epoch):
                return  # deposed meanwhile: remote retention is the new leader's
            await asyncio.to_thread(store.delete_segment, self._prefix, s)
            # A new list, not one changed in place: a reader iterating the old one across
            # its own awaits (a transaction index, a time index) must not skip a segment.
            self.segments = [kept for kept in self.segments if kept is not s]
            self._changes += 1
            self._indexes.pop(s.segment_id, None)

    # ------------------------------------------------------------------ what the log's offsets become

    @property
    def remote_end_offset(self) -> int | None:
        """The end (exclusive) of what the store holds, or None if nothing."""
        return self.segments[-1].end_offset if self.segments else None

    def log_start_offset(self) -> int:
        """The log start a consumer sees: the first remote offset where the remote copy
        reaches the local log, else the local log start."""
        local_start = self._ctx.log.log_start_offset
        if not self.enabled or not self.segments or self.segments[-1].end_offset < local_start:
            return local_start
        return min(max(self.segments[0].base_offset, self.log_start_floor), local_start)

    def holds(self, offset: int) -> bool:
        return self.enabled and offset >= self.log_start_floor and any(s.holds(offset) for s in self.segments)

    # ------------------------------------------------------------------ reads

    async def refresh(self) -> None:
        """Lists the store again."""
        if self.enabled:
            await self._list_in_epoch()

    async def _list_in_epoch(self) -> None:
        epoch = self._ctx.leader_epoch
        await self._list()
        self._listed_in_epoch = epoch

    async def _list(self) -> None:
        """Replaces what this replica knows of the store with a listing of it, taken again
        if this replica changed `segments` meanwhile: a listing that started before a
        pass's copy committed and ended after the pass had added the copy and deleted its
        local segments forgot the copy (its offsets below the local start and in no known
        segment: a consumer fetching them was answered OFFSET_OUT_OF_RANGE until the next
        pass). It never waits for a pass, whose copies may take long on a slow store. The
        floor only grows (a DeleteRecords'), so a listing never sets it back."""
        store = self._store()
        while True:
            changes = self._changes
            segments = await asyncio.to_thread(store.list_segments, self._prefix)
            floor = await asyncio.to_thread(store.read_log_start, self._prefix)
            if changes == self._changes:
                break
        self.segments = segments
        self.log_start_floor = max(self.log_start_floor, floor)

    async def delete_records(self, offset: int) -> None:
        """DeleteRecords up to `offset` on a tiered log: the store records it as the log's
        start (every leader, follower and Ray Data plan reads it there), the remote
        segments wholly below it go at the next pass."""
        await self.ensure_listed()
        if offset > self.log_start_floor:
            await asyncio.to_thread(self._store().write_log_start, self._prefix, offset)
            self.log_start_floor = max(self.log_start_floor, offset)

    async def ensure_listed(self) -> None:
        """Lists the store if this leader has not since it began leading: what it answers
        about the log's start (ListOffsets EARLIEST, a fetch below its local start) must
        count what its predecessors copied. KAFKA_STORAGE_ERROR (retriable) if the store
        cannot be listed."""
        if self.enabled and self._listed_in_epoch != self._ctx.leader_epoch:
            await self._list_in_epoch()

    async def read(self, offset: int, max_bytes: int, max_offset: int) -> tuple[bytes, int]:
        """(batches, next offset) from the remote segment holding `offset`; OFFSET_OUT_OF_RANGE
        if none does, KAFKA_STORAGE_ERROR if the store cannot be read."""
        segment = next((s for s in self.segments if s.holds(offset)), None) if offset >= self.log_start_floor else None
        if segment is None:
            raise OffsetOutOfRangeError(f"offset {offset} of {self._ctx.name} is in no remote segment")
        store = self._store()
        index = self._indexes.get(segment.segment_id)
        if index is None:
            index = await asyncio.to_thread(store.read, self._prefix, segment, "index")
            if len(self._indexes) >= INDEX_CACHE_ENTRIES:
                del self._indexes[next(iter(self._indexes))]
            self._indexes[segment.segment_id] = index
        return await asyncio.to_thread(read_batches, store, self._prefix, segment, offset, max_bytes, max_offset, index)

    async def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the earliest remote record below the local log with a
        timestamp >= `timestamp_ms`, or None (then the local log answers)."""
        local_start = self._ctx.log.log_start_offset
        for segment in tuple(self.segments):  # as they were with this local start (a pass may run meanwhile)
            if segment.base_offset >= local_start:
                return None
            if segment.max_timestamp_ms >= timestamp_ms and segment.end_offset > self.log_start_floor:
                found = await asyncio.to_thread(remote_offset_for_timestamp, self._store(), self._prefix, segment,
                                                timestamp_ms)  # fmt: skip
                if found is not None and found[1] >= self.log_start_floor:
                    return found
        return None

    async def aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> tuple[tuple[int, int], ...]:
        """(producer id, first offset) of the aborted transactions overlapping a range read
        from remote segments: what a read_committed fetch of it is answered beside its records."""
        return tuple((pid, first) for pid, first, _last in await self.aborted_transaction_spans(start_offset,
                                                                                              upper_bound_offset))

    async def aborted_transaction_spans(self, start_offset: int, upper_bound_offset: int) -> list[tuple[int, int, int]]:
        """(producer id, first offset, last offset) of the aborted transactions overlapping
        [start_offset, upper_bound_offset): their remote transaction indexes from the one
        holding `start_offset` on, then the local log's, until one says no later one can
        hold more.
        Both parts are taken before the first store read: the remote segments known then
        cover everything below the local start then, so a pass that copies and deletes
        local segments during the reads cannot leave a transaction in neither part."""
        found: list[tuple[int, int, int]] = []
        store = self._store()
        log = self._ctx.log
        remote = tuple(self.segments)
        local = log.aborted_transactions(max(start_offset, log.log_start_offset), upper_bound_offset)
        for segment in remote:
            if segment.end_offset <= start_offset or not segment.object_bytes.get("txnindex"):
                continue
            entries, _damage = decode_entries(await asyncio.to_thread(store.read, self._prefix, segment, "txnindex"))
            for txn in entries:
                if txn.last_offset >= start_offset and txn.first_offset < upper_bound_offset:
                    found.append((txn.producer_id, txn.first_offset, txn.last_offset))
                if txn.last_stable_offset >= upper_bound_offset:
                    return found
        return found + [(t.producer_id, t.first_offset, t.last_offset) for t in local]

    async def remote_start_state(self, offset: int) -> tuple[bytes | None, tuple[tuple[int, int], ...]]:
        """For a follower starting its log at `offset` (its leader's local log start): the
        producer snapshot and the leader epochs of the remote segment that ends there
        (None, () if the store holds none)."""
        if self._settings is None:
            return None, ()
        store = self._store()
        segments = await asyncio.to_thread(store.list_segments, self._prefix)
        segment = next((s for s in segments if s.end_offset == offset), None)
        if segment is None:
            return None, ()
        snapshot = await asyncio.to_thread(store.read, self._prefix, segment, "snapshot") if "snapshot" in segment.object_bytes else None
        epochs = tuple(e for s in segments if s.base_offset < offset for e in s.leader_epochs)
        return snapshot, epochs

