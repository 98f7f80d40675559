"""The Controller's maintenance pushes dirty partitions again without waiting for them:
a slow broker's pushes must not hold up the next round (and its fencing of silent
brokers). Pure asyncio: the pushes themselves are stood in for."""

from __future__ import annotations

import asyncio

from rayk.controller.channel_manager import ControllerChannelManager


def test_dirty_partitions_are_pushed_in_the_background_one_round_at_a_time():
    async def scenario():
        controller = ControllerChannelManager.__new__(ControllerChannelManager)  # only the push bookkeeping is used
        controller.dirty, controller._dirty_pushes, controller._tasks = {("t", 0), ("t", 1)}, None, set()
        started, release = [], asyncio.Event()

        async def slow_push(topic, partition):
            started.append((topic, partition))
            await release.wait()
            if partition == 1:
                raise RuntimeError("the broker answered with an error")

        controller.push = slow_push
        await asyncio.wait_for(controller.push_dirty(), timeout=1)  # returns while the pushes wait
        await asyncio.sleep(0)
        assert sorted(started) == [("t", 0), ("t", 1)]

        controller.dirty.add(("t", 2))
        await asyncio.wait_for(controller.push_dirty(), timeout=1)  # the last round is still out
        assert controller.dirty == {("t", 2)} and len(started) == 2

        release.set()
        await controller._dirty_pushes
        assert controller.dirty == {("t", 2), ("t", 1)}, "a push that raised is dirty again"
        await controller.push_dirty()
        await controller._dirty_pushes
        assert sorted(started[2:]) == [("t", 1), ("t", 2)] and not controller._tasks

    asyncio.run(scenario())
