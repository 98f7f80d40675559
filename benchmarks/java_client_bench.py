"""Kafka's Java client against rayk and, in the same run, against Apache Kafka itself:
Kafka's own perf tools (`kafka-producer-perf-test`, `kafka-consumer-perf-test`, the main
classes ProducerPerformance and ConsumerPerformance of kafka-tools 4.2.1, from the
classpath tests/jvm_programs.py builds with Maven) on a 3-partition topic, RF=3,
min.insync.replicas=2, acks=all, 100-byte records, the Java client's other settings at
their defaults. rayk runs 3 brokers on this machine; Kafka runs 3 KRaft nodes
(benchmarks/apache_kafka.py). One cluster at a time, so neither pays for the other's idle
CPU. Prints each tool's summary line and the ratios rayk / Kafka; the consumer's rate is
ConsumerPerformance's fetch rate, from the group's first assignment on (its join time is
printed beside it).

    .venv/bin/python benchmarks/java_client_bench.py [--records N] [--skip-kafka]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import ray

import rayk
from rayk.ray_settings import RAY_SYSTEM_CONFIG

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ beside benchmarks/
from tests.jvm_programs import Jvm, build  # noqa: E402

PARTITIONS = 3
TOPICS_TOOL = "org.apache.kafka.tools.TopicCommand"
PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"


def run_tools(jvm: Jvm, bootstrap: str, records: int, record_bytes: int) -> dict[str, float]:
    """Produces then consumes `records` records with Kafka's perf tools; records/s of each."""
    topic = "java-perf"
    jvm.tool(TOPICS_TOOL, "--bootstrap-server", bootstrap, "--create", "--topic", topic, "--partitions", PARTITIONS,
             "--replication-factor", 3, "--config", "min.insync.replicas=2")
    produced = jvm.tool(PRODUCER_PERF, "--topic", topic, "--num-records", records, "--record-size", record_bytes,
                        "--throughput", -1, "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all",
                        timeout_s=600)
    summary = produced.strip().splitlines()[-1]
    print(f"  producer: {summary}")
    produce_rate = float(re.search(r"([\d.]+) records/sec", summary).group(1))
    consumed = jvm.tool(CONSUMER_PERF, "--bootstrap-server", bootstrap, "--topic", topic, "--messages", records,
                        "--timeout", 60_000, timeout_s=600)
    header, values = consumed.strip().splitlines()[-2:]
    fields = dict(zip((h.strip() for h in header.split(",")), (v.strip() for v in values.split(","))))
    print(f"  consumer: {fields['data.consumed.in.nMsg']} records, {float(fields['fetch.nMsg.sec']):,.0f} records/s "
          f"({float(fields['fetch.MB.sec']):.1f} MB/s) once in the group, after joining it in "
          f"{fields['rebalance.time.ms']} ms")
    return {"produce": produce_rate, "consume": float(fields["fetch.nMsg.sec"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--skip-kafka", action="store_true")
    args = parser.parse_args()
    jvm = build()
    results = {}

    print(f"rayk: 3 brokers, RF=3, {args.records:,} x {args.record_bytes} B, acks=all")
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
             _system_config=dict(RAY_SYSTEM_CONFIG))  # brokers at nice 0, as Kafka runs
    with tempfile.TemporaryDirectory() as data_dir:
        # group.initial.rebalance.delay.ms 0, as apache_kafka.py sets it for Kafka
        config = {"listeners": "PLAINTEXT://127.0.0.1:0", "group.initial.rebalance.delay.ms": 0}
        cluster = rayk.start(brokers=3, data_dir=data_dir, config=config, namespace="java-client-bench")
        try:
            results["rayk"] = run_tools(jvm, cluster.bootstrap_servers, args.records, args.record_bytes)
        finally:
            cluster.shutdown()
            ray.shutdown()

    if not args.skip_kafka:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from apache_kafka import VERSION, ApacheKafka  # beside this script

        print(f"Apache Kafka {VERSION}: 3 KRaft nodes, RF=3, min.insync.replicas=2")
        with ApacheKafka(brokers=3, min_insync_replicas=2) as kafka:
            results["kafka"] = run_tools(jvm, kafka.bootstrap_servers, args.records, args.record_bytes)
        for direction in ("produce", "consume"):
            print(f"ratio {direction}: rayk {results['rayk'][direction]:,.0f} / Kafka {results['kafka'][direction]:,.0f}"
                  f" records/s = {results['rayk'][direction] / results['kafka'][direction]:.2f}x")


if __name__ == "__main__":
    main()
