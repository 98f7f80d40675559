"""FileSlice: whole batches of a segment's .log file, named by their place in the file
instead of read into memory, for an answer that sends them with `sendfile` (Kafka's
FileRecords slice, which its network threads send by `transferTo`).

A slice holds a descriptor of its own (a `dup` of the segment's), so the segment being
rolled, deleted by retention or swapped by the cleaner while the answer waits to be sent
does not take its bytes away: they stay readable until the slice is closed. Only a
truncation changes bytes already written (a leader that becomes a follower cuts its log
at the high watermark and appends its new leader's batches in the same place), so a
slice remembers the log's truncation count when it was made and `unchanged()` tells
whether it still holds the batches it was made of; whoever sends it checks that before
writing anything of its answer and before each part it sends (answer_writer.py).

Closed by whoever sends it (`close()`), or when the last reference goes away.
"""

from __future__ import annotations

import os
from collections.abc import Callable


class FileSlice:
    """`size_bytes` bytes of whole batches at `position` of a .log file, through a
    descriptor of its own; `len()` is its size, as `len()` of the bytes it stands for."""

    __slots__ = ("fd", "position", "size_bytes", "next_offset", "read_failed", "_truncations", "_truncations_now")

    def __init__(
        self, segment_fd: int, position: int, size_bytes: int, next_offset: int, truncations: int,
        truncations_now: Callable[[], int],
    ) -> None:
        assert position >= 0 and size_bytes > 0, (position, size_bytes)
        self.fd = -1
        self.fd = os.dup(segment_fd)  # OSError (EMFILE) to the caller, which reads instead
        # Told of an I/O error of the file when the slice is read or sent: its owner (a
        # leader) treats it as a failed read of its log.
        self.read_failed: Callable[[OSError], None] = _ignore
        self.position, self.size_bytes, self.next_offset = position, size_bytes, next_offset
        self._truncations, self._truncations_now = truncations, truncations_now

    def __len__(self) -> int:
        return self.size_bytes

    def __repr__(self) -> str:
        return f"FileSlice(position={self.position}, size_bytes={self.size_bytes}, next_offset={self.next_offset})"

    def unchanged(self) -> bool:
        """True while the log has not been truncated since the slice was made: the bytes
        at its place are still the batches it was made of."""
        return self._truncations_now() == self._truncations

    def read(self) -> bytes:
        """Its bytes, read into memory (for a connection `sendfile` cannot serve, such as
        TLS); fewer if a truncation cut the file (then `unchanged()` is False)."""
        return os.pread(self.fd, self.size_bytes, self.position)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


def _ignore(error: OSError) -> None:
    pass
