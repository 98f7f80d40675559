"""Metadata benchmark: how long a Controller takes to start over a long metadata history.

Run:  python benchmarks/metadata_bench.py [--records N] [--partitions P] [--no-ray]

The history: 9 brokers on 3 nodes register, topics of 10 partitions (RF 3) are created
until there are P partitions, then ISR churn (a leader drops a follower from the ISR,
then takes it back: one PartitionRecord each, as AlterPartition writes it) until the
log holds N records. Records are planned and applied by ClusterMetadata as the
Controller does; for speed they are appended 1,000 changes per batch rather than one
batch (and one fsync) per change, which leaves the same records in the log.

Two metadata directories get the same history, in the same run:
- "replay": no snapshots, as every Controller before rayk's snapshots started: the whole
  log is replayed;
- "snapshots": the Controller's policy (a snapshot once
  metadata.log.max.record.bytes.between.snapshots, 20 MiB, were appended since the last).

Printed, for each: the directory's size, and the start, timed twice:
- in process: MetadataLog open + load, restore, apply what follows (what
  Controller.__init__ does before it can answer anything);
- a Controller actor (with Ray, unless --no-ray): from creating it to its first
  `describe_topic` answer, Ray's process start included.
Also how long taking a snapshot took (the Controller's event loop is busy meanwhile), the
newest snapshot's size and the directory's size relative to it. Nothing is asserted.
The start depends on how many records follow the newest snapshot (printed): a history
that ends just before a snapshot is due is the slowest start.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from rayk.metadata.cluster_metadata import ClusterMetadata
from rayk.metadata import snapshot
from rayk.metadata.log import TOPIC_PARTITION_DIR, MetadataLog
from rayk.metadata.records import ClusterIdRecord, MetadataRecord

BATCH_CHANGES = 1_000
BROKERS = {b: f"node-{b % 3}" for b in range(1, 10)}


def build_history(
    directories: dict[str, MetadataLog], records: int, partitions: int, snapshot_times_s: list[float]
) -> ClusterMetadata:
    meta = ClusterMetadata()
    pending: list[MetadataRecord] = []

    def change(new: list[MetadataRecord]) -> None:
        offset = meta.last_offset + 1
        for i, record in enumerate(new):
            meta.apply(record, offset + i)
        pending.extend(new)
        if len(pending) >= BATCH_CHANGES:
            flush()

    def flush() -> None:
        if not pending:
            return
        for name, log in directories.items():
            log.append(list(pending))
            if name == "snapshots" and log.snapshot_due():
                started = time.perf_counter()  # what the Controller's event loop spends on one
                log.write_snapshot(meta.snapshot())
                snapshot_times_s.append(time.perf_counter() - started)
        pending.clear()

    change([ClusterIdRecord("metadata-bench")])
    for broker_id, node in BROKERS.items():
        change(meta.plan_register_broker(broker_id, node, f"incarnation-{broker_id}", f"dir-{broker_id}"))
        meta.attached.add(broker_id)
    for t in range(partitions // 10):
        change(meta.replication.plan_create_topic(f"topic-{t:05d}", 10, 3, {}, f"id-{t:019d}"))
    all_partitions = meta.all_partitions()
    i = 0
    while meta.last_offset + 1 < records:
        name, p, _ = all_partitions[i % len(all_partitions)]
        i += 1
        s = meta.partition(name, p)
        if len(s.isr) == len(s.replicas):
            new_isr = [r for r in s.isr if r != s.replicas[-1]]
        else:
            new_isr = list(s.replicas)
        change(meta.replication.plan_alter_partition(name, p, s.leader, s.leader_epoch, s.partition_epoch, new_isr))
    flush()
    return meta


def start_in_process(directory: Path) -> tuple[float, ClusterMetadata]:
    started = time.perf_counter()
    log = MetadataLog(directory)
    meta = ClusterMetadata()
    meta.load(log)
    elapsed = time.perf_counter() - started
    log.close()
    return elapsed, meta


def start_actor(directory: Path, topic: str) -> float:
    import ray

    from rayk.client.cluster import ControllerActor

    started = time.perf_counter()
    controller = ControllerActor.remote(str(directory))
    ray.get(controller.describe_topic.remote(topic))
    elapsed = time.perf_counter() - started
    ray.kill(controller)
    return elapsed


def directory_bytes(directory: Path) -> int:
    """What the files hold (the log's index files are preallocated sparse: their used part)."""
    total = 0
    for path in (directory / TOPIC_PARTITION_DIR).iterdir():
        if path.suffix in (".index", ".timeindex"):
            total += path.stat().st_blocks * 512
        else:
            total += path.stat().st_size
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--no-ray", action="store_true", help="time only the in-process start")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rayk-metadata-bench-"))
    try:
        dirs = {"replay": root / "replay", "snapshots": root / "snapshots"}
        logs = {name: MetadataLog(path) for name, path in dirs.items()}
        started = time.perf_counter()
        snapshot_times_s: list[float] = []
        meta = build_history(logs, args.records, args.partitions, snapshot_times_s)
        for log in logs.values():
            log.close()
        print(f"history: {meta.last_offset + 1:,} records, {len(meta.all_partitions()):,} partitions "
              f"(written in {time.perf_counter() - started:.0f} s); {len(snapshot_times_s)} snapshots taken, "
              f"the longest in {max(snapshot_times_s, default=0) * 1000:.0f} ms\n")
        topic = next(iter(meta.topics))
        if not args.no_ray:
            import ray

            ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
        print(f"{'metadata dir':<12} {'size MB':>8} {'snapshots':>9} {'in-process start s':>19} {'actor to describe_topic s':>26}")
        results = {}
        for name, path in dirs.items():
            in_process, loaded = start_in_process(path)
            assert loaded.topics == meta.topics and loaded.brokers == meta.brokers, "the start rebuilt the image"
            actor = start_actor(path, topic) if not args.no_ray else float("nan")
            snapshots = snapshot.snapshot_paths(path / TOPIC_PARTITION_DIR)
            results[name] = (in_process, actor)
            print(f"{name:<12} {directory_bytes(path) / 1e6:>8.1f} {len(snapshots):>9} {in_process:>19.2f} {actor:>26.2f}")
        newest = snapshot.snapshot_paths(dirs["snapshots"] / TOPIC_PARTITION_DIR)
        if newest:
            end_offset, path = newest[-1]
            size = path.stat().st_size
            print(f"\nnewest snapshot: {size / 1e6:.1f} MB, {meta.last_offset + 1 - end_offset:,} records after it; "
                  f"the snapshotting directory is {directory_bytes(dirs['snapshots']) / size:.1f}x its size")
        (a_in, a_actor), (b_in, b_actor) = results["replay"], results["snapshots"]
        print(f"start with snapshots vs full replay: in process {b_in / a_in:.3f}x"
              + ("" if args.no_ray else f", actor {b_actor / a_actor:.3f}x"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
