"""LogSegment on its own: naming, append and index cadence, read bounds, recovery, truncation."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.storage import LogConfig
from rayk.storage import segment as segment_module
from rayk.storage.records import BatchHeader, SimpleRecord, build_batch
from rayk.storage.segment import LogSegment, segment_file_name


def make_batch(base_offset: int, n: int = 2, ts: int = 1000) -> tuple[bytes, BatchHeader]:
    data = build_batch([SimpleRecord(b"v" * 40, timestamp_ms=ts + i) for i in range(n)], base_offset=base_offset)
    return data, BatchHeader.parse(data)


def fill(segment: LogSegment, batches: int, ts: int = 1000) -> list[BatchHeader]:
    headers = []
    for _ in range(batches):
        data, header = make_batch(segment.next_offset(), ts=ts)
        segment.append(data, [header])
        headers.append(header)
        ts += 10
    return headers


def test_segment_files_are_named_by_twenty_digit_base_offset(tmp_path):
    LogSegment(tmp_path, 42, LogConfig(), active=True)
    assert segment_file_name(42, ".log") == "00000000000000000042.log"
    assert {p.name for p in tmp_path.iterdir()} == {
        "00000000000000000042.log", "00000000000000000042.index", "00000000000000000042.timeindex"
    }


def test_index_entry_added_once_more_than_interval_bytes_were_written(tmp_path):
    segment = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=250), active=True)
    headers = fill(segment, 10)
    size = headers[0].size_bytes
    assert 125 < size <= 250  # so more than 250 bytes have gone by every second batch
    assert segment.offset_index.entries == 4  # before batches 2, 4, 6, 8
    assert segment.offset_index.lookup(headers[2].last_offset) == (headers[2].last_offset, 2 * size)
    assert segment.offset_index.lookup(100) == (headers[8].last_offset, 8 * size)


def test_translate_offset_finds_the_batch_holding_an_offset(tmp_path):
    segment = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=100), active=True)
    headers = fill(segment, 20)
    for header in headers:
        for offset in (header.base_offset, header.last_offset):
            assert segment.translate_offset(offset).header.base_offset == header.base_offset
    assert segment.translate_offset(headers[-1].next_offset) is None


def test_read_stops_at_max_offset_and_reports_next_offset(tmp_path):
    segment = LogSegment(tmp_path, 0, LogConfig(), active=True)
    headers = fill(segment, 5)
    data, next_offset = segment.read(0, 1 << 20, max_offset=6, min_one_batch=True)
    assert len(data) == 3 * headers[0].size_bytes and next_offset == 6


def test_recover_rebuilds_the_same_indexes(tmp_path):
    config = LogConfig(index_interval_bytes=100)
    segment = LogSegment(tmp_path, 0, config, active=True)
    fill(segment, 30)
    segment.flush()
    index_bytes = (tmp_path / "00000000000000000000.index").read_bytes()
    time_index_bytes = (tmp_path / "00000000000000000000.timeindex").read_bytes()
    assert segment.recover() == 0
    segment.flush()
    assert (tmp_path / "00000000000000000000.index").read_bytes() == index_bytes
    assert (tmp_path / "00000000000000000000.timeindex").read_bytes() == time_index_bytes


def test_recover_cuts_a_batch_whose_offsets_go_back(tmp_path):
    segment = LogSegment(tmp_path, 0, LogConfig(), active=True)
    fill(segment, 3)
    stray, _ = make_batch(5)  # the last batch holds offsets 4 and 5
    with open(segment.log_path, "ab") as f:
        f.write(stray)
    segment._size += len(stray)
    assert segment.recover() == len(stray)
    assert segment.next_offset() == 6


def test_recover_keeps_batches_after_a_gap(tmp_path):
    """Compaction removes whole batches: the offsets skip, and recovery keeps what follows."""
    segment = LogSegment(tmp_path, 0, LogConfig(), active=True)
    fill(segment, 3)
    later, _ = make_batch(100)
    with open(segment.log_path, "ab") as f:
        f.write(later)
    segment._size += len(later)
    assert segment.recover() == 0
    assert segment.next_offset() == 102


def test_truncate_recomputes_the_max_timestamp(tmp_path):
    segment = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=0), active=True)
    fill(segment, 10, ts=1000)
    assert segment.max_timestamp_ms == 1091
    segment.truncate_to(7)  # drops the batch [6, 7] and everything after
    assert segment.next_offset() == 6
    assert segment.max_timestamp_ms == 1021


def test_find_offset_by_timestamp_scans_into_the_batch(tmp_path):
    segment = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=0), active=True)
    fill(segment, 10, ts=1000)
    assert segment.find_offset_by_timestamp(1031) == (1031, 7)
    assert segment.find_offset_by_timestamp(5000) is None


def test_recover_reports_each_sound_batch_header_in_order_and_not_the_torn_tail(tmp_path):
    segment = LogSegment(tmp_path, 0, LogConfig(), active=True)
    headers = fill(segment, 4)
    segment.close()
    with open(tmp_path / segment_file_name(0, ".log"), "r+b") as f:
        f.truncate(sum(h.size_bytes for h in headers) - 1)
    reopened = LogSegment(tmp_path, 0, LogConfig(), active=True)
    seen: list[BatchHeader] = []
    reopened.recover(seen.append)
    assert seen == headers[:3]


def test_batch_locations_list_the_batches_from_the_one_holding_an_offset(tmp_path):
    segment = LogSegment(tmp_path, 10, LogConfig(index_interval_bytes=100), active=True)
    headers = fill(segment, 6)
    assert [location.header for location in segment.batch_locations(10)] == headers
    found = list(segment.batch_locations(headers[2].last_offset))
    assert [location.header for location in found] == headers[2:]
    assert BatchHeader.parse(segment.read_batch(found[0])) == headers[2]
    assert list(segment.batch_locations(headers[-1].last_offset + 1)) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 6), st.integers(1, 3), st.integers(0, 2)),  # batches, records, gap
    st.tuples(st.just("truncate"), st.integers(0, 60)),
    st.tuples(st.just("roll")),
), min_size=1, max_size=25))
def test_translate_offset_from_the_kept_recent_batches_agrees_with_a_scan_from_the_index(operations):
    """The locations kept from appends (RECENT_BATCHES, small here so that they are trimmed)
    answer exactly as the scan from an index entry does, through appends with offset gaps
    (a cleaned segment), truncations and a seal."""
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(segment_module, "RECENT_BATCHES", 3):
        segment = LogSegment(Path(tmp), 0, LogConfig(index_interval_bytes=100), active=True)
        for operation in operations:
            if operation[0] == "append":
                _, batches, records, gap = operation
                for _ in range(batches):
                    data, header = make_batch(segment.next_offset() + gap, n=records)
                    segment.append(data, [header])
            elif operation[0] == "truncate":
                segment.truncate_to(operation[1])
            else:  # sealed, then active again (as a truncation back into it makes it)
                for fd in segment.seal():
                    os.close(fd)
                segment.make_active()
            scanned = list(segment._batches_from(0))
            for offset in range(segment.next_offset() + 2):
                expected = next((b for b in scanned if b.header.last_offset >= offset), None)
                assert segment.translate_offset(offset) == expected, offset
        segment.close()
