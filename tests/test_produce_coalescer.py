"""ProduceCoalescer: a listener's produce requests for one partition go to the leader in
few calls, one in flight at a time, appended in the order they were submitted."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.errors import NotLeaderOrFollowerError
from rayk.net.produce_coalescer import ProduceCoalescer


class FakeLeaders:
    """Leaders that hold each call until released; they record what each call carried."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, int], list[bytes]]] = []
        self.gates: list[asyncio.Event] = []
        self.fail_next = False

    async def send(self, topic, partition, requests):
        self.calls.append(((topic, partition), [r[0] for r in requests]))
        gate = asyncio.Event()
        self.gates.append(gate)
        fail, self.fail_next = self.fail_next, False
        await gate.wait()
        if fail:
            raise NotLeaderOrFollowerError("the leader moved")
        return [f"result of {r[0].decode()}" for r in requests]


def run(body):
    asyncio.run(asyncio.wait_for(body(), 10))


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_request_to_an_idle_partition_goes_at_once_in_its_own_call():
    async def body():
        leaders = FakeLeaders()
        coalescer = ProduceCoalescer(leaders.send)
        answer = coalescer.submit("t", 0, b"a", -1, 1000)
        await settle()
        assert leaders.calls == [(("t", 0), [b"a"])]
        leaders.gates[0].set()
        assert await answer == "result of a"
        assert not coalescer.in_flight("t", 0)

    run(body)


def test_requests_arriving_while_a_call_is_in_flight_go_together_in_order():
    async def body():
        leaders = FakeLeaders()
        coalescer = ProduceCoalescer(leaders.send)
        answers = [coalescer.submit("t", 0, f"r{i}".encode(), -1, 1000) for i in range(6)]
        await settle()
        assert [c[1] for c in leaders.calls] == [[b"r0"]]  # one call in flight; the rest wait
        leaders.gates[0].set()
        await settle()
        assert [c[1] for c in leaders.calls][1:] == [[b"r1", b"r2", b"r3", b"r4", b"r5"]]
        leaders.gates[1].set()
        assert await asyncio.gather(*answers) == [f"result of r{i}" for i in range(6)]
        assert not coalescer.in_flight("t", 0)

    run(body)


def test_a_call_carries_at_most_call_max_bytes_but_always_one_request():
    async def body():
        leaders = FakeLeaders()
        coalescer = ProduceCoalescer(leaders.send, call_max_bytes=10)
        answers = [coalescer.submit("t", 0, payload, -1, 1000) for payload in (b"x", b"aaaa", b"bbbb", b"cccc", b"d" * 30)]
        for expected in ([b"x"], [b"aaaa", b"bbbb"], [b"cccc"], [b"d" * 30]):
            await settle()
            assert leaders.calls[-1][1] == expected
            leaders.gates[-1].set()
        await asyncio.gather(*answers)

    run(body)


def test_partitions_are_coalesced_independently():
    async def body():
        leaders = FakeLeaders()
        coalescer = ProduceCoalescer(leaders.send)
        coalescer.submit("t", 0, b"a", -1, 1000)
        coalescer.submit("t", 0, b"b", -1, 1000)
        coalescer.submit("t", 1, b"c", -1, 1000)
        await settle()
        assert sorted(leaders.calls) == [(("t", 0), [b"a"]), (("t", 1), [b"c"])]
        for gate in leaders.gates:
            gate.set()

    run(body)


def test_a_failed_call_fails_each_of_its_requests_and_the_next_ones_still_go():
    async def body():
        leaders = FakeLeaders()
        coalescer = ProduceCoalescer(leaders.send)
        leaders.fail_next = True
        first = coalescer.submit("t", 0, b"a", -1, 1000)
        second = coalescer.submit("t", 0, b"b", -1, 1000)
        await settle()
        leaders.gates[0].set()
        with pytest.raises(NotLeaderOrFollowerError):
            await first
        await settle()
        assert leaders.calls[-1][1] == [b"b"]
        leaders.gates[-1].set()
        assert await second == "result of b"

    run(body)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=40), st.integers(0, 2**32 - 1))
def test_every_partition_appends_its_requests_in_submit_order(partitions, seed):
    """Calls take random times and requests arrive at random moments; each partition's log
    still has its requests in submit order, and never two calls of it at once."""
    rng = random.Random(seed)
    logs: dict[int, list[bytes]] = {p: [] for p in range(3)}
    busy: set[int] = set()

    async def leader(topic, partition, requests):
        assert partition not in busy, "two calls in flight to one partition"
        busy.add(partition)
        await asyncio.sleep(rng.random() / 500)  # delivery
        logs[partition].extend(r[0] for r in requests)
        await asyncio.sleep(rng.random() / 500)  # the HW wait
        busy.discard(partition)
        return [None] * len(requests)

    async def body():
        coalescer = ProduceCoalescer(leader)
        answers = []
        for i, partition in enumerate(partitions):
            answers.append(coalescer.submit("t", partition, str(i).encode(), -1, 1000))
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() / 1000)
        await asyncio.gather(*answers)

    run(body)
    for p in range(3):
        assert logs[p] == [str(i).encode() for i, q in enumerate(partitions) if q == p]
