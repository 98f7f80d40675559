"""The transaction coordinator of one __transaction_state partition, against a scripted
partition log and scripted partition leaders: what it writes before it answers, the markers
it sends and retries, its recovery of prepared transactions after a failover, the
abort of timed-out transactions and the expiry of idle ids."""

from __future__ import annotations

import asyncio

import pytest

from rayk.coordinator.transaction import transaction_coordinator
from rayk.coordinator.transaction.transaction_coordinator import TransactionConfig, TransactionCoordinator
from rayk.coordinator.transaction.transaction_metadata import TV2, TxnState
from rayk.coordinator.transaction.transaction_records import decode_record
from rayk.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    KafkaStorageError,
    NotLeaderOrFollowerError,
    ProducerFencedError,
    TransactionCoordinatorFencedError,
    UnknownTopicOrPartitionError,
)

A, B = ("orders", 0), ("orders", 1)


class Partitions:
    """The partition log (records appended) and the partition leaders (markers written),
    each of which may refuse what the script says first."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None]] = []
        self.acks: list[int] = []  # of each append
        self.markers: list[tuple] = []
        self.refusals: dict[tuple[str, int], list[Exception]] = {}
        self.fail_appends = False
        self.next_id = 100
        self.now_ms = 1_000  # the coordinator's wall clock
        self.monotonic_ms = 50  # and its monotonic one

    def advance(self, ms: int) -> None:
        """Time passes: both clocks move."""
        self.now_ms += ms
        self.monotonic_ms += ms

    async def append(self, records: list[tuple[bytes, bytes | None]], acks: int = -1) -> None:
        if self.fail_appends:
            raise KafkaStorageError("the log is gone")
        self.records += records
        self.acks.append(acks)

    async def write_marker(self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool,
                           coordinator_epoch: int) -> None:  # fmt: skip
        refusals = self.refusals.get((topic, partition))
        if refusals:
            raise refusals.pop(0)
        self.markers.append((topic, partition, producer_id, epoch, commit, coordinator_epoch))

    async def new_producer_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def coordinator(self, epoch: int = 3, **config) -> TransactionCoordinator:
        return TransactionCoordinator(self.append, self.write_marker, self.new_producer_id, epoch,
                                      TransactionConfig(**config), clock_ms=lambda: self.now_ms,
                                      monotonic_ms=lambda: self.monotonic_ms)  # fmt: skip

    def states(self) -> list[tuple[str, str | None]]:
        """(id, state name) of each record written, in order."""
        out = []
        for key, value in self.records:
            transactional_id, md = decode_record(key, value)
            out.append((transactional_id, None if md is None else md.state.display_name))
        return out


async def settle(coordinator: TransactionCoordinator) -> None:
    for _ in range(100):
        if not coordinator._completing:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the markers were not all written")


def test_a_transaction_is_written_before_each_answer_and_its_markers_follow_the_decision():
    async def scenario():
        p = Partitions()
        c = p.coordinator()
        pid, epoch = await c.init_producer_id("tx", 60_000)
        assert (pid, epoch) == (101, 0)
        await c.add_partitions("tx", pid, epoch, [A])
        await c.add_partitions("tx", pid, epoch, [A, B])
        await c.add_partitions("tx", pid, epoch, [B])  # nothing new: nothing written
        p.refusals[A] = [NotLeaderOrFollowerError("moving")]  # retried
        assert await c.end_transaction("tx", pid, epoch, commit=True) == (pid, 0)
        await settle(c)
        assert sorted(p.markers) == [("orders", 0, pid, 0, True, 3), ("orders", 1, pid, 0, True, 3)]
        assert p.states() == [("tx", "Empty"), ("tx", "Ongoing"), ("tx", "Ongoing"), ("tx", "PrepareCommit"),
                              ("tx", "CompleteCommit")]  # fmt: skip
        again = p.coordinator(epoch=4)  # a failover: the next coordinator replays the same state
        assert again.load(p.records) == 0
        assert again.metadata("tx") == c.metadata("tx")

    asyncio.run(scenario())


def test_a_new_instance_aborts_the_open_transaction_with_a_fencing_epoch_and_retries():
    async def scenario():
        p = Partitions()
        c = p.coordinator()
        pid, _ = await c.init_producer_id("tx", 60_000)
        await c.add_partitions("tx", pid, 0, [A])
        with pytest.raises(ConcurrentTransactionsError):
            await c.init_producer_id("tx", 60_000)
        with pytest.raises(ProducerFencedError):
            await c.add_partitions("tx", pid, 0, [B])  # the zombie, answered once the abort is written
        await settle(c)
        assert p.markers == [("orders", 0, pid, 1, False, 3)], "the abort carries the fencing epoch"
        assert await c.init_producer_id("tx", 60_000) == (pid, 2)
        with pytest.raises(ProducerFencedError):
            await c.end_transaction("tx", pid, 0, commit=True)

    asyncio.run(scenario())


def test_the_next_transaction_waits_for_the_last_one_s_markers_instead_of_being_refused(monkeypatch):
    """A producer starts its next transaction while the markers of its last one are being
    written: its AddPartitionsToTxn is answered once they are (and Complete*, written
    without waiting for the ISR, is in the log before its Ongoing), not refused with
    CONCURRENT_TRANSACTIONS; a completion that takes longer than COMPLETION_WAIT_MS is."""
    monkeypatch.setattr(transaction_coordinator, "COMPLETION_WAIT_MS", 200)

    async def scenario():
        p = Partitions()
        c = p.coordinator()
        pid, epoch = await c.init_producer_id("tx", 60_000)
        await c.add_partitions("tx", pid, epoch, [A])
        leader_answers = asyncio.Event()
        write_marker = p.write_marker

        async def slow_marker(*args) -> None:
            await leader_answers.wait()
            await write_marker(*args)

        p.write_marker = slow_marker
        c._write_marker = slow_marker
        await c.end_transaction("tx", pid, epoch, commit=True)
        next_add = asyncio.ensure_future(c.add_partitions("tx", pid, epoch, [B]))
        await asyncio.sleep(0.05)
        assert not next_add.done(), "it waits for the markers"
        leader_answers.set()
        await asyncio.wait_for(next_add, 1)
        assert p.states()[-3:] == [("tx", "PrepareCommit"), ("tx", "CompleteCommit"), ("tx", "Ongoing")]
        assert p.acks[-3:] == [-1, 1, -1], "Complete* alone is not waited for: the Ongoing after it is"

        await c.end_transaction("tx", pid, epoch, commit=False)
        leader_answers.clear()
        with pytest.raises(ConcurrentTransactionsError):
            await c.add_partitions("tx", pid, epoch, [A])  # the markers take longer than COMPLETION_WAIT_MS
        leader_answers.set()
        await settle(c)
        await c.add_partitions("tx", pid, epoch, [A])

    asyncio.run(scenario())


def test_a_coordinator_that_took_over_completes_what_was_prepared():
    async def scenario():
        p = Partitions()
        c = p.coordinator(epoch=3)
        pid, _ = await c.init_producer_id("tx", 60_000)
        await c.add_partitions("tx", pid, 0, [A, B])
        p.refusals[A] = [TransactionCoordinatorFencedError("a newer coordinator wrote here")]
        await c.end_transaction("tx", pid, 0, commit=False)
        await settle(c)
        assert c.metadata("tx").state is TxnState.PREPARE_ABORT, "a fenced coordinator leaves it to the next"
        successor = p.coordinator(epoch=4)
        successor.load(p.records)
        successor.resume()
        await settle(successor)
        assert successor.metadata("tx").state is TxnState.COMPLETE_ABORT
        assert ("orders", 0, pid, 0, False, 4) in p.markers

    asyncio.run(scenario())


def test_a_deleted_partition_needs_no_marker_and_a_failed_write_changes_nothing():
    async def scenario():
        p = Partitions()
        c = p.coordinator()
        pid, _ = await c.init_producer_id("tx", 60_000)
        await c.add_partitions("tx", pid, 0, [A])
        p.fail_appends = True
        with pytest.raises(KafkaStorageError):
            await c.add_partitions("tx", pid, 0, [B])
        assert c.metadata("tx").partitions == {A}
        p.fail_appends = False
        p.refusals[A] = [UnknownTopicOrPartitionError("deleted")]
        await c.end_transaction("tx", pid, 0, commit=True)
        await settle(c)
        assert c.metadata("tx").state is TxnState.COMPLETE_COMMIT and p.markers == []

    asyncio.run(scenario())


def test_tv2_gets_a_new_epoch_at_every_end():
    async def scenario():
        p = Partitions()
        c = p.coordinator()
        pid, epoch = await c.init_producer_id("tx", 60_000)
        await c.add_partitions("tx", pid, epoch, [A], client_transaction_version=TV2)
        assert await c.end_transaction("tx", pid, epoch, True, TV2) == (pid, 1)
        await settle(c)
        assert p.markers == [("orders", 0, pid, 1, True, 3)], "the marker carries the new epoch"
        assert await c.end_transaction("tx", pid, epoch, True, TV2) == (pid, 1), "a retry with the old epoch"

    asyncio.run(scenario())


def test_timed_out_transactions_are_aborted_and_idle_ids_expire():
    async def scenario():
        p = Partitions()
        c = p.coordinator(transactional_id_expiration_ms=10_000)
        for name in ("slow", "idle"):
            await c.init_producer_id(name, 5_000)
        pid, _ = c.metadata("slow").producer_id, 0
        await c.add_partitions("slow", pid, 0, [A])
        p.advance(5_001)
        assert await c.abort_timed_out() == ["slow"]
        await settle(c)
        assert c.metadata("slow").state is TxnState.COMPLETE_ABORT and p.markers == [("orders", 0, pid, 1, False, 3)]
        p.now_ms += 10_001 - 5_001
        assert await c.expire() == ["idle"]
        assert c.metadata("idle") is None and p.states()[-1] == ("idle", None), "a tombstone"
        fresh = p.coordinator()
        fresh.load(p.records)
        assert fresh.metadata("idle") is None and fresh.metadata("slow") == c.metadata("slow")

    asyncio.run(scenario())


def test_bad_requests_get_kafkas_errors():
    async def scenario():
        c = Partitions().coordinator(transaction_max_timeout_ms=60_000)
        with pytest.raises(InvalidRequestError):
            await c.init_producer_id("", 1_000)
        with pytest.raises(InvalidTransactionTimeoutError):
            await c.init_producer_id("tx", 60_001)
        with pytest.raises(InvalidProducerIdMappingError):
            await c.add_partitions("unknown", 1, 0, [A])
        assert c.load([(b"\xc1", b"junk")]) == 1, "a record it cannot read is skipped"

    asyncio.run(scenario())


def test_the_coordinator_keeps_no_lock_for_ids_it_is_not_serving():
    """Ids that come and go (Flink makes one per checkpoint), expired ones and unknown ones
    leave no per-id lock behind; an id's requests still wait for each other."""

    async def scenario():
        p = Partitions()
        c = p.coordinator(transactional_id_expiration_ms=10_000)
        for i in range(200):
            await c.init_producer_id(f"checkpoint-{i}", 5_000)
        for i in range(50):
            with pytest.raises(InvalidProducerIdMappingError):
                await c.add_partitions(f"unknown-{i}", 1, 0, [A])
        p.now_ms += 10_001
        assert len(await c.expire()) == 200
        assert len(c._locks) == 0

        order = []

        async def hold(name: str) -> None:
            async with c._lock("tx"):
                order.append(name)
                await asyncio.sleep(0.01)
                order.append(name)

        await asyncio.gather(hold("a"), hold("b"))
        assert order == ["a", "a", "b", "b"] and len(c._locks) == 0

    asyncio.run(scenario())
