"""rayk.data's reading of one offset range (`iter_range`), against a fake leader: a table
per fetch, the next fetch sent before a table is handed out, and a failed fetch (the one
sent ahead included) retried from where the last table ended. No Ray."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from rayk import data as rayk_data
from rayk.client.offset_ranges import OffsetRange
from rayk.dataplane.frames import FetchResult
from rayk.errors import NotLeaderOrFollowerError
from rayk.storage.records import build_batch

RECORDS_PER_BATCH = 3
BATCHES = 10


class FakeMetadata:
    def __init__(self) -> None:
        self.invalidated = 0

    def leader(self, topic: str, partition: int) -> str:
        return "leader"

    def invalidate(self, topic: str) -> None:
        self.invalidated += 1


class FakeLeader:
    """A log of BATCHES batches; each fetch answers the one batch holding its offset."""

    def __init__(self, events: list[str], fail_fetches_at: set[int] = frozenset()) -> None:
        self.events = events
        self.fail_fetches_at = set(fail_fetches_at)  # fetch numbers answered NOT_LEADER_OR_FOLLOWER
        self.fetches = 0
        self.batches = [
            build_batch([(None, b"%d" % (RECORDS_PER_BATCH * b + i), (), 0) for i in range(RECORDS_PER_BATCH)],
                        base_offset=RECORDS_PER_BATCH * b)
            for b in range(BATCHES)
        ]  # fmt: skip

    def fetch(self, leader: str, request) -> concurrent.futures.Future:
        self.fetches += 1
        self.events.append(f"fetch {request.offset}")
        answer: concurrent.futures.Future = concurrent.futures.Future()
        end = RECORDS_PER_BATCH * BATCHES
        if self.fetches in self.fail_fetches_at:
            answer.set_result(FetchResult(b"", end, end, 0, NotLeaderOrFollowerError("moved")))
        else:
            answer.set_result(FetchResult(self.batches[request.offset // RECORDS_PER_BATCH], end, end, 0))
        return answer


def read(leader: FakeLeader, start: int, end: int, hold_s: float = 0) -> list[int]:
    """The offsets read, each table held `hold_s` (a Spark task writing it to its JVM)."""
    offsets = []
    for table in rayk_data._fetched_tables(FakeMetadata(), leader, OffsetRange("t", 0, start, end, 0), 1):
        first = table.column("offset")[0].as_py()
        leader.events.append(f"table {first}")
        offsets += table.column("offset").to_pylist()
        time.sleep(hold_s)
    return offsets


def test_the_next_fetch_is_sent_before_a_table_is_handed_out():
    events: list[str] = []
    assert read(FakeLeader(events), 4, 13) == list(range(4, 13))
    assert events == ["fetch 4", "fetch 6", "table 4", "fetch 9", "table 6", "fetch 12", "table 9", "table 12"]


def test_a_failed_fetch_sent_ahead_is_sent_again_from_the_same_offset(monkeypatch):
    monkeypatch.setattr(rayk_data, "READ_RETRY_BACKOFF_MS", 1)
    events: list[str] = []
    leader = FakeLeader(events, fail_fetches_at={2, 5})  # the first fetch sent ahead, and a later one
    assert read(leader, 0, 30) == list(range(30)), "nothing skipped, nothing twice"
    assert events[:4] == ["fetch 0", "fetch 3", "table 0", "fetch 3"]


def test_a_fetch_that_keeps_failing_ends_in_a_timeout(monkeypatch):
    monkeypatch.setattr(rayk_data, "READ_RETRY_BACKOFF_MS", 1)
    monkeypatch.setattr(rayk_data, "READ_RETRY_TIMEOUT_MS", 50)
    leader = FakeLeader([], fail_fetches_at=set(range(2, 10_000)))
    with pytest.raises(rayk_data.KafkaTimeoutError, match="stuck at offset 3"):
        read(leader, 0, 30)


def test_the_time_a_caller_holds_a_table_is_not_taken_from_the_next_fetchs_retries(monkeypatch):
    monkeypatch.setattr(rayk_data, "READ_RETRY_BACKOFF_MS", 1)
    monkeypatch.setattr(rayk_data, "READ_RETRY_TIMEOUT_MS", 50)
    leader = FakeLeader([], fail_fetches_at={2, 4})  # fetches sent ahead, failing
    assert read(leader, 0, 12, hold_s=0.1) == list(range(12))
