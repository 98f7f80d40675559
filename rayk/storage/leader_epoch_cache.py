"""Kafka's LeaderEpochFileCache: which leader epoch began at which log offset.

This module owns one partition's leader epoch history: an ascending list of
`EpochEntry(epoch, start_offset)`, where `start_offset` is the first offset written
under `epoch`. Followers use it (via `end_offset_for`, Kafka's OffsetsForLeaderEpoch) to
find where their log diverges from the leader's and truncate there.

Invariant, checked after every change: epochs strictly increase and start offsets
strictly increase along the list.

Persistence: with a `LeaderEpochCheckpointFile` the whole list is rewritten (atomically,
see `rayk.storage.checkpoint` for the `0 / count / "epoch start_offset"` text format)
after every change and loaded when the cache is built; with `None` it lives in memory
only. The new list is written *before* it replaces the in-memory one, so if the write
fails (`KafkaStorageError`) the cache still equals the file and the caller can take the
log directory offline without the two disagreeing. A crash mid-write leaves the previous
file, which the log's recovery can bring forward again by re-assigning epochs from the
batches it rescans.

Thread-safety: not thread-safe; the owner serialises calls.
"""

from __future__ import annotations

from collections.abc import Iterable

from rayk.storage.checkpoint import EpochEntry, LeaderEpochCheckpointFile

__all__ = ["UNDEFINED_EPOCH", "UNDEFINED_EPOCH_OFFSET", "EpochEntry", "LeaderEpochCache"]

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    """Leader epoch -> start offset, ascending, optionally persisted to a checkpoint."""

    def __init__(self, checkpoint: LeaderEpochCheckpointFile | None) -> None:
        self._checkpoint = checkpoint
        self._entries: list[EpochEntry] = []
        if checkpoint is not None:
            # Re-apply each stored entry through the same conflict rule as assign(), as
            # Kafka does, so a hand-edited or out-of-order file still yields a valid
            # cache. Nothing is written back: the file is only rewritten on a change.
            entries: list[EpochEntry] = []
            for entry in checkpoint.read():
                entries = _assigned(entries, entry) or entries
            _check_invariant(entries)
            self._entries = entries

    @property
    def checkpoint(self) -> LeaderEpochCheckpointFile | None:
        return self._checkpoint

    @property
    def entries(self) -> list[EpochEntry]:
        """A copy of the entries, ascending."""
        return list(self._entries)

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def latest_epoch(self) -> int:
        """The newest epoch, or `UNDEFINED_EPOCH` if the cache is empty."""
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` began at `start_offset` (called for each appended batch).

        A negative epoch (a batch from before leader epochs existed) is ignored. Entries
        that conflict with the new one (epoch >= `epoch` or start offset >=
        `start_offset`) are removed first, so the list stays monotonic.
        """
        if epoch < 0:
            return
        if start_offset < 0:
            raise ValueError(f"leader epoch {epoch} cannot start at negative offset {start_offset}")
        new_entries = _assigned(self._entries, EpochEntry(epoch, start_offset))
        if new_entries is not None:
            self._replace(new_entries)

    def recover(self, rescanned_from_offset: int, found: Iterable[EpochEntry], compacted_below_offset: int = 0) -> None:
        """Brings the cache forward from the batches crash recovery re-read (Kafka's
        LogSegment.recover assigns each rescanned batch's partitionLeaderEpoch).

        `found` holds, in log order, the (epoch, base offset) of re-read batches; only those
        where the epoch changes are needed. Every batch from `rescanned_from_offset` on was
        re-read, so entries starting there or later are dropped and re-derived from `found`:
        a lost or stale checkpoint cannot outvote the log. Batches before it (segments
        re-read only to rebuild an index) add an epoch only when it is newer than any
        known, as in Kafka, since the entries after them were not re-derived. Below
        `compacted_below_offset` (the log cleaner's offset) compaction may have removed an
        epoch's first batches, so there the checkpoint's earlier start for an epoch stands.
        Written once, if anything changed.
        """
        known_starts = {e.epoch: e.start_offset for e in self._entries}
        entries = [e for e in self._entries if e.start_offset < rescanned_from_offset]
        for entry in found:
            if entry.epoch < 0:
                continue
            known_start = known_starts.get(entry.epoch, entry.start_offset)
            if entry.start_offset < compacted_below_offset and known_start < entry.start_offset:
                entry = EpochEntry(entry.epoch, known_start)
            if entry.start_offset >= rescanned_from_offset or not entries or entry.epoch > entries[-1].epoch:
                entries = _assigned(entries, entry) or entries
        if entries != self._entries:
            self._replace(entries)

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch answer: (epoch, end offset of that epoch).

        The end offset of an epoch is the start offset of the next higher epoch in the
        cache, or `log_end_offset` for the latest epoch. If `requested_epoch` is not in
        the cache the returned epoch is the largest cached epoch below it (or the
        requested epoch itself if there is none), paired with the start of the first
        epoch above it. `(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)` if the requested
        epoch is undefined, above the latest epoch, or the cache is empty.
        """
        undefined = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return undefined
        if requested_epoch == self._entries[-1].epoch:
            return (requested_epoch, log_end_offset)
        higher = next((e for e in self._entries if e.epoch > requested_epoch), None)
        if higher is None:
            return undefined
        floor = next((e for e in reversed(self._entries) if e.epoch <= requested_epoch), None)
        if floor is None:
            # Older than anything we know: the requester's epoch ends where ours begin.
            return (requested_epoch, higher.start_offset)
        return (floor.epoch, higher.start_offset)

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after `end_offset` (the log was truncated to it).

        A negative `end_offset` (undefined) changes nothing.
        """
        if end_offset < 0 or not self._entries or self._entries[-1].start_offset < end_offset:
            return
        self._replace([e for e in self._entries if e.start_offset < end_offset])

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget epochs wholly below the new log start offset `start_offset`.

        The epoch containing `start_offset` (the last entry starting at or below it) is
        kept, with its start moved up to `start_offset`, because offsets from there on
        still belong to it.
        """
        below = [e for e in self._entries if e.start_offset <= start_offset]
        if not below:
            return
        kept = EpochEntry(below[-1].epoch, start_offset)
        new_entries = [kept] + self._entries[len(below):]
        if new_entries != self._entries:
            self._replace(new_entries)

    def clear(self) -> None:
        """Remove every entry (and persist the empty list)."""
        self._replace([])

    def _replace(self, new_entries: list[EpochEntry]) -> None:
        _check_invariant(new_entries)
        if self._checkpoint is not None:
            # Disk first: if this raises, memory still matches the file.
            self._checkpoint.write(new_entries)
        self._entries = new_entries

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self._entries!r})"


def _assigned(entries: list[EpochEntry], new: EpochEntry) -> list[EpochEntry] | None:
    """`entries` with `new` assigned, or None if nothing changes.

    Kafka's isUpdateNeeded: the latest epoch again is a no-op unless it now starts
    earlier (the log was rewritten below the old start), in which case the earlier start
    wins -- the cache keeps the *first* offset of each epoch.
    """
    if entries:
        latest = entries[-1]
        if latest.epoch == new.epoch and latest.start_offset <= new.start_offset:
            return None
    # Because the list is monotonic, the conflicting entries are a suffix of it.
    kept = len(entries)
    while kept > 0 and (entries[kept - 1].epoch >= new.epoch or entries[kept - 1].start_offset >= new.start_offset):
        kept -= 1
    return entries[:kept] + [new]


def _check_invariant(entries: list[EpochEntry]) -> None:
    for prev, cur in zip(entries, entries[1:]):
        assert prev.epoch < cur.epoch and prev.start_offset < cur.start_offset, (
            f"leader epoch cache out of order: {prev} then {cur} in {entries}"
        )
