"""Share group benchmark (KIP-932): a share group of `--consumers` members on ONE partition,
every record acknowledged, against a classic consumer group of one member on the same
partition, in the same run.

Run:  python benchmarks/share_group_bench.py [--records N] [--consumers N] [--mode poll poll_batch]
                                           [--batch-records 500] [--max-poll-records 2000] [--config name=value ...]

Everything runs on this machine: a local Ray, `rayk.start(brokers=3)` in a temporary
directory removed at the end. A topic of one partition, replication factor 3, holds
`--records` (default 600,000) records of 100 random bytes, written with send_batch in log
batches of `--batch-records` (500: ~55 KB, a few of Kafka's default 16 KiB producer
batches). A share-partition hands out whole log batches, at most a poll's worth, and holds
at most group.share.partition.max.record.locks (2,000) records in flight. Then, for each
`--mode` (`poll`: a record object each; `poll_batch`: Arrow RecordBatches):

1. classic: one `cluster.consumer(group_id=...)` in a Ray actor of its own reads them all
   (poll, or poll_batch), committing as it goes (auto-commit);
2. share: `--consumers` (default 4) `cluster.share_consumer(...)` members, each in a Ray
   actor of its own, read them together with implicit acknowledgement (every record of a
   poll accepted by the next), until the group's start offset reaches the end: every
   record accepted, and the acceptance written to the group coordinator.
Each run is timed from its members' start (their actors created and their modules
imported, before they join their group) to the last record settled; the figure is records per second. Nothing here asserts anything about speed: it prints, you judge.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import ray  # noqa: E402

import rayk  # noqa: E402
from scratch import scratch_dir  # noqa: E402  (beside this script)

VALUE_BYTES = 100


@ray.remote(num_cpus=0)
class Reader:
    """One member: reads until told the group is done, counting what it got."""

    def __init__(self, cluster, topic: str, group: str, share: bool, mode: str, max_poll_records: int = 500) -> None:
        self.cluster, self.topic, self.group, self.share, self.mode = cluster, topic, group, share, mode
        self.max_poll_records = max_poll_records

    def ready(self) -> bool:
        """Started: Ray's actor creation and the imports, rayk's and those poll_batch makes
        at its first call (pyarrow's, ~0.3 s, while the member holds the whole lock window
        and the others wait), are not timed."""
        import pyarrow  # noqa: F401

        from rayk.client import arrow_batches  # noqa: F401
        return True

    def run(self, until: int) -> int:
        if self.share:
            consumer = self.cluster.share_consumer(self.topic, group_id=self.group, max_poll_records=self.max_poll_records)
        else:
            consumer = self.cluster.consumer(self.topic, group_id=self.group, auto_offset_reset="earliest")
        got, idle_since = 0, time.monotonic()
        try:
            while True:
                if self.mode == "poll_batch":
                    n = sum(b.num_rows for b in consumer.poll_batch(timeout_ms=200).values())
                elif self.share:
                    n = len(consumer.poll(timeout_ms=200))
                else:
                    n = sum(len(rs) for rs in consumer.poll(timeout_ms=200).values())
                got += n
                if n:
                    idle_since = time.monotonic()
                if got >= until or (self.share and time.monotonic() - idle_since > 3):
                    return got
        finally:
            consumer.close()


def timed(cluster, topic: str, records: int, members: int, share: bool, mode: str,
          max_poll_records: int = 500) -> tuple[float, list[int]]:  # fmt: skip
    group = f"bench-{uuid.uuid4().hex[:6]}"
    if share:
        cluster.admin().alter_share_group_config(group, {"share.auto.offset.reset": "earliest"})
    readers = [Reader.remote(cluster, topic, group, share, mode, max_poll_records) for _ in range(members)]
    ray.get([r.ready.remote() for r in readers])
    started = time.monotonic()
    runs = [r.run.remote(records) for r in readers]
    if share:
        admin = cluster.admin()
        while admin.list_share_group_offsets(group).get((topic, 0), 0) < records:
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        counts = ray.get(runs)
    else:
        counts = ray.get(runs)
        elapsed = time.monotonic() - started
    return elapsed, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--mode", choices=["poll", "poll_batch"], nargs="*", default=["poll", "poll_batch"])
    parser.add_argument("--batch-records", type=int, default=500,
                        help="records per log batch (a send_batch call); a share-partition hands out whole batches")
    parser.add_argument("--max-poll-records", type=int, default=2_000, help="each share consumer's")
    parser.add_argument("--config", nargs="*", default=[], help="broker settings, name=value (Kafka's names)")
    args = parser.parse_args()
    ray.init(address="local", include_dashboard=False, log_to_driver=False,
             namespace=f"share-bench-{uuid.uuid4().hex[:6]}")
    data_dir = scratch_dir(prefix="rayk-share-bench-")
    cluster = rayk.start(brokers=3, data_dir=data_dir, config={"group.initial.rebalance.delay.ms": 0, **dict(c.split("=", 1) for c in args.config)})
    try:
        topic = "share-bench"
        cluster.create_topic(topic, num_partitions=1, replication_factor=3)
        rng = np.random.default_rng(1)
        with cluster.producer(acks="all") as producer:
            for first in range(0, args.records, args.batch_records):
                rows = rng.integers(0, 256, size=(min(args.batch_records, args.records - first), VALUE_BYTES), dtype=np.uint8)
                producer.send_batch(topic, rows)
        print(f"{args.records:,} records of {VALUE_BYTES} B in {topic} (1 partition, RF=3) in log batches of "
              f"{args.batch_records:,}; share consumers poll {args.max_poll_records:,} records at most")
        timed(cluster, topic, args.records, 1, False, "poll")  # warm-up: page cache, the first group's coordinator
        for mode in args.mode:
            classic_s, classic_counts = timed(cluster, topic, args.records, 1, False, mode)
            print(f"{mode}: classic group, 1 consumer:   {args.records / classic_s:>10,.0f} rec/s  "
                  f"({classic_s:.1f} s, {classic_counts})")  # fmt: skip
            share_s, share_counts = timed(cluster, topic, args.records, args.consumers, True, mode, args.max_poll_records)
            print(f"{mode}: share group, {args.consumers} consumers:   {args.records / share_s:>10,.0f} accepted rec/s  "
                  f"({share_s:.1f} s, per member {share_counts})")  # fmt: skip
            print(f"{mode}: share / classic: {classic_s / share_s:.2f}x")
    finally:
        cluster.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
