"""RestartBackoff: how long an owner waits before it starts again something that failed (a
replica process, a Kafka listener, a broker's registration), per thing it restarts.

On a node short of CPU, a restart is more load: a new replica process costs ~0.35 CPU-s
before it does anything, and a broker's registration pushes every partition it holds. An
owner that restarts at once whatever failed turns slowness into more slowness (a metastable
failure). So, per key (a partition, "listener", "registration"):
- the first restart in a window goes at once: one failure is recovered from as fast as
  before;
- each further restart within `window_s` of the last ones waits twice as long as the one
  before, from `first_delay_s` up to `max_delay_s`, with equal jitter (between half and all
  of that), so that the owners of many failed things do not restart them in step;
- at most `budget` restarts per `window_s`: past it, the next waits until the oldest of them
  leaves the window, however short its backoff.
Restarts older than `window_s` are forgotten, so a thing that stayed up that long starts
from scratch.

Pure: the clock and the random source are injected (tests drive both). Not thread-safe:
its owner's event loop calls it.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass


WINDOW_MARGIN_S = 0.001


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Delays and budget of one kind of restart (see the module docstring)."""

    first_delay_s: float
    max_delay_s: float
    budget: int
    window_s: float

    def __post_init__(self) -> None:
        assert 0 < self.first_delay_s <= self.max_delay_s, self
        assert self.budget >= 1 and self.window_s >= self.max_delay_s, self


class RestartBackoff:
    """Per key, the restarts of the last window, and the wait before the next one."""

    def __init__(self, policy: BackoffPolicy, clock: Callable[[], float] = time.monotonic,
                 uniform: Callable[[], float] = random.random) -> None:  # fmt: skip
        self.policy = policy
        self._clock = clock
        self._uniform = uniform
        # key -> its last `budget` restart times within the window, oldest first (bounded:
        # more never change a delay, which is at its budget's then).
        self._restarts: dict[Hashable, deque[float]] = {}

    def recent(self, key: Hashable) -> int:
        """Restarts of `key` within the window."""
        return len(self._window(key))

    def delay_s(self, key: Hashable) -> float:
        """How long to wait, from now, before restarting `key` (0: at once)."""
        p = self.policy
        restarts = self._window(key)
        if not restarts:
            return 0.0
        backoff_s = min(p.max_delay_s, p.first_delay_s * 2 ** (len(restarts) - 1))
        delay_s = backoff_s * (0.5 + 0.5 * self._uniform())
        if len(restarts) >= p.budget:  # spent: wait for the oldest to leave the window (a ms past it:
            # `now + delay` in floats may fall short of the oldest restart + the window by an ulp)
            delay_s = max(delay_s, restarts[-p.budget] + p.window_s - self._clock() + WINDOW_MARGIN_S)
        assert delay_s >= 0, delay_s
        return delay_s

    def restarted(self, key: Hashable) -> None:
        """`key` was restarted just now."""
        self._window(key)  # what left the window goes first
        self._restarts.setdefault(key, deque(maxlen=self.policy.budget)).append(self._clock())

    def forget(self, key: Hashable) -> None:
        """`key` is gone for good (its partition deleted, say)."""
        self._restarts.pop(key, None)

    def _window(self, key: Hashable) -> deque[float]:
        restarts = self._restarts.get(key)
        if restarts is None:
            return deque()
        horizon_s = self._clock() - self.policy.window_s
        while restarts and restarts[0] <= horizon_s:
            restarts.popleft()
        if not restarts:
            del self._restarts[key]
        return restarts
