"""Which producer defaults suit Ray: `batch_size` and `linger_ms` swept on one cluster, with
the throughput of `send()` flat out and its acknowledgement latency at a steady rate.

Run:  python benchmarks/producer_settings_bench.py [--records N] [--rate R] [--seconds S]
      [--batch-sizes 16384,1048576] [--lingers-ms 5]

A local Ray instance and `rayk.start(brokers=3)` in a temporary directory, shut down at
the end; every configuration gets a fresh topic of 3 partitions, RF=3,
min.insync.replicas=2, acks=all, records of 100 random bytes, no key. For each
`batch_size` x `linger_ms`:
- flat out: `--records` (default 200,000) records through `send()` as fast as it takes
  them (rayk.perf.run_produce_perf), records/s;
- steady: `send()` throttled to `--rate` records/s (default 5,000) for `--seconds`
  (default 4), after one warm-up record per partition, the acknowledgement latency
  p50/p99 (from `send()` to the future) and how busy the machine's CPUs were.
A value repeated in `--lingers-ms` (5,10,5,10) alternates the settings in one run, which
is how to compare two on a noisy machine. First it measures what one Ray actor call costs
in CPU on this machine (a driver calling a no-op async actor method 400 times a second):
batches travel over the data plane, not in such calls, so this is only the machine's
yardstick. Kafka's defaults are 16 KiB and 5 ms; the figures chose rayk's (see
DEFAULT_BATCH_SIZE in rayk/client/producer.py). Small batches queued behind a
partition's requests in flight are merged into requests of up to `max_request_size`
(rayk/client/accumulator.py), so 16 KiB against 1 MiB flat out shows what that merging
recovers. It prints figures and asserts nothing about them.
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
from rayk.perf import run_produce_perf  # noqa: E402

BATCH_SIZES = (16_384, 262_144, 1_048_576)
LINGERS_MS = (0, 5, 10, 20)


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # idle and iowait are not busy


def _busy_share(before: tuple[int, int]) -> float:
    after = _cpu_ticks()
    return (after[0] - before[0]) / max(1, after[1] - before[1])


@ray.remote(num_cpus=0)
class _Echo:
    async def echo(self, value: bytes) -> int:
        return len(value)


def ray_call_cpu_ms(calls_per_s: int = 400, seconds: float = 3) -> float:
    """CPU milliseconds (all processes, idle included) per driver -> async actor call."""
    echo = _Echo.remote()
    ray.get(echo.echo.remote(b""))
    count = int(calls_per_s * seconds)
    before, start = _cpu_ticks(), time.perf_counter()
    for i in range(count):
        ahead_s = start + i / calls_per_s - time.perf_counter()
        if ahead_s > 0:
            time.sleep(ahead_s)
        ray.get(echo.echo.remote(b"x" * 100))
    cpu_s = _busy_share(before) * (os.cpu_count() or 1) * (time.perf_counter() - start)
    ray.kill(echo)
    return cpu_s / count * 1000


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=5_000)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--batch-sizes", type=_ints, default=BATCH_SIZES, help="comma-separated bytes")
    parser.add_argument("--lingers-ms", type=_ints, default=LINGERS_MS, help="comma-separated ms")
    args = parser.parse_args()
    data_dir = tempfile.mkdtemp(prefix="rayk-settings-bench-")
    namespace = f"rayk-settings-{uuid.uuid4().hex[:8]}"
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, namespace=namespace,
             log_to_driver=False)
    cluster = rayk.start(brokers=3, data_dir=Path(data_dir) / "cluster", namespace=namespace)
    print(f"send() of 100 B records, acks=all, 3 partitions, RF=3; flat out {args.records:,} records; "
          f"steady {args.rate:,.0f} rec/s for {args.seconds:g} s; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    print(f"one Ray actor call (driver -> async actor, 400/s): {ray_call_cpu_ms():.2f} ms of CPU")
    print(f"{'batch_size':>10} {'linger_ms':>9} | {'flat out rec/s':>14} | {'steady p50 ms':>13} {'p99 ms':>8} "
          f"{'CPU busy':>8}")
    try:
        for batch_size in args.batch_sizes:
            for case, linger_ms in enumerate(args.lingers_ms):
                settings = dict(batch_size=batch_size, linger_ms=linger_ms, progress=False)
                flat_topic, steady_topic = (f"{kind}-{batch_size}-{linger_ms}-{case}" for kind in ("flat", "steady"))
                for topic in (flat_topic, steady_topic):
                    cluster.create_topic(topic, 3, 3, {"min.insync.replicas": "2"})
                before = _cpu_ticks()
                steady = run_produce_perf(
                    cluster, steady_topic, int(args.rate * args.seconds), 100, throughput=args.rate, warm_up=True,
                    **settings,
                )
                busy = _busy_share(before)
                flat = run_produce_perf(cluster, flat_topic, args.records, 100, **settings)  # after: it leaves work behind
                failed = flat["errors"] + steady["errors"]
                print(f"{batch_size:>10,} {linger_ms:>9} | {flat['records_per_s']:>14,.0f} | "
                      f"{steady['latency_p50_ms']:>13.1f} {steady['latency_p99_ms']:>8.1f} {busy:>8.0%}"
                      + (f"   {failed} FAILED" if failed else ""), flush=True)  # fmt: skip
                for topic in (flat_topic, steady_topic):
                    cluster.delete_topic(topic)
    finally:
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
