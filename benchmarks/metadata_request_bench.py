"""Metadata request benchmark: what a Kafka client's Metadata request costs rayk's
processes, answered from the listener's metadata image and from the Controller, in one run.

A 3-broker cluster (RF=3) with a few 3-partition topics; one connection to one listener
sends Metadata v12 requests one after another: `--requests` naming one topic (answered
from the listener's image, rayk/net/metadata_image.py) and as many for every topic (which
the listener always asks of the Controller, by a Ray call). Per kind it prints the wall
time per request and the CPU per request of each process class (listener, Controller,
replicas' idle work over the same time), read from /proc.

    .venv/bin/python benchmarks/metadata_request_bench.py [--requests N] [--topics T]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ray

import rayk
from rayk.net.api_versions import METADATA

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(str(Path(__file__).resolve().parent.parent))  # tests.protocol_helpers, after the rayk on the path
from kafka_protocol_bench import settle  # noqa: E402  (beside this script)
from latency_cpu_bench import process_cpu_s, processes  # noqa: E402
from results import record  # noqa: E402
from tests.protocol_helpers import RawConnection  # noqa: E402


def metadata_body(topics: list[str] | None) -> dict:
    return {"topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}


def cpu_by_class(pids: dict[int, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid, name in pids.items():
        try:
            out[name] = out.get(name, 0.0) + process_cpu_s(pid)
        except OSError:
            continue  # the process ended
    return out


def measure(connection: RawConnection, topics: list[str] | None, requests: int) -> tuple[float, dict[str, float]]:
    """(wall µs per request, CPU µs per request by process class) of `requests` Metadata requests."""
    body = metadata_body(topics)
    connection.call(METADATA, 12, body)
    pids = processes()
    before = cpu_by_class(pids)
    started = time.perf_counter()
    for _ in range(requests):
        connection.call(METADATA, 12, body)
    wall_s = time.perf_counter() - started
    after = cpu_by_class(pids)
    return wall_s / requests * 1e6, {name: (after[name] - before.get(name, 0.0)) / requests * 1e6 for name in after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3_000)
    parser.add_argument("--topics", type=int, default=5)
    args = parser.parse_args()
    print(f"rayk Metadata request benchmark: {args.requests:,} requests of each kind, {args.topics} topics of 3 "
          f"partitions, RF=3, 3 brokers; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    data_dir = tempfile.mkdtemp(prefix="rayk-metadata-request-bench-")
    cluster = rayk.start(brokers=3, data_dir=data_dir, config={"listeners": "PLAINTEXT://127.0.0.1:0"},
                         namespace="metadata-request-bench")
    rows = {}
    try:
        for t in range(args.topics):
            cluster.create_topic(f"topic-{t}", num_partitions=3, replication_factor=3)
        settle()
        connection = RawConnection(cluster.bootstrap_servers.split(",")[0])
        try:
            for label, topics in (("one topic, from the listener's image", ["topic-0"]),
                                  ("every topic, from the Controller", None)):
                settle()
                rows[label] = measure(connection, topics, args.requests)
        finally:
            connection.close()
    finally:
        cluster.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)
        ray.shutdown()
    classes = ["SocketServerActor", "Controller", "PartitionReplica"]
    print(f"{'Metadata request':<40} {'wall µs':>8} " + " ".join(f"{c + ' CPU µs':>24}" for c in classes))
    for label, (wall_us, cpu) in rows.items():
        print(f"{label:<40} {wall_us:>8.0f} " + " ".join(f"{cpu.get(c, 0.0):>24.0f}" for c in classes))
    record("metadata_request_bench", {
        "requests": args.requests, "topics": args.topics,
        "wall_us": {label: wall for label, (wall, _) in rows.items()},
        **{f"{c}_cpu_us": {label: cpu.get(c, 0.0) for label, (_, cpu) in rows.items()} for c in classes},
    })


if __name__ == "__main__":
    sys.exit(main())
