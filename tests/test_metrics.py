"""rayk/metrics.py: how the partition leaders' counts reach Ray's counters."""

from __future__ import annotations

from rayk import metrics


class RecordedCounter:
    def __init__(self) -> None:
        self.incs: list[tuple[float, dict]] = []

    def inc(self, value: float, tags: dict) -> None:
        self.incs.append((value, tags))


def test_a_leader_s_counts_reach_ray_at_most_once_a_second_and_whenever_flushed(monkeypatch):
    recorded: dict[str, RecordedCounter] = {}
    monkeypatch.setattr(metrics, "metric", lambda name: recorded.setdefault(name, RecordedCounter()))
    counters = metrics.BrokerTopicCounters(2, "t")
    counters.messages_in += 5
    counters.maybe_flush()  # the first goes at once
    counters.messages_in += 7
    counters.bytes_in += 700
    counters.maybe_flush()  # within the second: held back
    assert recorded[metrics.MESSAGES_IN].incs == [(5, {"broker": "2", "topic": "t"})]
    assert metrics.BYTES_IN not in recorded
    counters.flush()  # the broker's checkpoint loop asks
    counters.flush()  # nothing new: nothing recorded
    assert [v for v, _ in recorded[metrics.MESSAGES_IN].incs] == [5, 7]
    assert [v for v, _ in recorded[metrics.BYTES_IN].incs] == [700]
    assert set(recorded) == {metrics.MESSAGES_IN, metrics.BYTES_IN}, "zero counts are not recorded"
