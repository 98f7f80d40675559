"""The end-to-end latency of acks=all records through the listener at RF=3, with Ray's
workers (rayk's actors) at Ray's default nice 15 and at nice 0 (rayk.ray_settings), in
alternating rounds of one run.

Each round starts a local Ray with `worker_niceness` 15 or 0 (a raylet setting: every
worker it starts gets it), a 3-broker rayk cluster with a PLAINTEXT listener, and a topic
of kafka_protocol_bench's 3 partitions; sends `--records` records at each `--rates` rate
(linger.ms 0, acks=all, a consumer polling in the driver: kafka_protocol_bench's
`latency_at_rate`, so the driver and its clients run at nice 0, as any client does) and
prints the acknowledgement and end-to-end p50 / p99 / max of each. The pairs alternate
15, 0, 15, 0, ... so that the machine's drift meets both alike.

    python benchmarks/niceness_bench.py --pairs 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))
from frozen_heap import frozen_heap  # noqa: E402  (beside this script)
from kafka_protocol_bench import PARTITIONS, latency_at_rate, percentile, settle  # noqa: E402
from results import record  # noqa: E402

import rayk  # noqa: E402


def one_round(niceness: int, rates: list[int], records: int) -> dict[int, dict[str, float]]:
    """{rate: figures} for one Ray whose workers run at `niceness`."""
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             _system_config={"worker_niceness": niceness})  # fmt: skip
    data_dir = tempfile.mkdtemp(prefix="rayk-niceness-")
    try:
        cluster = rayk.start(3, data_dir, config={"listeners": "PLAINTEXT://127.0.0.1:0", "min.insync.replicas": 2},
                             namespace="niceness")  # fmt: skip
        try:
            cluster.create_topic("latency", num_partitions=PARTITIONS, replication_factor=3)
            latency_at_rate(cluster.bootstrap_servers, "latency", 500, 1_000)  # connections, caches, first segments
            out = {}
            for rate in rates:
                settle()
                with frozen_heap():
                    acks, e2e = latency_at_rate(cluster.bootstrap_servers, "latency", records * rate // 1_000, rate,
                                                from_end=True)  # fmt: skip
                out[rate] = {"ack_p50": percentile(acks, 0.5), "ack_p99": percentile(acks, 0.99), "ack_max": max(acks),
                             "e2e_p50": percentile(e2e, 0.5), "e2e_p99": percentile(e2e, 0.99), "e2e_max": max(e2e)}
            return out
        finally:
            cluster.shutdown()
    finally:
        ray.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="rounds at nice 15 and at nice 0, alternating")
    parser.add_argument("--rates", type=int, nargs="+", default=[500, 1_000], help="records/s")
    parser.add_argument("--records", type=int, default=4_000, help="records of a round at 1,000/s (in proportion at others)")
    args = parser.parse_args()
    print(f"acks=all at RF=3 through the listener, {PARTITIONS} partitions, linger.ms 0; {os.cpu_count()} CPUs; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(f"{'round':>5} {'nice':>4} {'rate/s':>7} {'ack p50 ms':>11} {'p99':>6} {'max':>6} "
          f"{'e2e p50 ms':>11} {'p99':>6} {'max':>6}", flush=True)
    runs: dict[int, list[dict[int, dict[str, float]]]] = {15: [], 0: []}
    for pair in range(args.pairs):
        for niceness in (15, 0):
            figures = one_round(niceness, args.rates, args.records)
            runs[niceness].append(figures)
            for rate, f in figures.items():
                print(f"{pair:>5} {niceness:>4} {rate:>7,} {f['ack_p50']:>11.1f} {f['ack_p99']:>6.1f} {f['ack_max']:>6.1f} "
                      f"{f['e2e_p50']:>11.1f} {f['e2e_p99']:>6.1f} {f['e2e_max']:>6.1f}", flush=True)
    print()
    print("median over the rounds, nice 15 / nice 0:")
    summary: dict[str, dict[str, float]] = {}
    for rate in args.rates:
        line = []
        for key in ("e2e_p50", "e2e_p99", "e2e_max"):
            at15 = statistics.median(r[rate][key] for r in runs[15])
            at0 = statistics.median(r[rate][key] for r in runs[0])
            summary.setdefault(f"{key}_ms", {}).update({f"{rate}/s nice 15": at15, f"{rate}/s nice 0": at0})
            line.append(f"{key} {at15:.1f} / {at0:.1f} ms")
        print(f"  {rate:>6,}/s: " + ", ".join(line))
    record("niceness_bench", {"rates": args.rates, "records": args.records, "pairs": args.pairs, **summary})


if __name__ == "__main__":
    main()
