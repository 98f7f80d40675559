"""The environment nemesis's schedules (tests/faults/env_schedule.py), drawn without Ray:
pinned seed for seed, their safety rule, and nemesis.py's process-fault schedules left as
they were. The schedules themselves run in `make chaos` (tests/faults/env_nemesis.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.faults import nemesis as nm
from tests.faults.env_schedule import (
    COPY_AWAY, CUT_LEADER, CUTS, DISK_FAILING, ENV_CONTROL, ENV_DOWN, ENV_KINDS, MAX_ENV_FAULTS, MIN_ENV_FAULTS,
    RAY_DEAD_MIN_MS, EnvSchedule, check_env_rule, draw_env_schedule,
)  # fmt: skip

seeds = st.integers(min_value=0, max_value=2**63)


def test_seed_1_draws_the_schedule_it_always_drew():
    drawn = [(f.kind, f.partition, f.pick, f.gap_ms, f.duration_ms, f.variant) for f in draw_env_schedule(1).faults]
    assert drawn == [
        ("cut-leader", 0, 0, 4200, 40000, ""),
        ("cut-leader", 2, 1, 200, 44000, ""),
        ("kill-controller", 2, 2, 5700, 0, ""),
        ("kill-broker", 2, 1, 5800, 0, ""),
        ("cut-leader", 2, 0, 0, 19000, ""),
    ]


def test_make_chaos_seeds_169_to_171_draw_every_environment_fault():
    kinds = {f.kind for seed in (169, 170, 171) for f in draw_env_schedule(seed).faults}
    assert kinds >= ENV_DOWN | ENV_CONTROL


def test_the_process_fault_schedules_are_what_they_were():
    """Drawing environment schedules changed nothing of nemesis.py's (pinned before they existed)."""
    drawn = {seed: [(f.kind, f.partition, f.pick, f.gap_ms) for f in nm.draw_schedule(seed).faults] for seed in (3, 7)}
    assert drawn[3] == [("elect-preferred", 0, 2, 5900), ("kill-controller", 2, 1, 4600), ("empty-disk", 1, 1, 500),
                        ("reassign", 1, 0, 3400), ("pause-leader-replica", 2, 0, 4100), ("reassign", 0, 0, 3500),
                        ("kill-leader-replica", 0, 2, 700)]  # fmt: skip
    assert drawn[7] == [("kill-controller", 1, 1, 6000), ("kill-leader-replica", 1, 2, 2700), ("empty-disk", 0, 0, 0),
                        ("auto-rebalance", 2, 0, 500), ("auto-rebalance", 1, 1, 3600), ("elect-preferred", 2, 2, 2200),
                        ("kill-broker", 2, 2, 2200)]  # fmt: skip


@given(seeds)
def test_a_seed_draws_the_same_environment_schedule_every_time(seed):
    assert draw_env_schedule(seed) == draw_env_schedule(seed)


@settings(max_examples=300)
@given(seeds, st.integers(min_value=MIN_ENV_FAULTS, max_value=MAX_ENV_FAULTS))
def test_every_environment_schedule_keeps_the_safety_rule(seed, max_faults):
    schedule = draw_env_schedule(seed, max_faults)
    assert MIN_ENV_FAULTS <= len(schedule.faults) <= max_faults
    for f in schedule.faults:
        assert f.kind in ENV_KINDS
        assert (f.barrier == nm.HEALTHY) == (f.kind in COPY_AWAY), f  # copies away wait; clock steps, CONTROL do not
        assert f.kind not in CUTS or f.duration_ms < RAY_DEAD_MIN_MS, f
    check_env_rule(schedule)


def test_seeds_draw_every_environment_fault_and_no_fault_the_netns_cluster_cannot_take():
    kinds = {f.kind for seed in range(200) for f in draw_env_schedule(seed).faults}
    assert kinds == set(ENV_KINDS)
    assert not kinds & {nm.LOSE_NODE, nm.REPLACE_NODE, nm.EMPTY_DISK, nm.CRASH_ALL, nm.REASSIGN}
    assert {f.variant for seed in range(200) for f in draw_env_schedule(seed).faults if f.kind == DISK_FAILING} == {
        "read,write,fsync", "write", "fsync", "read"}  # fmt: skip


def _with_first(schedule: EnvSchedule, **changes) -> EnvSchedule:
    return dataclasses.replace(schedule, faults=(dataclasses.replace(schedule.faults[0], **changes), *schedule.faults[1:]))


def test_the_rule_refuses_a_cut_that_does_not_wait_for_a_full_isr():
    with pytest.raises(AssertionError, match="full ISR"):
        check_env_rule(_with_first(draw_env_schedule(1), barrier=nm.NONE))


def test_the_rule_refuses_a_cut_long_enough_for_ray_to_declare_the_node_dead():
    drawn = draw_env_schedule(1)
    assert drawn.faults[0].kind == CUT_LEADER
    with pytest.raises(AssertionError):
        check_env_rule(_with_first(drawn, duration_ms=RAY_DEAD_MIN_MS))


def test_the_rule_refuses_a_fault_that_needs_a_spare_node():
    with pytest.raises(AssertionError, match="netns cluster"):
        check_env_rule(_with_first(draw_env_schedule(1), kind=nm.LOSE_NODE, duration_ms=0))


def test_a_reduced_environment_schedule_says_how_to_replay_it():
    drawn = draw_env_schedule(7)
    reduced = drawn.reduced((3, 1))
    assert reduced.faults == (drawn.faults[0], drawn.faults[2])
    assert reduced.replay() == ".venv/bin/python -m tests.faults.env_nemesis --seed 7 --count 1 --only 1,3"
    check_env_rule(reduced)
