"""Fetched record batches as Arrow: the columns of Spark's Kafka source, decoded without a
Python object per record.

`records_batch(data, topic, partition, start, end)` turns the v2 record batches of a
fetch answer into one pyarrow RecordBatch of the records with offsets in [start, end)
(`records_table` is the same as a Table):
    key binary, value binary, topic string, partition int32, offset int64,
    timestamp timestamp[ms, UTC], timestampType int32, headers list<struct<key string, value binary>>
All the batches are decoded by one call of the compiled `_records.decode_columns` (after
decompression, if any), which checks the records as the leader's walk does and writes
keys, values and headers straight into one set of Arrow buffers: the bytes are copied
once, from the fetched batches into the columns. Control batches (transaction markers) carry no records and are skipped.
The constant columns (topic, partition, timestampType) are built from numpy, not per record.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rayk.client.columns import HEADER_TYPE, HEADERS_TYPE
from rayk.storage.records import BatchHeader, decode_batches_columns, iter_batches

SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),  # Kafka timestamps are epoch ms
        ("timestampType", pa.int32()),
        ("headers", HEADERS_TYPE),
    ]
)


def records_table(data: bytes | bytearray | memoryview, topic: str, partition: int, start: int, end: int) -> pa.Table:
    """The records of the batches in `data` with offsets in [start, end), as a Table of SCHEMA."""
    return pa.Table.from_batches([records_batch(data, topic, partition, start, end)], schema=SCHEMA)


def records_batch(
    data: bytes | bytearray | memoryview, topic: str, partition: int, start: int, end: int
) -> pa.RecordBatch:
    """The records of the batches in `data` with offsets in [start, end), as one
    RecordBatch of SCHEMA."""
    wanted = []
    for batch in iter_batches(data):
        header = batch.header
        if not header.is_control and header.next_offset > start and header.base_offset < end:
            wanted.append(batch.data)
    headers, buffers = decode_batches_columns(wanted)
    record_batch = _record_batch(headers, buffers, topic, partition)
    offsets = np.frombuffer(buffers[0], dtype=np.int64)
    first, last = np.searchsorted(offsets, start), np.searchsorted(offsets, end)
    return record_batch.slice(first, last - first)


def _binary(kind: pa.DataType, count: int, valid: bytes | None, offsets: bytes, data: bytes) -> pa.Array:
    validity = None if valid is None else pa.py_buffer(valid)
    return pa.Array.from_buffers(kind, count, [validity, pa.py_buffer(offsets), pa.py_buffer(data)])


def numpy_array(kind: pa.DataType, values: np.ndarray) -> pa.Array:
    """A fixed-width Arrow array over a numpy array of the same width, with no copy. Not
    pa.array(values): on numpy input that imports pandas (~0.3 s) the first time in a
    process, which every read task and share consumer would pay at its first batch."""
    values = np.ascontiguousarray(values)
    assert values.dtype.itemsize * 8 == kind.bit_width, (values.dtype, kind)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def numpy_view(array: pa.Array, dtype: type) -> np.ndarray:
    """A fixed-width Arrow array without nulls as numpy, with no copy. Not
    array.to_numpy(), which imports pandas too."""
    assert array.null_count == 0, "a column with nulls"
    width = np.dtype(dtype).itemsize
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * width)


def rows_where(batch: pa.RecordBatch, keep: np.ndarray) -> pa.RecordBatch:
    """The rows of `batch` where the numpy bool array `keep` is true, as slices of its runs
    of kept rows put together: no copy when all are kept. (RecordBatch.filter would import
    pyarrow.compute at a process's first call: ~0.13 s, while a share consumer holds the
    records it polled.)"""
    if keep.all():
        return batch
    edges = np.flatnonzero(np.diff(np.concatenate(([False], keep, [False])).astype(np.int8)))
    runs = [batch.slice(start, end - start) for start, end in zip(edges[::2], edges[1::2])]
    return pa.concat_batches(runs) if runs else batch.slice(0, 0)


def _constant_string(value: str, count: int) -> pa.Array:
    encoded = value.encode()
    offsets = np.arange(count + 1, dtype=np.int32) * len(encoded)
    return pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * count)])


def _record_batch(headers: list[BatchHeader], buffers: tuple[bytes, ...], topic: str, partition: int) -> pa.RecordBatch:
    (offsets, timestamps, key_valid, key_offsets, key_data, value_valid, value_offsets, value_data,
     header_offsets, hkey_offsets, hkey_data, hvalue_valid, hvalue_offsets, hvalue_data) = buffers  # fmt: skip
    counts = [header.record_count for header in headers]
    n = sum(counts)
    headers_total = len(hkey_offsets) // 4 - 1
    header_structs = pa.StructArray.from_arrays(
        [
            _binary(pa.string(), headers_total, None, hkey_offsets, hkey_data),
            _binary(pa.binary(), headers_total, hvalue_valid, hvalue_offsets, hvalue_data),
        ],
        fields=list(HEADER_TYPE),
    )
    header_lists = pa.ListArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(header_offsets)]), header_structs, type=HEADERS_TYPE
    )
    columns = [
        _binary(pa.binary(), n, key_valid, key_offsets, key_data),
        _binary(pa.binary(), n, value_valid, value_offsets, value_data),
        _constant_string(topic, n),
        numpy_array(pa.int32(), np.full(n, partition, dtype=np.int32)),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(SCHEMA.field("timestamp").type, n, [None, pa.py_buffer(timestamps)]),
        numpy_array(pa.int32(), np.repeat(np.array([int(h.timestamp_type) for h in headers], dtype=np.int32), counts)),
        header_lists,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)
