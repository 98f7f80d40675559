"""What a fetch's read of the log costs near its end, where followers and caught-up consumers
read, against a read further back: `Log.read` of one-record batches of 100 B.

The active segment keeps the locations of its newest batches (LogSegment.RECENT_BATCHES),
so a read near the end finds its batch by a bisection; a read further back scans the batch
headers from the last index entry before it (~25 headers at the default
index.interval.bytes of 4,096 and batches of ~170 B), as every read did before. Both are
timed here in one run, with the time to decode one batch header. Run it on an older
commit (PYTHONPATH) for the figures before the kept locations.

    .venv/bin/python benchmarks/tail_read_bench.py [--batches N] [--reads N]

In a temporary directory, removed at the end. No Ray. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from rayk.storage import Log, segment
from rayk.storage.records import BatchHeader, SimpleRecord, build_batch

RECENT_BATCHES = getattr(segment, "RECENT_BATCHES", 256)  # (run on a commit before it, every read scans)
READ_BYTES = 1024  # ~6 batches: what each read returns, near the end or further back


def per_read_us(log: Log, offsets: list[int], repeats: int = 5) -> float:
    """The median over `repeats` of the mean time of one Log.read at `offsets`."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for offset in offsets:
            log.read(offset, READ_BYTES)
        times.append((time.perf_counter_ns() - start) / len(offsets) / 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--reads", type=int, default=2_000)
    args = parser.parse_args()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="rayk-tail-read-") as tmp:
        log = Log(Path(tmp) / "t-0")
        for _ in range(args.batches):
            log.append_as_leader(build_batch([SimpleRecord(rng.randbytes(100))]), leader_epoch=0)
        end = log.log_end_offset
        log.high_watermark = end
        near_end = [end - 1 - rng.randrange(25) for _ in range(args.reads)]  # a fetch a few records behind
        further_back = [end - 1 - RECENT_BATCHES * 2 - rng.randrange(1_000) for _ in range(args.reads)]
        print(f"{args.batches:,} one-record batches of 100 B in one segment; each read returns {READ_BYTES:,} B at most")
        print(f"Log.read within 25 records of the end:  {per_read_us(log, near_end):7.1f} µs")
        print(f"Log.read 500-1,500 records back (scan): {per_read_us(log, further_back):7.1f} µs")
        header = build_batch([SimpleRecord(b"x" * 100)])
        start = time.perf_counter_ns()
        for _ in range(100_000):
            BatchHeader.parse(header)
        print(f"BatchHeader.parse:                      {(time.perf_counter_ns() - start) / 100_000 / 1000:7.2f} µs")
        log.close()


if __name__ == "__main__":
    main()
