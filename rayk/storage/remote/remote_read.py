"""Reading whole batches out of a remote segment (Kafka's RemoteLogReader): what a fetch
below the local log start is answered with.

The segment's `.index` object (Kafka's offset index: 8-byte entries of a relative offset
and a .log position, big-endian) gives a position at or before the batch holding the
offset; the .log object is read from there, a chunk at a time, and its batch headers
walked to that batch. The answer holds whole batches from it: at most `max_bytes`, but the
first one whatever its size, and none reaching `max_offset`. One segment per answer, as
Kafka's remote fetch: the next fetch goes on from where this one stopped.
"""

from __future__ import annotations

import bisect
import struct

from rayk.errors import CorruptRecordError
from rayk.storage.records import HEADER_SIZE_BYTES, BatchHeader, iter_batches
from rayk.storage.remote.remote_log_storage import RemoteLogStorage
from rayk.storage.remote.remote_segment import RemoteSegmentMetadata

_INDEX_ENTRY = struct.Struct(">ii")
_TIME_INDEX_ENTRY = struct.Struct(">qi")  # Kafka's .timeindex: timestamp, relative offset
READ_CHUNK_BYTES = 256 * 1024


def index_position(index: bytes, base_offset: int, offset: int) -> int:
    """The .log position of the last index entry below `offset` (0 if none): the batch
    holding `offset` starts at or after it."""
    count = len(index) // _INDEX_ENTRY.size
    ends = [base_offset + _INDEX_ENTRY.unpack_from(index, i * _INDEX_ENTRY.size)[0] for i in range(count)]
    i = bisect.bisect_left(ends, offset) - 1  # entries name a batch's last offset: < offset is wholly before
    return 0 if i < 0 else _INDEX_ENTRY.unpack_from(index, i * _INDEX_ENTRY.size)[1]


def read_batches(storage: RemoteLogStorage, prefix: str, segment: RemoteSegmentMetadata, offset: int, max_bytes: int,
                 max_offset: int | None = None, index: bytes | None = None) -> tuple[bytes, int]:  # fmt: skip
    """(batches, next offset) from the batch holding `offset` in `segment` (see the module
    docstring); `index`: its .index object if the caller has it. Next offset is `offset`
    when nothing was read (it reaches `max_offset`)."""
    assert segment.holds(offset), f"offset {offset} is not in remote segment {segment.name}"
    if index is None:
        index = storage.read(prefix, segment, "index")
    log_size = segment.object_bytes.get("log", 0)
    position = index_position(index, segment.base_offset, offset)
    buf = b""
    # Walk to the batch holding `offset`.
    while True:
        if len(buf) < HEADER_SIZE_BYTES:
            buf += storage.read(prefix, segment, "log", position + len(buf), READ_CHUNK_BYTES)
            if len(buf) < HEADER_SIZE_BYTES:
                return b"", offset  # past the segment's last batch (a compaction gap cannot be: delete only)
        header = BatchHeader.parse(buf)
        if header.size_bytes <= 0 or position + header.size_bytes > log_size:
            raise CorruptRecordError(f"remote segment {prefix}/{segment.name}: bad batch length at position {position}")
        if header.last_offset >= offset:
            break
        if header.size_bytes > len(buf):
            position += header.size_bytes
            buf = b""
        else:
            position += header.size_bytes
            buf = buf[header.size_bytes:]
    # Whole batches from here, up to max_bytes (the first whatever its size).
    out = bytearray()
    next_offset = offset
    read_from = position
    data = buf
    while True:
        if len(data) < HEADER_SIZE_BYTES:
            more = storage.read(prefix, segment, "log", read_from + len(data), max(READ_CHUNK_BYTES, max_bytes - len(out)))
            if not more:
                break
            data += more
            continue
        header = BatchHeader.parse(data)
        if max_offset is not None and header.next_offset > max_offset:
            break
        if out and len(out) + header.size_bytes > max_bytes:
            break
        if header.size_bytes > len(data):
            data += storage.read(prefix, segment, "log", read_from + len(data), header.size_bytes - len(data))
            if header.size_bytes > len(data):
                raise CorruptRecordError(f"remote segment {prefix}/{segment.name}: batch at {read_from} is cut short")
        out += data[: header.size_bytes]
        next_offset = header.next_offset
        read_from += header.size_bytes
        data = data[header.size_bytes:]
        if len(out) >= max_bytes:
            break
    return bytes(out), next_offset


def offset_for_timestamp(storage: RemoteLogStorage, prefix: str, segment: RemoteSegmentMetadata,
                         timestamp_ms: int) -> tuple[int, int] | None:  # fmt: skip
    """(timestamp, offset) of the segment's earliest record with a timestamp >= `timestamp_ms`
    (ListOffsets by time below the local log), found as the local segment finds it: the
    time index's last entry below the target gives an offset, the offset index a position
    at or before it, and the batches from there are scanned."""
    if segment.max_timestamp_ms < timestamp_ms:
        return None
    times = storage.read(prefix, segment, "timeindex")
    hint = segment.base_offset
    for i in range(len(times) // _TIME_INDEX_ENTRY.size):
        entry_ms, relative = _TIME_INDEX_ENTRY.unpack_from(times, i * _TIME_INDEX_ENTRY.size)
        if entry_ms >= timestamp_ms:
            break
        hint = segment.base_offset + relative
    position = index_position(storage.read(prefix, segment, "index"), segment.base_offset, hint)
    for batch in iter_batches(storage.read(prefix, segment, "log", position)):
        if batch.header.max_timestamp >= timestamp_ms:
            for record in batch.records():
                if record.timestamp_ms >= timestamp_ms:
                    return record.timestamp_ms, record.offset
    return None
