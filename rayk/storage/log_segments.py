"""LogSegments: a log's segments in base offset order (Kafka's LogSegments).

Maps each segment's base offset to its LogSegment, as two parallel lists (a bisect over the
base offsets finds the segment that holds an offset). Base offsets strictly grow (asserted
on every change); a compacted log may leave gaps between one segment's last offset and the
next one's base, never an overlap. The last segment is the active one, the only one that
takes appends. The files are named by `segment_file_name` (SEGMENT_FILE matches them).

It keeps the order and nothing else: opening, recovery, retention and the cleaner's swap
belong to the Log and its loader. Not thread-safe: the owning Log's lock guards it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from typing import overload

from rayk.storage.segment import LogSegment

# <base offset:020d>.<log|index|timeindex|txnindex>: the files of a segment.
SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)$")


class LogSegments:
    """A log's segments, oldest first; the last is the active one."""

    def __init__(self) -> None:
        self._segments: list[LogSegment] = []
        self._base_offsets: list[int] = []

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[LogSegment]:
        return iter(self._segments)

    @overload
    def __getitem__(self, index: int) -> LogSegment: ...

    @overload
    def __getitem__(self, index: slice) -> list[LogSegment]: ...

    def __getitem__(self, index: int | slice) -> LogSegment | list[LogSegment]:
        return self._segments[index]

    @property
    def active(self) -> LogSegment:
        return self._segments[-1]

    @property
    def base_offsets(self) -> list[int]:
        """The base offsets, oldest first (the list itself: callers that keep it copy it)."""
        return self._base_offsets

    @property
    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self._segments)

    def floor_index(self, offset: int) -> int:
        """The index of the segment that holds `offset` (the last whose base is at or
        below it; the first if none is)."""
        return max(bisect.bisect_right(self._base_offsets, offset) - 1, 0)

    def from_offset(self, offset: int) -> list[LogSegment]:
        """The segment holding `offset` and every later one."""
        return self._segments[self.floor_index(offset):]

    def end_offset(self, index: int, log_end_offset: int) -> int:
        """Where segment `index`'s offsets end: the next segment's base, or the LEO."""
        return self._base_offsets[index + 1] if index + 1 < len(self._base_offsets) else log_end_offset

    def holds(self, segment: LogSegment) -> bool:
        """Whether `segment` (that very object) is still one of the log's."""
        return any(s is segment for s in self._segments)

    def add(self, segment: LogSegment) -> None:
        """`segment` becomes the last (active) one; its base offset is above every other's."""
        assert not self._base_offsets or segment.base_offset > self._base_offsets[-1], "base offsets only grow"
        self._segments.append(segment)
        self._base_offsets.append(segment.base_offset)

    def remove_from(self, index: int) -> list[LogSegment]:
        """Takes out the segments from `index` on (their files stay: the caller deletes them)."""
        removed = self._segments[index:]
        del self._segments[index:], self._base_offsets[index:]
        return removed

    def remove_first(self, count: int) -> list[LogSegment]:
        """Takes out the `count` oldest segments (their files stay)."""
        removed = self._segments[:count]
        del self._segments[:count], self._base_offsets[:count]
        return removed

    def replace(self, first: int, count: int, segment: LogSegment) -> None:
        """`segment` takes the place of the `count` segments from index `first`; it starts
        at the first one's base and ends before the next one's."""
        assert count >= 1 and first + count <= len(self._segments)
        assert segment.base_offset == self._base_offsets[first], "a replacement takes its first segment's base"
        self._segments[first:first + count] = [segment]
        self._base_offsets[first:first + count] = [segment.base_offset]
