"""Parsing Spark-style offset bounds, and splitting ranges (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayk.client.offset_ranges import EARLIEST, LATEST, OffsetRange, parse_offsets
from rayk.errors import InvalidConfigurationError


def test_keywords_cover_every_partition():
    assert parse_offsets("earliest", "t", 3, starting=True) == {0: EARLIEST, 1: EARLIEST, 2: EARLIEST}
    assert parse_offsets("latest", "t", 2, starting=False) == {0: LATEST, 1: LATEST}


def test_json_and_dicts_as_spark_takes_them():
    assert parse_offsets('{"t":{"0":23,"1":-2}}', "t", 2, starting=True) == {0: 23, 1: EARLIEST}
    assert parse_offsets({"t": {0: 5, 1: -1}}, "t", 2, starting=False) == {0: 5, 1: LATEST}


@pytest.mark.parametrize(
    "spec, starting",
    [
        ("latest", True),  # a batch read that starts at the end reads nothing
        ("earliest", False),
        ('{"t":{"0":-1,"1":0}}', True),
        ('{"t":{"0":-2,"1":0}}', False),
        ('{"t":{"0":1}}', True),  # partition 1 missing
        ('{"t":{"0":1,"1":2,"2":3}}', True),  # no partition 2
        ('{"other":{"0":1,"1":2}}', True),
        ('{"t":{"zero":1,"1":2}}', True),
        ('{"t":{"0":-3,"1":2}}', True),
        ("{not json", True),
        ('["t"]', True),
    ],
)
def test_bad_bounds_are_invalid_configuration(spec, starting):
    with pytest.raises(InvalidConfigurationError):
        parse_offsets(spec, "t", 2, starting=starting)


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 3_000))
def test_split_covers_the_range_in_order_without_overlap(start, size, max_records):
    r = OffsetRange("t", 0, start, start + size, leader=1)
    parts = r.split(max_records)
    assert parts[0].start == r.start and parts[-1].end == r.end
    assert all(a.end == b.start for a, b in zip(parts, parts[1:]))
    assert all(0 <= p.size <= max_records for p in parts)
    assert sum(p.size for p in parts) == size


@given(st.integers(0, 10**6), st.integers(0, 5_000), st.integers(1, 50))
def test_an_even_split_has_that_many_parts_of_nearly_one_size(start, size, parts):
    r = OffsetRange("t", 0, start, start + size, 1)
    pieces = r.split_evenly(parts)
    assert pieces[0].start == start and pieces[-1].end == start + size
    assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
    assert len(pieces) <= max(1, parts)
    if size >= parts:
        assert len(pieces) >= parts / 2, "no few large parts where many were asked for"
        sizes = [p.size for p in pieces]
        assert max(sizes) <= -(-size // parts)
