"""OffsetIndex and TimeIndex: file format, lookup, truncation, trim, sanity checks."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.storage.offset_index import OffsetIndex
from rayk.storage.time_index import TimeIndex

MIB = 1 << 20


def test_offset_index_entries_are_relative_offset_and_position_big_endian(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", base_offset=100, max_index_bytes=MIB, writable=True)
    index.append(105, 4096)
    index.append(110, 8200)
    index.trim()
    assert (tmp_path / "x.index").read_bytes() == struct.pack(">iiii", 5, 4096, 10, 8200)


def test_offset_index_lookup_returns_last_entry_at_or_below_target(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", base_offset=100, max_index_bytes=MIB, writable=True)
    for n in range(1, 11):
        index.append(100 + 10 * n, 1000 * n)
    assert index.lookup(99) == (100, 0)
    assert index.lookup(109) == (100, 0)
    assert index.lookup(110) == (110, 1000)
    assert index.lookup(155) == (150, 5000)
    assert index.lookup(10**9) == (200, 10000)


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.integers(1, 1000), min_size=0, max_size=200), target=st.integers(0, 300_000))
def test_offset_index_lookup_matches_a_linear_scan(tmp_path_factory, gaps, target):
    index = OffsetIndex(tmp_path_factory.mktemp("i") / "x.index", base_offset=0, max_index_bytes=MIB, writable=True)
    entries, offset = [], 0
    for gap in gaps:
        offset += gap
        index.append(offset, offset * 2)
        entries.append((offset, offset * 2))
    expected = max((e for e in entries if e[0] <= target), default=(0, 0))
    assert index.lookup(target) == expected


def test_offset_index_rejects_entries_that_do_not_grow(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", base_offset=0, max_index_bytes=MIB, writable=True)
    index.append(10, 100)
    with pytest.raises(AssertionError):
        index.append(10, 200)


def test_offset_index_is_full_at_its_preallocated_size(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", base_offset=0, max_index_bytes=20, writable=True)
    index.append(1, 1)
    index.append(2, 2)
    assert index.is_full
    with pytest.raises(RuntimeError, match="full"):
        index.append(3, 3)


def test_offset_index_truncate_to_drops_entries_at_or_above(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", base_offset=0, max_index_bytes=MIB, writable=True)
    for n in (10, 20, 30):
        index.append(n, n)
    index.truncate_to(20)
    assert (index.entries, index.last_offset) == (1, 10)


def test_offset_index_is_preallocated_while_active_and_trimmed_after(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", base_offset=0, max_index_bytes=800, writable=True)
    index.append(1, 1)
    assert (tmp_path / "x.index").stat().st_size == 800
    index.trim()
    assert (tmp_path / "x.index").stat().st_size == 8
    reopened = OffsetIndex(tmp_path / "x.index", base_offset=0, max_index_bytes=800, writable=False)
    assert reopened.lookup(5) == (1, 1)


def test_offset_index_sanity_check_flags_entries_that_do_not_grow(tmp_path):
    (tmp_path / "x.index").write_bytes(struct.pack(">iiii", 5, 100, 5, 200))
    index = OffsetIndex(tmp_path / "x.index", base_offset=0, max_index_bytes=MIB, writable=False)
    assert index.sanity_check() is not None


def test_time_index_appends_only_when_timestamp_grows(tmp_path):
    index = TimeIndex(tmp_path / "x.timeindex", base_offset=50, max_index_bytes=MIB, writable=True)
    index.maybe_append(1000, 55)
    index.maybe_append(1000, 60)
    index.maybe_append(900, 61)
    index.maybe_append(1200, 70)
    index.trim()
    assert (tmp_path / "x.timeindex").read_bytes() == struct.pack(">qiqi", 1000, 5, 1200, 20)


def test_time_index_lookup_returns_last_entry_at_or_below_target(tmp_path):
    index = TimeIndex(tmp_path / "x.timeindex", base_offset=0, max_index_bytes=MIB, writable=True)
    for n in range(1, 6):
        index.maybe_append(100 * n, 10 * n)
    assert index.lookup(50) == (-1, 0)
    assert index.lookup(250) == (200, 20)
    assert index.lookup(500) == (500, 50)


def test_time_index_truncate_to_drops_entries_at_or_above_offset(tmp_path):
    index = TimeIndex(tmp_path / "x.timeindex", base_offset=0, max_index_bytes=MIB, writable=True)
    for n in range(1, 6):
        index.maybe_append(100 * n, 10 * n)
    index.truncate_to(30)
    assert index.last_entry == (200, 20)


def _resident_pages(mapped: mmap.mmap) -> int:
    """How many pages of a file mapping are in the page cache (mincore(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    pages = (len(mapped) + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    view = ctypes.c_char.from_buffer(mapped)
    try:
        assert libc.mincore(ctypes.c_void_p(ctypes.addressof(view)), ctypes.c_size_t(len(mapped)), vector) == 0
    finally:
        del view
    return sum(v & 1 for v in vector)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore(2) and read-around are Linux's")
@pytest.mark.parametrize("index_class", [OffsetIndex, TimeIndex])
def test_first_entry_of_a_preallocated_index_brings_one_page_into_memory(tmp_path, index_class):
    """The sparse preallocated tail is not read around the first entry's page fault (it
    was 8 MiB of zeroed page cache per index on a device reading 8 MiB ahead)."""
    index = index_class(tmp_path / "x.index", base_offset=0, max_index_bytes=10 * MIB, writable=True)
    if index_class is OffsetIndex:
        index.append(5, 4096)
    else:
        index.maybe_append(1_000, 5)
    try:
        assert _resident_pages(index._mmap) == 1
    finally:
        index.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore(2) and read-around are Linux's")
def test_an_index_reopened_writable_reads_a_page_at_a_time(tmp_path):
    """A restarted broker's last segment, made active again with a cold page cache: a
    lookup and the next entry fault in their own pages, not the read-ahead around them
    (which reached into the sparse tail)."""
    path = tmp_path / "x.index"
    index = OffsetIndex(path, base_offset=0, max_index_bytes=10 * MIB, writable=True)
    entries = 3 * mmap.PAGESIZE // OffsetIndex.ENTRY_SIZE_BYTES  # three whole pages
    for n in range(entries):
        index.append(n + 1, 4096 * (n + 1))
    index.trim()
    index.close()
    with open(path, "rb") as f:  # a cold cache: the file's clean pages dropped
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    index = OffsetIndex(path, base_offset=0, max_index_bytes=10 * MIB, writable=True)
    try:
        assert index.lookup(10**9) == (entries, 4096 * entries)  # the search probes each page of entries
        index.append(entries + 1, 4096 * (entries + 1))  # and this brings in the tail's first page
        assert _resident_pages(index._mmap) <= 3 + 1
    finally:
        index.close()
