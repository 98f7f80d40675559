"""Where the CPU goes under kafka_protocol_bench's loads: 3 brokers, a 3-partition RF=3
topic (min.insync.replicas 2), a confluent-kafka producer with acks=all and a consumer
polling. The latency load (default) sends `--rate` records/s with `linger.ms` 0;
`--throughput` sends as fast as it can with `batch.size` 1 MiB and `linger.ms` 5.

After `--warmup-s`, it reads each process's CPU time from /proc for `--window-s` and
prints cores used per process class (partition replicas, listeners, the driver with its
librdkafka clients, raylet, GCS ...) next to the whole machine's busy cores (/proc/stat):
the ceiling of each stage is one core divided by its CPU per record. With `--py-spy` it
also samples the listeners and replicas with py-spy (which costs CPU itself) and prints
the frames where their samples end.

    .venv/bin/python benchmarks/latency_cpu_bench.py [--rate R | --throughput] [--window-s S] [--py-spy]

A local Ray instance, shut down at the end. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time

import confluent_kafka
import ray
from ray._private.state import actors as actor_table

import rayk

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def machine_busy_s() -> float:
    ticks = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS_PER_S  # all but idle and iowait


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=1_000, help="records/s")
    parser.add_argument("--warmup-s", type=float, default=6)
    parser.add_argument("--window-s", type=float, default=10)
    parser.add_argument("--throughput", action="store_true", help="unthrottled, batch.size 1 MiB, linger.ms 5")
    parser.add_argument("--py-spy", action="store_true")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    cluster = rayk.start(brokers=3, data_dir=tempfile.mkdtemp(prefix="rayk-cpu-"),
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

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    time.sleep(args.warmup_s)
    procs = processes()
    before = {pid: process_cpu_s(pid) for pid in procs}
    busy_before, sent_before, start = machine_busy_s(), sent[0], time.perf_counter()
    spies = []
    if args.py_spy:
        spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        spies = [(pid, subprocess.Popen([spy, "record", "-p", str(pid), "-d", str(int(args.window_s)), "-r", "100",
                                         "-f", "raw", "-o", f"/tmp/rayk-spy-{pid}.txt", "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                 for pid, cls in procs.items() if cls in ("SocketServer", "PartitionReplica")]
        for _, p in spies:
            p.wait()
    else:
        time.sleep(args.window_s)
    wall_s = time.perf_counter() - start
    records = sent[0] - sent_before
    used = collections.Counter()
    for pid, cls in procs.items():
        try:
            used[cls] += process_cpu_s(pid) - before[pid]
        except OSError:
            pass
    busy = machine_busy_s() - busy_before
    stop.set()
    for t in threads:
        t.join()
    print(f"{records / wall_s:,.0f} records/s over {wall_s:.1f} s; machine busy {busy / wall_s:.2f} of {os.cpu_count()} cores")
    used["kernel and other processes"] = busy - sum(used.values())
    print(f"{'process class':44} {'cores':>6} {'CPU µs / record':>16}")
    for cls, cpu_s in used.most_common():
        print(f"{cls:44} {cpu_s / wall_s:6.2f} {cpu_s / max(records, 1) * 1e6:16.1f}")
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
