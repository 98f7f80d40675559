"""Where an acks=all produce's time goes: the stages of its round trip on a 3-broker
cluster (RF=3, min.insync.replicas=2), p50 and p99 per stage.

Run:  python benchmarks/ack_path_bench.py [--calls N] [--rate R] [--seconds S]

A local Ray instance and `rayk.start(brokers=3)` in a temporary directory, shut down at
the end. The leader of a 1-partition topic traces its batches (PartitionReplica.
trace_produce, see rayk/replication/produce_trace.py): when each produce call started, when
the batch was in its log, when the first follower's fetch was answered with it, when that
follower's next fetch arrived (it had appended the batch), when the high watermark passed
it and when the call returned. All on the host's monotonic clock, so the driver's own
submit and result times sit beside them.

1. One at a time: `--calls` (default 300) produce calls of a one-record batch straight to
   the leader actor, each after the previous answered: the bare round trip, with the
   driver-to-leader and leader-to-driver transit as stages of their own.
2. A Producer at a steady rate: `send()` at `--rate` records/s (default 3,000) for
   `--seconds` (default 5), the Producer's defaults otherwise (linger 5 ms): the same
   leader stages under load, and the Producer's send-to-acknowledged latency.

It prints figures and asserts nothing about them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import ray  # noqa: E402

import rayk  # noqa: E402
from rayk.replication.produce_trace import stage_latencies_ms  # noqa: E402
from rayk.client.metadata import MetadataCache  # noqa: E402
from rayk.perf import run_produce_perf  # noqa: E402
from rayk.storage.records import SimpleRecord, build_batch  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def show(title: str, stages: dict[str, list[float]]) -> None:
    print(f"\n{title}")
    print(f"  {'stage':<52} {'batches':>7} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, values in stages.items():
        mean = sum(values) / len(values) if values else float("nan")
        print(f"  {name:<52} {len(values):>7} {percentile(values, 0.5):>8.2f} {percentile(values, 0.99):>8.2f} {mean:>8.2f}")


def one_at_a_time(leader, calls: int) -> dict[str, list[float]]:
    client: dict[int, tuple[float, float]] = {}
    ray.get(leader.trace_produce.remote(True))
    for _ in range(calls):
        batch = build_batch([SimpleRecord(os.urandom(100))])
        submitted = time.monotonic()
        result = ray.get(leader.produce.remote(batch, -1, 30_000))
        client[result.base_offset + 1] = (submitted, time.monotonic())
        if result.error is not None:
            raise SystemExit(f"produce failed: {result.error}")
    traced = ray.get(leader.trace_produce.remote(False))
    stages = {"driver -> leader (call transit)": []}
    stages.update(stage_latencies_ms(traced))
    stages["leader -> driver (answer transit)"] = []
    stages["driver total (submit to result)"] = []
    for b in traced:
        if b["end"] in client and "answered" in b:
            submitted, seen = client[b["end"]]
            stages["driver -> leader (call transit)"].append((b["received"] - submitted) * 1000)
            stages["leader -> driver (answer transit)"].append((seen - b["answered"]) * 1000)
            stages["driver total (submit to result)"].append((seen - submitted) * 1000)
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rate", type=float, default=3_000)
    parser.add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()
    data_dir = tempfile.mkdtemp(prefix="rayk-ack-bench-")
    namespace = f"rayk-ack-{uuid.uuid4().hex[:8]}"
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, namespace=namespace,
             log_to_driver=False)
    cluster = rayk.start(brokers=3, data_dir=Path(data_dir) / "cluster", namespace=namespace)
    try:
        print(f"acks=all round trip, 3 brokers, RF=3, min.insync.replicas=2; {os.cpu_count()} CPUs; "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
        cluster.create_topic("ack-path", 1, 3, {"min.insync.replicas": "2"})
        leader = MetadataCache(cluster.controller, 30_000, 100).leader("ack-path", 0)
        for _ in range(20):  # warm-up: connections, the followers' fetch loops
            ray.get(leader.produce.remote(build_batch([SimpleRecord(b"warm")]), -1, 30_000))
        show(f"1. one call at a time ({args.calls} one-record batches)", one_at_a_time(leader, args.calls))
        ray.get(leader.trace_produce.remote(True))
        figures = run_produce_perf(
            cluster, "ack-path", int(args.rate * args.seconds), 100, throughput=args.rate, progress=False
        )
        stages = stage_latencies_ms(ray.get(leader.trace_produce.remote(False)))
        show(f"2. Producer.send() at {args.rate:,.0f} rec/s for {args.seconds:g} s (leader stages per batch)", stages)
        print(f"  Producer send() to acknowledged, per record: p50 {figures['latency_p50_ms']:.2f} ms, "
              f"p99 {figures['latency_p99_ms']:.2f} ms ({figures['records']:,} records, {figures['errors']} failed)")
    finally:
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
