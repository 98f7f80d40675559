"""A broker's replica board: a small file its replicas share with their ReplicaManager,
where each replica publishes, from a timer on its own event loop, its log's offsets for
the broker's checkpoints, the log's size for the Log Size gauge, and the moment it last
ran. The ReplicaManager reads the board in its checkpoint and probe rounds.

Why: a broker used to collect each replica's offsets with an actor call every 5 s
(`replica.high.watermark.checkpoint.interval.ms`), and pinged each replica silent for 3 s
to tell a wedged one. An actor call costs ~1-2 ms of CPU across the two processes, so a
broker hosting N replicas spent ~0.4 N calls/s on that alone: 2,000 replicas, most of a
core, all idle. A Kafka broker reads those offsets from memory. Here a replica writes 64
bytes into a page it maps every `publish_interval_ms` of its slot (a timer turn, no call,
no wake-up of another process), and its broker reads them when it needs them.

The file is memory, not data: on tmpfs (/dev/shm, named after the broker's data directory)
where the node has it and has room, else `replica-board` in the broker's data directory.
Its blocks are allocated when it is made or grown (posix_fallocate), so a full file system
refuses it with an OSError rather than killing the process that first writes a page
(SIGBUS). It is an array of 64-byte slots, eight little-endian int64s each: a sequence
number (odd while the replica writes: a seqlock), the token of the replica the slot was
given to, when it last published (CLOCK_MONOTONIC ns, comparable across the node's
processes: replicas run on their broker's node), the recovery point, the log start
offset, the high watermark, the cleaner offset (-1: none) and the log's size in bytes. A
token of 0 is a free slot, an `at_ns` of 0 one not published yet.

Each ReplicaManager incarnation makes the file anew (a new inode, so a replica of the last
incarnation still running writes into the old one, not over a new replica's slot) and
hands every replica it creates a `BoardSlot` (path, index, token); tokens are never reused
in an incarnation, so what a replica it stopped writes late into its old slot is ignored.
Nothing is recovered from the file after a crash: the checkpoint files are the record.
A clean shutdown removes it; a broker that crashed for good leaves its 4 KiB on tmpfs.

The seqlock relies on x86-64's store order (no barriers from Python): elsewhere a reader
could take fields of two publications of the same replica, each once true, for one round.

Not thread-safe: the ReplicaManager's event loop owns `ReplicaBoard`, and a replica's
event loop its `SlotWriter`.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayk.storage.log_dir_checkpoints import PartitionOffsets

BOARD_FILE = "replica-board"
SHM_DIR = "/dev/shm"
SLOT = struct.Struct("<8q")  # seq, token, at_ns, recovery point, log start, HW, cleaner offset, size
SLOT_BYTES = SLOT.size
SEQ = struct.Struct("<q")
FIELDS = struct.Struct("<7q")
PAGE_BYTES = mmap.ALLOCATIONGRANULARITY
SLOTS_PER_PAGE = PAGE_BYTES // SLOT_BYTES
MAX_READ_ATTEMPTS = 100  # a slot being written is read again; a writer takes a few µs
NONE = -1  # an offset not known

assert PAGE_BYTES % SLOT_BYTES == 0


@dataclass(frozen=True, slots=True)
class BoardSlot:
    """Where one replica publishes: handed to it when its broker creates it."""

    path: str
    index: int
    token: int
    publish_interval_ms: int  # how often its replica publishes, while it leads or follows


@dataclass(frozen=True, slots=True)
class Publication:
    """What a replica last published."""

    at_s: float  # time.monotonic() when it published
    offsets: PartitionOffsets
    size_bytes: int


class ReplicaBoard:
    """The broker's side: gives out slots and reads them."""

    def __init__(
        self, broker_dir: str | Path, publish_interval_ms: int, initial_slots: int = SLOTS_PER_PAGE,
        directory: str | Path | None = None,
    ) -> None:
        """`directory`: where the file goes (default: tmpfs, or the data directory if there
        is no room there; see the module's docstring)."""
        assert publish_interval_ms > 0
        self.publish_interval_ms = publish_interval_ms
        places = [Path(directory) / BOARD_FILE] if directory is not None else candidate_paths(broker_dir)
        for i, path in enumerate(places):
            try:
                self.path = _make(path, _pages_bytes(initial_slots))
                break
            except OSError:
                if i == len(places) - 1:
                    raise
        self._file = open(self.path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), 0)
        # Oldest released first: a slot is given out again as late as can be (its last
        # replica closed its writer, or died, before it was released).
        self._free = collections.deque(range(self.capacity))
        self._tokens = itertools.count(1)
        self._owners: dict[int, int] = {}  # slot index -> the token it was given under
        self._closed = False

    @property
    def capacity(self) -> int:
        return len(self._map) // SLOT_BYTES

    def assign(self) -> BoardSlot:
        """A free slot for a new replica, under a token no replica had before."""
        if self._closed:
            raise RuntimeError("the broker's replica board is closed: the broker shut down")
        if not self._free:
            self._grow()
        index = self._free.popleft()
        token = self._owners[index] = next(self._tokens)
        SLOT.pack_into(self._map, index * SLOT_BYTES, 0, token, 0, NONE, NONE, NONE, NONE, 0)
        return BoardSlot(str(self.path), index, token, self.publish_interval_ms)

    def release(self, slot: BoardSlot) -> None:
        """The slot's replica was stopped or died: the slot is free again."""
        if not self._closed and self._owners.get(slot.index) == slot.token:
            del self._owners[slot.index]
            SLOT.pack_into(self._map, slot.index * SLOT_BYTES, 0, 0, 0, NONE, NONE, NONE, NONE, 0)
            self._free.append(slot.index)

    def read(self, slot: BoardSlot) -> Publication | None:
        """What the slot's replica last published (None: nothing yet, the slot is not its,
        or the board is closed)."""
        if self._closed:
            return None
        offset = slot.index * SLOT_BYTES
        for _ in range(MAX_READ_ATTEMPTS):
            (before,) = SEQ.unpack_from(self._map, offset)
            fields = FIELDS.unpack_from(self._map, offset + SEQ.size)
            (after,) = SEQ.unpack_from(self._map, offset)
            if before == after and before % 2 == 0:
                break
        else:
            return None  # written all along: the next round reads it
        token, at_ns, recovery_point, log_start, high_watermark, cleaner, size_bytes = fields
        if token != slot.token or at_ns == 0:
            return None
        offsets = PartitionOffsets(*(None if value == NONE else value for value in (
            recovery_point, log_start, high_watermark, cleaner)))  # fmt: skip
        return Publication(at_ns / 1e9, offsets, size_bytes)

    def close(self, remove: bool = False) -> None:
        """Unmaps the file; `remove` deletes it too (a clean shutdown). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._map.close()
        self._file.close()
        if remove:
            self.path.unlink(missing_ok=True)

    def _grow(self) -> None:
        old = self.capacity
        _allocate(self._file, _pages_bytes(old * 2))  # OSError if there is no room: nothing changed then
        self._map.close()
        self._map = mmap.mmap(self._file.fileno(), 0)
        self._free.extend(range(old, self.capacity))


class SlotWriter:
    """The replica's side: maps the page that holds its slot and publishes into it."""

    def __init__(self, slot: BoardSlot) -> None:
        self.slot = slot
        page_offset = slot.index // SLOTS_PER_PAGE * PAGE_BYTES
        with open(slot.path, "r+b") as f:
            self._map: mmap.mmap | None = mmap.mmap(f.fileno(), PAGE_BYTES, offset=page_offset)
        self._offset = slot.index * SLOT_BYTES - page_offset
        self._seq = SEQ.unpack_from(self._map, self._offset)[0]

    def publish(self, offsets: PartitionOffsets, size_bytes: int) -> None:
        """Publishes the log's offsets and size, stamped now."""
        if self._map is None:
            return
        values = (offsets.recovery_point, offsets.log_start_offset, offsets.high_watermark, offsets.cleaner_offset)
        self._seq += 1  # odd: a reader tries again
        SEQ.pack_into(self._map, self._offset, self._seq)
        FIELDS.pack_into(self._map, self._offset + SEQ.size, self.slot.token, time.monotonic_ns(),
                         *(NONE if value is None else value for value in values), size_bytes)  # fmt: skip
        self._seq += 1
        SEQ.pack_into(self._map, self._offset, self._seq)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


def candidate_paths(broker_dir: str | Path) -> list[Path]:
    """Where a broker's board may go, in order: tmpfs if the node has it (one file per data
    directory), then the data directory."""
    places = [Path(broker_dir) / BOARD_FILE]
    if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK):
        digest = hashlib.sha256(str(Path(broker_dir).resolve()).encode()).hexdigest()[:20]
        places.insert(0, Path(SHM_DIR) / f"rayk-{BOARD_FILE}-{digest}")
    return places


def _make(path: Path, size_bytes: int) -> Path:
    """A new file at `path` (a new inode, replacing whatever was there), allocated."""
    temp = path.with_name(path.name + ".new")
    try:
        with open(temp, "wb") as f:
            _allocate(f, size_bytes)
        os.replace(temp, path)
    except OSError:
        temp.unlink(missing_ok=True)
        raise
    return path


def _allocate(f: Any, size_bytes: int) -> None:
    """Makes `f` `size_bytes` long with every block allocated (zeros)."""
    f.flush()
    os.posix_fallocate(f.fileno(), 0, size_bytes)


def _pages_bytes(slots: int) -> int:
    return -(-slots // SLOTS_PER_PAGE) * PAGE_BYTES
