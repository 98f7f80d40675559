"""Client benchmark: rayk's Producer and Consumer (acks=all, RF=3) against the same records
through `ray.util.queue.Queue`, what a Ray user would reach for instead, in the same run.

Run:  python benchmarks/client_bench.py [--quick] [--records N] [--partitions N]

Everything runs on this machine: a local Ray instance (include_dashboard=False, a Ray
namespace of its own), `rayk.start(brokers=3)` with its data directory in a temporary
directory removed at the end, then `cluster.shutdown()` and `ray.shutdown()`. Nothing here
asserts anything about speed: the script prints figures, and you judge them.

What it measures
----------------
1. rayk produce: one `cluster.producer(acks="all")` (defaults otherwise: batch_size 16 KiB,
   linger_ms 5, buffer_memory 32 MiB) sends `--records` records of 100 random bytes, no
   key, to a topic of `--partitions` partitions (default 3), replication factor 3,
   min.insync.replicas 2, as fast as `send()` takes them (rayk.perf.run_produce_perf).
   Latency: from `send()` until the record's future completes, i.e. the leader answered
   after every in-sync replica had the batch.
2. rayk consume: one `cluster.consumer()` assigned every partition reads them all from the
   beginning (rayk.perf.run_consume_perf). Latency: the moment a record is returned by
   `poll()` minus its timestamp (set at `send()`), so it includes the wait behind the
   produce run's backlog: read the rate, not this latency, for the consumer.
3. Queue, one record per call: `queue.put(record)` and later `queue.get()`, the
   straightforward use; `--queue-single` records (default 5,000), as it is slow.
4. Queue, batched: records gathered into lists the size of a full rayk batch (as many
   100-byte records as fit in 16 KiB) and sent with `queue.put_nowait_batch(list)`; read
   back with `queue.get_nowait_batch(500)` (500 = the consumer's max_poll_records).
   Produce latency: from when a record joined its list until `put_nowait_batch` returned.
   Consume latency: as in 2, from a timestamp carried in each item.

The ratios at the end are rayk's records/s over the Queue's. What they compare is not
like for like in what you get: rayk writes each record to three replicas' logs on disk
(page cache; no fsync per write, as in Kafka) and acknowledges it only once it is
replicated, keeps it after it is read (any number of consumers, replay by offset), and
survives the loss of a broker; a Queue holds records in one actor's memory, once, until a
single reader takes them, and loses them if that actor dies.
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
from rayk.perf import MB, format_summary, throughput_figures, run_consume_perf, run_produce_perf  # noqa: E402

RECORD_BYTES = 100
BROKERS = 3
REPLICATION_FACTOR = 3
MIN_INSYNC = 2
BATCH_SIZE = 16384  # the producer's default batch_size
QUEUE_BATCH_RECORDS = (BATCH_SIZE - 61) // (RECORD_BYTES + 8)
POLL_RECORDS = 500  # the consumer's max_poll_records

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


def rayk_produce_consume(cluster: Any, records: int, partitions: int) -> tuple[dict[str, Any], dict[str, Any]]:
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions, REPLICATION_FACTOR, {"min.insync.replicas": str(MIN_INSYNC)})
    produced = run_produce_perf(cluster, topic, records, RECORD_BYTES, acks="all", progress=False)
    if produced["errors"]:
        raise SystemExit(f"{produced['errors']} records failed: {produced['first_error']}")
    consumed = run_consume_perf(cluster, topic, records, progress=False)
    if consumed["timed_out"]:
        raise SystemExit(f"the consumer read only {consumed['records']} of {records} records")
    return produced, consumed


def show(title: str, figures: dict[str, Any]) -> None:
    print(f"\n{title}")
    print("  " + format_summary(figures).replace("\n", "\n  "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30,000 records, 2,000 one by one (well under a minute)")
    parser.add_argument("--records", type=int, default=None, help="records for rayk and the batched Queue; default 300,000")
    parser.add_argument("--queue-single", type=int, default=None, help="records put one by one; default 5,000")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the topic; default 3")
    args = parser.parse_args()
    records = args.records or (30_000 if args.quick else 300_000)
    single = args.queue_single or (2_000 if args.quick else 5_000)
    if min(records, single, args.partitions) < 1:
        parser.error("--records, --queue-single and --partitions must be positive")
    payload = os.urandom(RECORD_BYTES)

    print("rayk client benchmark" + (" (--quick)" if args.quick else ""))
    print(f"machine: {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, Python {platform.python_version()}, "
          f"Ray {ray.__version__}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{records:,} records of {RECORD_BYTES} B; topic of {args.partitions} partitions, RF={REPLICATION_FACTOR}, "
          f"acks=all, min.insync.replicas={MIN_INSYNC}; Queue batches of {QUEUE_BATCH_RECORDS} records")
    data_dir = tempfile.mkdtemp(prefix="rayk-client-bench-")
    namespace = f"rayk-bench-{uuid.uuid4().hex[:8]}"
    cluster = None
    try:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, namespace=namespace, log_to_driver=False)
        cluster = rayk.start(brokers=BROKERS, data_dir=Path(data_dir) / "cluster", namespace=namespace)
        rayk_p, rayk_c = rayk_produce_consume(cluster, records, args.partitions)
        show("rayk produce (Producer, acks=all, RF=3)", rayk_p)
        show("rayk consume (Consumer, every partition, from the beginning)", rayk_c)
        batched_p, batched_c = queue_batched(records, payload)
        show(f"Queue.put_nowait_batch ({QUEUE_BATCH_RECORDS} records per call)", batched_p)
        show(f"Queue.get_nowait_batch({POLL_RECORDS})", batched_c)
        single_p, single_c = queue_single(single, payload)
        show("Queue.put, one record per call", single_p)
        show("Queue.get, one record per call", single_c)
    finally:
        if cluster is not None:
            cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)

    print("\nratios, rayk records/s over Queue records/s (in this run):")
    for what, ours, batched, one in (
        ("produce", rayk_p, batched_p, single_p),
        ("consume", rayk_c, batched_c, single_c),
    ):
        print(f"  {what}: {ours['records_per_s'] / batched['records_per_s']:.2f}x the batched Queue, "
              f"{ours['records_per_s'] / one['records_per_s']:.1f}x the one-by-one Queue "
              f"({ours['records_per_s']:,.0f} vs {batched['records_per_s']:,.0f} vs {one['records_per_s']:,.0f} rec/s; "
              f"{ours['mb_per_s']:.2f} vs {batched['mb_per_s']:.2f} MB/s of values, 1 MB = {MB:,} B)")


if __name__ == "__main__":
    main()
