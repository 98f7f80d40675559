"""The nemesis (tests/faults/nemesis.py): its schedules, drawn without Ray, and a short
fixed-seed schedule run against a Ray cluster of a head and 4 broker nodes under the
producer, a consumer group and a stream_topic pipeline, in `make chaos` (marked `chaos`),
which then runs more seeds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cluster_helpers import broker_node_cluster
from tests.faults.nemesis import (
    BROKERS,
    DATA_LOSS,
    DOWN,
    HEALTHY,
    LOSE_NODE,
    MAX_FAULTS,
    MIN_FAULTS,
    REPLICATION_FACTOR,
    Nemesis,
    Schedule,
    check_rule,
    draw_schedule,
)

# Drawn with MIN_FAULTS faults each; `make chaos` runs them first (`-m chaos`: a schedule
# takes a minute, which `make test`'s 25-minute budget no longer has room for).
SEEDS = [3]

seeds = st.integers(min_value=0, max_value=2**63)


@given(seeds)
def test_a_seed_draws_the_same_schedule_every_time(seed):
    assert draw_schedule(seed) == draw_schedule(seed)


@settings(max_examples=300)
@given(seeds, st.integers(min_value=MIN_FAULTS, max_value=MAX_FAULTS))
def test_every_schedule_has_3_to_10_faults_and_keeps_the_safety_rule(seed, max_faults):
    schedule = draw_schedule(seed, max_faults)
    assert MIN_FAULTS <= len(schedule.faults) <= max_faults
    assert all(f.barrier == HEALTHY for f in schedule.faults if f.kind in DOWN)
    assert sum(f.kind == LOSE_NODE for f in schedule.faults) <= BROKERS - REPLICATION_FACTOR
    check_rule(schedule)


def test_seeds_draw_every_kind_of_fault_and_different_schedules():
    schedules = [draw_schedule(seed) for seed in range(200)]
    assert len({s.faults for s in schedules}) == len(schedules)
    assert {f.kind for s in schedules for f in s.faults} >= DOWN | DATA_LOSS


def test_the_rule_refuses_a_data_loss_that_does_not_wait_for_a_full_isr():
    drawn = draw_schedule(1)
    unsafe = drawn.faults[0].__class__("empty-disk", 0, 0, 0, "none")
    with pytest.raises(AssertionError, match="full ISR"):
        check_rule(Schedule(1, (unsafe, *drawn.faults[1:])))


def test_a_reduced_schedule_keeps_the_faults_it_names_and_says_how_to_replay_it():
    drawn = draw_schedule(7)
    reduced = drawn.reduced((3, 1))
    assert reduced.faults == (drawn.faults[0], drawn.faults[2])
    assert reduced.replay().endswith("--seed 7 --count 1 --only 1,3")
    check_rule(reduced)


@pytest.fixture(scope="module")
def ray_cluster():
    with broker_node_cluster(BROKERS) as cluster:
        yield cluster


@pytest.mark.chaos
@pytest.mark.parametrize("seed", SEEDS)
def test_a_fixed_seed_schedule_loses_no_acknowledged_record(ray_cluster, tmp_path, seed):
    schedule = draw_schedule(seed, max_faults=MIN_FAULTS)
    report = Nemesis(ray_cluster, tmp_path, schedule).run()
    print("\n".join(report.lines()))
    assert report.ok, "\n".join(report.lines())
