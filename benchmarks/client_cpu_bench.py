"""The Python client's per-record CPU, without Ray or a broker: what a record costs the
thread that calls `send()`, the sender thread that frames its batch, and the thread
that iterates a consumer, each measured on its own.

Why: `client_bench.py` puts rayk's Producer against confluent-kafka with Tansu, and the
driver there is bound by its GIL, not by the machine: the thread calling `send()`, the
sender thread and the data plane's event loop take turns holding it (2026-12-06,
seventh session: 1.46 of 2 cores busy at ~600k records/s). So every part of a record's
way through those threads counts, and these are the parts, one at a time:

1. `send()`: `--records` records of 100 B into a Producer around a bare accumulator
   (tests/test_send_path.py's, no sender thread, batches that never fill), with one
   callback for every record, as client_bench sends. Side by side in the same run: the
   compiled send (rayk/client/_send.c, SendMethod and SendPath) and the Python one (the
   documented function, `Producer.send.__wrapped__`, with no path), µs per call of the
   calling thread, min and median of `--rounds`.
2. The sender's framing: `build_batch` of 1,200 records of 100 B (a batch of ~145 KB, as
   client_bench's batches are), ns per record.
3. The consumer's decoding: `decode_consumer_records` of that batch into ConsumerRecords,
   and freeing them, ns per record.
4. The consumer's iteration: `for record in fetcher.hand_out(positions)` over fetch
   answers of ~1 MiB (batches of 1,200 records of 100 B), each value's size read as
   client_bench reads it: the Fetcher as a Consumer has it (decoding, handing out, the
   positions), its answers scripted (tests/test_fetcher.py's), ns per record of the
   iterating thread, min and median of `--rounds`.

Run it on an older commit (PYTHONPATH) for the figures before. It prints figures and
asserts nothing.

    .venv/bin/python benchmarks/client_cpu_bench.py [--records N] [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))  # run from a checkout: rayk, and the tests' bare producer

from rayk.client.producer import Producer  # noqa: E402
from rayk.client.types import ConsumerRecord  # noqa: E402
from rayk.storage.records import build_batch, decode_consumer_records  # noqa: E402
from test_fetcher import A, ScriptedLeader, fetch_round, fetcher_for  # noqa: E402  (a Fetcher with scripted answers)
from test_send_path import FakeMetadata, producer  # noqa: E402  (a Producer with no cluster and no sender)

RECORD_BYTES = 100
BATCH_RECORDS = 1_200


def on_done(future: Any) -> None:
    """client_bench's callback: every record's error is asked for."""
    future.exception()


def send_us(kind: str, records: int) -> float:
    """µs of this thread per send() of one record into an open batch."""
    p = producer("compiled", FakeMetadata(), batch_size=1 << 31, buffer_memory=1 << 31, seed=1)
    send: Callable[..., Any] = p.send
    if kind == "python":
        p._send_path = None
        python_send = getattr(Producer.send, "__wrapped__", Producer.send)
        send = python_send.__get__(p)
    payload = os.urandom(RECORD_BYTES)
    start = time.thread_time()
    for _ in range(records):
        send("t3", payload, key=None, callback=on_done)
    return (time.thread_time() - start) / records * 1e6


def framing_ns(batches: int) -> tuple[float, float]:
    """ns per record: build_batch of a batch; decode_consumer_records of it, and freeing."""
    records = [(os.urandom(RECORD_BYTES), None, (), 1_700_000_000_000 + i // 400) for i in range(BATCH_RECORDS)]
    start = time.perf_counter()
    for _ in range(batches):
        batch = build_batch(records, producer_id=5, producer_epoch=0, base_sequence=0)
    built = (time.perf_counter() - start) / batches / BATCH_RECORDS * 1e9
    start = time.perf_counter()
    for _ in range(batches):
        decoded = decode_consumer_records(batch, ConsumerRecord, "t", 0, 0)
        del decoded
    return built, (time.perf_counter() - start) / batches / BATCH_RECORDS * 1e9


def iteration_ns(answers: int) -> float:
    """ns of this thread per record of `for record in fetcher.hand_out(positions)` over
    `answers` fetch answers of ~1 MiB each."""
    records = [(os.urandom(RECORD_BYTES), None, (), 1_700_000_000_000 + i // 400) for i in range(BATCH_RECORDS)]
    batches: list[bytes] = []
    while sum(map(len, batches)) < 1 << 20:
        offset = len(batches) * BATCH_RECORDS
        batches.append(build_batch(records, base_offset=offset, producer_id=5, producer_epoch=0, base_sequence=offset))
    fetcher, positions = fetcher_for({A: ScriptedLeader({0: b"".join(batches)})}), {A: 0}
    got = value_bytes = 0
    start = time.thread_time()
    for _ in range(answers):
        positions[A] = fetcher._fetch_offsets[A] = 0  # the same answer again, from its start
        fetch_round(fetcher, positions)
        for record in fetcher.hand_out(positions):
            got += 1
            value_bytes += len(record.value)
    assert got == answers * len(batches) * BATCH_RECORDS and value_bytes == got * RECORD_BYTES
    return (time.thread_time() - start) / got * 1e9


def summary(values: list[float], unit: str) -> str:
    return f"min {min(values):.3f} {unit}, median {statistics.median(values):.3f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per send() round; default 200,000")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each; default 5")
    args = parser.parse_args()
    if args.records < 1 or args.rounds < 1:
        parser.error("--records and --rounds must be positive")
    gc.freeze()  # as client_bench does before each timed run
    print(f"rayk client CPU per record ({RECORD_BYTES} B records, Python {sys.version.split()[0]}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    # Framing first, in a process whose heap is still small: a batch's buffers then come
    # from fresh mappings, as they did in client_bench's driver (perf: its sender thread
    # ~13% in page faults). After the send() rounds they come from a heap grown large.
    framed = [framing_ns(200) for _ in range(args.rounds)]
    print(f"  build_batch of {BATCH_RECORDS:,} records: {summary([b for b, _ in framed], 'ns')} a record")
    print(f"  decode_consumer_records of it, and freeing: {summary([d for _, d in framed], 'ns')} a record")
    times: dict[str, list[float]] = {"compiled": [], "python": []}
    for _ in range(args.rounds):
        for kind in times:  # alternating: the machine's drift falls on both
            times[kind].append(send_us(kind, args.records))
    for kind, values in times.items():
        print(f"  send(), {kind:<8} {summary(values, 'µs')} a call")
    print(f"  send(), compiled / python: {statistics.median(times['compiled']) / statistics.median(times['python']):.2f}")
    framed = [framing_ns(200) for _ in range(args.rounds)]
    print(f"  after them, build_batch: {summary([b for b, _ in framed], 'ns')} a record; "
          f"decode_consumer_records: {summary([d for _, d in framed], 'ns')} a record")
    iterated = [iteration_ns(10) for _ in range(args.rounds)]
    print(f"  iteration over 1 MiB answers (decode, hand-out, positions): {summary(iterated, 'ns')} a record")


if __name__ == "__main__":
    main()
