"""Handoff (rayk/net/handoff.py) against asyncio.Queue: one producer task and one consumer
task, each putting or getting with random pauses and cancellations, see the same items
in the same order from both, and neither ever holds more than its bound."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.net.handoff import Handoff


def run(make, seed: int, max_items: int, count: int, cancel_every: int) -> tuple[list[int], int]:
    """(what the consumer got, in order; the most items held at once)."""

    async def main() -> tuple[list[int], int]:
        channel = make(max_items)
        rng = random.Random(seed)
        got: list[int] = []
        most = [0]

        async def produce() -> None:
            i = 0
            while i < count:
                putting = asyncio.ensure_future(channel.put(i))
                if cancel_every and rng.randrange(cancel_every) == 0:
                    await asyncio.sleep(0)
                    if not putting.done():
                        putting.cancel()
                        try:
                            await putting
                        except asyncio.CancelledError:
                            continue  # not put: put it again
                await putting
                most[0] = max(most[0], channel.qsize() if hasattr(channel, "qsize") else len(channel._items))
                i += 1
                for _ in range(rng.randrange(3)):
                    await asyncio.sleep(0)
            await channel.put(None)

        async def consume() -> None:
            while True:
                getting = asyncio.ensure_future(channel.get())
                if cancel_every and rng.randrange(cancel_every) == 0:
                    await asyncio.sleep(0)
                    if not getting.done():
                        getting.cancel()
                        try:
                            await getting
                        except asyncio.CancelledError:
                            continue  # took nothing
                item = await getting
                if item is None:
                    return
                got.append(item)
                for _ in range(rng.randrange(3)):
                    await asyncio.sleep(0)

        await asyncio.wait_for(asyncio.gather(produce(), consume()), 30)
        return got, most[0]

    return asyncio.run(main())


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), max_items=st.integers(1, 5), count=st.integers(0, 40),
       cancel_every=st.sampled_from([0, 2, 5]))  # fmt: skip
def test_a_handoff_passes_every_item_in_order_within_its_bound_as_a_queue_does(seed, max_items, count, cancel_every):
    got, most = run(Handoff, seed, max_items, count, cancel_every)
    assert got == list(range(count)) and most <= max_items
    queue_got, _ = run(asyncio.Queue, seed, max_items, count, cancel_every)
    assert queue_got == got


def test_nowait_calls_raise_as_a_queue_s_do():
    async def main() -> None:
        channel: Handoff[int] = Handoff(1)
        with pytest.raises(asyncio.QueueEmpty):
            channel.get_nowait()
        channel.put_nowait(1)
        with pytest.raises(asyncio.QueueFull):
            channel.put_nowait(2)
        assert not channel.empty() and channel.get_nowait() == 1 and channel.empty()

    asyncio.run(main())
