"""Producer snapshot files: a partition's producer state as of one offset (Kafka's
ProducerStateManager snapshot, format version 1, byte for byte).

File `<offset:020d>.snapshot` in the partition directory: the `ProducerStateManager`
after every batch below `offset` was recorded. The `Log` writes one when it rolls a
segment (named by the new segment's base offset) and when it closes (at the LEO), and
rebuilds the state on open or truncation from the newest valid snapshot at or below the
LEO plus the batches after it. Format, big-endian, as Kafka writes it:

    Version int16 (= 1) | Crc uint32 (CRC-32C of every byte after this field)
    | Count int32 | Count entries of 46 bytes:
        ProducerId int64 | ProducerEpoch int16 | LastSequence int32 | LastOffset int64
        | OffsetDelta int32 (last - first offset of the batch) | Timestamp int64 (the
        batch's max timestamp) | CoordinatorEpoch int32 (-1) | CurrentTxnFirstOffset int64 (-1)

Kafka writes one entry per producer (its newest batch). rayk writes ONE ENTRY PER
RETAINED BATCH (up to `BATCHES_REMEMBERED` per producer, oldest first, producers in id
order) so that the whole duplicate-detection window survives a restart. Kafka's reader
keeps the last entry it reads for each producer id, which is the newest batch, so the
file stays readable by Kafka's tooling. LastSequence is stored modulo 2^32 as an int32
(the same number unless a sequence passed 2^31 - 1; rayk does not wrap sequences).
CoordinatorEpoch (of the producer's last transaction marker, -1 if none) and
CurrentTxnFirstOffset (its open transaction's first offset, -1 if none) are the
producer's, written on each of its entries. A producer with no batch left (a marker
started its epoch, or retention took the batches of its open transaction) is one entry
as Kafka writes it: LastSequence -1, LastOffset -1, OffsetDelta 0, Timestamp -1.

Crash behaviour: written atomically (`write_atomically`: temp file, fsync, rename,
directory fsync), so a crash leaves no file or a whole one. A damaged file is never
trusted: a wrong version, a bad CRC, a length that disagrees with the count, or
contents rayk's writer cannot produce (a negative producer id or offset, a producer's
entries with two epochs or two transaction states, offsets not increasing, more than
`BATCHES_REMEMBERED`, an open transaction that starts after the producer's last batch) make
`read` raise `KafkaStorageError`; the Log then deletes the file and falls back to an
older snapshot or to replaying the log.

Pure functions over one directory; not thread-safe (the owning Log serialises calls).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path

import crc32c as _crc32c

from rayk.errors import KafkaStorageError
from rayk.storage.checkpoint import write_atomically
from rayk.storage.producer_state import (
    BATCHES_REMEMBERED,
    NO_COORDINATOR_EPOCH,
    BatchMetadata,
    ProducerEntry,
    ProducerStateManager,
)

SNAPSHOT_SUFFIX = ".snapshot"
VERSION = 1
NO_TXN_FIRST_OFFSET = -1
NO_SEQUENCE = NO_OFFSET = NO_TIMESTAMP = -1  # a producer entry without a batch

_PREFIX = struct.Struct(">hI")  # Version, Crc
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhiqiqiq")
CRC_END_POS = _PREFIX.size  # the CRC covers everything from here on: the count and the entries
HEADER_SIZE_BYTES = _PREFIX.size + _COUNT.size
ENTRY_SIZE_BYTES = _ENTRY.size
assert (HEADER_SIZE_BYTES, ENTRY_SIZE_BYTES) == (10, 46)

_SNAPSHOT_FILE = re.compile(r"^(\d{20})\.snapshot$")
_TEMP_FILE = re.compile(r"^\d{20}\.snapshot\.tmp$")


def snapshot_file_name(offset: int) -> str:
    """Kafka names snapshots by their offset padded to 20 digits, like segments."""
    assert offset >= 0
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def _wrap_int32(value: int) -> int:
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


# ---------------------------------------------------------------------------- codec


def encode(state: ProducerStateManager) -> bytes:
    """The snapshot file's bytes for `state`."""
    body = bytearray(_COUNT.size)
    count = 0
    for producer_id in sorted(state.producers):
        entry = state.producers[producer_id]
        txn_first_offset = NO_TXN_FIRST_OFFSET if entry.current_txn_first_offset is None else entry.current_txn_first_offset
        if not entry.batches:
            body += _ENTRY.pack(
                producer_id, entry.epoch, NO_SEQUENCE, NO_OFFSET, 0, NO_TIMESTAMP, entry.coordinator_epoch, txn_first_offset
            )
            count += 1
        for batch in entry.batches:
            offset_delta = batch.last_offset - batch.first_offset
            assert offset_delta == batch.last_sequence - batch.first_sequence >= 0, f"inconsistent {batch}"
            body += _ENTRY.pack(
                producer_id, entry.epoch, _wrap_int32(batch.last_sequence), batch.last_offset, offset_delta,
                batch.timestamp_ms, entry.coordinator_epoch, txn_first_offset,
            )
            count += 1
    _COUNT.pack_into(body, 0, count)
    return _PREFIX.pack(VERSION, _crc32c.crc32c(body)) + bytes(body)


def decode(data: bytes | bytearray | memoryview, source: str = "producer snapshot") -> ProducerStateManager:
    """The state a snapshot holds; `KafkaStorageError` if the bytes are not exactly what
    a writer of format version 1 produced."""
    view = memoryview(data)
    if len(view) < HEADER_SIZE_BYTES:
        raise KafkaStorageError(f"{source}: {len(view)} bytes, shorter than the {HEADER_SIZE_BYTES}-byte header")
    version, crc = _PREFIX.unpack_from(view, 0)
    if version != VERSION:
        raise KafkaStorageError(f"{source}: unknown snapshot version {version} (rayk reads {VERSION})")
    computed = _crc32c.crc32c(view[CRC_END_POS:])
    if crc != computed:
        raise KafkaStorageError(f"{source}: CRC {crc:#010x} does not match the contents ({computed:#010x})")
    (count,) = _COUNT.unpack_from(view, CRC_END_POS)
    if count < 0 or len(view) != HEADER_SIZE_BYTES + count * ENTRY_SIZE_BYTES:
        raise KafkaStorageError(
            f"{source}: {count} entries do not fill the {len(view) - HEADER_SIZE_BYTES} bytes after the header"
        )
    state = ProducerStateManager()
    open_txns: dict[int, int] = {}
    for i, fields in enumerate(_ENTRY.iter_unpack(view[HEADER_SIZE_BYTES:])):
        producer_id, epoch, stored_last_sequence, last_offset, offset_delta, timestamp_ms, coordinator_epoch, txn_first = fields
        first_offset = last_offset - offset_delta
        entry = state.producers.get(producer_id)
        batchless = (stored_last_sequence, last_offset, offset_delta) == (NO_SEQUENCE, NO_OFFSET, 0)
        if (
            producer_id < 0 or coordinator_epoch < NO_COORDINATOR_EPOCH or txn_first < NO_TXN_FIRST_OFFSET
            or (batchless and entry is not None) or (not batchless and (offset_delta < 0 or first_offset < 0))
        ):
            raise KafkaStorageError(f"{source}: entry {i} is not a producer entry: {fields}")
        open_txn = None if txn_first == NO_TXN_FIRST_OFFSET else txn_first
        if entry is not None and (
            entry.epoch != epoch or not entry.batches or entry.batches[-1].last_offset >= first_offset
            or len(entry.batches) == BATCHES_REMEMBERED or entry.coordinator_epoch != coordinator_epoch
            or open_txns.get(producer_id) != open_txn
        ):
            raise KafkaStorageError(
                f"{source}: entry {i} (producer {producer_id}, epoch {epoch}, offset {last_offset}) "
                "does not follow the producer's earlier entries"
            )
        if entry is None:
            entry = state.producers[producer_id] = ProducerEntry(epoch, coordinator_epoch=coordinator_epoch)
            if open_txn is not None:
                open_txns[producer_id] = open_txn
        if not batchless:
            first_sequence = _wrap_int32(stored_last_sequence - offset_delta)
            entry.batches.append(
                BatchMetadata(first_sequence, first_sequence + offset_delta, first_offset, last_offset, timestamp_ms)
            )
    for producer_id, first_offset in open_txns.items():
        batches = state.producers[producer_id].batches
        if batches and first_offset > batches[-1].first_offset:
            raise KafkaStorageError(f"{source}: producer {producer_id}'s open transaction starts after its last batch")
        state.restore_open_txn(producer_id, first_offset)
    return state


# ---------------------------------------------------------------------------- files


def snapshot_offsets(dir_path: str | Path) -> list[int]:
    """The offsets of the snapshot files in `dir_path`, ascending."""
    try:
        names = os.listdir(dir_path)
    except OSError as e:
        raise KafkaStorageError(f"cannot list {dir_path}: {e}") from e
    return sorted(int(m.group(1)) for m in map(_SNAPSHOT_FILE.match, names) if m is not None)


def write(dir_path: str | Path, offset: int, state: ProducerStateManager) -> Path:
    """Writes `state` as the snapshot at `offset`, atomically; returns its path."""
    path = Path(dir_path) / snapshot_file_name(offset)
    write_atomically(path, encode(state))
    return path


def read(dir_path: str | Path, offset: int) -> ProducerStateManager:
    """The state in the snapshot at `offset`; `KafkaStorageError` if it is missing,
    unreadable or damaged."""
    path = Path(dir_path) / snapshot_file_name(offset)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise KafkaStorageError(f"cannot read producer snapshot {path}: {e}") from e
    return decode(data, str(path))


def delete(dir_path: str | Path, offsets: Iterable[int]) -> None:
    """Removes the snapshots at `offsets` (and any temp file a crashed write left), then
    fsyncs the directory so a crash cannot bring a deleted snapshot back."""
    dir_path = Path(dir_path)
    try:
        doomed = [snapshot_file_name(offset) for offset in offsets]
        doomed += [name for name in os.listdir(dir_path) if _TEMP_FILE.match(name)]
        if not doomed:
            return
        for name in doomed:
            (dir_path / name).unlink(missing_ok=True)
        fd = os.open(dir_path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise KafkaStorageError(f"cannot delete producer snapshots {offsets} in {dir_path}: {e}") from e
