"""Producer and consumer throughput/latency tests, in the style of Kafka's
kafka-producer-perf-test and kafka-consumer-perf-test.

`run_produce_perf` sends `num_records` records of `record_size` bytes as fast as the
producer takes them (or at a target rate) and measures each record's latency (or every
K-th record's: `latency_sample_every`) from `send()` until its future completes. The
producer blocks `send()` while `buffer_memory` bytes wait for acknowledgement (Kafka's
buffer.memory), so the latencies describe a steady pipeline rather than an ever-growing
queue.

`run_produce_batch_perf` does the same through `Producer.send_batch`, `batch_records`
records a call (the columnar path of Ray users: arrays and Arrow in); a record's latency
is from its call until the call's future completes.

`run_consume_perf` reads `messages` records of a topic from the beginning (alone, or as a
member of a consumer group) and measures the end-to-end latency of each record: the time
it is consumed minus its timestamp.

Both draw a one-line progress bar on stderr while they run and return a dict of figures
(`records`, `records_per_s`, `mb_per_s`, `latency_*_ms`, ...) that `format_summary` turns
into a two-line table; `rayk perf` and `rayk demo` use them, and so can a benchmark.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from rayk.client.producer import DEFAULT_LINGER_MS
from rayk.client.types import ConsumerRecord, TopicPartition

MB = 1024 * 1024
DEFAULT_BUFFER_MEMORY = 32 * MB  # Kafka's buffer.memory
PERCENTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("p99.9", 0.999))

RecordFn = Callable[[int], tuple[bytes | None, bytes]]  # record number -> (key, value)
ColumnsFn = Callable[[int, int], tuple[Any, Any]]  # (first record, count) -> (keys or None, values): columns


# ---------------------------------------------------------------------------- progress bar


class Progress:
    """A live one-line progress bar: `label [#####-----] done/total  pct%  rate rec/s`.

    A daemon thread redraws it every `interval_s` from `count()`, with a carriage return,
    so it keeps moving while the caller blocks (in a flush, a poll, ...).
    """

    WIDTH = 24

    def __init__(
        self, label: str, total: int, count: Callable[[], int], stream: TextIO | None = None, interval_s: float = 0.2
    ) -> None:
        self.label, self.total, self._count = label, total, count
        self._stream = stream if stream is not None else sys.stderr
        self._interval_s = interval_s
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rayk-progress", daemon=True)

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._draw()
        self._stream.write("\n")
        self._stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._draw()

    def _draw(self) -> None:
        done = self._count()
        fraction = min(1.0, done / self.total) if self.total else 1.0
        filled = int(fraction * self.WIDTH)
        rate = done / max(time.monotonic() - self._start, 1e-9)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        percent = int(1000 * fraction) / 10  # rounded down: 100.0% only when done
        self._stream.write(f"\r{self.label} [{bar}] {done:,}/{self.total:,} {percent:5.1f}% {rate:,.0f} rec/s   ")
        self._stream.flush()


class _NoProgress:
    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _progress(enabled: bool, label: str, total: int, count: Callable[[], int]) -> Progress | _NoProgress:
    return Progress(label, total, count) if enabled else _NoProgress()


# ---------------------------------------------------------------------------- figures


def latency_figures(latencies_ms: list[float]) -> dict[str, float]:
    """avg, p50, p95, p99, p99.9 and max of a list of latencies (it gets sorted in place)."""
    if not latencies_ms:
        return {f"latency_{name}_ms": 0.0 for name in ("avg", *(p for p, _ in PERCENTILES), "max")}
    latencies_ms.sort()
    n = len(latencies_ms)
    out = {"latency_avg_ms": sum(latencies_ms) / n}
    for name, q in PERCENTILES:
        out[f"latency_{name}_ms"] = latencies_ms[min(n - 1, int(q * n))]
    out["latency_max_ms"] = latencies_ms[-1]
    return out


def throughput_figures(records: int, total_bytes: int, elapsed_s: float, latencies_ms: list[float]) -> dict[str, Any]:
    elapsed_s = max(elapsed_s, 1e-9)
    return {
        "records": records,
        "bytes": total_bytes,
        "elapsed_s": elapsed_s,
        "records_per_s": records / elapsed_s,
        "mb_per_s": total_bytes / MB / elapsed_s,
        **latency_figures(latencies_ms),
    }


SUMMARY_COLUMNS = (
    ("records", "records", "{:d}"),
    ("records/s", "records_per_s", "{:.1f}"),
    ("MB/s", "mb_per_s", "{:.2f}"),
    ("avg ms", "latency_avg_ms", "{:.2f}"),
    ("p50 ms", "latency_p50_ms", "{:.2f}"),
    ("p95 ms", "latency_p95_ms", "{:.2f}"),
    ("p99 ms", "latency_p99_ms", "{:.2f}"),
    ("p99.9 ms", "latency_p99.9_ms", "{:.2f}"),
    ("max ms", "latency_max_ms", "{:.2f}"),
)


def format_summary(figures: dict[str, Any]) -> str:
    """A two-line table: column names, then the figures."""
    cells = [(title, fmt.format(figures[key])) for title, key, fmt in SUMMARY_COLUMNS]
    widths = [max(len(title), len(value)) for title, value in cells]
    header = "  ".join(title.rjust(w) for (title, _), w in zip(cells, widths))
    values = "  ".join(value.rjust(w) for (_, value), w in zip(cells, widths))
    return f"{header}\n{values}"


# ---------------------------------------------------------------------------- produce


def _throttle(start: float, sent: int, throughput: float) -> None:
    """Sleeps while `sent` records are ahead of `throughput` records/s (Kafka's ThroughputThrottler)."""
    ahead_s = start + sent / throughput - time.perf_counter()
    if ahead_s > 0.001:
        time.sleep(ahead_s)


def run_produce_perf(
    cluster: Any,
    topic: str,
    num_records: int,
    record_size: int = 100,
    *,
    acks: str | int = "all",
    throughput: float = -1,
    batch_size: int = 1_048_576,
    linger_ms: int = DEFAULT_LINGER_MS,
    buffer_memory: int = DEFAULT_BUFFER_MEMORY,
    record_fn: RecordFn | None = None,
    progress: bool = True,
    label: str = "produce",
    warm_up: bool = False,
    latency_sample_every: int = 1,
    **producer_settings: Any,
) -> dict[str, Any]:
    """Produces `num_records` records and returns the figures (see the module docstring).

    Records are a fixed random payload of `record_size` bytes without a key, unless
    `record_fn(i)` gives record i's (key, value). `throughput` > 0 caps the send rate in
    records/s. `warm_up` first sends one more record to each partition and waits for them,
    uncounted: a process's first call to an actor sets up its connection (~0.3 s here),
    which is not what a latency at a steady rate is about. The dict also holds `errors`
    (records that failed) and `first_error`.

    Every record gets a callback (`send(..., callback=)`) that keeps its error, if any.
    `latency_sample_every` = K times only every K-th record (Kafka's ProducerPerformance
    samples what it keeps too): taking the time and binding it to a callback costs more
    per record than `send()`'s own bookkeeping, which a throughput comparison with a
    client whose harness does not time each record should not count against rayk
    (benchmarks/client_bench.py).
    """
    if latency_sample_every < 1:
        raise ValueError(f"latency_sample_every must be >= 1, got {latency_sample_every}")
    partitions = len(cluster.describe_topic(topic))  # UNKNOWN_TOPIC_OR_PARTITION before anything else
    payload = os.urandom(record_size)
    outcomes = _ProduceOutcomes(num_records, latency_sample_every)
    producer = cluster.producer(
        acks=acks, batch_size=batch_size, linger_ms=linger_ms, buffer_memory=buffer_memory, **producer_settings
    )
    try:
        if warm_up:
            for future in [producer.send(topic, payload, partition=p) for p in range(partitions)]:
                future.get(60)
        with _progress(progress, label, num_records, outcomes.completed):
            start = time.perf_counter()
            total_bytes = _send_all(producer, topic, num_records, payload, record_fn, throughput, outcomes, start)
            producer.flush()
            elapsed_s = time.perf_counter() - start
    finally:
        producer.close()
    latencies_ms, errors = outcomes.latencies_ms, outcomes.errors
    figures = throughput_figures(num_records - len(errors), total_bytes, elapsed_s, latencies_ms)  # flush waited for all
    figures["latency_samples"] = len(latencies_ms)
    figures["errors"] = len(errors)
    figures["first_error"] = str(errors[0]) if errors else None
    return figures


class _ProduceOutcomes:
    """What became of run_produce_perf's records: the latencies of the timed ones (every
    `sample_every`-th) and the errors of all. Futures' callbacks add to it from the
    producer's threads; list.append is atomic."""

    def __init__(self, num_records: int, sample_every: int) -> None:
        self.latencies_ms: list[float] = []
        self.errors: list[BaseException] = []
        self._num_records = num_records
        self.sample_every = sample_every

    def completed(self) -> int:
        """For the progress bar (exact when every record is timed)."""
        return min(self._num_records, len(self.latencies_ms) * self.sample_every + len(self.errors))

    def on_done(self, future: Any) -> None:
        error = future.exception()
        if error is not None:
            self.errors.append(error)

    def on_timed(self, sent_at: float, future: Any) -> None:
        if future.exception() is None:
            self.latencies_ms.append((time.perf_counter() - sent_at) * 1000)
        self.on_done(future)


def _send_all(
    producer: Any, topic: str, num_records: int, payload: bytes, record_fn: RecordFn | None, throughput: float,
    outcomes: _ProduceOutcomes, start: float,
) -> int:
    """Sends the records (at most `throughput` a second from `start`, if > 0), each with
    its callback; returns their bytes."""
    total_bytes = 0
    sample_every, on_done, on_timed = outcomes.sample_every, outcomes.on_done, outcomes.on_timed  # bound once, not per record
    for i in range(num_records):
        if throughput > 0:
            _throttle(start, i, throughput)
        key, value = record_fn(i) if record_fn is not None else (None, payload)
        total_bytes += len(value) + (len(key) if key else 0)
        if i % sample_every:
            producer.send(topic, value, key=key, callback=on_done)
        else:
            producer.send(topic, value, key=key, callback=functools.partial(on_timed, time.perf_counter()))
    return total_bytes


# ---------------------------------------------------------------------------- consume


def _open_consumer(cluster: Any, topic: str, partitions: int, group: str | None) -> Any:
    """A consumer of every partition of `topic` from the beginning: in `group`, or alone."""
    if group is not None:
        return cluster.consumer(topic, group_id=group, auto_offset_reset="earliest")
    consumer = cluster.consumer(auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    return consumer


def run_produce_batch_perf(
    cluster: Any,
    topic: str,
    num_records: int,
    record_size: int = 100,
    *,
    batch_records: int = 10_000,
    acks: str | int = "all",
    throughput: float = -1,
    columns_fn: ColumnsFn | None = None,
    progress: bool = True,
    label: str = "produce",
    **producer_settings: Any,
) -> dict[str, Any]:
    """Produces `num_records` records with `send_batch` calls of `batch_records` records;
    returns the figures of `run_produce_perf`. Records are a fixed random payload of
    `record_size` bytes without a key, unless `columns_fn(first, count)` gives the
    (keys, values) columns of records first..first+count-1."""
    import numpy as np

    if batch_records < 1:
        raise ValueError(f"batch_records must be >= 1, not {batch_records}")
    cluster.describe_topic(topic)  # UNKNOWN_TOPIC_OR_PARTITION before anything else
    payload = np.frombuffer(os.urandom(record_size), dtype=np.uint8)
    acknowledged: list[tuple[float, int]] = []  # (latency ms, records) per call
    errors: list[tuple[BaseException, int]] = []

    def completed() -> int:
        return sum(n for _, n in acknowledged) + sum(n for _, n in errors)

    def on_done(sent_at: float, count: int, future: Any) -> None:
        error = future.exception()
        if error is None:
            acknowledged.append(((time.perf_counter() - sent_at) * 1000, count))
        else:
            errors.append((error, count))

    producer = cluster.producer(acks=acks, **producer_settings)
    total_bytes = 0
    try:
        with _progress(progress, label, num_records, completed):
            start = time.perf_counter()
            for first in range(0, num_records, batch_records):
                count = min(batch_records, num_records - first)
                if throughput > 0:
                    _throttle(start, first, throughput)
                if columns_fn is not None:
                    keys, values = columns_fn(first, count)
                else:
                    keys, values = None, np.broadcast_to(payload, (count, record_size))
                total_bytes += _column_bytes(values) + (_column_bytes(keys) if keys is not None else 0)
                future = producer.send_batch(topic, values, keys=keys)
                future.add_done_callback(functools.partial(on_done, time.perf_counter(), count))
            producer.flush()
            elapsed_s = time.perf_counter() - start
    finally:
        producer.close()
    latencies_ms = np.repeat([ms for ms, _ in acknowledged], [n for _, n in acknowledged]).tolist()
    figures = throughput_figures(len(latencies_ms), total_bytes, elapsed_s, latencies_ms)
    figures["errors"] = sum(n for _, n in errors)
    figures["first_error"] = str(errors[0][0]) if errors else None
    return figures


def _column_bytes(column: Any) -> int:
    """The payload bytes of a column given to send_batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, np.ndarray) and column.dtype == np.uint8:
        return int(column.nbytes)
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        return int(pc.sum(pc.binary_length(column)).as_py() or 0)
    return sum(len(v) for v in column if v is not None)


def run_consume_perf(
    cluster: Any,
    topic: str,
    messages: int,
    *,
    group: str | None = None,
    timeout_ms: int = 10_000,
    join_timeout_ms: int = 120_000,
    on_record: Callable[[ConsumerRecord], None] | None = None,
    progress: bool = True,
    label: str = "consume",
) -> dict[str, Any]:
    """Consumes `messages` records of `topic` from the beginning and returns the figures.

    Stops early when no record arrives for `timeout_ms` once the consumer has its
    partitions and knows where to start in each (the dict then has `timed_out` True);
    joining the group and those lookups may take longer (up to `join_timeout_ms`), e.g.
    while the first group creates __consumer_offsets. `on_record` sees every record
    consumed. Latency is end to end: when the record was consumed minus its timestamp. The rates count from the start, which includes
    joining the group; `first_record_s` is how long the first record took and the
    `fetch_*` rates count from then on (Kafka's fetch.MB.sec and fetch.nMsg.sec).
    """
    partitions = len(cluster.describe_topic(topic))  # UNKNOWN_TOPIC_OR_PARTITION before anything else
    consumer = _open_consumer(cluster, topic, partitions, group)
    run = _ConsumeRun(consumer, messages, on_record)
    try:
        with _progress(progress, label, messages, lambda: len(run.latencies_ms)):
            run.run(timeout_ms, join_timeout_ms)
    finally:
        consumer.close()
    return run.figures()


class _ConsumeRun:
    """One run of run_consume_perf: it polls until it has `messages` records or was idle
    too long, and keeps each record's end-to-end latency and when records came."""

    def __init__(self, consumer: Any, messages: int, on_record: Callable[[ConsumerRecord], None] | None) -> None:
        self._consumer, self._messages, self._on_record = consumer, messages, on_record
        self.latencies_ms: list[float] = []
        self.total_bytes = 0
        self.start = self.last_record_at = time.perf_counter()
        self.first_record_at: float | None = None

    def run(self, timeout_ms: int, join_timeout_ms: int) -> None:
        self.start = self.last_record_at = time.perf_counter()
        positioned = False
        while len(self.latencies_ms) < self._messages:
            if self.first_record_at is None and not positioned:
                # Still joining, or looking up where to start (the group's committed
                # offsets, or the reset): setting up, not idle yet.
                positioned = self._positioned()
                self.last_record_at = time.perf_counter()
                if (self.last_record_at - self.start) * 1000 >= join_timeout_ms:
                    break
            idle_s = time.perf_counter() - self.last_record_at
            if idle_s * 1000 >= timeout_ms:
                break
            polled = self._consumer.poll(
                timeout_ms=int(min(1000, timeout_ms - idle_s * 1000)) + 1,
                max_records=self._messages - len(self.latencies_ms),
            )
            if polled:
                self._take(polled)

    def _positioned(self) -> bool:
        """Whether the consumer has its partitions, each with its position looked up."""
        assigned = self._consumer.assignment()
        for tp in assigned:
            self._consumer.position(tp)
        return bool(assigned)

    def _take(self, polled: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        now_ms = time.time() * 1000
        self.last_record_at = time.perf_counter()
        self.first_record_at = self.first_record_at or self.last_record_at
        for records in polled.values():
            for record in records:
                self.latencies_ms.append(now_ms - record.timestamp)
                self.total_bytes += max(record.serialized_value_size, 0) + max(record.serialized_key_size, 0)
                if self._on_record is not None:
                    self._on_record(record)

    def figures(self) -> dict[str, Any]:
        elapsed_s = self.last_record_at - self.start
        figures = throughput_figures(len(self.latencies_ms), self.total_bytes, elapsed_s, self.latencies_ms)
        first_record_at = self.first_record_at or self.last_record_at
        fetch_s = max(self.last_record_at - first_record_at, 1e-9)
        figures.update(
            timed_out=figures["records"] < self._messages,
            first_record_s=first_record_at - self.start,
            fetch_records_per_s=figures["records"] / fetch_s,
            fetch_mb_per_s=self.total_bytes / MB / fetch_s,
        )
        return figures
