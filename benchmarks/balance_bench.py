"""Balance benchmark: how long a new broker takes its share of a cluster's partitions and
bytes, and what producers and consumers get while it does, against before it joined.

Run:  PYTHONPATH=. python benchmarks/balance_bench.py [--partitions 12] [--preload-mib 4]
          [--measure-s 20] [--record-bytes 1000] [--rate 3000] [--throttle BYTES_PER_S]

Everything runs on this machine: a local Ray instance and `rayk.start(brokers=3)` (rayk's
own clients, no Kafka listener) in a temporary directory removed at the end. A topic of
`--partitions` partitions x RF 3 (min.insync.replicas 2) gets `--preload-mib` MiB per
partition first. Then one idempotent acks=all producer offers `--rate` records/s of
`--record-bytes` (0: without pause), round-robin over the partitions, and one consumer
group member reads them; both run in this process, each in a thread of its own.

1. Before: acknowledged and consumed records/s, and the p50/p99 acknowledgement latency
   of every tenth record, over `--measure-s` seconds.
2. A fourth broker joins (a new broker id on this node, as Cluster.add_broker starts one);
   the balancer moves replicas to it, `balancer.max.concurrent.moves.per.broker` (5) at a
   time, and elects preferred leaders. Measured: seconds from its start until every
   broker's replicas and leaders are within 1 of the mean with nothing moving (the
   share of partitions), until its log bytes (as its replicas last checkpointed them)
   reach its share of the cluster's bytes (total / 4, within 10%), and the records/s
   acknowledged and consumed over that time.
3. After: the same rates over `--measure-s` seconds on the four brokers.
With `--throttle`, leader.replication.throttled.rate and follower.replication.throttled.rate
are set to that many bytes/s. Nothing here asserts anything about speed: it prints
figures side by side. Absolute figures on a shared 2-core machine are noise; compare
the columns of one run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections import Counter
from typing import Any

import ray

import rayk
from tests.cluster_helpers import balanced, placement, start_new_broker

CONFIG = {
    "listeners": "",
    "broker.session.timeout.ms": 8000,
    "broker.heartbeat.interval.ms": 400,
    "offsets.topic.num.partitions": 1,
    "group.initial.rebalance.delay.ms": 0,
    "replica.high.watermark.checkpoint.interval.ms": 1000,
}
TOPIC = "bench"
RAY_START_ATTEMPTS = 3
SEND_TICK_MS = 10  # the producer sends rate / 100 records every 10 ms
LATENCY_SAMPLE_EVERY = 10  # records whose acknowledgement latency is noted


class Load:
    """A producer sending at `rate_per_s` (0: without pause) and a consumer group member
    reading; counts both, and samples the acknowledgement latency of every tenth record."""

    def __init__(self, cluster: Any, partitions: int, record_bytes: int, rate_per_s: int) -> None:
        self.acked = 0
        self.consumed = 0
        self.failed: Counter[str] = Counter()
        self.latencies: list[tuple[float, float]] = []  # (acknowledged at, ms) of sampled records
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._value = b"v" * record_bytes
        self._partitions = partitions
        self._rate_per_s = rate_per_s
        self.producer = cluster.producer(acks="all", linger_ms=5, delivery_timeout_ms=120_000)
        self.consumer = cluster.consumer(TOPIC, group_id="bench-readers", auto_offset_reset="latest")
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _done(self, future: Any, sent_at: float | None) -> None:
        error = future.exception()
        now = time.monotonic()
        with self._lock:
            if error is None:
                self.acked += 1
                if sent_at is not None:
                    self.latencies.append((now, (now - sent_at) * 1000))
            else:
                self.failed[getattr(error, "name", type(error).__name__)] += 1

    def _produce(self) -> None:
        i = 0
        tick_s = SEND_TICK_MS / 1000
        per_tick = max(1, int(self._rate_per_s * tick_s))
        next_s = time.monotonic()
        while not self._halt.is_set():
            for _ in range(per_tick if self._rate_per_s else 1):
                sent_at = time.monotonic() if i % LATENCY_SAMPLE_EVERY == 0 else None
                future = self.producer.send(TOPIC, value=self._value, partition=i % self._partitions)
                future.add_done_callback(lambda f, t=sent_at: self._done(f, t))
                i += 1
            if self._rate_per_s:
                next_s += tick_s
                time.sleep(max(0.0, next_s - time.monotonic()))

    def _consume(self) -> None:
        while not self._halt.is_set():
            n = sum(len(records) for records in self.consumer.poll(timeout_ms=200).values())
            with self._lock:
                self.consumed += n

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.acked, self.consumed

    def latency_ms(self, since_s: float, until_s: float) -> tuple[float, float]:
        """(p50, p99) of the sampled acknowledgements in [since_s, until_s]."""
        with self._lock:
            window = sorted(ms for at, ms in self.latencies if since_s <= at <= until_s)
        if not window:
            return float("nan"), float("nan")
        return window[len(window) // 2], window[min(len(window) - 1, int(len(window) * 0.99))]

    def stop(self) -> None:
        self._halt.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self.producer.close()
        self.consumer.close()


def rates(load: Load, seconds: float, until: Any = None) -> tuple[float, float, float, float, float]:
    """(acked/s, consumed/s, seconds, p50 ms, p99 ms) over `seconds`, or until `until()` is true."""
    acked0, consumed0 = load.counts()
    started = time.monotonic()
    while time.monotonic() - started < seconds if until is None else not until():
        time.sleep(0.25)
    ended = time.monotonic()
    acked1, consumed1 = load.counts()
    elapsed = ended - started
    return ((acked1 - acked0) / elapsed, (consumed1 - consumed0) / elapsed, elapsed, *load.latency_ms(started, ended))


def bytes_per_broker(cluster: Any, brokers: int) -> dict[int, int]:
    sizes = {}
    for b in range(brokers):
        manager = cluster.broker(b)
        sizes[b] = sum(ray.get(manager.log_sizes.remote()).values()) if manager is not None else 0
    return sizes


def preload(cluster: Any, partitions: int, mib: int, record_bytes: int) -> None:
    producer = cluster.producer(acks="all", linger_ms=20)
    value = os.urandom(record_bytes)  # incompressible, not that rayk compresses by default
    for i in range(partitions * mib * 2**20 // record_bytes):
        producer.send(TOPIC, value=value, partition=i % partitions)
    producer.flush(600)
    producer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--preload-mib", type=int, default=4, help="MiB per partition before the traffic")
    parser.add_argument("--measure-s", type=float, default=20)
    parser.add_argument("--record-bytes", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=3000, help="records/s the producer offers (0: without pause)")
    parser.add_argument("--throttle", type=int, default=0, help="replication throttle, bytes/s per broker (0: none)")
    args = parser.parse_args()
    config = dict(CONFIG)
    if args.throttle:
        config |= {"leader.replication.throttled.rate": args.throttle, "follower.replication.throttled.rate": args.throttle}
    for attempt in range(RAY_START_ATTEMPTS):  # a node start times out on a machine others load heavily
        try:
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                     namespace="balance-bench")
            break
        except Exception as e:
            if attempt == RAY_START_ATTEMPTS - 1:
                raise
            print(f"ray.init failed ({e}); again")
    with tempfile.TemporaryDirectory(prefix="balance-bench-") as data_dir:
        cluster = rayk.start(brokers=3, data_dir=data_dir, config=config, namespace="balance-bench")
        try:
            run(cluster, args)
        finally:
            cluster.shutdown()
            ray.shutdown()


def run(cluster: Any, args: argparse.Namespace) -> None:
    cluster.create_topic(TOPIC, num_partitions=args.partitions, replication_factor=3, config={"min.insync.replicas": "2"})
    started = time.monotonic()
    preload(cluster, args.partitions, args.preload_mib, args.record_bytes)
    print(f"preloaded {args.partitions} x {args.preload_mib} MiB in {time.monotonic() - started:.1f} s")
    load = Load(cluster, args.partitions, args.record_bytes, args.rate)
    try:
        deadline = time.monotonic() + 120
        while load.counts()[1] == 0 and time.monotonic() < deadline:
            time.sleep(0.5)  # the group joined and reads
        before = rates(load, args.measure_s)
        joined = time.monotonic()
        start_new_broker(cluster, 3)
        shares: dict[str, float] = {}

        def done() -> bool:
            now = time.monotonic() - joined
            if "partitions" not in shares and balanced(cluster, 4):
                shares["partitions"] = now
            if "bytes" not in shares:
                sizes = bytes_per_broker(cluster, 4)
                if sizes[3] >= 0.9 * sum(sizes.values()) / 4:
                    shares["bytes"] = now
                    shares["bytes moved"] = sizes[3]
            return len(shares) == 3 or now > 600

        during = rates(load, 0, until=done)
        after = rates(load, args.measure_s)
    finally:
        load.stop()
    replicas, leaders, _ = placement(cluster)
    sizes = bytes_per_broker(cluster, 4)
    print(f"\nbroker 3 took its share of partitions in {shares.get('partitions', float('nan')):.1f} s and of bytes "
          f"in {shares.get('bytes', float('nan')):.1f} s ({shares.get('bytes moved', 0) / 2**20:.1f} MiB; throttle "
          f"{args.throttle or 'none'} B/s); replicas {dict(sorted(replicas.items()))}, leaders {dict(sorted(leaders.items()))}, "
          f"MiB {{{', '.join(f'{b}: {s / 2**20:.1f}' for b, s in sorted(sizes.items()))}}}")
    print(f"\n{'':28}{'before (3 brokers)':>20}{'during the move':>20}{'after (4 brokers)':>20}")
    print(f"{'seconds':28}{before[2]:>20.1f}{during[2]:>20.1f}{after[2]:>20.1f}")
    print(f"{'acked records/s':28}{before[0]:>20.0f}{during[0]:>20.0f}{after[0]:>20.0f}")
    print(f"{'consumed records/s':28}{before[1]:>20.0f}{during[1]:>20.0f}{after[1]:>20.0f}")
    print(f"{'ack latency p50 ms':28}{before[3]:>20.1f}{during[3]:>20.1f}{after[3]:>20.1f}")
    print(f"{'ack latency p99 ms':28}{before[4]:>20.1f}{during[4]:>20.1f}{after[4]:>20.1f}")
    if load.failed:
        print(f"failed sends: {dict(load.failed)}")


if __name__ == "__main__":
    main()
