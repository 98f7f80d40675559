"""The Producer under faults, against a fake one-partition leader actor (no cluster): calls
left unanswered, records past their delivery timeout, OUT_OF_ORDER_SEQUENCE_NUMBER, and
Ray's own failures never reaching the caller."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError

from rayk.client import calls
from rayk.client.producer import Producer
from rayk.errors import (
    InvalidDifferentRecordError,
    InvalidRecordError,
    KafkaTimeoutError,
    NetworkError,
    NotCoordinatorError,
    OutOfOrderSequenceError,
    RequestTimedOutError,
    UnknownServerError,
)
from tests.cluster_helpers import shared_local_ray, wait_until
from tests.dataplane_fakes import FakeReplicaEndpoint


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()  # the actors a test starts go when their handles do


@ray.remote(num_cpus=0)
class IdempotentLeader(FakeReplicaEndpoint):
    """A one-partition leader that checks producer sequences as PartitionReplica does
    (ProducerStateManager: append, answer a duplicate with its first offsets, wait for a
    gap, refuse what is behind) and can misbehave on chosen calls (numbered from 0 in
    arrival order): answer OUT_OF_ORDER_SEQUENCE_NUMBER (to that batch's retries too), or
    never answer, before appending; or never answer the first call of a chosen batch
    (numbered from 0 in the order batches first arrive: a busy machine can make the
    producer retry an earlier batch, which shifts the numbers of the calls after it) after
    appending it."""

    def __init__(self, oos_calls=(), hang_calls=(), hang_after_append_batches=(), hang_all=False, gap_wait_s=0.5):
        from rayk.storage.producer_state import ProducerStateManager

        self.state = ProducerStateManager()
        self.oos_calls, self.hang_calls = set(oos_calls), set(hang_calls)
        self.hang_after_append_batches, self.hang_all = set(hang_after_append_batches), hang_all
        self.batches: list[tuple[int, int, int]] = []  # (producer id, epoch, base sequence), in order of arrival
        self.gap_wait_s = gap_wait_s
        self.refused = set()  # (producer id, epoch, base sequence) of the batches refused
        self.log = []  # (offset, producer id, epoch, sequence, value)
        self.calls = []  # (producer id, epoch, base sequence, record count, acks)
        self.changed = asyncio.Event()

    async def produce(self, batch, acks, timeout_ms):
        from rayk.replication.partition_replica import ProduceResult
        from rayk.storage.producer_state import BatchMetadata, Verdict
        from rayk.errors import KafkaError, OutOfOrderSequenceError
        from rayk.storage.records import iter_batches

        (b,) = list(iter_batches(batch))
        h = b.header
        n = len(self.calls)
        self.calls.append((h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta + 1, acks))
        key = (h.producer_id, h.producer_epoch, h.base_sequence)
        held = key not in self.batches and len(self.batches) in self.hang_after_append_batches  # not its retries
        if key not in self.batches:
            self.batches.append(key)
        if self.hang_all or n in self.hang_calls:
            await asyncio.Event().wait()  # until the producer cancels the call
        if n in self.oos_calls or (h.producer_id, h.producer_epoch, h.base_sequence) in self.refused:  # (a retry of a refused batch is refused too)
            self.refused.add((h.producer_id, h.producer_epoch, h.base_sequence))
            return ProduceResult(-1, -1, 0, OutOfOrderSequenceError(f"call {n} refused (injected)"))
        last = h.base_sequence + h.last_offset_delta
        deadline = time.monotonic() + self.gap_wait_s
        while True:
            try:
                verdict, duplicate = self.state.check(h.producer_id, h.producer_epoch, h.base_sequence, last)
            except KafkaError as e:
                return ProduceResult(-1, -1, 0, e)
            if verdict is Verdict.DUPLICATE:
                return ProduceResult(duplicate.first_offset, -1, 0)
            if verdict is Verdict.APPEND:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ProduceResult(-1, -1, 0, OutOfOrderSequenceError(f"sequence {h.base_sequence}: gap"))
            changed = self.changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        base = len(self.log)
        for i, r in enumerate(b.records()):
            self.log.append((base + i, h.producer_id, h.producer_epoch, h.base_sequence + i, r.value))
        self.state.record(h.producer_id, h.producer_epoch, BatchMetadata(h.base_sequence, last, base, len(self.log) - 1))
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()
        if held:
            await asyncio.Event().wait()
        return ProduceResult(base, -1, 0)

    def stop_hanging(self):
        self.hang_all = False

    def written(self):
        return list(self.log)

    def produce_calls(self):
        return list(self.calls)


@ray.remote(num_cpus=0)
class OnePartitionController:
    def __init__(self, leader):
        self._leader = leader
        self.producer_ids = 0

    def init_producer_id(self):
        self.producer_ids += 1
        return 6 + self.producer_ids

    def metadata(self, topics):
        return {t: {"partitions": {0: {"leader_handle": self._leader}}} for t in topics}

    def move_leader(self, leader):
        """The partition's leader moves (an election)."""
        self._leader = leader


class FakeCluster:
    def __init__(self, controller):
        self.controller = controller


def producer_for(leader, **settings) -> Producer:
    return Producer(FakeCluster(OnePartitionController.remote(leader)), **settings)


def outcomes(futures, timeout_s=60):
    """(offset or None, error or None) per future."""
    out = []
    for f in futures:
        error = f.exception(timeout=timeout_s)
        out.append((None if error else f.result().offset, error))
    return out


def test_producer_defaults_to_acks_all():
    leader = IdempotentLeader.remote()
    with producer_for(leader) as producer:
        producer.send("t", b"x").get(timeout=30)
    assert [c[4] for c in ray.get(leader.produce_calls.remote())] == [-1]


def first_call_and_retry(produce_calls: list[tuple], batch: int) -> tuple[int, int]:
    """The indexes of the first call of the `batch`-th batch to arrive (from 0), and of the
    next call with its producer id, epoch and sequence (its retry)."""
    batches = list(dict.fromkeys(c[:3] for c in produce_calls))
    first = next(i for i, c in enumerate(produce_calls) if c[:3] == batches[batch])
    retry = next((i for i in range(first + 1, len(produce_calls)) if produce_calls[i][:3] == produce_calls[first][:3]), None)
    assert retry is not None, f"batch {batch} ({produce_calls[first]}) was retried: {produce_calls}"
    return first, retry


def test_an_unanswered_call_is_cancelled_after_request_timeout_and_its_retry_gets_the_original_offsets():
    # Call 1 is appended but never answered: the retry (same epoch and sequence) is a
    # duplicate, answered with the offsets of the first append.
    leader = IdempotentLeader.remote(hang_after_append_batches={1})
    producer = producer_for(leader, request_timeout_ms=800, delivery_timeout_ms=30_000, linger_ms=0,
                            max_in_flight_requests_per_connection=1)
    started = time.monotonic()
    futures = [producer.send("t", b"%d" % i) for i in range(3)]
    for f in futures:
        f.get(timeout=30)
        time.sleep(0.05)  # one record per batch
    futures += [producer.send("t", b"%d" % i) for i in range(3, 30)]
    producer.flush(timeout_s=30)
    elapsed = time.monotonic() - started
    producer.close()
    written = ray.get(leader.written.remote())
    assert [v for *_, v in written] == [b"%d" % i for i in range(30)], "each record written once, in order"
    assert [f.get().offset for f in futures] == list(range(30)), "the retried batch got its first offsets"
    produce_calls = ray.get(leader.produce_calls.remote())
    first_call_and_retry(produce_calls, 1)  # the held batch's retry kept its producer id, epoch and sequence
    assert elapsed >= 0.8, "the held call was given request_timeout_ms"


def test_calls_unanswered_by_a_leader_that_lost_its_leadership_go_to_the_new_one_before_request_timeout():
    # The old leader is cut off (it never answers); the Controller elects another. The
    # producer, which keeps looking at a partition with calls unanswered for 2 s, sends them
    # there, in order and once each, long before request_timeout_ms (60 s) would.
    old, new = IdempotentLeader.remote(hang_all=True), IdempotentLeader.remote()
    controller = OnePartitionController.remote(old)
    producer = Producer(FakeCluster(controller), request_timeout_ms=60_000, delivery_timeout_ms=120_000, linger_ms=5)
    futures = [producer.send("t", b"%d" % i) for i in range(20)]
    wait_until(lambda: ray.get(old.produce_calls.remote()), 30, "a call to the old leader")
    ray.get(controller.move_leader.remote(new))
    moved_s = time.monotonic()
    futures += [producer.send("t", b"%d" % i) for i in range(20, 40)]
    producer.flush(timeout_s=30)
    elapsed_s = time.monotonic() - moved_s
    producer.close()
    assert [f.get().offset for f in futures] == list(range(40))
    assert [v for *_, v in ray.get(new.written.remote())] == [b"%d" % i for i in range(40)], "each once, in order"
    assert elapsed_s < 15, f"the calls went to the new leader {elapsed_s:.1f} s after it was elected"


def test_records_fail_with_kafka_timeout_at_delivery_timeout_and_free_the_buffer():
    leader = IdempotentLeader.remote(hang_all=True)
    producer = producer_for(leader, request_timeout_ms=400, delivery_timeout_ms=1500, linger_ms=0,
                            buffer_memory=2000, max_block_ms=10_000, batch_size=300)
    started = time.monotonic()
    failed = []  # what a callback given to send() gets for an expired record
    first = [producer.send("t", b"x" * 100, callback=lambda f: failed.append(type(f.exception(0))))
             for _ in range(15)]  # 15 x 121 bytes: the buffer is full
    producer.flush(timeout_s=10)
    flushed_s = time.monotonic() - started
    assert all(isinstance(e, KafkaTimeoutError) for _, e in outcomes(first))
    assert failed == [KafkaTimeoutError] * 15
    assert 1.5 <= flushed_s < 5, f"flush returned after {flushed_s:.2f} s; delivery_timeout_ms is 1500"

    ray.get(leader.stop_hanging.remote())
    second = [producer.send("t", b"y" * 100) for _ in range(15)]  # fits only if the expired bytes left
    producer.flush(timeout_s=30)
    assert all(e is None for _, e in outcomes(second))
    producer.close()
    written = ray.get(leader.written.remote())
    assert [v for *_, v in written] == [b"y" * 100] * 15, "expired records that never reached the log stay out"
    assert {epoch for _, _, epoch, _, _ in written} == {1}, "batches sent and expired leave an unknown sequence: epoch bumped"
    assert [seq for _, _, _, seq, _ in written] == list(range(15)), "the new epoch starts at sequence 0"


def test_out_of_order_sequence_fails_the_batch_then_the_producer_continues_at_epoch_plus_one():
    leader = IdempotentLeader.remote(oos_calls={5}, gap_wait_s=0.5)
    producer = producer_for(leader, linger_ms=0, batch_size=250, max_request_size=250,
                            max_in_flight_requests_per_connection=5)
    futures = []
    for i in range(300):
        futures.append(producer.send("t", b"%04d" % i))
        if i % 10 == 0:
            time.sleep(0.002)
    producer.flush(timeout_s=60)
    results = outcomes(futures)
    later = [producer.send("t", b"late-%d" % i) for i in range(20)]
    producer.flush(timeout_s=60)
    producer.close()
    assert all(e is None for _, e in outcomes(later)), "sends after the bump succeed"

    written = ray.get(leader.written.remote())
    produce_calls = ray.get(leader.produce_calls.remote())
    values = [v for *_, v in written]
    assert len(values) == len(set(values)), "nothing is written twice"
    failed = [i for i, (_, e) in enumerate(results) if e is not None]
    assert failed, "the refused batch fails (it is not resent: it could be written twice)"
    assert all(isinstance(results[i][1], OutOfOrderSequenceError) for i in failed)
    refused = produce_calls[5]
    assert all(b"%04d" % i not in values for i in failed)
    by_value = {v: offset for offset, *_, v in written}
    assert all(by_value[b"%04d" % i] == offset for i, (offset, e) in enumerate(results) if e is None)
    assert {b"late-%d" % i for i in range(20)} <= set(values)
    assert {epoch for _, _, epoch, _, _ in written} == {0, 1}, "one bump"
    first_new = next(i for i, w in enumerate(written) if w[2] == 1)
    assert all(w[2] == 0 for w in written[:first_new]) and all(w[2] == 1 for w in written[first_new:])
    assert [w[3] for w in written[first_new:]] == list(range(len(written) - first_new)), "epoch 1 from sequence 0"
    assert refused[1] == 0 and all(c[1] == 0 for c in produce_calls[:6])
    print(f"\n{len(failed)} records failed with OUT_OF_ORDER_SEQUENCE_NUMBER (refused batch at sequence {refused[2]}),"
          f" {len(written)} written, {len(produce_calls)} produce calls")


@ray.remote(num_cpus=0)
class KeyRequiringLeader(FakeReplicaEndpoint):
    """A leader of a compacted partition: refuses a batch with records without a key,
    naming them (KIP-467), as Log._require_keys does; answers each call after `delay_s`."""

    def __init__(self, delay_s):
        self.delay_s, self.calls, self.end_offset = delay_s, 0, 0

    async def produce(self, batch, acks, timeout_ms):
        from rayk.replication.partition_replica import ProduceResult
        from rayk.errors import InvalidRecordError, RecordError
        from rayk.storage.records import iter_batches

        self.calls += 1
        await asyncio.sleep(self.delay_s)
        records = [r for b in iter_batches(batch) for r in b.records()]
        keyless = [i for i, r in enumerate(records) if r.key is None]
        if keyless:
            return ProduceResult(-1, -1, 0, InvalidRecordError(
                f"{len(keyless)} records have no key", record_errors=[RecordError(i, "no key") for i in keyless]))
        self.end_offset += len(records)
        return ProduceResult(self.end_offset - len(records), -1, 0)

    def produce_calls(self):
        return self.calls


def test_a_batch_refused_for_named_records_fails_those_and_the_others_as_different_records():
    """The first record goes alone and is held 0.5 s; the next 30 queue in small batches
    that then go as one, which the leader refuses naming its keyless records: those fail
    with INVALID_RECORD, the others with INVALID_DIFFERENT_RECORD (sendable again)."""
    leader = KeyRequiringLeader.remote(delay_s=0.5)
    producer = producer_for(leader, linger_ms=0, batch_size=200, max_in_flight_requests_per_connection=1)
    first = producer.send("t", b"first", key=b"k")
    time.sleep(0.1)  # in flight
    later = [producer.send("t", b"%02d" % i, key=None if i % 7 == 3 else b"k") for i in range(30)]
    producer.flush(timeout_s=30)
    assert first.get(timeout=0).offset == 0
    errors = [f.exception(timeout=0) for f in later]
    assert [i for i, e in enumerate(errors) if isinstance(e, InvalidRecordError)] == list(range(3, 30, 7))
    assert all(isinstance(e, InvalidDifferentRecordError) for i, e in enumerate(errors) if i % 7 != 3), errors
    assert ray.get(leader.produce_calls.remote()) == 2, "the 30 records went as one batch"
    resendable = [i for i, e in enumerate(errors) if isinstance(e, InvalidDifferentRecordError)]
    again = [producer.send("t", b"%02d" % i, key=b"k") for i in resendable]
    assert [f.get(timeout=30).offset for f in again] == list(range(1, 1 + len(again)))
    producer.close()


# ---------------------------------------------------------------------- Ray's errors, translated


def test_ray_failures_become_typed_retriable_errors():
    assert isinstance(calls.translate(ActorUnavailableError("restarting", None)), NetworkError)
    assert isinstance(calls.translate(ActorDiedError()), NetworkError)
    assert isinstance(calls.translate(GetTimeoutError("late")), RequestTimedOutError)
    for error in (NetworkError("x"), RequestTimedOutError("x")):
        assert error.retriable


@ray.remote(num_cpus=0)
class Flaky:
    def __init__(self):
        self.calls = 0

    def answer(self, fail_first):
        from rayk.errors import NotCoordinatorError

        self.calls += 1
        if self.calls <= fail_first:
            raise NotCoordinatorError("moved")
        return self.calls

    def fail(self):
        raise ValueError("a bug")

    async def slow(self):
        # async, as rayk's actors are: Ray 2.60 cancels a running call of an async actor,
        # but never interrupts one of a sync actor (only a call still queued)
        await asyncio.sleep(30)


def test_calls_retry_within_the_deadline_and_unwrap_the_actors_errors():
    flaky = Flaky.remote()
    seen = []
    assert calls.call(lambda: flaky.answer.remote(2), time.monotonic() + 10, "answer", on_retriable=seen.append) == 3
    assert [type(e) for e in seen] == [NotCoordinatorError, NotCoordinatorError], "the actor's error, not Ray's wrapper"
    with pytest.raises(UnknownServerError):
        calls.call(lambda: flaky.fail.remote(), time.monotonic() + 10, "fail")
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError) as raised:
        calls.call(lambda: flaky.answer.remote(10**6), time.monotonic() + 0.5, "answer")
    assert time.monotonic() - started < 2
    assert isinstance(raised.value.__cause__, (NotCoordinatorError, RequestTimedOutError)), "the last failure is the cause"


def test_a_call_past_its_deadline_is_cancelled_and_times_out():
    flaky = Flaky.options(max_concurrency=2).remote()
    ray.get(flaky.__ray_ready__.remote())  # the call runs, rather than waits for the actor to start
    ref = flaky.slow.remote()
    started = time.monotonic()
    with pytest.raises(RequestTimedOutError):
        calls.get(ref, time.monotonic() + 0.3, "slow")
    assert time.monotonic() - started < 2
    wait_until(lambda: ray.wait([ref], timeout=0)[0], 10, "the cancelled call to end")


def test_later_batches_wait_while_an_earlier_one_is_unanswered_so_its_retry_is_still_a_duplicate():
    # Call 1 is appended but its answer never comes (a lost answer; under load, or from a
    # leader cut off after replicating it); the calls after it are answered at once. The
    # leader remembers a producer's last 5 batches only (Kafka's NUM_BATCHES_TO_RETAIN),
    # so the producer must not get more than 5 batches ahead of a batch whose outcome is
    # open: else that batch's retry, after request_timeout_ms, is OUT_OF_ORDER_SEQUENCE_NUMBER
    # ("behind the expected ... and is not a recent batch") and its records are lost.
    leader = IdempotentLeader.remote(hang_after_append_batches={1})
    producer = producer_for(leader, request_timeout_ms=1000, delivery_timeout_ms=30_000, linger_ms=0,
                            batch_size=200, max_request_size=200, max_in_flight_requests_per_connection=5)
    futures = [producer.send("t", b"0000")]
    futures[0].get(timeout=30)  # call 0; the next call (1) hangs after its append
    futures += [producer.send("t", b"%04d" % i) for i in range(1, 1500)]
    producer.flush(timeout_s=60)
    producer.close()
    results = outcomes(futures)
    assert [e for _, e in results if e is not None] == [], "no record fails"
    written = ray.get(leader.written.remote())
    assert [v for *_, v in written] == [b"%04d" % i for i in range(1500)], "each record written once, in order"
    assert [offset for offset, _ in results] == list(range(1500)), "the retried batch got its first offsets"
    produce_calls = ray.get(leader.produce_calls.remote())
    first, retry = first_call_and_retry(produce_calls, 1)
    ahead = {c[2] for c in produce_calls[:retry] if c[1] == produce_calls[first][1] and c[2] > produce_calls[first][2]}
    assert len(ahead) <= 4, f"{len(ahead)} batches went ahead of the unanswered one before its retry"
