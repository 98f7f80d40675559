"""Idle CPU of partition replicas, followers and leaders, against bare Ray actors in the same
run: 3 brokers on this machine, `--partitions` partitions (default 66, in topics of 11,
created one after the other) with RF=3, so ~200 replica processes, no traffic at all. Issue 39 asked whether an idle
follower really costs 5-12% of a core, as was seen on a shared machine.

After `--warmup-s` with every ISR full, it reads each process's CPU time from /proc over
`--window-s` and prints the mean % of one core per process of each class: follower
replicas, leader replicas, `--bare` bare async Ray actors (created next to them, the figure
to beat), the brokers' ReplicaManagers, the Controller, raylet and GCS, and the machine's
busy cores. With `--py-spy` it also samples `--spied` followers with py-spy and prints the
frames where their samples end, and the rayk frames on their stacks.

With `--config KEY=VALUE` (repeatable) the brokers run with that setting: e.g.
`replica.high.watermark.checkpoint.interval.ms=600000` leaves the replicas' offset reports
out, `replica.fetch.wait.max.ms=5000` makes the followers' long polls ten times rarer.

    .venv/bin/python benchmarks/idle_replica_cpu_bench.py [--partitions N] [--window-s S] [--py-spy] [--config K=V]

A local Ray instance, shut down at the end. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time

import ray
from ray._private.state import actors as actor_table

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latency_cpu_bench import machine_busy_s, process_cpu_s, processes  # noqa: E402

import rayk  # noqa: E402
from rayk.errors import KafkaTimeoutError  # noqa: E402
from scratch import scratch_dir  # noqa: E402  (beside this script)

TOPIC = "idle"


@ray.remote(num_cpus=0)
class BareActor:
    """An async actor doing nothing, as a replica is between fetches: the floor."""

    async def pid(self) -> int:
        return os.getpid()


def healthy(cluster: rayk.Cluster, topic: str) -> bool:
    try:
        return all(len(p["isr"]) == 3 and p["leader"] >= 0 for p in cluster.describe_topic(topic))
    except KafkaTimeoutError:
        return False  # the Controller is slow to answer while replica processes start


def replica_roles(cluster: rayk.Cluster, topics: list[str]) -> dict[int, str]:
    """pid -> 'PartitionReplica (leader)' / '(follower)', from each replica's describe()."""
    by_actor = {i["ActorID"]: i["Pid"] for i in actor_table().values() if i["State"] == "ALIVE"}
    roles = {}
    for topic in topics:
        for p in cluster.describe_topic(topic):
            for broker_id in p["replicas"]:
                handle = cluster.replica(topic, p["partition"], broker_id)
                role = ray.get(handle.describe.remote())["role"]
                roles[by_actor[handle._actor_id.hex()]] = f"PartitionReplica ({role})"
    return roles


def spy(pids: list[int], seconds: float) -> None:
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    out = {pid: f"/tmp/rayk-idle-spy-{pid}.txt" for pid in pids}
    runs = [subprocess.Popen([py_spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100", "-f", "raw",
                              "-o", path, "--nonblocking", "--idle"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for pid, path in out.items()]  # fmt: skip
    for run in runs:
        run.wait()
    leaves, rayk_frames, total = collections.Counter(), collections.Counter(), 0
    for path in out.values():
        try:
            lines = open(path).read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            stack, count = line.rsplit(" ", 1)
            frames = stack.split(";")
            leaves[frames[-1]] += int(count)
            for frame in {f for f in frames if "rayk/" in f}:
                rayk_frames[frame] += int(count)
            total += int(count)
    print(f"py-spy over {len(pids)} idle followers ({total} samples, idle threads included):")
    for leaf, n in leaves.most_common(12):
        print(f"  {n / max(total, 1):6.1%}  {leaf}")
    print("  rayk frames on the sampled stacks:")
    for frame, n in rayk_frames.most_common(10):
        print(f"  {n / max(total, 1):6.1%}  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=66)
    parser.add_argument("--partitions-per-topic", type=int, default=11)
    parser.add_argument("--bare", type=int, default=20)
    parser.add_argument("--healthy-timeout-s", type=float, default=600)
    parser.add_argument("--warmup-s", type=float, default=15)
    parser.add_argument("--window-s", type=float, default=30)
    parser.add_argument("--py-spy", action="store_true")
    parser.add_argument("--spied", type=int, default=5)
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker setting, to see what a periodic task costs (repeatable)")
    args = parser.parse_args()
    config = {"listeners": "PLAINTEXT://127.0.0.1:0", "min.insync.replicas": 2}
    config.update(setting.split("=", 1) for setting in args.config)
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    cluster = rayk.start(brokers=3, data_dir=scratch_dir(prefix="rayk-idle-"), config=config)
    t0 = time.monotonic()
    topics = [f"{TOPIC}-{i}" for i in range(-(-args.partitions // args.partitions_per_topic))]
    for i, topic in enumerate(topics):  # in steps: ~200 replica processes starting at once swamp 2 cores
        partitions = min(args.partitions_per_topic, args.partitions - i * args.partitions_per_topic)
        try:
            cluster.create_topic(topic, num_partitions=partitions, replication_factor=3)
        except KafkaTimeoutError:
            pass  # the creation goes on
        deadline_s = time.monotonic() + args.healthy_timeout_s
        while not healthy(cluster, topic):
            if time.monotonic() > deadline_s:  # what happened at 198 replicas on 2 cores (issue 39's note)
                sizes = collections.Counter(len(p["isr"]) for t in topics[: i + 1] for p in cluster.describe_topic(t))
                epochs = {b["broker_id"]: b["epoch"] for b in cluster.brokers()}
                print(f"not every ISR full {args.healthy_timeout_s:.0f} s after creating {topic}: ISR sizes {dict(sizes)}, "
                      f"broker epochs (registrations) {epochs}")  # fmt: skip
                cluster.shutdown()
                ray.shutdown()
                return
            time.sleep(1)
    print(f"{args.partitions} partitions x RF 3 = {3 * args.partitions} replicas in {len(topics)} topics, every ISR "
          f"full after {time.monotonic() - t0:.0f} s")  # fmt: skip
    bare = [BareActor.remote() for _ in range(args.bare)]
    bare_pids = set(ray.get([b.pid.remote() for b in bare]))
    time.sleep(args.warmup_s)
    classes = {**processes(), **replica_roles(cluster, topics)}
    classes.update({pid: "bare async Ray actor" for pid in bare_pids})
    before = {pid: process_cpu_s(pid) for pid in classes}
    busy_before, start = machine_busy_s(), time.monotonic()
    followers = [pid for pid, cls in classes.items() if cls == "PartitionReplica (follower)"]
    if args.py_spy:
        spy(followers[: args.spied], args.window_s)
    else:
        time.sleep(args.window_s)
    wall_s = time.monotonic() - start
    used, count = collections.Counter(), collections.Counter()
    for pid, cls in classes.items():
        try:
            used[cls] += process_cpu_s(pid) - before[pid]
            count[cls] += 1
        except OSError:
            pass
    busy = machine_busy_s() - busy_before
    print(f"machine busy {busy / wall_s:.2f} of {os.cpu_count()} cores over {wall_s:.0f} s, no traffic"
          + (" (py-spy sampling some followers)" if args.py_spy else ""))  # fmt: skip
    print(f"{'process class':40} {'processes':>9} {'% of a core each':>17} {'cores in all':>13}")
    for cls, cpu_s in sorted(used.items(), key=lambda kv: -kv[1]):
        print(f"{cls:40} {count[cls]:9d} {100 * cpu_s / wall_s / count[cls]:17.2f} {cpu_s / wall_s:13.2f}")
    cluster.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
