"""OffsetIndex: a sparse map from offset to the position of a batch in a .log file.

File `<base offset:020d>.index`: 8-byte entries, a 4-byte offset relative to the segment's
base offset and a 4-byte file position, both big-endian. An entry (offset, position) says
that the batch starting at `position` ends at `offset` (the batch's last offset, as Kafka
writes it since 2.0), so every offset greater than it is stored at or after `position`.
The segment adds an entry each time more than `index.interval.bytes` have been appended
since the last one. Lookup: binary search for the last entry <= target, then the segment
scans the .log forward from that position.

No checksum; rebuilt from the .log on recovery or when the sanity check fails. Mutable
while its segment is active, trimmed and read-only after roll. Not thread-safe.
"""

from __future__ import annotations

import struct

from rayk.storage.index_file import IndexFile

_ENTRY = struct.Struct(">ii")
MAX_RELATIVE_OFFSET = (1 << 31) - 1


class OffsetIndex(IndexFile):
    """A segment's `.index`: a sparse map from an offset to a .log position at or before the
    batch holding it, to scan forward from (entries of a 4-byte relative offset and a 4-byte
    position). Owned by its LogSegment; rebuilt from the .log when not trusted; not
    thread-safe."""

    ENTRY_SIZE_BYTES = 8

    def _entry(self, n: int) -> tuple[int, int]:
        relative, position = _ENTRY.unpack_from(self._mmap, n * self.ENTRY_SIZE_BYTES)
        return self.base_offset + relative, position

    def _relative(self, n: int) -> int:
        return _ENTRY.unpack_from(self._mmap, n * self.ENTRY_SIZE_BYTES)[0]

    @property
    def last_offset(self) -> int:
        """Offset of the last entry, or the base offset when the index is empty."""
        return self._entry(self._entries - 1)[0] if self._entries else self.base_offset

    def can_append_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= MAX_RELATIVE_OFFSET

    def append(self, offset: int, position: int) -> None:
        """Adds an entry; offsets and positions must grow (asserted: a bug otherwise)."""
        self._check_appendable()
        if self._entries:
            last_offset, last_position = self._entry(self._entries - 1)
            assert offset > last_offset and position > last_position, (
                f"index entries must grow: ({offset}, {position}) after ({last_offset}, {last_position})"
            )
        if not self.can_append_offset(offset):
            raise ValueError(f"offset {offset} does not fit relative to base {self.base_offset}")
        _ENTRY.pack_into(self._mmap, self._entries * self.ENTRY_SIZE_BYTES, offset - self.base_offset, position)
        self._entries += 1

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry with offset <= target; (base, 0) if none."""
        n = self._largest_lower_bound(offset - self.base_offset, self._relative)
        return (self.base_offset, 0) if n < 0 else self._entry(n)

    def position_at_or_below(self, position: int) -> int:
        """The position of the last entry at or below `position` (a batch's start); 0 if none."""
        n = self._largest_lower_bound(position, lambda i: self._entry(i)[1])
        return 0 if n < 0 else self._entry(n)[1]

    def truncate_to(self, offset: int) -> None:
        """Removes every entry whose offset is >= `offset` (the log is cut there)."""
        n = self._largest_lower_bound(offset - self.base_offset - 1, self._relative)
        self._truncate_to_entries(n + 1)

    def sanity_check(self) -> str | None:
        """Returns what is wrong with the file, or None if it can be trusted."""
        if self._entries == 0:
            return None
        previous = -1
        for n in range(self._entries):
            relative, position = _ENTRY.unpack_from(self._mmap, n * self.ENTRY_SIZE_BYTES)
            if relative <= previous or position < 0:
                return f"entry {n} ({relative}, {position}) does not grow"
            previous = relative
        return None
