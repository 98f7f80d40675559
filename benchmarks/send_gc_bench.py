"""What Python's cyclic garbage collector costs `Producer.send()` per record, in the
producer's own process, the ways people call it.

A record's objects live until its batch is acknowledged: long enough to outlive Python's
two young collections, so each full collection walks every record in flight, and a full
collection comes each time the objects that outlived the young ones grow by a quarter
of those kept after the last one. So each object kept per record costs a share of
every full collection, whatever the buffer holds. `send()` keeps none of its own once
a callback is added (see rayk/client/produce_future.py); what is left is the caller's.
The cases, one run, one cluster (3 brokers, RF=3, acks=all, 100 B records):

1. `add_done_callback` with one callable for every record: no object kept per record;
   and the same callable given to `send` itself (`callback=`), which takes no lock;
2. a `functools.partial` per record given to `send` (what `rayk perf`, `run_produce_perf`,
   does to time each record): one object per record, as confluent-kafka's `on_delivery`
   with a lambda per record;
3. every future kept in a list and read at the end (kafka-python's idiom);
4. case 2 after `gc.freeze()`, which takes the objects of everything imported so far out
   of every later collection (Python's own advice for a process that is done importing).

Per case: records/s, the process's CPU per record, and the time in the collector per
record (from `gc.callbacks`). Run it on an older commit (PYTHONPATH) for the figures
before. It prints figures and asserts nothing.

    .venv/bin/python benchmarks/send_gc_bench.py [--records N]
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import ray

import rayk
from rayk.perf import run_produce_perf
from scratch import scratch_dir  # noqa: E402  (beside this script)

RECORD_BYTES = 100


class CollectorClock:
    """Seconds spent in each generation's collections, and how many, while installed."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[int] = collections.Counter()
        self.count: collections.Counter[int] = collections.Counter()
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started
            self.count[info["generation"]] += 1


def measured(what: str, records: int, run: Callable[[], None]) -> None:
    clock = CollectorClock()
    gc.callbacks.append(clock)
    cpu_s, wall_s = time.process_time(), time.perf_counter()
    try:
        run()
    finally:
        gc.callbacks.remove(clock)
    cpu_s, wall_s = time.process_time() - cpu_s, time.perf_counter() - wall_s
    collector_s = sum(clock.seconds.values())
    print(f"{what:<52} {records / wall_s:>10,.0f} {cpu_s / records * 1e6:>8.2f} {collector_s / records * 1e6:>9.2f}"
          f" {clock.count[2]:>5} {1000 * clock.seconds[2] / max(clock.count[2], 1):>8.1f}")


def one_callable(cluster: Any, topic: str, records: int) -> None:
    producer = cluster.producer(acks="all")
    outcomes: collections.Counter[bool] = collections.Counter()

    def on_done(future: Any) -> None:  # one function for every record
        outcomes[future.exception() is None] += 1

    payload = os.urandom(RECORD_BYTES)
    for _ in range(records):
        producer.send(topic, payload).add_done_callback(on_done)
    producer.flush()
    producer.close()
    assert outcomes == {True: records}, outcomes


def one_callable_given_to_send(cluster: Any, topic: str, records: int) -> None:
    producer = cluster.producer(acks="all")
    outcomes: collections.Counter[bool] = collections.Counter()

    def on_done(future: Any) -> None:
        outcomes[future.exception() is None] += 1

    payload = os.urandom(RECORD_BYTES)
    for _ in range(records):
        producer.send(topic, payload, callback=on_done)
    producer.flush()
    producer.close()
    assert outcomes == {True: records}, outcomes


def futures_kept(cluster: Any, topic: str, records: int) -> None:
    producer = cluster.producer(acks="all")
    payload = os.urandom(RECORD_BYTES)
    futures = [producer.send(topic, payload) for _ in range(records)]
    producer.flush()
    for future in futures:
        future.get(0)
    producer.close()


def partial_per_record(cluster: Any, topic: str, records: int) -> None:
    figures = run_produce_perf(cluster, topic, records, RECORD_BYTES, progress=False)
    assert not figures["errors"], figures["first_error"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000, help="records per case; default 300,000")
    args = parser.parse_args()
    namespace = f"rayk-bench-{uuid.uuid4().hex[:8]}"
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, namespace=namespace,
             log_to_driver=False)
    cluster = rayk.start(brokers=3, data_dir=Path(scratch_dir(prefix="rayk-send-gc-")), namespace=namespace)
    try:
        topic = "send-gc"
        cluster.create_topic(topic, 3, 3, {"min.insync.replicas": "2"})
        partial_per_record(cluster, topic, 20_000)  # warm-up: connections, metadata
        print(f"{args.records:,} records of {RECORD_BYTES} B per case; load average {os.getloadavg()[0]:.2f};"
              f" {len(gc.get_objects()):,} objects tracked by the collector before the first")
        print(f"{'case':<52} {'rec/s':>10} {'CPU us':>8} {'GC us':>9} {'fulls':>5} {'ms each':>8}")
        cases = [
            ("1. add_done_callback, one callable for all", one_callable),
            ("1b. send(callback=), one callable for all", one_callable_given_to_send),
            ("2. send(callback=), a partial per record", partial_per_record),
            ("3. every future kept, read at the end", futures_kept),
        ]
        for what, case in cases:
            measured(what, args.records, functools.partial(case, cluster, topic, args.records))
        gc.collect()
        gc.freeze()
        measured("4. case 2 after gc.freeze()", args.records, functools.partial(partial_per_record, cluster, topic, args.records))
        gc.unfreeze()
        print("(CPU and GC: microseconds per record in this process; fulls: full collections, and their mean ms)")
    finally:
        cluster.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
