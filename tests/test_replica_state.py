"""LeaderReplicaState: Kafka's ISR and high-watermark rules, without Ray."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.replication.replica_state import LeaderReplicaState

LAG_MS = 10_000


def leader(isr=(1, 2, 3), hw=0, epoch_start=0, now_ms=0) -> LeaderReplicaState:
    return LeaderReplicaState(1, [1, 2, 3], isr, hw, epoch_start, now_ms)


def test_high_watermark_is_min_leo_over_isr():
    state = leader()
    state.record_follower_fetch(2, 5, leader_log_end_offset=10, now_ms=1)
    state.record_follower_fetch(3, 8, leader_log_end_offset=10, now_ms=1)
    assert state.maybe_increment_high_watermark(10)
    assert state.high_watermark == 5


def test_high_watermark_with_only_the_leader_in_isr_is_leo():
    state = leader(isr=(1,))
    assert state.maybe_increment_high_watermark(7)
    assert state.high_watermark == 7


def test_high_watermark_stands_still_while_the_isr_is_below_min_insync_replicas():
    """KIP-966's strict min ISR: what the leader alone holds is not committed, so the
    replicas that left the ISR still hold everything committed (and may lead: the ELR)."""
    state = leader(isr=(1,), hw=4)
    assert not state.maybe_increment_high_watermark(7, min_insync_replicas=2)
    assert state.high_watermark == 4
    state.record_follower_fetch(2, 7, leader_log_end_offset=7, now_ms=1)
    state.commit_isr(state.isr_expansion(2))
    assert state.maybe_increment_high_watermark(7, min_insync_replicas=2) and state.high_watermark == 7


def test_min_insync_replicas_above_the_replica_count_counts_as_the_replica_count():
    state = LeaderReplicaState(1, [1], [1], 0, 0, 0)
    assert state.maybe_increment_high_watermark(3, min_insync_replicas=2) and state.high_watermark == 3


def test_high_watermark_never_moves_backwards():
    state = leader(hw=5)
    state.record_follower_fetch(2, 3, leader_log_end_offset=10, now_ms=1)
    state.record_follower_fetch(3, 3, leader_log_end_offset=10, now_ms=1)
    assert not state.maybe_increment_high_watermark(10)
    assert state.high_watermark == 5


def test_follower_joins_isr_when_it_reaches_the_high_watermark():
    state = leader(isr=(1,), hw=6)
    state.record_follower_fetch(2, 5, leader_log_end_offset=6, now_ms=1)
    assert state.isr_expansion(2) is None
    state.record_follower_fetch(2, 6, leader_log_end_offset=6, now_ms=2)
    assert state.isr_expansion(2) == {1, 2}
    assert state.isr == {1}, "a proposal is not the ISR until committed"


def test_follower_does_not_join_isr_below_the_leader_epoch_start():
    state = leader(isr=(1,), hw=0, epoch_start=4)
    state.record_follower_fetch(2, 3, leader_log_end_offset=6, now_ms=1)
    assert state.isr_expansion(2) is None


def test_stuck_follower_leaves_isr_after_lag_time():
    state = leader(now_ms=0)
    state.record_follower_fetch(2, 10, leader_log_end_offset=10, now_ms=5_000)
    state.record_follower_fetch(3, 10, leader_log_end_offset=10, now_ms=5_000)
    # Replica 3 stops fetching; replica 2 keeps up.
    state.record_follower_fetch(2, 20, leader_log_end_offset=20, now_ms=14_000)
    assert state.out_of_sync_replicas(LAG_MS, now_ms=15_001) == {3}


def test_slow_follower_that_fetches_but_never_catches_up_leaves_isr():
    state = leader(now_ms=0)
    for t in range(1_000, 13_000, 1_000):
        # Always a little behind where the leader was at its previous fetch.
        state.record_follower_fetch(2, t // 100 - 20, leader_log_end_offset=t // 100, now_ms=t)
        state.record_follower_fetch(3, t // 100, leader_log_end_offset=t // 100, now_ms=t)
    assert state.out_of_sync_replicas(LAG_MS, now_ms=12_500) == {2}


def test_follower_that_reaches_the_previous_leader_leo_counts_as_caught_up_then():
    state = leader(now_ms=0)
    state.record_follower_fetch(2, 10, leader_log_end_offset=10, now_ms=1_000)
    state.record_follower_fetch(2, 10, leader_log_end_offset=15, now_ms=2_000)
    # It reached 10, the leader's LEO at its previous fetch (t=1000), not yet 15.
    assert state.followers[2].last_caught_up_time_ms == 1_000
    state.record_follower_fetch(2, 15, leader_log_end_offset=20, now_ms=3_000)
    assert state.followers[2].last_caught_up_time_ms == 2_000


def test_shrink_never_removes_the_leader():
    state = leader()
    assert state.isr_shrink({1, 2, 3}) == {1}


def test_pending_shrink_keeps_the_high_watermark_behind_the_removed_follower():
    state = leader(hw=0)
    state.record_follower_fetch(2, 10, leader_log_end_offset=10, now_ms=1)
    state.record_follower_fetch(3, 4, leader_log_end_offset=10, now_ms=1)
    state.propose_isr(state.isr_shrink({3}))
    state.maybe_increment_high_watermark(10)
    assert state.high_watermark == 4, "replica 3 may still be elected until the shrink is committed"
    state.commit_isr({1, 2})
    state.maybe_increment_high_watermark(10)
    assert state.high_watermark == 10


def test_pending_expansion_counts_the_new_follower_at_once():
    state = leader(isr=(1,), hw=6)
    state.record_follower_fetch(2, 6, leader_log_end_offset=9, now_ms=1)
    state.propose_isr(state.isr_expansion(2))
    state.maybe_increment_high_watermark(9)
    assert state.high_watermark == 6
    assert state.isr_expansion(3) is None and state.isr_shrink({2}) is None, "one change at a time"
    state.abort_isr_change()
    assert state.isr == {1} and state.maximal_isr == {1}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([2, 3]), st.integers(0, 50), st.integers(0, 3), st.sampled_from(["commit", "abort", "wait"])),
        max_size=40,
    )
)
def test_invariants_hold_under_random_fetches_appends_and_isr_changes(steps):
    state, leo, now = leader(isr=(1,)), 0, 0
    follower_leo = {2: 0, 3: 0}  # within one leader epoch a follower's LEO only grows
    for replica, fetch_offset, appended, controller in steps:
        leo += appended
        now += 700
        follower_leo[replica] = max(follower_leo[replica], min(fetch_offset, leo))
        state.record_follower_fetch(replica, follower_leo[replica], leo, now)
        for proposal in (state.isr_expansion(replica), state.isr_shrink(state.out_of_sync_replicas(LAG_MS, now))):
            if proposal is not None:
                state.propose_isr(proposal)
        if state.pending_isr is not None and controller != "wait":
            state.commit_isr(state.pending_isr) if controller == "commit" else state.abort_isr_change()
        hw_before = state.high_watermark
        state.maybe_increment_high_watermark(leo)
        assert hw_before <= state.high_watermark <= leo
        assert 1 in state.isr
        for r in state.maximal_isr - {1}:
            assert state.followers[r].log_end_offset >= state.high_watermark


def test_a_pending_expansion_of_a_replica_a_reassignment_removed_is_dropped():
    """A removed replica fetches until its stop arrives, so the leader may propose it back
    into the ISR; once the new replica set arrives that proposal must go, or the HW would
    be computed over a follower the leader no longer tracks (a KeyError took down produce)."""
    state = LeaderReplicaState(1, [1, 2, 3, 4], [1, 2, 4], 10, 0, 0)
    state.record_follower_fetch(3, 10, leader_log_end_offset=10, now_ms=1)
    proposal = state.isr_expansion(3)
    assert proposal == {1, 2, 3, 4}
    state.propose_isr(proposal)
    state.update_replicas([1, 2, 4], now_ms=2)  # the reassignment completed: 3 is gone
    assert state.pending_isr is None and 3 not in state.followers
    state.record_follower_fetch(2, 12, leader_log_end_offset=12, now_ms=3)
    state.record_follower_fetch(4, 12, leader_log_end_offset=12, now_ms=3)
    assert state.maybe_increment_high_watermark(12) and state.high_watermark == 12
