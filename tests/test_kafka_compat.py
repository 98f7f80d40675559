"""Compatibility of rayk's stored bytes with kafka-python's record format implementation.

kafka-python (`kafka.record`) is an independent implementation of Kafka's record batch
format; it serves as the reference here. Segments and fetch responses rayk writes must
parse with it, batches it builds must be accepted and read back by rayk, and the legacy
formats (magic 0/1) it can still build must be refused without touching the log.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder
from kafka.record.util import decode_varint as kafka_decode_varint
from kafka.record.util import encode_varint as kafka_encode_varint

from rayk.errors import UnsupportedForMessageFormatError
from rayk.storage import Log, LogConfig
from rayk.storage.compression import CompressionType, is_available
from rayk.storage.records import (
    SimpleRecord,
    TimestampType,
    build_batch,
    decode_records,
    encode_varint,
    iter_batches,
)

CODECS = [c for c in CompressionType if is_available(c)]
NOW_MS = 1_700_000_000_000
APPEND_MS = 1_800_000_000_000
FAST = settings(max_examples=50, deadline=None)

# A record as both sides see it: (offset, timestamp, key, value, headers).
Expected = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def _small_log_config(**overrides) -> LogConfig:
    settings = {"segment_bytes": 2048, "segment_index_bytes": 4096, "index_interval_bytes": 256}
    return LogConfig(**{**settings, **overrides})


def _kafka_read(buf: bytes | bytearray) -> list[tuple[DefaultRecordBatch, list]]:
    """Every batch of `buf` parsed by kafka-python, each CRC checked, with its records."""
    records = MemoryRecords(bytes(buf))
    out = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc(), f"kafka-python rejects the CRC of the batch at {batch.base_offset}"
        out.append((batch, list(batch)))
    assert records.valid_bytes() == len(buf), "kafka-python left bytes unparsed"
    return out


def _as_expected(kafka_records) -> list[Expected]:
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in kafka_records]


def _kafka_batch(rows, codec: CompressionType, magic: int = 2, **producer) -> bytes:
    """A batch built by kafka-python from (timestamp, key, value, headers) rows."""
    builder = MemoryRecordsBuilder(magic, int(codec), batch_size=1 << 20, **producer)
    for timestamp, key, value, headers in rows:
        assert builder.append(timestamp, key, value, headers) is not None
    builder.close()
    return bytes(builder.buffer())


def _rows(n: int, with_meta: bool, seed: int = 0) -> list[tuple[int, bytes | None, bytes, list]]:
    # Repetitive values so that kafka-python keeps the codec (it falls back to none when
    # compression does not shrink the batch).
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        value = b"payload-%d|" % i * rng.randint(5, 40)
        key = b"key-%d" % i if with_meta else None
        headers = [("trace", b"t%d" % i), ("ключ", None), ("", b"")] if with_meta else []
        rows.append((NOW_MS + rng.randint(-1000, 1000), key, value, headers))
    return rows


def _segment_files(log_dir: Path) -> list[Path]:
    return sorted(log_dir.glob("*.log"))


# ---------------------------------------------------------------------------- rayk -> kafka-python


def _random_records(rng: random.Random, n: int) -> list[SimpleRecord]:
    records = []
    for _ in range(n):
        key = rng.choice([None, b"", b"k-%d" % rng.randint(0, 99)])
        value = rng.choice([None, b"", b"v" * rng.randint(1, 300), rng.randbytes(rng.randint(1, 120))])
        headers = [(rng.choice(["h", "", "日本", "x-y"]), rng.choice([None, b"", b"hv"])) for _ in range(rng.randint(0, 3))]
        records.append(SimpleRecord(value, key, headers, NOW_MS + rng.randint(-5000, 5000)))
    return records


def _fill_log(log: Log, seed: int = 1) -> tuple[list[Expected], list[tuple[int, int, int]]]:
    """Appends batches of every codec, several per call at times, in two leader epochs.

    Returns the records written and (base offset, codec, leader epoch) per batch.
    """
    rng = random.Random(seed)
    expected: list[Expected] = []
    batches: list[tuple[int, int, int]] = []
    for i in range(24):
        epoch = 0 if i < 12 else 3
        group = []
        for j in range(1 + (i % 3 == 2)):  # every third append carries two batches
            codec = CODECS[(i + j) % len(CODECS)]
            group.append((codec, _random_records(rng, rng.randint(1, 6))))
        data = b"".join(build_batch(records, compression=codec) for codec, records in group)
        info = log.append_as_leader(data, leader_epoch=epoch)
        offset = info.first_offset
        for codec, records in group:
            batches.append((offset, int(codec), epoch))
            for r in records:
                expected.append((offset, r.timestamp_ms, r.key, r.value, list(r.headers)))
                offset += 1
        assert offset == info.last_offset + 1 == log.log_end_offset
    return expected, batches


def test_segment_files_written_by_rayk_parse_with_kafka_python(tmp_path):
    log = Log(tmp_path, _small_log_config())
    expected, batches = _fill_log(log)
    log.flush()
    files = _segment_files(tmp_path)
    assert len(files) >= 3, "the test means to cover several rolled segments"
    seen_records, seen_batches = [], []
    for path in files:
        parsed = _kafka_read(path.read_bytes())
        assert parsed, f"{path.name} is empty"
        assert parsed[0][0].base_offset == int(path.stem), "a segment is named by its first offset"
        for batch, records in parsed:
            assert batch.magic == 2
            assert batch.timestamp_type == 0
            assert [r.offset for r in records] == list(range(batch.base_offset, batch.next_offset))
            seen_batches.append((batch.base_offset, batch.compression_type, batch.leader_epoch))
            seen_records += _as_expected(records)
    assert seen_batches == batches
    assert seen_records == expected
    log.close()


def test_segment_files_still_parse_with_kafka_python_after_reopening(tmp_path):
    log = Log(tmp_path, _small_log_config())
    expected, _ = _fill_log(log, seed=2)
    log.close()
    reopened = Log(tmp_path, _small_log_config())
    assert reopened.truncated_on_recovery_bytes == 0
    seen = [rec for path in _segment_files(tmp_path) for _, records in _kafka_read(path.read_bytes()) for rec in _as_expected(records)]
    assert seen == expected
    reopened.close()


@pytest.mark.parametrize("max_bytes", [1, 700, 1 << 20])
def test_log_read_bytes_parse_with_kafka_python(tmp_path, max_bytes):
    log = Log(tmp_path, _small_log_config())
    expected, _ = _fill_log(log, seed=3)
    log.high_watermark = log.log_end_offset
    seen, offset = [], 0
    while offset < log.log_end_offset:
        result = log.read(offset, max_bytes)
        assert result.records, f"no progress reading at {offset}"
        parsed = _kafka_read(result.records)
        assert parsed[0][0].base_offset == offset
        seen += [rec for _, records in parsed for rec in _as_expected(records)]
        offset = result.next_offset
    assert seen == expected
    log.close()


def test_log_read_from_inside_a_batch_returns_the_whole_batch_to_kafka_python(tmp_path):
    log = Log(tmp_path, _small_log_config())
    log.append_as_leader(build_batch(_random_records(random.Random(4), 2)), leader_epoch=0)
    records = [SimpleRecord(b"m%d" % i, b"k", [("h", b"v")], NOW_MS + i) for i in range(5)]
    log.append_as_leader(build_batch(records, compression=CompressionType.GZIP), leader_epoch=0)
    ((batch, read),) = _kafka_read(log.read(4, 1 << 20).records)
    assert batch.base_offset == 2
    assert [(r.offset, r.value) for r in read] == [(2 + i, b"m%d" % i) for i in range(5)]
    log.close()


@FAST
@given(
    st.lists(
        st.tuples(
            st.none() | st.binary(max_size=40),
            st.none() | st.binary(max_size=200),
            st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
            st.integers(0, 1 << 42),
        ),
        min_size=1,
        max_size=10,
    ),
    st.sampled_from(CODECS),
    st.integers(0, 1 << 40),
)
def test_rayk_built_batches_parse_with_kafka_python(rows, codec, base_offset):
    records = [SimpleRecord(value, key, headers, ts) for key, value, headers, ts in rows]
    ((batch, read),) = _kafka_read(build_batch(records, base_offset=base_offset, compression=codec))
    assert batch.compression_type == int(codec)
    assert batch.records_count == len(records)
    assert batch.max_timestamp == max(r.timestamp_ms for r in records)
    assert _as_expected(read) == [
        (base_offset + i, r.timestamp_ms, r.key, r.value, list(r.headers)) for i, r in enumerate(records)
    ]


@FAST
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1 << 42),
            st.none() | st.binary(max_size=40),
            st.none() | st.binary(max_size=200),
            st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_uncompressed_batches_are_byte_identical_to_kafka_python(rows):
    records = [SimpleRecord(value, key, headers, ts) for ts, key, value, headers in rows]
    # kafka-python's producer leaves baseOffset and partitionLeaderEpoch at 0.
    assert build_batch(records, partition_leader_epoch=0) == _kafka_batch(rows, CompressionType.NONE)


# ---------------------------------------------------------------------------- kafka-python -> rayk


@FAST
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1 << 42),
            st.none() | st.binary(max_size=40),
            st.none() | st.binary(max_size=300),
            st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
        ),
        min_size=1,
        max_size=10,
    ),
    st.sampled_from(CODECS),
)
def test_kafka_python_batches_decode_with_rayk(rows, codec):
    batch = _kafka_batch(rows, codec)
    decoded = decode_records(batch)
    assert [(r.offset, r.timestamp_ms, r.key, r.value, list(r.headers)) for r in decoded] == [
        (i, ts, key, value, headers) for i, (ts, key, value, headers) in enumerate(rows)
    ]


@pytest.mark.parametrize("with_meta", [True, False], ids=["keys+headers", "bare"])
@pytest.mark.parametrize("codec", CODECS, ids=[c.name.lower() for c in CODECS])
def test_kafka_python_batch_is_appended_and_read_back_with_rayk_offsets(tmp_path, codec, with_meta):
    log = Log(tmp_path, _small_log_config(max_message_bytes=1 << 20, segment_bytes=1 << 20))
    log.append_as_leader(build_batch([SimpleRecord(b"first")] * 3), leader_epoch=1)
    rows = _rows(6, with_meta, seed=int(codec))
    batch = _kafka_batch(rows, codec)
    assert DefaultRecordBatch(batch).compression_type == int(codec), "kafka-python dropped the codec"

    info = log.append_as_leader(batch, leader_epoch=2)

    assert (info.first_offset, info.last_offset, info.record_count) == (3, 8, 6)
    ((stored,),) = [list(iter_batches(log.read(3, 1 << 20).records))]
    assert stored.is_valid()
    assert (stored.header.base_offset, stored.header.partition_leader_epoch) == (3, 2)
    assert stored.header.compression is codec
    assert [(r.offset, r.timestamp_ms, r.key, r.value, list(r.headers)) for r in stored.records()] == [
        (3 + i, ts, key, value, headers) for i, (ts, key, value, headers) in enumerate(rows)
    ]
    # Only baseOffset and partitionLeaderEpoch were rewritten; the rest is kafka-python's bytes.
    assert bytes(stored.data[8:12]) == batch[8:12]
    assert bytes(stored.data[16:]) == batch[16:]
    log.close()


def test_several_kafka_python_batches_in_one_append_get_contiguous_offsets(tmp_path):
    log = Log(tmp_path, _small_log_config(segment_bytes=1 << 20))
    batches = [_kafka_batch(_rows(n, True, seed=n), codec) for n, codec in zip([2, 5, 1, 3, 4], CODECS * 2)]
    info = log.append_as_leader(b"".join(batches), leader_epoch=0)
    assert (info.first_offset, info.last_offset) == (0, 14)
    parsed = _kafka_read(log.read(0, 1 << 20).records)
    assert [b.base_offset for b, _ in parsed] == [0, 2, 7, 8, 11]
    assert [r.offset for _, records in parsed for r in records] == list(range(15))
    log.close()


def test_idempotent_producer_fields_of_a_kafka_python_batch_are_kept(tmp_path):
    log = Log(tmp_path, _small_log_config())
    batch = _kafka_batch(_rows(3, True), CompressionType.NONE, producer_id=4242, producer_epoch=7, base_sequence=100)
    log.append_as_leader(batch, leader_epoch=0)
    ((stored, _),) = _kafka_read(log.read(0, 1 << 20).records)
    assert (stored.producer_id, stored.producer_epoch, stored.base_sequence) == (4242, 7, 100)
    log.close()


# ---------------------------------------------------------------------------- LogAppendTime


@pytest.mark.parametrize("codec", CODECS, ids=[c.name.lower() for c in CODECS])
def test_log_append_time_is_what_kafka_python_reads(tmp_path, codec):
    config = _small_log_config(message_timestamp_type=TimestampType.LOG_APPEND_TIME, segment_bytes=1 << 20)
    log = Log(tmp_path, config, clock_ms=lambda: APPEND_MS)
    from_kafka = log.append_as_leader(_kafka_batch(_rows(4, True), codec), leader_epoch=0)
    from_rayk = log.append_as_leader(build_batch(_random_records(random.Random(5), 3), compression=codec), leader_epoch=0)
    assert from_kafka.log_append_time_ms == from_rayk.log_append_time_ms == APPEND_MS

    (path,) = _segment_files(tmp_path)
    parsed = _kafka_read(path.read_bytes())
    assert len(parsed) == 2
    for batch, records in parsed:
        assert batch.timestamp_type == 1  # LogAppendTime
        assert batch.max_timestamp == APPEND_MS
        assert batch.compression_type == int(codec)
        assert {(r.timestamp, r.timestamp_type) for r in records} == {(APPEND_MS, 1)}
    log.close()


# ---------------------------------------------------------------------------- legacy formats


def _log_state(log: Log, log_dir: Path) -> tuple:
    files = {p.name: p.read_bytes() for p in _segment_files(log_dir)}
    return log.log_end_offset, log.size_bytes, log.latest_epoch, log.segment_base_offsets, files


LEGACY = {
    "one-short-message": lambda: [(NOW_MS, b"k", b"v", None)],
    "several-messages": lambda: [(NOW_MS + i, b"key-%d" % i, b"value-%d " % i * 20, None) for i in range(4)],
}


@pytest.mark.parametrize("shape", LEGACY.keys())
@pytest.mark.parametrize("codec", [CompressionType.NONE, CompressionType.GZIP], ids=["none", "gzip"])
@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_magic_batch_is_unsupported_and_leaves_the_log_unchanged(tmp_path, magic, codec, shape):
    log = Log(tmp_path, _small_log_config())
    log.append_as_leader(build_batch(_random_records(random.Random(6), 3)), leader_epoch=1)
    before = _log_state(log, tmp_path)
    legacy = _kafka_batch([(ts, k, v, []) for ts, k, v, _ in LEGACY[shape]()], codec, magic=magic)
    assert legacy[16] == magic

    with pytest.raises(UnsupportedForMessageFormatError):
        log.append_as_leader(legacy, leader_epoch=2)

    assert _log_state(log, tmp_path) == before
    assert log.append_as_leader(build_batch([SimpleRecord(b"after")]), leader_epoch=2).first_offset == 3
    log.close()


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_after_a_valid_batch_rejects_the_whole_append(tmp_path, magic):
    log = Log(tmp_path, _small_log_config())
    before = _log_state(log, tmp_path)
    legacy = _kafka_batch([(NOW_MS, None, b"old", [])], CompressionType.NONE, magic=magic)
    with pytest.raises(UnsupportedForMessageFormatError):
        log.append_as_leader(build_batch([SimpleRecord(b"new")]) + legacy, leader_epoch=0)
    assert _log_state(log, tmp_path) == before
    assert log.log_end_offset == 0
    log.close()


# ---------------------------------------------------------------------------- varints


@FAST
@given(st.integers(-(1 << 63), (1 << 63) - 1))
def test_varint_encoding_matches_kafka_python(value):
    theirs = bytearray()
    kafka_encode_varint(value, theirs.append)
    ours = encode_varint(value)
    assert ours == bytes(theirs)
    assert kafka_decode_varint(ours, 0) == (value, len(ours))
