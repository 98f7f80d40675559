"""Where the CPU goes under kafka_protocol_bench's loads: 3 brokers, a 3-partition RF=3
topic (min.insync.replicas 2), a confluent-kafka producer with acks=all and a consumer
polling (`--no-consumer`: the producer alone, so the figures are the acks=all requests'
own). The latency load (default) sends `--rate` records/s with `linger.ms` 0;
`--throughput` sends as fast as it can with `batch.size` 1 MiB and `linger.ms` 5.

After `--warmup-s`, it reads each process's CPU time from /proc for `--window-s` and
prints cores used per process class (partition replicas, listeners, the driver with its
librdkafka clients, raylet, GCS ...), the other processes and the kernel's own threads
(what no process is charged with), next to the whole machine's busy cores: the ceiling
of each stage is one core divided by its CPU per record. Beside each, its wake-ups per
record (voluntary context switches, over all its threads: each is a sleep
that a wake-up ends) and its CPU per wake-up: a record's CPU is mostly a chain of
wake-ups, and a wake-up has a cost of its own on this VM whatever runs after it. It also
splits the replicas' and listeners' CPU and wake-ups by thread: the one that runs the
actor's event loop (rayk's work, asyncio's and the kernel's for its sockets), Ray's main
thread, and Ray's others (the native threads among them).

Every figure is the scheduler's own run time: the machine's, summed over its threads in
ns; a process's, from /proc/PID/stat (the same clock, to the 10 ms). /proc/stat's busy
cores, which count by the tick, are printed beside the machine's: with many wake-ups
shorter than a tick they can read far below the sum of the processes' times (0.29 cores
against 0.85 in one run), so a residual taken from them measures nothing.

With `--profile` it runs cProfile, timed by the thread's CPU clock, in the event loop of
partition 0's leader, of one of its followers and of the leader's broker's listener for
the window, and prints per process the Python calls per record of the partition and the
functions with the most time of their own. cProfile adds its own cost to every call, so
its times are for comparing functions, and the figures of the first table are from a
run without it. With `--py-spy` it samples the listeners and replicas with py-spy
instead (which costs a core itself) and prints the frames where their samples end; a
sample in native code ends in the Python frame that called into it (`Thread.run` for an
event loop), so that table does not tell uvloop from the interpreter: `perf record -g -p
PID` does.

    .venv/bin/python benchmarks/latency_cpu_bench.py [--rate R | --throughput] [--window-s S] [--no-consumer] [--profile | --py-spy]

A local Ray instance, shut down at the end. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import gc
import os
import pstats
import subprocess
import sys
import threading
import time

import confluent_kafka
import ray
from ray._private.state import actors as actor_table

import rayk
from rayk.ray_settings import RAY_SYSTEM_CONFIG
from scratch import scratch_dir  # noqa: E402  (beside this script)

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat_cpu_s(stat_path: str) -> float:
    """User + system CPU seconds from a /proc/.../stat file."""
    fields = open(stat_path).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def process_cpu_s(pid: int) -> float:
    return _stat_cpu_s(f"/proc/{pid}/stat")


def _voluntary_switches(stat_dir: str) -> int:
    for line in open(f"{stat_dir}/status"):
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def thread_wakeups(pid: int) -> dict[int, int]:
    """Thread id -> voluntary context switches (sleeps, each ended by a wake-up) so far."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out[int(tid)] = _voluntary_switches(f"/proc/{pid}/task/{tid}")
        except OSError:
            continue
    return out


def machine_busy_s() -> float:
    """CPU seconds the machine's cores ran anything so far: user, nice, system, irq and
    softirq. Not idle or iowait, nor steal (time the host ran something else in this VM's
    place), nor guest and guest_nice (already counted in user and nice)."""
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in open("/proc/stat").readline().split()[1:8])
    return (user + nice + system + irq + softirq) / TICKS_PER_S


PF_KTHREAD = 0x00200000  # a kernel thread (include/linux/sched.h), in /proc/PID/stat's flags


def machine_run_s() -> tuple[float, float]:
    """(every process's threads, the kernel's threads): CPU seconds run so far, by the
    scheduler's own clock (/proc/PID/task/TID/schedstat, in ns), not by the tick as
    /proc/stat counts. The kernel's threads (ksoftirqd, kworkers) carry the work no process
    is charged with, such as softirq work deferred from an interrupt. A thread that ended
    within the window is missing from the second reading, so the figure errs low."""
    processes_s = kernel_s = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            flags = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[6])
            run_ns = 0
            for tid in os.listdir(f"/proc/{entry}/task"):
                run_ns += int(open(f"/proc/{entry}/task/{tid}/schedstat").read().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
        if flags & PF_KTHREAD:
            kernel_s += run_ns / 1e9
        else:
            processes_s += run_ns / 1e9
    return processes_s, kernel_s


def processes() -> dict[int, str]:
    """pid -> class: Ray's actor table for rayk's actors, /proc for raylet and GCS."""
    out = {i["Pid"]: i["ActorClassName"] for i in actor_table().values() if i["State"] == "ALIVE" and i["Pid"]}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in out:
            try:
                comm = open(f"/proc/{entry}/comm").read().strip()
            except OSError:
                continue
            if comm in ("raylet", "gcs_server"):
                out[int(entry)] = comm
            elif "ray" in (cmdline := open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")):
                script = next((a for a in cmdline.split("\0") if a.endswith(".py")), comm)
                out[int(entry)] = f"Ray's {os.path.basename(script)}"
    out[os.getpid()] = "driver (librdkafka clients)"
    return out


def thread_cpu_s(pid: int) -> dict[int, float]:
    """Thread id -> CPU seconds (user + system) of each thread of the process."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out  # the process ended
    for tid in tids:
        try:
            out[int(tid)] = _stat_cpu_s(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue  # the thread ended
    return out


def data_path_actors(cluster: rayk.Cluster) -> dict[int, tuple[str, object]]:
    """pid -> (class, handle) of every partition replica and listener of the cluster."""
    handles = []
    for broker in cluster.brokers():
        manager = cluster.broker(broker["broker_id"])
        handles += [("PartitionReplica", h) for h in ray.get(manager.replica_handles.remote()).values()]
        handles.append(("SocketServerActor", ray.get(manager.listener.remote())))
    pids = ray.get([h.__ray_call__.remote(lambda actor: os.getpid()) for _, h in handles])
    return {pid: entry for pid, entry in zip(pids, handles)}


def _event_loop_thread(actor: object) -> int:
    """In an actor: the thread id of the thread that runs its event loop."""
    return next(t.native_id for t in threading.enumerate() if t.name.startswith("AsyncIO Thread"))


def _running_loop() -> asyncio.AbstractEventLoop:
    """In an async actor: its event loop (a call like this one runs on another thread)."""
    return next(o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running())


def _on_event_loop(function) -> None:
    """In an async actor: runs `function` on its event loop's thread and waits for it."""
    done = threading.Event()
    _running_loop().call_soon_threadsafe(lambda: (function(), done.set()))
    assert done.wait(30), "the event loop did not run the call"


def _start_profile(actor: object) -> None:
    actor._bench_profile = cProfile.Profile(time.thread_time_ns, 1e-9)
    _on_event_loop(actor._bench_profile.enable)


def _stop_profile(actor: object, top: int) -> tuple[int, list[tuple[int, float, str]]]:
    """(Python calls in all, the `top` functions by own time: (calls, own seconds, name))."""
    _on_event_loop(actor._bench_profile.disable)
    stats = pstats.Stats(actor._bench_profile)
    rows = [(calls, own_s, f"{os.path.basename(file)}:{line}({name})" if line else name)
            for (file, line, name), (_, calls, own_s, _, _) in stats.stats.items()]
    return stats.total_calls, sorted(rows, key=lambda row: -row[1])[:top]


def profile_targets(cluster: rayk.Cluster, topic: str) -> dict[str, tuple[object, int]]:
    """Label -> (handle, how many of the topic's partitions its records come from) for
    partition 0's leader, one of its followers and the listener of the leader's broker."""
    partitions = cluster.describe_topic(topic)
    leader = partitions[0].leader
    follower = next(b for b in partitions[0].replicas if b != leader)
    listener = ray.get(cluster.broker(leader).listener.remote())
    led = sum(1 for p in partitions if p.leader == leader)
    return {f"leader (broker {leader})": (cluster.replica(topic, 0, leader), 1),
            f"follower (broker {follower})": (cluster.replica(topic, 0, follower), 1),
            f"listener (broker {leader}, leads {led} of {len(partitions)})": (listener, led)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=1_000, help="records/s")
    parser.add_argument("--warmup-s", type=float, default=6)
    parser.add_argument("--window-s", type=float, default=10)
    parser.add_argument("--throughput", action="store_true", help="unthrottled, batch.size 1 MiB, linger.ms 5")
    parser.add_argument("--profile", action="store_true", help="cProfile in three event loops (see above)")
    parser.add_argument("--py-spy", action="store_true")
    parser.add_argument("--no-consumer", action="store_true",
                        help="the producer alone: the CPU of the acks=all requests (the followers' fetches included), without a consumer's")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             _system_config=dict(RAY_SYSTEM_CONFIG))  # brokers at nice 0, as Kafka runs
    cluster = rayk.start(brokers=3, data_dir=scratch_dir(prefix="rayk-cpu-"),
                         config={"listeners": "PLAINTEXT://127.0.0.1:0", "min.insync.replicas": 2})
    cluster.create_topic("latency", num_partitions=3, replication_factor=3)
    bootstrap, stop, sent = cluster.bootstrap_servers, threading.Event(), [0]

    def produce() -> None:
        settings = {"batch.size": 1 << 20, "linger.ms": 5} if args.throughput else {"linger.ms": 0}
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", **settings})
        start, i = time.perf_counter(), 0
        while not stop.is_set():
            if not args.throughput:
                time.sleep(max(start + i / args.rate - time.perf_counter(), 0))
            try:
                producer.produce("latency", b"x" * 100, partition=i % 3)
            except BufferError:
                producer.poll(0.01)
                continue
            producer.poll(0)
            i += 1
            sent[0] = i
        producer.flush(10)

    def consume() -> None:
        consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "cpu", "enable.auto.commit": False,
                                             "fetch.queue.backoff.ms": 10})  # as users set it: see kafka_protocol_bench
        consumer.assign([confluent_kafka.TopicPartition("latency", p, 0) for p in range(3)])
        while not stop.is_set():
            consumer.consume(1000, 0.1)
        consumer.close()

    threads = [threading.Thread(target=produce)] + ([] if args.no_consumer else [threading.Thread(target=consume)])
    for t in threads:
        t.start()
    time.sleep(args.warmup_s)
    procs = processes()
    data_path = data_path_actors(cluster)
    loop_threads = dict(zip(data_path, ray.get([h.__ray_call__.remote(_event_loop_thread) for _, h in data_path.values()])))
    targets = profile_targets(cluster, "latency") if args.profile else {}
    for handle, _ in targets.values():
        ray.get(handle.__ray_call__.remote(_start_profile))
    before = {pid: process_cpu_s(pid) for pid in procs}
    threads_before = {pid: thread_cpu_s(pid) for pid in data_path}
    wakeups_before = {pid: thread_wakeups(pid) for pid in procs}
    run_before = machine_run_s()
    busy_before, sent_before, start = machine_busy_s(), sent[0], time.perf_counter()
    spies = []
    if args.py_spy:
        spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        spies = [(pid, subprocess.Popen([spy, "record", "-p", str(pid), "-d", str(int(args.window_s)), "-r", "100",
                                         "-f", "raw", "-o", f"/tmp/rayk-spy-{pid}.txt", "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                 for pid, cls in procs.items() if cls in ("SocketServerActor", "PartitionReplica")]
        for _, p in spies:
            p.wait()
    else:
        time.sleep(args.window_s)
    wall_s = time.perf_counter() - start
    records = sent[0] - sent_before
    used, wakeups = collections.Counter(), collections.Counter()
    wakeups_after = {pid: thread_wakeups(pid) for pid in procs}
    for pid, cls in procs.items():
        try:
            used[cls] += process_cpu_s(pid) - before[pid]
        except OSError:
            pass
        # Threads that ended meanwhile are left out; those that started count from 0.
        wakeups[cls] += sum(n - wakeups_before[pid].get(tid, 0) for tid, n in wakeups_after[pid].items())
    busy = machine_busy_s() - busy_before
    run_after = machine_run_s()
    processes_run_s, kernel_run_s = (after - before for after, before in zip(run_after, run_before))
    by_thread, wakeups_by_thread = collections.Counter(), collections.Counter()
    for pid, (cls, _) in data_path.items():
        for tid, cpu_s in thread_cpu_s(pid).items():
            kind = "event loop" if tid == loop_threads[pid] else "Ray's main thread" if tid == pid else "Ray's other threads"
            by_thread[(cls, kind)] += cpu_s - threads_before[pid].get(tid, 0.0)
            wakeups_by_thread[(cls, kind)] += wakeups_after[pid].get(tid, 0) - wakeups_before[pid].get(tid, 0)
    profiles = {label: (ray.get(handle.__ray_call__.remote(_stop_profile, 12)), share)
                for label, (handle, share) in targets.items()}
    stop.set()
    for t in threads:
        t.join()
    load = "throughput" if args.throughput else f"{args.rate:,}/s, linger.ms 0"
    print(f"{load}, {'the producer alone' if args.no_consumer else 'a producer and a consumer'}")
    print(f"{records / wall_s:,.0f} records/s over {wall_s:.1f} s; machine busy {(processes_run_s + kernel_run_s) / wall_s:.2f}"
          f" of {os.cpu_count()} cores by its threads' run time ({busy / wall_s:.2f} by /proc/stat's ticks)")
    used["other processes"] = processes_run_s - sum(used.values())
    used["the kernel's threads (softirq, kworkers)"] = kernel_run_s
    per_record = 1 / max(records, 1)
    print(f"{'process class':44} {'cores':>6} {'CPU µs / record':>16} {'wake-ups / record':>18} {'µs / wake-up':>13}")
    for cls, cpu_s in used.most_common():
        woken = wakeups.get(cls)
        per_wakeup = f"{cpu_s / woken * 1e6:13.1f}" if woken else f"{'':13}"
        print(f"{cls:44} {cpu_s / wall_s:6.2f} {cpu_s * per_record * 1e6:16.1f} "
              f"{(woken or 0) * per_record:18.2f} {per_wakeup}")
    print(f"all rayk and Ray processes: {sum(wakeups.values()) * per_record:.2f} wake-ups per record")
    kinds = ("event loop", "Ray's main thread", "Ray's other threads")
    print(f"{'by thread, CPU µs / record (wake-ups)':44} {'event loop':>16} {'Ray main':>16} {'Ray other':>16}")
    for cls in ("PartitionReplica", "SocketServerActor"):
        row = [f"{by_thread[(cls, k)] * per_record * 1e6:8.1f} ({wakeups_by_thread[(cls, k)] * per_record:4.2f})" for k in kinds]
        print(f"{cls:44} {row[0]:>16} {row[1]:>16} {row[2]:>16}")
    for label, ((calls, top), share) in profiles.items():
        partition_records = max(records * share / 3, 1)  # the producer sends to the 3 partitions in turn
        print(f"cProfile, {label}: {calls / partition_records:,.0f} Python calls per record; most own time:")
        for n, seconds, name in top:
            print(f"  {n / partition_records:8.1f} calls/record {seconds / partition_records * 1e6:8.1f} µs/record  {name}")
    if spies:
        leaves, total = collections.Counter(), 0
        for pid, _ in spies:
            try:
                lines = open(f"/tmp/rayk-spy-{pid}.txt").read().splitlines()
            except FileNotFoundError:
                continue
            for line in lines:
                stack, count = line.rsplit(" ", 1)
                leaf = stack.split(";")[-1]
                leaves[(procs[pid], leaf)] += int(count)
                total += int(count)
        print("py-spy: where the listeners' and replicas' samples end")
        for (cls, leaf), n in leaves.most_common(20):
            print(f"  {n / max(total, 1):6.1%}  {cls:18} {leaf}")
    cluster.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
