"""MicroBatches: a topic read as consecutive micro-batches whose progress is a consumer
group's committed offsets: the offsets half of rayk.data.stream_topic and
rayk.spark.stream_topic (Spark's foreachBatch shape; the other half reads the ranges).

A batch is, per partition, the offset range from where the previous batch ended to the
partition's high watermark when the batch is planned: the records that arrived since
the last batch, committed ones only. With `max_records_per_batch` the ranges are cut to
that many records in all, shared among the partitions in proportion to their backlog
(Spark's maxOffsetsPerTrigger). `next_batch` plans one every `trigger_ms` (Spark's
processing-time trigger: a batch that ran longer than the trigger is followed at once);
a trigger with nothing new plans nothing and waits for the next one.

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

Where the group has no committed offset for a partition, the stream starts at
`starting_offsets`: "latest" (the records that arrive after the stream starts, Spark's
default for streams), "earliest", or per partition as in read_topic. Partitions the
topic gains later are read from their start. A position below the partition's log start
(retention deleted records before they were processed) raises OFFSET_OUT_OF_RANGE, or,
with `fail_on_data_loss=False`, moves to the log start (Spark's failOnDataLoss).

The group holds offsets only, as Spark's Kafka source uses none: a stream does not join
it and reads every partition, so two streams of one group would read the same records.
Not thread-safe, except `stop`, which may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from rayk.client.offset_ranges import EARLIEST, LATEST, OffsetRange, OffsetSpec, parse_offsets
from rayk.client.types import OffsetAndMetadata, TopicPartition
from rayk.errors import InvalidConfigurationError, OffsetOutOfRangeError

logger = logging.getLogger(__name__)

METADATA_KEY = "rayk.stream"


class MicroBatches:
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
        self._consumer = cluster.consumer(group_id=group_id, enable_auto_commit=False)
        self._stopped = threading.Event()
        self._next_start_s = time.monotonic()
        self._positions: dict[int, int] = {}  # where the next batch starts, per partition
        self.batch_id = 0  # the id of the next batch
        self._replay: list[OffsetRange] | None = None  # a planned batch never committed
        self._resume(starting_offsets)

    # ------------------------------------------------------------------ starting

    def _resume(self, starting_offsets: OffsetSpec) -> None:
        partitions = self._partition_count()
        self._consumer.assign([(self.topic, p) for p in range(partitions)])
        committed = {p: self._consumer.committed((self.topic, p), metadata=True) for p in range(partitions)}
        starts = None
        planned: dict[int, int] = {}
        for p, found in committed.items():
            if found is None:
                starts = starts or self._starting_offsets(starting_offsets, partitions)
                self._positions[p] = starts[p]
                continue
            self._positions[p] = found.offset
            state = _parse_metadata(found.metadata)
            self.batch_id = max(self.batch_id, state.get("next", 0))
            if "end" in state:
                planned[p] = state["end"]
        if planned:
            self._replay = self._ranges({p: planned.get(p, self._positions[p]) for p in self._positions}) or None
        if self._replay:
            logger.info("%s/%s: batch %d was planned and not committed; handing it out again", self.group_id, self.topic, self.batch_id)

    def _starting_offsets(self, spec: OffsetSpec, partitions: int) -> dict[int, int]:
        if spec in ("earliest", "latest"):
            offsets = {p: EARLIEST if spec == "earliest" else LATEST for p in range(partitions)}
        else:
            offsets = parse_offsets(spec, self.topic, partitions, starting=True)
        out = {}
        for p, offset in offsets.items():
            if offset == EARLIEST:
                offset = self._consumer.beginning_offsets([(self.topic, p)])[TopicPartition(self.topic, p)]
            elif offset == LATEST:
                offset = self._consumer.end_offsets([(self.topic, p)])[TopicPartition(self.topic, p)]
            out[p] = offset
        return out

    def _partition_count(self) -> int:
        return len(self._cluster.describe_topic(self.topic))

    # ------------------------------------------------------------------ batches

    def next_batch(self) -> list[OffsetRange] | None:
        """The ranges of the next batch (non-empty ones only), once its trigger time has
        come and it holds records; None once `stop` was called."""
        if self._replay is not None:
            ranges, self._replay = self._replay, None
            return ranges
        while not self._stopped.is_set():
            wait_s = self._next_start_s - time.monotonic()
            if wait_s > 0 and self._stopped.wait(wait_s):
                break
            self._next_start_s = max(self._next_start_s + self._trigger_s, time.monotonic())
            ranges = self._plan()
            if ranges:
                self._commit_planned(ranges)
                return ranges
        return None

    def _plan(self) -> list[OffsetRange]:
        partitions = self._partition_count()
        if partitions > len(self._positions):  # the topic gained partitions: read them from their start
            new = range(len(self._positions), partitions)
            self._consumer.assign([(self.topic, p) for p in range(partitions)])
            for p in new:
                self._positions[p] = self._consumer.beginning_offsets([(self.topic, p)])[TopicPartition(self.topic, p)]
        tps = [TopicPartition(self.topic, p) for p in self._positions]
        ends = {tp.partition: hw for tp, hw in self._consumer.end_offsets(tps).items()}
        self._check_log_starts(tps)
        lags = {p: max(0, ends[p] - self._positions[p]) for p in self._positions}
        budget = _share(lags, self._max_records) if self._max_records is not None else lags
        return self._ranges({p: self._positions[p] + budget[p] for p in self._positions})

    def _check_log_starts(self, tps: list[TopicPartition]) -> None:
        for tp, log_start in self._consumer.beginning_offsets(tps).items():
            position = self._positions[tp.partition]
            if position >= log_start:
                continue
            message = f"{tp.topic}-{tp.partition}: records [{position}, {log_start}) were deleted before this stream read them"
            if self._fail_on_data_loss:
                raise OffsetOutOfRangeError(message + " (fail_on_data_loss=False skips them)")
            logger.warning("%s; skipping them", message)
            self._positions[tp.partition] = log_start

    def _ranges(self, ends: dict[int, int]) -> list[OffsetRange]:
        leaders = {d["partition"]: d["leader"] for d in self._cluster.describe_topic(self.topic)}
        return [
            OffsetRange(self.topic, p, self._positions[p], end, leaders.get(p, -1))
            for p, end in sorted(ends.items())
            if end > self._positions[p]
        ]

    # ------------------------------------------------------------------ progress

    def _commit_planned(self, ranges: list[OffsetRange]) -> None:
        """Writes the batch ahead (its id and ends) before it is handed out."""
        ends = {r.partition: r.end for r in ranges}
        self._consumer.commit(
            {
                TopicPartition(self.topic, p): OffsetAndMetadata(
                    position, _metadata(self.batch_id, ends.get(p, position))
                )
                for p, position in self._positions.items()
            }
        )

    def commit(self, ranges: list[OffsetRange]) -> None:
        """The batch `ranges` (the last `next_batch` answer) was processed: commits its
        ends, and the next batch gets the next id."""
        for r in ranges:
            assert r.start == self._positions[r.partition], f"{r} does not start at the position {self._positions[r.partition]}"
            self._positions[r.partition] = r.end
        self.batch_id += 1
        self._consumer.commit(
            {
                TopicPartition(self.topic, p): OffsetAndMetadata(position, _metadata(self.batch_id))
                for p, position in self._positions.items()
            }
        )

    def stop(self) -> None:
        """Ends the stream: a `next_batch` waiting returns None at once (any thread)."""
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def close(self) -> None:
        self._stopped.set()
        self._consumer.close(autocommit=False)


def _share(lags: dict[int, int], max_records: int) -> dict[int, int]:
    """At most `max_records` records in all, in proportion to each partition's backlog;
    what rounding leaves goes one record each to the largest backlogs."""
    total = sum(lags.values())
    if total <= max_records:
        return dict(lags)
    budget = {p: lag * max_records // total for p, lag in lags.items()}
    left = max_records - sum(budget.values())
    for p in sorted(lags, key=lambda p: (-lags[p], p)):
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
