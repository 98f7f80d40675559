"""Consumer lag per group and partition from committed offsets and high watermarks (group_lag.py)."""

from __future__ import annotations

from rayk.coordinator.group.group_lag import lags


def test_lag_is_the_high_watermark_minus_the_committed_offset_and_never_negative():
    committed = {"g1": {("t", 0): 10, ("t", 1): 7}, "g2": {("t", 0): 12}}
    # g2 committed past an end offset that was read before its commit: no lag, not -2.
    assert lags(committed, {("t", 0): 10, ("t", 1): 9}) == {("g1", "t", 0): 0, ("g1", "t", 1): 2, ("g2", "t", 0): 0}


def test_partitions_without_an_end_offset_or_a_committed_position_are_left_out():
    committed = {"g": {("t", 0): 3, ("t", 1): 4, ("u", 0): -1}}
    assert lags(committed, {("t", 0): 5, ("u", 0): 8}) == {("g", "t", 0): 2}
