"""MetadataCache (rayk/client/metadata.py) against a fake Controller: what the blocking
lookups answer as the metadata ages."""

from __future__ import annotations

import concurrent.futures
import types
from typing import Any

import pytest

from rayk.client import calls, metadata
from rayk.client.metadata import MetadataCache

MAX_AGE_MS = 300_000


class Answer:
    """An ObjectRef stand-in: its value is there at once."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def future(self) -> concurrent.futures.Future:
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(self.value)
        return done


class Controller:
    """Answers `metadata` with the leader each partition has now; counts the lookups."""

    def __init__(self) -> None:
        self.leaders = {0: "replica-on-broker-2"}
        self.lookups = 0
        self.metadata = types.SimpleNamespace(remote=self._metadata)

    def _metadata(self, topics: list[str]) -> Answer:
        self.lookups += 1
        return Answer({t: {"partitions": {p: {"leader_handle": h} for p, h in self.leaders.items()}} for t in topics})


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(metadata, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=lambda s: None))
    monkeypatch.setattr(calls, "get", lambda ref, deadline_s, what: ref.value)
    return now


def test_a_blocking_lookup_takes_a_new_leader_once_the_metadata_is_older_than_its_max_age(clock):
    """A leader that answers without an error but no longer leads (cut off from the
    Controller while the others elected another) must not be asked for ever: Kafka's
    metadata.max.age.ms bounds it, for blocking lookups (a stream's end offsets) too."""
    controller = Controller()
    cache = MetadataCache(controller, metadata_max_age_ms=MAX_AGE_MS)
    assert cache.leader("t", 0) == "replica-on-broker-2"
    controller.leaders = {0: "replica-on-broker-0"}  # elected elsewhere; no error told this cache
    clock[0] += MAX_AGE_MS / 1000 - 1
    assert cache.leader("t", 0) == "replica-on-broker-2" and controller.lookups == 1, "fresh enough: no lookup"
    clock[0] += 2
    cache.leader("t", 0)  # answered as stored, and looked up again in the background
    assert controller.lookups == 2
    assert cache.leader("t", 0) == "replica-on-broker-0"
    assert cache.partition_count("t") == 1 and controller.lookups == 2, "fresh again"
