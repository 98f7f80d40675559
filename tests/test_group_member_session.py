"""A classic group member's own count of its session (rayk/client/group_member.py), on a
fake clock, without Ray: a member counts itself evicted once no heartbeat *sent* within
`session_timeout_ms` was answered, so a process stopped with a heartbeat in flight does not
take the OK it reads on resuming for a live session (the coordinator evicted it meanwhile,
and its partitions are another member's)."""

from __future__ import annotations

import types

import pytest

from rayk.client import group_member
from rayk.client.group_member import GroupMember, Phase

SESSION_TIMEOUT_MS = 2_000


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_000.0

    def monotonic(self) -> float:
        return self.now_s


class CoordinatorLink:
    """Answers every heartbeat OK after `pause_s` on the clock: the call's round trip, or a
    process stopped while the call was in flight."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.pause_s, self.calls = clock, 0.005, []

    def call(self, method, *args, **kwargs):
        self.calls.append(method)
        self.clock.now_s += self.pause_s


@pytest.fixture
def member(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(group_member, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    revoked: list[bool] = []
    m = GroupMember(None, "g", "client", SESSION_TIMEOUT_MS, 60_000, 1_000, ("range",), lambda topics: None,
                    lambda lost: revoked.append(lost))  # fmt: skip
    m._closed.set()  # no heartbeat thread: the test sends each heartbeat itself
    m._heartbeats.join(timeout=5)
    m._coordinator = CoordinatorLink(clock)
    m._phase, m.member_id, m.generation, m._joined_topics = Phase.STABLE, "m-1", 3, ["t"]
    m._last_answer_s = clock.now_s
    yield m, clock, revoked


def test_a_heartbeat_answered_after_a_pause_longer_than_the_session_does_not_renew_it(member):
    m, clock, revoked = member
    m._coordinator.pause_s = 5.0  # SIGSTOP for 5 s with the heartbeat in flight, then its OK
    m._heartbeat("m-1", 3)
    m._maybe_leave_stable(["t"], clock.monotonic())
    assert revoked == [True], "the session ran out while the heartbeat was in flight: lost, no commit"
    assert m.phase is Phase.UNJOINED


def test_heartbeats_answered_in_time_keep_the_session(member):
    m, clock, revoked = member
    for _ in range(10):  # 15 s of heartbeats, one every 1.5 s, each answered in 5 ms
        clock.now_s += 1.5
        m._heartbeat("m-1", 3)
        m._maybe_leave_stable(["t"], clock.monotonic())
    assert revoked == [] and m.phase is Phase.STABLE and m._coordinator.calls == ["heartbeat"] * 10


def test_no_answer_for_a_session_is_lost_at_the_next_poll(member):
    m, clock, revoked = member
    clock.now_s += SESSION_TIMEOUT_MS / 1000 + 0.1
    m._maybe_leave_stable(["t"], clock.monotonic())
    assert revoked == [True]
