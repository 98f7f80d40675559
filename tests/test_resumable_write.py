"""Resumable write tasks (rayk.client.resumable_write): a retried write task writes no
record twice. TaskRows without Ray; the resume against a 3-broker cluster."""

from __future__ import annotations

import itertools
import threading
import time

import pyarrow as pa
import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st

import rayk
from rayk.client.columns import key_partitions
from rayk.client.idempotence import ProducerIdentity
from rayk.client.resumable_write import (
    STICKY_RUN_BYTES,
    TaskRows,
    reserve_task_producer_ids,
    resume_point,
    write_task,
)
from rayk.client.types import TopicPartition
from rayk.errors import InvalidConfigurationError, KafkaError, OutOfOrderSequenceError
from tests.cluster_helpers import FAST_CONFIG, NO_LISTENERS, read_partition, shared_local_ray

# ---------------------------------------------------------------------------- TaskRows, no Ray


def rows_table(values: list[bytes], keys: list[bytes | None] | None = None) -> pa.Table:
    columns = {"value": pa.array(values, pa.binary())}
    if keys is not None:
        columns["key"] = pa.array(keys, pa.binary())
    return pa.table(columns)


def placed(rows: TaskRows, tables: list[pa.Table]) -> list[tuple[int, bytes]]:
    out = []
    for table in tables:
        kept, partitions = rows.place(table)
        assert kept.num_rows == len(partitions)
        out += zip(partitions.tolist(), kept.column("value").to_pylist())
    return out


def split(table: pa.Table, cuts: list[int]) -> list[pa.Table]:
    bounds = [0, *sorted(c for c in cuts if 0 < c < table.num_rows), table.num_rows]
    return [table.slice(a, b - a) for a, b in itertools.pairwise(bounds)]


def test_keyed_rows_go_where_send_puts_their_key_and_a_partition_column_wins():
    keys = [b"a", b"b", None, b"c"]
    table = rows_table([b"0", b"1", b"2", b"3"], keys).append_column("partition", pa.array([None, 2, None, -1], pa.int32()))
    _, partitions = TaskRows("t", 4, 0, {}).place(table)
    by_key = key_partitions(pa.array(keys, pa.binary()), 4)
    assert partitions.tolist() == [by_key[0], 2, 0, by_key[3]], "unkeyed row 2 starts at the task's partition"


def test_unkeyed_rows_go_in_runs_of_sticky_run_bytes_starting_at_the_task_index():
    value = b"x" * (STICKY_RUN_BYTES // 4)  # about 4 rows per run, with the record overhead 3
    table = rows_table([value] * 12)
    _, partitions = TaskRows("t", 3, task_index=4, already_written={}).place(table)
    assert partitions.tolist()[:3] == [1, 1, 1], "task 4 of a 3-partition topic starts at partition 1"
    runs = [len(list(group)) for _, group in itertools.groupby(partitions.tolist())]
    assert set(runs) <= {3, 4} and len(set(partitions.tolist())) == 3


def test_rows_an_earlier_attempt_wrote_are_dropped_per_partition_across_tables():
    table = rows_table([b"%d" % i for i in range(10)]).append_column("partition", pa.array([0, 1] * 5, pa.int32()))
    rows = TaskRows("t", 2, 0, {0: 3, 1: 1})
    kept = placed(rows, split(table, [2, 7]))
    assert kept == [(1, b"3"), (1, b"5"), (0, b"6"), (1, b"7"), (0, b"8"), (1, b"9")]
    assert rows.skipped == 4


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", None]), st.binary(max_size=300_000)), max_size=40),
    st.lists(st.integers(0, 40), max_size=5),
    st.lists(st.integers(0, 40), max_size=5),
    st.lists(st.integers(0, 12), min_size=3, max_size=3),
)
def test_any_cut_of_the_rows_places_them_alike_and_drops_the_first_written_of_each_partition(rows, cuts1, cuts2, written):
    """The two attempts of a task cut its rows into different tables; whatever the cuts,
    a row gets the same partition, and the resumed attempt sends exactly the rows after
    the first `written[p]` of each partition p."""
    table = rows_table([v for _, v in rows], [k for k, _ in rows])
    first = placed(TaskRows("t", 3, 5, {}), split(table, cuts1))
    assert len(first) == len(rows)
    counts = {p: min(n, sum(1 for q, _ in first if q == p)) for p, n in enumerate(written)}
    expected, seen = [], dict.fromkeys(range(3), 0)
    for p, value in first:
        seen[p] += 1
        if seen[p] > counts[p]:
            expected.append((p, value))
    assert placed(TaskRows("t", 3, 5, counts), split(table, cuts2)) == expected


def test_a_table_without_a_value_column_or_with_a_numeric_key_is_refused():
    rows = TaskRows("t", 2, 0, {})
    with pytest.raises(InvalidConfigurationError, match="'value' column"):
        rows.place(pa.table({"key": pa.array([b"k"])}))
    with pytest.raises(InvalidConfigurationError, match="'key' must be binary or string"):
        rows.place(pa.table({"value": pa.array([b"v"]), "key": pa.array([1])}))


# ---------------------------------------------------------------------------- against a cluster


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("resume"), config={**FAST_CONFIG, **NO_LISTENERS},
                   namespace="resume")
    yield c
    c.shutdown()


_topics = itertools.count()


def new_topic(cluster, partitions=3) -> str:
    name = f"rw{next(_topics)}"
    cluster.create_topic(name, num_partitions=partitions, replication_factor=3)
    return name


def topic_values(cluster, topic) -> dict[int, list[bytes]]:
    return {
        d["partition"]: [v for _, v in read_partition(cluster.leader(topic, d["partition"]), d["high_watermark"])]
        for d in cluster.describe_topic(topic)
    }


def numbered_table(count: int, keyed: bool) -> pa.Table:
    values = [b"row-%06d" % i + b"." * 200 for i in range(count)]
    return rows_table(values, [b"k%d" % (i % 7) for i in range(count)] if keyed else None)


def assert_each_row_once_in_task_order(cluster, topic, table: pa.Table) -> None:
    by_partition = topic_values(cluster, topic)
    everything = [v for values in by_partition.values() for v in values]
    assert sorted(everything) == sorted(table.column("value").to_pylist()), "every row exactly once"
    for values in by_partition.values():
        assert values == sorted(values), "each partition holds the task's rows in the task's order"


def test_producer_sequence_is_what_the_producer_committed(cluster):
    topic = new_topic(cluster, partitions=1)
    leader = cluster.leader(topic, 0)
    assert ray.get(leader.producer_sequence.remote(123_456, 1000)) == (-1, 0)
    with cluster.producer() as producer:
        for i in range(5):
            producer.send(topic, b"v%d" % i)
        producer.flush()
        producer_id = producer._idempotence.producer_id
    assert ray.get(leader.producer_sequence.remote(producer_id, 1000)) == (0, 5)
    described = cluster.describe_topic(topic)[0]
    follower = cluster.replica(topic, 0, next(b for b in described["replicas"] if b != described["leader"]))
    with pytest.raises(Exception, match="NOT_LEADER_OR_FOLLOWER|not the leader"):
        ray.get(follower.producer_sequence.remote(producer_id, 1000))


@pytest.mark.parametrize("keyed", [False, True])
def test_a_retried_task_resumes_after_what_its_failed_attempt_wrote(cluster, keyed):
    topic = new_topic(cluster)
    table = numbered_table(3000, keyed)
    first_id = reserve_task_producer_ids(cluster)

    def failing_after(tables, count):
        yield from tables[:count]
        raise RuntimeError("the task's executor was lost")

    with pytest.raises(RuntimeError, match="executor was lost"):
        write_task(cluster, topic, failing_after(split(table, [500, 1100, 1800]), 2), {}, first_id, task_index=3)
    written_before = sum(len(v) for v in topic_values(cluster, topic).values())
    assert written_before == 1100, "the failed attempt's records were written (the producer flushes on close)"

    # The retry cuts the same rows differently (another batch size), as Spark may not.
    assert write_task(cluster, topic, split(table, [250, 2000]), {}, first_id, task_index=3) == 3000
    assert_each_row_once_in_task_order(cluster, topic, table)
    # A third attempt (the second one's answer was lost, say) writes nothing.
    assert write_task(cluster, topic, [table], {}, first_id, task_index=3) == 3000
    assert sum(len(v) for v in topic_values(cluster, topic).values()) == 3000


def test_two_attempts_at_once_and_then_a_third_write_each_row_once(cluster):
    """A zombie attempt still running while the retry runs: the leaders' sequence checks
    let one copy of each record in; a loser fails, and the next attempt completes."""
    topic = new_topic(cluster)
    table = numbered_table(20_000, keyed=False)
    first_id = reserve_task_producer_ids(cluster)
    outcomes: list[BaseException | int] = []

    def attempt(cuts):
        try:
            outcomes.append(write_task(cluster, topic, split(table, cuts), {}, first_id, task_index=0))
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion below
            outcomes.append(e)

    threads = [threading.Thread(target=attempt, args=(cuts,)) for cuts in ([2000 * i for i in range(10)], [3333, 9000])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(outcomes) == 2
    for outcome in outcomes:
        assert outcome == 20_000 or isinstance(outcome, KafkaError), outcome
    assert write_task(cluster, topic, [table], {}, first_id, task_index=0) == 20_000
    assert_each_row_once_in_task_order(cluster, topic, table)


def test_a_pinned_producer_that_loses_its_sequence_fails_what_it_has_not_sent_at_once(cluster):
    topic = new_topic(cluster, partitions=1)
    producer_id = reserve_task_producer_ids(cluster)
    tp = TopicPartition(topic, 0)
    with cluster.producer(identity=ProducerIdentity(producer_id, 0, {tp: 0})) as first:
        first.send_batch(topic, [b"a"] * 10).result(timeout=30)
    stale = cluster.producer(identity=ProducerIdentity(producer_id, 0, {tp: 0}), linger_ms=0)
    try:
        started = time.monotonic()
        behind = stale.send_batch(topic, [b"b"] * 4)  # sequences 0..3: behind, and not a batch the leader had
        with pytest.raises(OutOfOrderSequenceError):
            behind.result(timeout=30)
        later = stale.send_batch(topic, [b"c"] * 4)
        with pytest.raises(OutOfOrderSequenceError, match="pinned"):
            later.result(timeout=30)
        assert time.monotonic() - started < 15, "failed at once, not after delivery_timeout_ms"
    finally:
        stale.close()
    assert resume_point(cluster, topic, producer_id).next_sequences == {tp: 10}
    assert topic_values(cluster, topic) == {0: [b"a"] * 10}


def test_a_write_job_reserves_a_block_of_producer_ids_no_one_else_gets(cluster):
    first = reserve_task_producer_ids(cluster)
    second = reserve_task_producer_ids(cluster)
    assert second >= first + (1 << 16)
    with cluster.producer() as producer:
        assert producer._idempotence.producer_id >= second + (1 << 16) or producer._idempotence.producer_id < first
