"""The compiled halves of the record codec (`rayk.storage._records`) against their Python
references in `records`:
- the walk (`scan_records_reference`): for any bytes and any record count, both return the
  same largest timestamp delta or both refuse with the same message, and the compiled one
  never reads outside its input;
- the decoder (`decode_records_reference`): the walk's verdict and message, and the same
  (offset, timestamp, key, value, headers) for every record;
- the consumer's decoder (`decode_consumer_records_reference`): the decoder's verdict and
  message, and equal ConsumerRecords, those before the start offset left out;
- the column decoder (`decode_columns_reference`): the walk's verdict and message (naming
  the batch), and the same Arrow buffers byte for byte, for one batch or several;
- the encoder (`encode_records_reference`): byte-identical output for any records."""

from __future__ import annotations

import gc
import weakref

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayk.client.types import ConsumerRecord
from rayk.errors import InvalidRecordError
from rayk.storage import _records
from rayk.storage.records import (
    HEADER_SIZE_BYTES,
    SimpleRecord,
    build_batch,
    check_records,
    decode_columns_reference,
    decode_consumer_records_reference,
    decode_records,
    decode_records_reference,
    encode_records_reference,
    scan_records_reference,
)
from tests.test_records import MALFORMED, record_lists

MANY = settings(max_examples=400, deadline=None)


def outcome(walk, body, record_count, *more):
    try:
        return "ok", walk(body, record_count, *more)
    except ValueError as e:
        return "refused", str(e)


def assert_same(body, record_count):
    compiled = outcome(_records.scan_records, body, record_count)
    assert compiled == outcome(scan_records_reference, body, record_count)
    decoded = outcome(_records.decode_records, body, record_count, 100, 5_000, -1)
    assert decoded == outcome(decode_records_reference, body, record_count, 100, 5_000, -1)
    # The decoders walk as scan does, except that offset deltas need only grow (compaction).
    walked = outcome(lambda *args: scan_records_reference(*args, strict_offsets=False), body, record_count)
    assert decoded[0] == walked[0] and (decoded[0] == "ok" or decoded[1] == walked[1]), "decode checks as scan"
    consumer_args = (100, 5_000, -1, ConsumerRecord, "t", 3, 0, 101)
    consumed = outcome(_records.decode_consumer_records, body, record_count, *consumer_args)
    assert consumed == outcome(decode_consumer_records_reference, body, record_count, *consumer_args)
    assert consumed[0] == decoded[0] and (consumed[0] == "ok" or consumed[1] == decoded[1]), "checks as decode"
    columns = outcome(lambda *section: _records.decode_columns([section]), body, record_count, 100, 5_000, -1)
    assert columns == outcome(lambda *section: decode_columns_reference([section]), body, record_count, 100, 5_000, -1)
    assert columns[0] == walked[0], "columns check as scan"
    assert columns[0] == "ok" or columns[1] == f"batch at offset 100: {walked[1]}"
    return compiled


def body_of(records) -> bytes:
    return build_batch(records)[HEADER_SIZE_BYTES:]


@MANY
@given(record_lists)
def test_well_formed_records_give_the_same_largest_timestamp_delta(records):
    result = assert_same(body_of(records), len(records))
    stamps = [r.timestamp_ms for r in records]
    assert result == ("ok", max(stamps) - stamps[0])


@MANY
@given(record_lists, st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=4), st.data())
@example([SimpleRecord(b"v", headers=[("ü", b"x")])], [(9, 0xFF)], None)  # a header key byte: not UTF-8
def test_mutated_records_get_the_same_verdict(records, mutations, data):
    body = bytearray(body_of(records))
    for pos, byte in mutations:
        body[pos % len(body)] = byte
    count = len(records) if data is None else data.draw(st.integers(0, len(records) + 2))
    assert_same(bytes(body), count)


@MANY
@given(record_lists, st.integers(0, 1 << 16))
def test_every_truncation_gets_the_same_verdict(records, cut):
    body = body_of(records)
    assert_same(body[: cut % (len(body) + 1)], len(records))


@MANY
@given(st.binary(max_size=200), st.integers(0, 50))
def test_arbitrary_bytes_get_the_same_verdict(body, record_count):
    assert_same(body, record_count)


@pytest.mark.parametrize("make", MALFORMED.values(), ids=MALFORMED.keys())
def test_each_known_defect_is_refused_alike(make):
    batch = make()
    body, count = batch[HEADER_SIZE_BYTES:], int.from_bytes(batch[57:61], "big", signed=True)
    verdict, message = assert_same(bytes(body), count)
    assert verdict == "refused" and message


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview, lambda b: memoryview(b"xx" + b + b"yy")[2:-2]])
def test_takes_any_contiguous_buffer(wrap):
    body = body_of([SimpleRecord(b"a", timestamp_ms=5), SimpleRecord(b"b", timestamp_ms=9)])
    assert _records.scan_records(wrap(body), 2) == 4


def test_a_huge_varint_is_refused_not_wrapped():
    record = b"\x00" + b"\xff" * 9 + b"\x03"  # attributes, then a timestamp delta past 64 bits
    assert assert_same(bytes([len(record) * 2]) + record, 1) == ("refused", "varint out of int64 range")


def test_check_records_names_the_batch_and_the_defect():
    with pytest.raises(InvalidRecordError, match=r"batch at offset 0: record header key is null"):
        check_records(MALFORMED["null header key"]())


@pytest.mark.parametrize("tenth", [0x01, 0x02, 0x81, 0x83])
def test_the_tenth_varint_byte_is_judged_alike(tenth):
    record = b"\x00" + b"\xff" * 9 + bytes([tenth]) + b"\x00" * 6
    assert_same(bytes([len(record) * 2]) + record, 1)


# ---------------------------------------------------------------------------- the encoder


@MANY
@given(record_lists, st.integers(0, 1 << 45), st.booleans())
def test_encoded_records_are_byte_identical_to_the_reference(records, now_ms, drop_timestamps):
    if drop_timestamps:
        records = [SimpleRecord(r.value, r.key, r.headers) for r in records]  # each takes now_ms
    assert _records.encode_records(records, now_ms) == encode_records_reference(records, now_ms)


@MANY
@given(record_lists)
def test_a_built_batch_decodes_to_its_records(records):
    decoded = decode_records(build_batch(records))
    assert [(r.key, r.value, list(r.headers), r.timestamp_ms) for r in decoded] == [
        (r.key, r.value, list(r.headers), r.timestamp_ms) for r in records
    ]


def test_headers_as_lists_and_values_as_any_bytes_like_encode_alike():
    plain = [SimpleRecord(b"v", b"k", (("h", b"x"),), 7)]
    loose = [SimpleRecord(bytearray(b"v"), memoryview(b"k"), [["h", bytearray(b"x")]], 7)]
    assert _records.encode_records(loose, 0) == _records.encode_records(plain, 0)


@pytest.mark.parametrize(
    "record",
    [
        SimpleRecord("text"),
        SimpleRecord(b"v", key=5),
        SimpleRecord(b"v", headers=[(b"bytes key", b"x")]),
        SimpleRecord(b"v", headers=[("k", "text")]),
        SimpleRecord(b"v", headers=[("k",)]),
        SimpleRecord(b"v", headers=5),
        SimpleRecord(b"v", timestamp_ms="now"),
        SimpleRecord(b"v", headers=[("\ud800", b"x")]),  # a lone surrogate has no UTF-8
    ],
)
def test_records_of_the_wrong_types_are_refused(record):
    with pytest.raises((TypeError, ValueError)):
        _records.encode_records([record], 0)


def test_timestamp_deltas_outside_int64_are_refused_alike():
    records = [SimpleRecord(b"a", timestamp_ms=-(1 << 63)), SimpleRecord(b"b", timestamp_ms=(1 << 63) - 1)]
    for encode in (_records.encode_records, encode_records_reference):
        with pytest.raises(ValueError, match="int64"):
            encode(records, 0)


def test_no_records_is_refused():
    with pytest.raises(ValueError, match="at least one record"):
        _records.encode_records([], 0)


@MANY
@given(record_lists, st.integers(-1, 1 << 45))
def test_decoding_gives_back_the_records(records, append_time):
    body = body_of(records)
    decoded = _records.decode_records(body, len(records), 7, records[0].timestamp_ms, append_time)
    assert decoded == decode_records_reference(body, len(records), 7, records[0].timestamp_ms, append_time)
    assert decoded == [
        (7 + i, append_time if append_time >= 0 else r.timestamp_ms, r.key, r.value, list(r.headers))
        for i, r in enumerate(records)
    ]


@MANY
@given(record_lists, st.integers(-1, 1 << 45), st.integers(0, 12), st.sampled_from([0, 1]))
def test_consumer_records_are_the_records_from_the_start_offset(records, append_time, start_offset, timestamp_type):
    body, base_timestamp = body_of(records), records[0].timestamp_ms
    args = (body, len(records), 7, base_timestamp, append_time, ConsumerRecord, "topic", 2, timestamp_type, start_offset)
    consumed = _records.decode_consumer_records(*args)
    assert consumed == decode_consumer_records_reference(*args)
    assert all(type(r) is ConsumerRecord for r in consumed)
    assert consumed == [
        ConsumerRecord("topic", 2, 7 + i, append_time if append_time >= 0 else r.timestamp_ms, timestamp_type, r.key,
                       r.value, list(r.headers), -1 if r.key is None else len(r.key), -1 if r.value is None else len(r.value))
        for i, r in enumerate(records) if 7 + i >= start_offset
    ]  # fmt: skip


@MANY
@given(record_lists)
def test_consumer_records_and_their_headers_are_left_to_refcounting_not_the_cyclic_gc(records):
    """They hold no container but their headers, so no cycle: left tracked, every
    collection walked a consumer's buffered records (~a fifth of an iteration's read)."""
    args = (body_of(records), len(records), 7, records[0].timestamp_ms, -1, ConsumerRecord, "topic", 2, 0, 0)
    for record in _records.decode_consumer_records(*args):
        assert not gc.is_tracked(record) and not gc.is_tracked(record.headers)
        assert not any(gc.is_tracked(pair) for pair in record.headers)


def test_records_of_a_type_with_attributes_of_its_own_stay_tracked():
    """Attributes could make a cycle through such a record, which only the GC would free."""

    class WithAttributes(tuple):
        pass

    class Held:
        pass

    body = body_of([SimpleRecord(b"v", b"k", headers=[("h", b"1")])])
    [record] = _records.decode_consumer_records(body, 1, 0, 0, -1, WithAttributes, "t", 0, 0, 0)
    record.me, record.held = record, Held()  # a tuple takes no weak reference: what it holds does
    assert gc.is_tracked(record)
    held = weakref.ref(record.held)
    del record
    gc.collect()
    assert held() is None, "the cycle through the attribute was collected"


def test_the_consumer_decoder_builds_only_tuple_types():
    for decode in (_records.decode_consumer_records, decode_consumer_records_reference):
        with pytest.raises(TypeError, match="tuple type"):
            decode(b"", 0, 0, 0, -1, dict, "t", 0, 0, 0)


def test_a_negative_record_count_is_refused():
    for decode in (_records.decode_records, decode_records_reference):
        with pytest.raises(ValueError, match="record count -1"):
            decode(b"", -1, 0, 0, -1)
    for decode in (_records.decode_consumer_records, decode_consumer_records_reference):
        with pytest.raises(ValueError, match="record count -1"):
            decode(b"", -1, 0, 0, -1, ConsumerRecord, "t", 0, 0, 0)
    for decode in (_records.decode_columns, decode_columns_reference):
        with pytest.raises(ValueError, match="batch at offset 0: record count -1"):
            decode([(b"", -1, 0, 0, -1)])


@MANY
@given(st.lists(record_lists, max_size=4), st.integers(-1, 1 << 40))
def test_columns_of_several_batches_are_the_reference_buffers(batches, append_time):
    sections, base = [], 0
    for records in batches:
        sections.append((body_of(records), len(records), base, records[0].timestamp_ms, append_time))
        base += len(records)
    assert _records.decode_columns(sections) == decode_columns_reference(sections)


@MANY
@given(st.lists(record_lists, min_size=1, max_size=4), st.data())
def test_columns_are_the_same_from_any_buffer_whether_or_not_it_can_change(batches, data):
    """Bodies that can change (bytearray and views of it) are copied into bytes before
    they are read, and bodies of bytes are read as they are: the columns are the same
    either way, and in a mix of both."""
    sections, base = [], 0
    kinds = (bytes, bytearray, lambda b: memoryview(bytes(b)), lambda b: memoryview(bytearray(b))[0:])
    for records in batches:
        wrap = data.draw(st.sampled_from(kinds))
        sections.append((wrap(body_of(records)), len(records), base, records[0].timestamp_ms, -1))
        base += len(records)
    plain = [(bytes(body), *rest) for body, *rest in sections]
    assert _records.decode_columns(sections) == decode_columns_reference(plain)


class Meddler:
    """An int argument whose __index__ (run while the decoder parses its arguments) first
    does something to the caller's objects."""

    def __init__(self, value: int, meddle) -> None:
        self.value, self.meddle = value, meddle

    def __index__(self) -> int:
        self.meddle()
        return self.value


def lengthen_last_header_value(body: bytearray, value: bytes) -> None:
    """Makes the length of the body's last header value `value` (its last field) 63: a
    read that trusts the walk then reads past the body's end."""
    at = body.rindex(b"\x50" + value)  # zig-zag 40
    assert at + 1 + len(value) == len(body)
    body[at] = 0x7E  # zig-zag 63


def test_the_column_decoder_reads_what_it_checked_whatever_python_code_does_meanwhile():
    # A body that can change is copied before the walk checks it, and the list of batches
    # before it is parsed: the decoder never reads past what it checked (it used to: the
    # columns held bytes from outside the body).
    value = b"x" * 40
    first = [SimpleRecord(b"v" * 40, headers=[("h", value)])]
    second = [SimpleRecord(b"w" * 10)]
    plain = [(body_of(first), 1, 0, 0, -1), (body_of(second), 1, 1, 0, -1)]
    expected = decode_columns_reference(plain)
    changing = bytearray(plain[0][0])
    sections = [(memoryview(changing), 1, 0, 0, -1),
                (plain[1][0], Meddler(1, lambda: lengthen_last_header_value(changing, value)), 1, 0, -1)]
    assert _records.decode_columns(sections) == expected
    sections = [(bytearray(plain[0][0]), 1, 0, 0, -1)]
    sections.append((plain[1][0], Meddler(1, sections.clear), 1, 0, -1))
    assert _records.decode_columns(sections) == expected


def test_the_record_decoders_read_what_they_checked_when_a_collection_changes_the_body():
    # The decoders allocate as they go, and a collection may run Python code (its
    # callbacks, finalizers) that changes a bytearray body after the walk checked it.
    value = b"x" * 40
    records = [SimpleRecord(b"v%d" % i, b"k", headers=[("h", value)]) for i in range(50)]
    body = body_of(records)
    expected = decode_consumer_records_reference(body, 50, 0, 0, -1, ConsumerRecord, "t", 0, 0, 0)
    expected_tuples = decode_records_reference(body, 50, 0, 0, -1)
    changing = bytearray(body)

    def meddle(phase: str, info: dict) -> None:
        if changing[-41] == 0x50:
            lengthen_last_header_value(changing, value)

    threshold = gc.get_threshold()
    gc.callbacks.append(meddle)
    gc.set_threshold(1)  # a collection at nearly every allocation of a container
    try:
        consumed = _records.decode_consumer_records(changing, 50, 0, 0, -1, ConsumerRecord, "t", 0, 0, 0)
        changing[:] = body
        decoded = _records.decode_records(changing, 50, 0, 0, -1)
    finally:
        gc.callbacks.remove(meddle)
        gc.set_threshold(*threshold)
    assert consumed == expected and decoded == expected_tuples


@pytest.mark.parametrize("bad", [None, [b"x"], [(b"", 0, 0, 0)], [(1, 0, 0, 0, -1)]])
def test_the_column_decoder_refuses_what_is_not_a_batch_list_with_a_type_error(bad):
    with pytest.raises(TypeError):
        _records.decode_columns(bad)


@pytest.mark.parametrize("append_time", [-1, 77])
def test_records_that_share_a_timestamp_decode_to_their_own_timestamps(append_time):
    """The consumer's decoder makes one int for a run of equal timestamps: runs, changes and
    returns to an earlier value, each record with its own (or the append time)."""
    stamps = [5, 5, 5, 9, 9, 5, 1 << 44, 1 << 44, 6]
    body = body_of([SimpleRecord(bytes([i]), timestamp_ms=ts) for i, ts in enumerate(stamps)])
    args = (body, len(stamps), 100, 5, append_time, ConsumerRecord, "t", 3, 0, 100)
    consumed = _records.decode_consumer_records(*args)
    assert consumed == decode_consumer_records_reference(*args)
    assert [r.timestamp for r in consumed] == ([append_time] * len(stamps) if append_time >= 0 else stamps)
