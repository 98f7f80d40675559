"""Fetched record batches as Arrow tables (rayk.client.arrow_batches, on the compiled
`_records.decode_columns`): the same records as the per-record decoder, in Spark's Kafka
source columns, for any records, codec and offset range."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.client.arrow_batches import SCHEMA, records_batch, records_table, rows_where
from rayk.errors import CorruptRecordError, InvalidRecordError
from rayk.storage.compression import CompressionType
from rayk.storage.records import HEADER_SIZE_BYTES, SimpleRecord, TimestampType, build_batch, decode_records
from tests.test_records import record_lists

CODECS = [CompressionType.NONE, CompressionType.GZIP, CompressionType.LZ4, CompressionType.ZSTD]


def expected_rows(batches: list[bytes], topic: str, partition: int, start: int, end: int) -> list[dict]:
    rows = []
    for batch in batches:
        for r in decode_records(batch):
            if start <= r.offset < end:
                rows.append({
                    "key": r.key, "value": r.value, "topic": topic, "partition": partition, "offset": r.offset,
                    "timestamp": r.timestamp_ms,
                    "timestampType": int(r.timestamp_type),
                    "headers": [{"key": k, "value": v} for k, v in r.headers],
                })  # fmt: skip
    return rows


@settings(max_examples=200, deadline=None)
@given(st.lists(record_lists, min_size=1, max_size=3), st.sampled_from(CODECS), st.data())
def test_a_fetch_answer_becomes_the_records_of_its_range(record_lists_, codec, data):
    batches, offset = [], 5
    for records in record_lists_:
        kind = data.draw(st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME]))  # per batch
        batches.append(build_batch(records, base_offset=offset, compression=codec, timestamp_type=kind))
        offset += len(records)
    start = data.draw(st.integers(0, offset + 1))
    end = data.draw(st.integers(start, offset + 2))
    batch = records_batch(b"".join(batches), "tópico", 7, start, end)  # one RecordBatch for the whole answer
    batch.validate(full=True)
    assert batch.schema == SCHEMA
    table = pa.Table.from_batches([batch])
    rows = table.to_pylist()
    for row, ms in zip(rows, table.column("timestamp").cast(pa.int64()).to_pylist()):
        row["timestamp"] = ms  # epoch ms, as Kafka stores them
    assert rows == expected_rows(batches, "tópico", 7, start, end)


def test_a_partial_last_batch_and_control_batches_are_left_out():
    data = build_batch([SimpleRecord(b"a", timestamp_ms=1)], base_offset=0)
    control = bytearray(build_batch([SimpleRecord(b"\x00\x00\x00\x00", key=b"\x00\x00\x00\x00", timestamp_ms=2)], base_offset=1))
    control[21:23] = (0x30).to_bytes(2, "big")  # attributes: transactional + control (CRC not checked on read)
    tail = build_batch([SimpleRecord(b"c", timestamp_ms=3)], base_offset=2)[:-3]
    table = records_table(data + bytes(control) + tail, "t", 0, 0, 10)
    assert table.column("value").to_pylist() == [b"a"]


def test_malformed_records_get_the_decoder_s_typed_errors():
    batch = bytearray(build_batch([SimpleRecord(b"value", timestamp_ms=1), SimpleRecord(b"v2", timestamp_ms=2)]))
    batch[57:61] = (3).to_bytes(4, "big")  # the header claims 3 records
    with pytest.raises(InvalidRecordError):
        records_table(bytes(batch), "t", 0, 0, 10)
    with pytest.raises(CorruptRecordError):
        records_table(b"\x00" * 8 + (5).to_bytes(4, "big") + b"\x00" * 60, "t", 0, 0, 10)


def test_an_empty_answer_is_an_empty_table():
    table = records_table(b"", "t", 0, 0, 10)
    assert table.num_rows == 0 and table.schema == SCHEMA
    assert records_table(build_batch([SimpleRecord(b"a")])[:HEADER_SIZE_BYTES], "t", 0, 0, 10).num_rows == 0


def test_decoding_and_filtering_columns_imports_neither_pandas_nor_pyarrow_compute():
    """pa.array and Array.to_numpy import pandas (~0.3 s) the first time in a process, and
    RecordBatch.filter pyarrow.compute (~0.13 s): a read task or a share consumer that used
    them paid that at its first batch, while a share consumer holds its group's whole lock
    window and every other member waits."""
    program = """
import sys
import numpy as np
from rayk.client.arrow_batches import numpy_array, numpy_view, records_batch, rows_where
from rayk.storage.records import SimpleRecord, build_batch
batch = records_batch(build_batch([SimpleRecord(b"v%d" % i, key=b"k") for i in range(5)], base_offset=3), "t", 1, 4, 8)
offsets = numpy_view(batch.column("offset"), np.int64)
assert offsets.tolist() == [4, 5, 6, 7]
kept = rows_where(batch, offsets % 2 == 0).append_column("n", numpy_array(__import__("pyarrow").int16(), np.ones(2, np.int16)))
assert kept.column("offset").to_pylist() == [4, 6] and kept.column("n").to_pylist() == [1, 1]
assert "pandas" not in sys.modules, "pandas was imported"
assert "pyarrow.compute" not in sys.modules, "pyarrow.compute was imported"
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@given(st.lists(st.booleans(), max_size=40))
def test_rows_where_keeps_exactly_the_rows_of_the_mask_in_order(keep):
    batch = pa.RecordBatch.from_arrays([pa.array(range(len(keep)), pa.int64())], names=["i"])
    kept = rows_where(batch, np.array(keep, dtype=bool))
    assert kept.schema == batch.schema
    assert kept.column("i").to_pylist() == [i for i, k in enumerate(keep) if k]
