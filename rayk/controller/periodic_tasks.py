"""PeriodicTasks: where the Controller's maintenance runs (Kafka's
PeriodicTaskControlManager).

One loop on the Controller's event loop wakes every tick (`tick_s`) and runs, in the
order they were given, the tasks that are due: a task with period 0 runs every tick,
one with a longer period on the first tick at or after its period has passed since it
last ran (or since it was created). A task that fails is logged and runs again when next due;
one round never overlaps the next, so a task that must not hold up the others (the
pushes of dirty partitions) starts its own background task and returns.

Each tick also records how late its timer fired, as Kafka's EventQueueTimeMs: how long a
ready event waited for the Controller's event loop, where every call and push answer
queues (rayk/metrics.py); and tells `on_late` by how much, before the round's tasks run,
so that what judges the brokers' silence does not count time it could not hear them.

A new kind of maintenance (a balancer, say) is one more `PeriodicTask`, not a new loop.
`start` is idempotent; `cancel` stops the loop. Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from rayk import metrics

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class PeriodicTask:
    """One kind of maintenance: `run` every `period_s` (0: every tick)."""

    name: str
    run: Callable[[], Awaitable[None]]
    period_s: float = 0.0
    next_s: float = 0.0  # monotonic: when it is next due


class PeriodicTasks:
    """The maintenance loop: runs each task when due, in order, one round at a time."""

    def __init__(self, tick_s: float, tasks: Sequence[PeriodicTask], on_late: Callable[[float], None] | None = None) -> None:
        assert tick_s > 0 and all(t.period_s >= 0 for t in tasks), (tick_s, tasks)
        self.tick_s = tick_s
        self._on_late = on_late
        self.tasks = list(tasks)
        now = time.monotonic()
        for task in self.tasks:
            task.next_s = now + task.period_s
        self._loop: asyncio.Task | None = None

    @property
    def started(self) -> bool:
        return self._loop is not None

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._run())

    def cancel(self) -> None:
        if self._loop is not None:
            self._loop.cancel()

    async def _run(self) -> None:
        while True:
            slept_from_s = time.monotonic()
            await asyncio.sleep(self.tick_s)
            late_s = time.monotonic() - slept_from_s - self.tick_s
            metrics.record_event_queue_time(late_s * 1000)
            if self._on_late is not None:
                self._on_late(late_s)
            await self.run_due()

    async def run_due(self) -> None:
        """One round: every task that is due, in order."""
        for task in self.tasks:
            now = time.monotonic()
            if now < task.next_s:
                continue
            task.next_s = now + task.period_s
            try:
                await task.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Controller maintenance: %s failed", task.name)
