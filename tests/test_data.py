"""Topics as Ray Datasets (rayk.data) against a 3-broker cluster on one Ray node."""

from __future__ import annotations

import dataclasses

import itertools
import os
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
import ray
from ray.remote_function import RemoteFunction

import rayk
from rayk import data as rayk_data
from rayk.client.offset_ranges import OffsetRange
from rayk.errors import (
    InvalidConfigurationError,
    InvalidTxnStateError,
    KafkaError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    UnknownTopicOrPartitionError,
)
from tests.cluster_helpers import FAST_CONFIG, NO_LISTENERS, shared_local_ray, wait_until


pytestmark = pytest.mark.usefixtures("delete_topics_after_test")


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()
    ray.data.DataContext.get_current().enable_progress_bars = False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("data"), config={**FAST_CONFIG, **NO_LISTENERS},
                   namespace="data")
    yield c
    c.shutdown()


_topics = itertools.count()


def new_topic(cluster, partitions=3, replication_factor=1, **config) -> str:
    """RF 1 unless the test is about replication (each replica is a process to start)."""
    name = f"d{next(_topics)}"
    cluster.create_topic(name, num_partitions=partitions, replication_factor=replication_factor, config=config or None)
    return name


def rows_of(ds) -> list[dict]:
    return sorted(ds.take_all(), key=lambda r: (r["partition"], r["offset"]))


def test_a_dataset_round_trips_through_a_topic_with_every_column(cluster):
    topic = new_topic(cluster)
    source = ray.data.from_arrow(
        pa.table(
            {
                "key": [b"k0", None, b"k2", b"k3"],
                "value": [b"v0", b"v1", None, b"v3"],
                "partition": [0, 1, 2, 1],
                "headers": [[{"key": "h", "value": b"x"}], [], [{"key": "a", "value": None}], []],
                "timestamp": pa.array([1_700_000_000_000 + i for i in range(4)], pa.timestamp("ms")),
            }
        )
    )
    assert rayk_data.write_topic(source, topic, cluster=cluster) == 4
    ds = rayk_data.read_topic(topic, cluster=cluster)
    assert ds.schema().base_schema == rayk_data.SCHEMA
    rows = rows_of(ds)
    assert [(r["partition"], r["offset"], r["key"], r["value"]) for r in rows] == [
        (0, 0, b"k0", b"v0"), (1, 0, None, b"v1"), (1, 1, b"k3", b"v3"), (2, 0, b"k2", None),
    ]
    assert {r["topic"] for r in rows} == {topic} and {r["timestampType"] for r in rows} == {0}
    assert [r["timestamp"].timestamp() * 1000 for r in rows] == [1_700_000_000_000 + i for i in (0, 1, 3, 2)]
    assert [r["headers"] for r in rows] == [[{"key": "h", "value": b"x"}], [], [], [{"key": "a", "value": None}]]
    as_ray = rayk_data.read_topic(topic, cluster=cluster, schema="ray")  # the columns of ray.data.read_kafka
    assert as_ray.schema().base_schema == rayk_data.RAY_SCHEMA
    assert [(r["partition"], r["offset"], r["key"], r["value"], r["timestamp"], r["timestamp_type"], r["headers"])
            for r in rows_of(as_ray)] == [
        (0, 0, b"k0", b"v0", 1_700_000_000_000, 1, [("h", b"x")]),
        (1, 0, None, b"v1", 1_700_000_000_001, 1, []),
        (1, 1, b"k3", b"v3", 1_700_000_000_003, 1, []),
        (2, 0, b"k2", None, 1_700_000_000_002, 1, [("a", None)]),
    ]  # fmt: skip
    copy = new_topic(cluster)
    sink = rayk_data.TopicDatasink(copy, cluster=cluster)
    as_ray.write_datasink(sink)  # its columns write back as they are: a map of headers, ms timestamps
    assert sink.written == 4

    def but_topic(rows):
        return [{k: v for k, v in r.items() if k != "topic"} for r in rows]

    assert but_topic(rows_of(rayk_data.read_topic(copy, cluster=cluster))) == but_topic(rows), "the same records"


def test_string_values_keys_and_keyed_partitioning(cluster):
    topic = new_topic(cluster, partitions=4)
    source = ray.data.from_items([{"key": f"user-{i % 5}", "value": f"click {i}"} for i in range(200)])
    assert rayk_data.write_topic(source, topic, cluster=cluster) == 200
    rows = rows_of(rayk_data.read_topic(topic, cluster=cluster))
    assert len(rows) == 200
    partitions_of_key = {}
    for r in rows:
        partitions_of_key.setdefault(r["key"], set()).add(r["partition"])
    assert all(len(ps) == 1 for ps in partitions_of_key.values()), "a key always lands on one partition"
    assert sorted(int(r["value"].split()[1]) for r in rows) == list(range(200))
    assert all(r["key"] == b"user-%d" % (int(r["value"].split()[1]) % 5) for r in rows), "strings are utf-8"


def test_offset_ranges_timestamps_and_splitting(cluster):
    topic = new_topic(cluster, partitions=2)
    source = ray.data.from_items(
        [{"value": b"%d" % i, "partition": i % 2, "timestamp": 1_000_000 + i * 1000} for i in range(100)]
    )
    rayk_data.write_topic(source, topic, cluster=cluster)
    ds = rayk_data.read_topic(topic, f'{{"{topic}":{{"0":10,"1":-2}}}}', {topic: {0: 20, 1: 5}}, cluster=cluster)
    assert [(r["partition"], r["offset"]) for r in rows_of(ds)] == [(0, o) for o in range(10, 20)] + [
        (1, o) for o in range(5)
    ]
    ds = rayk_data.read_topic(topic, starting_timestamp=1_000_000 + 90 * 1000, cluster=cluster)
    assert sorted(int(r["value"]) for r in rows_of(ds)) == list(range(90, 100))
    assert rayk_data.read_topic(topic, starting_timestamp=9_000_000, cluster=cluster).count() == 0
    split = rayk_data.read_topic(topic, cluster=cluster, records_per_task=7).materialize()
    assert split.num_blocks() == 2 * 8  # 50 records per partition in tasks of at most 7
    assert [(r["partition"], r["offset"]) for r in rows_of(split)] == [(p, o) for p in (0, 1) for o in range(50)]
    for blocks in (5, 1):  # 5: tasks of 20 offsets, one of them the end of partition 0 and the start of 1
        ds = rayk_data.read_topic(topic, cluster=cluster, override_num_blocks=blocks).materialize()
        assert ds.num_blocks() == blocks
        assert [(r["partition"], r["offset"]) for r in rows_of(ds)] == [(p, o) for p in (0, 1) for o in range(50)]
    with pytest.raises(OffsetOutOfRangeError):
        rayk_data.read_topic(topic, {topic: {0: 0, 1: 51}}, cluster=cluster)
    with pytest.raises(InvalidConfigurationError):
        rayk_data.read_topic(topic, "latest", cluster=cluster)
    with pytest.raises(UnknownTopicOrPartitionError):
        rayk_data.read_topic("no-such-topic", cluster=cluster)
    with pytest.raises(InvalidConfigurationError, match="'spark', 'ray'"):
        rayk_data.read_topic(topic, cluster=cluster, schema="avro")
    with pytest.raises(InvalidConfigurationError, match="'spark', 'ray'"):
        rayk_data.stream_topic(topic, "g", cluster=cluster, schema="kafka")
    for bad in (dict(override_num_blocks=0), dict(concurrency=0), dict(ray_remote_args=["num_cpus"])):
        with pytest.raises(InvalidConfigurationError, match=next(iter(bad))):
            rayk_data.read_topic(topic, cluster=cluster, **bad)


def test_override_num_blocks_cuts_the_snapshot_into_runs_of_equal_offsets():
    ranges = [OffsetRange("t", 0, 10, 60, leader=1), OffsetRange("t", 1, 0, 50, leader=2)]
    assert [[(r.partition, r.start, r.end) for r in task] for task in rayk_data.cut_into_tasks(ranges, 3)] == [
        [(0, 10, 44)], [(0, 44, 60), (1, 0, 17)], [(1, 17, 50)],
    ]  # fmt: skip
    one_each = rayk_data.cut_into_tasks(ranges[1:], 80)
    assert [task[0].start for task in one_each] == list(range(50)), "fewer than 80: at most one per offset"
    # A read_committed plan stays read_committed in every piece (its tasks dropped it, and
    # read aborted records as committed).
    committed = [dataclasses.replace(r, read_committed=True) for r in ranges]
    assert all(piece.read_committed for task in rayk_data.cut_into_tasks(committed, 3) for piece in task)


def test_an_empty_topic_is_an_empty_dataset_with_the_schema(cluster):
    ds = rayk_data.read_topic(new_topic(cluster, partitions=1), cluster=cluster)
    assert ds.count() == 0
    assert ds.schema().base_schema == rayk_data.SCHEMA


def test_a_read_is_a_snapshot_while_writers_append(cluster):
    topic = new_topic(cluster, partitions=2, replication_factor=3)  # reads stop at the HW
    rayk_data.write_topic(ray.data.from_items([{"value": b"old"}] * 500), topic, cluster=cluster)
    stop = threading.Event()

    def keep_writing():
        with cluster.producer(acks=1, linger_ms=1) as producer:
            while not stop.is_set():
                producer.send(topic, value=b"new")
                time.sleep(0.0005)

    def records_now():
        return sum(p["high_watermark"] for p in cluster.describe_topic(topic))

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        time.sleep(0.5)
        ds = rayk_data.read_topic(topic, cluster=cluster)  # lazy: each execution reads the snapshot of this call
        at_the_call = records_now()
        time.sleep(0.5)
        rows = rows_of(ds)
    finally:
        stop.set()
        writer.join()
    for p in (0, 1):
        offsets = [r["offset"] for r in rows if r["partition"] == p]
        assert offsets == list(range(len(offsets))), "each partition is a gapless prefix"
    assert 500 < len(rows) <= at_the_call < records_now(), "records appended after the call are not part of it"
    assert rows_of(ds) == rows, "nor of a second execution, after more were appended"


@pytest.fixture
def submitted_tasks(monkeypatch) -> list[dict]:
    """The options of every Ray task this process submits from now on (all `f.remote()`,
    Ray Data's tasks included, go through RemoteFunction._remote); "name" is a Ray Data
    task's operator, like "ReadTopic" or "Write"."""
    submitted = []
    submit = RemoteFunction._remote

    def recording(self, *args, **options):
        submitted.append(options)
        return submit(self, *args, **options)

    monkeypatch.setattr(RemoteFunction, "_remote", recording)
    return submitted


def test_read_topic_starts_no_task_until_the_dataset_executes(cluster, submitted_tasks):
    topic = new_topic(cluster, partitions=2)
    produce_values(cluster, topic, [b"old"] * 10, 2)
    ds = rayk_data.read_topic(topic, cluster=cluster)
    assert submitted_tasks == [], "read_topic plans the read (the snapshot) and starts no task"
    produce_values(cluster, topic, [b"new"] * 4, 2)
    assert ds.count() == 10, "count() reads (row counts are not known before), the snapshot of the call"
    assert [o for o in submitted_tasks if o.get("name", "").startswith("ReadTopic")], "the read tasks, now"


def test_ray_remote_args_and_concurrency_reach_the_read_tasks(cluster, submitted_tasks):
    topic = new_topic(cluster, partitions=2)
    produce_values(cluster, topic, [b"v"] * 10, 2)
    ds = rayk_data.read_topic(
        topic, cluster=cluster, ray_remote_args={"num_cpus": 0.5, "memory": 64 << 20}, concurrency=1
    )
    assert len(ds.take_all()) == 10
    reads = [o for o in submitted_tasks if o.get("name", "").startswith("ReadTopic")]
    assert len(reads) == 2 and all((o["num_cpus"], o["memory"]) == (0.5, 64 << 20) for o in reads)


def test_a_topic_datasink_users_make_writes_resumably_and_counts(cluster, submitted_tasks):
    topic = new_topic(cluster, partitions=2)
    sink = rayk_data.TopicDatasink(topic, cluster=cluster, linger_ms=1)
    rows = [{"key": f"k{i % 3}", "value": f"v{i}"} for i in range(200)]
    ray.data.from_items(rows, override_num_blocks=20).write_datasink(sink)
    assert sink.written == 200, "on_write_complete ran on this sink"
    writes = [o for o in submitted_tasks if "Write" in o.get("name", "")]
    assert len(writes) == 1, "20 blocks, bundled into one task of at least min_rows_per_write rows"
    values = [r["value"] for r in rows_of(rayk_data.read_topic(topic, cluster=cluster))]
    assert sorted(values) == sorted(b"v%d" % i for i in range(200))
    with pytest.raises(UnknownTopicOrPartitionError):
        rayk_data.TopicDatasink("no-such-topic", cluster=cluster)


def test_a_dead_follower_does_not_stop_reads_or_writes(cluster):
    topic = new_topic(cluster, partitions=1, replication_factor=3)
    leader = cluster.describe_topic(topic)[0]["leader"]
    follower = next(b for b in cluster.describe_topic(topic)[0]["replicas"] if b != leader)
    rayk_data.write_topic(ray.data.from_items([{"value": b"%d" % i} for i in range(100)]), topic, cluster=cluster)
    ray.kill(cluster.broker(follower))
    try:
        wait_until(lambda: follower not in cluster.describe_topic(topic)[0]["isr"], 30, "the ISR to shrink")
        written = rayk_data.write_topic(
            ray.data.from_items([{"value": b"%d" % i} for i in range(100, 150)]), topic, cluster=cluster
        )
        assert written == 50
        rows = rows_of(rayk_data.read_topic(topic, cluster=cluster))
        assert [r["offset"] for r in rows] == list(range(150))
        assert sorted(int(r["value"]) for r in rows) == list(range(150)), "write tasks run side by side: any order"
    finally:
        cluster.restart_broker(follower)
    wait_until(lambda: len(cluster.describe_topic(topic)[0]["isr"]) == 3, 60, "the ISR to heal")


def test_write_fails_when_records_are_not_acknowledged_and_on_bad_columns(cluster):
    topic = new_topic(cluster, partitions=1, replication_factor=3, **{"min.insync.replicas": "3"})
    follower = next(b for b in cluster.describe_topic(topic)[0]["replicas"] if b != cluster.describe_topic(topic)[0]["leader"])
    ray.kill(cluster.broker(follower))
    try:
        wait_until(lambda: len(cluster.describe_topic(topic)[0]["isr"]) == 2, 30, "the ISR to shrink")
        with pytest.raises(Exception, match="NOT_ENOUGH_REPLICAS"):
            rayk_data.write_topic(
                ray.data.from_items([{"value": b"x"}] * 10), topic, cluster=cluster, delivery_timeout_ms=1500,
                request_timeout_ms=1000,
            )
    finally:
        cluster.restart_broker(follower)
    with pytest.raises(Exception, match="'value' column"):
        rayk_data.write_topic(ray.data.from_items([{"payload": b"x"}]), topic, cluster=cluster)
    with pytest.raises(Exception, match="binary or string"):
        rayk_data.write_topic(ray.data.from_items([{"value": 5}]), topic, cluster=cluster)
    with pytest.raises(UnknownTopicOrPartitionError):
        rayk_data.write_topic(ray.data.from_items([{"value": b"x"}]), "no-such-topic", cluster=cluster)
    assert issubclass(OffsetOutOfRangeError, KafkaError)


# ---------------------------------------------------------------------------- streams


def produce_values(cluster, topic, values, partitions) -> None:
    with cluster.producer(linger_ms=1) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value, partition=i % partitions)


def offsets_of(ds) -> list[tuple[int, int]]:
    return [(r["partition"], r["offset"]) for r in rows_of(ds)]


def test_a_stream_hands_out_what_arrived_since_the_last_batch_and_commits_after_the_loop_body(cluster):
    topic = new_topic(cluster, partitions=2)
    produce_values(cluster, topic, [b"before"] * 4, 2)
    stream = rayk_data.stream_topic(topic, "s-new", trigger_ms=50, cluster=cluster)  # "latest": not the 4 before
    produce_values(cluster, topic, [b"first"] * 6, 2)
    consumer = cluster.consumer(group_id="s-new", enable_auto_commit=False)
    batches = iter(stream)
    first = next(batches)
    assert stream.batch_id == 0
    assert offsets_of(first) == [(p, o) for p in (0, 1) for o in (2, 3, 4)]
    assert {r["value"] for r in rows_of(first)} == {b"first"}
    assert consumer.committed((topic, 0)) == 2, "a batch handed out is not committed yet"
    copy = new_topic(cluster, partitions=2)
    assert stream.write_topic(first, copy) == 6, "without exactly_once, rayk.data.write_topic"
    assert sorted(r["value"] for r in rayk_data.read_topic(copy, cluster=cluster).take_all()) == [b"first"] * 6
    produce_values(cluster, topic, [b"second"] * 2, 2)
    second = next(batches)
    assert (stream.batch_id, offsets_of(second)) == (1, [(0, 5), (1, 5)])
    assert [consumer.committed((topic, p)) for p in (0, 1)] == [5, 5], "asking for the next batch committed the first"
    stream.stop()
    with pytest.raises(StopIteration):
        next(batches)
    assert [consumer.committed((topic, p)) for p in (0, 1)] == [6, 6], "stop() committed the batch processed last"
    again = rayk_data.stream_topic(topic, "s-new", trigger_ms=50, cluster=cluster)
    threading.Timer(0.5, again.stop).start()  # nothing new arrives: no batch, and stop ends the wait
    assert list(again) == []
    consumer.close()


def test_a_batch_left_by_an_exception_comes_again_with_its_id_and_the_budget_caps_every_batch(cluster):
    topic = new_topic(cluster, partitions=3)
    produce_values(cluster, topic, [b"v"] * 30, 3)
    settings = dict(trigger_ms=0, max_records_per_batch=12, starting_offsets="earliest", cluster=cluster)
    with pytest.raises(RuntimeError), rayk_data.stream_topic(topic, "s-retry", **settings) as stream:
        for ds in stream:
            failed = offsets_of(ds)
            raise RuntimeError("the sink failed")
    assert len(failed) == 12
    seen, ids = [], []
    with rayk_data.stream_topic(topic, "s-retry", **settings) as stream:
        for ds in stream:
            batch = offsets_of(ds)
            if not ids:
                assert (stream.batch_id, batch) == (0, failed), "the uncommitted batch, whole, under its id"
            assert 0 < len(batch) <= 12
            seen += batch
            ids.append(stream.batch_id)
            if len(seen) == 30:
                stream.stop()
    assert ids == [0, 1, 2]
    assert sorted(seen) == [(p, o) for p in range(3) for o in range(10)], "every record once, none skipped"


STREAM_DRIVER = r"""
import sys, time, ray, rayk
from rayk import data as rayk_data
ray.init(address=sys.argv[1], namespace="data", log_to_driver=False)
cluster = rayk.connect(namespace="data")
with open(sys.argv[3], "a") as out:
    stream = rayk_data.stream_topic(sys.argv[2], "s-killed", trigger_ms=0, max_records_per_batch=10,
                                    starting_offsets="earliest", cluster=cluster)
    for ds in stream:
        for row in ds.iter_rows():
            out.write(f"{stream.batch_id} {row['partition']} {row['offset']}\n")
        out.flush()
        time.sleep(0.5)  # the batch is processed, not committed yet: the kill lands here
"""


def test_a_stream_whose_driver_was_killed_resumes_with_nothing_skipped(cluster, tmp_path):
    topic = new_topic(cluster, partitions=2)
    produce_values(cluster, topic, [b"v"] * 60, 2)
    processed = tmp_path / "processed.txt"
    driver = subprocess.Popen(
        [sys.executable, "-c", STREAM_DRIVER, ray.get_runtime_context().gcs_address, topic, str(processed)],
        env={**os.environ, "RAY_AUTH_MODE": "token"},
    )
    try:
        def three_batches_processed():
            assert driver.poll() is None, "the stream driver exited"
            return processed.exists() and len({line.split()[0] for line in processed.read_text().splitlines()}) >= 3

        wait_until(three_batches_processed, timeout_s=60, what="the stream driver to process three batches")
    finally:
        driver.kill()  # the driver this test started, by its pid
        driver.wait()
    before = [tuple(map(int, line.split())) for line in processed.read_text().splitlines()]
    last_id = max(b for b, _, _ in before)
    seen, ids = [(p, o) for _, p, o in before], []
    with rayk_data.stream_topic(topic, "s-killed", trigger_ms=0, cluster=cluster) as stream:
        deadline = threading.Timer(60, stream.stop)  # a skip would otherwise wait here for ever
        deadline.start()
        for ds in stream:
            ids.append(stream.batch_id)
            seen += offsets_of(ds)
            if {(p, o) for p, o in seen} >= {(p, o) for p in (0, 1) for o in range(30)}:
                stream.stop()
        deadline.cancel()
    assert ids[0] in (last_id, last_id + 1), "the next stream picks up at the batch the killed one was processing, or after it"
    assert sorted(set(seen)) == [(p, o) for p in (0, 1) for o in range(30)], "at least once, none skipped"


def test_a_stream_behind_the_log_start_fails_or_with_fail_on_data_loss_off_skips_to_it(cluster):
    topic = new_topic(cluster, partitions=1, **{"segment.bytes": "1024", "retention.bytes": "1"})
    with cluster.producer() as producer:
        for _ in range(20):
            producer.send(topic, b"x" * 200).get(30)  # a batch each, three to a segment
    with cluster.consumer(group_id="s-loss", enable_auto_commit=False) as consumer:
        consumer.commit({(topic, 0): 0})
    ray.get(cluster.leader(topic, 0).enforce_retention.remote())  # what the retention check does every 5 min
    log_start = ray.get(cluster.leader(topic, 0).list_offset.remote(-2))[0]
    assert log_start > 0
    with pytest.raises(OffsetOutOfRangeError, match="deleted before this stream read them"):
        with rayk_data.stream_topic(topic, "s-loss", trigger_ms=0, cluster=cluster) as stream:
            next(iter(stream))
    with rayk_data.stream_topic(topic, "s-loss", trigger_ms=0, fail_on_data_loss=False, cluster=cluster) as stream:
        first = offsets_of(next(iter(stream)))
    assert first == [(0, o) for o in range(log_start, 20)]


def test_a_range_is_read_a_table_per_fetch_in_offset_order_with_the_next_fetch_on_its_way(cluster):
    topic = new_topic(cluster, partitions=1)
    with cluster.producer() as producer:
        for i in range(20):  # 20 batches of 10 records
            producer.send_batch(topic, [b"v%03d" % (10 * i + j) for j in range(10)]).get(timeout=30)
    leader = cluster.describe_topic(topic)[0]["leader"]
    r = OffsetRange(topic, 0, 5, 195, leader)
    tables = list(rayk_data.iter_range(cluster, r, fetch_max_bytes=300))  # a batch or two a fetch
    assert len(tables) >= 10
    assert [o for t in tables for o in t.column("offset").to_pylist()] == list(range(5, 195))
    assert [v for t in tables for v in t.column("value").to_pylist()] == [b"v%03d" % o for o in range(5, 195)]
    assert rayk_data.read_range(cluster, r, fetch_max_bytes=300).equals(pa.concat_tables(tables))
    reading = rayk_data.iter_range(cluster, r, fetch_max_bytes=300)
    assert next(reading).column("offset")[0].as_py() == 5
    reading.close()  # a reader that stops early, a fetch still on its way: its session closes
    assert rayk_data.read_range(cluster, OffsetRange(topic, 0, 7, 7, leader)).num_rows == 0


def test_read_tasks_are_sized_by_bytes_as_well_as_records(cluster):
    topic = new_topic(cluster, partitions=2)
    rayk_data.write_topic(ray.data.from_items([{"value": b"v" * 1000, "partition": i % 2} for i in range(400)]), topic,
                          cluster=cluster)  # fmt: skip
    # ~1,070 bytes a record on disk, 200 a partition: ~214 KB a partition, so 50 KB tasks make 5 a partition
    ds = rayk_data.read_topic(topic, cluster=cluster, bytes_per_task=50_000).materialize()
    assert 2 * 4 <= ds.num_blocks() <= 2 * 6
    assert [(r["partition"], r["offset"]) for r in rows_of(ds)] == [(p, o) for p in (0, 1) for o in range(200)]
    ds = rayk_data.read_topic(topic, cluster=cluster)
    assert ds.materialize().num_blocks() == 2, "64 MiB by default: a task a partition"
    assert 2 * 200 * 1000 < ds.size_bytes() < 2 * 200 * 1200, "estimated from the partitions' size on disk"
    with pytest.raises(InvalidConfigurationError):
        rayk_data.read_topic(topic, cluster=cluster, bytes_per_task=0)


def test_read_committed_reads_and_streams_leave_out_aborted_and_open_transactions(cluster):
    """isolation_level="read_committed": a read ends at the last stable offset (an open
    transaction's records and what follows them wait) and leaves out what aborted
    transactions wrote; read_uncommitted reads all of it. A read_committed stream's batches
    stop at the LSO too."""
    topic = new_topic(cluster, partitions=1)
    producer = cluster.producer(transactional_id=f"data-{topic}")
    producer.init_transactions()
    for commit, values in ((True, [b"c0", b"c1"]), (False, [b"a0", b"a1"]), (True, [b"c2"])):
        producer.begin_transaction()
        producer.send_batch(topic, values)
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    wait_until(lambda: cluster.describe_topic(topic)[0]["high_watermark"] == 8, 30, "the markers")  # 5 records, 3 markers
    stream = rayk_data.stream_topic(topic, "rc-stream", trigger_ms=50, starting_offsets="earliest", cluster=cluster,
                                    isolation_level="read_committed")  # fmt: skip
    producer.begin_transaction()
    producer.send(topic, b"open").get(timeout=30)  # a transaction left open while the reads run
    with cluster.producer() as plain:
        plain.send(topic, b"after")
    committed = rayk_data.read_topic(topic, cluster=cluster, isolation_level="read_committed")
    assert [r["value"] for r in rows_of(committed)] == [b"c0", b"c1", b"c2"]
    cut = rayk_data.read_topic(topic, cluster=cluster, isolation_level="read_committed", override_num_blocks=3)
    assert [r["value"] for r in rows_of(cut)] == [b"c0", b"c1", b"c2"], "each task reads read_committed too"
    everything = rayk_data.read_topic(topic, cluster=cluster)
    assert [r["value"] for r in rows_of(everything)] == [b"c0", b"c1", b"a0", b"a1", b"c2", b"open", b"after"]
    first = next(iter(stream))
    assert [r["value"] for r in rows_of(first)] == [b"c0", b"c1", b"c2"]
    producer.commit_transaction()
    wait_until(lambda: [r["value"] for r in rows_of(rayk_data.read_topic(topic, cluster=cluster, isolation_level="read_committed"))]
               == [b"c0", b"c1", b"c2", b"open", b"after"], 30, "the LSO to move on once the transaction commits")
    stream.close()
    producer.close()
    with pytest.raises(InvalidConfigurationError):
        rayk_data.read_topic(topic, cluster=cluster, isolation_level="read_committed_please")


def values_of(topic, cluster, isolation_level) -> list[bytes]:
    return sorted(r["value"] for r in rayk_data.read_topic(topic, cluster=cluster, isolation_level=isolation_level).take_all())


def test_an_exactly_once_stream_commits_each_batch_s_output_with_its_offsets_and_fences_a_zombie(cluster):
    """exactly_once=True: what the loop body writes with stream.write_topic and the batch's
    offsets are one transaction. A batch left by an exception is aborted, and a stream
    still running when a new one of its group starts (a driver thought dead) is fenced:
    its batch's output is aborted and its commit refused. read_committed readers of the
    sink see every input record's output exactly once."""
    source, sink = (new_topic(cluster, partitions=3, replication_factor=3) for _ in range(2))
    inputs = [b"v%02d" % i for i in range(30)]
    produce_values(cluster, source, inputs, 3)
    settings = dict(trigger_ms=0, max_records_per_batch=12, starting_offsets="earliest", cluster=cluster, exactly_once=True)

    def output(ds):
        return ds.map_batches(lambda t: pa.table({"value": t.column("value")}), batch_format="pyarrow")

    with pytest.raises(RuntimeError), rayk_data.stream_topic(source, "eos", **settings) as stream:
        for ds in stream:
            assert stream.write_topic(output(ds), sink) == 12
            raise RuntimeError("the loop body failed after writing")
    zombie = rayk_data.stream_topic(source, "eos", **settings)
    zombie_batches = iter(zombie)
    zombie.write_topic(output(next(zombie_batches)), sink)  # then it stalls, its batch open
    # write_topic queues: the zombie's records are in the log before its successor fences it
    wait_until(lambda: len(values_of(sink, cluster, "read_uncommitted")) >= 12 + 12, 30, "the zombie's writes")
    with pytest.raises(InvalidTxnStateError), rayk_data.stream_topic(source, "eos-idle", **settings) as idle:
        idle.write_topic(output(ds), sink)  # no batch handed out

    ids = []
    with rayk_data.stream_topic(source, "eos", **settings) as stream:  # fences the zombie
        for ds in stream:
            ids.append(stream.batch_id)
            stream.write_topic(output(ds), sink)
            if len(ids) == 3:
                stream.stop()
    with pytest.raises(ProducerFencedError):
        next(zombie_batches)  # its commit
    zombie.close()
    assert ids == [0, 1, 2]
    # (a commit returns once decided; its markers, and so what read_committed readers see, follow)
    wait_until(lambda: len(values_of(sink, cluster, "read_committed")) >= 30, 30, "the last batch's markers")
    assert values_of(sink, cluster, "read_committed") == inputs, "each input's output once"
    assert len(values_of(sink, cluster, "read_uncommitted")) == 30 + 12 + 12, "the two aborted batches were written"
    consumer = cluster.consumer(group_id="eos", enable_auto_commit=False)
    assert [consumer.committed((source, p)) for p in range(3)] == [10, 10, 10]
    consumer.close()
    with pytest.raises(InvalidConfigurationError):
        rayk_data.stream_topic(source, "eos", **settings, isolation_level="read_uncommitted")


def test_rays_warning_of_the_ray_remote_args_rayk_passes_is_not_shown_to_users():
    """A multi-node read places its tasks through Ray Data's ray_remote_args, which Ray 2.60
    deprecates without a parameter for a scheduling strategy, and Ray's warning names
    rayk's call (test_cluster_failover.py checks where it points). In a process with
    Python's default filters, as a user's is, rayk.data hides that warning, and only it."""
    script = (
        "import warnings, rayk.data\n"
        "from ray.util.annotations import RayDeprecationWarning\n"
        "message = '`ray_remote_args` is deprecated and will be removed in Ray 2.64. Use the named remote parameters instead.'\n"
        "for module in ('rayk.data', 'users_job'):\n"
        "    warnings.warn_explicit(message, RayDeprecationWarning, module + '.py', 1, module=module)\n"
        "warnings.warn_explicit('another deprecation', RayDeprecationWarning, 'rayk/data.py', 2, module='rayk.data')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS",)}
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120).stderr
    assert "users_job.py:1: RayDeprecationWarning: `ray_remote_args`" in shown
    assert "rayk.data.py:1" not in shown
    assert shown.count("`ray_remote_args` is deprecated") == 1, shown
    assert "another deprecation" in shown
