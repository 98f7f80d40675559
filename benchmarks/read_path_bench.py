"""Where a topic read spends its time: `rayk.data.read_topic` taken apart stage by stage,
next to `ray.data.read_parquet` of the same rows, in one run.

Run:  python benchmarks/read_path_bench.py [--mb MB] [--value-bytes N] [--profile DIR]

A local Ray (2 CPUs), `rayk.start(brokers=3)`, a topic of 6 partitions, RF=3, filled with
`--mb` MB (default 512) of rows with an 8-byte key and a `--value-bytes` (default 1000)
value; the same rows as one Parquet file per partition (so both reads make the same
number of blocks). Stages, each timed alone, the better of two runs:

1. fetch: the leaders' `fetch` calls of a whole read (8 MiB each, as read tasks make
   them) from this process, one partition after the other, bytes discarded: the actor
   call, the leader's read of its log, and the bytes crossing the object store;
2. decode: `records_table` (compiled, into Arrow) over the fetched answers, in memory;
3. read_range: both, as one read task does them, in this process;
4. `rayk.data.read_topic(topic).materialize()`: the read tasks in Ray, 64 MiB each;
5. `pyarrow.parquet.read_table` of the files, in this process, and
   `ray.data.read_parquet(dir).materialize()`.

With `--profile DIR`, py-spy's collapsed stacks (`--format raw`, for flamegraph.pl or
speedscope) of a leader replica during stage 1 and of this process during stage 2 are
written to DIR (py-spy is installed with the test extras).
Nothing asserts anything about speed: the script prints figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import ray  # noqa: E402

import rayk  # noqa: E402
from rayk import data as rayk_data  # noqa: E402
from rayk.client.arrow_batches import records_table  # noqa: E402
from rayk.client.offset_ranges import plan_read_ranges  # noqa: E402
from rayk.storage.records import end_offset_of  # noqa: E402

PARTITIONS = 6
KEY_BYTES = 8


def fill(cluster: Any, topic: str, megabytes: int, value_bytes: int, parquet_dir: Path) -> int:
    rows_per_partition = megabytes * 1_000_000 // (value_bytes + KEY_BYTES) // PARTITIONS
    chunk = 20_000
    with cluster.producer() as producer:
        for p in range(PARTITIONS):
            tables = []
            for start in range(0, rows_per_partition, chunk):
                n = min(chunk, rows_per_partition - start)
                offsets = pa.array(range(0, (n + 1) * value_bytes, value_bytes), pa.int32()).buffers()[1]
                values = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(os.urandom(n * value_bytes))])
                table = pa.table({"key": pa.array([b"%08d" % (start + i) for i in range(n)], pa.binary()), "value": values})
                producer.send_batch(topic, table.column("value"), keys=table.column("key"), partition=p)
                tables.append(table)
            pq.write_table(pa.concat_tables(tables), parquet_dir / f"part-{p}.parquet")
        producer.flush()
    return rows_per_partition * PARTITIONS


def fetch_all(cluster: Any, topic: str, ranges: list) -> list[tuple[Any, bytes]]:
    answers = []
    for r in ranges:
        leader, offset = cluster.leader(topic, r.partition), r.start
        while offset < r.end:
            records = ray.get(leader.fetch.remote(offset, rayk_data.FETCH_MAX_BYTES, 1, 0)).records
            answers.append((r, offset, records))
            offset = min(end_offset_of(records), r.end)
    return answers


def profiled(pid: int, out: Path | None, what: str) -> subprocess.Popen | None:
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", "200", "--nonblocking",
         "--format", "raw", "--output", str(out / f"{what}.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop(profiler: subprocess.Popen | None) -> None:
    if profiler is not None:
        profiler.send_signal(2)  # SIGINT: py-spy writes the flame graph and exits
        profiler.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--profile", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rayk-read-bench-"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    cluster = rayk.start(brokers=3, data_dir=work / "brokers")
    try:
        cluster.create_topic("rows", num_partitions=PARTITIONS, replication_factor=3)
        parquet_dir = work / "parquet"
        parquet_dir.mkdir()
        rows = fill(cluster, "rows", args.mb, args.value_bytes, parquet_dir)
        megabytes = rows * (args.value_bytes + KEY_BYTES) / 1e6
        ranges = plan_read_ranges(cluster, "rows", "earliest", "latest", None, rayk_data.RECORDS_PER_TASK, rayk_data.BYTES_PER_TASK)
        print(f"{rows:,} rows, {megabytes:,.0f} MB of key + value, {PARTITIONS} partitions, RF=3; load {os.getloadavg()[0]:.1f}")
        figures = []

        def stage(name: str, fn: Any) -> Any:
            """The better of two runs: the first pays for memory this VM has not touched
            yet (~3 us a 4 KiB page on a Firecracker guest) and for starting Ray workers."""
            times = []
            for _ in range(2):
                start = time.perf_counter()
                result = fn()
                times.append(time.perf_counter() - start)
            seconds = min(times)
            figures.append((name, seconds))
            print(f"  {name}: {seconds:.2f} s, {megabytes / seconds:,.0f} MB/s (first run {times[0]:.2f} s)", flush=True)
            return result

        leader_pid = ray.get(cluster.leader("rows", 0).__ray_call__.remote(lambda self: os.getpid()))
        profiler = profiled(leader_pid, args.profile, "leader-fetch")
        answers = stage("1. fetch (leader calls, this process)", lambda: fetch_all(cluster, "rows", ranges))
        stop(profiler)
        profiler = profiled(os.getpid(), args.profile, "decode")
        stage("2. decode (records_table)", lambda: [records_table(b, r.topic, r.partition, o, r.end) for r, o, b in answers])
        stop(profiler)
        answers = None  # freed before the next stage
        stage("3. read_range (1 + 2, this process)", lambda: [rayk_data.read_range(cluster, r) for r in ranges])
        stage("4. rayk.data.read_topic().materialize()", lambda: rayk_data.read_topic("rows", cluster=cluster).materialize())
        stage("5a. pyarrow.parquet.read_table (this process)", lambda: [pq.read_table(f) for f in sorted(parquet_dir.iterdir())])
        stage("5b. ray.data.read_parquet().materialize()", lambda: ray.data.read_parquet(str(parquet_dir)).materialize())
        by_name = dict(figures)
        ratio = by_name["5b. ray.data.read_parquet().materialize()"] / by_name["4. rayk.data.read_topic().materialize()"]
        print(f"rayk.data.read_topic = {ratio:.2f}x ray.data.read_parquet")
    finally:
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
