"""`make demo`: rayk's storage engine at work on a real directory.

Writes 200,000 records into a partition log with small segments, reads them all back and
checks them, looks records up by offset and by timestamp, tears the tail of the active
segment as a power cut would, and shows recovery cutting back to the last whole batch.
Later issues grow this into the full cluster demo (brokers, replication, consumers).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rayk.storage import Log, LogConfig
from rayk.storage.records import SimpleRecord, build_batch, iter_batches

RECORD_BYTES = 100
RECORDS_PER_BATCH = 500


def _batches(total_records: int, start_ms: int) -> list[bytes]:
    batches = []
    for first in range(0, total_records, RECORDS_PER_BATCH):
        records = [
            SimpleRecord(
                value=f"record-{n:08d}".encode().ljust(RECORD_BYTES, b"."),
                key=f"user-{n % 97}".encode(),
                timestamp_ms=start_ms + n,
            )
            for n in range(first, min(first + RECORDS_PER_BATCH, total_records))
        ]
        batches.append(build_batch(records, compression="gzip" if first % 2000 == 0 else "none"))
    return batches


def run(data_dir: Path, total_records: int) -> None:
    log_dir = data_dir / "clicks-0"
    config = LogConfig(segment_bytes=4 * 1024 * 1024)
    start_ms = int(time.time() * 1000) - total_records
    print(f"rayk storage demo: partition log in {log_dir}")

    batches = _batches(total_records, start_ms)
    log = Log(log_dir, config)
    t0 = time.perf_counter()
    for data in batches:
        log.append_as_leader(data, leader_epoch=0)
    append_s = time.perf_counter() - t0
    log.high_watermark = log.log_end_offset
    size_mb = log.size_bytes / 1e6
    print(
        f"  appended {total_records:,} records ({len(batches)} batches, {size_mb:.1f} MB) in {append_s:.2f} s"
        f" -> {size_mb / append_s:.0f} MB/s; LEO {log.log_end_offset:,}, {len(log.segment_base_offsets)} segments"
    )
    for path in sorted(log_dir.iterdir())[:6]:
        print(f"    {path.name:<36} {path.stat().st_size:>10,} bytes")
    print("    ...")

    t0 = time.perf_counter()
    offset, seen = 0, 0
    while offset < log.high_watermark:
        result = log.read(offset, 1 << 20, max_offset=log.high_watermark)
        for batch in iter_batches(result.records):
            for record in batch.records():
                assert record.offset == seen and record.value.startswith(f"record-{seen:08d}".encode())
                seen += 1
        offset = result.next_offset
    print(f"  read back and checked {seen:,} records in {time.perf_counter() - t0:.2f} s")

    probe = total_records * 3 // 4
    first = next(iter_batches(log.read(probe, 1).records)).header
    print(f"  offset {probe:,} -> batch [{first.base_offset:,}..{first.last_offset:,}] via the sparse .index")
    found = log.offset_for_timestamp(start_ms + probe)
    print(f"  timestamp {start_ms + probe} -> offset {found.offset:,} via the .timeindex")

    leo_before = log.log_end_offset
    active = log_dir / f"{log.segment_base_offsets[-1]:020d}.log"
    log.close()
    with open(active, "r+b") as f:  # a power cut tears the last write
        f.truncate(active.stat().st_size - 123)
    recovered = Log(log_dir, config)
    print(
        f"  tore 123 bytes off {active.name}; recovery cut {recovered.truncated_on_recovery_bytes:,} bytes,"
        f" LEO {leo_before:,} -> {recovered.log_end_offset:,} (the torn batch is gone, all before it kept)"
    )
    recovered.close()
    print("done.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the log here (default: a temp dir)")
    args = parser.parse_args()
    if args.data_dir is not None:
        run(args.data_dir, args.records)
        return
    with tempfile.TemporaryDirectory(prefix="rayk-demo-") as tmp:
        run(Path(tmp), args.records)


if __name__ == "__main__":
    main()
