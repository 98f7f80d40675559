"""GroupCoordinator: the coordinator of the groups of one `__consumer_offsets` partition
(Kafka's GroupCoordinatorShard), made of one manager per kind of state, each owning its
state and writing through the partition's append:

- ClassicGroupManager (classic_group_manager.py): classic groups (JoinGroup, SyncGroup);
- ConsumerProtocolGroupManager (consumer_protocol_group_manager.py): KIP-848's groups
  (ConsumerGroupHeartbeat), and their conversions to and from classic groups;
- OffsetMetadataManager (offset_metadata_manager.py): committed offsets, transactional
  offsets until their markers, commits in flight;
- ShareCoordinator (rayk/coordinator/share/share_coordinator.py): share groups and their
  share-partitions' states.

The coordinator itself replays the partition into them (`load`) and keeps what spans
them: the group id namespace the kinds share (a later group record of one kind ends the
group of another, a request of one kind for another kind's group is refused), the lock of
a group id, the timers (member and offset expiry), and what needs a group and its offsets
together: commits checked by the group's members, deletion, expiry, listing, description.
Its public methods are what OffsetsPartitionReplica (offsets_replica.py), the partition's
leader actor, serves; those of one kind only are handed to its manager.

A group id's lock is held across the writes of the changes that are applied once written
(consumer-protocol and share heartbeats, expiry, deletion). Classic requests change their
group at once, without holding it (a JoinGroup waits for the whole rebalance), but each
first waits until the lock is free and then changes the group before it awaits anything
else, and the expiry of classic members skips a group whose lock is held: so nothing
changes a classic group while a heartbeat upgrading it to the consumer protocol writes the
consumer group it built from it, as in Kafka, which runs a group's operations one at a time.

As in Kafka, group `g` belongs to partition `coordinator_partition(g, n)` of the internal
topic `__consumer_offsets`, and the broker leading that partition coordinates the group:
here the coordinator lives inside that partition's leader replica actor, is created when it
becomes leader (loading the partition's records) and closed when it stops leading (clients
then get NOT_COORDINATOR and look the coordinator up again).

Durable state is records in the partition (group_records.py), written with acks=all
before a request is answered, so committed offsets survive broker restarts and failover,
and a new coordinator takes each group over as it was. The coordinator is the partition's
only writer (clients' produces to it are refused), but a record it cannot read (written
before that refusal, or corrupt) is skipped by the load with an error logged, and the load
goes on: one bad record never costs the partition's other groups their coordinator. The
topic is compacted (cleanup.policy compact, as Kafka's), so a new coordinator replays only
each key's latest record, plus what was written since the last clean; a deleted offset or
group is a tombstone, which the cleaner drops after delete.retention.ms.

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
a time) and leave alone a partition with a commit in flight or committed again since they
looked (OffsetMetadataManager.tombstone). Groups come into being by JoinGroup or a
standalone commit only; SyncGroup, Heartbeat and LeaveGroup for a group the coordinator
does not know are UNKNOWN_MEMBER_ID, a commit of a generation it does not know
ILLEGAL_GENERATION, as in Kafka.

Not thread-safe; the owning actor's event loop calls it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterable
from typing import Any

from rayk.config import BrokerConfig
from rayk.coordinator.coordinator_log import LogEntry, TxnMarker, TxnRecords
from rayk.coordinator.group.classic_group_manager import ClassicGroupManager
from rayk.coordinator.group.consumer_group import GroupState, JoinResult
from rayk.coordinator.group.consumer_protocol_group import ConsumerHeartbeat, HeartbeatAnswer
from rayk.coordinator.group.consumer_protocol_group_manager import ConsumerProtocolGroupManager, PartitionCounts
from rayk.coordinator.group.classic_group_records import GroupRecord
from rayk.coordinator.group.consumer_group_records import ConsumerGroupRecord
from rayk.coordinator.group.group_records import AnyGroupRecord, decode_record
# (offsets' Append returns the log offset written at; the other managers take the same call and ignore it)
from rayk.coordinator.group.offset_metadata_manager import Append, AppendTransactional, OffsetMetadataManager, OffsetsToCommit
from rayk.coordinator.group.offset_records import CommittedOffset, OffsetRecord
from rayk.coordinator.group.record_schema import MalformedGroupRecordError
from rayk.coordinator.share.share_coordinator import MembersGone, ShareCoordinator, StatesReset
from rayk.coordinator.share.share_group import ShareHeartbeatAnswer
from rayk.coordinator.share.share_records import ShareGroupRecord
from rayk.errors import (
    CoordinatorNotAvailableError,
    GroupIdNotFoundError,
    InvalidGroupIdError,
    InvalidSessionTimeoutError,
    KafkaError,
    NonEmptyGroupError,
    NotCoordinatorError,
)
from rayk.internal_topics import OFFSETS_TOPIC
from rayk.replication.share.share_state import ShareStateRecord

logger = logging.getLogger(__name__)

MEMBER_EXPIRY_CHECK_MS = 250
TopicPartition = tuple[str, int]


class GroupCoordinator:
    """The groups and committed offsets of one `__consumer_offsets` partition: the managers
    that own them (`classic_groups`, `consumer_groups`, `offsets`, `share`), and what spans
    them (see the module docstring)."""

    def __init__(self, append: Append, config: BrokerConfig | None = None,
                 append_transactional: AppendTransactional | None = None,
                 partition_counts: PartitionCounts | None = None,
                 share_members_gone: MembersGone | None = None,
                 share_states_reset: StatesReset | None = None) -> None:  # fmt: skip
        self.config = config or BrokerConfig()
        self._lookup_partition_counts = partition_counts
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._closed = False  # its replica loaded a successor (or stopped leading): it serves nothing more
        self.classic_groups = ClassicGroupManager(self.config, append)
        self.consumer_groups = ConsumerProtocolGroupManager(self.config, append, self._lock, self._partition_counts,
                                                            self.classic_groups, self._is_share_group)  # fmt: skip
        self.offsets = OffsetMetadataManager(self.config, append, append_transactional, self.classic_groups,
                                             self.consumer_groups)  # fmt: skip
        self.share = ShareCoordinator(self.config, append, self._lock, self._partition_counts, self._held_by_other_kind,
                                      share_members_gone, share_states_reset)  # fmt: skip
        self._expiry: asyncio.Task | None = None
        self._offset_expiry: asyncio.Task | None = None

    # ------------------------------------------------------------------ loading

    def load(self, records: Iterable[LogEntry], source: str = OFFSETS_TOPIC) -> None:
        """Replays the partition's log, oldest first (coordinator_log.py): records
        (offset, key, value), transactional producers' offsets and their markers; `source`
        names the partition in the error logged for each record it skips, one that is none
        of the coordinator's records (see group_records.py)."""
        for entry in records:
            if isinstance(entry, TxnMarker):
                self.offsets.complete_txn(entry.producer_id, entry.commit)
            elif isinstance(entry, TxnRecords):
                for offset, key, value in entry.records:
                    record = self._decoded(offset, key, value, source)
                    if isinstance(record, OffsetRecord):
                        self.offsets.load_pending(entry.producer_id, record, offset)
            else:
                record = self._decoded(*entry, source)
                if record is not None:
                    self._replay(record, entry[0])

    @staticmethod
    def _decoded(offset: int, key: bytes | None, value: bytes | None, source: str) -> AnyGroupRecord | None:
        if key is None:
            return None
        try:
            return decode_record(key, value)
        except MalformedGroupRecordError as e:
            logger.error("%s offset %d: skipped a record the group coordinator did not write: %s", source, offset, e)
            return None

    def _replay(self, record: AnyGroupRecord, log_offset: int) -> None:
        """One record (at `log_offset`) into its manager. A group's record (not its tombstone) ends whatever
        group of another kind had its id: the later record decides which kind it is."""
        if isinstance(record, OffsetRecord):
            self.offsets.load(record, log_offset)
        elif isinstance(record, ShareStateRecord):
            self.share.load_state(record)
        elif isinstance(record, ConsumerGroupRecord):
            if record.group_epoch is not None:
                self.classic_groups.discard(record.group_id)
                self.share.discard(record.group_id)
            self.consumer_groups.load(record)
        elif isinstance(record, ShareGroupRecord):
            if record.group_epoch is not None:
                self.classic_groups.discard(record.group_id)
                self.consumer_groups.discard(record.group_id)
            self.share.load_group(record)
        else:
            assert isinstance(record, GroupRecord), record
            if record.generation is not None:
                self.consumer_groups.discard(record.group_id)
                self.share.discard(record.group_id)
            self.classic_groups.load(record)

    def start(self) -> None:
        self.classic_groups.start()
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().create_task(self._expire_members())
        if self._offset_expiry is None:
            self._offset_expiry = asyncio.get_running_loop().create_task(self._expire_offsets_forever())

    def close(self) -> None:
        self._closed = True
        for loop_task in (self._expiry, self._offset_expiry):
            if loop_task is not None:
                loop_task.cancel()
        self.classic_groups.close()

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
            self.classic_groups.expire_members(busy=self._writing)
            for group_id in list(self.consumer_groups.groups):
                try:
                    await self.consumer_groups.expire_members(group_id)
                except Exception as e:  # not leading any more, or the write failed: next time
                    logger.warning("group %s: member expiry failed: %r", group_id, e)
            for group_id in list(self.share.groups):
                try:
                    await self.share.expire_members(group_id)
                except Exception as e:
                    logger.warning("share group %s: member expiry failed: %r", group_id, e)

    # ------------------------------------------------------------------ what the kinds share

    def _lock(self, group_id: str) -> asyncio.Lock:
        """A group id's lock, whatever its kind, for the changes that write before they are
        applied (heartbeats of consumer and share groups), expiry and deletion (gone once
        nobody holds it)."""
        lock = self._locks.get(group_id)
        if lock is None:
            lock = self._locks[group_id] = asyncio.Lock()
        return lock

    def _writing(self, group_id: str) -> bool:
        """Whether a change of the group is being written (its lock is held)."""
        lock = self._locks.get(group_id)
        return lock is not None and lock.locked()

    async def _no_write_under_way(self, group_id: str) -> None:
        """Returns once the group's lock is free (see the module docstring). The caller, a
        classic request, must change the classic group before its next await: it does not
        hold the lock, so a write could start after that await. NOT_COORDINATOR if this
        coordinator was closed meanwhile (its successor, loaded from the log, serves the
        group): a request waiting here must not start a rebalance in a closed group."""
        async with self._lock(group_id):
            pass
        if self._closed:
            raise NotCoordinatorError(f"the coordinator of group {group_id!r} moved: find it again")

    async def _partition_counts(self) -> dict[str, int]:
        if self._lookup_partition_counts is None:
            raise CoordinatorNotAvailableError("this coordinator cannot look the topics up")
        return await self._lookup_partition_counts()

    def _is_share_group(self, group_id: str) -> bool:
        return group_id in self.share.groups

    def _held_by_other_kind(self, group_id: str) -> bool:
        """Whether the id is a classic group's (one that had a generation or has members), a
        consumer-protocol group's, or has committed offsets: not a share group's to take."""
        group = self.classic_groups.groups.get(group_id)
        return ((group is not None and (group.generation > 0 or bool(group.members)))
                or group_id in self.consumer_groups.groups or bool(self.offsets.committed.get(group_id)))  # fmt: skip

    def _refuse_share_group(self, group_id: str) -> None:
        """GROUP_ID_NOT_FOUND for a share group's id in another kind's request."""
        if group_id in self.share.groups:
            raise GroupIdNotFoundError(f"group {group_id!r} is a share group")

    def _has_members(self, group_id: str) -> bool:
        group = self.classic_groups.groups.get(group_id) or self.consumer_groups.groups.get(group_id)
        return group is not None and bool(group.members)

    # ------------------------------------------------------------------ membership (classic)

    async def join_group(self, group_id: str, member_id: str, client_id: str, session_timeout_ms: int,
                         rebalance_timeout_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
                         group_instance_id: str | None = None) -> JoinResult:  # fmt: skip
        """A JoinGroup: to a classic group, or as a classic member of a consumer-protocol one."""
        if not group_id:
            raise InvalidGroupIdError("a consumer group needs a non-empty group id")
        c = self.config
        if not c.group_min_session_timeout_ms <= session_timeout_ms <= c.group_max_session_timeout_ms:
            raise InvalidSessionTimeoutError(
                f"session timeout {session_timeout_ms} ms is outside the broker's "
                f"[{c.group_min_session_timeout_ms}, {c.group_max_session_timeout_ms}] ms"
            )
        await self._no_write_under_way(group_id)
        self._refuse_share_group(group_id)
        joined = await self.consumer_groups.classic_join(group_id, member_id, client_id, session_timeout_ms,
                                                         rebalance_timeout_ms, protocol_type, protocols,
                                                         group_instance_id)  # fmt: skip
        if joined is not None:
            return joined
        return await self.classic_groups.join(group_id, member_id, client_id, session_timeout_ms, rebalance_timeout_ms,
                                              protocol_type, protocols, group_instance_id)  # fmt: skip

    async def sync_group(self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes] | None,
                         group_instance_id: str | None = None) -> bytes:  # fmt: skip
        await self._no_write_under_way(group_id)
        synced = await self.consumer_groups.classic_sync(group_id, generation, member_id, group_instance_id)
        if synced is not None:
            return synced
        return await self.classic_groups.sync(group_id, generation, member_id, assignments, group_instance_id)

    async def heartbeat(self, group_id: str, generation: int, member_id: str, group_instance_id: str | None = None) -> None:
        await self._no_write_under_way(group_id)
        if not await self.consumer_groups.classic_heartbeat(group_id, generation, member_id, group_instance_id):
            self.classic_groups.heartbeat(group_id, generation, member_id, group_instance_id)

    async def leave_group(self, group_id: str, member_id: str, group_instance_id: str | None = None) -> None:
        """Removes a member, named by its member id or (a static one) by its instance id."""
        await self._no_write_under_way(group_id)
        if not await self.consumer_groups.classic_leave(group_id, member_id, group_instance_id):
            self.classic_groups.leave(group_id, member_id, group_instance_id)

    # ------------------------------------------------------------------ offsets

    async def commit_offsets(self, group_id: str, generation: int, member_id: str, offsets: OffsetsToCommit,
                             group_instance_id: str | None = None) -> None:  # fmt: skip
        """Stores committed offsets durably (acks=all) if the member may commit: per
        partition (offset, metadata) or (offset, metadata, leader epoch), the epoch of the
        record the offset follows (KIP-320; -1, the default, for none), which OffsetFetch
        gives back so that a resuming consumer can detect a truncated log."""
        if not group_id:
            raise InvalidGroupIdError("a consumer group needs a non-empty group id")
        self._refuse_share_group(group_id)
        await self.offsets.commit_offsets(group_id, generation, member_id, offsets, group_instance_id)

    async def txn_commit_offsets(self, group_id: str, transactional_id: str, producer_id: int, producer_epoch: int,
                                 generation: int, member_id: str, offsets: OffsetsToCommit,
                                 group_instance_id: str | None = None) -> None:  # fmt: skip
        """TxnOffsetCommit (KIP-98, KIP-447): the offsets are written as the producer's
        transactional records and become the group's committed offsets only when its
        transaction commits (`complete_txn`); an abort drops them (see
        OffsetMetadataManager.txn_commit_offsets for the member's check)."""
        if not group_id:
            raise InvalidGroupIdError("a consumer group needs a non-empty group id")
        await self.offsets.txn_commit_offsets(group_id, transactional_id, producer_id, producer_epoch, generation,
                                              member_id, offsets, group_instance_id)  # fmt: skip

    def complete_txn(self, producer_id: int, commit: bool) -> None:
        """The producer's transaction marker is in the log (see OffsetMetadataManager.complete_txn)."""
        self.offsets.complete_txn(producer_id, commit)

    def pending_partitions(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions with transactional offsets awaiting their marker."""
        return self.offsets.pending_partitions(group_id)

    async def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None = None, require_stable: bool = False,
        member_id: str | None = None, member_epoch: int = -1,
    ) -> dict[TopicPartition, CommittedOffset]:
        """OffsetFetch (OffsetMetadataManager.fetch_offsets)."""
        return self.offsets.fetch_offsets(group_id, partitions, require_stable, member_id, member_epoch)

    def committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        """Every group's committed offsets (for the broker's consumer-lag gauge)."""
        return self.offsets.committed_offsets()

    # ------------------------------------------------------------------ expiry and deletion

    async def expire_offsets(self, now_ms: int | None = None) -> int:
        """Writes tombstones for the offsets that expired and deletes the groups left with
        neither members nor offsets (see the module docstring), group by group, a failure
        costing only its group this time; returns how many offsets expired."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        expired = 0
        for group_id in sorted(set(self.offsets.committed) | set(self.classic_groups.groups)):
            try:
                expired += await self._expire_group(group_id, now_ms)
            except Exception as e:  # not leading any more, or the write failed: next time
                logger.warning("group %s: offset expiry failed: %r", group_id, e)
        return expired

    async def _expire_group(self, group_id: str, now_ms: int) -> int:
        if self._has_members(group_id):
            return 0  # a group with members keeps its offsets (and need not wait for the lock)
        async with self._lock(group_id):
            group = self.classic_groups.groups.get(group_id)
            if group is not None and group.members:
                return 0
            # A group that had generations expires as one; a standalone consumer's offsets each by its commit.
            empty_since_ms = group.empty_since_ms if group is not None and group.generation > 0 else None
            expired = await self.offsets.tombstone(group_id, self.offsets.expired(group_id, empty_since_ms, now_ms))
            await self._delete_if_unused(group_id)
            return expired

    async def delete_group(self, group_id: str) -> None:
        """DeleteGroups: tombstones for the group and its offsets (a share group's: and its
        share-partitions' states)."""
        async with self._lock(group_id):
            if group_id in self.share.groups:
                await self.share.delete_group(group_id)
                return
            group = self.classic_groups.groups.get(group_id)
            if self._has_members(group_id):
                raise NonEmptyGroupError(f"group {group_id!r} has members; it can be deleted once they have left")
            gone = dict(self.offsets.table(group_id))
            if not gone and (group is None or group.generation == 0) and group_id not in self.consumer_groups.groups:
                raise GroupIdNotFoundError(f"consumer group {group_id!r} does not exist")
            await self.offsets.tombstone(group_id, gone)
            await self._delete_if_unused(group_id)  # (a commit or a member that came meanwhile keeps it)

    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> dict[TopicPartition, KafkaError | None]:
        """OffsetDelete (OffsetMetadataManager.delete_offsets), under the group's lock."""
        async with self._lock(group_id):
            return await self.offsets.delete_offsets(group_id, partitions)

    async def _delete_if_unused(self, group_id: str) -> None:
        """A group with neither members nor offsets is deleted (its record tombstoned);
        the caller holds the group's lock."""
        if self.offsets.in_use(group_id):
            return
        await self.consumer_groups.delete_if_empty(group_id)
        await self.classic_groups.delete_if_empty(group_id)

    # ------------------------------------------------------------------ inspection

    async def list_groups(self) -> list[dict[str, Any]]:
        """Every group here: its id, state, protocol type and type ("classic", "consumer" or "share")."""
        share, consumer = self.share.groups, self.consumer_groups.groups
        names = set(self.classic_groups.groups) | set(self.offsets.committed) | set(consumer) | set(share)
        return [{**self._summary(g), "group_type": ("share" if g in share else "consumer" if g in consumer else "classic")}
                for g in sorted(names)]  # fmt: skip

    def _summary(self, group_id: str) -> dict[str, Any]:
        share_group = self.share.groups.get(group_id)
        if share_group is not None:
            return {"group_id": group_id, "state": share_group.state, "protocol_type": "share"}
        consumer_group = self.consumer_groups.groups.get(group_id)
        if consumer_group is not None:
            return {"group_id": group_id, "state": consumer_group.state.value, "protocol_type": "consumer"}
        group = self.classic_groups.groups.get(group_id)
        if group is None:  # only committed offsets left: Empty; nothing at all: Dead (Kafka's answers)
            state = GroupState.EMPTY if self.offsets.committed.get(group_id) else GroupState.DEAD
            return {"group_id": group_id, "state": state.value, "protocol_type": "consumer"}
        return {"group_id": group_id, "state": group.state.value, "protocol_type": group.protocol_type or "consumer"}

    async def describe_group(self, group_id: str, consumer_protocol_too: bool = False) -> dict[str, Any]:
        """A classic group as DescribeGroups shows it. A consumer-protocol group is
        GROUP_ID_NOT_FOUND there, as in Kafka; with `consumer_protocol_too` (rayk's Admin)
        it is shown in the same shape (ConsumerProtocolGroupManager.describe_as_classic)."""
        self._refuse_share_group(group_id)
        consumer_group = self.consumer_groups.groups.get(group_id)
        if consumer_group is not None and not consumer_protocol_too:
            raise GroupIdNotFoundError(f"group {group_id!r} is a consumer-protocol group: ConsumerGroupDescribe "
                                       "describes it")  # fmt: skip
        described = (self.consumer_groups.describe_as_classic(consumer_group) if consumer_group is not None
                     else self.classic_groups.describe(group_id))  # fmt: skip
        offsets = {tp: c.offset for tp, c in self.offsets.table(group_id).items()}
        return {**self._summary(group_id), **described, "offsets": offsets}

    # ------------------------------------------------------------------ consumer-protocol groups (KIP-848)

    async def consumer_heartbeat(self, group_id: str, heartbeat: ConsumerHeartbeat,
                                 partition_counts: dict[str, int] | None = None) -> HeartbeatAnswer:  # fmt: skip
        """One ConsumerGroupHeartbeat (ConsumerProtocolGroupManager.heartbeat)."""
        return await self.consumer_groups.heartbeat(group_id, heartbeat, partition_counts)

    async def expire_consumer_members(self, group_id: str, now_ms: int | None = None) -> list[str]:
        return await self.consumer_groups.expire_members(group_id, now_ms)

    async def describe_consumer_group(self, group_id: str) -> dict[str, Any]:
        return self.consumer_groups.describe(group_id)

    # ------------------------------------------------------------------ share groups (KIP-932): ShareCoordinator's

    async def share_heartbeat(
        self, group_id: str, member_id: str, member_epoch: int, subscribed_topics: Iterable[str] | None = None,
        client_id: str = "", client_host: str = "", rack_id: str | None = None,
        partition_counts: dict[str, int] | None = None,
    ) -> ShareHeartbeatAnswer:
        return await self.share.heartbeat(group_id, member_id, member_epoch, subscribed_topics, client_id, client_host,
                                          rack_id, partition_counts)  # fmt: skip

    async def expire_share_members(self, group_id: str, now_ms: int | None = None) -> list[str]:
        return await self.share.expire_members(group_id, now_ms)

    def share_group_configs(self, group_id: str) -> dict[str, str]:
        return self.share.group_configs(group_id)

    async def alter_share_group_configs(self, group_id: str, configs: dict[str, str], replace: bool = False) -> None:
        await self.share.alter_group_configs(group_id, configs, replace)

    async def read_share_state(self, group_id: str, topic: str, partition: int,
                               leader_epoch: int) -> tuple[ShareStateRecord | None, int, str]:  # fmt: skip
        return await self.share.read_state(group_id, topic, partition, leader_epoch)

    async def write_share_state(self, group_id: str, topic: str, partition: int, leader_epoch: int, state_epoch: int,
                                start_offset: int, batches: list[tuple[int, int, str, int]],
                                create: bool = False) -> None:  # fmt: skip
        await self.share.write_state(group_id, topic, partition, leader_epoch, state_epoch, start_offset, batches, create)

    def share_group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        return self.share.group_offsets(group_id)

    def describe_share_group(self, group_id: str) -> dict[str, Any]:
        return self.share.describe_group(group_id)

    async def alter_share_group_offsets(self, group_id: str, start_offsets: dict[TopicPartition, int]) -> None:
        await self.share.alter_group_offsets(group_id, start_offsets)

    async def delete_share_group_offsets(self, group_id: str, topics: Iterable[str]) -> None:
        await self.share.delete_group_offsets(group_id, topics)
