"""Offset ranges of a batch read (what Spark's Kafka source calls offset ranges).

A batch read of a topic (rayk.data.read_topic, rayk.spark.read_topic) reads, per
partition, the records in [start, end). The bounds are given the way Spark's Kafka source
takes them: "earliest" / "latest", or JSON per partition like `{"t":{"0":23,"1":-2}}`
(-2 earliest, -1 latest; a dict works too), or a starting timestamp in ms. They are
resolved once, when the read is planned, against each partition leader's log start
offset and high watermark (the last stable offset, for a read_committed read), so the
read is a consistent snapshot: records appended later are not part of it, whole or half.

As in Spark's batch queries, "latest" cannot start a range and "earliest" cannot end it,
and JSON offsets must name every partition of the topic. An offset outside the log
(below its start, above its high watermark) is OFFSET_OUT_OF_RANGE. A partition with no
record at or after `starting_timestamp` gives an empty range (Spark's
startingOffsetsByTimestampStrategy=latest).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from rayk.client import calls
from rayk.dataplane.frames import READ_COMMITTED, READ_UNCOMMITTED
from rayk.errors import InvalidConfigurationError, KafkaError, OffsetOutOfRangeError

logger = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
OffsetSpec = str | dict[str, dict[Any, int]]
LOG_SIZES_TIMEOUT_MS = 30_000  # for the leaders to say their logs' sizes; else tasks are sized by records


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """One partition's part of a batch read: the offsets [start, end) to read, the leader that
    held them when the read was planned, and whether to read them read_committed."""

    topic: str
    partition: int
    start: int  # first offset read
    end: int  # first offset not read
    leader: int  # broker id of the partition's leader when planned
    read_committed: bool = False  # read as a read_committed consumer: `end` is at most the LSO, aborted records dropped

    @property
    def size(self) -> int:
        return self.end - self.start

    def split(self, max_records: int) -> list[OffsetRange]:
        """Consecutive sub-ranges of at most `max_records` offsets (at least one range)."""
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        starts = range(self.start, max(self.end, self.start + 1), max_records)
        return [OffsetRange(self.topic, self.partition, s, min(s + max_records, self.end), self.leader, self.read_committed)
                for s in starts]

    def split_evenly(self, parts: int) -> list[OffsetRange]:
        """`parts` consecutive sub-ranges of (nearly) equal size, fewer if the range is smaller."""
        return self.split(max(1, -(-self.size // max(1, parts))))


def read_committed_of(isolation_level: str) -> bool:
    """Whether `isolation_level` (Kafka's names) is "read_committed"."""
    if isolation_level not in ("read_uncommitted", "read_committed"):
        raise InvalidConfigurationError(
            f"isolation_level must be 'read_uncommitted' or 'read_committed', got {isolation_level!r}"
        )
    return isolation_level == "read_committed"


def parse_offsets(spec: OffsetSpec, topic: str, partitions: int, *, starting: bool, streaming: bool = False) -> dict[int, int]:
    """Per partition: an offset, EARLIEST or LATEST. A batch read may not start at
    "latest" nor end at "earliest"; a stream (`streaming`) may start at either."""
    name = "starting_offsets" if starting else "ending_offsets"
    if spec in ("earliest", "latest"):
        if spec == ("latest" if starting else "earliest") and not streaming:
            raise InvalidConfigurationError(f"{name}={spec!r} is not allowed in a batch read (it would read nothing)")
        return {p: EARLIEST if spec == "earliest" else LATEST for p in range(partitions)}
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise InvalidConfigurationError(f"{name} is neither 'earliest', 'latest' nor JSON: {e}") from None
    if not isinstance(spec, dict) or set(spec) != {topic} or not isinstance(spec[topic], dict):
        raise InvalidConfigurationError(f'{name} must be like {{"{topic}": {{"0": 23, "1": -2}}}}, got {spec!r}')
    try:
        offsets = {int(p): int(o) for p, o in spec[topic].items()}
    except (TypeError, ValueError):
        raise InvalidConfigurationError(f"{name}: partitions and offsets must be integers, got {spec[topic]!r}") from None
    if set(offsets) != set(range(partitions)):
        raise InvalidConfigurationError(
            f"{name} must give an offset for each of the {partitions} partitions of {topic!r}, got {sorted(offsets)}"
        )
    forbidden = None if streaming else LATEST if starting else EARLIEST
    bad = {p: o for p, o in offsets.items() if o < EARLIEST or o == forbidden}
    if bad:
        raise InvalidConfigurationError(f"{name}: offsets {bad} are not allowed (use >= 0, or -2 earliest / -1 latest)")
    return offsets


def plan_ranges(
    cluster: Any,
    topic: str,
    starting_offsets: OffsetSpec = "earliest",
    ending_offsets: OffsetSpec = "latest",
    starting_timestamp: int | None = None,
    isolation_level: str = "read_uncommitted",
) -> list[OffsetRange]:
    """Resolves the bounds against each partition leader, once (the snapshot). The leaders
    are asked within the cluster's default_api_timeout_ms, all again (looked up again)
    after retry_backoff_ms while one does not answer or answers a retriable error (a
    partition without a leader, as while a restarted broker recovers its logs). With
    `isolation_level` "read_committed", "latest" is the last stable offset (LSO), which no
    range ends past, and the ranges are read as a read_committed consumer reads."""
    read_committed = read_committed_of(isolation_level)
    description = cluster.describe_topic(topic)  # UNKNOWN_TOPIC_OR_PARTITION first
    partitions = len(description)
    starts = parse_offsets(starting_offsets, topic, partitions, starting=True)
    ends = parse_offsets(ending_offsets, topic, partitions, starting=False)
    if starting_timestamp is not None and starting_timestamp < 0:
        raise InvalidConfigurationError(f"starting_timestamp must be >= 0 ms, got {starting_timestamp}")
    specs = [EARLIEST, LATEST] + ([starting_timestamp] if starting_timestamp is not None else [])
    deadline_s = cluster.api_calls.deadline_s()
    answers = calls.retry(
        lambda: _list_offsets(cluster, topic, partitions, specs, deadline_s, read_committed), deadline_s, f"ListOffsets {topic}",
        retry_backoff_ms=cluster.retry_backoff_ms,
    )
    bounds, hws = answers[0], answers[1]
    by_time = answers[2] if starting_timestamp is not None else [(-1, -1)] * partitions
    ranges = []
    for p in range(partitions):
        log_start, hw = bounds[p][0], hws[p][0]
        if starting_timestamp is not None:
            start = by_time[p][0] if by_time[p][0] >= 0 else hw
        else:
            start = log_start if starts[p] == EARLIEST else starts[p]
        end = hw if ends[p] == LATEST else ends[p]
        if not log_start <= start <= hw or not start <= end <= hw:
            raise OffsetOutOfRangeError(
                f"{topic}-{p}: cannot read [{start}, {end}); the partition holds [{log_start}, {hw})"
            )
        leader = next(d["leader"] for d in description if d["partition"] == p)
        ranges.append(OffsetRange(topic, p, start, end, leader, read_committed))
    return ranges


def _list_offsets(
    cluster: Any, topic: str, partitions: int, specs: list[int], deadline_s: float, read_committed: bool = False
) -> list[list[tuple[int, int]]]:
    """Per spec (EARLIEST, LATEST or a timestamp), each partition leader's list_offset
    answer, all asked at once (LATEST is the LSO when `read_committed`)."""
    leaders = calls.get_all(
        [cluster.controller.leader.remote(topic, p) for p in range(partitions)], deadline_s, f"leaders of {topic}"
    )
    isolation = READ_COMMITTED if read_committed else READ_UNCOMMITTED
    asked = [[leader.list_offset.remote(spec, isolation) for leader in leaders] for spec in specs]
    return [calls.get_all(refs, deadline_s, f"ListOffsets {topic}") for refs in asked]


def plan_read_ranges(
    cluster: Any,
    topic: str,
    starting_offsets: OffsetSpec,
    ending_offsets: OffsetSpec,
    starting_timestamp: int | None,
    max_records: int,
    max_bytes: int | None = None,
    isolation_level: str = "read_uncommitted",
) -> list[OffsetRange]:
    """The ranges a batch read's tasks read: the non-empty ones, split into tasks (see
    `split_for_tasks`)."""
    ranges = plan_ranges(cluster, topic, starting_offsets, ending_offsets, starting_timestamp, isolation_level)
    return split_for_tasks(cluster, ranges, max_records, max_bytes)


def split_for_tasks(cluster: Any, ranges: list[OffsetRange], max_records: int, max_bytes: int | None) -> list[OffsetRange]:
    """The non-empty `ranges`, each split evenly into as few tasks as hold at most
    `max_records` records and, by the partition's average record size on disk (its
    leader's log bytes over its offsets), about `max_bytes` bytes (None: no byte limit)."""
    if max_records < 1 or (max_bytes is not None and max_bytes < 1):
        raise InvalidConfigurationError("records and bytes per task must be >= 1")
    ranges = [r for r in ranges if r.size > 0]
    sizes = log_sizes(cluster, ranges) if max_bytes else None
    out = []
    for i, r in enumerate(ranges):
        parts = -(-r.size // max_records)
        if max_bytes and sizes:
            log_start, log_end, size_bytes = sizes[i]
            bytes_per_record = size_bytes / max(1, log_end - log_start)
            parts = max(parts, math.ceil(r.size * bytes_per_record / max_bytes))
        out += r.split_evenly(parts)
    return out


def log_sizes(cluster: Any, ranges: list[OffsetRange]) -> list[tuple[int, int, int]] | None:
    """Each range's partition (log start, log end, bytes) from its leader; None if a
    leader cannot say (it moved or died: the tasks are then sized by records only)."""
    deadline_s = cluster.api_calls.deadline_s(LOG_SIZES_TIMEOUT_MS)
    try:
        leaders = calls.get_all(
            [cluster.controller.leader.remote(r.topic, r.partition) for r in ranges], deadline_s, "leaders"
        )
        return calls.get_all([leader.log_size.remote() for leader in leaders], deadline_s, "log sizes")
    except KafkaError as e:
        logger.warning("sizing read tasks by records only: %s", e)
        return None
