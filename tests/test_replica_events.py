"""ReplicaEvents (rayk/replication/replica_events.py): which waiters each notification
wakes. An append wakes those for records only; an HW move alone wakes every waiter but
those (a follower's parked fetch gains nothing from it); a change wakes everyone. Pure, no
Ray, no event loop."""

from __future__ import annotations

import pytest

from rayk.replication.replica_events import ReplicaEvents


@pytest.fixture
def woken() -> tuple[ReplicaEvents, list[str]]:
    events, calls = ReplicaEvents(), []
    events.on_append = lambda appended: calls.append("followers' parked fetches")
    events.on_change_produce = lambda: calls.append("parked produce calls")
    events.on_change_fetch = lambda: calls.append("consumers' parked fetches")
    events.on_change = lambda: calls.append("share partitions")
    return events, calls


def test_an_append_wakes_only_the_waiters_for_records(woken):
    events, calls = woken
    for_records, for_changes = events.change_event(appends=True), events.change_event()
    events.notify_append((0, b"batches"))
    assert calls == ["followers' parked fetches"]
    assert for_records.fired and not for_changes.fired


def test_an_hw_move_alone_wakes_every_waiter_but_those_for_records(woken):
    events, calls = woken
    for_records, for_changes = events.change_event(appends=True), events.change_event()
    events.notify_high_watermark()
    assert calls == ["parked produce calls", "consumers' parked fetches", "share partitions"]
    assert for_changes.fired and not for_records.fired
    # The append event still waits for records, and fires for them.
    assert events.change_event(appends=True) is for_records
    events.notify_append()
    assert for_records.fired


def test_a_change_of_role_or_config_wakes_every_waiter(woken):
    events, calls = woken
    for_records, for_changes = events.change_event(appends=True), events.change_event()
    events.notify_change()
    assert calls == ["followers' parked fetches", "parked produce calls", "consumers' parked fetches",
                     "share partitions"]
    assert for_records.fired and for_changes.fired
    # Each event is made anew once fired: a later waiter waits for the next notification.
    assert not events.change_event().fired and not events.change_event(appends=True).fired
