"""`frozen_heap`: how the benchmarks time a client running in their own process.

The clients a benchmark times run in its process, which also holds Ray's objects and
those of the rayk clusters it started (88,000 tracked objects after ray.init, 121,000 once
a rayk cluster has come and gone). A full collection walks all of them: reading 300,000
records, a confluent-kafka consumer's 3 full collections took 0.08 CPU-s with the first
heap and 0.12-0.15 with the second, of a read that lasts 0.22-0.25 s (Tansu's consume read
1.17-1.43 M records/s so, and 2.0-2.5 M frozen). So each broker's figure depended on what
the process had held before its turn, and the brokers measured later paid more. Frozen,
that costs every client ~nothing; the phase's own objects are collected as usual. A
program of its own does the same with one `gc.freeze()` once it has imported and
connected (README: "What a callback costs").
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Keeps Python's collector off the objects this process holds before a timed phase."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
