"""The columnar encoder of `Producer.send_batch` (`rayk.storage._columns`, and its Python
reference in `rayk.client.columns`) against the record codec that `send()` uses:
- for any records given as columns (lists, numpy or pyarrow, sliced, with nulls, shared
  or per-record headers, any timestamps) and any batch byte limit, the batches are
  byte-identical to `encode_records_reference` of the same records, cut where the limit
  says, and the compiled and Python encoders agree;
- murmur2 partitioning of a key column gives each key the partition `send()` picks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.client.columns import (
    HEADERS_TYPE,
    RecordColumns,
    binary_column,
    column_spec,
    encode_columns_reference,
    key_partitions,
    key_partitions_reference,
    timestamps_argument,
)
from rayk.client.partitioner import murmur2, partition_for_key
from rayk.storage import _columns
from rayk.storage.records import SimpleRecord, encode_records_reference
from tests.test_records import header_keys, nullable_bytes

MANY = settings(max_examples=300, deadline=None)

rows_strategy = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=200),  # value
        nullable_bytes,  # key
        st.none() | st.lists(st.tuples(header_keys, nullable_bytes), max_size=3),  # headers (None: no list)
        st.integers(0, 1 << 45),  # timestamp
    ),
    min_size=1,
    max_size=30,
)


def as_input(column: list, form: str):
    if form == "list":
        return column
    if form == "numpy":
        array = np.empty(len(column), dtype=object)
        array[:] = column
        return array
    padded = pa.array([b"pad"] + column + [b"pad"], type=pa.binary())  # a slice: non-zero array offset
    return padded.slice(1, len(column)) if form == "sliced" else pa.array(column, type=pa.large_binary())


def expected_batches(records: list[SimpleRecord], max_body_bytes: int) -> list[tuple[bytes, int, int, int]]:
    """Greedy cuts by encoded size, with the reference encoder of `send()`'s batches."""
    out, start = [], 0
    while start < len(records):
        end = start + 1
        while end < len(records) and len(encode_records_reference(records[start : end + 1], 0)[0]) <= max_body_bytes:
            end += 1
        body, base, top = encode_records_reference(records[start:end], 0)
        out.append((body, end - start, base, top))
        start = end
    return out


@MANY
@given(rows_strategy, st.sampled_from(["list", "numpy", "sliced", "large"]), st.integers(1, 3000), st.booleans())
def test_columns_encode_to_the_bytes_send_writes(rows, form, max_body_bytes, per_record_headers):
    values = [r[0] for r in rows]
    keys = [r[1] for r in rows]
    stamps = [r[3] for r in rows]
    if per_record_headers:
        header_lists = [r[2] for r in rows]
        headers = pa.array([None if h is None else [{"key": k, "value": v} for k, v in h] for h in header_lists], HEADERS_TYPE)
        record_headers = [tuple(h or ()) for h in header_lists]
    else:
        shared = rows[0][2] or []
        headers, record_headers = shared, [tuple(shared)] * len(rows)
    records = [SimpleRecord(v, k, h, t) for v, k, h, t in zip(values, keys, record_headers, stamps)]
    columns = RecordColumns.of(as_input(values, form), as_input(keys, form), headers, stamps)
    rows_in_order = np.arange(len(rows), dtype=np.int64)
    got = [
        (r.body, r.count, r.base_timestamp_ms, r.max_timestamp_ms)
        for r, _ in columns.batches(rows_in_order, now_ms=0, max_body_bytes=max_body_bytes)
    ]
    assert got == expected_batches(records, max_body_bytes)
    keys_spec = column_spec(columns.keys) if columns.keys is not None else None
    reference = encode_columns_reference(
        column_spec(columns.values), keys_spec, columns.headers, columns.timestamps_ms, rows_in_order, 0, len(rows), 0, max_body_bytes
    )
    assert reference == got[0]
    largest_single = max(len(body) for body, count, _, _ in expected_batches(records, 0))  # a batch per record
    assert columns.largest_record_bytes() <= largest_single, "a lower bound: it never refuses what fits"
    if not per_record_headers:
        assert columns.largest_record_bytes() >= largest_single - 8, "tight but for varint widths"


@MANY
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=40), st.data())
def test_rows_in_any_order_and_the_default_timestamp(values, data):
    order = np.array(data.draw(st.permutations(range(len(values)))), dtype=np.int64)
    columns = RecordColumns.of(values)
    [(records, rows)] = list(columns.batches(order, now_ms=1234, max_body_bytes=1 << 20))
    assert list(rows) == list(order)
    expected = encode_records_reference([SimpleRecord(values[i], None, (), 1234) for i in order], 0)
    assert (records.body, records.base_timestamp_ms, records.max_timestamp_ms) == expected


@MANY
@given(st.lists(nullable_bytes, min_size=1, max_size=50), st.integers(1, 1000))
def test_key_partitions_are_send_s_murmur2_partitions(keys, num_partitions):
    column = binary_column(keys, "keys")
    expected = [-1 if k is None else partition_for_key(k, num_partitions) for k in keys]
    assert key_partitions(column, num_partitions).tolist() == expected
    out = np.empty(len(keys), dtype=np.int32)
    key_partitions_reference(column_spec(column), len(keys), num_partitions, out)
    assert out.tolist() == expected


@MANY
@given(st.binary(max_size=100))
def test_compiled_murmur2_is_java_s(data):
    assert _columns.murmur2(data) == murmur2(data)


def test_inputs_of_every_shape_become_binary_columns():
    assert binary_column(np.array([b"ab", b"c"]), "v").to_pylist() == [b"ab", b"c"]
    assert binary_column(np.array(["é", "x"]), "v").cast(pa.binary()).to_pylist() == ["é".encode(), b"x"]
    grid = np.arange(6, dtype=np.uint8).reshape(2, 3)
    assert binary_column(grid, "v").to_pylist() == [b"\x00\x01\x02", b"\x03\x04\x05"]
    chunked = pa.chunked_array([pa.array([b"a"]), pa.array([None, b"b"])])
    assert binary_column(chunked, "v").to_pylist() == [b"a", None, b"b"]
    assert binary_column(pa.array(["s"], pa.large_string()), "v").cast(pa.binary()).to_pylist() == [b"s"]
    large = np.frombuffer(bytes(range(100)) * 300_000, dtype="S100")  # pa.array gives 2 chunks for it
    column = binary_column(large, "v")
    assert isinstance(column, pa.BinaryArray) and len(column) == 300_000 and column[-1].as_py() == bytes(range(100))
    nuls = np.array([b"\x00ab", b"ab\x00", b"", b"\x00\x00c"], dtype="S3")  # pa.array cuts values at a NUL
    assert binary_column(nuls, "v").to_pylist() == nuls.tolist() == [b"\x00ab", b"ab", b"", b"\x00\x00c"]
    assert binary_column(np.array([b"", b""], dtype="S0"), "v").to_pylist() == [b"", b""]


@pytest.mark.parametrize(
    "values, error",
    [
        ([1, 2], TypeError),
        (pa.array([1, 2]), TypeError),
        (np.zeros((2, 2, 2), dtype=np.uint8), TypeError),
    ],
)
def test_values_that_are_not_bytes_get_a_type_error(values, error):
    with pytest.raises(error):
        RecordColumns.of(values)


def test_bad_keys_headers_and_timestamps_are_refused():
    with pytest.raises(ValueError, match="keys has 1 rows"):
        RecordColumns.of([b"a", b"b"], keys=[b"k"])
    with pytest.raises(ValueError, match="headers has 1 rows"):
        RecordColumns.of([b"a", b"b"], headers=pa.array([[]], HEADERS_TYPE))
    with pytest.raises(TypeError, match="header key must be str"):
        RecordColumns.of([b"a"], headers=[(b"k", b"v")])
    with pytest.raises(ValueError, match=">= 0"):
        timestamps_argument([5, -1], 2)
    with pytest.raises(ValueError, match="2 integers"):
        timestamps_argument([5], 2)
    null_key = pa.array([[{"key": None, "value": b"v"}]], HEADERS_TYPE)
    with pytest.raises(ValueError, match="header key is null"):
        list(RecordColumns.of([b"a"], headers=null_key).batches(np.arange(1), 0, 1 << 20))


def test_datetimes_are_timestamps_in_ms():
    stamps = np.array(["2026-01-01T00:00:00.005"], dtype="datetime64[ms]")
    assert timestamps_argument(stamps, 1).tolist() == [1767225600005]
    arrow = pa.array([1767225600005], pa.timestamp("ms"))
    assert timestamps_argument(arrow, 1).tolist() == [1767225600005]
