"""PartitionReplica actors on a local Ray instance: produce acks, long-poll fetch,
follower replication, ISR shrink and expansion, epoch fencing and truncation."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
import ray

from rayk import errors, native_paths
from rayk.replication.partition_replica import PartitionReplica, ReplicaConfig
from rayk.dataplane import frames, handshake
from rayk.dataplane.connection import Connection
from rayk.dataplane.frames import FetchResult, ProduceResult
from rayk.dataplane.replica_link import ReplicaLink
from rayk.errors import (
    InconsistentTopicIdError,
    FencedLeaderEpochError,
    InvalidRequiredAcksError,
    NetworkError,
    NotEnoughReplicasAfterAppendError,
    NotCoordinatorError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetNotAvailableError,
    RequestTimedOutError,
)
from rayk.storage import Log, LogConfig, partition_metadata
from rayk.storage.records import SimpleRecord, build_batch, iter_batches
from tests.cluster_helpers import shared_local_ray

Replica = ray.remote(num_cpus=0)(PartitionReplica)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    shared_local_ray()  # the actors a test starts go when their handles do


def batch(n: int = 3, tag: str = "v") -> bytes:
    return build_batch([SimpleRecord(f"{tag}{i}".encode()) for i in range(n)])


def offsets(records: bytes) -> list[int]:
    return [r.offset for b in iter_batches(records) for r in b.records()]


def replicas(tmp_path, ids=(1, 2, 3), config: ReplicaConfig | None = None) -> dict[int, ray.actor.ActorHandle]:
    return {i: Replica.remote("t", 0, i, str(tmp_path / f"broker-{i}" / "t-0"), None, config) for i in ids}


def wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def describe(handle) -> dict:
    return ray.get(handle.describe.remote())


def stored_bytes(handle, tmp_path, broker_id: int) -> bytes:
    """Closes a replica and reads its whole log back from its directory on disk."""
    ray.get(handle.close.remote())
    log = Log(tmp_path / f"broker-{broker_id}" / "t-0")
    log.high_watermark = log.log_end_offset
    data = log.read(0, 1 << 30).records
    log.close()
    return data


async def fenced_then_deposed(fetch, offset: int, parked, native: bool, r: dict) -> None:
    """Over the data plane, a fetch of replica 1 (leading epoch 0, with replica 2) at
    `offset`: in epoch 1, UNKNOWN_LEADER_EPOCH; then one parked (where the endpoint is
    native) is answered NOT_LEADER_OR_FOLLOWER once replica 1 follows 2, and none is left."""
    assert isinstance((await fetch(offset, 100, epoch=1)).error, errors.UnknownLeaderEpochError)
    pending = asyncio.ensure_future(fetch(offset, 10_000))
    await asyncio.sleep(0.3)
    assert parked() == (1 if native else 0)
    await r[1].become_follower.remote(1, 2, r[2])
    assert isinstance((await asyncio.wait_for(pending, 5)).error, NotLeaderOrFollowerError)
    assert parked() == 0


def start_replication(r: dict, leader: int, epoch: int = 0, isr=None) -> None:
    ids = sorted(r)
    ray.get(r[leader].become_leader.remote(epoch, ids, list(isr or ids)))
    ray.get([r[i].become_follower.remote(epoch, leader, r[leader]) for i in ids if i != leader])


# ---------------------------------------------------------------------- produce


def test_produce_requests_appends_a_calls_requests_in_order_and_answers_each(tmp_path):
    r = replicas(tmp_path, ids=(1,))
    ray.get(r[1].become_leader.remote(0, [1], [1]))
    requests = [(batch(2, "a"), 1, 1000), (b"not a batch", 1, 1000), (batch(1, "b"), -1, 1000), (batch(3, "c"), 0, 1000)]
    results = ray.get(r[1].produce_requests.remote(requests))
    assert [res.base_offset for res in results] == [0, -1, 2, 3]
    assert [type(res.error).__name__ for res in results] == ["NoneType", "CorruptRecordError", "NoneType", "NoneType"]
    values = [rec.value for b in iter_batches(stored_bytes(r[1], tmp_path, 1)) for rec in b.records()]
    assert values == [b"a0", b"a1", b"b0", b"c0", b"c1", b"c2"]


def test_a_fetch_by_another_topic_id_than_the_logs_is_inconsistent_topic_id(tmp_path):
    partition_metadata.write(tmp_path / "broker-1" / "t-0", "H8cSMgxTQ9CaBUjTfZy6bg")
    r = replicas(tmp_path, ids=(1,))
    ray.get(r[1].become_leader.remote(0, [1], [1]))
    ray.get(r[1].produce.remote(batch(2), 1, 1000))
    mine = ray.get(r[1].fetch.remote(0, 1 << 20, 1, 0, topic_id="H8cSMgxTQ9CaBUjTfZy6bg"))
    other = ray.get(r[1].fetch.remote(0, 1 << 20, 1, 0, topic_id="AAAAAAAAAAAAAAAAAAAAAA"))
    assert offsets(mine.records) == [0, 1]
    assert isinstance(other.error, InconsistentTopicIdError) and other.records == b""


def test_acks_one_returns_the_assigned_offset_and_acks_zero_appends(tmp_path):
    r = replicas(tmp_path, ids=(1,))
    ray.get(r[1].become_leader.remote(0, [1], [1]))
    assert ray.get(r[1].produce.remote(batch(3), 1, 1000)).base_offset == 0
    assert ray.get(r[1].produce.remote(batch(2), 0, 1000)).base_offset == 3
    assert describe(r[1])["log_end_offset"] == 5


def test_acks_other_than_0_1_all_is_invalid_required_acks(tmp_path):
    r = replicas(tmp_path, ids=(1,))
    ray.get(r[1].become_leader.remote(0, [1], [1]))
    result = ray.get(r[1].produce.remote(batch(), 2, 1000))
    assert isinstance(result.error, InvalidRequiredAcksError)
    assert describe(r[1])["log_end_offset"] == 0


def test_produce_to_a_follower_is_not_leader(tmp_path):
    r = replicas(tmp_path, ids=(1, 2))
    start_replication(r, leader=1)
    result = ray.get(r[2].produce.remote(batch(), 1, 1000))
    assert isinstance(result.error, NotLeaderOrFollowerError)
    assert "leader: 1" in str(result.error)


def test_acks_all_is_refused_before_append_when_isr_below_min_insync(tmp_path):
    r = replicas(tmp_path, ids=(1, 2, 3), config=ReplicaConfig(min_insync_replicas=2))
    ray.get(r[1].become_leader.remote(0, [1, 2, 3], [1]))
    result = ray.get(r[1].produce.remote(batch(), -1, 1000))
    assert isinstance(result.error, NotEnoughReplicasError)
    assert describe(r[1])["log_end_offset"] == 0
    assert ray.get(r[1].produce.remote(batch(), 1, 1000)).error is None


def test_acks_all_waits_for_followers_then_every_replica_holds_the_same_bytes(tmp_path):
    r = replicas(tmp_path)
    start_replication(r, leader=1)
    for _ in range(5):
        result = ray.get(r[1].produce.remote(batch(4), -1, 5000))
        assert result.error is None
    state = describe(r[1])
    assert state["high_watermark"] == state["log_end_offset"] == 20
    for i in (2, 3):
        wait_until(lambda i=i: describe(r[i])["log_end_offset"] == 20)
    leader_bytes = stored_bytes(r[1], tmp_path, 1)
    assert offsets(leader_bytes) == list(range(20))
    assert stored_bytes(r[2], tmp_path, 2) == leader_bytes
    assert stored_bytes(r[3], tmp_path, 3) == leader_bytes


def test_acks_all_times_out_when_a_follower_in_isr_is_stalled(tmp_path):
    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(0, [1, 2], [1, 2]))  # replica 2 never fetches
    started = time.monotonic()
    result = ray.get(r[1].produce.remote(batch(), -1, 400))
    elapsed = time.monotonic() - started
    assert isinstance(result.error, RequestTimedOutError)
    assert 0.35 < elapsed < 5
    assert describe(r[1])["high_watermark"] == 0


# ---------------------------------------------------------------------- fetch


def test_consumer_fetch_waiting_for_min_bytes_is_answered_as_soon_as_data_arrives(tmp_path):
    r = replicas(tmp_path, ids=(1,))
    ray.get(r[1].become_leader.remote(0, [1], [1]))
    started = time.monotonic()
    pending = r[1].fetch.remote(0, 1 << 20, 1, 10_000)
    time.sleep(0.3)
    ray.get(r[1].produce.remote(batch(2), 1, 1000))
    result = ray.get(pending)
    elapsed = time.monotonic() - started
    assert offsets(result.records) == [0, 1]
    assert elapsed < 3, f"fetch took {elapsed:.2f} s though data arrived after 0.3 s (max wait 10 s)"


def test_consumer_fetch_answers_empty_after_max_wait(tmp_path):
    r = replicas(tmp_path, ids=(1,))
    ray.get(r[1].become_leader.remote(0, [1], [1]))
    started = time.monotonic()
    result = ray.get(r[1].fetch.remote(0, 1 << 20, 1, 300))
    elapsed = time.monotonic() - started
    assert result.records == b"" and result.error is None
    assert 0.29 < elapsed < 3


def test_a_follower_fetching_at_the_log_end_waits_for_records_or_answers_empty_after_max_wait(tmp_path):
    """The leader reads nothing for a follower at its log end until records come (each
    follower is there after each record); the answer is as a read would make it."""
    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(0, [1, 2], [1, 2]))
    ray.get(r[1].produce.remote(batch(2), 1, 1000))
    started = time.monotonic()
    empty = ray.get(r[1].fetch.remote(2, 1 << 20, 1, 300, 2, 0))
    elapsed = time.monotonic() - started
    assert (empty.records, empty.error, empty.log_end_offset) == (b"", None, 2) and 0.29 < elapsed < 3
    assert empty.high_watermark == 2  # the follower's fetch at 2 moved it
    at_once = ray.get(r[1].fetch.remote(2, 1 << 20, 1, 0, 2, 0))  # no wait asked: read and answered at once
    assert (at_once.records, at_once.error, at_once.high_watermark) == (b"", None, 2)
    pending = r[1].fetch.remote(2, 1 << 20, 1, 10_000, 2, 0)
    time.sleep(0.3)
    started = time.monotonic()
    ray.get(r[1].produce.remote(batch(3), 1, 1000))
    assert offsets(ray.get(pending).records) == [2, 3, 4]
    assert time.monotonic() - started < 3


def test_a_followers_fetch_over_the_data_plane_is_parked_without_a_task_until_records_time_or_a_role_change(tmp_path):
    """Where the endpoint is native, a follower's fetch at the log end waits in the leader's
    list of parked fetches (no task), and is answered as the async path answers: by the
    records appended, empty after its wait (its position recorded all the same), fenced by
    epoch, NOT_LEADER_OR_FOLLOWER once the replica stops leading."""

    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(0, [1, 2], [1, 2]))
    ray.get(r[1].produce.remote(batch(2), 1, 1000))
    node = ray.get_runtime_context().get_node_id()
    address = ray.get(r[1].data_endpoint.remote(node))
    native = native_paths.enabled("parked_fetch")  # the replica's process has the same build and environment

    def parked() -> int:
        return ray.get(r[1].__ray_call__.remote(lambda replica: len(replica._fetches._parked)))

    def count_reads(replica) -> None:
        """In the replica: counts the reads of its log that its fetches make."""
        fetches, read = replica._fetches, replica._fetches._read
        fetches.reads = 0

        def counted(*args, **kwargs):
            fetches.reads += 1
            return read(*args, **kwargs)

        fetches._read = counted

    ray.get(r[1].__ray_call__.remote(count_reads))

    def reads() -> int:
        return ray.get(r[1].__ray_call__.remote(lambda replica: replica._fetches.reads))

    async def go() -> None:
        connection = await Connection.open(address, node)

        async def fetch(offset: int, wait_ms: int, epoch: int = 0, max_bytes: int = 1 << 20,
                        min_bytes: int = 1) -> FetchResult:  # fmt: skip
            request = frames.FetchRequest(offset, max_bytes, min_bytes, wait_ms, replica_id=2, leader_epoch=epoch)
            return frames.decode_fetch_answer(await connection.request(frames.FETCH, frames.encode_fetch_request(request)))

        started = time.monotonic()
        empty = await fetch(2, 300)
        assert (empty.records, empty.error, empty.log_end_offset, empty.high_watermark) == (b"", None, 2, 2)
        assert 0.29 < time.monotonic() - started < 3
        pending = asyncio.ensure_future(fetch(2, 10_000))
        await asyncio.sleep(0.3)
        assert not pending.done() and parked() == (1 if native else 0)
        read_before = reads()
        await r[1].produce.remote(batch(3), 1, 1000)
        answered = await asyncio.wait_for(pending, 5)
        assert offsets(answered.records) == [2, 3, 4]
        # Answered with the batches as the append wrote them, unread (the parked path), and
        # byte for byte the log's.
        assert reads() == read_before if native else reads() > read_before
        assert answered.records == await r[1].read_local.remote(2, 1 << 20)
        assert (answered.log_end_offset, answered.log_start_offset) == (5, 0)
        # Two batches in one append, more than the fetch takes: the log is read (the first
        # batch alone, whole), as for any fetch.
        pending = asyncio.ensure_future(fetch(5, 10_000, max_bytes=100))
        await asyncio.sleep(0.3)
        read_before = reads()
        await r[1].produce.remote(batch(3) + batch(3, tag="w"), 1, 1000)
        assert (await asyncio.wait_for(pending, 5)).records == await r[1].read_local.remote(5, 100)
        assert reads() > read_before
        assert offsets(await r[1].read_local.remote(5, 100)) == [5, 6, 7]
        assert (await fetch(11, 100)).high_watermark == 11  # the follower caught up: the HW moves to the end
        # A fetch asking for more bytes than an append brings (replica.fetch.min.bytes) waits
        # on for more, and is answered with both appends' records once they are enough.
        one = len(batch(3))
        pending = asyncio.ensure_future(fetch(11, 10_000, min_bytes=one + 1))
        await asyncio.sleep(0.3)
        await r[1].produce.remote(batch(3), 1, 1000)
        await asyncio.sleep(0.3)
        assert not pending.done()
        await r[1].produce.remote(batch(3, tag="w"), 1, 1000)
        assert offsets((await asyncio.wait_for(pending, 5)).records) == [11, 12, 13, 14, 15, 16]
        assert (await fetch(17, 100)).high_watermark == 17
        await fenced_then_deposed(fetch, 17, parked, native, r)
        connection.close()

    asyncio.run(go())


def test_a_consumers_fetch_over_the_data_plane_is_parked_without_a_task_until_the_high_watermark_moves(tmp_path):
    """Where the endpoint is native, a consumer's fetch (as a listener sends it) waits in the
    leader's parked consumer fetches (no task), and is answered as the async path answers:
    once the HW brings records (an append alone does not), empty after its wait, at once
    when it asks for no wait, fenced by epoch, NOT_LEADER_OR_FOLLOWER once the replica stops
    leading; what it answers counts as BytesOut. One below the log start takes the async path."""

    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(0, [1, 2], [1, 2]))
    ray.get(r[1].produce.remote(batch(2), 1, 1000))  # offsets 0-1; the HW stays at 0 until broker 2 fetches
    node = ray.get_runtime_context().get_node_id()
    address = ray.get(r[1].data_endpoint.remote(node))
    native = native_paths.enabled("parked_fetch")  # the replica's process has the same build and environment

    def parked() -> int:
        return ray.get(r[1].__ray_call__.remote(lambda replica: len(replica._fetches._parked_consumers)))

    def hold_counters(replica) -> None:
        """In the replica: its counters are not flushed to Ray's (and zeroed) meanwhile."""
        replica._ctx.counters._next_flush_s = float("inf")

    def bytes_out() -> int:
        return ray.get(r[1].__ray_call__.remote(lambda replica: replica._ctx.counters.bytes_out))

    async def go() -> None:
        connection = await Connection.open(address, node)

        async def fetch(offset: int, wait_ms: int, replica_id: int = -1, epoch: int = 0) -> FetchResult:
            request = frames.FetchRequest(offset, 1 << 20, 1, wait_ms, replica_id=replica_id, leader_epoch=epoch)
            return frames.decode_fetch_answer(await connection.request(frames.FETCH, frames.encode_fetch_request(request)))

        started = time.monotonic()
        empty = await fetch(0, 300)
        assert (empty.records, empty.error, empty.high_watermark, empty.log_end_offset) == (b"", None, 0, 2)
        assert 0.29 < time.monotonic() - started < 3
        started = time.monotonic()
        at_once = await fetch(0, 0)
        assert (at_once.records, at_once.error) == (b"", None) and time.monotonic() - started < 0.25
        pending = asyncio.ensure_future(fetch(0, 10_000))
        await asyncio.sleep(0.3)
        assert not pending.done() and parked() == (1 if native else 0)
        await r[1].produce.remote(batch(3), 1, 1000)  # offsets 2-4, the HW still 0
        await asyncio.sleep(0.3)
        assert not pending.done(), "an append that leaves the HW where it was answers no consumer"
        await r[1].__ray_call__.remote(hold_counters)
        out_before = bytes_out()
        assert (await fetch(5, 100, replica_id=2)).high_watermark == 5  # broker 2 caught up: the HW moves
        answered = await asyncio.wait_for(pending, 5)
        assert offsets(answered.records) == [0, 1, 2, 3, 4] and answered.high_watermark == 5
        assert answered.records == await r[1].read_local.remote(0, 1 << 20)
        assert bytes_out() == out_before + len(answered.records)
        assert await r[1].delete_records.remote(2) == 2
        below = await asyncio.wait_for(fetch(0, 10_000), 5)  # the async path: answered at once, not parked
        assert isinstance(below.error, errors.OffsetOutOfRangeError) and below.log_start_offset == 2
        await fenced_then_deposed(fetch, 5, parked, native, r)
        connection.close()

    asyncio.run(go())


def test_a_parked_consumers_fetch_whose_connection_ended_is_dropped_unread(tmp_path):
    """A consumer's fetch parked at the leader whose listener connection ends before the HW
    moves is dropped when it does: nothing is read or counted (BytesOut) for an answer no
    one will take."""

    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(0, [1, 2], [1, 2]))
    ray.get(r[1].produce.remote(batch(2), 1, 1000))  # the HW stays at 0 until broker 2 fetches
    node = ray.get_runtime_context().get_node_id()
    address = ray.get(r[1].data_endpoint.remote(node))
    if not native_paths.enabled("parked_fetch"):
        pytest.skip("the native endpoint is not built here: no fetch is parked")

    def parked() -> int:
        return ray.get(r[1].__ray_call__.remote(lambda replica: len(replica._fetches._parked_consumers)))

    def counters(replica) -> tuple[int, int]:
        replica._ctx.counters._next_flush_s = float("inf")  # not flushed to Ray's (and zeroed) meanwhile
        return replica._ctx.counters.bytes_out, replica._ctx.counters.fetch_requests

    async def go() -> None:
        connection = await Connection.open(address, node)
        request = frames.FetchRequest(0, 1 << 20, 1, 10_000, replica_id=-1, leader_epoch=0)
        pending = asyncio.ensure_future(connection.request(frames.FETCH, frames.encode_fetch_request(request)))
        await asyncio.sleep(0.3)
        assert parked() == 1
        before = await r[1].__ray_call__.remote(counters)
        connection.close()
        with pytest.raises(errors.NetworkError):
            await pending
        await asyncio.sleep(0.3)  # the endpoint sees the connection end
        assert (await r[1].fetch.remote(2, 1 << 20, 1, 0, 2, 0)).high_watermark == 2  # the HW moves
        assert parked() == 0
        bytes_out, fetch_requests = before
        assert await r[1].__ray_call__.remote(counters) == (bytes_out, fetch_requests + 1)  # broker 2's fetch only

    asyncio.run(go())


def test_a_produce_call_over_the_data_plane_waits_for_replication_without_a_task(tmp_path):
    """Where the endpoint is native, a PRODUCE frame is appended at once and its acks=-1
    requests wait in the leader's parked calls (no task), answered as the async path
    answers: once a follower's fetch moves the HW past them (the call's acks=1 request in
    the same answer), REQUEST_TIMED_OUT after their timeout, NOT_LEADER_OR_FOLLOWER once
    the replica stops leading; and a batch ahead of its producer's sequence waits for the
    earlier one (the async way) without failing the call."""

    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(0, [1, 2], [1, 2]))  # follower 2 is played by this test
    node = ray.get_runtime_context().get_node_id()
    address = ray.get(r[1].data_endpoint.remote(node))
    native = native_paths.enabled("parked_produce")  # the replica's process has the same build and environment

    def parked() -> int:
        return ray.get(r[1].__ray_call__.remote(lambda replica: len(replica._produce._delayed)))

    def follower_fetches(offset: int) -> None:
        ray.get(r[1].fetch.remote(offset, 1 << 20, 1, 0, 2, 0))

    async def go() -> None:
        connection = await Connection.open(address, node)

        async def produce(*requests: frames.ProduceRequest) -> list[ProduceResult]:
            body = frames.encode_produce_request(list(requests))
            return frames.decode_produce_answer(await connection.request(frames.PRODUCE, body))

        call = asyncio.ensure_future(produce(frames.ProduceRequest(batch(2), 1, 10_000),
                                             frames.ProduceRequest(batch(3), -1, 10_000)))  # fmt: skip
        await asyncio.sleep(0.3)
        assert not call.done() and parked() == (1 if native else 0)
        assert describe(r[1])["log_end_offset"] == 5  # appended before it waits
        follower_fetches(2)  # the HW moves to 2: not yet past the acks=-1 request's records
        await asyncio.sleep(0.2)
        assert not call.done()
        follower_fetches(5)
        assert [(res.base_offset, res.error) for res in await asyncio.wait_for(call, 5)] == [(0, None), (2, None)]
        assert parked() == 0

        started = time.monotonic()
        (timed_out,) = await produce(frames.ProduceRequest(batch(1), -1, 300))
        assert isinstance(timed_out.error, errors.RequestTimedOutError) and timed_out.base_offset == 5
        assert 0.29 < time.monotonic() - started < 3 and parked() == 0

        pid_batch = build_batch([SimpleRecord(b"p1")], producer_id=7, producer_epoch=0, base_sequence=1)
        ahead = asyncio.ensure_future(produce(frames.ProduceRequest(pid_batch, 1, 10_000)))
        await asyncio.sleep(0.2)
        assert not ahead.done()  # waiting for sequence 0, the async way
        first = build_batch([SimpleRecord(b"p0")], producer_id=7, producer_epoch=0, base_sequence=0)
        (earlier,) = await produce(frames.ProduceRequest(first, 1, 10_000))
        (later,) = await asyncio.wait_for(ahead, 5)
        assert (earlier.error, later.error) == (None, None) and later.base_offset == earlier.base_offset + 1

        pending = asyncio.ensure_future(produce(frames.ProduceRequest(batch(1), -1, 10_000)))
        await asyncio.sleep(0.3)
        assert parked() == (1 if native else 0)
        await r[1].become_follower.remote(1, 2, r[2])
        assert isinstance((await asyncio.wait_for(pending, 5))[0].error, NotLeaderOrFollowerError)
        assert parked() == 0
        connection.close()

    asyncio.run(go())


def test_consumers_never_see_above_the_high_watermark(tmp_path):
    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(0, [1, 2], [1, 2]))  # follower stalled: HW stays 0
    ray.get(r[1].produce.remote(batch(3), 1, 1000))
    consumer = ray.get(r[1].fetch.remote(0, 1 << 20, 1, 0))
    assert consumer.records == b"" and consumer.high_watermark == 0
    follower_view = ray.get(r[1].fetch.remote(0, 1 << 20, 1, 0, 2, 0))
    assert offsets(follower_view.records) == [0, 1, 2]


def test_fetch_with_an_old_leader_epoch_is_fenced(tmp_path):
    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(3, [1, 2], [1, 2]))
    result = ray.get(r[1].fetch.remote(0, 100, 1, 0, 2, 2))
    assert isinstance(result.error, FencedLeaderEpochError)


# ---------------------------------------------------------------------- replication and ISR


def test_follower_catches_up_from_empty_and_follows_the_high_watermark(tmp_path):
    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(0, [1, 2], [1]))
    for _ in range(10):
        ray.get(r[1].produce.remote(batch(5), 1, 1000))
    ray.get(r[2].become_follower.remote(0, 1, r[1]))
    wait_until(lambda: describe(r[2])["log_end_offset"] == 50)
    wait_until(lambda: describe(r[1])["isr"] == [1, 2])
    wait_until(lambda: describe(r[2])["high_watermark"] == 50)
    assert describe(r[1])["data_plane_connections"] == 1  # the records came over it, not over Ray


def test_a_follower_catching_up_on_megabytes_gets_the_leaders_bytes_sent_from_its_log_file(tmp_path):
    """Catch-up answers are ~1 MiB (replica.fetch.max.bytes), above SENDFILE_MIN_BYTES: the
    leader's endpoint sends them by sendfile from its segment files (answer_writer.py),
    on the uvloop Ray runs the actor on."""
    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(0, [1, 2], [1]))
    big = build_batch([SimpleRecord(bytes([i % 251]) * 1000) for i in range(100)])  # ~100 KB
    for _ in range(40):
        ray.get(r[1].produce.remote(big, 1, 1000))
    ray.get(r[2].become_follower.remote(0, 1, r[1]))
    wait_until(lambda: describe(r[2])["log_end_offset"] == 4000, timeout_s=30)
    assert stored_bytes(r[2], tmp_path, 2) == stored_bytes(r[1], tmp_path, 1)


def test_a_replicas_data_plane_admits_no_stranger(tmp_path):
    """A raw socket on a replica's TCP endpoint, or one with a made-up secret, gets no records
    and puts none: the connection is closed before a frame is read."""
    r = replicas(tmp_path, ids=(1,), config=ReplicaConfig(data_plane_host="127.0.0.1"))
    ray.get(r[1].become_leader.remote(0, [1], [1]))
    ray.get(r[1].produce.remote(batch(5), 1, 1000))
    assert ray.get(r[1].data_endpoint.remote(ray.get_runtime_context().get_node_id())).port == 0  # no TCP yet
    address = ray.get(r[1].data_endpoint.remote("another node"))
    assert address.host == "127.0.0.1" and address.port > 0

    async def stranger() -> bytes:
        reader, writer = await asyncio.open_connection(address.host, address.port)
        request = frames.encode_fetch_request(frames.FetchRequest(0, 1 << 20))
        writer.write(frames.request_frame(0, frames.FETCH, request) * 10)
        received = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return received

    received = asyncio.run(stranger())
    assert received.startswith(handshake.MAGIC) and len(received) == len(handshake.MAGIC) + handshake.NONCE_BYTES

    async def forged() -> None:
        address_forged = dataclasses.replace(address, secret=b"f" * 32)
        await Connection.open(address_forged, "another node")

    with pytest.raises(NetworkError):
        asyncio.run(forged())
    assert describe(r[1])["data_plane_connections"] == 0

    async def member() -> FetchResult:  # a process given the address through Ray gets in
        connection = await Connection.open(address, "another node")
        answer = await connection.request(frames.FETCH, frames.encode_fetch_request(frames.FetchRequest(0, 1 << 20)))
        connection.close()
        return frames.decode_fetch_answer(answer)

    assert offsets(asyncio.run(member()).records) == [0, 1, 2, 3, 4]


def test_a_share_state_write_to_a_replica_of_an_ordinary_topic_is_not_coordinator_and_the_link_goes_on(tmp_path):
    r = replicas(tmp_path, ids=(1,))
    ray.get(r[1].become_leader.remote(0, [1], [1]))
    ray.get(r[1].produce.remote(batch(3), 1, 1000))

    async def main() -> tuple[Any, FetchResult]:
        link = ReplicaLink(r[1], ray.get_runtime_context().get_node_id(), "t-0")
        try:
            state_epoch = int(time.time() * 1000)  # (a coordinator's clock, as state epochs are)
            error = await link.write_share_state(frames.ShareStateWrite("g", "t", 0, 0, state_epoch, 0,
                                                                        ((0, 2, "acknowledged", 1),)))  # fmt: skip
            return error, await link.fetch(frames.FetchRequest(0, 1 << 20))
        finally:
            link.close()

    error, fetched = asyncio.run(main())
    assert isinstance(error, NotCoordinatorError)
    assert offsets(fetched.records) == [0, 1, 2] and describe(r[1])["log_end_offset"] == 3


def test_isr_shrinks_when_a_follower_stalls_and_expands_when_it_catches_up(tmp_path):
    """The leader runs isr-expiration itself, every half of replica.lag.time.max.ms: no
    call asks it to."""
    config = ReplicaConfig(replica_lag_time_max_ms=2000, replica_fetch_wait_max_ms=100)
    r = replicas(tmp_path, ids=(1, 2), config=config)
    ray.get(r[1].become_leader.remote(0, [1, 2], [1, 2]))  # replica 2 stalled from the start
    pending = r[1].produce.remote(batch(3), -1, 10_000)
    time.sleep(0.5)
    assert describe(r[1])["isr"] == [1, 2], "not yet out of sync for replica.lag.time.max.ms"
    wait_until(lambda: describe(r[1])["isr"] == [1], 10)
    # With the stalled follower out, the HW moves and the parked acks=all produce completes.
    assert ray.get(pending).error is None
    assert describe(r[1])["high_watermark"] == 3
    ray.get(r[2].become_follower.remote(0, 1, r[1]))
    wait_until(lambda: describe(r[1])["isr"] == [1, 2])


def test_producer_sequence_does_not_count_a_batch_held_by_fewer_than_min_insync_replicas(tmp_path):
    """A resuming writer must not skip a batch its producer was told is not durable enough
    (NOT_ENOUGH_REPLICAS_AFTER_APPEND): the ISR shrank below min.insync.replicas."""
    config = ReplicaConfig(min_insync_replicas=2, replica_lag_time_max_ms=500, replica_fetch_wait_max_ms=100)
    r = replicas(tmp_path, ids=(1, 2), config=config)
    start_replication(r, leader=1)
    records = build_batch([SimpleRecord(b"x")] * 3, producer_id=7, producer_epoch=0, base_sequence=0)
    assert ray.get(r[1].produce.remote(records, -1, 10_000)).error is None
    assert ray.get(r[1].producer_sequence.remote(7, 1000)) == (0, 3)
    ray.get(r[2].close.remote())
    wait_until(lambda: describe(r[1])["isr"] == [1], 5)
    with pytest.raises(NotEnoughReplicasAfterAppendError):
        ray.get(r[1].producer_sequence.remote(7, 1000))


def test_high_watermark_never_moves_backwards_while_followers_come_and_go(tmp_path):
    # Healthy followers fetch at least every 100 ms, so within 300 ms they stay in the ISR.
    config = ReplicaConfig(replica_lag_time_max_ms=300, replica_fetch_wait_max_ms=100)
    r = replicas(tmp_path, config=config)
    start_replication(r, leader=1)
    seen = []
    for round_ in range(6):
        ray.get(r[1].produce.remote(batch(2), 1, 1000))
        if round_ == 2:
            ray.get(r[3].close.remote())  # replica 3 stops fetching: the leader drops it from the ISR
            wait_until(lambda: describe(r[1])["isr"] == [1, 2], 5)
        seen.append(describe(r[1])["high_watermark"])
        time.sleep(0.05)
    assert seen == sorted(seen)
    wait_until(lambda: describe(r[1])["high_watermark"] == 12)


def test_new_follower_truncates_divergent_uncommitted_data_by_leader_epoch(tmp_path):
    r = replicas(tmp_path, ids=(1, 2))
    start_replication(r, leader=1, epoch=0)
    ray.get(r[1].produce.remote(batch(3), -1, 5000))  # committed: offsets 0-2 on both
    wait_until(lambda: describe(r[2])["log_end_offset"] == 3)
    ray.get(r[2].close.remote())
    # Replica 1 takes writes nobody replicated, then loses leadership to replica 2.
    ray.get(r[1].produce.remote(batch(4, tag="lost"), 1, 1000))
    assert describe(r[1])["log_end_offset"] == 7
    r2 = Replica.remote("t", 0, 2, str(tmp_path / "broker-2" / "t-0"), None, None)
    ray.get(r2.become_leader.remote(1, [1, 2], [2]))
    ray.get(r2.produce.remote(batch(2, tag="new"), 1, 1000))  # offsets 3-4 in epoch 1
    ray.get(r[1].become_follower.remote(1, 2, r2))
    wait_until(lambda: describe(r2)["isr"] == [1, 2])
    wait_until(lambda: describe(r[1])["log_end_offset"] == 5)
    values = [rec.value for b in iter_batches(stored_bytes(r[1], tmp_path, 1)) for rec in b.records()]
    assert values == [b"v0", b"v1", b"v2", b"new0", b"new1"]


def test_a_producer_retry_after_a_replica_crash_is_answered_from_the_log_not_appended_twice(tmp_path):
    log_dir, config = str(tmp_path / "broker-1" / "t-0"), LogConfig(segment_bytes=400)
    idempotent = build_batch([SimpleRecord(b"once")] * 3, producer_id=42, producer_epoch=0, base_sequence=0)
    leader = Replica.remote("t", 0, 1, log_dir, config, None)
    ray.get(leader.become_leader.remote(0, [1], [1]))
    assert ray.get(leader.produce.remote(idempotent, 1, 1000)).base_offset == 0
    for _ in range(10):  # other producers fill later segments
        ray.get(leader.produce.remote(batch(3), 1, 1000))
    leo = describe(leader)["log_end_offset"]
    ray.kill(leader, no_restart=True)  # a crash: the log is not closed
    restarted = Replica.remote("t", 0, 1, log_dir, config, None)
    ray.get(restarted.become_leader.remote(1, [1], [1]))
    retry = ray.get(restarted.produce.remote(idempotent, 1, 1000))
    assert (retry.error, retry.base_offset) == (None, 0)
    assert describe(restarted)["log_end_offset"] == leo


# ---------------------------------------------------------------------- divergence (KIP-101/279/320)


def write_log(tmp_path, broker_id: int, epochs_and_counts: list[tuple[int, int, str]]) -> None:
    """Writes a replica's log directly: (leader epoch, records, tag) batches in order."""
    log = Log(tmp_path / f"broker-{broker_id}" / "t-0")
    for epoch, count, tag in epochs_and_counts:
        log.append_as_leader(batch(count, tag=tag), leader_epoch=epoch)
    log.close()


def test_follower_truncates_at_its_own_end_of_the_epoch_the_leader_answers_with(tmp_path):
    # The leader has epoch 0 up to offset 10; the follower's epoch 0 ends at 5, after which it
    # led in epoch 2 and wrote 3 records no one copied. Asked about epoch 2, the leader answers
    # (0, 10): the follower must cut at min(10, its own end of epoch 0) = 5 (KIP-279), not keep
    # its epoch-2 records because 10 is past its log end.
    write_log(tmp_path, 1, [(0, 5, "v"), (0, 5, "w")])
    write_log(tmp_path, 2, [(0, 5, "v"), (2, 3, "div")])
    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(3, [1, 2], [1]))
    ray.get(r[2].become_follower.remote(3, 1, r[1]))
    wait_until(lambda: describe(r[1])["isr"] == [1, 2])
    values = [rec.value for b in iter_batches(stored_bytes(r[2], tmp_path, 2)) for rec in b.records()]
    assert values == [b"v0", b"v1", b"v2", b"v3", b"v4", b"w0", b"w1", b"w2", b"w3", b"w4"]


def test_follower_keeps_asking_for_the_epoch_end_until_the_leader_answers(tmp_path):
    write_log(tmp_path, 1, [(0, 4, "v")])
    write_log(tmp_path, 2, [(0, 4, "v"), (1, 3, "div")])
    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[2].become_follower.remote(2, 1, r[1]))  # replica 1 does not lead yet: NOT_LEADER
    time.sleep(0.5)
    ray.get(r[1].become_leader.remote(2, [1, 2], [1]))
    ray.get(r[1].produce.remote(batch(2, tag="new"), 1, 1000))
    wait_until(lambda: describe(r[1])["isr"] == [1, 2])
    values = [rec.value for b in iter_batches(stored_bytes(r[2], tmp_path, 2)) for rec in b.records()]
    assert values == [b"v0", b"v1", b"v2", b"v3", b"new0", b"new1"]


def test_leader_answers_a_diverged_follower_with_the_epoch_end_and_does_not_count_its_offset(tmp_path):
    write_log(tmp_path, 1, [(0, 4, "v"), (3, 4, "new")])
    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[1].become_leader.remote(4, [1, 2], [1, 2]))
    # Replica 2 says it fetched up to offset 7 with batches of epoch 1, which the leader never had.
    result = ray.get(r[1].fetch.remote(7, 1 << 20, 1, 0, replica_id=2, leader_epoch=4, last_fetched_epoch=1))
    assert (result.records, result.diverging_epoch) == (b"", (0, 4))
    assert describe(r[1])["high_watermark"] == 0, "a diverged follower's offset is no log end of the leader's"
    # A fetch whose epoch the leader knows, at an offset within it, is served.
    result = ray.get(r[1].fetch.remote(4, 1 << 20, 1, 0, replica_id=2, leader_epoch=4, last_fetched_epoch=0))
    assert result.diverging_epoch is None and offsets(result.records)[0] == 4


def test_a_new_leader_records_its_epoch_start_so_an_older_epoch_ends_at_its_log_end(tmp_path):
    write_log(tmp_path, 1, [(0, 4, "v")])
    r = replicas(tmp_path, ids=(1,))
    ray.get(r[1].become_leader.remote(5, [1], [1]))
    assert ray.get(r[1].offsets_for_leader_epoch.remote(2)) == (0, 4)
    assert ray.get(r[1].offsets_for_leader_epoch.remote(5)) == (5, 4)


def test_a_new_leader_answers_offset_not_available_until_its_high_watermark_reaches_its_epoch_start(tmp_path):
    # Replica 2 holds 4 records whose HW it never learned (0): as a new leader it must not
    # tell a consumer that the partition ends at 0 (after its predecessor said 4) until its
    # follower has fetched and the HW reached the epoch's start (KIP-207).
    write_log(tmp_path, 1, [(0, 4, "v")])
    write_log(tmp_path, 2, [(0, 4, "v")])
    r = replicas(tmp_path, ids=(1, 2))
    ray.get(r[2].become_leader.remote(1, [1, 2], [1, 2]))
    assert describe(r[2])["high_watermark"] == 0
    for spec in (-1, -2, 0):
        with pytest.raises(OffsetNotAvailableError, match="lags the start 4 of leader epoch 1"):
            ray.get(r[2].list_offset.remote(spec))
    ray.get(r[1].become_follower.remote(1, 2, r[2]))
    wait_until(lambda: describe(r[2])["high_watermark"] == 4)
    assert ray.get(r[2].list_offset.remote(-1)) == (4, -1)
    assert ray.get(r[2].list_offset.remote(-2)) == (0, -1)


# ---------------------------------------------------------------------- AlterPartition outcomes


@ray.remote(num_cpus=0)
class FakeIsrManager:
    """Stands in for the ReplicaManager: answers AlterPartition as told."""

    def __init__(self, mode: str) -> None:
        self.mode, self.calls, self.incarnations = mode, 0, []

    async def alter_partition(self, topic, partition, leader_id, leader_epoch, partition_epoch, isr, added_incarnations):
        self.calls += 1
        self.incarnations.append(added_incarnations)
        if self.mode == "lost":  # the call fails: the Controller may or may not have applied it
            raise ConnectionError("the answer was lost")
        if self.mode == "stale":  # the broker registered again meanwhile
            from rayk.errors import StaleBrokerEpochError

            raise StaleBrokerEpochError("broker 1 epoch 3 is not current (4)")
        if self.mode == "refused":
            from rayk.errors import IneligibleReplicaError

            raise IneligibleReplicaError("broker 2 is fenced")
        return sorted(isr), partition_epoch + 1

    async def set_mode(self, mode: str) -> None:
        self.mode = mode

    async def call_count(self) -> int:
        return self.calls

    async def sent_incarnations(self) -> list[dict]:
        return self.incarnations


def leader_with_manager(tmp_path, mode: str):
    manager = FakeIsrManager.remote(mode)
    leader = Replica.remote("t", 0, 1, str(tmp_path / "broker-1" / "t-0"), None, None, None, manager)
    follower = Replica.remote("t", 0, 2, str(tmp_path / "broker-2" / "t-0"), None, None)
    ray.get(leader.become_leader.remote(0, [1, 2], [1]))
    return manager, leader, follower


def test_an_isr_expansion_with_no_answer_keeps_the_larger_isr_in_the_high_watermark(tmp_path):
    manager, leader, follower = leader_with_manager(tmp_path, "lost")
    ray.get(leader.produce.remote(batch(3), 1, 1000))
    ray.get(follower.become_follower.remote(0, 1, leader))
    wait_until(lambda: describe(leader)["pending_isr"] == [1, 2])
    wait_until(lambda: ray.get(manager.call_count.remote()) >= 3)  # sent again and again
    ray.get(follower.close.remote())  # the follower stops at offset 3
    ray.get(leader.produce.remote(batch(3), 1, 1000))
    time.sleep(0.3)
    state = describe(leader)
    assert state["pending_isr"] == [1, 2] and state["isr"] == [1], "the unknown outcome is never reverted"
    assert state["high_watermark"] == 3, "the HW waits for the follower the Controller may have added"
    ray.get(manager.set_mode.remote("ok"))
    wait_until(lambda: describe(leader)["isr"] == [1, 2] and describe(leader)["pending_isr"] is None)


def test_an_isr_expansion_the_controller_refused_is_dropped(tmp_path):
    manager, leader, follower = leader_with_manager(tmp_path, "refused")
    ray.get(leader.produce.remote(batch(3), 1, 1000))
    ray.get(follower.become_follower.remote(0, 1, leader))
    wait_until(lambda: ray.get(manager.call_count.remote()) >= 1)
    wait_until(lambda: describe(leader)["pending_isr"] is None)
    assert describe(leader)["isr"] == [1]


def test_an_isr_expansion_answered_stale_broker_epoch_stays_pending_in_the_high_watermark(tmp_path):
    """The first try's answer is lost (the Controller may have applied it), then the broker's
    epoch moves and the retry is answered STALE_BROKER_EPOCH: that says nothing of the
    change, so the HW must keep waiting for the follower the Controller may hold in its ISR
    (dropping the change let a fenced leader acknowledge records its follower lacks)."""
    manager, leader, follower = leader_with_manager(tmp_path, "lost")
    ray.get(leader.produce.remote(batch(3), 1, 1000))
    ray.get(follower.become_follower.remote(0, 1, leader))
    wait_until(lambda: describe(leader)["pending_isr"] == [1, 2])
    ray.get(follower.close.remote())  # the follower stops at offset 3
    ray.get(manager.set_mode.remote("stale"))
    calls = ray.get(manager.call_count.remote())
    wait_until(lambda: ray.get(manager.call_count.remote()) >= calls + 2)  # sent again
    ray.get(leader.produce.remote(batch(3), 1, 1000))
    time.sleep(0.3)
    state = describe(leader)
    assert state["pending_isr"] == [1, 2] and state["isr"] == [1]
    assert state["high_watermark"] == 3, "the HW waits for the follower the Controller may have added"
    ray.get(manager.set_mode.remote("ok"))
    wait_until(lambda: describe(leader)["isr"] == [1, 2] and describe(leader)["pending_isr"] is None)


def test_an_isr_expansion_names_the_follower_process_whose_fetch_caught_up(tmp_path):
    """KIP-903: the Controller can only refuse an expansion based on a fetch from a
    restarted broker's old process if the leader says which process fetched."""
    manager, leader, follower = leader_with_manager(tmp_path, "ok")
    ray.get(leader.produce.remote(batch(3), 1, 1000))
    ray.get(follower.become_follower.remote(0, 1, leader, "process-b"))
    wait_until(lambda: describe(leader)["isr"] == [1, 2])
    assert ray.get(manager.sent_incarnations.remote()) == [{2: "process-b"}]


# ---------------------------------------------------------------------- transactions (the log side)


def test_a_read_committed_fetch_stops_at_the_lso_and_names_the_aborted_transactions(tmp_path):
    """Transactional batches written before the replica started (no coordinator exists to
    let a producer write them), then markers through write_txn_marker, replicated: a
    read_committed consumer fetch reads below the LSO, over Ray and over the data plane, and
    a follower builds the same LSO from the markers it copies."""
    log = Log(tmp_path / "broker-1" / "t-0")
    for pid, seq in ((7, 0), (8, 0), (7, 1)):  # offsets 0, 1, 2
        record = [SimpleRecord(b"p%d-%d" % (pid, seq))]
        log.append_as_leader(build_batch(record, producer_id=pid, producer_epoch=0, base_sequence=seq,
                                         is_transactional=True), 0, allow_transactional=True,
                         verification_guard=log.verification_guard(pid))  # fmt: skip
    log.close()
    r = replicas(tmp_path, ids=(1, 2))
    start_replication(r, leader=1, epoch=1)
    wait_until(lambda: describe(r[1])["high_watermark"] == 3)
    uncommitted = ray.get(r[1].fetch.remote(0, 1 << 20, 1, 0))
    committed = ray.get(r[1].fetch.remote(0, 1 << 20, 1, 0, isolation_level=frames.READ_COMMITTED))
    assert offsets(uncommitted.records) == [0, 1, 2] and uncommitted.last_stable_offset == 0
    assert committed.records == b"" and committed.last_stable_offset == 0, "both transactions are open"

    node = ray.get_runtime_context().get_node_id()
    address = ray.get(r[1].data_endpoint.remote(node))

    async def waiting_for_the_abort() -> FetchResult:
        """A read_committed fetch over the data plane at the LSO waits (parked, where the
        endpoint is native) until the abort marker, once replicated, moves the LSO."""
        connection = await Connection.open(address, node)
        request = frames.FetchRequest(0, 1 << 20, 1, 10_000, isolation_level=frames.READ_COMMITTED)
        pending = asyncio.ensure_future(connection.request(frames.FETCH, frames.encode_fetch_request(request)))
        await asyncio.sleep(0.3)
        assert not pending.done(), "nothing below the LSO yet"
        aborted = await r[1].write_txn_marker.remote(7, 0, False, 0, 5000)  # offset 3, acknowledged by the ISR
        assert aborted.error is None and aborted.base_offset == 3
        answer = frames.decode_fetch_answer(await asyncio.wait_for(pending, 5))
        connection.close()
        return answer

    answer = asyncio.run(waiting_for_the_abort())
    assert offsets(answer.records) == [0], "up to the LSO: producer 8's transaction is still open at offset 1"
    assert (answer.last_stable_offset, answer.aborted_transactions) == (1, ((7, 0),))
    assert ray.get(r[1].write_txn_marker.remote(8, 0, True, 0, 5000)).base_offset == 4
    fenced = ray.get(r[1].write_txn_marker.remote(8, 0, True, -1, 5000))
    assert type(fenced.error).__name__ == "TransactionCoordinatorFencedError"
    committed = ray.get(r[1].fetch.remote(0, 1 << 20, 1, 0, isolation_level=frames.READ_COMMITTED))
    assert committed.last_stable_offset == 5 and committed.aborted_transactions == ((7, 0),)
    from rayk.storage.read_committed import committed_batches

    kept = [rec.value for b in committed_batches(committed.records, committed.aborted_transactions) for rec in b.records()]
    assert kept == [b"p8-0"]

    async def over_the_data_plane() -> FetchResult:
        connection = await Connection.open(address, node)
        request = frames.FetchRequest(1, 1 << 20, isolation_level=frames.READ_COMMITTED)
        answer = await connection.request(frames.FETCH, frames.encode_fetch_request(request))
        connection.close()
        return frames.decode_fetch_answer(answer)

    answer = asyncio.run(over_the_data_plane())
    assert (answer.last_stable_offset, answer.aborted_transactions) == (5, ((7, 0),))
    assert ray.get(r[1].list_offset.remote(-1, frames.READ_COMMITTED)) == (5, -1)
    wait_until(lambda: describe(r[2])["log_end_offset"] == 5)
    ray.get(r[2].close.remote())
    follower = Log(tmp_path / "broker-2" / "t-0", high_watermark=5)
    assert follower.last_stable_offset == 5
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in follower.aborted_transactions(0, 5)] == [(7, 0, 3)]
    follower.close()


def test_a_transaction_marker_is_refused_by_a_follower_and_below_min_insync_replicas(tmp_path):
    r = replicas(tmp_path, ids=(1, 2), config=ReplicaConfig(min_insync_replicas=2))
    ray.get(r[1].become_leader.remote(0, [1, 2], [1]))  # replica 2 neither leads nor follows: the ISR stays [1]
    assert isinstance(ray.get(r[2].write_txn_marker.remote(7, 0, True, 0, 1000)).error, NotLeaderOrFollowerError)
    assert isinstance(ray.get(r[1].write_txn_marker.remote(7, 0, True, 0, 1000)).error, NotEnoughReplicasError)
