"""RestartBackoff on a clock of its own: the first restart at once, then doubling delays
with jitter up to the cap, at most a budget per window, and a fresh start after a window
without restarts."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayk.actors.restart_backoff import WINDOW_MARGIN_S, BackoffPolicy, RestartBackoff

POLICY = BackoffPolicy(first_delay_s=1, max_delay_s=8, budget=6, window_s=60)


def backoff(jitter: float = 1.0) -> tuple[RestartBackoff, list[float]]:
    clock = [0.0]
    return RestartBackoff(POLICY, clock=lambda: clock[0], uniform=lambda: jitter), clock


def test_the_first_restart_goes_at_once_and_the_next_ones_wait_twice_as_long_up_to_the_cap():
    b, clock = backoff()
    delays = []
    for _ in range(5):
        delays.append(b.delay_s("p"))
        clock[0] += delays[-1]
        b.restarted("p")
    assert delays == [0, 1, 2, 4, 8]
    assert b.delay_s("other") == 0, "per key"


def test_jitter_keeps_between_half_and_all_of_the_backoff():
    low, clock = backoff(jitter=0.0)
    low.restarted("p")
    low.restarted("p")
    assert low.delay_s("p") == 1.0, "half of 2 s"


def test_past_the_budget_a_restart_waits_for_the_oldest_to_leave_the_window():
    b, clock = backoff()
    for _ in range(6):  # six restarts in 6 s: the budget
        b.restarted("p")
        clock[0] += 1
    assert b.delay_s("p") == pytest.approx(60 - 6, abs=WINDOW_MARGIN_S), "the first leaves the window at 60"
    clock[0] = 60.5
    assert b.recent("p") == 5 and b.delay_s("p") == 8


def test_a_window_without_restarts_starts_from_scratch():
    b, clock = backoff()
    for _ in range(4):
        b.restarted("p")
    clock[0] = 61
    assert b.recent("p") == 0 and b.delay_s("p") == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 120), st.floats(0, 1)), max_size=40))
@example([(0.5887642507475542, 0.0), (32.0, 0.0)] + [(0.0, 0.0)] * 6)  # a wait that fell an ulp short of the window
def test_restarts_that_follow_the_delays_never_exceed_the_budget_in_any_window(steps):
    clock = [0.0]
    jitter = [0.0]
    b = RestartBackoff(POLICY, clock=lambda: clock[0], uniform=lambda: jitter[0])
    times = []
    for gap_s, j in steps:
        clock[0] += gap_s
        jitter[0] = j
        delay_s = b.delay_s("p")
        assert 0 <= delay_s <= max(POLICY.max_delay_s, POLICY.window_s + WINDOW_MARGIN_S)
        clock[0] += delay_s
        b.restarted("p")
        times.append(clock[0])
    for i, t in enumerate(times):
        assert sum(1 for u in times[i:] if u - t < POLICY.window_s) <= POLICY.budget
