"""SampledRate: a rate over a sliding window of samples (Kafka's metrics Rate over a
SampledStat), what a client quota measures a client with.

The window is `samples` samples of `sample_ms` each. A value is added to the current
sample; a sample older than the whole window is forgotten. The rate is the sum of the
samples over the time since the oldest began, padded to at least `samples - 1` whole
samples, so a client's first burst is measured over the full window rather than over
the few milliseconds it took (Kafka's Rate.windowSize).

`throttle_ms` is Kafka's QuotaUtils.throttleTime: how long the client must send nothing
for the rate to come back down to `limit`.
"""

from __future__ import annotations

from collections import deque


class SampledRate:
    """One measured client's rate for one quota: owns its samples ([start ms, sum], oldest
    first, at most `samples`). The caller passes the clock; not thread-safe (the listener's
    event loop, through ClientQuotas)."""

    def __init__(self, samples: int, sample_ms: int) -> None:
        assert samples >= 1 and sample_ms >= 1
        self.samples = samples
        self.sample_ms = sample_ms
        self._windows: deque[list[float]] = deque()  # [start_ms, sum], oldest first

    def record(self, value: float, now_ms: float) -> None:
        """Adds `value` (negative to take back what was recorded) at `now_ms`."""
        self._purge(now_ms)
        if not self._windows or now_ms - self._windows[-1][0] >= self.sample_ms:
            self._windows.append([now_ms, 0.0])
            if len(self._windows) > self.samples:
                self._windows.popleft()
        self._windows[-1][1] += value

    def window_ms(self, now_ms: float) -> float:
        """The time the rate is measured over (at least `samples - 1` whole samples)."""
        self._purge(now_ms)
        elapsed = now_ms - self._windows[0][0] if self._windows else 0.0
        whole_samples = int(elapsed // self.sample_ms)
        if whole_samples < self.samples - 1:
            elapsed += (self.samples - 1 - whole_samples) * self.sample_ms
        return max(elapsed, 1.0)

    def total(self, now_ms: float) -> float:
        self._purge(now_ms)
        return sum(w[1] for w in self._windows)

    def rate_per_s(self, now_ms: float) -> float:
        return self.total(now_ms) * 1000 / self.window_ms(now_ms)

    def throttle_ms(self, limit_per_s: float, now_ms: float) -> int:
        """0 while the rate is within `limit_per_s`; else how long it takes, with nothing
        recorded meanwhile, to come back to it."""
        assert limit_per_s > 0
        rate = self.rate_per_s(now_ms)
        if rate <= limit_per_s:
            return 0
        return round((rate - limit_per_s) / limit_per_s * self.window_ms(now_ms))

    def idle(self, now_ms: float) -> bool:
        """Whether everything recorded has left the window (the rate may be dropped)."""
        self._purge(now_ms)
        return not self._windows

    def _purge(self, now_ms: float) -> None:
        while self._windows and now_ms - self._windows[0][0] >= self.samples * self.sample_ms:
            self._windows.popleft()
