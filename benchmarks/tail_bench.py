"""Where the end-to-end tail at 1,000 records/s comes from on this machine: rayk's data
path, or Ray's own per-node processes beside it.

kafka_protocol_bench's latency harness (`latency_at_rate`: a confluent-kafka producer at
`--rate` records/s, linger.ms 0, acks=all, and a consumer polling) on one rayk cluster of
3 brokers, a 3-partition RF=3 topic and `--idle-topics` more like it that nothing uses
(54 replica processes by default, the offsets topic's 9 included). Rounds of
`--round-records` alternate between
- Ray's per-node processes running, as always, and
- the same processes paused (SIGSTOP, SIGCONT when the round ends): the dashboard agent
  (which takes every worker's metrics exports and samples every worker process), the log
  monitor, the dashboard, the autoscaler monitor and the runtime-env agent. Only this
  bench's own Ray instance's, the driver's children. The raylet and the GCS keep running:
  the data plane does not need them while the round lasts, but nothing else would work.
It prints end-to-end p50 / p99 / p99.9 per round and pooled per condition, then, for the
running rounds, the dashboard agent's CPU per 100 ms (read from /proc every 10 ms): its
busiest windows, and how many of the records over `--spike-ms` arrived during or within
200 ms after a window where it used 20 ms of CPU or more, against the share of the time
those stretches cover.

    .venv/bin/python benchmarks/tail_bench.py [--rounds N] [--round-records R] [--idle-topics T]

A local Ray instance, shut down at the end. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import threading
import time

import psutil
import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_protocol_bench as kpb  # noqa: E402
from latency_cpu_bench import process_cpu_s  # noqa: E402
from results import record  # noqa: E402  (beside this script)

import rayk  # noqa: E402
from rayk.ray_settings import RAY_SYSTEM_CONFIG  # noqa: E402
from scratch import scratch_dir  # noqa: E402  (beside this script)

WINDOW_S = 0.1
BUSY_WINDOW_CPU_S = 0.02  # a window where the agent took a fifth of a core or more
AFTER_BUSY_S = 0.2  # a record delayed by a burst arrives during it or soon after
PAUSED_KINDS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "log_monitor.py", "dashboard.py", "monitor.py")
AGENT = "ray::DashboardAgent"


def ray_node_processes() -> dict[str, psutil.Process]:
    """This driver's Ray instance's per-node processes that PAUSED_KINDS names, by kind."""
    found = {}
    for process in psutil.Process().children(recursive=True):
        try:
            cmdline = process.cmdline()
        except psutil.Error:
            continue
        if not cmdline:
            continue
        if cmdline[0].startswith("ray::"):
            kind = cmdline[0].split()[0]
        else:
            kind = next((os.path.basename(a) for a in cmdline[:4] if a.endswith(".py")), "")
        if kind in PAUSED_KINDS:
            found[kind] = process
    return found


class CpuTimeline:
    """One process's CPU seconds, read from /proc every 10 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), process_cpu_s(self._pid)))
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def windows(self, spans: list[tuple[float, float]]) -> dict[float, float]:
        """CPU seconds per WINDOW_S window (keyed by its start) inside `spans`."""
        used: dict[float, float] = collections.defaultdict(float)
        for (_, before), (at, after) in zip(self.samples, self.samples[1:]):
            if any(start <= at < end for start, end in spans):
                used[at - at % WINDOW_S] += after - before
        return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="alternating: running, paused, running, ...")
    parser.add_argument("--round-records", type=int, default=5_000)
    parser.add_argument("--rate", type=int, default=1_000, help="records/s")
    parser.add_argument("--idle-topics", type=int, default=4)
    parser.add_argument("--spike-ms", type=float, default=15.0)
    args = parser.parse_args()

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             _system_config=dict(RAY_SYSTEM_CONFIG))  # brokers at nice 0, as Kafka runs
    cluster = rayk.start(brokers=3, data_dir=scratch_dir(prefix="rayk-tail-"),
                         config={"listeners": "PLAINTEXT://127.0.0.1:0", "min.insync.replicas": 2})
    try:
        for n in range(args.idle_topics):
            cluster.create_topic(f"idle-{n}", num_partitions=kpb.PARTITIONS, replication_factor=3)
        cluster.create_topic("latency", num_partitions=kpb.PARTITIONS, replication_factor=3)
        kpb.settle()
        kpb.latency_at_rate(cluster.bootstrap_servers, "latency", 2_000, args.rate)  # connections up, uncounted
        paused_kinds = ray_node_processes()
        print(f"{9 * (args.idle_topics + 2)} replica processes; paused in alternate rounds: {', '.join(sorted(paused_kinds))}")
        agent = CpuTimeline(paused_kinds[AGENT].pid) if AGENT in paused_kinds else None
        pooled: dict[bool, list[float]] = {False: [], True: []}
        per_round: dict[str, dict[str, float]] = {"round_e2e_p50_ms": {}, "round_e2e_p99_ms": {}}
        arrivals: list[tuple[float, float]] = []  # the running rounds'
        running_spans: list[tuple[float, float]] = []
        for n in range(args.rounds):
            paused = n % 2 == 1
            kpb.settle()
            if paused:
                for process in paused_kinds.values():
                    process.send_signal(signal.SIGSTOP)
            started = time.perf_counter()
            try:
                _, e2e = kpb.latency_at_rate(cluster.bootstrap_servers, "latency", args.round_records, args.rate,
                                             from_end=True, arrivals=None if paused else arrivals)
            finally:
                if paused:
                    for process in paused_kinds.values():
                        process.send_signal(signal.SIGCONT)
            if not paused:
                running_spans.append((started, time.perf_counter()))
            pooled[paused] += e2e
            per_round["round_e2e_p50_ms"][f"{n} {'paused' if paused else 'running'}"] = kpb.percentile(e2e, 0.5)
            per_round["round_e2e_p99_ms"][f"{n} {'paused' if paused else 'running'}"] = kpb.percentile(e2e, 0.99)
            print(f"round {n}, Ray's node processes {'paused ' if paused else 'running'}: e2e p50 "
                  f"{kpb.percentile(e2e, 0.5):.1f} p99 {kpb.percentile(e2e, 0.99):.1f} ms", flush=True)
        print(f"{'pooled end to end, ms':44} {'records':>8} {'p50':>6} {'p99':>6} {'p99.9':>6}")
        for paused, values in pooled.items():
            label = "Ray's node processes " + ("paused" if paused else "running")
            print(f"{label:44} {len(values):8,} {kpb.percentile(values, 0.5):6.1f} {kpb.percentile(values, 0.99):6.1f}"
                  f" {kpb.percentile(values, 0.999):6.1f}")
        # For benchmarks/plot.py: the pooled percentiles per condition, and each round's.
        labels = {False: "Ray's node processes running", True: "Ray's node processes paused"}
        record("tail_bench", {
            "rounds": args.rounds, "round_records": args.round_records, "rate": args.rate,
            "replica_processes": 9 * (args.idle_topics + 2),
            **{f"e2e_{name}_ms": {labels[paused]: kpb.percentile(values, q) for paused, values in pooled.items()}
               for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))},
            "records": {labels[paused]: len(values) for paused, values in pooled.items()},
            **per_round,
        })
        if agent is not None:
            agent.stop()
            show_agent_bursts(agent.windows(running_spans), running_spans, arrivals, args.spike_ms)
    finally:
        cluster.shutdown()
        ray.shutdown()


def show_agent_bursts(windows: dict[float, float], spans: list[tuple[float, float]],
                      arrivals: list[tuple[float, float]], spike_ms: float) -> None:
    running_s = sum(end - start for start, end in spans)
    print(f"dashboard agent, running rounds: {sum(windows.values()):.2f} s of CPU in {running_s:.0f} s; busiest 100 ms "
          f"windows (ms of CPU): {sorted((round(v * 1000) for v in windows.values()), reverse=True)[:10]}")
    busy = [(start, start + WINDOW_S + AFTER_BUSY_S) for start, cpu_s in windows.items() if cpu_s >= BUSY_WINDOW_CPU_S]
    covered_s = sum(end - start for start, end in merge(busy))
    spikes = [at for at, e2e in arrivals if e2e > spike_ms]
    near = sum(1 for at in spikes if any(start <= at < end for start, end in busy))
    print(f"records over {spike_ms:g} ms: {len(spikes)}; {near} of them ({near / max(len(spikes), 1):.0%}) arrived during "
          f"or {AFTER_BUSY_S * 1000:.0f} ms after an agent window of {BUSY_WINDOW_CPU_S * 1000:.0f}+ ms of CPU, "
          f"stretches that cover {covered_s / max(running_s, 1e-9):.0%} of the time")


def merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


if __name__ == "__main__":
    main()
