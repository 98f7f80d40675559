"""GroupCoordinator: the consumer groups and committed offsets of one `__consumer_offsets`
partition (Kafka's GroupCoordinator + GroupMetadataManager).

As in Kafka, group `g` belongs to partition `coordinator_partition(g, n)` of the internal
topic `__consumer_offsets`, and the broker leading that partition coordinates the group:
here the coordinator lives inside that partition's leader replica actor, is created when it
becomes leader (loading the partition's records) and closed when it stops leading (clients
then get NOT_COORDINATOR and look the coordinator up again).

Durable state is records in the partition (group_records.py), written with acks=all
before a request is answered, so committed offsets survive broker restarts and failover:
committed offsets, and a group's record written when a generation settles, with its
members and their assignments (Kafka's GroupMetadataValue), so a new coordinator takes the
group over as it was: its members go on heartbeating and committing in their generation,
with no rebalance, and those that do not reach it within their session time out. The coordinator is the
partition's only writer (clients' produces to it are refused), but a record it cannot read
(written before that refusal, or corrupt) is skipped by the load with an error logged, and
the load goes on: one bad record never costs the partition's other groups their coordinator.
The topic is compacted (cleanup.policy compact, as Kafka's), so a new coordinator replays
only each key's latest record, plus what was written since the last clean; a deleted
offset or group is a tombstone, which the cleaner drops after delete.retention.ms.

Offsets go away in two ways, each written as tombstones:
- expiry (KIP-211), checked every offsets.retention.check.interval.ms: a group that had
  generations and has no members loses all its offsets once it has been empty
  offsets.retention.minutes; the offsets of a group that never had one (a standalone
  consumer's) each expire that long after their commit; a group with members keeps them
  all. A group with neither members nor offsets is deleted at the same check, as Kafka's
  cleanupGroupMetadata does;
- DeleteGroups: a group without members, with its offsets (NON_EMPTY_GROUP while it has
  members, GROUP_ID_NOT_FOUND if there is no such group);
- OffsetDelete (KIP-496): some of a group's offsets, as Kafka's ClassicGroup allows: not
  those of topics its members consume (GROUP_SUBSCRIBED_TO_TOPIC; all topics while their
  subscriptions cannot be read), none of a group with members that is not a consumer
  group (NON_EMPTY_GROUP).
Commits run concurrently, as in Kafka; expiry and deletion take the group's lock (one at
a time) and, like Kafka's pendingOffsetCommits, leave alone a partition with a commit in
flight or committed again since they looked, choosing each batch of tombstones in the
same step as it enters the log, so the log ends with what memory holds. Groups come into being by
JoinGroup or a standalone commit only; SyncGroup, Heartbeat and LeaveGroup for a group
the coordinator does not know are UNKNOWN_MEMBER_ID, a commit of a generation it does
not know ILLEGAL_GENERATION, as in Kafka.

Groups of KIP-848's consumer protocol are hosted here too, by ConsumerGroupHosting
(consumer_group_hosting.py), in the same group id namespace.

Not thread-safe; the owning actor's event loop calls it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgpack

from rayk.coordinator.group.consumer_group import ConsumerGroup, GroupState, JoinResult, Member
from rayk.coordinator.group.consumer_group_hosting import (
    CONSUMER_PROTOCOL_TYPE,
    ConsumerGroupHosting,
    PartitionCounts,
    encode_partitions,
    monotonic_ms,
)
from rayk.coordinator.group.consumer_protocol_group import ConsumerProtocolGroup
from rayk.coordinator.share.share_group import ShareGroup
from rayk.coordinator.share.share_group_hosting import MembersGone, ShareGroupHosting, StatesReset
from rayk.coordinator.coordinator_log import LogEntry, TxnMarker, TxnRecords
from rayk.coordinator.group.group_records import (
    AnyGroupRecord,
    CommittedOffset,
    ConsumerGroupRecord,
    GroupRecord,
    MalformedGroupRecordError,
    MemberState,
    OffsetRecord,
    ShareGroupRecord,
    ShareStateRecord,
    consumer_group_key,
    consumer_group_value,
    decode_record,
    group_key,
    member_state_value,
    offset_key,
    offset_value,
)
from rayk.config import BrokerConfig
from rayk.errors import (
    CoordinatorNotAvailableError,
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    IllegalGenerationError,
    InvalidGroupIdError,
    InvalidSessionTimeoutError,
    KafkaError,
    NonEmptyGroupError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    OffsetMetadataTooLargeError,
    RequestTimedOutError,
    UnknownMemberIdError,
    UnstableOffsetCommitError,
)
from rayk.internal_topics import OFFSETS_TOPIC

logger = logging.getLogger(__name__)

MEMBER_EXPIRY_CHECK_MS = 250
RECORDS_PER_APPEND = 1_000  # tombstones or group records: ~60 KB a batch, well under max.message.bytes
TopicPartition = tuple[str, int]
Append = Callable[[list[tuple[bytes, bytes | None]]], Awaitable[None]]
# (records, transactional id, producer id, producer epoch): a transactional producer's batch
AppendTransactional = Callable[[list[tuple[bytes, bytes | None]], str, int, int], Awaitable[None]]


def _subscribed_topics(group: ConsumerGroup) -> frozenset[str] | None:
    """The topics a consumer group's members subscribe to, by the metadata they joined the
    current protocol with; None (all topics, as Kafka's ClassicGroup answers) while no
    protocol is chosen or a member's subscription does not decode."""
    from rayk.consumer_protocol import decode_subscription  # (rayk.client imports this module)

    if group.protocol is None:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        metadata = dict(member.protocols).get(group.protocol)
        if metadata is None:
            return None
        try:
            topics.update(decode_subscription(metadata).topics)
        except KafkaError:
            return None
    return frozenset(topics)


class GroupCoordinator(ConsumerGroupHosting, ShareGroupHosting):
    def __init__(self, append: Append, config: BrokerConfig | None = None,
                 append_transactional: AppendTransactional | None = None,
                 partition_counts: PartitionCounts | None = None,
                 share_members_gone: MembersGone | None = None,
                 share_states_reset: StatesReset | None = None) -> None:  # fmt: skip
        self.config = config or BrokerConfig()
        self._append = append
        self._lookup_partition_counts = partition_counts
        self._append_transactional = append_transactional
        # TxnOffsetCommit's offsets until their producer's marker: producer id -> group -> partition -> offset
        self._pending_txn: dict[int, dict[str, dict[TopicPartition, CommittedOffset]]] = {}
        self._groups: dict[str, ConsumerGroup] = {}
        self._consumer_groups: dict[str, ConsumerProtocolGroup] = {}
        self._share_groups: dict[str, ShareGroup] = {}
        self._share_states: dict[str, dict[TopicPartition, ShareStateRecord]] = {}
        self._share_state_locks: weakref.WeakValueDictionary[tuple[str, str, int], asyncio.Lock] = weakref.WeakValueDictionary()
        self._share_members_gone = share_members_gone
        self._share_states_reset = share_states_reset
        self._offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._expiry: asyncio.Task | None = None
        self._offset_expiry: asyncio.Task | None = None
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._committing: dict[str, Counter[TopicPartition]] = {}  # commits in flight, by group
        self._unstamped: list[str] = []  # groups loaded without the time they became empty

    # ------------------------------------------------------------------ loading

    def load(self, records: Iterable[LogEntry], source: str = OFFSETS_TOPIC) -> None:
        """Replays the partition's log, oldest first (coordinator_log.py): records
        (offset, key, value), transactional producers' offsets and their markers; `source`
        names the partition in the error logged for each record it skips, one that is none
        of the coordinator's records (see group_records.py)."""
        for entry in records:
            if isinstance(entry, TxnMarker):
                self.complete_txn(entry.producer_id, entry.commit)
            elif isinstance(entry, TxnRecords):
                for offset, key, value in entry.records:
                    record = self._decoded(offset, key, value, source)
                    if isinstance(record, OffsetRecord) and record.committed is not None:
                        self._pending_txn.setdefault(entry.producer_id, {}).setdefault(record.group_id, {})[
                            (record.topic, record.partition)] = record.committed
            else:
                record = self._decoded(*entry, source)
                if isinstance(record, OffsetRecord):
                    self._load_offset(record)
                elif isinstance(record, ConsumerGroupRecord):
                    self._load_consumer_group(record)
                elif isinstance(record, ShareGroupRecord):
                    self._load_share_group(record)
                elif isinstance(record, ShareStateRecord):
                    self._load_share_state(record)
                elif record is not None:
                    self._load_group(record)

    @staticmethod
    def _decoded(offset: int, key: bytes | None, value: bytes | None, source: str) -> AnyGroupRecord | None:
        if key is None:
            return None
        try:
            return decode_record(key, value)
        except MalformedGroupRecordError as e:
            logger.error("%s offset %d: skipped a record the group coordinator did not write: %s", source, offset, e)
            return None

    def _load_offset(self, record: OffsetRecord) -> None:
        tp = (record.topic, record.partition)
        self._supersede_pending(record.group_id, [tp])
        if record.committed is not None:
            self._offsets.setdefault(record.group_id, {})[tp] = record.committed
            return
        table = self._offsets.get(record.group_id, {})
        table.pop(tp, None)
        if not table:
            self._offsets.pop(record.group_id, None)

    def _load_group(self, record: GroupRecord) -> None:
        if record.generation is None:
            self._groups.pop(record.group_id, None)
            return
        self._groups.pop(record.group_id, None)  # each record supersedes the one before
        self._consumer_groups.pop(record.group_id, None)  # (of any kind)
        self._share_groups.pop(record.group_id, None)
        group = self._group(record.group_id)
        group.generation = record.generation
        if record.members:
            # The settled generation's members, taken over as Kafka's coordinator loads its
            # GroupMetadata: they go on heartbeating and committing in their generation, and
            # those that do not come to this coordinator within their session leave as usual.
            group.restore_stable(record.protocol_type, record.protocol, record.leader_id, [
                Member(m.member_id, m.client_id, m.session_timeout_ms, m.rebalance_timeout_ms, list(m.protocols),
                       group.clock_s(), m.assignment, m.group_instance_id)
                for m in record.members
            ])
            group.empty_since_ms = None
            return
        # No members kept (an empty group, or a record written before members were kept):
        # the group is empty since it became so (or, for a record written while it had
        # members, since now, which `start` writes down so that the next coordinator
        # counts from it too) until its members join again.
        group.empty_since_ms = record.empty_since_ms
        if group.empty_since_ms is None:
            group.empty_since_ms = int(time.time() * 1000)
            self._unstamped.append(record.group_id)

    def _group(self, group_id: str) -> ConsumerGroup:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = ConsumerGroup(
                group_id, self.config.group_initial_rebalance_delay_ms, on_stable=self._persist_group
            )
        return group

    def _existing_group(self, group_id: str, member_id: str) -> ConsumerGroup:
        group = self._groups.get(group_id)
        if group is None:
            raise UnknownMemberIdError(f"group {group_id!r} has no member {member_id!r} (no such group here)")
        return group

    def _lock(self, group_id: str) -> asyncio.Lock:
        """The group's lock for expiry and deletion (gone once nobody holds it)."""
        lock = self._locks.get(group_id)
        if lock is None:
            lock = self._locks[group_id] = asyncio.Lock()
        return lock

    def start(self) -> None:
        stamped = [self._group_record(g) for g in map(self._groups.get, self._unstamped) if g is not None and not g.members]
        self._unstamped.clear()
        if stamped:
            self._write_in_background(stamped)
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().create_task(self._expire_members())
        if self._offset_expiry is None:
            self._offset_expiry = asyncio.get_running_loop().create_task(self._expire_offsets_forever())

    async def _expire_offsets_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            try:
                expired = await self.expire_offsets()
            except Exception as e:  # not leading any more, or the write failed: next time
                logger.warning("offset expiry failed: %r", e)
                continue
            if expired:
                logger.info("expired %d committed offset(s)", expired)

    async def _expire_members(self) -> None:
        while True:
            await asyncio.sleep(MEMBER_EXPIRY_CHECK_MS / 1000)
            for group in list(self._groups.values()):
                for member_id in group.expire():
                    logger.info("group %s: member %s timed out", group.group_id, member_id)
            for group_id in list(self._consumer_groups):
                try:
                    await self.expire_consumer_members(group_id)
                except Exception as e:  # not leading any more, or the write failed: next time
                    logger.warning("group %s: member expiry failed: %r", group_id, e)
            for group_id in list(self._share_groups):
                try:
                    await self.expire_share_members(group_id)
                except Exception as e:
                    logger.warning("share group %s: member expiry failed: %r", group_id, e)

    def close(self) -> None:
        for loop_task in (self._expiry, self._offset_expiry):
            if loop_task is not None:
                loop_task.cancel()
        for task in self._tasks:
            task.cancel()
        for group in self._groups.values():
            group.close()

    def _persist_group(self, group: ConsumerGroup) -> None:
        self._write_in_background([self._group_record(group)])

    @staticmethod
    def _group_record(group: ConsumerGroup) -> tuple[bytes, bytes]:
        states = [
            member_state_value(MemberState(m.member_id, m.group_instance_id, m.client_id, m.session_timeout_ms,
                                           m.rebalance_timeout_ms, tuple(m.protocols), m.assignment))
            for m in group.members.values()
        ] if group.state is GroupState.STABLE else []
        value = msgpack.packb(
            {
                "generation": group.generation,
                "protocol_type": group.protocol_type,
                "protocol": group.protocol,
                "leader": group.leader_id,
                "members": sorted(group.members),
                "empty_since_ms": group.empty_since_ms if not group.members else None,
                "member_states": states,
            }
        )
        return group_key(group.group_id), value

    def _write_in_background(self, records: list[tuple[bytes, bytes]]) -> None:
        async def write() -> None:
            for i in range(0, len(records), RECORDS_PER_APPEND):
                await self._append(records[i:i + RECORDS_PER_APPEND])

        task = asyncio.get_running_loop().create_task(write())
        self._tasks.add(task)
        task.add_done_callback(self._persisted)

    async def _background_writes_landed(self) -> None:
        """Returns once every record written in the background so far is written (or failed)."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def _persisted(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("could not persist group metadata: %s", task.exception())

    # ------------------------------------------------------------------ membership

    async def join_group(
        self,
        group_id: str,
        member_id: str,
        client_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        group_instance_id: str | None = None,
    ) -> JoinResult:
        if not group_id:
            raise InvalidGroupIdError("a consumer group needs a non-empty group id")
        c = self.config
        if not c.group_min_session_timeout_ms <= session_timeout_ms <= c.group_max_session_timeout_ms:
            raise InvalidSessionTimeoutError(
                f"session timeout {session_timeout_ms} ms is outside the broker's "
                f"[{c.group_min_session_timeout_ms}, {c.group_max_session_timeout_ms}] ms"
            )
        self._refuse_share_group(group_id)
        if group_id in self._consumer_groups:
            joined = await self._classic_join_consumer_group(group_id, member_id, client_id, session_timeout_ms,
                                                             rebalance_timeout_ms, protocol_type, protocols,
                                                             group_instance_id)  # fmt: skip
            if joined is not None:
                return joined
        return await self._group(group_id).join(
            member_id, client_id, session_timeout_ms, rebalance_timeout_ms, protocol_type, protocols, group_instance_id
        )

    async def sync_group(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: dict[str, bytes] | None,
        group_instance_id: str | None = None,
    ) -> bytes:
        if group_id in self._consumer_groups:
            async with self._lock(group_id):
                mixed = self._consumer_groups.get(group_id)
                if mixed is not None:
                    return encode_partitions(mixed.classic_sync(self._classic_member_id(mixed, member_id, group_instance_id),
                                                                generation, monotonic_ms()))  # fmt: skip
        group = self._existing_group(group_id, member_id)
        return await group.sync(generation, member_id, assignments, group_instance_id)

    async def heartbeat(self, group_id: str, generation: int, member_id: str, group_instance_id: str | None = None) -> None:
        if group_id in self._consumer_groups:
            async with self._lock(group_id):
                mixed = self._consumer_groups.get(group_id)
                if mixed is not None:
                    mixed.classic_heartbeat(self._classic_member_id(mixed, member_id, group_instance_id), generation,
                                            monotonic_ms())  # fmt: skip
                    return
        self._existing_group(group_id, member_id).heartbeat(generation, member_id, group_instance_id)

    async def leave_group(self, group_id: str, member_id: str, group_instance_id: str | None = None) -> None:
        """Removes a member, named by its member id or (a static one) by its instance id."""
        if group_id in self._consumer_groups:
            async with self._lock(group_id):
                mixed = self._consumer_groups.get(group_id)
                if mixed is not None:
                    trial = mixed.copy()
                    trial.classic_leave(self._classic_member_id(trial, member_id, group_instance_id))
                    await self._write_group_records(group_id, [(consumer_group_key(group_id), consumer_group_value(trial.snapshot()))])
                    self._consumer_groups[group_id] = trial
                    return
        self._existing_group(group_id, member_id or group_instance_id or "").leave(member_id, group_instance_id)

    # ------------------------------------------------------------------ offsets

    async def commit_offsets(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        offsets: dict[TopicPartition, tuple[int, str] | tuple[int, str, int]],
        group_instance_id: str | None = None,
    ) -> None:
        """Stores committed offsets durably (acks=all) if the member may commit: per
        partition (offset, metadata) or (offset, metadata, leader epoch), the epoch of the
        record the offset follows (KIP-320; -1, the default, for none), which OffsetFetch
        gives back so that a resuming consumer can detect a truncated log."""
        if not group_id:
            raise InvalidGroupIdError("a consumer group needs a non-empty group id")
        self._refuse_share_group(group_id)
        group = self._groups.get(group_id)
        consumer_group = self._consumer_groups.get(group_id)
        if consumer_group is not None:
            self._check_member_epoch(consumer_group, member_id, generation)
        elif group is not None:
            group.check_commit(generation, member_id, group_instance_id)
        elif generation >= 0:
            raise IllegalGenerationError(f"group {group_id!r} has no generation {generation} here; rejoin")
        committed = self._to_commit(offsets)
        if committed:
            await self._write_offsets(group_id, committed, self._append)
            self._offsets.setdefault(group_id, {}).update(committed)
            self._supersede_pending(group_id, committed)

    async def txn_commit_offsets(
        self,
        group_id: str,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        generation: int,
        member_id: str,
        offsets: dict[TopicPartition, tuple[int, str] | tuple[int, str, int]],
        group_instance_id: str | None = None,
    ) -> None:
        """TxnOffsetCommit (KIP-98, KIP-447): the offsets are written as the producer's
        transactional records and become the group's committed offsets only when its
        transaction commits (`complete_txn`); an abort drops them. A member's commit is
        checked as Kafka checks it: an unknown member is UNKNOWN_MEMBER_ID, another
        generation ILLEGAL_GENERATION; one without a member (generation -1) is not checked."""
        if not group_id:
            raise InvalidGroupIdError("a consumer group needs a non-empty group id")
        if self._append_transactional is None:
            raise KafkaError("this coordinator cannot write transactional offsets")
        group = self._groups.get(group_id)
        consumer_group = self._consumer_groups.get(group_id)
        if consumer_group is not None:
            if member_id or generation >= 0:
                self._check_member_epoch(consumer_group, member_id, generation)
        else:
            if member_id and (group is None or member_id not in group.members):
                raise UnknownMemberIdError(f"member {member_id!r} is not in group {group_id!r}")
            if generation >= 0 and (group is None or generation != group.generation):
                raise IllegalGenerationError(f"generation {generation} is not group {group_id!r}'s current generation")
        if group is not None:
            group.check_not_fenced(group_instance_id, member_id)
        committed = self._to_commit(offsets)
        if not committed:
            return

        async def append(records: list[tuple[bytes, bytes | None]]) -> None:
            assert self._append_transactional is not None
            await self._append_transactional(records, transactional_id, producer_id, producer_epoch)

        await self._write_offsets(group_id, committed, append)
        self._pending_txn.setdefault(producer_id, {}).setdefault(group_id, {}).update(committed)

    def complete_txn(self, producer_id: int, commit: bool) -> None:
        """The producer's transaction marker is in the log: its pending offsets become the
        groups' committed offsets (COMMIT) or are dropped (ABORT)."""
        pending = self._pending_txn.pop(producer_id, {})
        if commit:
            for group_id, table in pending.items():
                self._offsets.setdefault(group_id, {}).update(table)

    def _supersede_pending(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """A commit written after a transactional one of the same partition wins, whatever
        the transaction's outcome: the later record in the log decides, as in Kafka."""
        for by_group in self._pending_txn.values():
            table = by_group.get(group_id)
            if table:
                for tp in partitions:
                    table.pop(tp, None)

    def pending_partitions(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions with transactional offsets awaiting their marker."""
        return {tp for by_group in self._pending_txn.values() for tp in by_group.get(group_id, {})}

    def _to_commit(self, offsets: dict[TopicPartition, tuple[int, str] | tuple[int, str, int]]) -> dict[TopicPartition, CommittedOffset]:
        now_ms = int(time.time() * 1000)
        committed = {}
        for (topic, partition), (offset, metadata, *epoch) in offsets.items():
            if len(metadata.encode()) > self.config.offset_metadata_max_bytes:
                raise OffsetMetadataTooLargeError(
                    f"offset metadata of {len(metadata)} bytes exceeds offset.metadata.max.bytes"
                )
            leader_epoch = epoch[0] if epoch and epoch[0] >= 0 else -1
            committed[(topic, partition)] = CommittedOffset(offset, metadata, now_ms, leader_epoch)
        return committed

    async def _write_offsets(self, group_id: str, committed: dict[TopicPartition, CommittedOffset], append: Append) -> None:
        """Writes the offsets' records, marked in flight for expiry meanwhile. A write the
        partition could not replicate is COORDINATOR_NOT_AVAILABLE, which clients retry
        (Kafka's GroupMetadataManager.storeOffsets maps it so)."""
        records = [(offset_key(group_id, t, p), offset_value(c)) for (t, p), c in committed.items()]
        in_flight = Counter(committed.keys())
        committing = self._committing.setdefault(group_id, Counter())
        committing += in_flight
        try:
            await append(records)
        except (NotEnoughReplicasError, NotEnoughReplicasAfterAppendError, RequestTimedOutError) as e:
            raise CoordinatorNotAvailableError(f"the offsets of group {group_id!r} were not replicated: {e}") from None
        finally:
            committing -= in_flight  # (in place; partitions at 0 drop out)
            if not committing and self._committing.get(group_id) is committing:
                del self._committing[group_id]

    async def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None = None, require_stable: bool = False,
        member_id: str | None = None, member_epoch: int = -1,
    ) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets (of `partitions`, or all). With `require_stable`
        (KIP-447, as Kafka's consumers ask), UNSTABLE_OFFSET_COMMIT, which clients retry,
        while a transaction's offsets for them await its marker. A consumer-protocol
        member names itself and its epoch (OffsetFetch v9+), checked as a commit's."""
        consumer_group = self._consumer_groups.get(group_id)
        if consumer_group is not None and (member_id or member_epoch >= 0):
            self._check_member_epoch(consumer_group, member_id or "", member_epoch)
        if require_stable:
            pending = self.pending_partitions(group_id)
            if pending and (partitions is None or pending.intersection(partitions)):
                raise UnstableOffsetCommitError(f"group {group_id!r} has transactional offsets awaiting their marker")
        table = self._offsets.get(group_id, {})
        if partitions is None:
            return dict(table)
        return {tp: table[tp] for tp in partitions if tp in table}

    async def expire_offsets(self, now_ms: int | None = None) -> int:
        """Writes tombstones for the offsets that expired and deletes the groups left with
        neither members nor offsets (see the module docstring), group by group, a failure
        costing only its group this time; returns how many offsets expired."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        expired = 0
        for group_id in sorted(set(self._offsets) | set(self._groups)):
            try:
                expired += await self._expire_group(group_id, now_ms)
            except Exception as e:  # not leading any more, or the write failed: next time
                logger.warning("group %s: offset expiry failed: %r", group_id, e)
        return expired

    async def _expire_group(self, group_id: str, now_ms: int) -> int:
        retention_ms = self.config.offsets_retention_minutes * 60_000
        if self._has_members(group_id):
            return 0  # a group with members keeps its offsets (and need not wait for the lock)
        async with self._lock(group_id):
            group = self._groups.get(group_id)
            if group is not None and group.members:
                return 0
            table = self._offsets.get(group_id, {})
            if group is not None and group.generation > 0 and group.empty_since_ms is not None:
                gone = dict(table) if now_ms - group.empty_since_ms >= retention_ms else {}
            else:  # a standalone consumer's offsets: each by its commit time
                gone = {tp: c for tp, c in table.items() if now_ms - c.commit_timestamp_ms >= retention_ms}
            expired = await self._tombstone_offsets(group_id, gone)
            await self._delete_if_unused(group_id)
            return expired

    def _has_members(self, group_id: str) -> bool:
        group = self._groups.get(group_id) or self._consumer_groups.get(group_id)
        return group is not None and bool(group.members)

    def _refuse_share_group(self, group_id: str) -> None:
        """GROUP_ID_NOT_FOUND for a share group's id in another kind's request."""
        if group_id in self._share_groups:
            raise GroupIdNotFoundError(f"group {group_id!r} is a share group")

    async def delete_group(self, group_id: str) -> None:
        """DeleteGroups: tombstones for the group and its offsets (a share group's: and its
        share-partitions' states)."""
        async with self._lock(group_id):
            if group_id in self._share_groups:
                await self._delete_share_group(group_id)
                return
            group = self._groups.get(group_id)
            if self._has_members(group_id):
                raise NonEmptyGroupError(f"group {group_id!r} has members; it can be deleted once they have left")
            gone = dict(self._offsets.get(group_id, {}))
            if not gone and (group is None or group.generation == 0) and group_id not in self._consumer_groups:
                raise GroupIdNotFoundError(f"consumer group {group_id!r} does not exist")
            await self._tombstone_offsets(group_id, gone)
            await self._delete_if_unused(group_id)  # (a commit or a member that came meanwhile keeps it)

    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> dict[TopicPartition, KafkaError | None]:
        """OffsetDelete: per partition None (its offset, if it had one, is tombstoned) or
        GROUP_SUBSCRIBED_TO_TOPIC; raises GROUP_ID_NOT_FOUND for a group with neither
        members nor offsets, NON_EMPTY_GROUP for a non-consumer group with members."""
        async with self._lock(group_id):
            group = self._groups.get(group_id)
            consumer_group = self._consumer_groups.get(group_id)
            members = self._has_members(group_id)
            table = self._offsets.get(group_id, {})
            if not members and not table and (group is None or group.generation == 0) and consumer_group is None:
                raise GroupIdNotFoundError(f"consumer group {group_id!r} does not exist")
            if consumer_group is not None:
                subscribed: frozenset[str] | None = consumer_group.subscribed_topics()
            elif members:
                assert group is not None
                if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                    raise NonEmptyGroupError(f"group {group_id!r} has members and is not a consumer group")
                subscribed = _subscribed_topics(group)
            else:
                subscribed = frozenset()
            results: dict[TopicPartition, KafkaError | None] = {}
            for tp in partitions:
                if subscribed is None or tp[0] in subscribed:
                    results[tp] = GroupSubscribedToTopicError(f"group {group_id!r} consumes {tp[0]!r}")
                else:
                    results[tp] = None
            gone = {tp: table[tp] for tp, error in results.items() if error is None and tp in table}
            await self._tombstone_offsets(group_id, gone)
            return results

    async def _tombstone_offsets(self, group_id: str, gone: dict[TopicPartition, CommittedOffset]) -> int:
        """Writes tombstones for the offsets `gone`, RECORDS_PER_APPEND a batch, and
        forgets each batch's once it is written; returns how many. Each batch leaves out,
        in the step it is written in, a partition committed again or being committed
        since `gone` was taken: that commit is the newer one, in the log as in memory."""
        items, written = list(gone.items()), 0
        for i in range(0, len(items), RECORDS_PER_APPEND):
            table, committing = self._offsets.get(group_id, {}), self._committing.get(group_id, {})
            batch = {tp: c for tp, c in items[i:i + RECORDS_PER_APPEND] if table.get(tp) is c and not committing.get(tp)}
            if batch:
                await self._append([(offset_key(group_id, t, p), None) for t, p in batch])
                self._forget_offsets(group_id, batch)
                written += len(batch)
        return written

    def _forget_offsets(self, group_id: str, gone: dict[TopicPartition, CommittedOffset]) -> None:
        table = self._offsets.get(group_id, {})
        for tp, committed in gone.items():
            if table.get(tp) is committed:
                del table[tp]
        if not table:
            self._offsets.pop(group_id, None)

    async def _delete_if_unused(self, group_id: str) -> None:
        """A group with neither members nor offsets is deleted (its record tombstoned)."""
        if self._offsets.get(group_id) or self._committing.get(group_id):
            return
        consumer_group = self._consumer_groups.get(group_id)
        if consumer_group is not None and not consumer_group.members:  # (callers hold the group's lock)
            await self._append([(consumer_group_key(group_id), None)])
            del self._consumer_groups[group_id]
        group = self._groups.get(group_id)
        if group is None or group.members:
            return
        if group.generation > 0:
            await self._append([(group_key(group_id), None)])
            if group.members:  # joined meanwhile: its next generation writes its record again
                return
        if self._groups.get(group_id) is group:
            del self._groups[group_id]
            group.close()

    def committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        """Every group's committed offsets (for the broker's consumer-lag gauge)."""
        return {group: {tp: c.offset for tp, c in table.items()} for group, table in self._offsets.items() if table}

    # ------------------------------------------------------------------ inspection

    async def list_groups(self) -> list[dict[str, Any]]:
        """Every group here: its id, state, protocol type and type ("classic", "consumer" or "share")."""
        names = set(self._groups) | set(self._offsets) | set(self._consumer_groups) | set(self._share_groups)
        return [{**self._summary(g), "group_type": ("share" if g in self._share_groups else
                                                    "consumer" if g in self._consumer_groups else "classic")}
                for g in sorted(names)]  # fmt: skip

    def _summary(self, group_id: str) -> dict[str, Any]:
        share_group = self._share_groups.get(group_id)
        if share_group is not None:
            return {"group_id": group_id, "state": share_group.state, "protocol_type": "share"}
        consumer_group = self._consumer_groups.get(group_id)
        if consumer_group is not None:
            return {"group_id": group_id, "state": consumer_group.state.value, "protocol_type": "consumer"}
        group = self._groups.get(group_id)
        if group is None:  # only committed offsets left: Empty; nothing at all: Dead (Kafka's answers)
            state = GroupState.EMPTY if self._offsets.get(group_id) else GroupState.DEAD
            return {"group_id": group_id, "state": state.value, "protocol_type": "consumer"}
        return {"group_id": group_id, "state": group.state.value, "protocol_type": group.protocol_type or "consumer"}

    async def describe_group(self, group_id: str, consumer_protocol_too: bool = False) -> dict[str, Any]:
        """A classic group as DescribeGroups shows it. A consumer-protocol group is
        GROUP_ID_NOT_FOUND there, as in Kafka; with `consumer_protocol_too` (rayk's Admin)
        it is shown in the same shape: its group epoch as the generation, its assignor as
        the protocol, and each member's subscription and assignment in the classic
        consumer protocol's encoding."""
        self._refuse_share_group(group_id)
        consumer_group = self._consumer_groups.get(group_id)
        if consumer_group is not None and not consumer_protocol_too:
            raise GroupIdNotFoundError(f"group {group_id!r} is a consumer-protocol group: ConsumerGroupDescribe "
                                       "describes it")  # fmt: skip
        if consumer_group is not None:
            return self._describe_as_classic(consumer_group)
        group = self._groups.get(group_id)
        members = []
        if group is not None:
            members = [
                {
                    "member_id": m.member_id,
                    "client_id": m.client_id,
                    "group_instance_id": m.group_instance_id,
                    "assignment": m.assignment,
                    "metadata": dict(m.protocols).get(group.protocol, b""),  # the chosen protocol's
                }
                for m in group.members.values()
            ]
        return {
            **self._summary(group_id),
            "generation": group.generation if group else 0,
            "protocol": group.protocol if group else None,
            "leader": group.leader_id if group else None,
            "members": members,
            "offsets": {tp: c.offset for tp, c in self._offsets.get(group_id, {}).items()},
        }
