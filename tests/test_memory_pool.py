"""MemoryPool (queued.max.request.bytes): reservations wait while the pool is spent, are
granted in arrival order, and a cancelled wait gives back what it was granted."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.net.memory_pool import UNBOUNDED, MemoryPool


def test_a_reservation_waits_until_enough_is_released_and_large_ones_are_not_starved():
    async def main() -> None:
        pool = MemoryPool(100)
        await pool.reserve(60)
        large = asyncio.ensure_future(pool.reserve(80))
        small = asyncio.ensure_future(pool.reserve(10))  # fits now, but queues behind the large one
        await asyncio.sleep(0.01)
        assert not large.done() and not small.done() and pool.available_bytes == 40
        pool.release(60)
        await asyncio.sleep(0.01)
        assert large.done() and small.done() and pool.used_bytes == 90

    asyncio.run(main())


def test_a_cancelled_wait_takes_nothing_and_lets_the_next_one_through():
    async def main() -> None:
        pool = MemoryPool(100)
        await pool.reserve(50)
        blocked = asyncio.ensure_future(pool.reserve(80))
        behind = asyncio.ensure_future(pool.reserve(30))
        await asyncio.sleep(0.01)
        blocked.cancel()
        await asyncio.sleep(0.01)
        assert behind.done() and pool.used_bytes == 80

    asyncio.run(main())


def test_a_wait_cancelled_just_before_a_release_takes_nothing():
    """Cancelling the waiting task cancels its future at once; a release in the same turn
    must skip it, not grant it (found by review: it raised and lost the bytes)."""
    async def main() -> None:
        pool = MemoryPool(100)
        await pool.reserve(100)
        waiter = asyncio.ensure_future(pool.reserve(50))
        behind = asyncio.ensure_future(pool.reserve(30))
        await asyncio.sleep(0)
        waiter.cancel()
        pool.release(100)  # before the cancelled task runs again
        results = await asyncio.gather(waiter, behind, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError) and results[1] is None
        assert pool.used_bytes == 30 and not pool._waiters

    asyncio.run(main())


def test_unbounded_never_waits():
    async def main() -> None:
        pool = MemoryPool(UNBOUNDED)
        await pool.reserve(1 << 40)
        pool.release(1 << 40)
        assert pool.used_bytes == 0

    asyncio.run(main())


operations = st.lists(st.one_of(st.tuples(st.just("reserve"), st.integers(1, 100)), st.just(("release", 0))),
                      max_size=40)


@settings(max_examples=100, deadline=None)
@given(operations)
def test_reservations_are_granted_in_arrival_order_and_the_pool_never_overdraws(ops):
    async def main() -> None:
        pool = MemoryPool(100)
        waits: list[tuple[int, asyncio.Future]] = []  # (size, reservation) in arrival order
        released: set[int] = set()

        async def settle() -> None:
            for _ in range(3):
                await asyncio.sleep(0)
            done = [w.done() for _, w in waits]
            assert done == sorted(done, reverse=True), "granted in arrival order: a prefix of the reservations"
            held = sum(size for i, (size, w) in enumerate(waits) if w.done() and i not in released)
            assert pool.used_bytes == held <= pool.capacity_bytes

        def release_oldest() -> bool:
            held = [i for i, (_, w) in enumerate(waits) if w.done() and i not in released]
            if held:
                released.add(held[0])
                pool.release(waits[held[0]][0])
            return bool(held)

        for op, size in ops:
            if op == "reserve":
                waits.append((size, asyncio.ensure_future(pool.reserve(size))))
            else:
                release_oldest()
            await settle()
        while release_oldest():  # giving everything back grants every reservation in turn
            await settle()
        assert all(w.done() for _, w in waits) and pool.used_bytes == 0

    asyncio.run(main())
