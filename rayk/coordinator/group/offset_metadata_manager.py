"""OffsetMetadataManager: the committed offsets of one `__consumer_offsets` partition's
groups (Kafka's OffsetMetadataManager), a part of the GroupCoordinator that owns it.

It maps group -> (topic, partition) -> CommittedOffset (offset, metadata, commit time,
leader epoch), rebuilt from the partition's offset records on load (a tombstone deletes),
and written with acks=all through the coordinator's append before a commit is answered.
As Kafka's does, it checks a commit, a fetch or an OffsetDelete against the group, which
it reads from the classic and consumer-protocol group managers and never changes: a
classic group's generation and member, a consumer-protocol group's member epoch, the
topics a group's members consume. A commit for a share group's id is refused by the
coordinator before it comes here.

Transactional offsets (TxnOffsetCommit, KIP-98/447) are written as the producer's
transactional records and wait here, by producer id, until its marker: a COMMIT makes them
the groups' committed offsets, an ABORT drops them (`complete_txn`). A plain commit of the
same partition written after them wins whatever the transaction's outcome, as the later
record in the log does in Kafka. Which record is later is decided by their offsets in the
log, kept with each committed and pending offset (Kafka's `olderThan`), never by the order
in which the writes' acks happen to resume them: two commits of one partition whose acks
come in one step are applied as a replay of the log applies them. The marker can follow the records into the log and be
applied while their write still waits for its acks (a transaction aborted on timeout, or
fenced by a new producer instance): the write in flight learns the marker's outcome and
applies it itself, as a replay of the log would (records, then marker), instead of
parking offsets that no marker will end.

Commits run concurrently; each is counted in flight (`committing`) while it is written, so
that expiry and deletion, which write tombstones (`tombstone`), leave alone a partition
being committed, or committed again since they chose what to delete: the log ends with
what memory holds.

Not thread-safe; the owning actor's event loop calls it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from rayk.config import BrokerConfig
from rayk.coordinator.group.classic_group_manager import ClassicGroupManager, subscribed_topics
from rayk.coordinator.group.consumer_protocol_group_manager import (
    CONSUMER_PROTOCOL_TYPE,
    ConsumerProtocolGroupManager,
    check_member_epoch,
)
from rayk.coordinator.group.group_records import RECORDS_PER_APPEND
from rayk.coordinator.group.offset_records import CommittedOffset, OffsetRecord, offset_key, offset_value
from rayk.errors import (
    CoordinatorNotAvailableError,
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    IllegalGenerationError,
    KafkaError,
    NonEmptyGroupError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    OffsetMetadataTooLargeError,
    RequestTimedOutError,
    UnknownMemberIdError,
    UnstableOffsetCommitError,
)

TopicPartition = tuple[str, int]
# records -> the log offset of the first (the batch's base offset), once acknowledged
Append = Callable[[list[tuple[bytes, bytes | None]]], Awaitable[int]]
# (records, transactional id, producer id, producer epoch): a transactional producer's batch
AppendTransactional = Callable[[list[tuple[bytes, bytes | None]], str, int, int], Awaitable[int]]
# An offset as committed, with the log offset of the record (of its batch) that committed it
Written = tuple[CommittedOffset, int]
# per partition (offset, metadata) or (offset, metadata, leader epoch), as a commit request gives them
OffsetsToCommit = dict[TopicPartition, tuple[int, str] | tuple[int, str, int]]


@dataclass(slots=True, eq=False)
class _TxnWrite:
    """A TxnOffsetCommit's records being written: `ended` is the outcome of the producer's
    marker if one was applied meanwhile (True COMMIT, False ABORT), None while none was."""

    ended: bool | None = None


class OffsetMetadataManager:
    """The committed offsets of the groups of one `__consumer_offsets` partition, the
    transactional offsets awaiting their markers, and the commits in flight; written
    through the coordinator's append (see the module docstring)."""

    def __init__(self, config: BrokerConfig, append: Append, append_transactional: AppendTransactional | None,
                 classic_groups: ClassicGroupManager, consumer_groups: ConsumerProtocolGroupManager) -> None:  # fmt: skip
        self._config = config
        self._append = append
        self._append_transactional = append_transactional
        self._classic_groups = classic_groups  # (read only: the groups a commit is checked against)
        self._consumer_groups = consumer_groups
        self.committed: dict[str, dict[TopicPartition, CommittedOffset]] = {}  # group -> partition -> offset
        # group -> partition -> the log offset of the record that committed `committed`'s offset
        self._written_at: dict[str, dict[TopicPartition, int]] = {}
        # TxnOffsetCommit's offsets until their producer's marker: producer id -> group -> partition -> offset
        self._pending_txn: dict[int, dict[str, dict[TopicPartition, Written]]] = {}
        self._txn_writes: dict[int, list[_TxnWrite]] = {}  # TxnOffsetCommits in flight, by producer id
        self._committing: dict[str, Counter[TopicPartition]] = {}  # commits in flight, by group

    # ------------------------------------------------------------------ loading

    def load(self, record: OffsetRecord, log_offset: int) -> None:
        """Replays one offset record, at `log_offset` in the log (a tombstone deletes the offset)."""
        tp = (record.topic, record.partition)
        self._supersede_pending(record.group_id, [tp], log_offset)
        if record.committed is not None:
            self._apply(record.group_id, {tp: (record.committed, log_offset)})
        else:
            self._forget(record.group_id, {tp: self.committed.get(record.group_id, {}).get(tp)})

    def load_pending(self, producer_id: int, record: OffsetRecord, log_offset: int) -> None:
        """Replays one offset record of a transactional producer's batch: pending until its marker."""
        if record.committed is not None:
            self._pending_txn.setdefault(producer_id, {}).setdefault(record.group_id, {})[
                (record.topic, record.partition)] = (record.committed, log_offset)

    # ------------------------------------------------------------------ committing

    async def commit_offsets(self, group_id: str, generation: int, member_id: str, offsets: OffsetsToCommit,
                             group_instance_id: str | None = None) -> None:  # fmt: skip
        """OffsetCommit: writes the offsets (acks=all) if the member may commit, then they
        are the group's committed offsets. A consumer-protocol group checks the member's
        epoch, a classic group its generation and member; a group the coordinator does not
        know takes commits without a generation (a standalone consumer's)."""
        group = self._classic_groups.groups.get(group_id)
        consumer_group = self._consumer_groups.groups.get(group_id)
        if consumer_group is not None:
            check_member_epoch(consumer_group, member_id, generation)
        elif group is not None:
            group.check_commit(generation, member_id, group_instance_id)
        elif generation >= 0:
            raise IllegalGenerationError(f"group {group_id!r} has no generation {generation} here; rejoin")
        committed = self._to_commit(offsets)
        if committed:
            log_offset = await self._write(group_id, committed, self._append)
            self._apply(group_id, {tp: (c, log_offset) for tp, c in committed.items()})
            self._supersede_pending(group_id, committed, log_offset)

    async def txn_commit_offsets(self, group_id: str, transactional_id: str, producer_id: int, producer_epoch: int,
                                 generation: int, member_id: str, offsets: OffsetsToCommit,
                                 group_instance_id: str | None = None) -> None:  # fmt: skip
        """TxnOffsetCommit: writes the offsets as the producer's transactional records,
        which wait for its marker. A member's commit is checked as Kafka checks it: an
        unknown member is UNKNOWN_MEMBER_ID, another generation ILLEGAL_GENERATION; one
        without a member (generation -1) is not checked."""
        if self._append_transactional is None:
            raise KafkaError("this coordinator cannot write transactional offsets")
        group = self._classic_groups.groups.get(group_id)
        consumer_group = self._consumer_groups.groups.get(group_id)
        if consumer_group is not None:
            if member_id or generation >= 0:
                check_member_epoch(consumer_group, member_id, generation)
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

        async def append(records: list[tuple[bytes, bytes | None]]) -> int:
            assert self._append_transactional is not None
            return await self._append_transactional(records, transactional_id, producer_id, producer_epoch)

        write = _TxnWrite()
        writes = self._txn_writes.setdefault(producer_id, [])
        writes.append(write)
        try:
            log_offset = await self._write(group_id, committed, append)
        finally:
            writes.remove(write)
            if not writes and self._txn_writes.get(producer_id) is writes:
                del self._txn_writes[producer_id]
        written = {tp: (c, log_offset) for tp, c in committed.items()}
        if write.ended is None:
            # Not a partition a later record committed meanwhile (a plain commit whose acks came first): a
            # replay of the log has that commit supersede these, whatever the marker says.
            written_at = self._written_at.get(group_id, {})
            pending = self._pending_txn.setdefault(producer_id, {}).setdefault(group_id, {})
            pending.update({tp: w for tp, w in written.items() if written_at.get(tp, -1) < log_offset})
            if not pending:
                self._drop_pending(producer_id, group_id)
        elif write.ended:
            # (Kafka's producer sends EndTxn only once TxnOffsetCommit is answered: a COMMIT here is a client's
            # mistake, but the log commits the records all the same, and memory follows the log.)
            self._apply(group_id, written)

    def complete_txn(self, producer_id: int, commit: bool) -> None:
        """The producer's transaction marker is in the log: its pending offsets become the
        groups' committed offsets (COMMIT) or are dropped (ABORT), and so will those of its
        writes in flight, whose records are before the marker in the log. (A write of the
        producer's next transaction starts only after this marker: the transaction
        coordinator lets the producer add offsets to a new transaction once every marker of
        the last one is acknowledged, which comes after this call.)"""
        pending = self._pending_txn.pop(producer_id, {})
        if commit:
            for group_id, table in pending.items():
                self._apply(group_id, table)
        for write in self._txn_writes.get(producer_id, ()):
            if write.ended is None:  # (a second marker is a later transaction's, not this write's)
                write.ended = commit

    def _apply(self, group_id: str, written: dict[TopicPartition, Written]) -> None:
        """Makes `written` the group's committed offsets, each unless the one it has was
        written later in the log (Kafka's `olderThan`)."""
        table = self.committed.setdefault(group_id, {})
        written_at = self._written_at.setdefault(group_id, {})
        for tp, (committed, log_offset) in written.items():
            if written_at.get(tp, -1) < log_offset:
                table[tp], written_at[tp] = committed, log_offset
        if not table:
            self.committed.pop(group_id, None)
            self._written_at.pop(group_id, None)

    def _supersede_pending(self, group_id: str, partitions: Iterable[TopicPartition], log_offset: int) -> None:
        """A commit (or tombstone) at `log_offset` in the log, after a transactional one of the
        same partition, wins whatever the transaction's outcome: the later record in the log
        decides, as in Kafka. A transactional one written after it stays pending."""
        for producer_id, by_group in list(self._pending_txn.items()):
            table = by_group.get(group_id)
            if table:
                for tp in partitions:
                    if tp in table and table[tp][1] < log_offset:
                        del table[tp]
                if not table:
                    self._drop_pending(producer_id, group_id)

    def _drop_pending(self, producer_id: int, group_id: str) -> None:
        by_group = self._pending_txn.get(producer_id, {})
        by_group.pop(group_id, None)
        if not by_group:
            self._pending_txn.pop(producer_id, None)

    def pending_partitions(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions with transactional offsets awaiting their marker."""
        return {tp for by_group in self._pending_txn.values() for tp in by_group.get(group_id, {})}

    def _to_commit(self, offsets: OffsetsToCommit) -> dict[TopicPartition, CommittedOffset]:
        now_ms = int(time.time() * 1000)
        committed = {}
        for (topic, partition), (offset, metadata, *epoch) in offsets.items():
            if len(metadata.encode()) > self._config.offset_metadata_max_bytes:
                raise OffsetMetadataTooLargeError(
                    f"offset metadata of {len(metadata)} bytes exceeds offset.metadata.max.bytes"
                )
            leader_epoch = epoch[0] if epoch and epoch[0] >= 0 else -1
            committed[(topic, partition)] = CommittedOffset(offset, metadata, now_ms, leader_epoch)
        return committed

    async def _write(self, group_id: str, committed: dict[TopicPartition, CommittedOffset], append: Append) -> int:
        """Writes the offsets' records, marked in flight for expiry meanwhile; returns the log
        offset of the first (the batch's: records of different batches compare as their
        batches do). A write the
        partition could not replicate is COORDINATOR_NOT_AVAILABLE, which clients retry
        (Kafka's GroupMetadataManager.storeOffsets maps it so)."""
        records: list[tuple[bytes, bytes | None]] = [(offset_key(group_id, t, p), offset_value(c))
                                                     for (t, p), c in committed.items()]  # fmt: skip
        in_flight = Counter(committed.keys())
        committing: Counter[TopicPartition] = self._committing.setdefault(group_id, Counter())
        committing += in_flight
        try:
            return await append(records)
        except (NotEnoughReplicasError, NotEnoughReplicasAfterAppendError, RequestTimedOutError) as e:
            raise CoordinatorNotAvailableError(f"the offsets of group {group_id!r} were not replicated: {e}") from None
        finally:
            committing -= in_flight  # (in place; partitions at 0 drop out)
            if not committing and self._committing.get(group_id) is committing:
                del self._committing[group_id]

    # ------------------------------------------------------------------ reading

    def table(self, group_id: str) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets (the manager's own table: not to be changed)."""
        return self.committed.get(group_id, {})

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None = None, require_stable: bool = False,
                      member_id: str | None = None, member_epoch: int = -1) -> dict[TopicPartition, CommittedOffset]:  # fmt: skip
        """OffsetFetch: the group's committed offsets (of `partitions`, or all). With
        `require_stable` (KIP-447, as Kafka's consumers ask), UNSTABLE_OFFSET_COMMIT, which
        clients retry, while a transaction's offsets for them await its marker. A
        consumer-protocol member names itself and its epoch (OffsetFetch v9+), checked as a
        commit's."""
        consumer_group = self._consumer_groups.groups.get(group_id)
        if consumer_group is not None and (member_id or member_epoch >= 0):
            check_member_epoch(consumer_group, member_id or "", member_epoch)
        if require_stable:
            pending = self.pending_partitions(group_id)
            if pending and (partitions is None or pending.intersection(partitions)):
                raise UnstableOffsetCommitError(f"group {group_id!r} has transactional offsets awaiting their marker")
        table = self.committed.get(group_id, {})
        if partitions is None:
            return dict(table)
        return {tp: table[tp] for tp in partitions if tp in table}

    def in_use(self, group_id: str) -> bool:
        """Whether the group has committed offsets, or a commit in flight."""
        return bool(self.committed.get(group_id) or self._committing.get(group_id))

    def committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        """Every group's committed offsets (for the broker's consumer-lag gauge)."""
        return {group: {tp: c.offset for tp, c in table.items()} for group, table in self.committed.items() if table}

    # ------------------------------------------------------------------ deleting

    def expired(self, group_id: str, empty_since_ms: int | None, now_ms: int) -> dict[TopicPartition, CommittedOffset]:
        """The group's offsets past offsets.retention.minutes (KIP-211): all of them once a
        group that had generations has been empty that long (`empty_since_ms`), else (a
        standalone consumer's, None) each that long after its commit."""
        retention_ms = self._config.offsets_retention_minutes * 60_000
        table = self.committed.get(group_id, {})
        if empty_since_ms is not None:
            return dict(table) if now_ms - empty_since_ms >= retention_ms else {}
        return {tp: c for tp, c in table.items() if now_ms - c.commit_timestamp_ms >= retention_ms}

    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> dict[TopicPartition, KafkaError | None]:
        """OffsetDelete (KIP-496), the caller holding the group's lock: per partition None
        (its offset, if it had one, is tombstoned) or GROUP_SUBSCRIBED_TO_TOPIC (a topic
        the group's members consume; all topics while their subscriptions cannot be read);
        raises GROUP_ID_NOT_FOUND for a group with neither members nor offsets,
        NON_EMPTY_GROUP for a classic group with members that is not a consumer group."""
        group = self._classic_groups.groups.get(group_id)
        consumer_group = self._consumer_groups.groups.get(group_id)
        holder = group if group is not None else consumer_group  # (an id is one kind's at a time)
        members = holder is not None and bool(holder.members)
        table = self.committed.get(group_id, {})
        if not members and not table and (group is None or group.generation == 0) and consumer_group is None:
            raise GroupIdNotFoundError(f"consumer group {group_id!r} does not exist")
        if consumer_group is not None:
            subscribed: frozenset[str] | None = consumer_group.subscribed_topics()
        elif members:
            assert group is not None
            if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                raise NonEmptyGroupError(f"group {group_id!r} has members and is not a consumer group")
            subscribed = subscribed_topics(group)
        else:
            subscribed = frozenset()
        results: dict[TopicPartition, KafkaError | None] = {}
        for tp in partitions:
            if subscribed is None or tp[0] in subscribed:
                results[tp] = GroupSubscribedToTopicError(f"group {group_id!r} consumes {tp[0]!r}")
            else:
                results[tp] = None
        gone = {tp: table[tp] for tp, error in results.items() if error is None and tp in table}
        await self.tombstone(group_id, gone)
        return results

    async def tombstone(self, group_id: str, gone: dict[TopicPartition, CommittedOffset]) -> int:
        """Writes tombstones for the offsets `gone`, RECORDS_PER_APPEND a batch, and
        forgets each batch's once it is written; returns how many. Each batch leaves out,
        in the step it is written in, a partition committed again or being committed
        since `gone` was taken: that commit is the newer one, in the log as in memory."""
        items, written = list(gone.items()), 0
        for i in range(0, len(items), RECORDS_PER_APPEND):
            table, committing = self.committed.get(group_id, {}), self._committing.get(group_id, Counter())
            batch = {tp: c for tp, c in items[i:i + RECORDS_PER_APPEND] if table.get(tp) is c and not committing.get(tp)}
            if batch:
                log_offset = await self._append([(offset_key(group_id, t, p), None) for t, p in batch])
                self._forget(group_id, batch)
                self._supersede_pending(group_id, batch, log_offset)
                written += len(batch)
        return written

    def _forget(self, group_id: str, gone: dict[TopicPartition, CommittedOffset | None]) -> None:
        """Deletes each offset of `gone` that is still the one committed. (No commit older
        than the tombstone is applied after it: expiry and deletion leave out partitions
        with commits in flight, and the tombstone supersedes the pending ones.)"""
        table, written_at = self.committed.get(group_id, {}), self._written_at.get(group_id, {})
        for tp, committed in gone.items():
            if tp in table and table[tp] is committed:
                del table[tp]
                written_at.pop(tp, None)
        if not table:
            self.committed.pop(group_id, None)
            self._written_at.pop(group_id, None)
