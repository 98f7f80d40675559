"""What a partition leader promises about a produce it answers, whatever happens while the
request waits (the leadership moving, a coordinator holding a verification, a retry or a
marker arriving meanwhile, a batch that does not parse), without Ray: a PartitionReplica
with a temporary log, its coordinator faked (tests/transaction_fakes.py).

- A record acknowledged with an offset is at that offset: an acks=all acknowledgement holds
  only in the leader epoch its records were appended in.
- Every call a produce waits on is bounded by the produce's timeout.
- A transaction's first batch is appended only if no marker for its producer was written
  since it was verified (KIP-890's guard), and a plain batch of a producer whose transaction
  is open is refused (INVALID_TXN_STATE), so no client can hang another's transaction.
- The producer-state checks run at the append, so a retry that arrived during a
  verification is answered as a duplicate, never written twice.
- One request's bad batch is that request's error alone.
"""

from __future__ import annotations

import asyncio
import struct
import tempfile
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayk.replication.partition_replica import NO_LEADER
from rayk.dataplane.frames import ProduceRequest
from rayk.errors import (
    InvalidRecordError,
    InvalidTxnStateError,
    KafkaError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
)
from rayk.storage import Log
from rayk.storage.records import ATTRIBUTES_POS, CRC_POS, HEADER_SIZE_BYTES, SimpleRecord, build_batch, compute_crc, iter_batches
from tests.transaction_fakes import EPOCH, PID, Controller, Coordinator, leader_of, txn_batch

TRANSACTIONAL_ID = "tx"


def plain(value: bytes) -> bytes:
    return build_batch([SimpleRecord(value)])


def idempotent(value: bytes, sequence: int, producer_id: int = PID, epoch: int = EPOCH) -> bytes:
    return build_batch([SimpleRecord(value)], producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


def values_in(replica) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every data record in the replica's log."""
    data = replica._log.read(replica._log.log_start_offset, 1 << 20).records
    return [(r.offset, r.value) for b in iter_batches(data) if not b.header.is_control for r in b.records()]


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


# ---------------------------------------------------------------------------- acknowledgements and epochs


def test_an_acks_all_write_is_not_acknowledged_once_the_leadership_moved_while_the_call_waited(tmp_path):
    """The review's case: one call holds [a plain acks=all batch, a transaction's first batch]
    while the coordinator holds the verification; meanwhile the replica follows in epoch 1,
    truncates to 0 and leads again in epoch 2. No answer may claim an offset the log does
    not hold for it (before the fix: both answered offset 0, and only the transactional
    record was there)."""

    async def main() -> None:
        coordinator = Coordinator({("t", 0)})
        coordinator.hold()
        replica = await leader_of(tmp_path, Controller(coordinator), epoch=0, replicas=(0, 1, 2))
        call = asyncio.ensure_future(replica.produce_requests([
            ProduceRequest(plain(b"plain"), -1, 5_000),
            ProduceRequest(txn_batch(b"txn", 0), -1, 5_000, TRANSACTIONAL_ID),
        ]))
        await until(lambda: coordinator.waiting == 1)
        await replica.become_follower(1, NO_LEADER, None)
        replica._log.truncate_to(0)  # what its fetcher does against the new leader's log
        await replica.become_leader(2, [0], [0])
        coordinator.release()
        answers = await asyncio.wait_for(call, 5)
        stored = dict(values_in(replica))
        for answer, value in zip(answers, (b"plain", b"txn")):
            assert answer.error is not None or stored.get(answer.base_offset) == value, (answer, stored)
        assert all(isinstance(a.error, NotLeaderOrFollowerError) for a in answers), answers
        await replica.close()

    asyncio.run(main())


def test_a_parked_acks_all_write_fails_when_its_epoch_ends_even_if_the_next_epoch_passes_its_offset(tmp_path):
    async def main() -> None:
        replica = await leader_of(tmp_path, Controller(), epoch=0, replicas=(0, 1))
        parked = asyncio.ensure_future(replica.produce(plain(b"first"), -1, 5_000))
        await until(lambda: replica._log.log_end_offset == 1)
        await replica.become_follower(1, NO_LEADER, None)
        replica._log.truncate_to(0)
        await replica.become_leader(2, [0], [0])
        assert (await replica.produce(plain(b"second"), -1, 5_000)).base_offset == 0
        answer = await asyncio.wait_for(parked, 5)
        assert isinstance(answer.error, NotLeaderOrFollowerError), answer
        assert values_in(replica) == [(0, b"second")]
        await replica.close()

    asyncio.run(main())


def test_a_verification_the_coordinator_never_answers_ends_with_the_produces_timeout(tmp_path):
    async def main() -> None:
        coordinator = Coordinator({("t", 0)})
        coordinator.hold()  # and never released
        replica = await leader_of(tmp_path, Controller(coordinator))
        started = time.monotonic()
        [answer] = await asyncio.wait_for(
            replica.produce_requests([ProduceRequest(txn_batch(b"a", 0), -1, 300, TRANSACTIONAL_ID)]), 5
        )
        assert isinstance(answer.error, NotEnoughReplicasError), answer  # retriable, as Kafka answers it
        assert time.monotonic() - started < 3
        assert replica._log.log_end_offset == 0
        await replica.close()

    asyncio.run(main())


# ---------------------------------------------------------------------------- transactions nobody can hang


def test_a_plain_batch_of_a_producer_with_an_open_transaction_is_refused_so_its_marker_still_ends_it(tmp_path):
    """Another client sends `pid 7, epoch 1, seq 0` as a plain idempotent batch while producer
    7's transaction is open (before the fix: accepted, the abort marker then refused as of
    an old epoch, and the LSO stuck at the transaction's start for good)."""

    async def main() -> None:
        replica = await leader_of(tmp_path, Controller(Coordinator({("t", 0)})))
        assert (await replica.produce_requests([(txn_batch(b"t", 0), -1, 1000, TRANSACTIONAL_ID)]))[0].error is None
        forged = await replica.produce(idempotent(b"forged", 0, epoch=EPOCH + 1), -1, 1000)
        assert isinstance(forged.error, InvalidTxnStateError), forged
        assert (await replica.write_txn_marker(PID, EPOCH, False, 0, 1000)).error is None
        log = replica._log
        assert log.last_stable_offset == log.high_watermark == log.log_end_offset == 2
        assert values_in(replica) == [(0, b"t")]
        await replica.close()

    asyncio.run(main())


def test_a_marker_written_while_a_first_batch_is_verified_voids_the_verification_and_its_retry(tmp_path):
    """The review's case: `pid 7 seq 0` waits for its verification, a retry of it arrives, and
    the coordinator's abort marker is written; then the coordinator answers both (before the
    fix: the marker at 0, the batch at 1, the retry at 2, and an open transaction for good)."""

    async def main() -> None:
        coordinator = Coordinator({("t", 0)})
        coordinator.hold()
        replica = await leader_of(tmp_path, Controller(coordinator))
        request = ProduceRequest(txn_batch(b"late", 0), -1, 5_000, TRANSACTIONAL_ID)
        first = asyncio.ensure_future(replica.produce_requests([request]))
        retry = asyncio.ensure_future(replica.produce_requests([request]))
        await until(lambda: coordinator.waiting == 2)
        assert (await replica.write_txn_marker(PID, EPOCH, False, 0, 1000)).error is None
        coordinator.partitions.clear()  # the coordinator aborted the transaction: it holds no partition now
        coordinator.release()
        answers = [(await asyncio.wait_for(call, 5))[0] for call in (first, retry)]
        assert all(isinstance(a.error, InvalidTxnStateError) for a in answers), answers
        log = replica._log
        assert values_in(replica) == [] and log.log_end_offset == 1, "the marker alone"
        assert log.last_stable_offset == log.high_watermark == 1, "no transaction left open"
        await replica.close()

    asyncio.run(main())


def test_a_retry_that_arrives_during_its_first_copys_verification_is_answered_as_a_duplicate(tmp_path):
    async def main() -> None:
        coordinator = Coordinator({("t", 0)})
        coordinator.hold()
        replica = await leader_of(tmp_path, Controller(coordinator))
        request = ProduceRequest(txn_batch(b"once", 0), -1, 5_000, TRANSACTIONAL_ID)
        calls = [asyncio.ensure_future(replica.produce_requests([request])) for _ in range(2)]
        await until(lambda: coordinator.waiting == 2)
        coordinator.release()
        answers = [(await asyncio.wait_for(call, 5))[0] for call in calls]
        assert [(a.error, a.base_offset) for a in answers] == [(None, 0), (None, 0)]
        assert values_in(replica) == [(0, b"once")], "written once"
        await replica.close()

    asyncio.run(main())


def test_the_log_refuses_a_first_transactional_batch_whose_guard_a_marker_voided(tmp_path):
    log = Log(tmp_path)
    guard = log.verification_guard(PID)
    log.append_txn_marker(PID, EPOCH, False, 0, 0)
    try:
        log.append_as_leader(txn_batch(b"a", 0), 0, allow_transactional=True, verification_guard=guard)
    except InvalidTxnStateError:
        pass
    else:
        raise AssertionError("appended with a voided guard")
    assert log.log_end_offset == 1
    fresh = log.verification_guard(PID)
    assert fresh is not guard
    log.append_as_leader(txn_batch(b"a", 0), 0, allow_transactional=True, verification_guard=fresh)
    assert log.log_end_offset == 2
    log.close()


def test_the_leader_refuses_a_sequence_gap_of_a_known_producer_and_answers_a_duplicate_with_its_offsets(tmp_path):
    log = Log(tmp_path)
    log.append_as_leader(idempotent(b"a", 0), 0)
    duplicate = log.append_as_leader(idempotent(b"a", 0), 0)
    assert (duplicate.duplicate, duplicate.first_offset, log.log_end_offset) == (True, 0, 1)
    try:
        log.append_as_leader(idempotent(b"c", 2), 0)
    except KafkaError as e:
        assert e.name == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    else:
        raise AssertionError("a gap was appended")
    log.append_as_leader(idempotent(b"z", 5, producer_id=PID + 1), 0)  # unknown producer: its earlier batches went
    assert log.log_end_offset == 2
    log.close()


# ---------------------------------------------------------------------------- one bad batch, one error


def _with_codec(batch: bytes, codec_id: int) -> bytes:
    """The batch with another compression id in its attributes, and a CRC that matches."""
    data = bytearray(batch)
    attributes = struct.unpack_from(">h", data, ATTRIBUTES_POS)[0]
    struct.pack_into(">h", data, ATTRIBUTES_POS, (attributes & ~0x07) | codec_id)
    struct.pack_into(">I", data, CRC_POS, compute_crc(data))
    return bytes(data)


def test_a_batch_naming_no_codec_is_an_invalid_record_for_its_request_alone(tmp_path):
    async def main() -> None:
        replica = await leader_of(tmp_path, Controller())
        answers = await replica.produce_requests([
            ProduceRequest(plain(b"good"), 1, 1000),
            ProduceRequest(_with_codec(plain(b"bad"), 5), 1, 1000),
            ProduceRequest(plain(b"good too"), -1, 1000),
        ])
        assert [(type(a.error).__name__, a.base_offset) for a in answers] == [
            ("NoneType", 0), ("InvalidRecordError", -1), ("NoneType", 1)
        ]
        assert values_in(replica) == [(0, b"good"), (1, b"good too")]
        await replica.close()

    asyncio.run(main())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_batch_with_a_valid_crc_gets_a_kafka_error_and_leaves_the_log_as_it_was(tmp_path, data):
    """Any bytes after the CRC field changed, the CRC made right again (so the record
    decoders see them): the leader's append raises a typed Kafka error or appends, and
    never anything else."""
    batch = bytearray(build_batch(
        [SimpleRecord(b"v%d" % i, b"k%d" % i, (("h", b"x"),)) for i in range(3)],
        compression=data.draw(st.sampled_from([None, "gzip", "lz4", "zstd", "snappy"])),
    ))
    codec_id = data.draw(st.integers(0, 7))  # 5-7 name no codec
    batch[ATTRIBUTES_POS + 1] = (batch[ATTRIBUTES_POS + 1] & ~0x07) | codec_id
    for _ in range(data.draw(st.integers(0, 4))):
        in_header = st.integers(ATTRIBUTES_POS, HEADER_SIZE_BYTES - 1)  # codec, counts, producer fields
        position = data.draw(st.one_of(in_header, st.integers(HEADER_SIZE_BYTES, len(batch) - 1)))
        batch[position] = data.draw(st.integers(0, 255))
    struct.pack_into(">I", batch, CRC_POS, compute_crc(batch))
    log = Log(tempfile.mkdtemp(dir=tmp_path))
    try:
        log.append_as_leader(bytes(batch), 0)
    except KafkaError:
        assert log.log_end_offset == 0
    log.close()


# ---------------------------------------------------------------------------- a failing disk


def test_a_write_to_a_full_disk_is_a_retriable_storage_error_and_ends_the_replicas_process(tmp_path, monkeypatch):
    """Kafka's LogDirFailureChannel, per replica: the failed request and every later one
    are KAFKA_STORAGE_ERROR (retriable: the producer looks the leader up again; it was
    UNKNOWN_SERVER_ERROR, which failed the records), and the process is told to end so that
    its broker reports it and the Controller moves its leadership."""
    import errno

    from rayk.errors import KafkaStorageError
    from rayk.replication import storage_failure

    ended = []
    monkeypatch.setattr(storage_failure, "end_process", lambda name, error: ended.append((name, error.errno)))

    async def main() -> None:
        replica = await leader_of(tmp_path, Controller(), epoch=0, replicas=(0,))
        assert (await replica.produce(plain(b"before"), -1, 5_000)).error is None

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(replica._log, "append_as_leader", full)
        answers = [await replica.produce(plain(b"full-%d" % i), -1, 5_000) for i in range(2)]
        assert all(isinstance(a.error, KafkaStorageError) and a.error.retriable for a in answers), answers
        assert ended == [("t-0", errno.ENOSPC)], "ended once, for the first failure"
        assert values_in(replica) == [(0, b"before")]
        await replica.close()

    asyncio.run(main())
