"""Transactional produce against the same producer without transactions, in one run.

A confluent-kafka (librdkafka) producer, acks=all and idempotent (what a transactional
producer is anyway), `batch.size` 1 MiB and `linger.ms` 5, writes `--records` (default
1,000,000) records of 100 B to a 3-partition topic with replication factor 3 and
min.insync.replicas=2: once plainly, once in transactions of `--txn-ms` (100 ms; each
commit waits for the transaction's records, then EndTxn), the two runs alternated
`--rounds` times (3; the best of each kept: this machine is noisy), each on a topic of its
own that is deleted after it. Against rayk's 3 brokers and, in the same run, Apache Kafka's
3 KRaft nodes (benchmarks/apache_kafka.py; `--skip-kafka` leaves it out). Prints records/s
of each and the ratio transactional / plain.

    .venv/bin/python benchmarks/transactions_bench.py [--records N] [--txn-ms MS] [--rounds R] [--skip-kafka]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic

import ray
import rayk
from rayk.ray_settings import RAY_SYSTEM_CONFIG
from kafka_protocol_bench import send_all  # beside this script

PARTITIONS = 3
PRODUCER = {"acks": "all", "enable.idempotence": True, "linger.ms": 5, "batch.size": 1024 * 1024,
            "queue.buffering.max.messages": 1_000_000}


def produce(bootstrap: str, topic: str, records: int, value: bytes, txn_ms: int | None) -> float:
    """Seconds to write `records` (in transactions of `txn_ms` if given), all acknowledged."""
    settings = {"bootstrap.servers": bootstrap, **PRODUCER}
    if txn_ms is None:
        producer = confluent_kafka.Producer(settings)
        start = time.perf_counter()
        send_all(producer, topic, records, value)
        return time.perf_counter() - start
    producer = confluent_kafka.Producer({**settings, "transactional.id": f"bench-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(60)
    txn_end = 0.0

    def next_transaction_when_due(i: int) -> None:
        nonlocal txn_end
        if i % 1000 == 0 and time.perf_counter() >= txn_end:
            if txn_end:
                producer.commit_transaction(60)
            producer.begin_transaction()
            txn_end = time.perf_counter() + txn_ms / 1000

    start = time.perf_counter()
    send_all(producer, topic, records, value, before=next_transaction_when_due)
    producer.commit_transaction(60)
    return time.perf_counter() - start


def measure(name: str, bootstrap: str, create_topic, delete_topic, args: argparse.Namespace) -> dict:
    """Each run writes a topic of its own, deleted after it: on rayk every replica is a
    process, and idle ones left from earlier rounds (~1% of a core each) would slow the
    later rounds down."""
    value = b"x" * args.value_bytes
    warmup = f"bench-warmup-{uuid.uuid4().hex[:6]}"
    create_topic(warmup)
    produce(bootstrap, warmup, min(args.records, 200_000), value, None)  # connections, metadata, a JVM's JIT
    produce(bootstrap, warmup, min(args.records, 50_000), value, args.txn_ms)  # the coordinator's topic and replicas
    delete_topic(warmup)
    best = {"plain": 0.0, "transactional": 0.0}
    for round_ in range(args.rounds):
        for kind, txn_ms in (("plain", None), ("transactional", args.txn_ms)):
            topic = f"bench-{kind}-{round_}-{uuid.uuid4().hex[:6]}"
            create_topic(topic)
            rate = args.records / produce(bootstrap, topic, args.records, value, txn_ms)
            delete_topic(topic)
            best[kind] = max(best[kind], rate)
            print(f"  {name}, round {round_ + 1}: {kind} {rate:,.0f} rec/s", flush=True)
    return {"broker": name, **best, "ratio": best["transactional"] / best["plain"]}


def rayk_row(args: argparse.Namespace) -> dict:
    data_dir = tempfile.mkdtemp(prefix="rayk-bench-")
    config = {"listeners": "PLAINTEXT://127.0.0.1:0", "min.insync.replicas": 2}
    cluster = rayk.start(brokers=3, data_dir=data_dir, config=config, namespace="txn-bench")
    try:
        return measure("rayk, 3 brokers, RF=3", cluster.bootstrap_servers,
                       lambda t: cluster.create_topic(t, num_partitions=PARTITIONS, replication_factor=3),
                       cluster.delete_topic, args)
    finally:
        cluster.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)


def kafka_row(args: argparse.Namespace) -> dict:
    from apache_kafka import VERSION, ApacheKafka  # beside this script

    with ApacheKafka(brokers=3, min_insync_replicas=2, heap_mb=args.kafka_heap_mb) as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})

        def create(topic: str) -> None:
            admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=3,
                                          config={"min.insync.replicas": "2"})])[topic].result(60)

        def delete(topic: str) -> None:
            admin.delete_topics([topic])[topic].result(60)

        return measure(f"Apache Kafka {VERSION}, RF=3", kafka.bootstrap_servers, create, delete, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--txn-ms", type=int, default=100, help="how long each transaction collects records")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-kafka", action="store_true", help="leave Apache Kafka out (it needs Java 17 and Maven)")
    parser.add_argument("--kafka-heap-mb", type=int, default=512)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _system_config=dict(RAY_SYSTEM_CONFIG))  # brokers at nice 0, as Kafka runs
    print(f"{args.records:,} x {args.value_bytes} B, acks=all, idempotent, transactions of {args.txn_ms} ms", flush=True)
    rows = [rayk_row(args)]
    if not args.skip_kafka:
        rows.append(kafka_row(args))
    print("\n| broker | plain, rec/s | transactional, rec/s | transactional / plain |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['broker']} | {r['plain']:,.0f} | {r['transactional']:,.0f} | {r['ratio']:.2f}x |")


if __name__ == "__main__":
    main()
