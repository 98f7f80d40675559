"""The pure parts of rayk.client.micro_batches: the budget shared among partitions and the
stream's state in a commit's metadata. (Streams themselves: tests/test_data.py and
tests/test_spark.py.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.client.micro_batches import _metadata, _parse_metadata, _share


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 20), st.integers(0, 1_000), min_size=1, max_size=8), st.integers(1, 2_000))
def test_a_budget_is_spent_whole_in_proportion_to_backlogs(lags, max_records):
    budget = _share(lags, max_records)
    assert set(budget) == set(lags)
    assert all(0 <= budget[p] <= lags[p] for p in lags), "never past a partition's backlog"
    assert sum(budget.values()) == min(max_records, sum(lags.values())), "the whole budget, or the whole backlog"
    total = sum(lags.values())
    if total > max_records:
        for p, lag in lags.items():
            assert abs(budget[p] - lag * max_records / total) < 1 + 1e-9, "in proportion, up to rounding"


def test_the_stream_state_round_trips_through_commit_metadata_and_foreign_metadata_is_ignored():
    assert _parse_metadata(_metadata(7)) == {"next": 7}
    assert _parse_metadata(_metadata(7, 1234)) == {"next": 7, "end": 1234}
    for foreign in ("", "hello", "[1, 2]", '{"other": 1}', '{"rayk.stream": "x"}', '{"rayk.stream": {"next": -1}}'):
        assert _parse_metadata(foreign) == {}, foreign
    assert len(_metadata(2**31, 2**62)) < 100, "well inside offset.metadata.max.bytes (4096)"
