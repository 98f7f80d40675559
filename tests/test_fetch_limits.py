"""data_apis.fetch's limits on what one Fetch may ask of the replicas: a partition named
twice is INVALID_REQUEST before any replica is called, max_wait is capped, and at most
MAX_PARKED_PER_PARTITION fetches wait at one replica (the rest are answered at once)."""

from __future__ import annotations

import asyncio

from rayk.actors.partition_replica import FetchResult
from rayk.net import data_apis
from rayk.net.api_versions import FETCH
from rayk.net.codec import Request, RequestHead, request_class
from rayk.net.entities import build
from rayk.net.fetch_session import FetchSessionCache
from rayk.net.parked_fetches import ParkedFetches

HOUR_MS = 3_600_000


class FakeView:
    """A BrokerView whose replicas answer at once with nothing, recording each call."""

    def __init__(self, park: asyncio.Event | None = None) -> None:
        self.fetch_sessions = FetchSessionCache()
        self.parked_fetches = ParkedFetches(max_per_partition=3)
        self.calls: list[tuple] = []
        self._park = park  # a fetch with a wait parks until it is set

    def authorized(self, *_: object) -> bool:
        return True

    async def call(self, topic, partition, method, offset, max_bytes, min_bytes, wait_ms, *rest):
        self.calls.append((topic, partition, wait_ms))
        if wait_ms and self._park is not None:
            await self._park.wait()
        return FetchResult(b"", 0, 0, 0)


def fetch_request(partitions: list[int], max_wait_ms: int) -> Request:
    body = build(request_class(FETCH, 12), {
        "max_wait": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": [
            {"partition": p, "fetch_offset": 0, "partition_max_bytes": 1 << 20} for p in partitions]}],
    })
    return Request(RequestHead(FETCH, 12, 1), "test", body)


def test_a_partition_named_twice_is_invalid_request_and_no_replica_is_called():
    view = FakeView()
    answer = asyncio.run(data_apis.fetch(view, fetch_request([0] * 1000, HOUR_MS)))
    assert answer == {"error_code": 42, "session_id": 0, "responses": []}  # INVALID_REQUEST
    assert view.calls == []


def test_max_wait_is_capped(monkeypatch):
    monkeypatch.setattr(data_apis, "MAX_FETCH_WAIT_MS", 50)
    view = FakeView()
    answer = asyncio.run(data_apis.fetch(view, fetch_request([0], HOUR_MS)))
    assert answer["error_code"] == 0 and view.calls == [("t", 0, 50)]


def test_past_the_parked_limit_a_fetch_is_answered_at_once_and_a_freed_place_is_used_again():
    async def main() -> None:
        park = asyncio.Event()
        view = FakeView(park)
        parked = [asyncio.ensure_future(data_apis.fetch(view, fetch_request([0], 10_000))) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert view.parked_fetches.parked("t", 0) == 3
        answer = await asyncio.wait_for(data_apis.fetch(view, fetch_request([0], 10_000)), 1)
        assert answer["error_code"] == 0 and view.calls[-1] == ("t", 0, 0), "answered without waiting"
        park.set()
        await asyncio.gather(*parked)
        assert view.parked_fetches.parked("t", 0) == 0
        park.clear()
        again = asyncio.ensure_future(data_apis.fetch(view, fetch_request([0], 10_000)))
        await asyncio.sleep(0.01)
        assert view.calls[-1] == ("t", 0, 10_000)
        park.set()
        await again

    asyncio.run(main())
