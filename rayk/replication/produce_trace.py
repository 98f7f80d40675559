"""ProduceTrace: when each stage of the acks=all path happened to a leader's batches, to
measure where a produce's round trip goes (benchmarks/ack_path_bench.py reads it).

A leader that is tracing (PartitionReplica.trace_produce) notes, per batch it appends,
keyed by the batch's end offset (last offset + 1), on its own `time.monotonic()` clock:
- `received`: its produce call started;
- `appended`: the batch is in the leader's log;
- `sent[r]`: a fetch of follower r was answered with records reaching the batch's end;
- `acked[r]`: follower r's next fetch arrived at or past the end (it has the batch);
- `hw`: the high watermark reached the end;
- `answered`: the produce call returned.
Stages between them are what `stage_latencies_ms` summarises. `time.monotonic` is the
host's CLOCK_MONOTONIC, so a client on the same host can put its own times beside these.

Bounded: at most `max_batches` batches are kept (the oldest are dropped), and marking is
O(1) per batch per stage: batches are appended in offset order and each stage keeps a
cursor over them.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

STAGES = ("received", "appended", "sent", "acked", "hw", "answered")


class ProduceTrace:
    """A tracing leader's record of when each stage happened to its last `max_batches` batches,
    keyed by end offset, with a cursor per (stage, follower). Made by
    PartitionReplica.trace_produce and dropped when tracing stops; not thread-safe (the
    replica's event loop)."""

    def __init__(self, max_batches: int = 100_000) -> None:
        self._batches: deque[dict[str, Any]] = deque(maxlen=max_batches)
        self._by_end: dict[int, dict[str, Any]] = {}
        self._cursors: dict[tuple[str, int], int] = {}  # (stage, replica) -> end offset marked up to

    def appended(self, received_s: float, end_offset: int) -> None:
        if len(self._batches) == self._batches.maxlen:
            self._by_end.pop(self._batches[0]["end"], None)
        batch = {"end": end_offset, "received": received_s, "appended": time.monotonic(), "sent": {}, "acked": {}}
        self._batches.append(batch)
        self._by_end[end_offset] = batch

    def _mark(self, stage: str, replica: int, up_to_offset: int) -> None:
        """Notes now for every batch ending at or below `up_to_offset` not yet noted."""
        key = (stage, replica)
        if up_to_offset <= self._cursors.get(key, -1):
            return
        self._cursors[key] = up_to_offset
        now = time.monotonic()
        for batch in reversed(self._batches):  # the newest first; stop at the first already noted
            if batch["end"] > up_to_offset:
                continue
            slot = batch if replica < 0 else batch[stage]
            name = stage if replica < 0 else replica
            if name in slot:
                break
            slot[name] = now

    def fetch_answered(self, replica_id: int, records_end_offset: int) -> None:
        self._mark("sent", replica_id, records_end_offset)

    def fetch_arrived(self, replica_id: int, fetch_offset: int) -> None:
        self._mark("acked", replica_id, fetch_offset)

    def high_watermark(self, hw: int) -> None:
        self._mark("hw", -1, hw)

    def answered(self, end_offset: int) -> None:
        batch = self._by_end.get(end_offset)
        if batch is not None and "answered" not in batch:
            batch["answered"] = time.monotonic()

    def batches(self) -> list[dict[str, Any]]:
        return list(self._batches)


def stage_latencies_ms(batches: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per stage, the milliseconds each complete batch spent in it: append, wake and answer
    the first follower's parked fetch, the first follower's round trip (its fetch answered
    to its next fetch arriving: transfer, append, new fetch), the HW after that, and the
    answer; `first follower` is the one whose acknowledgement moved the HW."""
    out: dict[str, list[float]] = {
        "leader append": [],
        "leader: data to the first follower's fetch": [],
        "follower round trip (answer, append, next fetch)": [],
        "HW advance after the follower's fetch": [],
        "produce answered after the HW": [],
        "leader total (received to answered)": [],
    }
    for b in batches:
        if "answered" not in b or "hw" not in b or not b["acked"]:
            continue
        follower = min(b["acked"], key=b["acked"].get)
        if follower not in b["sent"]:
            continue
        sent, acked = b["sent"][follower], b["acked"][follower]
        for name, start, end in (
            ("leader append", b["received"], b["appended"]),
            ("leader: data to the first follower's fetch", b["appended"], sent),
            ("follower round trip (answer, append, next fetch)", sent, acked),
            ("HW advance after the follower's fetch", acked, b["hw"]),
            ("produce answered after the HW", b["hw"], b["answered"]),
            ("leader total (received to answered)", b["received"], b["answered"]),
        ):
            out[name].append(max(0.0, (end - start) * 1000))
    return out
