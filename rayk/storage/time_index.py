"""TimeIndex: a sparse map from timestamp to the first offset that may hold it.

File `<base offset:020d>.timeindex`: 12-byte entries, an 8-byte timestamp (ms) and a
4-byte offset relative to the segment's base, big-endian. An entry (timestamp, offset)
says that `timestamp` is the largest timestamp in the segment up to `offset`, and that
it first appeared in the batch ending at `offset`. Entries are appended only when that
maximum grows, so timestamps strictly ascend. Lookup: the last entry with timestamp <=
target gives an offset before whose batch no record can have a timestamp >= target, so a
forward scan of the .log from there finds the earliest record at or after the target.

No checksum; rebuilt from the .log on recovery or when the sanity check fails. Mutable
while its segment is active, trimmed and read-only after roll. Not thread-safe.
"""

from __future__ import annotations

import struct

from rayk.storage.index_file import IndexFile

_ENTRY = struct.Struct(">qi")


class TimeIndex(IndexFile):
    """A segment's `.timeindex`: maps a timestamp (ms) to the offset from which to scan for the
    first record at or after it (entries of an 8-byte timestamp and a 4-byte relative offset,
    timestamps strictly ascending). Owned by its LogSegment; rebuilt from the .log when not
    trusted; not thread-safe."""

    ENTRY_SIZE_BYTES = 12

    def _entry(self, n: int) -> tuple[int, int]:
        timestamp, relative = _ENTRY.unpack_from(self._mmap, n * self.ENTRY_SIZE_BYTES)
        return timestamp, self.base_offset + relative

    def _timestamp(self, n: int) -> int:
        return _ENTRY.unpack_from(self._mmap, n * self.ENTRY_SIZE_BYTES)[0]

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base offset) when empty."""
        return self._entry(self._entries - 1) if self._entries else (-1, self.base_offset)

    def maybe_append(self, timestamp_ms: int, offset: int) -> None:
        """Adds an entry if `timestamp_ms` is larger than the last one's (Kafka's rule)."""
        last_timestamp, last_offset = self.last_entry
        if timestamp_ms <= last_timestamp:
            return
        assert offset >= last_offset, f"time index offsets must not shrink: {offset} < {last_offset}"
        self._check_appendable()
        _ENTRY.pack_into(self._mmap, self._entries * self.ENTRY_SIZE_BYTES, timestamp_ms, offset - self.base_offset)
        self._entries += 1

    def lookup(self, timestamp_ms: int) -> tuple[int, int]:
        """(timestamp, offset) of the last entry with timestamp <= target; (-1, base) if none."""
        n = self._largest_lower_bound(timestamp_ms, self._timestamp)
        return (-1, self.base_offset) if n < 0 else self._entry(n)

    def truncate_to(self, offset: int) -> None:
        """Removes every entry whose offset is >= `offset`."""
        keep = self._entries
        while keep > 0 and self._entry(keep - 1)[1] >= offset:
            keep -= 1
        self._truncate_to_entries(keep)

    def sanity_check(self) -> str | None:
        previous_timestamp, previous_offset = -1, -1
        for n in range(self._entries):
            timestamp, relative = _ENTRY.unpack_from(self._mmap, n * self.ENTRY_SIZE_BYTES)
            if timestamp <= previous_timestamp or relative < previous_offset:
                return f"entry {n} ({timestamp}, {relative}) does not grow"
            previous_timestamp, previous_offset = timestamp, relative
        return None
