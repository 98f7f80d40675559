"""A consumer's commits land in the order they were asked for, whatever their kind
(rayk/client/commit_manager.py): an asynchronous commit queued behind a slow one never
lands after a synchronous commit or an auto-commit asked for later, which would move the
group's committed offset back."""

from __future__ import annotations

import threading

import pytest

from rayk.client.commit_manager import CommitManager
from rayk.client.consumer_config import ConsumerConfig
from rayk.errors import KafkaTimeoutError


class SlowMember:
    """A group membership whose first commit waits until `release` is set."""

    def __init__(self) -> None:
        self.committed: list[int] = []  # the offsets of partition t-0, in the order they landed
        self.release = threading.Event()
        self.auto_commits = 0

    def commit(self, offsets, timeout_ms: int) -> None:
        if not self.committed:
            self.release.wait(5)
        self.committed.append(offsets[("t", 0)][0])

    def commit_async(self, offsets, now: float) -> bool:  # an auto-commit (never waits)
        self.auto_commits += 1
        self.committed.append(offsets[("t", 0)][0])
        return True


def manager(member: SlowMember, timeout_ms: int = 5_000) -> CommitManager:
    config = ConsumerConfig(group_id="g", enable_auto_commit=True, default_api_timeout_ms=timeout_ms)
    return CommitManager(member, config)  # type: ignore[arg-type]


def test_a_synchronous_commit_lands_after_the_asynchronous_ones_asked_for_before():
    member = SlowMember()
    commits = manager(member)
    commits.commit_async({("t", 0): (100, "")}, None)  # slow: waits for release
    threading.Timer(0.2, member.release.set).start()
    commits.commit({("t", 0): (200, "")})
    assert member.committed == [100, 200], "the older asynchronous commit landed last, moving the offset back"
    commits.close(None, 1_000)


def test_a_synchronous_commit_behind_a_stuck_asynchronous_one_times_out():
    member = SlowMember()
    commits = manager(member, timeout_ms=200)
    commits.commit_async({("t", 0): (100, "")}, None)
    with pytest.raises(KafkaTimeoutError):
        commits.commit({("t", 0): (200, "")})
    member.release.set()
    commits.close(None, 1_000)
    assert member.committed == [100]


def test_an_auto_commit_waits_for_the_asynchronous_commits_under_way():
    member = SlowMember()
    commits = manager(member)
    commits.commit_async({("t", 0): (100, "")}, None)
    due = commits.next_auto_commit_s
    commits.maybe_auto_commit(lambda: {("t", 0): (200, "")}, due)
    assert member.auto_commits == 0, "an auto-commit went out while an older commit was still under way"
    member.release.set()
    commits.close(None, 1_000)  # waits for the asynchronous commit
    commits.maybe_auto_commit(lambda: {("t", 0): (200, "")}, due)
    assert member.committed == [100, 200]
