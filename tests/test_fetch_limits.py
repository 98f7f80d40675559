"""data_apis.fetch's limits on what one Fetch may ask of the replicas: a partition named
twice is INVALID_REQUEST before any replica is called, max_wait is capped, at most
MAX_PARKED_PER_PARTITION fetches wait at one replica (the rest are answered at once), and
fetch.max.bytes bounds what is read, not only what is answered."""

from __future__ import annotations

import asyncio

from rayk.replication.partition_replica import FetchResult
from rayk.net import data_apis
from rayk.net.api_versions import FETCH
from rayk.net.codec import Request, RequestHead, request_class
from rayk.net.client_quotas import ClientQuotas
from rayk.net.entities import build
from rayk.net.fetch_session import FetchSessionCache
from rayk.net.parked_fetches import ParkedFetches
from rayk.storage.records import SimpleRecord, build_batch, iter_batches

HOUR_MS = 3_600_000


class FakeView:
    """A BrokerView whose replicas answer at once with nothing, recording each call."""

    def __init__(self, park: asyncio.Event | None = None) -> None:
        self.fetch_sessions = FetchSessionCache()
        self.parked_fetches = ParkedFetches(max_per_partition=3)
        self.quotas = ClientQuotas()  # none set
        self.calls: list[tuple] = []
        self._park = park  # a fetch with a wait parks until it is set

    def authorized(self, *_: object) -> bool:
        return True

    async def fetch(self, topic, partition, request):
        wait_ms = request.max_wait_ms
        self.calls.append((topic, partition, wait_ms))
        if wait_ms and self._park is not None:
            await self._park.wait()
        return FetchResult(b"", 0, 0, 0)


class LogView(FakeView):
    """Replicas holding `batches` batches of BATCH_RECORDS records each, answering as a log
    does: whole batches up to max_bytes, at least one."""

    def __init__(self, batches: dict[int, int]) -> None:
        super().__init__()
        self.logs = {p: [build_batch([SimpleRecord(b"v" * 100)] * BATCH_RECORDS, base_offset=i * BATCH_RECORDS)
                         for i in range(n)] for p, n in batches.items()}
        self.read_bytes = 0

    async def fetch(self, topic, partition, request):
        offset, max_bytes = request.offset, request.max_bytes
        self.calls.append((partition, offset, max_bytes))
        out = b""
        for batch in self.logs[partition][offset // BATCH_RECORDS:]:
            if out and len(out) + len(batch) > max_bytes:
                break
            out += batch
        self.read_bytes += len(out)
        end = len(self.logs[partition]) * BATCH_RECORDS
        return FetchResult(out, end, end, 0)


BATCH_RECORDS = 10


def fetch_request(partitions: list[int], max_wait_ms: int, max_bytes: int = 1 << 20,
                  partition_max_bytes: int = 1 << 20) -> Request:
    body = build(request_class(FETCH, 12), {
        "max_wait": max_wait_ms, "min_bytes": 1, "max_bytes": max_bytes, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": [
            {"partition": p, "fetch_offset": 0, "partition_max_bytes": partition_max_bytes} for p in partitions]}],
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


def answered_bytes(answer: dict) -> dict[int, int]:
    return {p["partition_index"]: len(p["records"]) for t in answer["responses"] for p in t["partitions"]}


def test_many_partitions_read_no_more_than_fetch_max_bytes_and_a_batch_each():
    batch_bytes = len(build_batch([SimpleRecord(b"v" * 100)] * BATCH_RECORDS))
    view = LogView({p: 20 for p in range(100)})
    max_bytes = 20 * batch_bytes
    answer = asyncio.run(data_apis.fetch(view, fetch_request(list(range(100)), 0, max_bytes=max_bytes)))
    assert sum(answered_bytes(answer).values()) <= max_bytes
    assert all(requested <= max(max_bytes // 100, 1) for _, _, requested in view.calls)
    assert view.read_bytes <= max_bytes + 100 * batch_bytes, "at most one batch over each share"
    assert view.read_bytes < 100 * 20 * batch_bytes / 10, "not every partition's partition_max_bytes"


def test_what_quiet_partitions_leave_tops_up_a_busy_one_in_order():
    batch_bytes = len(build_batch([SimpleRecord(b"v" * 100)] * BATCH_RECORDS))
    view = LogView({0: 50, 1: 1, 2: 1})  # partition 0 has far more than a third of max_bytes
    max_bytes = 30 * batch_bytes
    answer = asyncio.run(data_apis.fetch(view, fetch_request([0, 1, 2], 0, max_bytes=max_bytes)))
    got = answered_bytes(answer)
    assert got[1] == got[2] == batch_bytes
    assert max_bytes - 3 * batch_bytes <= got[0] <= max_bytes - 2 * batch_bytes, got
    records = b"".join(view.logs[0])[:got[0]]
    offsets = [b.header.base_offset for b in iter_batches(records)]
    assert offsets == list(range(0, len(offsets) * BATCH_RECORDS, BATCH_RECORDS)), "the top-up continues the read"
    assert view.read_bytes <= max_bytes + batch_bytes


def test_partitions_whose_limits_fit_are_read_in_one_round():
    view = LogView({p: 3 for p in range(3)})
    asyncio.run(data_apis.fetch(view, fetch_request([0, 1, 2], 0, max_bytes=50 << 20, partition_max_bytes=1 << 20)))
    assert len(view.calls) == 3 and all(requested == 1 << 20 for _, _, requested in view.calls)


def test_a_fetch_of_no_partitions_is_answered():
    answer = asyncio.run(data_apis.fetch(LogView({}), fetch_request([], 0)))
    assert answer == {"error_code": 0, "session_id": 0, "responses": [], "throttle_time": 0}


def test_a_top_up_takes_only_whole_batches_that_fit_and_never_starves_the_partitions_after():
    """Two busy partitions and max_bytes of 2.5 batches: each gets its batch, and the top-up
    (which a replica answers with at least one whole batch) adds none that would not fit."""
    batch_bytes = len(build_batch([SimpleRecord(b"v" * 100)] * BATCH_RECORDS))
    view = LogView({0: 10, 1: 10})
    answer = asyncio.run(data_apis.fetch(view, fetch_request([0, 1], 0, max_bytes=batch_bytes * 5 // 2)))
    assert answered_bytes(answer) == {0: batch_bytes, 1: batch_bytes}


def test_caught_up_partitions_are_not_read_again():
    view = LogView({p: 1 for p in range(60)})  # one batch each, all read in the first round
    asyncio.run(data_apis.fetch(view, fetch_request(list(range(60)), 0, max_bytes=50 << 20, partition_max_bytes=1 << 20)))
    assert len(view.calls) == 60
