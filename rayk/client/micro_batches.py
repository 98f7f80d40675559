"""MicroBatches: a topic read as consecutive micro-batches whose progress is a consumer
group's committed offsets: the offsets half of rayk.data.stream_topic and
rayk.spark.stream_topic (Spark's foreachBatch shape; the other half reads the ranges).

A batch is, per partition, the offset range from where the previous batch ended to the
partition's high watermark when the batch is planned: the records that arrived since
the last batch, committed ones only. With `max_records_per_batch` the ranges are cut to
that many records in all, shared among the partitions in proportion to their backlog,
at least one each (Spark's maxOffsetsPerTrigger). `next_batch` plans one every `trigger_ms` (Spark's
processing-time trigger: a batch that ran longer than the trigger is followed at once);
a trigger with nothing new plans nothing, and the next one looks again no sooner than
IDLE_POLL_MS later.

Progress lives in the group's committed offsets, and the commit's metadata carries the
batch ids, so that a stream started again (a new driver, after a crash) picks up where
the last one was, as Spark's checkpointed offset log does:
- before a batch is handed out, its ends are committed as *planned* (the offsets stay
  the previous batch's ends, the metadata names the batch id and its ends);
- after the caller has processed it, `commit` commits its ends as the offsets.
A stream that finds a planned batch hands that batch out again, same id, same ranges:
every record is processed at least once, none is skipped, and a sink can use the batch
id to write each batch once (Spark's advice for foreachBatch). A batch whose processing
raised is never committed.

A group with no committed offset for the topic starts at `starting_offsets`: "latest"
(the records that arrive after the stream starts, Spark's default for streams),
"earliest", or per partition as in read_topic (-1 and -2 allowed); that start is
committed at once, so a crash before the first batch skips nothing. Partitions the topic
gains later are read from their start. A position below the partition's log start
(retention deleted records before they were processed) or past its high watermark (the
log was cut below what the stream read, or the topic made anew) raises
OFFSET_OUT_OF_RANGE, or, with `fail_on_data_loss=False`, goes on from the log start or
the high watermark (Spark's failOnDataLoss).

The group holds offsets only, as Spark's Kafka source uses none: a stream does not join
it and reads every partition. One stream per group runs at a time: before each commit a
stream checks that the group's offsets are still what it last committed, and fails with
FENCED_INSTANCE_ID if another stream (a driver thought dead, still running) or consumer
committed since, so that two streams never hand out the same batch id for different
records. (The check is not atomic with the commit; it catches a stale driver at its next
commit, not two commits racing within milliseconds.)

With `exactly_once`, what the caller writes to rayk topics while a batch is out and the
batch's offsets are one transaction (rayk.client.batch_transactions): the batch's output
is committed with its end, or aborted. The planned ends are still written ahead (outside
the transaction), so that a batch processed again keeps its id and ranges. Such a stream
is fenced by its transactional id instead of the check above: a newer stream of the
group and topic fences the older one atomically (PRODUCER_FENCED at its next write or
commit).

Not thread-safe, except `stop`, which may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from rayk.client.batch_transactions import DEFAULT_TRANSACTION_TIMEOUT_MS, BatchTransactions
from rayk.client.offset_ranges import EARLIEST, LATEST, OffsetRange, OffsetSpec, parse_offsets, read_committed_of
from rayk.client.types import OffsetAndMetadata, TopicPartition
from rayk.errors import FencedInstanceIdError, InvalidConfigurationError, OffsetOutOfRangeError

logger = logging.getLogger(__name__)

METADATA_KEY = "rayk.stream"
IDLE_POLL_MS = 100  # after a trigger found nothing new, the soonest the next one looks (Spark: pollingDelay)


class MicroBatches:
    """One stream's planner of micro-batches: owns the next batch's start per partition, the
    batch id, a planned batch to hand out again, the stream's last commit, its offsets-only
    Consumer and, with `exactly_once`, its BatchTransactions. Made by a stream_topic call,
    closed with it; not thread-safe except `stop`."""

    def __init__(
        self,
        cluster: Any,
        topic: str,
        group_id: str,
        *,
        trigger_ms: int = 1000,
        max_records_per_batch: int | None = None,
        starting_offsets: OffsetSpec = "latest",
        fail_on_data_loss: bool = True,
        isolation_level: str | None = None,
        exactly_once: bool = False,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
    ) -> None:
        if not group_id:
            raise InvalidConfigurationError("a stream needs a group_id: its progress is the group's committed offsets")
        if trigger_ms < 0 or (max_records_per_batch is not None and max_records_per_batch < 1):
            raise InvalidConfigurationError("trigger_ms must be >= 0 and max_records_per_batch >= 1")
        self.topic, self.group_id = topic, group_id
        self._trigger_s = trigger_ms / 1000
        self._max_records = max_records_per_batch
        self._fail_on_data_loss = fail_on_data_loss
        self._cluster = cluster
        cluster.describe_topic(topic)  # UNKNOWN_TOPIC_OR_PARTITION before anything else
        if isolation_level is None:
            isolation_level = "read_committed" if exactly_once else "read_uncommitted"
        self._read_committed = read_committed_of(isolation_level)  # batches end at the LSO, read committed
        if exactly_once and not self._read_committed:
            raise InvalidConfigurationError("an exactly_once stream reads read_committed: it must not act on records that may be aborted")
        self._consumer = cluster.consumer(group_id=group_id, enable_auto_commit=False, isolation_level=isolation_level)
        self._stopped = threading.Event()
        self._next_start_s = time.monotonic()
        self._positions: dict[int, int] = {}  # where the next batch starts, per partition
        self._written: dict[TopicPartition, OffsetAndMetadata] = {}  # this stream's last commit
        self.batch_id = 0  # the id of the next batch
        self._replay_ends: dict[int, int] | None = None  # a planned batch never committed
        self.transactions: BatchTransactions | None = None  # exactly_once: the batches' transactions
        try:
            if exactly_once:  # first: fences an older stream of the group before its offsets are read
                self.transactions = BatchTransactions(cluster, group_id, topic, transaction_timeout_ms)
            self._resume(starting_offsets)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ starting

    def _resume(self, starting_offsets: OffsetSpec) -> None:
        partitions = self._partition_count()
        tps = [TopicPartition(self.topic, p) for p in range(partitions)]
        self._consumer.assign(tps)
        committed = self._consumer.committed_offsets(tps)
        if not committed:  # a new stream: start where asked, and say so at once (a crash then skips nothing)
            self._positions = self._starting_offsets(starting_offsets, partitions)
            self._commit(self._positions)
            return
        planned: dict[int, int] = {}
        for tp in tps:
            found = committed.get(tp)
            if found is None:  # the topic grew before that partition's first batch: all of it
                self._positions[tp.partition] = self._log_start(tp.partition)
                continue
            self._positions[tp.partition] = found.offset
            state = _parse_metadata(found.metadata)
            self.batch_id = max(self.batch_id, state.get("next", 0))
            if "end" in state:
                planned[tp.partition] = state["end"]
        self._written = dict(committed)
        if planned:
            self._replay_ends = {p: planned.get(p, position) for p, position in self._positions.items()}
            logger.info("%s/%s: batch %d was planned and not committed; handing it out again", self.group_id, self.topic, self.batch_id)

    def _starting_offsets(self, spec: OffsetSpec, partitions: int) -> dict[int, int]:
        if spec in ("earliest", "latest"):
            offsets = {p: EARLIEST if spec == "earliest" else LATEST for p in range(partitions)}
        else:
            offsets = parse_offsets(spec, self.topic, partitions, starting=True, streaming=True)
        ends = self._ends() if LATEST in offsets.values() else {}
        return {
            p: self._log_start(p) if offset == EARLIEST else ends[p] if offset == LATEST else offset
            for p, offset in offsets.items()
        }

    def _partition_count(self) -> int:
        return len(self._cluster.describe_topic(self.topic))

    def _log_start(self, partition: int) -> int:
        tp = TopicPartition(self.topic, partition)
        return self._consumer.beginning_offsets([tp])[tp]

    def _ends(self) -> dict[int, int]:
        """Each partition's high watermark, or last stable offset when read_committed (the
        end of what a batch may read)."""
        tps = [TopicPartition(self.topic, p) for p in self._positions] or [
            TopicPartition(self.topic, p) for p in range(self._partition_count())
        ]
        return {tp.partition: hw for tp, hw in self._consumer.end_offsets(tps).items()}

    # ------------------------------------------------------------------ batches

    def next_batch(self) -> list[OffsetRange] | None:
        """The ranges of the next batch (non-empty ones only), once its trigger time has
        come and it holds records; None once `stop` was called."""
        while not self._stopped.is_set():
            if self._replay_ends is not None:
                ends, self._replay_ends = self._replay_ends, None
                self._check_positions(self._ends())
                ranges = self._ranges(ends)
                if ranges:
                    return self._handed_out(ranges)
            wait_s = self._next_start_s - time.monotonic()
            if wait_s > 0 and self._stopped.wait(wait_s):
                break
            self._next_start_s = max(self._next_start_s + self._trigger_s, time.monotonic())
            ranges = self._plan()
            if ranges:
                self._commit(self._positions, planned_ends={r.partition: r.end for r in ranges})
                return self._handed_out(ranges)
            self._next_start_s = max(self._next_start_s, time.monotonic() + IDLE_POLL_MS / 1000)
        return None

    def _handed_out(self, ranges: list[OffsetRange]) -> list[OffsetRange]:
        if self.transactions is not None:
            self.transactions.begin()
        return ranges

    def _plan(self) -> list[OffsetRange]:
        partitions = self._partition_count()
        if partitions > len(self._positions):  # the topic grew: read the new partitions whole
            self._consumer.assign([TopicPartition(self.topic, p) for p in range(partitions)])
            for p in range(len(self._positions), partitions):
                self._positions[p] = self._log_start(p)
        ends = self._ends()
        logger.debug("%s/%s: planning batch %d at positions %s, ends %s", self.group_id, self.topic, self.batch_id,
                     self._positions, ends)
        self._check_positions(ends)
        lags = {p: ends[p] - self._positions[p] for p in self._positions}
        budget = _share(lags, self._max_records) if self._max_records is not None else lags
        return self._ranges({p: self._positions[p] + budget[p] for p in self._positions})

    def _check_positions(self, ends: dict[int, int]) -> None:
        """Data loss: a position below the log start (retention deleted records before the
        stream read them) or past the high watermark (the log was cut below what the
        stream read, or the topic was made anew). Raises OFFSET_OUT_OF_RANGE, or with
        fail_on_data_loss=False moves to the log start / the high watermark, as Spark does."""
        tps = [TopicPartition(self.topic, p) for p in self._positions]
        for tp, log_start in self._consumer.beginning_offsets(tps).items():
            position, end = self._positions[tp.partition], ends[tp.partition]
            if log_start <= position <= end:
                continue
            if position < log_start:
                moved, message = log_start, f"records [{position}, {log_start}) were deleted before this stream read them"
            else:
                moved, message = end, f"the log ends at {end}, before this stream's position {position}"
            message = f"{tp.topic}-{tp.partition}: {message}"
            if self._fail_on_data_loss:
                raise OffsetOutOfRangeError(message + " (fail_on_data_loss=False goes on from there)")
            logger.warning("%s; going on from %d", message, moved)
            self._positions[tp.partition] = moved

    def _ranges(self, ends: dict[int, int]) -> list[OffsetRange]:
        leaders = {d["partition"]: d["leader"] for d in self._cluster.describe_topic(self.topic)}
        return [
            OffsetRange(self.topic, p, self._positions[p], end, leaders.get(p, -1), self._read_committed)
            for p, end in sorted(ends.items())
            if end > self._positions[p]
        ]

    # ------------------------------------------------------------------ progress

    def commit(self, ranges: list[OffsetRange]) -> None:
        """The batch `ranges` (the last `next_batch` answer) was processed: commits its
        ends, and the next batch gets the next id."""
        for r in ranges:
            assert r.start == self._positions[r.partition], f"{r} does not start at the position {self._positions[r.partition]}"
        positions = {**self._positions, **{r.partition: r.end for r in ranges}}
        self._commit(positions, next_batch_id=self.batch_id + 1)
        self._positions = positions
        self.batch_id += 1

    def _commit(self, positions: dict[int, int], planned_ends: dict[int, int] | None = None,
                next_batch_id: int | None = None) -> None:  # fmt: skip
        """Commits `positions` with the stream's state: the next batch's id and, for a
        batch about to be handed out, its ends (written ahead). First checks that the
        group's offsets are still what this stream last committed: another stream of the
        group (a driver thought dead, still running) would make the ids ambiguous. An
        exactly_once stream leaves that to its transactional id: a newer stream fenced it."""
        tps = [TopicPartition(self.topic, p) for p in positions]
        if self._written and self.transactions is None:  # (exactly_once: the producer's fencing does it, atomically)
            now = self._consumer.committed_offsets(tps)
            changed = [tp.partition for tp in self._written if now.get(tp) != self._written[tp]]
            if changed:
                raise FencedInstanceIdError(
                    f"group {self.group_id!r} got commits for {self.topic} partitions {changed} from another stream or "
                    "consumer since this stream's last commit: one stream per group at a time"
                )
        batch_id = self.batch_id if next_batch_id is None else next_batch_id
        offsets = {
            tp: OffsetAndMetadata(
                positions[tp.partition],
                _metadata(batch_id, None if planned_ends is None else planned_ends.get(tp.partition, positions[tp.partition])),
            )
            for tp in tps
        }
        if self.transactions is not None and next_batch_id is not None:  # a batch's end, with its writes
            self.transactions.commit(offsets)
        else:
            self._consumer.commit(offsets)
        self._written = offsets

    def stop(self) -> None:
        """Ends the stream: `next_batch` returns None from now on, at once if it is
        waiting (any thread)."""
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def close(self) -> None:
        """Ends the stream; a batch handed out and not committed is aborted (exactly_once)
        or simply left uncommitted."""
        self._stopped.set()
        try:
            if self.transactions is not None:
                self.transactions.close()
        finally:
            self._consumer.close(autocommit=False)


def _share(lags: dict[int, int], max_records: int) -> dict[int, int]:
    """At most `max_records` records in all: one to each partition with a backlog first
    (the largest backlogs first if the budget is smaller; as Spark rounds a share below
    one up to one, so that a partition with little waiting is not starved), the rest in
    proportion to what is left of each backlog, what rounding leaves one record each to
    the largest backlogs."""
    total = sum(lags.values())
    if total <= max_records:
        return dict(lags)
    largest_first = sorted(lags, key=lambda p: (-lags[p], p))
    budget = {p: 0 for p in lags}
    for p in largest_first[:max_records]:
        budget[p] = min(1, lags[p])
    left = max_records - sum(budget.values())
    rest = {p: lags[p] - budget[p] for p in lags}
    rest_total = sum(rest.values())  # > left, since total > max_records
    for p in lags:
        budget[p] += rest[p] * left // rest_total
    left = max_records - sum(budget.values())
    for p in largest_first:
        if left == 0:
            break
        if budget[p] < lags[p]:
            budget[p] += 1
            left -= 1
    return budget


def _metadata(next_batch_id: int, planned_end: int | None = None) -> str:
    state = {"next": next_batch_id} if planned_end is None else {"next": next_batch_id, "end": planned_end}
    return json.dumps({METADATA_KEY: state}, separators=(",", ":"))


def _parse_metadata(text: str) -> dict[str, int]:
    """The stream's state in a commit's metadata ({} for a commit made by anything else)."""
    try:
        state = json.loads(text).get(METADATA_KEY, {}) if text else {}
    except (ValueError, AttributeError):
        return {}
    if not isinstance(state, dict):
        return {}
    return {k: v for k, v in state.items() if k in ("next", "end") and type(v) is int and v >= 0}
