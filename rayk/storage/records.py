"""Kafka record batch format v2 (magic 2): build, iterate, validate and decode batches.

A batch is a 61-byte header followed by its records, optionally compressed as one blob:

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (=2)
    crc uint32 | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64
    maxTimestamp int64 | producerId int64 | producerEpoch int16 | baseSequence int32
    recordCount int32 | records...

`batchLength` counts the bytes after the length field itself (so a batch occupies
`batchLength + 12` bytes). The CRC-32C covers `attributes` through the end of the batch;
`baseOffset` and `partitionLeaderEpoch` lie outside it so a leader can assign them without
re-checksumming. attributes bits 0-2 are the compression codec, bit 3 the timestamp type
(0 CreateTime, 1 LogAppendTime), bit 4 transactional, bit 5 control, bit 6 the delete horizon.

The delete horizon (KIP-534, Kafka 3.1+): when the log cleaner first keeps a batch holding
a tombstone, it rewrites the batch with bit 6 set and `baseTimestamp` = the cleaner's clock
+ `delete.retention.ms`, the time from which a later clean may drop the tombstones. Read
from Kafka's DefaultRecordBatch, MemoryRecords.filterTo and MemoryRecordsBuilder (3.9):
`baseTimestamp()` and `deleteHorizonMs()` both read that one field, and a record's timestamp
is still `baseTimestamp + timestampDelta` (DefaultRecord.readFrom); the builder writes each
kept record with `timestampDelta = its timestamp - horizon` (negative, usually), so every
record keeps its absolute timestamp and `maxTimestamp` stays the records' largest. The
field is then no longer the first record's timestamp, whatever DefaultRecordBatch's class
comment says; only the flag tells a reader which it is.

Each record is `length varint` then: attributes int8, timestampDelta varlong, offsetDelta
varint, keyLength varint + key, valueLength varint + value (-1 = null), header count varint,
then per header keyLength varint + utf-8 key, valueLength varint + value. Varints are
zig-zag encoded, as in protobuf.

This module is pure: it never touches files. Functions take `bytes`, `bytearray` or
`memoryview` and never copy record payloads they do not need to.
"""

from __future__ import annotations

import array
import enum
import logging
import struct
import time
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c as _crc32c

from rayk.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
    UnsupportedForMessageFormatError,
)
from rayk.storage.compression import CompressionType, compress, decompress

MAGIC_V2 = 2
HEADER_SIZE_BYTES = 61
LOG_OVERHEAD_BYTES = 12  # baseOffset + batchLength: the part not counted in batchLength
NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

# Byte positions of the header fields, as in Kafka's DefaultRecordBatch.
BASE_OFFSET_POS = 0
LENGTH_POS = 8
PARTITION_LEADER_EPOCH_POS = 12
MAGIC_POS = 16
CRC_POS = 17
ATTRIBUTES_POS = 21
LAST_OFFSET_DELTA_POS = 23
BASE_TIMESTAMP_POS = 27
MAX_TIMESTAMP_POS = 35
RECORDS_COUNT_POS = 57

_HEADER = struct.Struct(">qiibIhiqqqhii")
_new_tuple = tuple.__new__  # a NamedTuple from a tuple of its fields, without _make's length check
assert _HEADER.size == HEADER_SIZE_BYTES
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")

_LEGACY_MIN_LENGTH = 14  # Kafka's LegacyRecord.RECORD_OVERHEAD_V0: the smallest magic 0 message
_COMPRESSION_MASK = 0x07
_MAX_CODEC_ID = max(CompressionType)  # zstd (4); ids 5-7 name no codec
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20
_DELETE_HORIZON_BIT = 0x40  # Kafka's DELETE_HORIZON_FLAG_MASK: baseTimestamp holds the delete horizon


class TimestampType(enum.IntEnum):
    """Which clock a batch's timestamps are (attributes bit 3, and a topic's
    message.timestamp.type): the producer's CreateTime, or the leader's LogAppendTime."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1

    @classmethod
    def from_name(cls, name: str | int | TimestampType) -> TimestampType:
        """Accepts Kafka's config spellings `CreateTime` / `LogAppendTime`."""
        if isinstance(name, int):
            return cls(name)
        spelled = {"createtime": cls.CREATE_TIME, "logappendtime": cls.LOG_APPEND_TIME}
        key = name.replace("_", "").lower()
        if key not in spelled:
            raise ValueError(f"unknown timestamp type {name!r}; use CreateTime or LogAppendTime")
        return spelled[key]


class BatchHeader(NamedTuple):
    """The 61-byte header of one v2 batch, decoded; offsets are absolute. A NamedTuple:
    a read walks every header between an index entry and its offset, and building one is
    ~1 µs against ~5.6 for a frozen dataclass of 13 fields."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @classmethod
    def parse(cls, buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
        """Decodes the header at `pos`; the caller checked that 61 bytes are there."""
        return _new_tuple(cls, _HEADER.unpack_from(buf, pos))

    @property
    def size_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD_BYTES

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> CompressionType:
        """The batch's codec; INVALID_RECORD for an id no codec has (5-7): a header's bytes
        may be anyone's, and a bad one is its batch's error, never a crash of the reader."""
        codec_id = self.attributes & _COMPRESSION_MASK
        if codec_id > _MAX_CODEC_ID:
            raise InvalidRecordError(f"batch at offset {self.base_offset} names compression codec {codec_id}, which does not exist")
        return CompressionType(codec_id)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes >> 3) & 1)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def delete_horizon_ms(self) -> int | None:
        """When the log cleaner may drop this batch's tombstones (Kafka's deleteHorizonMs):
        `base_timestamp` once a clean kept them and set the flag, None before."""
        return self.base_timestamp if self.attributes & _DELETE_HORIZON_BIT else None


class SimpleRecord(NamedTuple):
    """A record to be written: what a producer supplies. `timestamp_ms=None` means now.
    A tuple, so the encoders also take a plain (value, key, headers, timestamp_ms) tuple,
    which is what the producer's send() makes: ~30 ns instead of ~500 for a frozen
    dataclass."""

    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp_ms: int | None = None


# What the encoders take: a SimpleRecord, or the plain tuple of its fields that send() makes.
RecordToWrite = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int | None]


@dataclass(frozen=True, slots=True)
class Record:
    """A record read back from a batch, with its absolute offset and effective timestamp."""

    offset: int
    timestamp_ms: int
    timestamp_type: TimestampType
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """One whole batch inside a buffer: its header and a view of its bytes."""

    header: BatchHeader
    data: memoryview

    def is_valid(self) -> bool:
        return compute_crc(self.data) == self.header.crc

    def records(self) -> list[Record]:
        return decode_records(self.data)


# ---------------------------------------------------------------------------- varints


def _zigzag_varint(value: int) -> bytes:
    z = (value << 1) ^ (value >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# Lengths, deltas and small counts dominate encoding; precomputed they cost a list lookup.
_VARINT_CACHE_MIN = -1
_VARINT_CACHE = [_zigzag_varint(v) for v in range(_VARINT_CACHE_MIN, 1 << 14)]


def encode_varint(value: int) -> bytes:
    """Zig-zag varint (Kafka's ByteUtils.writeVarint/writeVarlong), for 64-bit values."""
    if _VARINT_CACHE_MIN <= value < (1 << 14):
        return _VARINT_CACHE[value - _VARINT_CACHE_MIN]
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"varint out of int64 range: {value}")
    return _zigzag_varint(value)


def decode_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Returns (value, position after it). Raises IndexError past the end of `buf`."""
    b = buf[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    z = b & 0x7F
    shift = 7
    while True:
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise InvalidRecordError("varint is longer than 10 bytes")
    return (z >> 1) ^ -(z & 1), pos


# ---------------------------------------------------------------------------- building


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    """CRC-32C of a batch from `attributes` to its end: the value its header must carry."""
    return _crc32c.crc32c(memoryview(batch)[ATTRIBUTES_POS:])


def _append_nullable_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out += encode_varint(-1)
    else:
        out += encode_varint(len(data))
        out += data


def _encode_record(out: bytearray, offset_delta: int, timestamp_delta: int, record: SimpleRecord) -> None:
    value, key, headers, _ = record
    body = bytearray(b"\x00")  # record attributes: unused, always 0
    body += encode_varint(timestamp_delta)
    body += encode_varint(offset_delta)
    _append_nullable_bytes(body, key)
    _append_nullable_bytes(body, value)
    body += encode_varint(len(headers))
    for header_key, header_value in headers:
        _append_nullable_bytes(body, header_key.encode("utf-8"))
        _append_nullable_bytes(body, header_value)
    out += encode_varint(len(body))
    out += body


def build_batch(
    records: Iterable[RecordToWrite],
    *,
    base_offset: int = 0,
    compression: CompressionType | str | None = CompressionType.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    now_ms: int | None = None,
) -> bytes:
    """Encodes records into one v2 batch with offset deltas 0..n-1 and a valid CRC.
    The records are encoded by the compiled `_records.encode_records`."""
    if not isinstance(records, (list, tuple)):
        records = list(records)
    if not records:
        raise ValueError("a record batch needs at least one record")
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    body, base_timestamp, max_timestamp = _records.encode_records(records, now_ms)
    return assemble_batch(
        EncodedRecords(body, len(records), base_timestamp, max_timestamp),
        base_offset=base_offset,
        compression=compression,
        timestamp_type=timestamp_type,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=is_transactional,
        is_control=is_control,
    )


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """The records section of a v2 batch (offset deltas 0..count-1), not yet framed."""

    body: bytes
    count: int
    base_timestamp_ms: int
    max_timestamp_ms: int


def assemble_batch(
    records: EncodedRecords,
    *,
    base_offset: int = 0,
    compression: CompressionType | str | None = CompressionType.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
) -> bytes:
    """Frames an encoded records section as one v2 batch: compresses it if asked, writes
    the 61-byte header and the CRC."""
    if records.count < 1:
        raise ValueError("a record batch needs at least one record")
    codec = CompressionType.from_name(compression)
    payload = compress(codec, records.body) if codec != CompressionType.NONE else records.body
    attributes = int(codec) | (int(timestamp_type) << 3)
    if is_transactional:
        attributes |= _TRANSACTIONAL_BIT
    if is_control:
        attributes |= _CONTROL_BIT
    # The header on its own, its CRC continued over the payload, and one copy of the two
    # into the batch: the payload is most of a batch, copied once (a producer's sender
    # thread assembles a batch of up to batch.size bytes this way, holding the GIL).
    header = bytearray(HEADER_SIZE_BYTES)
    _HEADER.pack_into(
        header, 0, base_offset, HEADER_SIZE_BYTES + len(payload) - LOG_OVERHEAD_BYTES, partition_leader_epoch,
        MAGIC_V2, 0, attributes, records.count - 1, records.base_timestamp_ms, records.max_timestamp_ms, producer_id,
        producer_epoch, base_sequence, records.count,
    )
    _UINT32.pack_into(header, CRC_POS, _crc32c.crc32c(payload, compute_crc(header)))
    return b"".join((header, payload))


def encode_records_reference(records: Sequence[SimpleRecord], now_ms: int) -> tuple[bytes, int, int]:
    """The records section of a batch, in plain Python: the reference for the compiled
    `_records.encode_records`, byte for byte. Returns (body, base timestamp, max timestamp)."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    timestamps = [now_ms if r[3] is None else r[3] for r in records]
    base_timestamp = timestamps[0]
    body = bytearray()
    for delta, (record, ts) in enumerate(zip(records, timestamps)):
        _encode_record(body, delta, ts - base_timestamp, record)
    return bytes(body), base_timestamp, max(timestamps)


# ---------------------------------------------------------------------------- reading


def end_offset_of(buf: bytes | bytearray | memoryview) -> int:
    """The offset after the last whole batch at the start of `buf` (0 if none): where a
    fetch that returned `buf` goes on, past control batches and compacted-away records."""
    end = 0
    for batch in iter_batches(buf):
        end = batch.header.next_offset
    return end


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[RecordBatch]:
    """Yields the whole batches at the start of `buf`; stops at an incomplete tail.

    A fetch response may end in a partial batch (Kafka cuts at max_bytes), so an
    incomplete last batch is not an error here. A length field that cannot be a v2
    batch is: it means the buffer is not a sequence of batches.
    """
    view = memoryview(buf)
    pos, end = 0, len(view)
    while end - pos >= LOG_OVERHEAD_BYTES:
        batch_length = _INT32.unpack_from(view, pos + LENGTH_POS)[0]
        size = batch_length + LOG_OVERHEAD_BYTES
        if size < HEADER_SIZE_BYTES:
            # A magic 0/1 message can be shorter than a v2 header: name its format, not corruption.
            if _is_short_legacy_message(view, pos):
                raise UnsupportedForMessageFormatError(
                    f"batch at byte {pos} has magic {view[pos + MAGIC_POS]}; rayk reads only magic 2 (Kafka >= 0.11) batches"
                )
            raise CorruptRecordError(f"batch at byte {pos} has length {batch_length}, below the v2 minimum")
        if end - pos < size:
            return
        magic = view[pos + MAGIC_POS]
        if magic != MAGIC_V2:
            raise UnsupportedForMessageFormatError(
                f"batch at byte {pos} has magic {magic}; rayk reads only magic 2 (Kafka >= 0.11) batches"
            )
        yield RecordBatch(BatchHeader.parse(view, pos), view[pos : pos + size])
        pos += size


def decode_records(batch: bytes | bytearray | memoryview, max_uncompressed_bytes: int | None = None) -> list[Record]:
    """Decodes every record of one whole batch, decompressing it if needed.

    Raises InvalidRecordError when the records do not match the header, and
    CorruptRecordError when they cannot be decompressed.
    """
    header, decoded = decode_record_tuples(batch, max_uncompressed_bytes)
    kind = header.timestamp_type
    return [Record(offset, timestamp, kind, key, value, tuple(headers)) for offset, timestamp, key, value, headers in decoded]


RecordTuple = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def decode_record_tuples(
    batch: bytes | bytearray | memoryview, max_uncompressed_bytes: int | None = None
) -> tuple[BatchHeader, list[RecordTuple]]:
    """`decode_records` without a Record object per record: the batch's header and each
    record as (offset, timestamp, key, value, headers), decoded by compiled code (the
    consumer's path)."""
    return _decode_compiled(_records.decode_records, batch, max_uncompressed_bytes)


def decode_consumer_records(
    batch: bytes | bytearray | memoryview, record_type: type, topic: str, partition: int, start_offset: int,
    max_uncompressed_bytes: int | None = None,
) -> list:
    """The batch's records at `start_offset` or later, each a `record_type` (the consumer's
    ConsumerRecord) of (topic, partition, offset, timestamp, timestamp_type, key, value,
    headers, len(key) or -1, len(value) or -1), built by compiled code: the consumer's
    iteration, which hands these out as they are."""
    header, body, append_time = _records_section(batch, max_uncompressed_bytes)
    try:
        return _records.decode_consumer_records(
            body, header.record_count, header.base_offset, header.base_timestamp, append_time,
            record_type, topic, partition, int(header.timestamp_type), start_offset,
        )  # fmt: skip
    except ValueError as e:
        raise InvalidRecordError(f"batch at offset {header.base_offset}: {e}") from None


def decode_batches_columns(
    batches: Sequence[bytes | bytearray | memoryview], max_uncompressed_bytes: int | None = None
) -> tuple[list[BatchHeader], tuple[bytes, ...]]:
    """The batches' headers and the records of all of them as one set of column buffers in
    Arrow's layouts (see `_records.decode_columns`), decoded by compiled code with no
    object per record; the same checks and errors as `decode_record_tuples`."""
    headers, sections = [], []
    for batch in batches:
        header, body, append_time = _records_section(batch, max_uncompressed_bytes)
        headers.append(header)
        sections.append((body, header.record_count, header.base_offset, header.base_timestamp, append_time))
    try:
        return headers, _records.decode_columns(sections)
    except ValueError as e:  # "batch at offset N: ..."
        raise InvalidRecordError(str(e)) from None


def _decode_compiled(decode: Callable, batch: bytes | bytearray | memoryview, max_uncompressed_bytes: int | None) -> tuple:
    header, body, append_time = _records_section(batch, max_uncompressed_bytes)
    try:
        decoded = decode(body, header.record_count, header.base_offset, header.base_timestamp, append_time)
    except ValueError as e:
        raise InvalidRecordError(f"batch at offset {header.base_offset}: {e}") from None
    return header, decoded


def _records_section(
    batch: bytes | bytearray | memoryview, max_uncompressed_bytes: int | None
) -> tuple[BatchHeader, memoryview, int]:
    """A v2 batch's header, its records section (decompressed) and the LogAppendTime
    that stands for every record's timestamp (-1 for CreateTime)."""
    view = memoryview(batch)
    if len(view) < HEADER_SIZE_BYTES:
        raise CorruptRecordError(f"batch of {len(view)} bytes is shorter than the 61-byte header")
    header = BatchHeader.parse(view)
    if header.magic != MAGIC_V2:
        raise UnsupportedForMessageFormatError(f"magic {header.magic} is not supported; only magic 2")
    body = view[HEADER_SIZE_BYTES : header.size_bytes]
    if header.compression != CompressionType.NONE:
        body = memoryview(decompress(header.compression, body, max_uncompressed_bytes))
    append_time = header.max_timestamp if header.timestamp_type == TimestampType.LOG_APPEND_TIME else -1
    return header, body, append_time


def decode_records_reference(
    body: bytes | bytearray | memoryview, record_count: int, base_offset: int, base_timestamp: int, append_time: int
) -> list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    """The compiled `_records.decode_records` in plain Python: the checks (and ValueError
    messages) of `scan_records_reference` with offset deltas that need only grow (a batch
    thinned by log compaction keeps its records' offsets), then each record as (offset,
    timestamp, key, value, headers); `append_time` >= 0 is every record's timestamp
    (LogAppendTime)."""
    if record_count < 0:
        raise ValueError(f"record count {record_count}")
    scan_records_reference(body, record_count, strict_offsets=False)
    data = bytes(body)
    pos = 0

    def field() -> bytes | None:
        nonlocal pos
        length, pos = decode_varint(data, pos)
        if length < 0:
            return None
        pos += length
        return data[pos - length : pos]

    out = []
    for _ in range(record_count):
        _length, pos = decode_varint(data, pos)
        timestamp_delta, pos = decode_varint(data, pos + 1)  # after the attributes
        offset_delta, pos = decode_varint(data, pos)
        key, value = field(), field()
        header_count, pos = decode_varint(data, pos)
        headers = []
        for _h in range(header_count):
            header_key = field()
            headers.append((header_key.decode("utf-8"), field()))
        timestamp = append_time if append_time >= 0 else base_timestamp + timestamp_delta
        out.append((base_offset + offset_delta, timestamp, key, value, headers))
    return out


def decode_consumer_records_reference(
    body: bytes | bytearray | memoryview, record_count: int, base_offset: int, base_timestamp: int, append_time: int,
    record_type: type, topic: str, partition: int, timestamp_type: int, start_offset: int,
) -> list:
    """The compiled `_records.decode_consumer_records` in plain Python."""
    if not issubclass(record_type, tuple):
        raise TypeError("record_type must be a tuple type")
    return [
        tuple.__new__(record_type, (topic, partition, offset, timestamp, timestamp_type, key, value, headers,
                                    -1 if key is None else len(key), -1 if value is None else len(value)))
        for offset, timestamp, key, value, headers in decode_records_reference(
            body, record_count, base_offset, base_timestamp, append_time)
        if offset >= start_offset
    ]  # fmt: skip


def decode_columns_reference(sections: Sequence[tuple]) -> tuple[bytes, ...]:
    """The compiled `_records.decode_columns` in plain Python: the records of the (body,
    record_count, base_offset, base_timestamp, append_time) sections as the same 14 Arrow
    buffers, byte for byte, with the same ValueError."""
    records = []
    for body, record_count, base_offset, base_timestamp, append_time in sections:
        try:
            records += decode_records_reference(body, record_count, base_offset, base_timestamp, append_time)
        except ValueError as e:
            raise ValueError(f"batch at offset {base_offset}: {e}") from None
    headers = [header for record in records for header in record[4]]
    keys, values = _binary_buffers([r[2] for r in records]), _binary_buffers([r[3] for r in records])
    header_keys = _binary_buffers([key.encode() for key, _value in headers])
    header_values = _binary_buffers([value for _key, value in headers])
    header_offsets = [0]
    for record in records:
        header_offsets.append(header_offsets[-1] + len(record[4]))
    return (
        array.array("q", [r[0] for r in records]).tobytes(),
        array.array("q", [r[1] for r in records]).tobytes(),
        *keys,
        *values,
        array.array("i", header_offsets).tobytes(),
        *header_keys[1:],
        *header_values,
    )


def _binary_buffers(fields: list[bytes | None]) -> tuple[bytes, bytes, bytes]:
    """An Arrow binary column's validity bitmap, int32 offsets and data."""
    valid = bytearray((len(fields) + 7) // 8)
    offsets = array.array("i", [0])
    for i, field in enumerate(fields):
        if field is not None:
            valid[i >> 3] |= 1 << (i & 7)
        offsets.append(offsets[-1] + (0 if field is None else len(field)))
    return bytes(valid), offsets.tobytes(), b"".join(f for f in fields if f is not None)


def _read_bytes(body: memoryview, pos: int, limit: int) -> tuple[bytes | None, int]:
    length, pos = decode_varint(body, pos)
    if length < 0:
        return None, pos
    if pos + length > limit:
        raise InvalidRecordError(f"field of {length} bytes runs past the end of its record")
    return bytes(body[pos : pos + length]), pos + length


def check_records(
    batch: bytes | bytearray | memoryview, max_uncompressed_bytes: int | None = None, header: BatchHeader | None = None
) -> None:
    """Checks that a whole batch's records decode, without building them (the leader's
    LogValidator pass): each record's fields fit inside its declared length, offset deltas
    run 0..n-1, the records fill the batch exactly, and a CreateTime batch's maxTimestamp
    is its records' largest timestamp (the time index relies on it). Raises InvalidRecordError (or
    CorruptRecordError if a compressed body does not decompress).

    The record walk is compiled (`_records`); `scan_records_reference` is the same walk
    in Python, which the tests hold it to. `header`, if given, is the batch's parsed header.
    """
    view = memoryview(batch)
    if header is None:
        header = BatchHeader.parse(view)
    body = view[HEADER_SIZE_BYTES : header.size_bytes]
    if header.compression != CompressionType.NONE:
        body = memoryview(decompress(header.compression, body, max_uncompressed_bytes))
    try:
        max_timestamp_delta = _records.scan_records(body, header.record_count)
    except ValueError as e:
        raise InvalidRecordError(f"batch at offset {header.base_offset}: {e}") from None
    if header.timestamp_type == TimestampType.CREATE_TIME and max_timestamp_delta is not None:
        records_max = header.base_timestamp + max_timestamp_delta
        if header.max_timestamp != records_max:
            raise InvalidRecordError(
                f"batch maxTimestamp {header.max_timestamp} is not its records' largest timestamp {records_max}"
            )


def scan_records_reference(
    body: bytes | bytearray | memoryview, record_count: int, strict_offsets: bool = True
) -> int | None:
    """The record walk of `check_records` in plain Python: the reference for the compiled
    `_records.scan_records`, with the same result and the same ValueError messages.
    Returns the largest timestamp delta (None for no records). `strict_offsets`: offset
    deltas run 0..n-1 (a producer's batch); else they need only grow (the decoders' walk,
    over batches that compaction may have thinned)."""
    data = bytes(body)  # bytes indexing is the fastest single-byte read Python has
    pos, end = 0, len(data)

    def varint() -> int:
        nonlocal pos
        try:
            value, pos = decode_varint(data, pos)
        except IndexError:
            raise ValueError(_PAST_END) from None
        except InvalidRecordError as e:
            raise ValueError(e.args[0]) from None
        if not -(1 << 63) <= value < (1 << 63):
            raise ValueError("varint out of int64 range")
        return value

    def skip(length: int) -> None:
        nonlocal pos
        if length > 0:
            if length > end - pos:
                raise ValueError(_PAST_END)
            pos += length

    max_timestamp_delta = None
    expected_delta = 0
    for _ in range(record_count):
        length = varint()
        if length <= 0 or length > end - pos:
            raise ValueError(f"record length {length} does not fit in the batch")
        record_end = pos + length
        pos += 1  # attributes
        timestamp_delta = varint()
        if max_timestamp_delta is None or timestamp_delta > max_timestamp_delta:
            max_timestamp_delta = timestamp_delta
        offset_delta = varint()
        if offset_delta != expected_delta if strict_offsets else offset_delta < expected_delta:
            at_least = "" if strict_offsets else "at least "
            raise ValueError(f"record offset delta {offset_delta}, expected {at_least}{expected_delta}")
        if offset_delta > 0x7FFFFFFF:  # an int32 in Kafka's batches
            raise ValueError(f"record offset delta {offset_delta} is beyond int32")
        expected_delta = offset_delta + 1
        skip(varint())  # key
        skip(varint())  # value
        header_count = varint()
        if header_count < 0:
            raise ValueError(f"invalid header count {header_count}")
        for _ in range(header_count):
            key_length = varint()
            if key_length < 0:
                raise ValueError("record header key is null")
            if key_length > end - pos:
                raise ValueError(_PAST_END)
            try:
                data[pos : pos + key_length].decode("utf-8")  # as decode_records (and consumers) will
            except UnicodeDecodeError:
                raise ValueError("a header key that is not UTF-8") from None
            pos += key_length
            skip(varint())  # header value
        if pos != record_end:
            raise ValueError(f"record declares {length} bytes but its fields take {length + pos - record_end}")
    if pos != end:
        raise ValueError(f"{end - pos} bytes after its last record")
    return max_timestamp_delta


_PAST_END = "records running past its end"


# ---------------------------------------------------------------------------- compaction


def filter_batch(
    batch: bytes | bytearray | memoryview,
    retain: Callable[[int, int, bytes | None, bool], bool],
    keep_empty: bool,
    delete_horizon_ms: int | None = None,
) -> bytes | None:
    """The batch with only the records for which `retain(offset, timestamp_ms, key,
    is_tombstone)` is true, written as Kafka's cleaner writes it (MemoryRecords.filterTo).

    The input's own bytes come back when every record stays and no delete horizon is to be
    set. A batch that keeps a tombstone but has no delete horizon yet gets
    `delete_horizon_ms` (the cleaner's now + delete.retention.ms; None: never set one).
    Otherwise the batch is rebuilt as Kafka's MemoryRecordsBuilder does: the same base
    offset, lastOffsetDelta (so a producer's sequence range is unchanged), partition leader
    epoch, producer fields and codec; each kept record re-encoded with its offset and
    timestamp (record attributes 0, as Kafka writes them) and timestamp deltas from the
    new baseTimestamp, which is the delete horizon if the batch has one, else the first
    kept record's timestamp (a LogAppendTime batch's records all read as its maxTimestamp);
    maxTimestamp the kept records' largest (CreateTime) or unchanged (LogAppendTime); the
    CRC recomputed. When no record stays: None, or if `keep_empty` (a producer's batch
    whose sequence numbers must survive) Kafka's empty batch (writeEmptyHeader): no
    records, no compression, no delete horizon, baseTimestamp -1, maxTimestamp unchanged.
    """
    header, records = decode_record_tuples(batch)
    kept = [r for r in records if retain(r[0], r[1], r[2], r[3] is None)]
    horizon_ms = header.delete_horizon_ms
    sets_horizon = horizon_ms is None and delete_horizon_ms is not None and any(r[3] is None for r in kept)
    if len(kept) == header.record_count and not sets_horizon:
        return bytes(memoryview(batch)[: header.size_bytes])
    flags = header.attributes & (_TIMESTAMP_TYPE_BIT | _TRANSACTIONAL_BIT | _CONTROL_BIT)
    if not kept:
        if not keep_empty:
            return None
        return _frame(header, flags, b"", 0, NO_TIMESTAMP, header.max_timestamp)
    if sets_horizon:
        horizon_ms = delete_horizon_ms
    if horizon_ms is not None:
        flags |= _DELETE_HORIZON_BIT
    base_timestamp = kept[0][1] if horizon_ms is None else horizon_ms
    body = bytearray()
    for offset, timestamp_ms, key, value, headers in kept:
        _encode_record(body, offset - header.base_offset, timestamp_ms - base_timestamp, SimpleRecord(value, key, headers))
    codec = header.compression
    payload = compress(codec, bytes(body)) if codec != CompressionType.NONE else bytes(body)
    max_timestamp = header.max_timestamp
    if header.timestamp_type == TimestampType.CREATE_TIME:
        max_timestamp = max(timestamp_ms for _offset, timestamp_ms, *_rest in kept)
    return _frame(header, flags | int(codec), payload, len(kept), base_timestamp, max_timestamp)


def _frame(
    header: BatchHeader, attributes: int, payload: bytes, record_count: int, base_timestamp: int, max_timestamp: int
) -> bytes:
    """A batch of `payload` with `header`'s offsets, epoch and producer fields, checksummed."""
    out = bytearray(HEADER_SIZE_BYTES)
    out += payload
    _HEADER.pack_into(
        out, 0, header.base_offset, len(out) - LOG_OVERHEAD_BYTES, header.partition_leader_epoch, MAGIC_V2, 0,
        attributes, header.last_offset_delta, base_timestamp, max_timestamp, header.producer_id,
        header.producer_epoch, header.base_sequence, record_count,
    )
    _UINT32.pack_into(out, CRC_POS, compute_crc(out))
    return bytes(out)


# ---------------------------------------------------------------------------- validation


def _is_short_legacy_message(view: memoryview, pos: int) -> bool:
    """Whether the fewer-than-61 bytes at `pos` start a magic 0/1 message (smaller than any
    v2 batch), so that it is refused as an unsupported format rather than as corruption.
    Like Kafka's ByteBufferLogInputStream, a length below the magic 0 minimum is corrupt."""
    return (
        len(view) - pos > MAGIC_POS
        and _INT32.unpack_from(view, pos + LENGTH_POS)[0] >= _LEGACY_MIN_LENGTH
        and view[pos + MAGIC_POS] in (0, 1)
    )


def check_batch_at(view: memoryview, pos: int, max_batch_bytes: int | None = None) -> BatchHeader:
    """Checks the batch starting at `pos` of `view` and returns its header.

    The batch must be whole, magic 2, carry a valid CRC, have no more records than its
    offset range holds (fewer, even none, once log compaction thinned it: the batch keeps
    its offset range, as Kafka's cleaner writes it) and, if `max_batch_bytes` is given, be
    no larger. Raises the Kafka error for the first problem found.
    """
    end = len(view)
    if end - pos < HEADER_SIZE_BYTES:
        if _is_short_legacy_message(view, pos):
            raise UnsupportedForMessageFormatError(
                f"batch at byte {pos} has magic {view[pos + MAGIC_POS]}; rayk stores only magic 2 (Kafka >= 0.11) batches"
            )
        raise CorruptRecordError(f"{end - pos} trailing bytes at byte {pos} are not a whole batch header")
    magic = view[pos + MAGIC_POS]
    if magic != MAGIC_V2:
        raise UnsupportedForMessageFormatError(
            f"batch at byte {pos} has magic {magic}; rayk stores only magic 2 (Kafka >= 0.11) batches"
        )
    header = BatchHeader.parse(view, pos)
    size = header.size_bytes
    if size < HEADER_SIZE_BYTES or size > end - pos:
        raise CorruptRecordError(f"batch at byte {pos} declares {size} bytes but {end - pos} remain")
    if max_batch_bytes is not None and size > max_batch_bytes:
        raise RecordTooLargeError(f"batch of {size} bytes exceeds max.message.bytes = {max_batch_bytes}")
    if compute_crc(view[pos : pos + size]) != header.crc:
        raise CorruptRecordError(f"batch at offset {header.base_offset} fails its CRC-32C check")
    if header.last_offset_delta < 0 or not 0 <= header.record_count <= header.last_offset_delta + 1:
        raise InvalidRecordError(
            f"batch has {header.record_count} records but lastOffsetDelta {header.last_offset_delta}"
        )
    return header


def validate_batches(
    buf: bytes | bytearray | memoryview,
    max_batch_bytes: int | None,
    leader_checks: bool,
    allow_transactional: bool = False,
) -> list[BatchHeader]:
    """Checks that `buf` is exactly a sequence of sound batches and returns their headers.

    Each batch passes `check_batch_at`. With `leader_checks` (a producer's batch on the
    leader, as in Kafka's LogValidator) the records are decoded too, so that a batch whose
    CRC is right but whose records are malformed never reaches a log. A producer's control
    batch is refused, and so is a transactional one unless `allow_transactional` (a
    transaction the leader checked). Raises the Kafka error for the first problem; nothing
    is partially accepted.
    """
    view = memoryview(buf)
    if len(view) == 0:
        raise InvalidRecordError("no record batch in the input")
    headers: list[BatchHeader] = []
    pos = 0
    while pos < len(view):
        header = check_batch_at(view, pos, max_batch_bytes)
        if leader_checks:
            if header.is_control:
                raise InvalidRecordError("producers may not write control batches")
            if header.is_transactional and not allow_transactional:  # no coordinator vouched for it
                raise InvalidRecordError("a transactional batch needs an ongoing transaction that its coordinator added this partition to")
            if header.record_count != header.last_offset_delta + 1:  # a producer's offsets are 0..n-1
                raise InvalidRecordError(
                    f"batch has {header.record_count} records but lastOffsetDelta {header.last_offset_delta}"
                )
            # A batch may legitimately compress well; the bound only stops decompression bombs.
            check_records(view[pos : pos + header.size_bytes], max(max_batch_bytes or 0, 1 << 20) * 64, header)
        headers.append(header)
        pos += header.size_bytes
    return headers


def set_base_offset_and_epoch(batch: bytearray, pos: int, base_offset: int, leader_epoch: int) -> None:
    """Rewrites the two header fields outside the CRC: no checksum work needed."""
    _INT64.pack_into(batch, pos + BASE_OFFSET_POS, base_offset)
    _INT32.pack_into(batch, pos + PARTITION_LEADER_EPOCH_POS, leader_epoch)


def set_log_append_time(batch: bytearray, pos: int, size: int, timestamp_ms: int) -> None:
    """Marks a batch LogAppendTime with `timestamp_ms` as maxTimestamp and re-checksums it.

    Both fields lie inside the CRC, so this is the one header rewrite that costs a CRC.
    """
    attributes = _INT16.unpack_from(batch, pos + ATTRIBUTES_POS)[0]
    _INT16.pack_into(batch, pos + ATTRIBUTES_POS, attributes | _TIMESTAMP_TYPE_BIT)
    _INT64.pack_into(batch, pos + MAX_TIMESTAMP_POS, timestamp_ms)
    _UINT32.pack_into(batch, pos + CRC_POS, compute_crc(memoryview(batch)[pos : pos + size]))


# ---------------------------------------------------------------------------- the compiled codec

try:
    from rayk.storage import _records  # built from _records.c by pip install
except ImportError:  # installed where no C compiler was found: the same codec, slower
    logging.getLogger(__name__).warning(
        "rayk.storage._records is not built (no C compiler at install time?); using the Python record codec"
    )
    _records = types.SimpleNamespace(
        scan_records=scan_records_reference,
        encode_records=encode_records_reference,
        decode_records=decode_records_reference,
        decode_consumer_records=decode_consumer_records_reference,
        decode_columns=decode_columns_reference,
    )
