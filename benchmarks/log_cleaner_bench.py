"""Log cleaner benchmark: how fast one clean compacts a log, against reading it.

Run:  python benchmarks/log_cleaner_bench.py [--records N] [--keys K]

A compacted log of N records (100-byte values, keys drawn from K, batches of 100 records,
uncompressed and gzip), 16 MiB segments, HW at the LEO, one empty active segment. Timed:
one `log_cleaner.clean` from nothing cleaned (the offset map over every segment, then
every segment copied without superseded records and swapped in). Baseline, in the same
run: reading the same log front to back with `Log.read` and decoding every record with
the compiled decoder, which is the least a clean must do (it reads everything twice).
Printed: records/s and MB/s of each and the ratio. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from rayk.storage import Log, LogConfig
from rayk.storage.log_cleaner import clean
from rayk.storage.records import SimpleRecord, build_batch, decode_record_tuples, iter_batches

NOW_MS = 1_700_000_000_000


def make_log(path: Path, records: int, keys: int, compression: str | None) -> Log:
    log = Log(path, LogConfig(segment_bytes=16 << 20, cleanup_policy="compact"))
    rng = random.Random(7)
    value = bytes(100)
    for start in range(0, records, 100):
        batch = [SimpleRecord(value, b"key-%d" % rng.randrange(keys), (), NOW_MS) for _ in range(100)]
        log.append_as_leader(build_batch(batch, compression=compression), 0)
    log.roll()
    log.high_watermark = log.log_end_offset
    return log


def read_all(log: Log) -> int:
    count, offset = 0, log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        for batch in iter_batches(result.records):
            count += len(decode_record_tuples(batch.data)[1])
        offset = result.next_offset
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=10_000)
    args = parser.parse_args()
    print(f"{args.records:,} records of 100 B over {args.keys:,} keys, batches of 100\n")
    print(f"{'codec':<6} {'read+decode rec/s':>18} {'clean rec/s':>12} {'clean MB/s':>11} {'ratio':>6} {'kept':>8}")
    for compression in (None, "gzip"):
        root = Path(tempfile.mkdtemp(prefix="rayk-cleaner-bench-"))
        try:
            log = make_log(root / "p-0", args.records, args.keys, compression)
            size = log.size_bytes
            started = time.perf_counter()
            read_all(log)
            read_s = time.perf_counter() - started
            started = time.perf_counter()
            result = clean(log, NOW_MS)
            clean_s = time.perf_counter() - started
            kept = read_all(log)
            print(
                f"{compression or 'none':<6} {args.records / read_s:>18,.0f} {args.records / clean_s:>12,.0f} "
                f"{size / clean_s / 1e6:>11.1f} {read_s / clean_s:>6.2f} {kept:>8,}"
            )
            assert result is not None and result.completed
            log.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
