"""A Spark-on-Ray pipeline over rayk topics: click events in, clicks per user and minute out.

    python examples/spark_pipeline.py [--events 20000] [--users 25] [--stream-events 10000] [--address auto]

1. A producer writes `--events` JSON click events {"user", "page"} into the topic
   `clicks` (6 partitions, replication factor 3, keyed by user), with timestamps spread
   over five minutes.
2. A Spark job on Ray (RayDP) reads `clicks` as a DataFrame (rayk.spark.read_topic),
   parses the JSON, counts clicks and distinct pages per user and one-minute window, and
   writes each result as JSON, keyed by user, to `clicks-per-user` (rayk.spark.write_topic).
3. A consumer in a consumer group reads `clicks-per-user` and prints the busiest users.
   The script checks that the counts add up to the events produced.
4. The same topic as a stream (rayk.spark.stream_topic, Spark's foreachBatch shape):
   while a producer sends `--stream-events` more clicks, each micro-batch of at most
   10,000 records counts its clicks per page; the group `click-stream` commits after
   each batch. The script checks that the batches counted every click once.

Without `--address` it starts a local Ray and a 3-broker rayk cluster in a temporary
directory and removes both at the end; with `--address` it uses that Ray cluster and the
rayk cluster already running there (`rayk start`) and leaves them running.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import tempfile
import time

import ray

import rayk
from rayk import spark as rayk_spark
from rayk.ray_settings import RAY_SYSTEM_CONFIG

PAGES = ("/", "/search", "/cart", "/checkout", "/help", "/product")
WINDOW = "1 minute"
SPAN_MS = 5 * 60 * 1000


def produce_clicks(cluster, topic: str, events: int, users: int, label: str = "1.") -> None:
    rng = random.Random(events)
    start_ms = (int(time.time() * 1000) // 60_000 - 5) * 60_000  # five whole minutes ago
    with cluster.producer(acks="all", linger_ms=10, key_serializer="str") as producer:
        for i in range(events):
            user = f"user-{rng.randrange(users):03d}"
            event = {"user": user, "page": rng.choice(PAGES)}
            producer.send(topic, json.dumps(event).encode(), key=user, timestamp_ms=start_ms + i * SPAN_MS // events)
    print(f"{label} produced {events:,} click events for {users} users into {topic!r}")


def aggregate(spark, cluster, source: str, target: str) -> int:
    from pyspark.sql import functions as F

    clicks = rayk_spark.read_topic(spark, source, cluster=cluster)
    events = clicks.select(
        F.from_json(F.col("value").cast("string"), "user string, page string").alias("event"), "timestamp"
    ).select("event.user", "event.page", "timestamp")
    per_user = events.groupBy("user", F.window("timestamp", WINDOW)).agg(
        F.count("*").alias("clicks"), F.countDistinct("page").alias("pages")
    )
    results = per_user.select(
        F.col("user").cast("binary").alias("key"),
        F.to_json(
            F.struct("user", F.date_format("window.start", "HH:mm").alias("minute"), "clicks", "pages")
        ).cast("binary").alias("value"),
    )
    written = rayk_spark.write_topic(results, target, cluster=cluster)
    print(f"2. Spark read {clicks.count():,} records, wrote {written} per-user-minute results to {target!r}")
    return written


def print_results(cluster, topic: str, expected: int, events: int) -> None:
    # The cluster's first group creates __consumer_offsets (3 partitions, 9 replica actors,
    # each a process), which takes some seconds on two cores; consumer_timeout_ms counts
    # from the start of iteration, joining included, as in kafka-python.
    consumer = cluster.consumer(
        topic, group_id="click-report", auto_offset_reset="earliest", consumer_timeout_ms=60_000,
        value_deserializer=lambda b: json.loads(b),
    )  # fmt: skip
    results = []
    for record in consumer:
        results.append(record.value)
        if len(results) == expected:
            break
    consumer.close()
    total = sum(r["clicks"] for r in results)
    per_user: dict[str, int] = {}
    for r in results:
        per_user[r["user"]] = per_user.get(r["user"], 0) + r["clicks"]
    print(f"3. consumed {len(results)} results; busiest users:")
    print("   user      clicks  minutes")
    for user, clicks in sorted(per_user.items(), key=lambda kv: -kv[1])[:5]:
        minutes = sum(1 for r in results if r["user"] == user)
        print(f"   {user}  {clicks:6d}  {minutes:7d}")
    if len(results) != expected or total != events:
        raise SystemExit(f"pipeline check FAILED: {len(results)}/{expected} results, {total}/{events} clicks")
    print(f"pipeline check passed: every one of the {events:,} clicks is counted once")


def stream_clicks(spark, cluster, source: str, total: int, more_events: int, users: int) -> None:
    from pyspark.sql import functions as F

    counted: list[int] = []

    def count_pages(df, batch_id: int) -> None:
        pages = df.groupBy(F.get_json_object(F.col("value").cast("string"), "$.page").alias("page")).count().collect()
        counted.append(sum(r["count"] for r in pages))
        top = max(pages, key=lambda r: r["count"])
        print(f"   batch {batch_id}: {counted[-1]:,} clicks, the most on {top['page']!r} ({top['count']:,})")

    query = rayk_spark.stream_topic(
        spark, source, "click-stream", count_pages, trigger_ms=1000, max_records_per_batch=10_000,
        starting_offsets="earliest", cluster=cluster,
    )  # fmt: skip
    print(f"4. streaming {source!r} in micro-batches while more clicks arrive:")
    produce_clicks(cluster, source, more_events, users, "   meanwhile:")  # the stream runs on a thread of its own
    deadline = time.monotonic() + 120
    while sum(counted) < total + more_events and query.is_active and time.monotonic() < deadline:
        time.sleep(0.2)
    query.stop()
    if query.exception() is not None:
        raise query.exception()
    if sum(counted) != total + more_events:
        raise SystemExit(f"stream check FAILED: the batches counted {sum(counted):,} of {total + more_events:,} clicks")
    print(f"stream check passed: {len(counted)} micro-batches counted each of the {sum(counted):,} clicks once")


def run_pipeline(
    spark, cluster, source: str, target: str, events: int, users: int, stream_events: int,
    source_partitions: int = 6, target_partitions: int = 3,
) -> None:
    """Steps 1 to 4 on a Spark session and a rayk cluster, into new topics `source` and
    `target` (replication factor 3: one replica process per partition on each broker)."""
    cluster.create_topic(source, num_partitions=source_partitions, replication_factor=3)
    cluster.create_topic(target, num_partitions=target_partitions, replication_factor=3)
    produce_clicks(cluster, source, events, users)
    written = aggregate(spark, cluster, source, target)
    print_results(cluster, target, written, events)
    stream_clicks(spark, cluster, source, events, stream_events, users)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=25)
    parser.add_argument("--stream-events", type=int, default=10_000)
    parser.add_argument("--address", help="an existing Ray cluster with rayk running (default: start both here)")
    args = parser.parse_args()
    if args.events < 1 or args.users < 1 or args.stream_events < 0:
        parser.error("--events and --users must be >= 1, --stream-events >= 0")

    data_dir = None
    if args.address:
        ray.init(address=args.address, log_to_driver=False)
        cluster = rayk.connect()
    else:
        ray.init(
            include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, _system_config=dict(RAY_SYSTEM_CONFIG)
        )
        data_dir = tempfile.mkdtemp(prefix="rayk-pipeline-")
        cluster = rayk.start(brokers=3, data_dir=data_dir)
    try:
        suffix = "" if data_dir else f"-{int(time.time())}"  # fresh topics on a long-running cluster
        run(cluster, args.events, args.users, args.stream_events, suffix)
    finally:
        if data_dir is not None:
            cluster.shutdown()
            shutil.rmtree(data_dir, ignore_errors=True)
        ray.shutdown()


def run(cluster, events: int = 20_000, users: int = 25, stream_events: int = 10_000, suffix: str = "",
        **partitions: int) -> None:  # fmt: skip
    """The pipeline on `cluster`, in a Spark session of its own (examples/demo.py runs it on
    the cluster it shares with the other demos); `partitions`: run_pipeline's
    `source_partitions` and `target_partitions`."""
    ray.data.DataContext.get_current().enable_progress_bars = False
    source, target = f"clicks{suffix}", f"clicks-per-user{suffix}"
    spark = rayk_spark.session("click-aggregation", executors=1, executor_cores=1, executor_memory="1g")
    try:
        run_pipeline(spark, cluster, source, target, events, users, stream_events, **partitions)
    finally:
        rayk_spark.stop()


if __name__ == "__main__":
    main()
