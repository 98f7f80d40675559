"""Decode benchmark: fetched record batches into Arrow, the read path of rayk.data and
rayk.spark, three ways over the same bytes in one run.

Run:  python benchmarks/decode_bench.py [--records N] [--value-bytes B] [--reps R]

The bytes: `--records` (default 200,000) records with an 8-byte key and a `--value-bytes`
(default 100) value, in batches of ~1 MiB, as a leader's fetch answer holds them. Each
way produces the same pyarrow Table with the columns of Spark's Kafka source (checked):
- compiled columns: `rayk.client.arrow_batches.records_table`, which decodes each batch
  with `_records.decode_columns` straight into Arrow buffers (what rayk.data uses now);
- compiled tuples: `decode_record_tuples` (the consumer's decoder, a tuple per record),
  then Python lists per column and `pa.table` (the shape of rayk.data's read before);
- Python reference: `decode_records_reference`, then the same lists.
It prints records/s and MB/s (10^6 bytes of key + value) of the best of `--reps` runs,
and each way's ratio to the compiled columns. It asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import pyarrow as pa  # noqa: E402

from rayk.client.arrow_batches import SCHEMA, records_table  # noqa: E402
from rayk.storage.records import (  # noqa: E402
    HEADER_SIZE_BYTES,
    SimpleRecord,
    build_batch,
    decode_record_tuples,
    decode_records_reference,
    iter_batches,
)

TOPIC, PARTITION = "bench", 0
BATCH_BYTES = 1 << 20


def fetched_bytes(records: int, value_bytes: int) -> bytes:
    per_batch = max(1, BATCH_BYTES // (value_bytes + 8 + 20))
    value = os.urandom(value_bytes)
    out, offset = [], 0
    while offset < records:
        count = min(per_batch, records - offset)
        batch = [SimpleRecord(value, key=b"%08d" % (offset + i), timestamp_ms=1_700_000_000_000 + i) for i in range(count)]
        out.append(build_batch(batch, base_offset=offset))
        offset += count
    return b"".join(out)


def tuples_to_table(decode: Callable, data: bytes) -> pa.Table:
    columns: dict[str, list] = {name: [] for name in SCHEMA.names}
    for batch in iter_batches(data):
        header = batch.header
        kind = int(header.timestamp_type)
        if decode is decode_record_tuples:
            decoded = decode(batch.data)[1]
        else:
            body = batch.data[HEADER_SIZE_BYTES:]
            decoded = decode(body, header.record_count, header.base_offset, header.base_timestamp, -1)
        for offset, timestamp, key, value, headers in decoded:
            columns["key"].append(key)
            columns["value"].append(value)
            columns["topic"].append(TOPIC)
            columns["partition"].append(PARTITION)
            columns["offset"].append(offset)
            columns["timestamp"].append(timestamp)
            columns["timestampType"].append(kind)
            columns["headers"].append([{"key": k, "value": v} for k, v in headers])
    return pa.table(columns, schema=SCHEMA)


def best_of(reps: int, run: Callable[[], pa.Table]) -> tuple[float, pa.Table]:
    best, table = float("inf"), None
    for _ in range(reps):
        gc.collect()
        start = time.perf_counter()
        table = run()
        best = min(best, time.perf_counter() - start)
    return best, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    data = fetched_bytes(args.records, args.value_bytes)
    payload_mb = args.records * (args.value_bytes + 8) / 1e6
    print(f"{args.records:,} records of {args.value_bytes} B values and 8 B keys, {len(data) / 2**20:.1f} MiB of "
          f"batches; best of {args.reps}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    ways = [
        ("compiled columns -> Arrow (records_table)", lambda: records_table(data, TOPIC, PARTITION, 0, args.records)),
        ("compiled tuples -> lists -> pa.table", lambda: tuples_to_table(decode_record_tuples, data)),
        ("Python reference -> lists -> pa.table", lambda: tuples_to_table(decode_records_reference, data)),
    ]
    baseline_s, expected = best_of(args.reps, ways[0][1])
    print(f"{'way':<45} {'records/s':>12} {'MB/s':>8} {'x columns':>9}")
    for name, run in ways:
        seconds, table = (baseline_s, expected) if run is ways[0][1] else best_of(args.reps, run)
        assert table.equals(expected), f"{name} decoded other records"
        print(f"{name:<45} {args.records / seconds:>12,.0f} {payload_mb / seconds:>8.1f} {baseline_s / seconds:>9.2f}")


if __name__ == "__main__":
    main()
