"""Wakeup (rayk/actors/wakeup.py): what a replica's waiting fetches and produce requests wait on."""

from __future__ import annotations

import asyncio
import time

import pytest

from rayk.actors.wakeup import Wakeup

# Ray runs the replicas on uvloop; these run on both loops.
pytestmark = pytest.mark.usefixtures("each_event_loop")


def test_fire_wakes_every_waiter_at_once_and_later_waits_return_at_once():
    async def main() -> list[float]:
        wakeup = Wakeup()
        start = time.monotonic()
        waiting = [asyncio.ensure_future(wakeup.wait(30)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiting)
        wakeup.fire()
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        await asyncio.wait_for(wakeup.wait(30), 5)  # fired: it does not wait
        assert wakeup.fired and not wakeup._waiters
        return [time.monotonic() - start]

    assert asyncio.run(main())[0] < 5


def test_a_wait_that_times_out_returns_without_an_error_and_leaves_nothing_behind():
    async def main() -> float:
        wakeup = Wakeup()
        start = time.monotonic()
        for _ in range(50):  # an idle partition's long polls: each one times out
            await wakeup.wait(0.002)
        assert not wakeup._waiters, "a timed-out waiter stays in the list: it grows with every poll"
        assert not wakeup.fired
        return time.monotonic() - start

    assert asyncio.run(main()) >= 50 * 0.002


def test_a_cancelled_waiter_is_dropped_and_the_others_still_wake():
    async def main() -> None:
        wakeup = Wakeup()
        cancelled = asyncio.ensure_future(wakeup.wait(30))
        kept = asyncio.ensure_future(wakeup.wait(30))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert len(wakeup._waiters) == 1
        wakeup.fire()
        await asyncio.wait_for(kept, 5)

    asyncio.run(main())


def test_an_unbounded_wait_waits_for_the_fire():
    async def main() -> None:
        wakeup = Wakeup()
        waiting = asyncio.ensure_future(wakeup.wait(float("inf")))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        wakeup.fire()
        await asyncio.wait_for(waiting, 5)

    asyncio.run(main())
