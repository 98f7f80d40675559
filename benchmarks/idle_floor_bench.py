"""What an idle rayk cluster costs the machine it runs on, and what that costs a client.

Three parts, each printed as a table:
1. **Periodic Ray calls.** 20 idle async actors, each called twice a second by the
   driver, with Ray's task events on (Ray's default) and off (`enable_task_events=False`,
   as rayk's own actors run: rayk/actors/__init__.py), alternating: CPU per call of the
   actors, the GCS, the raylet and the driver, from /proc.
2. **The idle floor.** The cluster of kafka_protocol_bench (3 brokers; the warm-up, the
   throughput and the latency topic, 3 partitions RF=3 each, and `__consumer_offsets`)
   with nothing to do, next to 4 bare async Ray actors: per process class its share of a
   core and its wake-ups per second (context switches of all its threads, /proc), so
   rayk's own periodic work reads against Ray's floor per worker process.
3. **The neighbour.** Tansu (in memory, one node) read by kafka_protocol_bench's consumer
   with Ray started (as that bench runs it, the process's heap frozen), then with the idle
   rayk cluster of part 2 on the same machine, then after that cluster's shutdown: what
   the other processes of a small machine, waking up, cost a broker's consume figure.

    .venv/bin/python benchmarks/idle_floor_bench.py [--window-s S] [--records N] [--skip-tansu]

A local Ray instance, shut down at the end. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import time

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_protocol_bench as kpb  # noqa: E402
from latency_cpu_bench import machine_busy_s, process_cpu_s, processes  # noqa: E402

import rayk  # noqa: E402
from rayk.ray_settings import RAY_SYSTEM_CONFIG  # noqa: E402
from scratch import scratch_dir  # noqa: E402  (beside this script)

BARE_ACTORS = 4
CALLED_ACTORS = 20
CALLS_PER_S_PER_ACTOR = 2
BENCH_TOPICS = ("warm", "throughput", "latency")


@ray.remote(num_cpus=0)
class Bare:
    async def pid(self) -> int:
        return os.getpid()

    async def ping(self) -> None:
        return None

    @ray.method(enable_task_events=False)
    async def ping_without_task_events(self) -> None:
        return None


def wakeups(pid: int) -> int:
    """Context switches so far of all the threads of a process (0 once it ended)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            status = open(f"/proc/{pid}/task/{tid}/status").read()
        except OSError:
            continue
        for field in ("\nvoluntary_ctxt_switches:", "\nnonvoluntary_ctxt_switches:"):
            total += int(status.split(field)[1].split()[0])
    return total


def cpu_s_or_zero(pid: int) -> float:
    try:
        return process_cpu_s(pid)
    except OSError:
        return 0.0


def periodic_calls(window_s: float) -> None:
    actors = [Bare.remote() for _ in range(CALLED_ACTORS)]
    pids = set(ray.get([a.pid.remote() for a in actors]))
    procs = processes()
    time.sleep(5)

    def window(method: str | None) -> tuple[float, float, collections.Counter]:
        before = {p: cpu_s_or_zero(p) for p in procs}
        busy, start, calls = machine_busy_s(), time.perf_counter(), 0
        while time.perf_counter() - start < window_s:
            if method:
                ray.get([getattr(a, method).remote() for a in actors])
                calls += len(actors)
            time.sleep(1 / CALLS_PER_S_PER_ACTOR)
        elapsed = time.perf_counter() - start
        used: collections.Counter = collections.Counter()
        for p, name in procs.items():
            used["the called actors" if p in pids else name] += cpu_s_or_zero(p) - before[p]
        return (machine_busy_s() - busy) / elapsed, calls / elapsed, collections.Counter(
            {k: v / elapsed for k, v in used.items()})

    print(f"\n1. {CALLED_ACTORS} idle actors called {CALLS_PER_S_PER_ACTOR}/s each, {window_s:.0f} s windows")
    print(f"{'round':<6} {'calls':<22} {'calls/s':>8} {'busy cores':>11} {'CPU µs per call, all':>21} "
          f"{'actors':>7} {'gcs_server':>11} {'raylet':>7} {'driver':>7}")
    for round_ in (1, 2):
        idle_busy, _, idle_used = window(None)
        for label, method in (("task events on", "ping"), ("task events off", "ping_without_task_events")):
            busy, rate, used = window(method)

            def per_call(name: str) -> float:
                return (used[name] - idle_used[name]) / rate * 1e6

            print(f"{round_:<6} {label:<22} {rate:>8.0f} {busy:>11.3f} {(busy - idle_busy) / rate * 1e6:>21.0f} "
                  f"{per_call('the called actors'):>7.0f} {per_call('gcs_server'):>11.0f} {per_call('raylet'):>7.0f} "
                  f"{per_call('driver (librdkafka clients)'):>7.0f}")
    for a in actors:
        ray.kill(a)


def start_bench_cluster() -> rayk.Cluster:
    cluster = rayk.start(brokers=3, data_dir=scratch_dir(prefix="rayk-idle-floor-"),
                         config={"listeners": "PLAINTEXT://127.0.0.1:0", "min.insync.replicas": 2})
    for topic in BENCH_TOPICS:
        cluster.create_topic(topic, num_partitions=kpb.PARTITIONS, replication_factor=3)
    # A consumer group's first read creates __consumer_offsets, as in kafka_protocol_bench.
    kpb.produce(cluster.bootstrap_servers, "warm", 20_000, os.urandom(100))
    kpb.consume(cluster.bootstrap_servers, "warm", 20_000)
    return cluster


def idle_floor(window_s: float) -> None:
    bare = [Bare.remote() for _ in range(BARE_ACTORS)]
    bare_pids = set(ray.get([b.pid.remote() for b in bare]))
    kpb.settle()
    time.sleep(10)
    procs = processes()
    procs.update({p: "bare async Ray actor" for p in bare_pids})
    cpu_before = {p: cpu_s_or_zero(p) for p in procs}
    wakeups_before = {p: wakeups(p) for p in procs}
    busy = machine_busy_s()
    time.sleep(window_s)
    busy = (machine_busy_s() - busy) / window_s
    count, cores, woken = collections.Counter(), collections.Counter(), collections.Counter()
    for p, name in procs.items():
        count[name] += 1
        cores[name] += (cpu_s_or_zero(p) - cpu_before[p]) / window_s
        woken[name] += (wakeups(p) - wakeups_before[p]) / window_s
    print(f"\n2. the idle cluster of kafka_protocol_bench, {window_s:.0f} s: machine busy {busy:.3f} cores, "
          f"{sum(woken.values()):,.0f} wake-ups/s")
    print(f"{'process class':<32} {'processes':>9} {'cores':>7} {'% of a core each':>17} {'wake-ups/s each':>16}")
    for name, used in cores.most_common():
        print(f"{name:<32} {count[name]:>9} {used:>7.3f} {used / count[name] * 100:>17.2f} "
              f"{woken[name] / count[name]:>16.0f}")
    for b in bare:
        ray.kill(b)


def consume_rates(bootstrap: str, records: int, runs: int) -> list[float]:
    with kpb.frozen_heap():  # as kafka_protocol_bench times it: see frozen_heap
        return [records / kpb.consume(bootstrap, "consume", records) for _ in range(runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window-s", type=float, default=20)
    parser.add_argument("--records", type=int, default=300_000, help="records Tansu's consumer reads per run")
    parser.add_argument("--runs", type=int, default=3, help="consume runs per case")
    parser.add_argument("--skip-tansu", action="store_true")
    args = parser.parse_args()
    print(f"rayk idle floor benchmark: {os.cpu_count()} CPUs, Ray {ray.__version__}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", _system_config=dict(RAY_SYSTEM_CONFIG))  # as kafka_protocol_bench
    periodic_calls(args.window_s)
    with contextlib.ExitStack() as stack:
        if not args.skip_tansu:
            bootstrap = stack.enter_context(kpb.tansu_broker())
            kpb.create_topic_by_admin(bootstrap, "consume")
            kpb.produce(bootstrap, "consume", args.records, os.urandom(100))
            consume_rates(bootstrap, args.records, 1)  # the first read of Tansu and of the client, untimed
            kpb.settle()
            alone = consume_rates(bootstrap, args.records, args.runs)
        cluster = start_bench_cluster()
        idle_floor(args.window_s)
        if not args.skip_tansu:
            kpb.settle()
            beside = consume_rates(bootstrap, args.records, args.runs)
        cluster.shutdown()
        if not args.skip_tansu:
            kpb.settle()
            after = consume_rates(bootstrap, args.records, args.runs)
            print(f"\n3. Tansu's consume, {args.records:,} records, {args.runs} runs each (median; all)")
            for label, rates in (("alone (Ray started)", alone), ("beside the idle rayk cluster", beside),
                                 ("after the cluster's shutdown", after)):
                print(f"{label:<40} {statistics.median(rates):>12,.0f} rec/s  ({', '.join(f'{r:,.0f}' for r in rates)})")
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
