"""ProduceTrace notes each stage of a leader's batches once, in offset order, and
stage_latencies_ms turns complete batches into per-stage milliseconds."""

from __future__ import annotations

import time

from rayk.replication.produce_trace import ProduceTrace, stage_latencies_ms


def test_each_stage_is_noted_once_for_every_batch_it_reaches():
    trace = ProduceTrace()
    start = time.monotonic()
    trace.appended(start, 3)
    trace.appended(start, 5)
    trace.fetch_answered(1, 5)  # one fetch answer carries both batches
    trace.fetch_answered(1, 5)  # the same again: already noted
    trace.fetch_arrived(1, 3)  # follower 1 has the first batch only
    trace.fetch_arrived(2, 5)  # follower 2 was never sent anything traced
    trace.high_watermark(3)
    trace.answered(3)
    first, second = trace.batches()
    assert set(first["sent"]) == {1} and first["sent"][1] == second["sent"][1]
    assert set(first["acked"]) == {1, 2} and set(second["acked"]) == {2}
    assert "hw" in first and "hw" not in second
    assert "answered" in first and "answered" not in second
    assert first["received"] <= first["appended"] <= first["sent"][1] <= first["acked"][1] <= first["hw"]
    stages = stage_latencies_ms(trace.batches())
    assert {name: len(values) for name, values in stages.items()} == {name: 1 for name in stages}, "only the first is complete"
    assert all(v >= 0 for values in stages.values() for v in values)


def test_the_trace_keeps_the_newest_batches():
    trace = ProduceTrace(max_batches=2)
    for end in (1, 2, 3):
        trace.appended(time.monotonic(), end)
    trace.high_watermark(3)
    trace.answered(1)  # dropped already: ignored
    assert [b["end"] for b in trace.batches()] == [2, 3]
    assert all("hw" in b for b in trace.batches())
