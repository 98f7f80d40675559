"""How many partition replicas a node holds, and what an idle one costs, side by side with
a bare Ray actor, in one run (issue 67, items 4 and 6).

3 brokers on this machine with the derived `max.replicas.per.broker` (replica_capacity.py):
1. **Replicas per node before refusal.** The cap each broker derives from this node's memory
   and cores, checked against the Controller: a topic at the cap is accepted
   (validate_only), one replica more is refused (POLICY_VIOLATION).
2. **Filling the node to its capacity.** Topics of `--step` partitions at RF 3 are created
   one after the other up to the capacity: how long until every ISR is full, and the
   longest gap between two heartbeats of a broker meanwhile (the Controller's
   session_counts), against the session timeout.
3. **What an idle replica costs.** With every ISR full and no traffic, over `--window-s`:
   per process class (follower, leader, bare async Ray actor: `--bare` of them, created in
   the same run, the floor) the mean CPU in % of one core (/proc) and the memory of its
   own (USS, /proc/<pid>/smaps_rollup), and the node's used memory per replica. The
   measured figures are then put through replica_capacity's formula beside the constants
   it uses.

With `--config KEY=VALUE` (repeatable) the brokers run with that setting (e.g.
`replica.fetch.wait.max.ms=5000`, to see what the followers' long poll costs).

    .venv/bin/python benchmarks/capacity_bench.py [--window-s S] [--step N] [--bare N] [--config K=V]

A local Ray instance, shut down at the end. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import ray
from ray._private.utils import get_num_cpus, get_system_memory

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from idle_replica_cpu_bench import BareActor, healthy, replica_roles  # noqa: E402
from latency_cpu_bench import machine_busy_s, process_cpu_s, processes  # noqa: E402
from results import record  # noqa: E402  (beside this script)

import rayk  # noqa: E402
from rayk.errors import KafkaError, PolicyViolationError  # noqa: E402
from rayk.server import replica_capacity as rc  # noqa: E402
from scratch import scratch_dir  # noqa: E402  (beside this script)

BROKERS = 3
MiB = 1 << 20


def uss_bytes(pid: int) -> int:
    """Memory only this process maps (private pages): what it costs beyond what it shares."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def used_memory_bytes() -> int:
    info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in open("/proc/meminfo")}
    return info["MemTotal"] - info["MemAvailable"]


def refusal_point(cluster: rayk.Cluster, cap: int) -> str:
    """Whether the Controller accepts a topic putting each broker at `cap` and refuses one more."""
    controller = cluster.controller
    ray.get(controller.create_topic.remote("probe-at-cap", cap, 3, None, True))  # validate_only: accepted
    try:
        ray.get(controller.create_topic.remote("probe-past-cap", cap + 1, 3, None, True))
        return "NOT refused one past it"
    except PolicyViolationError as e:
        return f"accepted at {cap} per broker, refused at {cap + 1}: {str(e).split(';')[0]}"


def fill(cluster: rayk.Cluster, partitions: int, step: int, timeout_s: float) -> tuple[list[str], float]:
    """Topics of `step` partitions at RF 3 up to `partitions`, each until its ISRs are full."""
    started_s = time.monotonic()
    topics = []
    for i in range(0, partitions, step):
        topic = f"fill-{i}"
        topics.append(topic)
        try:
            cluster.create_topic(topic, num_partitions=min(step, partitions - i), replication_factor=3)
        except KafkaError as e:
            print(f"  creating {topic}: {e.__class__.__name__}; its replicas go on starting")
        deadline_s = time.monotonic() + timeout_s
        while not healthy(cluster, topic) and time.monotonic() < deadline_s:
            time.sleep(1)
    return topics, time.monotonic() - started_s


def measure(classes: dict[int, str], window_s: float) -> tuple[dict, dict, dict, float]:
    """Per class: CPU seconds over the window, process count, USS bytes; the machine's busy cores."""
    before = {pid: process_cpu_s(pid) for pid in classes}
    busy_before, start = machine_busy_s(), time.monotonic()
    time.sleep(window_s)
    wall_s = time.monotonic() - start
    cpu, count, uss = collections.Counter(), collections.Counter(), collections.Counter()
    for pid, cls in classes.items():
        try:
            cpu[cls] += process_cpu_s(pid) - before[pid]
            uss[cls] += uss_bytes(pid)
            count[cls] += 1
        except OSError:
            pass
    return cpu, count, uss, (machine_busy_s() - busy_before) / wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step", type=int, default=10, help="partitions per topic while filling the node")
    parser.add_argument("--fill", type=int, default=0,
                        help="partitions to fill the node with (default: the capacity; past it, set "
                             "--config max.replicas.per.broker=N too)")
    parser.add_argument("--bare", type=int, default=20)
    parser.add_argument("--warmup-s", type=float, default=15)
    parser.add_argument("--window-s", type=float, default=30)
    parser.add_argument("--healthy-timeout-s", type=float, default=600)
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    memory, cores = get_system_memory(), get_num_cpus()
    node = rc.node_capacity(memory, cores)
    cap = rc.derived_cap(memory, BROKERS, cores)
    print(f"node: {memory / 2**30:.1f} GiB, {cores:g} cores; {BROKERS} brokers")
    print(f"capacity: {node.by_memory} replicas by memory ({rc.REPLICA_MEMORY_SHARE:.0%} at "
          f"{rc.REPLICA_NODE_MEMORY_BYTES / MiB:.0f} MiB), {node.by_cpu} by CPU ({rc.REPLICA_CPU_SHARE:.0%} at "
          f"{rc.REPLICA_IDLE_CPU_CORES:.0%} of a core): {node.replicas} per node ({node.bound}), {cap} per broker")  # fmt: skip

    config = {"listeners": "PLAINTEXT://127.0.0.1:0", "min.insync.replicas": 2}
    config.update(setting.split("=", 1) for setting in args.config)
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    used_before = used_memory_bytes()
    cluster = rayk.start(brokers=BROKERS, data_dir=scratch_dir(prefix="rayk-capacity-"), config=config)
    try:
        print(f"1. replicas per node before refusal: {BROKERS * cap} ({refusal_point(cluster, cap)})")
        partitions = args.fill or cap
        topics, fill_s = fill(cluster, partitions, args.step, args.healthy_timeout_s)
        sessions = ray.get(cluster.controller.session_counts.remote())
        ok = all(healthy(cluster, t) for t in topics)
        print(f"2. {partitions} partitions x RF 3 = {BROKERS * partitions} replicas in topics of {args.step}: "
              f"{'every ISR full' if ok else 'NOT every ISR full'} after {fill_s:.0f} s; longest heartbeat gap "
              f"{sessions['longest_silence_ms'] / 1000:.1f} s (session timeout "
              f"{ray.get(cluster.controller.broker_config.remote()).broker_session_timeout_ms / 1000:.0f} s); registrations "
              f"{sessions['registrations']} for {BROKERS} brokers, fencings "
              f"{sessions['fenced_dead'] + sessions['fenced_silent'] + sessions['fenced_late']}")  # fmt: skip
        bare = [BareActor.remote() for _ in range(args.bare)]
        bare_pids = set(ray.get([b.pid.remote() for b in bare]))
        time.sleep(args.warmup_s)
        used_per_replica = (used_memory_bytes() - used_before) / (BROKERS * partitions + args.bare)
        classes = {**processes(), **replica_roles(cluster, topics)}
        classes.update({pid: "bare async Ray actor" for pid in bare_pids})
        cpu, count, uss, busy = measure(classes, args.window_s)
        print(f"3. idle, no traffic, over {args.window_s:.0f} s (machine {busy:.2f} of {cores:g} cores busy):")
        print(f"   {'process class':30} {'processes':>9} {'% of a core each':>17} {'USS MiB each':>13}")
        for cls in ("PartitionReplica (follower)", "PartitionReplica (leader)", "bare async Ray actor",
                    "ReplicaManager", "SocketServerActor", "Controller"):  # fmt: skip
            if count[cls]:
                print(f"   {cls:30} {count[cls]:9d} {100 * cpu[cls] / args.window_s / count[cls]:17.2f} "
                      f"{uss[cls] / count[cls] / MiB:13.1f}")  # fmt: skip
        replicas = count["PartitionReplica (follower)"] + count["PartitionReplica (leader)"]
        replica_cpu = (cpu["PartitionReplica (follower)"] + cpu["PartitionReplica (leader)"]) / args.window_s / max(replicas, 1)
        bare_cpu = cpu["bare async Ray actor"] / args.window_s / max(count["bare async Ray actor"], 1)
        print(f"   a replica at RF 3 (2 followers to a leader): {100 * replica_cpu:.2f}% of a core, bare actor "
              f"{100 * bare_cpu:.2f}%; node memory used per process {used_per_replica / MiB:.0f} MiB")  # fmt: skip
        by_cpu = int(cores * rc.REPLICA_CPU_SHARE / replica_cpu) if replica_cpu else 0
        by_memory = int(memory * rc.REPLICA_MEMORY_SHARE / used_per_replica) if used_per_replica > 0 else 0
        print(f"   with the figures measured here: {by_cpu} replicas by CPU, {by_memory} by memory (the constants give "
              f"{node.by_cpu} and {node.by_memory})")  # fmt: skip
        # For benchmarks/plot.py: replicas per node against idle CPU and memory.
        shown = ("PartitionReplica (follower)", "PartitionReplica (leader)", "bare async Ray actor")
        record("capacity_bench", {
            "node": {"memory_gib": memory / 2**30, "cores": cores, "brokers": BROKERS},
            "capacity": {"replicas_per_node": BROKERS * cap, "by_cpu": node.by_cpu, "by_memory": node.by_memory,
                         "by_cpu_measured": by_cpu, "by_memory_measured": by_memory},
            "budget": {"cpu_share": rc.REPLICA_CPU_SHARE, "memory_share": rc.REPLICA_MEMORY_SHARE,
                       "replica_idle_cpu_cores": rc.REPLICA_IDLE_CPU_CORES,
                       "replica_node_memory_mib": rc.REPLICA_NODE_MEMORY_BYTES / MiB},
            "fill": {"replicas": BROKERS * partitions, "every_isr_full": ok, "seconds": fill_s,
                     "longest_heartbeat_gap_s": sessions["longest_silence_ms"] / 1000},
            "idle_cpu_pct_of_core": {**{cls: 100 * cpu[cls] / args.window_s / count[cls] for cls in shown if count[cls]},
                                     "replica at RF 3": 100 * replica_cpu},
            "uss_mib": {cls: uss[cls] / count[cls] / MiB for cls in shown if count[cls]},
            "processes": {cls: count[cls] for cls in shown},
            "node_memory_used_per_process_mib": used_per_replica / MiB,
            "machine_busy_cores": busy,
            "window_s": args.window_s,
        })
    finally:
        cluster.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
