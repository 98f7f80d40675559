"""Replication benchmark: produce throughput and latency of a 3-broker rayk cluster on one
machine, against the bare cost of a Ray actor call, and the footprint of replica actors.

Run:  python benchmarks/replication_bench.py [--quick] [--duration S] [--window N] [--partitions N]
                                           [--parts produce,replicas,capacity] [--capacity-replicas N]

Everything runs on this machine: a local Ray instance (ray.init(address="local", num_cpus=os.cpu_count(),
include_dashboard=False) in a Ray namespace of its own) and `rayk.start(brokers=3)` with its
data directory in a temporary directory that is removed at the end. The script ends with
`cluster.shutdown()` and `ray.shutdown()`. Nothing here asserts anything about speed: the
script prints figures, and you judge them.

What it measures
----------------
1. Produce. For each replication factor (1, 3) x acks (1, -1) x batch size (64 KiB,
   1 MiB): a fresh topic of 1 partition with that replication factor (RF=3 topics get
   min.insync.replicas=2), and one Kafka v2 batch of ~100-byte records (random values, no
   key, no compression) that fills the batch size, built once with
   `rayk.storage.records.build_batch` and sent again and again: the leader assigns
   offsets, so the same bytes are a new batch every time. The driver calls the leader's
   PartitionReplica directly, `leader.produce.remote(batch, acks, timeout_ms=30000)`,
   keeping a window of `--window` (default 8) calls in flight (`ray.wait`), for
   `--duration` seconds (default 5; 1.5 with --quick) or until `--max-mib` of batches
   went out, after an unmeasured warm-up of the same kind. Each call's latency is from
   submit to the moment the driver sees its result. Every result is checked: errors (a
   ProduceResult with `error` set, or an exception from the call) are counted and the
   first few printed; at the end the leader's log end offset must equal the records
   produced, and the topic's ISR is shown. The topic is deleted afterwards (disk space).
   Baseline: the same calls (same batch bytes, same window, same arguments) to a trivial
   async actor whose `produce` returns len(records): the cost of a Ray actor call that
   carries the batch, in the same run. Reference: `Log.append_as_leader` of the same batch
   to a log in this process, one call after the other, no Ray: the leader's own work per
   call (it validates every record of the batch, in Python), the ceiling for one leader.
2. Replica actors. A topic of `--partitions` partitions (default 30; 10 with --quick) and
   RF=1 spread over the 3 brokers: every partition is one PartitionReplica actor, i.e.
   one Ray worker process. Printed: how long create_topic took (actors/s), and per replica
   process the resident set (RSS) and unique set (USS: memory no other process shares),
   read with psutil from the actors' pids. The pids come from Ray's actor table in the GCS
   (`ray._private.state.actors()`): `ray.util.state.list_actors` needs the dashboard's API
   server, which include_dashboard=False does not start; it is only the fallback.
   Baseline: as many trivial actors, created at once (seconds until each answered once),
   and their RSS/USS.

3. Partitions per node. A rayk cluster of one broker, so that every replica is a process
   on this node. (a) A topic of `--create-partitions` partitions (default 100), RF=1:
   seconds from create_topic until every partition answered a produce (acks=1) through its
   leader's handle; against as many bare actors created at once, and each process's RSS,
   USS and idle CPU next to a bare actor's, in the same run. (b) Topics of
   `--capacity-step` partitions (50) added until `--capacity-replicas` replicas run (320;
   150 with --quick), or under `--reserve-percent` of the node's memory is available;
   after each step every partition of every topic must answer a produce within 300 s, and
   the node's used memory, the replicas' summed USS and their idle CPU (% of one core,
   over `--idle-seconds`) are printed. `--parts capacity` runs this part alone.

How to read it
--------------
MB/s are 10^6 bytes per second of batch bytes handed to `produce`; records/s count the
records in the batches that succeeded. Latencies are in ms over all measured calls (p50,
p99, max). With a window of W calls in flight, latency ~ W / (calls per second): the
window trades latency for throughput. acks=1 answers after the leader's append; acks=-1
waits until the follower(s) in the ISR fetched the batch and reported it back (the HW
passed it), i.e. at least one more fetch round trip between actors. Batches of more than
100 KiB go through Ray's object store, smaller ones inline in the call. All actors share
the machine's CPUs with the driver, so on a small machine the figures measure CPU
contention as much as anything.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import psutil  # noqa: E402  (installed with ray)
import ray  # noqa: E402
from ray.util.state import list_actors  # noqa: E402

import rayk  # noqa: E402
from rayk.storage.log import Log  # noqa: E402
from rayk.storage.log_config import LogConfig  # noqa: E402
from rayk.storage.records import SimpleRecord, build_batch  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
MB = 1e6
RECORD_VALUE_BYTES = 100
BATCH_SIZES = (64 * KiB, 1 * MiB)
REPLICATION_FACTORS = (1, 3)
ACKS = (1, -1)
MIN_INSYNC_RF3 = 2
PRODUCE_TIMEOUT_MS = 30_000
BROKERS = 3
MAX_ERRORS_SHOWN = 5

ns = time.perf_counter_ns


# ---------------------------------------------------------------------------- helpers


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def build_full_batch(target_bytes: int, rng: random.Random, max_bytes: int) -> tuple[bytes, int]:
    """One batch of as many ~100-byte records as fit in the target (and max.message.bytes)."""
    limit = min(target_bytes, max_bytes)
    values = [rng.randbytes(RECORD_VALUE_BYTES) for _ in range(limit // RECORD_VALUE_BYTES + 1)]
    n = len(values)
    batch = build_batch([SimpleRecord(v) for v in values[:n]])
    while len(batch) > limit:  # per-record overhead is a few bytes: shrink by the excess
        excess = len(batch) - limit
        n -= max(1, excess // (RECORD_VALUE_BYTES + 8))
        batch = build_batch([SimpleRecord(v) for v in values[:n]])
    return batch, n


class Echo:
    """The baseline: an async actor whose produce does nothing but look at the batch."""

    async def produce(self, records: bytes, acks: int, timeout_ms: int) -> int:
        return len(records)

    async def pid(self) -> int:
        return os.getpid()


EchoActor = ray.remote(num_cpus=0)(Echo)


@dataclass
class RunStats:
    calls: int = 0  # completed calls (ok or not)
    ok: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    latencies_ns: list[int] = field(default_factory=list)
    elapsed_ns: int = 0

    def note_error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < MAX_ERRORS_SHOWN:
            self.error_samples.append(text)


def drive(handle: Any, batch: bytes, acks: int, window: int, seconds: float, max_bytes: int, is_echo: bool) -> RunStats:
    """Calls handle.produce with `window` calls in flight for `seconds` (or `max_bytes`),
    then waits for the stragglers; returns what completed and how long that took."""
    stats = RunStats()
    inflight: dict[Any, int] = {}  # ObjectRef -> submit time
    expected_len = len(batch)
    sent_bytes = 0
    start = ns()
    deadline = start + int(seconds * 1e9)
    produce = handle.produce
    while True:
        now = ns()
        while len(inflight) < window and now < deadline and sent_bytes < max_bytes:
            ref = produce.remote(batch, acks, PRODUCE_TIMEOUT_MS)
            inflight[ref] = ns()
            sent_bytes += expected_len
            now = inflight[ref]
        if not inflight:
            break
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=PRODUCE_TIMEOUT_MS / 1000 + 30)
        if not ready:
            stats.note_error(f"no reply within {PRODUCE_TIMEOUT_MS / 1000 + 30:.0f} s to {len(inflight)} calls; giving up")
            stats.calls += len(inflight)
            stats.errors += len(inflight) - 1
            inflight.clear()
            break
        if len(inflight) > 1:  # collect whatever else is ready already
            more, _ = ray.wait([r for r in inflight if r not in ready], num_returns=len(inflight) - 1, timeout=0)
            ready += more
        done_at = ns()
        for ref in ready:
            stats.latencies_ns.append(done_at - inflight.pop(ref))
            stats.calls += 1
            try:
                result = ray.get(ref)
            except Exception as e:  # the actor died, or the call raised
                stats.note_error(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                continue
            if is_echo:
                if result != expected_len:
                    stats.note_error(f"echo returned {result}, expected {expected_len}")
                else:
                    stats.ok += 1
            elif result.error is not None:
                stats.note_error(f"{type(result.error).__name__}: {result.error}")
            else:
                stats.ok += 1
    stats.elapsed_ns = ns() - start
    return stats


def append_locally(log_dir: Path, batch: bytes, seconds: float, max_bytes: int) -> RunStats:
    """The same batch appended to a Log in this process, back to back, no Ray involved."""
    stats = RunStats()
    log = Log(log_dir, LogConfig())
    append = log.append_as_leader
    sent = 0
    start = ns()
    deadline = start + int(seconds * 1e9)
    t0 = start
    while t0 < deadline and sent < max_bytes:
        try:
            append(batch, 0)
            stats.ok += 1
        except Exception as e:
            stats.note_error(f"{type(e).__name__}: {e}")
        t1 = ns()
        stats.latencies_ns.append(t1 - t0)
        stats.calls += 1
        sent += len(batch)
        t0 = t1
    stats.elapsed_ns = ns() - start
    log.delete()
    return stats


@dataclass
class Row:
    case: str
    rf: str
    acks: str
    batch_bytes: int
    records_per_batch: int
    stats: RunStats
    isr: str = ""
    leo_check: str = ""

    def figures(self) -> dict[str, float]:
        s = self.stats
        secs = s.elapsed_ns / 1e9
        lat = sorted(x / 1e6 for x in s.latencies_ns)
        return {
            "calls_s": s.calls / secs if secs else float("nan"),
            "records_s": s.ok * self.records_per_batch / secs if secs else float("nan"),
            "mb_s": s.ok * self.batch_bytes / MB / secs if secs else float("nan"),
            "p50": percentile(lat, 0.50),
            "p99": percentile(lat, 0.99),
            "max": lat[-1] if lat else float("nan"),
            "mean": statistics.fmean(lat) if lat else float("nan"),
        }


# ---------------------------------------------------------------------------- 1. produce


def bench_produce(cluster: Any, args: argparse.Namespace, batches: dict[int, tuple[bytes, int]]) -> list[Row]:
    rows: list[Row] = []
    max_bytes = args.max_mib * MiB
    print(f"\n1. PRODUCE  1 partition per topic, window {args.window} calls in flight, "
          f"{args.duration:g} s per case (or {human_bytes(max_bytes)}) after a {args.warmup:g} s warm-up")

    # Baseline first: a trivial actor on the same machine, the same calls.
    echo = EchoActor.remote()
    ray.get(echo.pid.remote())
    for size in BATCH_SIZES:
        batch, nrec = batches[size]
        drive(echo, batch, 1, args.window, args.warmup, max_bytes, is_echo=True)
        stats = drive(echo, batch, 1, args.window, args.duration, max_bytes, is_echo=True)
        rows.append(Row("baseline (echo actor)", "-", "-", len(batch), nrec, stats))
        print_progress(rows[-1])
    ray.kill(echo)

    # Reference: the leader's own work, Log.append_as_leader, one call at a time in this process.
    for size in BATCH_SIZES:
        batch, nrec = batches[size]
        rows.append(Row("Log.append_as_leader", "-", "-", len(batch), nrec,
                        append_locally(Path(args.data_dir) / f"local-{size}", batch, args.duration, max_bytes)))
        print_progress(rows[-1])

    for rf in REPLICATION_FACTORS:
        for acks in ACKS:
            for size in BATCH_SIZES:
                batch, nrec = batches[size]
                topic = f"bench-rf{rf}-acks{'all' if acks == -1 else acks}-{size // KiB}k"
                config = {"min.insync.replicas": str(MIN_INSYNC_RF3)} if rf == 3 else None
                cluster.create_topic(topic, num_partitions=1, replication_factor=rf, config=config)
                leader = cluster.leader(topic, 0)
                warm = drive(leader, batch, acks, args.window, args.warmup, max_bytes, is_echo=False)
                stats = drive(leader, batch, acks, args.window, args.duration, max_bytes, is_echo=False)
                stats.errors += warm.errors
                stats.error_samples = (warm.error_samples + stats.error_samples)[:MAX_ERRORS_SHOWN]
                row = Row("rayk produce", str(rf), "all" if acks == -1 else str(acks), len(batch), nrec, stats)
                try:
                    # acks=1 returns before the followers have the data: give them a moment
                    # so the ISR shown is not just a snapshot of the last fetch round.
                    time.sleep(0.2)
                    (desc,) = cluster.describe_topic(topic)
                    row.isr = f"[{','.join(map(str, desc['isr']))}]/{len(desc['replicas'])}"
                    expected = (warm.ok + stats.ok) * nrec
                    leo = desc["log_end_offset"]
                    row.leo_check = "ok" if leo == expected else f"LEO {leo} != {expected} records produced"
                except Exception as e:
                    row.isr, row.leo_check = "?", f"describe failed: {type(e).__name__}: {e}"
                rows.append(row)
                print_progress(row)
                try:
                    cluster.delete_topic(topic)
                except Exception as e:
                    print(f"    note: delete_topic({topic!r}) failed: {type(e).__name__}: {e}")
    return rows


def print_progress(row: Row) -> None:
    f = row.figures()
    print(f"    done: {row.case:<22} rf={row.rf} acks={row.acks:<3} {human_bytes(row.batch_bytes):>9}: "
          f"{f['mb_s']:7.1f} MB/s, p50 {f['p50']:7.2f} ms, {row.stats.errors} errors")


def print_produce_table(rows: list[Row]) -> None:
    header = (f"  {'case':<22} {'RF':>2} {'acks':>4} {'batch':>9} {'rec/batch':>9} {'calls':>6} | "
              f"{'records/s':>10} {'MB/s':>8} {'calls/s':>8} | {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} | "
              f"{'errors':>6} {'ISR at end':>10}  LEO check")
    print("\n" + header)
    print("  " + "-" * (len(header) - 2))
    for row in rows:
        f = row.figures()
        print(f"  {row.case:<22} {row.rf:>2} {row.acks:>4} {human_bytes(row.batch_bytes):>9} "
              f"{row.records_per_batch:>9} {row.stats.calls:>6} | {f['records_s']:>10,.0f} {f['mb_s']:>8.1f} "
              f"{f['calls_s']:>8.1f} | {f['p50']:>8.2f} {f['p99']:>8.2f} {f['max']:>8.2f} | "
              f"{row.stats.errors:>6} {row.isr:>10}  {row.leo_check}")
    errored = [r for r in rows if r.stats.errors]
    if errored:
        print("  errors (first few per case):")
        for r in errored:
            print(f"    {r.case} rf={r.rf} acks={r.acks} {human_bytes(r.batch_bytes)}: {r.stats.errors} errors")
            for text in r.stats.error_samples:
                print(f"      {text}")
    else:
        print("  errors: none (every ProduceResult had error None)")
    # The cost of replication relative to the bare actor call and to the leader's own append.
    base = {r.batch_bytes: r.figures() for r in rows if r.case.startswith("baseline")}
    local = {r.batch_bytes: r.figures() for r in rows if r.case == "Log.append_as_leader"}
    print("  rayk produce relative to the baseline actor call and to Log.append_as_leader alone, same batch:")
    for r in rows:
        if r.case != "rayk produce" or r.batch_bytes not in base or r.batch_bytes not in local:
            continue
        f, b, a = r.figures(), base[r.batch_bytes], local[r.batch_bytes]
        print(f"    RF={r.rf} acks={r.acks:<3} {human_bytes(r.batch_bytes):>10}: {f['mb_s'] / b['mb_s']:5.2f}x the echo "
              f"actor's MB/s ({f['p50'] / b['p50']:5.2f}x its p50), {f['mb_s'] / a['mb_s']:5.2f}x in-process append MB/s")


# ---------------------------------------------------------------------------- 2. replica actors


def process_memory(pid: int) -> tuple[float, float]:
    """(RSS, USS) in MiB; USS is NaN when /proc/<pid>/smaps cannot be read."""
    proc = psutil.Process(pid)
    try:
        info = proc.memory_full_info()
        return info.rss / MiB, info.uss / MiB
    except (psutil.AccessDenied, AttributeError):
        return proc.memory_info().rss / MiB, float("nan")


def memory_of(pids: list[int]) -> list[tuple[float, float]]:
    """(RSS, USS) in MiB of each of `pids` still readable."""
    mems = []
    for pid in pids:
        try:
            mems.append(process_memory(pid))
        except psutil.Error:
            pass
    return mems


def replica_pids(actor_ids: set[str]) -> tuple[dict[str, int], str]:
    """actor id -> pid of the ALIVE PartitionReplica actors among `actor_ids`.

    `ray.util.state.list_actors` asks the dashboard's API server, which does not run
    with include_dashboard=False (and, with several Ray instances on the machine, may
    find the wrong one), so it is tried only after Ray's own actor table in the GCS
    (`ray._private.state.actors()`, what `ray list actors` reads too, with the pid)."""
    try:
        import ray._private.state as gcs_state

        table = gcs_state.actors()
        return (
            {
                aid: info["Pid"]
                for aid, info in table.items()
                if aid in actor_ids and info.get("State") == "ALIVE" and info.get("ActorClassName") == "PartitionReplica"
            },
            "Ray's GCS actor table",
        )
    except Exception as e:  # a private API: fall back on the state API
        print(f"    note: GCS actor table unavailable ({type(e).__name__}: {e}); trying ray.util.state.list_actors")
    actors = list_actors(
        address=ray.get_runtime_context().gcs_address,
        filters=[("class_name", "=", "PartitionReplica"), ("state", "=", "ALIVE")],
        detail=True,
        limit=10_000,
    )
    return {a.actor_id: a.pid for a in actors if a.actor_id in actor_ids}, "ray.util.state.list_actors"


def bench_replicas(cluster: Any, args: argparse.Namespace) -> None:
    n = args.partitions
    topic = "bench-many-replicas"
    print(f"\n2. REPLICA ACTORS  topic of {n} partitions, RF=1, over {BROKERS} brokers: "
          f"{n} PartitionReplica actors on this node")
    t0 = ns()
    cluster.create_topic(topic, num_partitions=n, replication_factor=1)
    create_s = (ns() - t0) / 1e9
    ids = {cluster.leader(topic, p)._actor_id.hex() for p in range(n)}
    pids, source = replica_pids(ids)
    missing = len(ids) - len(pids)
    mems = []
    for actor_id, pid in pids.items():
        try:
            mems.append(process_memory(pid))
        except psutil.Error as e:
            print(f"    note: cannot read memory of pid {pid} ({actor_id[:8]}): {type(e).__name__}")
    per_broker: dict[int, int] = {}
    for desc in cluster.describe_topic(topic):
        per_broker[desc["leader"]] = per_broker.get(desc["leader"], 0) + 1

    # Baseline: as many trivial actors, created at once; ready when each answered.
    t0 = ns()
    idle = [EchoActor.remote() for _ in range(n)]
    idle_pids = ray.get([a.pid.remote() for a in idle])
    idle_s = (ns() - t0) / 1e9
    idle_mems = memory_of(idle_pids)
    for a in idle:
        ray.kill(a)

    print(f"  {'':24} {'actors':>6} {'per broker':>10} {'create s':>9} {'actors/s':>9} | "
          f"{'avg RSS MiB':>11} {'min..max':>13} {'total RSS MiB':>13} | {'avg USS MiB':>11} {'total USS MiB':>13}")
    for name, count, spread_, secs, ms in (
        ("PartitionReplica (RF=1)", len(mems), "/".join(str(per_broker.get(b, 0)) for b in range(BROKERS)), create_s, mems),
        ("baseline: trivial actor", len(idle_mems), "-", idle_s, idle_mems),
    ):
        rss = [m[0] for m in ms]
        uss = [m[1] for m in ms]
        print(f"  {name:24} {count:>6} {spread_:>10} {secs:>9.2f} {n / secs:>9.1f} | "
              f"{statistics.fmean(rss) if rss else float('nan'):>11.1f} "
              f"{(f'{min(rss):.0f}..{max(rss):.0f}' if rss else '-'):>13} {sum(rss):>13.1f} | "
              f"{statistics.fmean(uss) if uss else float('nan'):>11.1f} {sum(uss):>13.1f}")
    print(f"  'create s': cluster.create_topic({n} partitions) until every leader is in place; for the baseline, "
          f"{n} x Actor.remote() until each answered once. pids from {source}; RSS counts shared pages "
          f"(libraries, Ray's object store) in every process, USS only the process's own")
    if missing:
        print(f"  note: {missing} of the {n} leader actors were not found ALIVE in the actor table")
    try:
        cluster.delete_topic(topic)
    except Exception as e:
        print(f"    note: delete_topic({topic!r}) failed: {type(e).__name__}: {e}")


# ---------------------------------------------------------------------------- 3. partitions per node


def answering(cluster: Any, partitions: list[tuple[str, int]], timeout_s: float) -> tuple[list[tuple[str, int]], list[str]]:
    """Produces one record (acks=1) to each of `partitions` through its leader's handle,
    all at once; (the partitions that did not answer, the first errors)."""
    batch = build_batch([SimpleRecord(b"ping")])
    refs, failed, errors = {}, [], []

    def note(tp: tuple[str, int], text: str) -> None:
        failed.append(tp)
        if len(errors) < MAX_ERRORS_SHOWN:
            errors.append(f"{tp[0]}-{tp[1]}: {text}")

    leaders = [cluster.controller.leader.remote(t, p) for t, p in partitions]
    for tp, leader in zip(partitions, leaders):
        try:
            refs[ray.get(leader).produce.remote(batch, 1, PRODUCE_TIMEOUT_MS)] = tp
        except Exception as e:  # no leader yet
            note(tp, f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}")
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    for ref in late:
        note(refs[ref], f"no answer within {timeout_s:.0f} s")
    for ref in ready:
        try:
            result = ray.get(ref)
            if result.error is None:
                continue
            note(refs[ref], f"{type(result.error).__name__}: {result.error}")
        except Exception as e:
            note(refs[ref], f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}")
    return failed, errors


def wait_answering(cluster: Any, topics: dict[str, int], timeout_s: float) -> tuple[int, int, list[str]]:
    """Asks every partition of `topics` (name -> partitions) until each has answered a
    produce once, or `timeout_s` passed; (answered, partitions, last errors)."""
    waiting = [(t, p) for t, n in topics.items() for p in range(n)]
    deadline = time.monotonic() + timeout_s
    errors: list[str] = []
    while waiting and time.monotonic() < deadline:
        waiting, errors = answering(cluster, waiting, timeout_s=max(1.0, deadline - time.monotonic()))
        if waiting:
            time.sleep(0.2)
    total = sum(topics.values())
    return total - len(waiting), total, errors


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def idle_cpu_percent(pids: list[int], seconds: float) -> float:
    """CPU the processes used while nothing was asked of them, in % of one core."""
    before = cpu_seconds(pids)
    time.sleep(seconds)
    return 100 * (cpu_seconds(pids) - before) / seconds


def bench_capacity(args: argparse.Namespace, namespace: str) -> None:
    """One broker, so that every replica is on this node: (a) how long a topic of
    `--create-partitions` takes until every partition answers, against as many bare actors
    created at once; (b) topics of `--capacity-step` partitions added until
    `--capacity-replicas` replicas run, each step checked (every partition answers a
    produce) and measured (node memory, the replicas' own memory and idle CPU)."""
    n = args.create_partitions
    print("\n3. PARTITIONS PER NODE  one broker: every replica is a process on this node")
    cluster = rayk.start(brokers=1, data_dir=Path(args.data_dir) / "capacity", namespace=namespace + "-capacity")
    try:
        vm0 = psutil.virtual_memory()
        t0 = ns()
        cluster.create_topic("capacity-0", num_partitions=n, replication_factor=1)
        created_s = (ns() - t0) / 1e9
        ok, asked, errors = wait_answering(cluster, {"capacity-0": n}, timeout_s=300)
        answered_s = (ns() - t0) / 1e9
        print(f"  a topic of {n} partitions on one broker: create_topic returned after {created_s:.1f} s, "
              f"all {ok}/{asked} partitions answered a produce after {answered_s:.1f} s ({n / answered_s:.1f} replicas/s)")
        for e in errors:
            print(f"    error: {e}")

        t0 = ns()
        bare = [EchoActor.remote() for _ in range(n)]
        bare_pids = ray.get([a.pid.remote() for a in bare])
        bare_s = (ns() - t0) / 1e9
        bare_mem = memory_of(bare_pids)
        bare_cpu = idle_cpu_percent(bare_pids, args.idle_seconds)
        print(f"  baseline: {n} bare actors (Actor.remote() at once) answered after {bare_s:.1f} s ({n / bare_s:.1f} actors/s)")

        topics = {"capacity-0": n}
        ids = {cluster.leader("capacity-0", p)._actor_id.hex() for p in range(n)}
        pids, _ = replica_pids(ids)
        replica_mem = memory_of(list(pids.values()))
        replica_cpu = idle_cpu_percent(list(pids.values()), args.idle_seconds)
        for a in bare:
            ray.kill(a)
        if not replica_mem or not bare_mem:
            print(f"  stopped: memory read for {len(replica_mem)} replicas and {len(bare_mem)} bare actors")
            return
        uss_r = statistics.fmean(m[1] for m in replica_mem)
        uss_b = statistics.fmean(m[1] for m in bare_mem)
        print(f"  {'':22} {'processes':>9} {'avg RSS MiB':>11} {'avg USS MiB':>11} {'idle CPU %/process':>18}")
        print(f"  {'PartitionReplica':22} {len(replica_mem):>9} {statistics.fmean(m[0] for m in replica_mem):>11.1f} "
              f"{uss_r:>11.1f} {replica_cpu / max(1, len(pids)):>18.2f}")
        print(f"  {'bare Ray actor':22} {len(bare_mem):>9} {statistics.fmean(m[0] for m in bare_mem):>11.1f} "
              f"{uss_b:>11.1f} {bare_cpu / max(1, len(bare_pids)):>18.2f}")
        print(f"  a replica process holds {uss_r - uss_b:+.1f} MiB of its own memory over a bare Ray actor's")

        print(f"\n  adding topics of {args.capacity_step} partitions until {args.capacity_replicas} replicas run "
              f"(or the node's available memory falls under {args.reserve_percent}%):")
        print(f"  {'replicas':>8} {'step s':>7} {'answered':>9} {'node used GiB':>13} {'available %':>11} "
              f"{'replicas USS GiB':>16} {'idle CPU % of a core':>20}")
        held = n
        while held < args.capacity_replicas:
            vm = psutil.virtual_memory()
            if 100 * vm.available / vm.total < args.reserve_percent:
                print(f"  stopped: {100 * vm.available / vm.total:.0f}% of the node's memory available")
                break
            step = min(args.capacity_step, args.capacity_replicas - held)
            topic = f"capacity-{len(topics)}"
            t0 = ns()
            try:
                cluster.create_topic(topic, num_partitions=step, replication_factor=1)
            except Exception as e:
                print(f"  stopped: create_topic({topic!r}, {step}) failed: {type(e).__name__}: {e}")
                break
            topics[topic] = step
            ok, asked, errors = wait_answering(cluster, topics, timeout_s=300)
            step_s = (ns() - t0) / 1e9
            ids = {cluster.leader(t, p)._actor_id.hex() for t, k in topics.items() for p in range(k)}
            pids, _ = replica_pids(ids)
            mem = memory_of(list(pids.values()))
            cpu = idle_cpu_percent(list(pids.values()), args.idle_seconds)
            vm = psutil.virtual_memory()
            print(f"  {asked:>8} {step_s:>7.1f} {ok:>9} {(vm.total - vm.available) / (1 << 30):>13.1f} "
                  f"{100 * vm.available / vm.total:>11.0f} {sum(m[1] for m in mem) / 1024:>16.1f} {cpu:>20.0f}")
            for e in errors:
                print(f"    error: {e}")
            if ok < asked:
                print(f"  stopped: {asked - ok} of {asked} partitions did not answer")
                break
            held = asked
        vm = psutil.virtual_memory()
        per_replica_mib = ((vm.total - vm.available) - (vm0.total - vm0.available)) / max(1, held) / MiB
        print(f"  held: {held} replicas on this node, every partition answering")
        if per_replica_mib > 0:  # other work on the machine may have freed more than the replicas took
            print(f"  node memory per replica ~{per_replica_mib:.0f} MiB (used memory since the start of part 3 / "
                  f"replicas), so ~{int(0.95 * vm.total / MiB / per_replica_mib)} would fit under Ray's memory "
                  f"monitor (95% of {human_bytes(vm.total)})")
    finally:
        shut_down(cluster)


# ---------------------------------------------------------------------------- main


def shut_down(cluster: Any) -> None:
    try:
        cluster.shutdown()
    except Exception as e:
        print(f"note: cluster.shutdown() failed: {type(e).__name__}: {e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1.5 s per case, 10 partitions (about a minute in all)")
    parser.add_argument("--duration", type=float, default=None, help="seconds measured per case; default 5 (--quick 1.5)")
    parser.add_argument("--warmup", type=float, default=None, help="unmeasured seconds before each case; default 0.5 (--quick 0.2)")
    parser.add_argument("--window", type=int, default=8, help="calls in flight; default 8")
    parser.add_argument("--max-mib", type=int, default=None, help="batch bytes per case at most; default 4096 (--quick 1024)")
    parser.add_argument("--partitions", type=int, default=None, help="partitions (replica actors) in part 2; default 30 (--quick 10)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs Ray may use; default os.cpu_count()")
    parser.add_argument("--parts", default="produce,replicas,capacity",
                        help="which parts to run, comma-separated; default all: produce,replicas,capacity")
    parser.add_argument("--create-partitions", type=int, default=100,
                        help="part 3: partitions of the topic timed on one broker; default 100")
    parser.add_argument("--capacity-replicas", type=int, default=None,
                        help="part 3: replicas to reach on this node; default 320 (--quick 150)")
    parser.add_argument("--capacity-step", type=int, default=50, help="part 3: partitions added per step; default 50")
    parser.add_argument("--reserve-percent", type=float, default=10,
                        help="part 3: stop adding when less of the node's memory is available; default 10")
    parser.add_argument("--idle-seconds", type=float, default=3, help="part 3: seconds idle CPU is measured over; default 3")
    args = parser.parse_args()
    args.duration = args.duration if args.duration is not None else (1.5 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.2 if args.quick else 0.5)
    args.max_mib = args.max_mib if args.max_mib is not None else (1024 if args.quick else 4096)
    args.partitions = args.partitions if args.partitions is not None else (10 if args.quick else 30)
    args.capacity_replicas = args.capacity_replicas if args.capacity_replicas is not None else (150 if args.quick else 320)
    args.parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if args.window < 1 or args.duration <= 0 or args.partitions < 1 or args.create_partitions < 1 or args.capacity_step < 1:
        parser.error("--window, --duration, --partitions, --create-partitions and --capacity-step must be positive")
    if not args.parts or args.parts - {"produce", "replicas", "capacity"}:
        parser.error("--parts takes produce, replicas and capacity")

    started = ns()
    rng = random.Random(42)
    max_message = LogConfig().max_message_bytes
    batches = {size: build_full_batch(size, rng, max_message) for size in BATCH_SIZES}

    num_cpus = args.num_cpus or os.cpu_count() or 2
    namespace = f"rayk-bench-{uuid.uuid4().hex[:8]}"
    data_dir = tempfile.mkdtemp(prefix="rayk-replication-bench-")
    args.data_dir = data_dir
    print(f"rayk replication benchmark{' (--quick)' if args.quick else ''}")
    print(f"machine: {os.cpu_count()} CPUs ({num_cpus} given to Ray), "
          f"{human_bytes(psutil.virtual_memory().total)} RAM, {platform.system()} {platform.machine()}; "
          f"Python {platform.python_version()}, Ray {ray.__version__}, psutil {psutil.__version__}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other work on the machine skews every figure)")
    print(f"data dir {data_dir}, Ray namespace {namespace}")
    print("batches: " + ", ".join(f"{human_bytes(len(b))} = {n} records of {RECORD_VALUE_BYTES} B"
                                  for b, n in batches.values()))
    cluster = None
    try:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, namespace=namespace)
        if args.parts & {"produce", "replicas"}:
            t0 = ns()
            cluster = rayk.start(brokers=BROKERS, data_dir=Path(data_dir) / "cluster", namespace=namespace)
            print(f"rayk.start(brokers={BROKERS}) took {(ns() - t0) / 1e9:.1f} s")
            if "produce" in args.parts:
                print_produce_table(bench_produce(cluster, args, batches))
            if "replicas" in args.parts:
                bench_replicas(cluster, args)
            shut_down(cluster)
            cluster = None
        if "capacity" in args.parts:
            bench_capacity(args, namespace)
    finally:
        if cluster is not None:
            shut_down(cluster)
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"\nwall time {(ns() - started) / 1e9:.0f} s")


if __name__ == "__main__":
    main()
