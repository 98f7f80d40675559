"""Tests for rayk.storage.records: the Kafka v2 record batch codec and its validation."""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayk.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
    UnsupportedForMessageFormatError,
)
from rayk.storage.compression import CompressionType, compress, is_available
from rayk.storage.records import (
    ATTRIBUTES_POS,
    BASE_OFFSET_POS,
    CRC_POS,
    HEADER_SIZE_BYTES,
    LAST_OFFSET_DELTA_POS,
    LENGTH_POS,
    MAGIC_POS,
    PARTITION_LEADER_EPOCH_POS,
    RECORDS_COUNT_POS,
    BatchHeader,
    RecordBatch,
    SimpleRecord,
    TimestampType,
    build_batch,
    check_batch_at,
    check_records,
    compute_crc,
    decode_batches_columns,
    decode_records,
    decode_records_reference,
    decode_varint,
    encode_varint,
    filter_batch,
    iter_batches,
    set_base_offset_and_epoch,
    set_log_append_time,
    validate_batches,
)

CODECS = [c for c in CompressionType if is_available(c)]
COMPRESSED = [c for c in CODECS if c is not CompressionType.NONE]
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
NOW_MS = 1_700_000_000_000

FAST = settings(max_examples=60, deadline=None)


def _records(n: int = 3, ts: int = NOW_MS) -> list[SimpleRecord]:
    return [
        SimpleRecord(value=b"value-%d " % i * 10, key=b"key-%d" % i, headers=[("h", b"%d" % i)], timestamp_ms=ts + i)
        for i in range(n)
    ]


def _recrc(batch: bytearray, pos: int = 0) -> bytearray:
    """Re-checksums the batch at `pos` so that only a deliberate defect remains."""
    size = struct.unpack_from(">i", batch, pos + LENGTH_POS)[0] + 12
    struct.pack_into(">I", batch, pos + CRC_POS, compute_crc(memoryview(batch)[pos : pos + size]))
    return batch


def _header(batch: bytes | bytearray) -> BatchHeader:
    return BatchHeader.parse(batch)


# ---------------------------------------------------------------------------- strategies

header_keys = st.text(max_size=12)  # any unicode, incl. non-ASCII and empty
nullable_bytes = st.none() | st.binary(max_size=64)
simple_records = st.builds(
    SimpleRecord,
    value=st.none() | st.binary(max_size=300),
    key=nullable_bytes,
    headers=st.lists(st.tuples(header_keys, nullable_bytes), max_size=4),
    timestamp_ms=st.integers(0, 1 << 45),
)
record_lists = st.lists(simple_records, min_size=1, max_size=12)
codecs = st.sampled_from(CODECS)
base_offsets = st.integers(0, 1 << 50)


# ---------------------------------------------------------------------------- varints


@FAST
@given(st.integers(INT64_MIN, INT64_MAX))
def test_varint_round_trips_every_int64(value):
    encoded = encode_varint(value)
    assert decode_varint(encoded, 0) == (value, len(encoded))
    assert 1 <= len(encoded) <= 10


@FAST
@given(st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=1, max_size=20))
def test_concatenated_varints_decode_in_sequence_from_their_positions(values):
    buf = b"".join(encode_varint(v) for v in values)
    pos, out = 0, []
    while pos < len(buf):
        value, pos = decode_varint(buf, pos)
        out.append(value)
    assert out == values


@pytest.mark.parametrize(
    "value, encoded",
    [
        (0, "00"),
        (-1, "01"),
        (1, "02"),
        (63, "7e"),
        (-64, "7f"),
        (64, "8001"),
        (300, "d804"),
        (-65, "8101"),
        (8191, "fe7f"),  # last value of the precomputed cache
        (8192, "808001"),  # first value past it
        (INT64_MAX, "feffffffffffffffff01"),
        (INT64_MIN, "ffffffffffffffffff01"),
    ],
)
def test_varint_known_encodings(value, encoded):
    assert encode_varint(value).hex() == encoded
    assert decode_varint(bytes.fromhex(encoded), 0) == (value, len(encoded) // 2)


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1, 1 << 70])
def test_encode_varint_rejects_values_outside_int64(value):
    with pytest.raises(ValueError):
        encode_varint(value)


def test_decode_varint_longer_than_ten_bytes_is_invalid_record():
    with pytest.raises(InvalidRecordError):
        decode_varint(b"\xff" * 10 + b"\x01", 0)


def test_decode_varint_running_off_the_buffer_raises_index_error():
    with pytest.raises(IndexError):
        decode_varint(b"\x80\x80", 0)


# ---------------------------------------------------------------------------- build / decode round trip


@FAST
@given(record_lists, codecs, base_offsets)
def test_build_then_decode_returns_the_same_records(records, codec, base_offset):
    batch = build_batch(records, base_offset=base_offset, compression=codec)
    decoded = decode_records(batch)
    assert [r.offset for r in decoded] == list(range(base_offset, base_offset + len(records)))
    for written, read in zip(records, decoded, strict=True):
        assert read.key == written.key
        assert read.value == written.value
        assert read.headers == tuple(written.headers)
        assert read.timestamp_ms == written.timestamp_ms
        assert read.timestamp_type is TimestampType.CREATE_TIME


@FAST
@given(record_lists, codecs, base_offsets)
def test_built_batch_header_describes_its_records(records, codec, base_offset):
    batch = build_batch(records, base_offset=base_offset, compression=codec)
    header = _header(batch)
    timestamps = [r.timestamp_ms for r in records]
    assert header.magic == 2
    assert header.base_offset == base_offset
    assert header.size_bytes == len(batch)
    assert header.record_count == len(records)
    assert header.last_offset_delta == len(records) - 1
    assert header.last_offset == base_offset + len(records) - 1
    assert header.base_timestamp == timestamps[0]
    assert header.max_timestamp == max(timestamps)
    assert header.attributes & 0x07 == int(codec)
    assert header.compression is codec
    assert header.timestamp_type is TimestampType.CREATE_TIME
    assert not header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert header.partition_leader_epoch == -1


@FAST
@given(record_lists, codecs, base_offsets)
def test_built_batch_crc_is_valid(records, codec, base_offset):
    batch = build_batch(records, base_offset=base_offset, compression=codec)
    (parsed,) = list(iter_batches(batch))
    assert parsed.is_valid()
    assert parsed.header.crc == compute_crc(batch)
    assert check_batch_at(memoryview(batch), 0) == parsed.header


@pytest.mark.parametrize("codec", COMPRESSED)
def test_compressed_batch_body_is_not_the_plain_records(codec):
    records = [SimpleRecord(b"x" * 2000)]
    plain = build_batch(records, compression=CompressionType.NONE, now_ms=0)
    packed = build_batch(records, compression=codec, now_ms=0)
    assert len(packed) < len(plain)
    assert decode_records(packed)[0].value == b"x" * 2000


def test_missing_timestamp_is_stamped_with_now():
    batch = build_batch([SimpleRecord(b"a"), SimpleRecord(b"b", timestamp_ms=5)], now_ms=1234)
    assert [r.timestamp_ms for r in decode_records(batch)] == [1234, 5]
    assert _header(batch).max_timestamp == 1234


def test_decreasing_timestamps_encode_negative_deltas():
    records = [SimpleRecord(b"a", timestamp_ms=1000), SimpleRecord(b"b", timestamp_ms=10)]
    batch = build_batch(records)
    assert [r.timestamp_ms for r in decode_records(batch)] == [1000, 10]
    assert (_header(batch).base_timestamp, _header(batch).max_timestamp) == (1000, 1000)


def test_build_batch_refuses_an_empty_record_list():
    with pytest.raises(ValueError):
        build_batch([])


def test_build_batch_writes_producer_fields_and_transactional_bit():
    batch = build_batch(
        _records(2), producer_id=77, producer_epoch=3, base_sequence=40, is_transactional=True, partition_leader_epoch=9
    )
    header = _header(batch)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 40)
    assert header.is_transactional and not header.is_control
    assert header.partition_leader_epoch == 9
    assert RecordBatch(header, memoryview(batch)).is_valid()


def test_build_batch_accepts_codec_names():
    assert _header(build_batch(_records(1), compression="gzip")).compression is CompressionType.GZIP
    assert _header(build_batch(_records(1), compression=None)).compression is CompressionType.NONE


def test_record_batch_records_decodes_its_own_bytes():
    batch = build_batch(_records(3), base_offset=10)
    (parsed,) = iter_batches(batch)
    assert parsed.records() == decode_records(batch)


# ---------------------------------------------------------------------------- header rewrites


@pytest.mark.parametrize("codec", CODECS)
def test_set_log_append_time_keeps_the_crc_valid(codec):
    batch = bytearray(build_batch(_records(4), compression=codec))
    set_log_append_time(batch, 0, len(batch), NOW_MS + 999_999)
    (parsed,) = iter_batches(batch)
    assert parsed.is_valid()
    check_batch_at(memoryview(batch), 0)


@pytest.mark.parametrize("codec", CODECS)
def test_log_append_time_records_take_the_batch_max_timestamp(codec):
    append_time = NOW_MS + 999_999
    batch = bytearray(build_batch(_records(4), compression=codec))
    set_log_append_time(batch, 0, len(batch), append_time)
    header = _header(batch)
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == append_time
    assert header.compression is codec  # the codec bits survive the attribute rewrite
    decoded = decode_records(batch)
    assert [r.timestamp_ms for r in decoded] == [append_time] * 4
    assert {r.timestamp_type for r in decoded} == {TimestampType.LOG_APPEND_TIME}


def test_built_log_append_time_batch_reports_max_timestamp_for_every_record():
    batch = build_batch(_records(3), timestamp_type=TimestampType.LOG_APPEND_TIME)
    assert [r.timestamp_ms for r in decode_records(batch)] == [NOW_MS + 2] * 3


def test_set_log_append_time_touches_only_the_batch_at_its_position():
    first, second = build_batch(_records(2)), build_batch(_records(3), base_offset=2)
    buf = bytearray(first + second)
    set_log_append_time(buf, len(first), len(second), 42)
    assert bytes(buf[: len(first)]) == first
    batches = list(iter_batches(buf))
    assert all(b.is_valid() for b in batches)
    assert [b.header.timestamp_type for b in batches] == [TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME]


@FAST
@given(codecs, st.integers(INT64_MIN, INT64_MAX), st.integers(-(1 << 31), (1 << 31) - 1))
def test_set_base_offset_and_epoch_keeps_the_crc_valid(codec, base_offset, epoch):
    original = build_batch(_records(3), compression=codec)
    batch = bytearray(original)
    set_base_offset_and_epoch(batch, 0, base_offset, epoch)
    header = _header(batch)
    assert (header.base_offset, header.partition_leader_epoch) == (base_offset, epoch)
    assert header.crc == _header(original).crc
    assert compute_crc(batch) == header.crc
    assert batch[ATTRIBUTES_POS:] == original[ATTRIBUTES_POS:]


def test_set_base_offset_shifts_decoded_offsets():
    batch = bytearray(build_batch(_records(3)))
    set_base_offset_and_epoch(batch, 0, 1000, 5)
    assert [r.offset for r in decode_records(batch)] == [1000, 1001, 1002]


def test_set_base_offset_and_epoch_touches_only_the_batch_at_its_position():
    first, second = build_batch(_records(2)), build_batch(_records(1))
    buf = bytearray(first + second)
    set_base_offset_and_epoch(buf, len(first), 2, 7)
    assert bytes(buf[: len(first)]) == first
    assert [(b.header.base_offset, b.header.partition_leader_epoch) for b in iter_batches(buf)] == [(0, -1), (2, 7)]


# ---------------------------------------------------------------------------- iter_batches


def _three_batches() -> list[bytes]:
    return [
        build_batch(_records(2), base_offset=0),
        build_batch(_records(5), base_offset=2, compression=CompressionType.GZIP),
        build_batch(_records(1), base_offset=7),
    ]


def test_iter_batches_yields_every_concatenated_batch():
    batches = _three_batches()
    parsed = list(iter_batches(b"".join(batches)))
    assert [bytes(b.data) for b in parsed] == batches
    assert [b.header.base_offset for b in parsed] == [0, 2, 7]
    assert all(b.is_valid() for b in parsed)


def test_iter_batches_of_an_empty_buffer_yields_nothing():
    assert list(iter_batches(b"")) == []


@FAST
@given(st.data())
def test_iter_batches_stops_cleanly_at_a_partial_trailing_batch(data):
    batches = _three_batches()
    whole = b"".join(batches[:2])
    cut = data.draw(st.integers(0, len(batches[2]) - 1))
    parsed = list(iter_batches(whole + batches[2][:cut]))
    assert [bytes(b.data) for b in parsed] == batches[:2]


@pytest.mark.parametrize("batch_length", [-1, 0, 48, HEADER_SIZE_BYTES - 12 - 1])
def test_iter_batches_length_below_the_v2_minimum_is_corrupt(batch_length):
    bad = bytearray(build_batch(_records(1)))
    struct.pack_into(">i", bad, LENGTH_POS, batch_length)
    with pytest.raises(CorruptRecordError):
        list(iter_batches(build_batch(_records(1)) + bad))


def test_iter_batches_zero_padding_after_a_batch_is_corrupt():
    # Length 0 and magic 0: below even a magic 0 message, so corruption, not a legacy format.
    with pytest.raises(CorruptRecordError):
        list(iter_batches(build_batch(_records(1)) + b"\x00" * 40))


@pytest.mark.parametrize("magic", [0, 1])
def test_iter_batches_legacy_magic_is_unsupported(magic):
    batch = bytearray(build_batch(_records(2)))
    batch[MAGIC_POS] = magic
    with pytest.raises(UnsupportedForMessageFormatError):
        list(iter_batches(batch))


@pytest.mark.parametrize("magic", [0, 1])
def test_iter_batches_short_legacy_message_is_unsupported_not_corrupt(magic):
    # A magic 0/1 message with a tiny payload is shorter than a v2 header (61 bytes).
    message = bytearray(40)
    struct.pack_into(">qi", message, 0, 0, 40 - 12)
    message[MAGIC_POS] = magic
    with pytest.raises(UnsupportedForMessageFormatError):
        list(iter_batches(message))


# ---------------------------------------------------------------------------- check_batch_at / validate_batches


def _both_checks(buf, max_batch_bytes=None, leader_checks=False):
    """Runs check_batch_at on the first batch, then validate_batches on the whole input."""
    yield lambda: check_batch_at(memoryview(buf), 0, max_batch_bytes)
    yield lambda: validate_batches(buf, max_batch_bytes, leader_checks)


@FAST
@given(codecs, st.data())
def test_flipped_byte_inside_the_crc_range_is_corrupt(codec, data):
    batch = bytearray(build_batch(_records(3), compression=codec))
    pos = data.draw(st.integers(ATTRIBUTES_POS, len(batch) - 1), label="pos")
    batch[pos] ^= data.draw(st.integers(1, 255), label="mask")
    for check in _both_checks(batch, leader_checks=True):
        with pytest.raises(CorruptRecordError):
            check()


def test_flipped_crc_field_is_corrupt():
    batch = bytearray(build_batch(_records(1)))
    batch[CRC_POS] ^= 0x01
    with pytest.raises(CorruptRecordError):
        validate_batches(batch, None, False)


@pytest.mark.parametrize("pos", [BASE_OFFSET_POS, BASE_OFFSET_POS + 7, PARTITION_LEADER_EPOCH_POS + 3])
def test_flipped_byte_outside_the_crc_range_still_validates(pos):
    batch = bytearray(build_batch(_records(2)))
    batch[pos] ^= 0xFF
    (header,) = validate_batches(batch, None, True)
    assert header.crc == compute_crc(batch)


@pytest.mark.parametrize("keep", [1, MAGIC_POS, MAGIC_POS + 1, HEADER_SIZE_BYTES - 1, HEADER_SIZE_BYTES, -1])
def test_truncated_batch_is_corrupt(keep):
    batch = build_batch(_records(3))
    truncated = batch[:keep]
    for check in _both_checks(truncated):
        with pytest.raises(CorruptRecordError):
            check()


def test_truncated_second_batch_is_corrupt():
    whole, second = build_batch(_records(1)), build_batch(_records(2), base_offset=1)
    with pytest.raises(CorruptRecordError):
        validate_batches(whole + second[:-3], None, False)


@pytest.mark.parametrize("batch_length", [-5, 0, HEADER_SIZE_BYTES - 13])
def test_length_field_below_the_header_size_is_corrupt(batch_length):
    batch = bytearray(build_batch(_records(1)))
    struct.pack_into(">i", batch, LENGTH_POS, batch_length)
    for check in _both_checks(batch):
        with pytest.raises(CorruptRecordError):
            check()


def test_length_field_past_the_input_is_corrupt():
    batch = bytearray(build_batch(_records(1)))
    struct.pack_into(">i", batch, LENGTH_POS, len(batch))  # claims 12 bytes more than exist
    with pytest.raises(CorruptRecordError):
        validate_batches(batch, None, False)


@pytest.mark.parametrize("magic", [0, 1, 3, 0xFF])
def test_wrong_magic_is_unsupported_for_message_format(magic):
    batch = bytearray(build_batch(_records(2)))
    batch[MAGIC_POS] = magic
    _recrc(batch)  # magic lies outside the CRC anyway; make sure only it is wrong
    for check in _both_checks(batch, leader_checks=True):
        with pytest.raises(UnsupportedForMessageFormatError):
            check()


@pytest.mark.parametrize("magic", [0, 1])
def test_short_legacy_message_is_unsupported_not_corrupt(magic):
    # Smaller than a v2 header, so only the magic byte can tell its format apart.
    message = bytearray(30)
    struct.pack_into(">qi", message, 0, 0, 30 - 12)
    message[MAGIC_POS] = magic
    for check in _both_checks(message, leader_checks=True):
        with pytest.raises(UnsupportedForMessageFormatError):
            check()


def test_batch_bigger_than_max_is_record_too_large():
    batch = build_batch(_records(3))
    for check in _both_checks(batch, max_batch_bytes=len(batch) - 1):
        with pytest.raises(RecordTooLargeError):
            check()


def test_batch_exactly_max_bytes_is_accepted():
    batch = build_batch(_records(3))
    assert len(validate_batches(batch, len(batch), True)) == 1


@pytest.mark.parametrize("record_count", [4, -1])
def test_record_count_beyond_the_offset_range_is_invalid(record_count):
    batch = bytearray(build_batch(_records(3)))  # lastOffsetDelta 2
    struct.pack_into(">i", batch, RECORDS_COUNT_POS, record_count)
    _recrc(batch)
    for check in _both_checks(batch):
        with pytest.raises(InvalidRecordError):
            check()


@pytest.mark.parametrize("record_count", [0, 2])
def test_fewer_records_than_the_offset_range_only_from_a_log(record_count):
    """A batch thinned by log compaction keeps its offset range with fewer records (none,
    for the empty batch kept for a producer's sequence): a follower copies and a log
    recovers such batches, but a producer's batch must hold every offset of its range."""
    batch = bytearray(build_batch(_records(3)))  # lastOffsetDelta 2
    struct.pack_into(">i", batch, RECORDS_COUNT_POS, record_count)
    _recrc(batch)
    assert validate_batches(batch, None, leader_checks=False)[0].record_count == record_count
    with pytest.raises(InvalidRecordError, match="lastOffsetDelta"):
        validate_batches(batch, None, leader_checks=True)


def test_negative_last_offset_delta_is_invalid():
    batch = bytearray(build_batch(_records(1)))
    struct.pack_into(">i", batch, LAST_OFFSET_DELTA_POS, -1)
    struct.pack_into(">i", batch, RECORDS_COUNT_POS, 0)
    _recrc(batch)
    with pytest.raises(InvalidRecordError):
        validate_batches(batch, None, False)


# Malformed record bodies inside a batch whose CRC is valid. Each takes an uncompressed
# batch of one record (key b"k", value b"v", one header) and returns the defective bytes.
_ONE = [SimpleRecord(b"v", b"k", [("h", b"x")], NOW_MS)]


def _with_body(body: bytes, record_count: int = 1) -> bytearray:
    batch = bytearray(build_batch(_ONE))[:HEADER_SIZE_BYTES] + body
    struct.pack_into(">i", batch, LENGTH_POS, len(batch) - 12)
    struct.pack_into(">i", batch, RECORDS_COUNT_POS, record_count)
    struct.pack_into(">i", batch, LAST_OFFSET_DELTA_POS, record_count - 1)
    return _recrc(batch)


def _body() -> bytes:
    return build_batch(_ONE)[HEADER_SIZE_BYTES:]


def _record_fields(attrs=b"\x00", ts=0, delta=0, key=b"k", value=b"v", headers=(("h", b"x"),), header_count=None):
    def nullable(b):
        return encode_varint(-1) if b is None else encode_varint(len(b)) + b

    out = attrs + encode_varint(ts) + encode_varint(delta) + nullable(key) + nullable(value)
    out += encode_varint(len(headers) if header_count is None else header_count)
    for k, v in headers:
        out += nullable(k if k is None or isinstance(k, bytes) else k.encode()) + nullable(v)
    return out


def _framed(fields: bytes, length_adjust: int = 0) -> bytes:
    return encode_varint(len(fields) + length_adjust) + fields


MALFORMED = {
    "record length too long": lambda: _with_body(_framed(_record_fields(), +1)),
    "record length too short": lambda: _with_body(_framed(_record_fields(), -1)),
    "record length negative": lambda: _with_body(encode_varint(-3) + _record_fields()),
    "record length varint corrupted": lambda: _with_body(b"\x7f" + _body()[1:]),
    "varint longer than 10 bytes": lambda: _with_body(b"\xff" * 11 + _body()),
    "bytes after the last record": lambda: _with_body(_body() + b"\x00"),
    "fewer records than the header counts": lambda: _with_body(_body(), record_count=2),
    "key runs past the record": lambda: _with_body(_framed(_record_fields()[:3] + encode_varint(50) + b"k")),
    "null header key": lambda: _with_body(_framed(_record_fields(headers=((None, b"x"),)))),
    "header key not utf-8": lambda: _with_body(_framed(_record_fields(headers=((b"\xff\xfe", b"x"),)))),
    "negative header count": lambda: _with_body(_framed(_record_fields(headers=(), header_count=-2))),
    "huge header count": lambda: _with_body(_framed(_record_fields(header_count=1 << 40))),
    "empty records section": lambda: _with_body(b""),
}


def test_record_field_helpers_rebuild_the_real_record():
    assert _framed(_record_fields()) == _body()  # so each defect below is the only one


@pytest.mark.parametrize("make", MALFORMED.values(), ids=MALFORMED.keys())
def test_valid_crc_batch_with_malformed_records_is_invalid_when_records_are_checked(make):
    batch = make()
    check_batch_at(memoryview(batch), 0)  # framing and CRC are fine
    with pytest.raises(InvalidRecordError):
        validate_batches(batch, None, True)


@pytest.mark.parametrize("make", MALFORMED.values(), ids=MALFORMED.keys())
def test_decode_records_of_malformed_records_is_invalid(make):
    with pytest.raises(InvalidRecordError):
        decode_records(make())


@pytest.mark.parametrize("delta", [1, -1, 5])
def test_record_offset_delta_out_of_sequence_is_invalid_when_leader_checked(delta):
    batch = _with_body(_framed(_record_fields(delta=delta)))
    with pytest.raises(InvalidRecordError):
        validate_batches(batch, None, True)


@FAST
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=3), codecs)
@example([(15, 0xFF)], CompressionType.NONE)  # first byte of the header key "ü": not UTF-8 any more
@example([(15, 0xFF)], CompressionType.GZIP)
@example([(2, 0x02)], CompressionType.NONE)  # first record's offset delta 0 -> 1
def test_any_batch_the_leader_accepts_decodes(mutations, codec):
    # Mutate the decompressed records, re-frame and re-checksum: the leader's record check
    # must reject exactly enough that whatever it accepts, decode_records can read back.
    records = [SimpleRecord(b"v%d" % i, b"k", [("h", b"x"), ("ü", None)], NOW_MS + i) for i in range(3)]
    body = bytearray(build_batch(records)[HEADER_SIZE_BYTES:])
    for pos, byte in mutations:
        body[pos % len(body)] = byte
    batch = bytearray(build_batch(records, compression=codec))[:HEADER_SIZE_BYTES]
    batch += compress(codec, body)
    struct.pack_into(">i", batch, LENGTH_POS, len(batch) - 12)
    _recrc(batch)
    try:
        validate_batches(batch, None, True)
    except InvalidRecordError:
        return
    decoded = decode_records(batch)
    assert [r.offset for r in decoded] == [0, 1, 2]


def test_malformed_records_pass_when_records_are_not_checked():
    batch = MALFORMED["record length too long"]()
    assert len(validate_batches(batch, None, False)) == 1


def test_second_batch_with_malformed_records_rejects_the_whole_input():
    with pytest.raises(InvalidRecordError):
        validate_batches(build_batch(_records(2)) + MALFORMED["null header key"](), None, True)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_valid_crc_batch_whose_payload_does_not_decompress_is_corrupt(codec):
    batch = bytearray(build_batch([SimpleRecord(b"v" * 500)], compression=codec))
    batch[HEADER_SIZE_BYTES:] = b"\x00" * (len(batch) - HEADER_SIZE_BYTES)
    _recrc(batch)
    with pytest.raises(CorruptRecordError):
        validate_batches(batch, None, True)


def test_control_batch_is_invalid_when_records_are_checked():
    batch = bytearray(build_batch(_records(1)))
    struct.pack_into(">h", batch, ATTRIBUTES_POS, 0x20)
    _recrc(batch)
    assert _header(batch).is_control
    with pytest.raises(InvalidRecordError):
        validate_batches(batch, None, True)


def test_control_batch_is_accepted_when_records_are_not_checked():
    batch = bytearray(build_batch(_records(1)))
    struct.pack_into(">h", batch, ATTRIBUTES_POS, 0x20)
    _recrc(batch)
    assert validate_batches(batch, None, False)[0].is_control


@pytest.mark.parametrize("empty", [b"", bytearray(), memoryview(b"")])
def test_empty_input_is_invalid_record(empty):
    with pytest.raises(InvalidRecordError):
        validate_batches(empty, None, False)


def test_validate_batches_returns_every_header_in_order():
    batches = _three_batches()
    headers = validate_batches(b"".join(batches), 1 << 20, True)
    assert [h.base_offset for h in headers] == [0, 2, 7]
    assert [h.record_count for h in headers] == [2, 5, 1]


def test_trailing_bytes_after_the_last_batch_are_corrupt():
    with pytest.raises(CorruptRecordError):
        validate_batches(build_batch(_records(1)) + b"\x00" * 20, None, False)


def test_check_batch_at_reads_the_batch_at_its_position():
    first, second = build_batch(_records(1)), build_batch(_records(2), base_offset=1)
    header = check_batch_at(memoryview(first + second), len(first))
    assert (header.base_offset, header.record_count) == (1, 2)


# ---------------------------------------------------------------------------- decode_records bounds


@pytest.mark.parametrize("codec", COMPRESSED)
def test_decode_records_refuses_output_beyond_max_uncompressed_bytes(codec):
    records = [SimpleRecord(b"z" * 10_000, timestamp_ms=0)]
    raw_size = len(build_batch(records)) - HEADER_SIZE_BYTES
    batch = build_batch(records, compression=codec)
    with pytest.raises(InvalidRecordError):
        decode_records(batch, max_uncompressed_bytes=raw_size - 1)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_decode_records_accepts_output_of_exactly_max_uncompressed_bytes(codec):
    records = [SimpleRecord(b"z" * 10_000, timestamp_ms=0)]
    raw_size = len(build_batch(records)) - HEADER_SIZE_BYTES
    batch = build_batch(records, compression=codec)
    assert decode_records(batch, max_uncompressed_bytes=raw_size)[0].value == b"z" * 10_000


def test_decode_records_of_a_short_buffer_is_corrupt():
    with pytest.raises(CorruptRecordError):
        decode_records(build_batch(_records(1))[: HEADER_SIZE_BYTES - 1])


def test_decode_records_of_legacy_magic_is_unsupported():
    batch = bytearray(build_batch(_records(1)))
    batch[MAGIC_POS] = 1
    with pytest.raises(UnsupportedForMessageFormatError):
        decode_records(batch)


# ---------------------------------------------------------------------------- compaction (filter_batch)

# Kafka's bytes for the batches its log cleaner writes: each row is a batch below, a
# (now, delete.retention.ms) pair, whether an empty batch is kept, the offsets kept, and
# the hex that kafka-clients 4.1.1's MemoryRecords.filterTo wrote for it, given a
# RecordFilter whose checkBatchRetention answered RETAIN_EMPTY (if kept) or DELETE_EMPTY
# and whose shouldRetainRecord kept those offsets ("" = no batch). All uncompressed: a
# compressed payload depends on the compressor's build, not on Kafka's format.
FILTER_T_MS = 1_600_000_000_000  # the records' CreateTime, long before the cleaner's clock
FILTER_NOW_MS, FILTER_RETENTION_MS = 1_700_000_000_000, 86_400_000
KAFKA_HORIZON_BATCH = (  # the "sets_horizon" row's output: the input of the "horizon_" rows
    "00000000000000640000006300000003023c07fc8d0040000000020000018bd50bc40000000174876e8007ffffffffffffffffffffffffffff"
    "000000031e00ff8fead9e90500046b30047630001a008990ead9e90502046b3101002600f18fead9e90504046b320476320202680278"
)


def _filter_input(name: str) -> bytes:
    def records(tombstone: bool = True) -> list[SimpleRecord]:
        return [
            SimpleRecord(b"v0", b"k0", (), FILTER_T_MS),
            SimpleRecord(None if tombstone else b"v1", b"k1", (), FILTER_T_MS - 5),
            SimpleRecord(b"v2", b"k2", (("h", b"x"),), FILTER_T_MS + 7),
        ]

    if name.startswith("horizon_"):
        return bytes.fromhex(KAFKA_HORIZON_BATCH)
    if name.startswith("log_append_time"):
        batch = bytearray(build_batch(records(), base_offset=10))
        set_log_append_time(batch, 0, len(batch), FILTER_T_MS + 1000)
        return bytes(batch)
    if name.startswith("no_tombstone"):
        return build_batch(records(tombstone=False), base_offset=100)
    if name == "producer_batch_emptied":
        return build_batch(records(), base_offset=50, producer_id=7, producer_epoch=1, base_sequence=5)
    return build_batch(records(), base_offset=100, partition_leader_epoch=3)


KAFKA_FILTERED = [
    ("sets_horizon", FILTER_NOW_MS, FILTER_RETENTION_MS, False, [100, 101, 102], KAFKA_HORIZON_BATCH),
    ("thinned_keeping_the_tombstone", FILTER_NOW_MS, FILTER_RETENTION_MS, False, [101, 102],
     "0000000000000064000000530000000302efc37ca00040000000020000018bd50bc40000000174876e8007ffffffffffffffffffffffffffff"
     "000000021a008990ead9e90502046b3101002600f18fead9e90504046b320476320202680278"),
    ("thinned_of_the_tombstone", FILTER_NOW_MS, FILTER_RETENTION_MS, False, [100, 102],
     "00000000000000640000004b00000003025e554fd200000000000200000174876e800000000174876e8007ffffffffffffffffffffffffffff"
     "0000000214000000046b30047630001c000e04046b320476320202680278"),
    ("no_tombstone_thinned", FILTER_NOW_MS, FILTER_RETENTION_MS, False, [101, 102],
     "00000000000000640000004bffffffff02332c60e700000000000200000174876e7ffb00000174876e8007ffffffffffffffffffffffffffff"
     "0000000214000002046b31047631001c001804046b320476320202680278"),
    ("no_tombstone_whole", FILTER_NOW_MS, FILTER_RETENTION_MS, False, [100, 101, 102], None),  # None: the input
    ("producer_batch_emptied", FILTER_NOW_MS, FILTER_RETENTION_MS, True, [],
     "000000000000003200000031ffffffff021ba7ddc0000000000002ffffffffffffffff00000174876e8007000000000000000700010000000500000000"),
    ("emptied", FILTER_NOW_MS, FILTER_RETENTION_MS, False, [], ""),
    ("zero_retention", FILTER_NOW_MS, 0, False, [101],
     "00000000000000640000003f0000000302afa2f6490040000000020000018bcfe5680000000174876e7ffbffffffffffffffffffffffffffff"
     "000000011a0089a0b787e90502046b310100"),
    ("log_append_time_sets_horizon", FILTER_NOW_MS, FILTER_RETENTION_MS, False, [10, 11, 12],
     "000000000000000a00000063ffffffff02fcb5a9430048000000020000018bd50bc40000000174876e83e8ffffffffffffffffffffffffffff"
     "000000031e00af80ead9e90500046b30047630001a00af80ead9e90502046b3101002600af80ead9e90504046b320476320202680278"),
    ("log_append_time_thinned_of_the_tombstone", FILTER_NOW_MS, FILTER_RETENTION_MS, False, [10, 12],
     "000000000000000a0000004bffffffff02bbc24d9f00080000000200000174876e83e800000174876e83e8ffffffffffffffffffffffffffff"
     "0000000214000000046b30047630001c000004046b320476320202680278"),
    ("horizon_whole", 1_800_000_000_000, 5, False, [100, 101, 102], None),
    ("horizon_thinned_to_the_tombstone", 1_800_000_000_000, 5, False, [101],
     "00000000000000640000003f00000003021db07cc10040000000020000018bd50bc40000000174876e7ffbffffffffffffffffffffffffffff"
     "000000011a008990ead9e90502046b310100"),
    ("horizon_thinned_of_the_tombstone", 1_800_000_000_000, 5, False, [100, 102],
     "0000000000000064000000550000000302af040a490040000000020000018bd50bc40000000174876e8007ffffffffffffffffffffffffffff"
     "000000021e00ff8fead9e90500046b30047630002600f18fead9e90504046b320476320202680278"),
    ("horizon_emptied", 1_800_000_000_000, 5, True, [],
     "00000000000000640000003100000003026f13331e000000000002ffffffffffffffff00000174876e8007ffffffffffffffffffffffffffff00000000"),
]


@pytest.mark.parametrize("name, now_ms, retention_ms, keep_empty, kept, kafka_hex", KAFKA_FILTERED, ids=[r[0] for r in KAFKA_FILTERED])
def test_filter_batch_writes_the_bytes_kafkas_cleaner_writes(name, now_ms, retention_ms, keep_empty, kept, kafka_hex):
    batch = _filter_input(name)
    out = filter_batch(batch, lambda offset, *_: offset in kept, keep_empty, now_ms + retention_ms)
    expected = batch if kafka_hex is None else bytes.fromhex(kafka_hex) if kafka_hex else None
    assert out == expected


def test_a_kept_tombstone_sets_the_delete_horizon_in_attributes_bit_6_and_the_base_timestamp():
    out = filter_batch(_filter_input("sets_horizon"), lambda *_: True, False, FILTER_NOW_MS + FILTER_RETENTION_MS)
    header = _header(out)
    assert header.attributes == 0x40 and header.delete_horizon_ms == header.base_timestamp == FILTER_NOW_MS + FILTER_RETENTION_MS
    assert header.max_timestamp == FILTER_T_MS + 7, "maxTimestamp stays the records' largest"
    assert check_batch_at(memoryview(out), 0) == header, "CRC recomputed"
    check_records(out)  # maxTimestamp = baseTimestamp + the largest delta, as a leader checks it
    assert [(r.offset, r.timestamp_ms, r.key, r.value) for r in decode_records(out)] == [
        (100, FILTER_T_MS, b"k0", b"v0"), (101, FILTER_T_MS - 5, b"k1", None), (102, FILTER_T_MS + 7, b"k2", b"v2")
    ], "every record keeps its timestamp: the deltas are re-based on the horizon"
    assert _header(_filter_input("sets_horizon")).delete_horizon_ms is None


def test_every_decoder_reads_a_horizon_batchs_records_at_their_own_timestamps():
    out = filter_batch(_filter_input("sets_horizon"), lambda *_: True, False, FILTER_NOW_MS + FILTER_RETENTION_MS)
    timestamps = [FILTER_T_MS, FILTER_T_MS - 5, FILTER_T_MS + 7]
    body, horizon_ms = out[HEADER_SIZE_BYTES:], FILTER_NOW_MS + FILTER_RETENTION_MS
    assert [r[1] for r in decode_records_reference(body, 3, 100, horizon_ms, -1)] == timestamps  # the C one's reference
    assert [r.timestamp_ms for r in decode_records(out)] == timestamps
    _headers, columns = decode_batches_columns([out])
    assert list(struct.unpack("<3q", columns[1])) == timestamps


def test_filter_batch_without_a_horizon_to_give_leaves_a_kept_tombstone_batch_whole():
    batch = _filter_input("sets_horizon")
    assert filter_batch(batch, lambda *_: True, False) == batch


filtered_records = st.lists(
    st.builds(
        SimpleRecord,
        value=st.none() | st.binary(max_size=8),
        key=st.binary(min_size=1, max_size=4),
        headers=st.lists(st.tuples(st.text(max_size=3), nullable_bytes), max_size=2),
        timestamp_ms=st.integers(0, 1 << 42),
    ),
    min_size=1,
    max_size=8,
)


@FAST
@given(filtered_records, st.data(), codecs, st.booleans(), st.integers(0, 1 << 43))
def test_filter_batch_keeps_what_it_is_told_with_offsets_timestamps_and_sequence_range(records, data, codec, log_append_time, horizon_ms):
    batch = bytearray(build_batch(records, base_offset=1000, compression=codec, producer_id=9, producer_epoch=2, base_sequence=40))
    if log_append_time:
        set_log_append_time(batch, 0, len(batch), 1 << 41)
    original = decode_records(batch)
    kept = data.draw(st.sets(st.sampled_from([r.offset for r in original])))
    twice = None
    for rewrite in range(2):  # a second clean keeps the first one's horizon
        source = batch if twice is None else twice
        out = filter_batch(source, lambda offset, *_: offset in kept, True, horizon_ms + rewrite)
        header = _header(out)
        assert check_batch_at(memoryview(out), 0) == header
        assert (header.base_offset, header.last_offset_delta, header.base_sequence) == (1000, len(records) - 1, 40)
        assert [(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in decode_records(out)] == [
            (r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in original if r.offset in kept
        ]
        tombstone_kept = any(r.value is None for r in original if r.offset in kept)
        assert header.delete_horizon_ms == (horizon_ms if tombstone_kept else None)
        if log_append_time or not kept:
            assert header.max_timestamp == _header(batch).max_timestamp
        else:
            assert header.max_timestamp == max(r.timestamp_ms for r in original if r.offset in kept)
        twice = out


# ---------------------------------------------------------------------------- small types


@pytest.mark.parametrize(
    "name, expected",
    [
        ("CreateTime", TimestampType.CREATE_TIME),
        ("LogAppendTime", TimestampType.LOG_APPEND_TIME),
        ("log_append_time", TimestampType.LOG_APPEND_TIME),
        (1, TimestampType.LOG_APPEND_TIME),
    ],
)
def test_timestamp_type_from_name(name, expected):
    assert TimestampType.from_name(name) is expected


def test_timestamp_type_from_unknown_name_is_value_error():
    with pytest.raises(ValueError):
        TimestampType.from_name("WallClock")
