"""LogLifecycle: a replica's log as its broker keeps it (the parts of Kafka's UnifiedLog and
LogManager that are per log): offsets published to the broker, retention, compaction,
close and delete.

The broker's board (replica_board.py): from its first role on, the replica publishes its
log's offsets (recovery point, log start, HW, cleaner offset) and size into its slot on a
timer of its own; the broker reads them for its checkpoints and gauges, and takes each
publication for a sign of life. A follower's truncation lowers offsets it published: those
go out at once (`after_follower_progress`). Each publication also adds the replica's
counts to Ray's counters (rayk/metrics.py), so an idle partition's last ones do not wait.

Retention deletes whole segments past retention.ms / retention.bytes when the broker asks.
Compaction (log_cleaner.py) runs in a thread of its own while appends and fetches go on,
one clean at a time; closing or deleting the log stops it first, so the log's files are
not touched by it afterwards.

Lifecycle: publishing starts with the first role and stops, for good, when the log closes
or is deleted; the final offsets go to the broker with close's answer. Not thread-safe:
the replica actor's event loop (the cleaner's thread gets the Log only).
"""

from __future__ import annotations

import asyncio
import logging

from rayk.replication.replica_board import BoardSlot, SlotWriter
from rayk.replication.replica_context import ReplicaContext, wall_clock_ms
from rayk.storage import Log, log_cleaner
from rayk.storage.log_cleaner import CleanableState, CleanResult
from rayk.storage.log_dir_checkpoints import PartitionOffsets

logger = logging.getLogger(__name__)


def offsets_of(log: Log) -> PartitionOffsets:
    """What the broker's checkpoints record for `log`; a cleaner offset only if it compacts, as Kafka."""
    cleaner_offset = log.cleaner_offset if log.config.compacts else None
    return PartitionOffsets(log.recovery_point, log.log_start_offset, log.high_watermark, cleaner_offset)


class LogLifecycle:
    """A replica's board publications, retention, cleaning, close and delete (see the
    module docstring)."""

    def __init__(self, ctx: ReplicaContext, board_slot: BoardSlot | None) -> None:
        """`board_slot`: where this replica publishes to its broker; None: nowhere (a replica
        used on its own)."""
        self._ctx = ctx
        self._board = None if board_slot is None else SlotWriter(board_slot)
        self._publishing: asyncio.TimerHandle | None = None  # the next publication, while it leads or follows
        self._published: PartitionOffsets | None = None  # the offsets last published
        self._cleaning: asyncio.Future | None = None  # the log cleaner's thread, while it runs

    # ------------------------------------------------------------------ the broker's board

    def start_publishing(self) -> None:
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
            logger.exception("%s: publishing on the broker's board failed", self._ctx.name)
        finally:
            self._publishing = asyncio.get_running_loop().call_later(board.slot.publish_interval_ms / 1000, self._publish)

    def _publish_offsets(self) -> None:
        """The log's offsets and size on the broker's board, and the counts not yet added to
        Ray's counters (an idle partition's last ones would wait else)."""
        assert self._board is not None
        log = self._ctx.log
        self._ctx.counters.flush()
        self._published = offsets_of(log)
        self._board.publish(self._published, log.size_bytes)

    def after_follower_progress(self) -> None:
        """The follower appended, moved its HW, or truncated. A truncation lowers offsets it
        published: those go out at once, so that the broker never checkpoints a recovery
        point or HW above what the log now holds for longer than before (a cleaner offset
        is below the HW, so it is lowered with it). Two comparisons per append."""
        self._ctx.events.notify_change()
        published, log = self._published, self._ctx.log
        if published is not None and self._board is not None and (
            log.high_watermark < published.high_watermark or log.recovery_point < published.recovery_point
        ):
            self._publish_offsets()

    def _stop_publishing(self) -> None:
        if self._publishing is not None:
            self._publishing.cancel()
            self._publishing = None
        if self._board is not None:
            self._board.close()
            self._board = None

    # ------------------------------------------------------------------ retention and cleaning

    def enforce_retention(self) -> int:
        """Deletes whole segments past retention.ms / retention.bytes; returns how many."""
        return self._ctx.log.delete_expired_segments()

    async def cleanable_state(self) -> CleanableState | None:
        """How dirty this log is (None: the topic is not compacted)."""
        log = self._ctx.log
        if not log.config.compacts:
            return None
        return await asyncio.to_thread(log_cleaner.cleanable_state, log, wall_clock_ms())

    async def clean_log(self, max_bytes_per_second: float, dedupe_buffer_bytes: int) -> CleanResult | None:
        """Compacts this log in a thread (see PartitionReplica.clean_log); None: it does not
        compact, or a clean runs already."""
        log = self._ctx.log
        if not log.config.compacts or self._cleaning is not None:
            return None
        throttler = log_cleaner.Throttler(max_bytes_per_second)
        self._cleaning = asyncio.ensure_future(
            asyncio.to_thread(log_cleaner.clean, log, wall_clock_ms(), dedupe_buffer_bytes=dedupe_buffer_bytes,
                              throttler=throttler)
        )
        try:
            return await asyncio.shield(self._cleaning)
        finally:
            if self._cleaning is not None and self._cleaning.done():
                self._cleaning = None

    async def _stop_cleaning(self) -> None:
        """A clean in its thread stops at its next read, and the log's files are not touched
        by it once this returns."""
        cleaning, self._cleaning = self._cleaning, None
        if cleaning is not None:
            self._ctx.log.abort_cleaning()
            await asyncio.gather(cleaning, return_exceptions=True)

    # ------------------------------------------------------------------ the end

    async def close(self) -> PartitionOffsets:
        """Stops publishing and cleaning, flushes and closes the log (data stays on disk);
        returns the final offsets for the broker's checkpoints."""
        await self._stop()
        self._ctx.log.close()
        return offsets_of(self._ctx.log)

    async def delete(self) -> None:
        """Stops publishing and cleaning and removes the log's directory."""
        await self._stop()
        self._ctx.log.delete()

    async def _stop(self) -> None:
        self._stop_publishing()
        self._ctx.counters.flush()
        await self._stop_cleaning()
