"""A memory-mapped file of fixed-size index entries: the mechanism shared by the offset
index and the time index (Kafka's AbstractIndex).

While its segment is active an index file is preallocated to `max_index_bytes` (rounded
down to a whole number of entries) and mapped read-write; entries are appended in place
and `entries` counts the valid ones. `trim()` (on roll and on close) cuts the file to the
valid entries, after which it is read-only. An index has no checksum: after a crash the
segment rebuilds it from the .log file, so nothing here needs to survive a torn write.

The preallocated file is sparse, and the writable mapping is advised MADV_RANDOM (its
lookups are binary searches; the sanity check scans only the read-only mappings of loaded
segments, before the last one is made active). Without the advice, the first entry's
page fault read around it as far as the device reads ahead (8 MiB on this project's VMs),
and the kernel zeroed that much of the hole into the page cache for each index, ~16 MiB
per partition replica as its first records arrived. On a fresh VM, whose memory the host
backs on first touch, that was ~30 ms of CPU per replica, all of a new topic's replicas
at once (a 3-partition RF=3 topic's first acks=all records waited ~100-250 ms; `perf` put
47% of those replicas' CPU in the kernel's memset).

Entries are sorted by their key (relative offset, or timestamp); `_largest_lower_bound`
is the binary search both indexes use. Not thread-safe: the owning segment serialises
calls.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from pathlib import Path

MADV_RANDOM: int | None = getattr(mmap, "MADV_RANDOM", None)  # not on every platform


class IndexFile:
    """Base of OffsetIndex and TimeIndex: owns the index file, its mmap and the count of valid
    entries; a subclass sets ENTRY_SIZE_BYTES and the entry layout. Writable and preallocated
    while its segment is active, trimmed to its entries and read-only after `trim`. Not
    thread-safe: the owning segment serialises calls."""

    ENTRY_SIZE_BYTES: int  # set by each subclass

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int, writable: bool) -> None:
        self.path = path
        self.base_offset = base_offset
        self._max_entries = max_index_bytes // self.ENTRY_SIZE_BYTES
        if self._max_entries < 1:
            raise ValueError(f"index of {max_index_bytes} bytes cannot hold one {self.ENTRY_SIZE_BYTES}-byte entry")
        existed = path.exists()
        self._file = open(path, "r+b" if existed else "w+b")
        length = os.fstat(self._file.fileno()).st_size
        # An existing file counts as full of entries up to its length; the segment's
        # sanity check (or recovery) decides whether to believe them.
        self._entries = length // self.ENTRY_SIZE_BYTES
        self._writable = False
        self._mmap: mmap.mmap | None = None
        if writable:
            self.make_writable()
        else:
            self._remap(self._entries * self.ENTRY_SIZE_BYTES)

    # -------------------------------------------------------------- size management

    def _remap(self, length_bytes: int) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        self._file.truncate(length_bytes)
        if length_bytes > 0:
            access = mmap.ACCESS_WRITE if self._writable else mmap.ACCESS_READ
            self._mmap = mmap.mmap(self._file.fileno(), length_bytes, access=access)
            if self._writable and MADV_RANDOM is not None:  # no read-around into the sparse tail (see above)
                self._mmap.madvise(MADV_RANDOM)

    def make_writable(self) -> None:
        """Preallocates the file to its maximum size so entries can be appended in place."""
        self._writable = True
        self._max_entries = max(self._max_entries, self._entries)
        self._remap(self._max_entries * self.ENTRY_SIZE_BYTES)

    def trim(self, sync: bool = True) -> None:
        """Cuts the file to its valid entries and maps it read-only (segment roll / close);
        `sync=False` leaves the fsync to whoever holds a `dup_fd()` (a background flush)."""
        if self._writable and sync:
            self.flush()
        self._writable = False
        self._remap(self._entries * self.ENTRY_SIZE_BYTES)

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def entries_left(self) -> int:
        """How many more entries fit."""
        return max(self._max_entries - self._entries, 0)

    @property
    def is_full(self) -> bool:
        return self._entries >= self._max_entries

    @property
    def size_bytes(self) -> int:
        return self._entries * self.ENTRY_SIZE_BYTES

    def _truncate_to_entries(self, entries: int) -> None:
        assert 0 <= entries <= self._entries
        self._entries = entries
        if not self._writable:
            self._remap(entries * self.ENTRY_SIZE_BYTES)

    def reset(self) -> None:
        """Drops every entry (the index is about to be rebuilt)."""
        self._truncate_to_entries(0)

    def _check_appendable(self) -> None:
        if not self._writable:
            raise RuntimeError(f"{self.path.name} is read-only: its segment was rolled")
        if self.is_full:
            raise RuntimeError(f"{self.path.name} is full ({self._entries} entries)")

    # -------------------------------------------------------------- search

    def _largest_lower_bound(self, target: int, key_of: Callable[[int], int]) -> int:
        """Index of the last entry whose key <= target, or -1 if none (keys ascend)."""
        lo, hi = 0, self._entries - 1
        if hi < 0 or key_of(0) > target:
            return -1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if key_of(mid) <= target:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # -------------------------------------------------------------- lifecycle

    def flush(self) -> None:
        if self._mmap is not None and self._writable:
            self._mmap.flush()
        os.fsync(self._file.fileno())

    def dup_fd(self) -> int:
        """A duplicate of the file's descriptor, for the caller to fsync and close."""
        return os.dup(self._file.fileno())

    def close(self) -> None:
        if self._file.closed:
            return
        self.trim()
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        self._file.close()

    def delete(self) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if not self._file.closed:
            self._file.close()
        self.path.unlink(missing_ok=True)

    def rename_to(self, path: Path) -> None:
        os.replace(self.path, path)
        self.path = path
