"""A durable work queue for Ray on a rayk topic: a pool of actors, one killed mid-work.

    python examples/work_queue.py [--jobs 2000] [--workers 3] [--address auto]

1. A producer writes `--jobs` jobs into the topic `jobs` (one partition: the workers share
   it record by record, which a consumer group could not do).
2. A WorkQueue (rayk.work_queue) of `--workers` Ray actors, all members of the share group
   `job-workers`, works through them: each job's function writes its result, with the
   name of the actor that did it, to `jobs-done`. A job whose payload says "poison" fails
   every time: after 3 deliveries it goes to the dead-letter topic `jobs-dlq`.
3. Mid-work, one actor's process is killed (SIGKILL). Ray restarts it as a new member, and
   the jobs it held go to the others once their locks expire.
4. When the group has settled every job, the script reads `jobs-done` and checks: every
   job was done, and a job done twice was first done by the killed actor (before or after
   its restart: it died before those acceptances were committed) - at-least-once, with
   duplicates only where a worker died.

Without `--address` it starts a local Ray and a 3-broker rayk cluster (with a 5 s record
lock) in a temporary directory and removes both at the end; with `--address` it uses that
Ray cluster and the rayk cluster running there and leaves them running.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import tempfile
import time
from collections import Counter, defaultdict

import ray

import rayk
from rayk.ray_settings import RAY_SYSTEM_CONFIG
from rayk.work_queue import WorkQueue

LOCK_MS = 5_000  # group.share.record.lock.duration.ms of the demo's own cluster (Kafka's default: 30 s)
_producers: dict[str, object] = {}


def do_job(cluster, done_topic: str):
    """The function each worker calls per job: the result goes to `done_topic`."""

    def run(record) -> None:
        if record.value.startswith(b"poison"):
            raise ValueError(f"job {record.key!r} cannot be done")
        producer = _producers.get(done_topic)
        if producer is None:  # one per worker process
            producer = _producers[done_topic] = cluster.producer(acks="all")
        worker = ray.get_runtime_context().get_actor_id()
        time.sleep(0.002)  # the work
        producer.send(done_topic, record.value.upper(), key=record.key, headers=[("worker", worker.encode())]).result(60)

    return run


def run_queue(cluster, jobs: int, workers: int, suffix: str = "") -> None:
    topic, done, dlq, group = f"jobs{suffix}", f"jobs-done{suffix}", f"jobs-dlq{suffix}", f"job-workers{suffix}"
    for name in (topic, done, dlq):
        cluster.create_topic(name, num_partitions=1, replication_factor=3)
    poison = {jobs // 2}
    with cluster.producer(acks="all", linger_ms=5) as producer:
        for i in range(jobs):
            producer.send(topic, b"poison" if i in poison else f"job-{i}".encode(), key=str(i).encode())
    print(f"1. produced {jobs:,} jobs into {topic!r} (job {min(poison)} is poison)")
    cluster.admin().alter_share_group_config(group, {"share.auto.offset.reset": "earliest"})
    pool = WorkQueue(cluster, topic, group_id=group, fn=do_job(cluster, done), num_workers=workers,
                     dead_letter_topic=dlq, max_deliveries=3, max_poll_records=20)  # fmt: skip
    started = time.monotonic()
    try:
        victim = pool.workers[0]
        victim_id = ray.get(victim.actor_id.remote())
        while (accepted := sum(s.accepted for s in pool.stats())) < jobs // 4:
            time.sleep(0.05)
        os.kill(ray.get(victim.pid.remote()), signal.SIGKILL)
        print(f"2. {workers} workers; killed one ({victim_id[:8]}) after {accepted:,} jobs")
        pool.wait_until_idle(timeout_s=600)
        stats = pool.stats()
    finally:
        pool.stop()
    print(f"3. every job settled in {time.monotonic() - started:.1f} s: "
          + ", ".join(f"{s.worker} accepted {s.accepted}" for s in stats))  # fmt: skip
    by_job: dict[bytes, list[str]] = defaultdict(list)
    consumer = cluster.consumer(auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([(done, 0)])
    end = consumer.end_offsets([(done, 0)])
    while consumer.position((done, 0)) < next(iter(end.values())):
        for records in consumer.poll(timeout_ms=1000).values():
            for r in records:
                by_job[r.key].append(dict(r.headers)["worker"].decode())
    consumer.close()
    dead = read_all(cluster, dlq)
    missing = [i for i in range(jobs) if i not in poison and str(i).encode() not in by_job]
    twice = {job: workers_ for job, workers_ in by_job.items() if len(workers_) > 1}
    not_the_victim = [job for job, workers_ in twice.items() if workers_[0] != victim_id]
    print(f"4. {len(by_job):,} jobs done, {len(twice)} of them twice, {len(dead)} in the dead-letter topic")
    assert not missing, f"jobs never done: {missing[:10]}"
    assert not not_the_victim, f"jobs done twice though their first worker lived: {not_the_victim[:10]}"
    assert [r.key for r in dead] == [str(i).encode() for i in sorted(poison)], dead
    assert Counter(dict(r.headers)["rayk.dlq.delivery.count"] for r in dead) == Counter({b"3": 1})
    print("work queue check passed: every job done, duplicates only among the killed worker's")


def read_all(cluster, topic: str) -> list:
    consumer = cluster.consumer(auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([(topic, 0)])
    end = next(iter(consumer.end_offsets([(topic, 0)]).values()))
    out = []
    while consumer.position((topic, 0)) < end:
        for records in consumer.poll(timeout_ms=1000).values():
            out += records
    consumer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--address", help="an existing Ray cluster with rayk running (default: start both here)")
    args = parser.parse_args()
    if args.jobs < 4 or args.workers < 2:
        parser.error("--jobs must be >= 4 and --workers >= 2 (one of them is killed)")
    data_dir = None
    if args.address:
        ray.init(address=args.address, log_to_driver=False)
        cluster = rayk.connect()
    else:
        ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 _system_config=dict(RAY_SYSTEM_CONFIG))  # fmt: skip
        data_dir = tempfile.mkdtemp(prefix="rayk-work-queue-")
        cluster = rayk.start(brokers=3, data_dir=data_dir, config={"group.share.record.lock.duration.ms": LOCK_MS})
    try:
        run_queue(cluster, args.jobs, args.workers, "" if data_dir else f"-{int(time.time())}")
    finally:
        if data_dir:
            cluster.shutdown()
            ray.shutdown()
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
