"""Tiered storage's costs and its reads, side by side in one run.

Run:  python benchmarks/tiered_storage_bench.py [--mb MB] [--value-bytes N] [--rounds N]

A local Ray (2 CPUs), `rayk.start(brokers=3)` with a file:// store in a temporary
directory, topics of 1 partition, RF=3, 16 MiB segments:
1. produce, tiering on against off: `--rounds` alternating rounds (ABAB, the machine is
   noisy) of `send_batch` of 64 MiB to a tiered topic (local.retention.bytes 32 MiB: it
   copies and deletes while it takes records) and to one that is not; records/s and the
   ratio (the issue's target: >= 0.9x);
2. a history of `--mb` MB (default 1024) in the tiered topic, copied to the store and
   deleted locally but for the local retention, read three ways, the better of two runs
   each: `rayk.data.read_topic(topic).materialize()` reading the remote segments straight
   from the store (one task per segment); the same rows as Parquet files in the same
   store, `ray.data.read_parquet(...).materialize()` (target: rayk >= 0.5x);
   `read_topic(topic, from_store=False)`, every record through the leaders as before; and,
   for scale, `pyarrow.parquet.read_table` of the files in this process, without Ray.
Nothing asserts anything about speed: the script prints figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

SEGMENT_BYTES = 16 << 20
CHUNK_ROWS = 20_000


def value_table(n: int, value_bytes: int, start: int) -> Any:
    import pyarrow as pa

    offsets = pa.array(range(0, (n + 1) * value_bytes, value_bytes), pa.int32()).buffers()[1]
    values = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(os.urandom(n * value_bytes))])
    return pa.table({"key": pa.array([b"%010d" % (start + i) for i in range(n)], pa.binary()), "value": values})


def produce(cluster: Any, topic: str, megabytes: int, value_bytes: int, parquet_dir: Path | None = None) -> tuple[int, float]:
    """(records, seconds) of `megabytes` of rows sent with send_batch, acks=all."""
    import pyarrow.parquet as pq

    rows = megabytes * 1_000_000 // (value_bytes + 10)
    started = time.perf_counter()
    with cluster.producer(acks="all") as producer:
        for i, start in enumerate(range(0, rows, CHUNK_ROWS)):
            table = value_table(min(CHUNK_ROWS, rows - start), value_bytes, start)
            producer.send_batch(topic, table.column("value"), keys=table.column("key"), partition=0)
            if parquet_dir is not None:
                pq.write_table(table, parquet_dir / f"part-{i:05d}.parquet")
        producer.flush()
    return rows, time.perf_counter() - started


def best_of_two(fn: Any) -> float:
    times = []
    for _ in range(2):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="history read in part 2 (default 1024)")
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4, help="produce rounds per topic in part 1")
    args = parser.parse_args()

    import ray

    import rayk
    import rayk.data

    work = Path(tempfile.mkdtemp(prefix="tiered-bench-"))
    store = work / "store"
    store.mkdir()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = {"remote.log.storage.system.enable": True, "remote.log.storage.uri": f"file://{store}",
              "remote.log.manager.task.interval.ms": 1000, "listeners": "PLAINTEXT://127.0.0.1:0"}  # fmt: skip
    cluster = rayk.start(brokers=3, data_dir=work / "brokers", config=config)
    try:
        base = {"segment.bytes": str(SEGMENT_BYTES), "retention.ms": "-1"}
        tiered = {**base, "remote.storage.enable": "true", "local.retention.bytes": str(2 * SEGMENT_BYTES)}
        cluster.create_topic("plain", num_partitions=1, replication_factor=3, config=base)
        cluster.create_topic("tiered", num_partitions=1, replication_factor=3, config=tiered)
        print(f"1. produce, 64 MB rounds of {args.value_bytes}-byte values, acks=all, RF=3 (ABAB, {args.rounds} each)")
        rates: dict[str, list[float]] = {"plain": [], "tiered": []}
        for _ in range(args.rounds):
            for topic in ("plain", "tiered"):
                rows, seconds = produce(cluster, topic, 64, args.value_bytes)
                rates[topic].append(rows / seconds)
        on, off = max(rates["tiered"]), max(rates["plain"])
        print(f"   tiering off {off:>12,.0f} rec/s   on {on:>12,.0f} rec/s   on/off {on / off:.2f}x")

        print(f"2. a history of {args.mb} MB, read back as a Ray Dataset (the better of two runs)")
        cluster.create_topic("history", num_partitions=1, replication_factor=3, config=tiered)
        parquet_dir = store / "parquet"
        parquet_dir.mkdir()
        rows, _ = produce(cluster, "history", args.mb, args.value_bytes, parquet_dir)
        leader = cluster.leader("history", 0)
        while True:  # everything rolled is copied, and the local log is down to its retention
            segments = ray.get(leader.remote_segments.remote())
            start, end, size = ray.get(leader.log_size.remote())
            if segments and size <= 4 * SEGMENT_BYTES:
                break
            time.sleep(1)
        remote_rows = segments[-1]["end_offset"]
        print(f"   {rows:,} rows, {remote_rows:,} of them only in the store ({len(segments)} segments)")
        ending = {"history": {"0": remote_rows}}
        store_s = best_of_two(lambda: rayk.data.read_topic("history", ending_offsets=ending, cluster=cluster).materialize())
        files = sorted(str(p) for p in parquet_dir.iterdir())
        parquet_s = best_of_two(lambda: ray.data.read_parquet(files).materialize())
        import pyarrow.parquet as pq

        pyarrow_s = best_of_two(lambda: pq.read_table(files))  # no Ray: what the files cost to decode
        brokers_s = best_of_two(lambda: rayk.data.read_topic("history", ending_offsets=ending, cluster=cluster,
                                                            from_store=False).materialize())  # fmt: skip
        mb = args.mb * remote_rows / rows
        for name, seconds in (("read_topic, from the store", store_s), ("read_parquet, same rows", parquet_s),
                              ("read_topic, through the brokers", brokers_s),
                              ("pyarrow read_table, in this process", pyarrow_s)):  # fmt: skip
            print(f"   {name:<34} {seconds:>7.2f} s  {mb / seconds:>8.1f} MB/s")
        print(f"   from the store / Parquet {parquet_s / store_s:.2f}x   from the store / through the brokers "
              f"{brokers_s / store_s:.2f}x")
    finally:
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
