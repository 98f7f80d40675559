"""TransactionIndex: the aborted transactions whose markers a segment holds (Kafka's
`<base offset>.txnindex`, byte for byte).

When an ABORT marker is appended, the log adds an entry to the active segment's index:

    version int16 (0) | producerId int64 | firstOffset int64 | lastOffset int64
    | lastStableOffset int64                                    (34 bytes, big-endian)

`firstOffset` is the transaction's first batch (the marker's own offset if it wrote
none here), `lastOffset` the marker's, and `lastStableOffset` the LSO just after the
abort: the first offset of the earliest transaction of another producer still open then
(which may be below firstOffset), or lastOffset + 1. Entries are in marker order, so their last offsets strictly grow.

A `read_committed` fetch of [fetch offset, upper bound) collects the entries that
overlap it (lastOffset >= fetch offset and firstOffset < upper bound) from the segment
holding the fetch offset onwards, and stops at the first entry whose lastStableOffset is
at or past the upper bound: every transaction that could overlap the range was closed by
then (Kafka's collectAbortedTxns). The consumer drops the records of those producers'
transactional batches inside each range.

The file exists only once the segment has an entry (Kafka creates it lazily); the
entries are also kept in memory (aborts are rare, and every read_committed fetch reads
them). Crash behaviour: the file is appended to and fsynced with its segment; a torn or
otherwise broken file fails `problem` and the log rebuilds it by replaying the segment.
Not thread-safe: the owning Log serialises calls.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from rayk.errors import KafkaStorageError

SUFFIX = ".txnindex"
VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE_BYTES = _ENTRY.size
assert ENTRY_SIZE_BYTES == 34


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One `.txnindex` entry: an aborted transaction of `producer_id` spanning [first_offset,
    last_offset] (the marker's offset) and the LSO just after the abort; 34 bytes on disk."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return _ENTRY.pack(VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset)


def decode_entries(data: bytes | bytearray | memoryview) -> tuple[list[AbortedTxn], str | None]:
    """The entries in a file's bytes, and what is wrong with them (None if nothing): a
    length that is not a whole number of entries, an unknown version, or offsets that a
    writer could not have produced. The entries before the first bad one are returned."""
    view = memoryview(data)
    entries: list[AbortedTxn] = []
    whole = len(view) - len(view) % ENTRY_SIZE_BYTES
    for i, (version, producer_id, first, last, stable) in enumerate(_ENTRY.iter_unpack(view[:whole])):
        if version != VERSION:
            return entries, f"entry {i} has version {version}, not {VERSION}"
        if producer_id < 0 or not 0 <= first <= last or stable < 0:
            return entries, f"entry {i} is not an aborted transaction: {(producer_id, first, last, stable)}"
        if entries and last <= entries[-1].last_offset:
            return entries, f"entry {i} ends at {last}, not after the previous entry's {entries[-1].last_offset}"
        entries.append(AbortedTxn(producer_id, first, last, stable))
    if whole != len(view):
        return entries, f"{len(view)} bytes are not a whole number of {ENTRY_SIZE_BYTES}-byte entries"
    return entries, None


class TransactionIndex:
    """A segment's `.txnindex`: owns the file (created by the first `append`) and its entries in
    memory. `problem` says why the file on disk cannot be trusted, and the Log then rebuilds
    it. Not thread-safe: the owning Log serialises calls."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        self.problem: str | None = None  # why the file on disk cannot be trusted, if it cannot
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        except OSError as e:
            raise KafkaStorageError(f"cannot read transaction index {path}: {e}") from e
        self.entries, self.problem = decode_entries(data)

    def append(self, txn: AbortedTxn) -> None:
        if self.entries and txn.last_offset <= self.entries[-1].last_offset:
            raise ValueError(
                f"aborted transaction ending at {txn.last_offset} does not follow the one ending at "
                f"{self.entries[-1].last_offset} in {self.path}"
            )
        data = txn.encode()
        position = len(self.entries) * ENTRY_SIZE_BYTES
        written = 0
        while written < len(data):
            written += os.pwrite(self._open(), data[written:], position + written)
        self.entries.append(txn)

    def collect(self, fetch_offset: int, upper_bound_offset: int) -> tuple[list[AbortedTxn], bool]:
        """The entries overlapping [fetch_offset, upper_bound_offset), and whether the search
        is complete (no later segment can hold one)."""
        found = []
        for txn in self.entries:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                found.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return found, True
        return found, False

    def truncate_to(self, offset: int) -> None:
        """Drops the entries whose marker is at or after `offset`."""
        keep = len(self.entries)
        while keep and self.entries[keep - 1].last_offset >= offset:
            keep -= 1
        self._cut(keep)

    def reset(self) -> None:
        """Drops every entry (the log replays the segment to write them again)."""
        self._cut(0)
        self.problem = None

    def _cut(self, keep: int) -> None:
        if keep == len(self.entries) and self.problem is None:
            return
        del self.entries[keep:]
        if self._fd >= 0 or self.path.exists():
            os.ftruncate(self._open(), keep * ENTRY_SIZE_BYTES)

    def _open(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    def flush(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)

    def dup_fd(self) -> int | None:
        """A duplicate descriptor for a background fsync; None if the file was never written."""
        return os.dup(self._fd) if self._fd >= 0 else None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def rename_to(self, path: Path) -> None:
        if self.path.exists():
            os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
