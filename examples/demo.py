"""`make demo`: the three demos on one local Ray and one 3-broker rayk cluster.

    python examples/demo.py [--records 1000000]

1. `rayk demo`'s run (rayk.cli.run_demo): 1,000,000 records with acks=all, read back by a
   consumer group, each checked once and in order;
2. examples/spark_pipeline.py's pipeline: Spark on Ray from topic to topic, batch and as
   a stream;
3. examples/work_queue.py's work queue: Ray actors on a share group, one killed mid-work.

Each of them also runs alone (`rayk demo`, `python examples/spark_pipeline.py`, ...), each
starting its own Ray and cluster; here they share one, which saves two starts of each
(~25 s apiece on two cores). Everything is removed at the end.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time

import ray

import rayk
from rayk import cli
from rayk.ray_settings import RAY_SYSTEM_CONFIG

sys.path.insert(0, __file__.rpartition("/")[0] or ".")  # the examples beside this file
import spark_pipeline  # noqa: E402
import work_queue  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="rayk demo's records (default 1,000,000)")
    args = parser.parse_args()
    started = time.monotonic()
    data_dir = tempfile.mkdtemp(prefix="rayk-demo-")
    print(f"make demo: a local Ray and 3 brokers, data in {data_dir}")
    ray.init(address="local", namespace=cli.DEMO_NAMESPACE, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR, _system_config=dict(RAY_SYSTEM_CONFIG))  # fmt: skip
    try:
        # Every replica is a process (~1 CPU-s to start here): the demos' few groups share one
        # offsets partition, and each demo deletes its topics when it is done.
        config = {"group.initial.rebalance.delay.ms": 0,  # rayk demo's: its one consumer need not wait
                  "group.share.record.lock.duration.ms": work_queue.LOCK_MS,
                  "offsets.topic.num.partitions": 1}  # fmt: skip
        cluster = rayk.start(brokers=3, data_dir=data_dir, namespace=cli.DEMO_NAMESPACE, config=config)
        try:
            print("\n== rayk demo ==")
            failed = cli.run_demo(argparse.Namespace(records=args.records, out=sys.stdout), cluster, started)
            cluster.delete_topic(cli.DEMO_TOPIC)
            print("\n== Spark on Ray (examples/spark_pipeline.py) ==")
            spark_pipeline.run(cluster, source_partitions=3, target_partitions=1)
            for topic in ("clicks", "clicks-per-user"):
                cluster.delete_topic(topic)
            print("\n== a work queue of Ray actors (examples/work_queue.py) ==")
            work_queue.run_queue(cluster, jobs=2_000, workers=3)
        finally:
            cluster.shutdown()
    finally:
        ray.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"\nmake demo: {'passed' if not failed else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return failed


if __name__ == "__main__":
    sys.exit(main())
