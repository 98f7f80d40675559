"""The columns of `Producer.send_batch`: the caller's values, keys, headers and timestamps
as Arrow arrays, the partition of each keyed record, and the v2 records sections encoded
straight from the Arrow buffers.

Ray users hold arrays, Arrow tables and Dataset blocks, so send_batch takes columns (lists
of bytes, numpy arrays, pyarrow arrays) and makes no Python object per record: the
compiled `rayk.storage._columns` reads the buffers, hashes keys with Kafka's murmur2 (the
partitions `send()` picks for the same keys) and writes records into a batch's bytes.
Where it is not built, `encode_columns_reference` and `key_partitions_reference` do the
same in Python; the property tests hold both to the bytes of `build_batch`.

A column is handed to the encoder as its Arrow buffers: (validity bitmap or None, int32
offsets, data or None, array offset). String arrays have binary's layout, so they pass
as they are; other binary-like types are cast to `binary` (int32 offsets) first.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from rayk.client.partitioner import partition_for_key
from rayk.storage.records import EncodedRecords, encode_varint

logger = logging.getLogger(__name__)

HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
HEADERS_TYPE = pa.list_(HEADER_TYPE)

ColumnSpec = tuple[Any, Any, Any, int]


def binary_column(data: Any, what: str) -> pa.Array:
    """`data` (bytes/str/None per record, as a sequence, numpy array or pyarrow array) as
    one pyarrow `binary` or `string` array; a 2-D uint8 numpy array is one value per row."""
    if isinstance(data, pa.ChunkedArray):
        data = data.combine_chunks()
    try:
        if isinstance(data, np.ndarray):
            if data.ndim == 2 and data.dtype == np.uint8:
                rows, width = data.shape
                buffer = pa.py_buffer(np.ascontiguousarray(data))
                data = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), rows, [None, buffer])
            elif data.ndim != 1:
                raise TypeError(f"{what}: a {data.ndim}-D array; pass one value per row")
            else:
                kind = data.dtype.kind
                data = _numpy_bytes(data) if kind == "S" else pa.array(data) if kind == "U" else pa.array(data, type=pa.binary())
        elif not isinstance(data, pa.Array):
            data = pa.array(data if isinstance(data, (list, tuple)) else list(data), type=pa.binary())
        if isinstance(data, pa.ChunkedArray):  # pa.array splits large inputs (numpy `S` of 30 MB: 2 chunks)
            data = data.combine_chunks()
        kind = data.type
        if pa.types.is_binary(kind) or pa.types.is_string(kind):
            return data
        if pa.types.is_large_binary(kind) or pa.types.is_large_string(kind) or pa.types.is_fixed_size_binary(kind):
            return data.cast(pa.binary())
        if pa.types.is_null(kind):
            return data.cast(pa.binary())
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise TypeError(f"{what} must be bytes, str or None for each record: {e}") from None
    raise TypeError(f"{what} must be a binary or string column, not {data.type}")


def _numpy_bytes(data: np.ndarray) -> pa.Array:
    """A numpy `S` array as binary, each value what numpy gives for it (`data[i]`: the
    fixed-width bytes without trailing NULs). pa.array would cut each value at its first
    NUL, losing the rest of binary values."""
    width = data.dtype.itemsize
    rows = np.ascontiguousarray(data).view(np.uint8).reshape(len(data), width)
    if width == 0:
        lengths = np.zeros(len(data), dtype=np.int64)
    else:
        nonzero = rows != 0
        lengths = np.where(nonzero.any(axis=1), width - np.argmax(nonzero[:, ::-1], axis=1), 0)
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise TypeError("values: more than 2 GiB of bytes in one call")
    packed = rows[np.arange(width) < lengths[:, None]]  # row by row, the kept bytes
    return pa.Array.from_buffers(pa.binary(), len(data), [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(packed)])


def column_spec(array: pa.Array) -> ColumnSpec:
    validity, offsets, data = array.buffers()[:3]
    return (validity, offsets, data, array.offset)


def headers_argument(headers: Any, length: int) -> bytes | tuple | None:
    """The encoder's `headers`: None; the encoded headers section of a list of (str,
    bytes | None) pairs every record carries; or the buffers of a pyarrow
    list<struct<key string, value binary>> column with one entry per record."""
    if headers is None:
        return None
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    if isinstance(headers, pa.Array):
        if len(headers) != length:
            raise ValueError(f"headers has {len(headers)} rows, values has {length}")
        try:
            headers = headers.cast(HEADERS_TYPE)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise TypeError(f"a headers column must be list<struct<key string, value binary>>: {e}") from None
        entries = headers.values
        if entries.null_count:
            raise ValueError("a record header must be a (key, value) pair, not null")
        keys, values = entries.field(0), entries.field(1)
        validity, offsets = headers.buffers()[:2]
        return (validity, offsets, headers.offset, column_spec(keys), column_spec(values))
    section = bytearray(encode_varint(len(headers)))
    for pair in headers:
        key, value = pair
        if not isinstance(key, str):
            raise TypeError(f"a record header key must be str, not {type(key).__name__}")
        if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"a record header value must be bytes or None, not {type(value).__name__}")
        key_bytes = key.encode("utf-8")
        section += encode_varint(len(key_bytes)) + key_bytes
        section += encode_varint(-1) if value is None else encode_varint(len(value)) + bytes(value)
    return bytes(section)


def timestamps_argument(timestamps_ms: Any, length: int) -> np.ndarray | None:
    """Create times as a contiguous int64 array (ms since the epoch), or None for "now"."""
    if timestamps_ms is None:
        return None
    if isinstance(timestamps_ms, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_timestamp(timestamps_ms.type):
            timestamps_ms = timestamps_ms.cast(pa.timestamp("ms")).cast(pa.int64())
        timestamps_ms = timestamps_ms.to_numpy(zero_copy_only=False)
    array = np.asarray(timestamps_ms)
    if np.issubdtype(array.dtype, np.datetime64):
        array = array.astype("datetime64[ms]").astype(np.int64)
    if array.shape != (length,) or not (np.issubdtype(array.dtype, np.integer) or array.dtype == bool):
        raise ValueError(f"timestamps_ms must be {length} integers (ms), got shape {array.shape} of {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.int64)
    if length and array.min() < 0:
        raise ValueError(f"timestamps_ms must be >= 0, got {int(array.min())}")
    return array


def value_sizes(array: pa.Array) -> np.ndarray:
    """Each entry's length in bytes (0 for null), as int64."""
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=array.offset + len(array) + 1)
    return np.diff(offsets[array.offset :]).astype(np.int64)


# ---------------------------------------------------------------------------- the reference


def _entry(spec: ColumnSpec, row: int) -> bytes | None:
    validity, offsets, data, offset = spec
    at = offset + row
    if validity is not None and not (memoryview(validity)[at >> 3] >> (at & 7)) & 1:
        return None
    ends = memoryview(offsets).cast("i")
    return bytes(memoryview(data)[ends[at] : ends[at + 1]]) if data is not None else b""


def _nullable(data: bytes | None) -> bytes:
    return encode_varint(-1) if data is None else encode_varint(len(data)) + data


def _headers_section(headers: bytes | tuple | None, row: int) -> bytes:
    if headers is None:
        return encode_varint(0)
    if isinstance(headers, bytes):
        return headers
    validity, offsets, offset, keys, values = headers
    at = offset + row
    if validity is not None and not (memoryview(validity)[at >> 3] >> (at & 7)) & 1:
        return encode_varint(0)
    ends = memoryview(offsets).cast("i")
    section = bytearray(encode_varint(ends[at + 1] - ends[at]))
    for j in range(ends[at], ends[at + 1]):
        key = _entry(keys, j)
        if key is None:
            raise ValueError("record header key is null")
        section += _nullable(key) + _nullable(_entry(values, j))
    return bytes(section)


def encode_columns_reference(
    values: ColumnSpec,
    keys: ColumnSpec | None,
    headers: bytes | tuple | None,
    timestamps: Any,
    indices: Any,
    start: int,
    stop: int,
    now_ms: int,
    max_body_bytes: int,
) -> tuple[bytes, int, int, int]:
    """`_columns.encode_columns` in plain Python, with the same arguments and result."""
    if start < 0 or stop <= start:
        raise ValueError("a record batch needs at least one record")
    rows = memoryview(indices).cast("B").cast("q") if indices is not None else None
    stamps = memoryview(timestamps).cast("B").cast("q") if timestamps is not None else None
    body = bytearray()
    base = max_timestamp = 0
    count = 0
    for k in range(start, stop):
        row = rows[k] if rows is not None else k
        ts = stamps[row] if stamps is not None else now_ms
        fields = bytearray(b"\x00")  # attributes
        fields += encode_varint(ts - (ts if count == 0 else base)) + encode_varint(count)
        fields += _nullable(_entry(keys, row) if keys is not None else None)
        fields += _nullable(_entry(values, row))
        fields += _headers_section(headers, row)
        record = encode_varint(len(fields)) + fields
        if count and len(body) + len(record) > max_body_bytes:
            break
        base = ts if count == 0 else base
        max_timestamp = ts if count == 0 else max(max_timestamp, ts)
        body += record
        count += 1
    return bytes(body), count, base, max_timestamp


def key_partitions_reference(keys: ColumnSpec, count: int, num_partitions: int, out: Any) -> None:
    """`_columns.murmur2_partitions` in plain Python."""
    partitions = memoryview(out).cast("B").cast("i")
    for row in range(count):
        key = _entry(keys, row)
        partitions[row] = -1 if key is None else partition_for_key(key, num_partitions)


try:
    from rayk.storage import _columns  # built from _columns.c by pip install
except ImportError:  # pragma: no cover - depends on the machine the package was installed on
    logger.warning("rayk.storage._columns is not built; send_batch encodes in Python")
    _columns = types.SimpleNamespace(
        encode_columns=encode_columns_reference, murmur2_partitions=key_partitions_reference
    )


# ---------------------------------------------------------------------------- what the producer calls


def key_partitions(keys: pa.Array, num_partitions: int) -> np.ndarray:
    """Each key's partition as `send()` would pick it (murmur2), -1 for a null key."""
    out = np.empty(len(keys), dtype=np.int32)
    _columns.murmur2_partitions(column_spec(keys), len(keys), num_partitions, out)
    return out


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """One send_batch call's columns, ready for the encoder."""

    values: pa.Array
    keys: pa.Array | None
    headers: bytes | tuple | None
    timestamps_ms: np.ndarray | None

    def __len__(self) -> int:
        return len(self.values)

    @classmethod
    def of(cls, values: Any, keys: Any = None, headers: Any = None, timestamps_ms: Any = None) -> RecordColumns:
        value_array = binary_column(values, "values")
        length = len(value_array)
        key_array = binary_column(keys, "keys") if keys is not None else None
        if key_array is not None and len(key_array) != length:
            raise ValueError(f"keys has {len(key_array)} rows, values has {length}")
        if key_array is not None and key_array.null_count == length:
            key_array = None
        return cls(
            value_array, key_array, headers_argument(headers, length), timestamps_argument(timestamps_ms, length)
        )

    def largest_record_bytes(self) -> int:
        """A lower bound of the largest record's encoded size (0 for no records): its key,
        value and shared headers, plus one byte per framing field; exact but for the
        varint widths and any per-record headers, which the encoder itself bounds."""
        if not len(self.values):
            return 0
        sizes = value_sizes(self.values)
        if self.keys is not None:
            sizes = sizes + value_sizes(self.keys)
        headers_bytes = len(self.headers) if isinstance(self.headers, bytes) else 1
        return int(sizes.max()) + headers_bytes + 6  # length, attributes, deltas, key and value lengths

    def batches(self, rows: np.ndarray, now_ms: int, max_body_bytes: int) -> Iterator[tuple[EncodedRecords, np.ndarray]]:
        """Encodes `rows` (int64 row numbers, in order) as records sections of at most
        `max_body_bytes` each (a single larger record gets a batch of its own); yields
        each with the rows it holds."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        values = column_spec(self.values)
        keys = column_spec(self.keys) if self.keys is not None else None
        start = 0
        while start < len(rows):
            body, count, base_ms, max_ms = _columns.encode_columns(
                values, keys, self.headers, self.timestamps_ms, rows, start, len(rows), now_ms, max_body_bytes
            )
            yield EncodedRecords(body, count, base_ms, max_ms), rows[start : start + count]
            start += count


def row_partitions(columns: RecordColumns, partition: Any, num_partitions: int, topic: str) -> np.ndarray:
    """Each row's partition for `Producer.send_batch`: `partition` (an int, or one per row,
    -1 or null for "by key"), else the key's (murmur2), else -1 (the sticky partitioner
    chooses). ValueError for a partition the topic does not have."""
    if columns.keys is not None:
        partitions = key_partitions(columns.keys, num_partitions)
    else:
        partitions = np.full(len(columns), -1, dtype=np.int32)
    if partition is None:
        return partitions
    if isinstance(partition, (int, np.integer)):
        chosen = np.full(len(columns), int(partition), dtype=np.int64)
    else:
        if isinstance(partition, (pa.Array, pa.ChunkedArray)):
            partition = partition.fill_null(-1).to_numpy(zero_copy_only=False)
        chosen = np.asarray(partition)
        if chosen.shape != (len(columns),) or not np.issubdtype(chosen.dtype, np.integer):
            raise ValueError(f"partition must be an int or {len(columns)} ints, got shape {chosen.shape} of {chosen.dtype}")
    named = chosen >= 0
    bad = chosen[(chosen < -1) | (chosen >= num_partitions)]
    if len(bad):
        raise ValueError(f"topic {topic!r} has partitions 0..{num_partitions - 1}, not {int(bad[0])}")
    partitions[named] = chosen[named]
    return partitions
