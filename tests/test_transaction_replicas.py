"""The transaction coordinator and the transactional writes in the replicas, without Ray
(methods called on the objects, the Controller and other replicas faked behind handles
whose methods have `.remote`):

- a partition leader appends a producer's first transactional batch of a transaction only
  if the transaction coordinator says the partition is in the transaction (KIP-890), and
  answers what Kafka answers otherwise;
- a TransactionStatePartitionReplica coordinates: InitProducerId, AddPartitionsToTxn,
  EndTxn, the markers to the partitions' leaders, and what it left prepared is finished by
  the coordinator of the next leader epoch;
- an OffsetsPartitionReplica keeps TxnOffsetCommit's offsets pending until the producer's
  marker, and a new coordinator replays them, markers included, from the log.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from rayk.coordinator.group.offsets_replica import OffsetsPartitionReplica
from rayk.replication.partition_replica import PartitionReplica
from rayk.coordinator.transaction.transaction_metadata import TxnState
from rayk.coordinator.transaction.transaction_state_replica import TransactionStatePartitionReplica
from rayk.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTopicError,
    InvalidTxnStateError,
    NotCoordinatorError,
    NotEnoughReplicasError,
    ProducerFencedError,
    UnstableOffsetCommitError,
)
from rayk.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from rayk.storage.records import SimpleRecord, build_batch
from tests.transaction_fakes import EPOCH, PID, Controller, Coordinator, Handle, leader_of, txn_batch

# ---------------------------------------------------------------------------- verification (KIP-890)


def test_a_leader_appends_a_transactions_first_batch_only_once_the_coordinator_verifies_it(tmp_path):
    async def main() -> None:
        coordinator = Coordinator()
        replica = await leader_of(tmp_path, Controller(coordinator))
        refused = (await replica.produce_requests([(txn_batch(b"a", 0), -1, 1000, "tx")]))[0]
        assert isinstance(refused.error, InvalidTxnStateError) and coordinator.calls == 1
        assert (await replica.describe())["log_end_offset"] == 0, "nothing appended"

        coordinator.partitions.add(("t", 0))
        first = (await replica.produce_requests([(txn_batch(b"a", 0), -1, 1000, "tx")]))[0]
        second = (await replica.produce_requests([(txn_batch(b"b", 1), -1, 1000, "tx")]))[0]
        assert (first.error, first.base_offset, second.error, second.base_offset) == (None, 0, None, 1)
        assert coordinator.calls == 2, "the open transaction's later batches need no verification"

        assert (await replica.write_txn_marker(PID, EPOCH, True, 0, 1000)).error is None  # offset 2
        coordinator.partitions.clear()
        late = (await replica.produce_requests([(txn_batch(b"late", 2), -1, 1000, "tx")]))[0]
        assert isinstance(late.error, InvalidTxnStateError), "a late write opens no hanging transaction"
        assert coordinator.calls == 3 and (await replica.describe())["log_end_offset"] == 3
        await replica.close()

    asyncio.run(main())


class MarkerWritingCoordinator(Coordinator):
    """A coordinator that, as rayk's does, holds a verification until the producer's
    previous transaction is complete: while `markers_to_write` > 0, a verification first
    writes a marker (`commit`) to `leader`, then answers."""

    def __init__(self, partitions: set[tuple[str, int]], commit: bool) -> None:
        super().__init__(partitions)
        self.leader: Any = None
        self.commit, self.markers_to_write = commit, 0

    async def verify_partitions(self, transactional_id: str, producer_id: int, epoch: int, partitions: list) -> list:
        if self.markers_to_write > 0:
            self.markers_to_write -= 1
            assert (await self.leader.write_txn_marker(PID, EPOCH, self.commit, 0, 1000)).error is None
        return await super().verify_partitions(transactional_id, producer_id, epoch, partitions)


def test_the_previous_transactions_marker_landing_during_a_verification_does_not_refuse_the_next_one(tmp_path):
    """Kafka's Java client sends the next transaction's first batch the moment its commit
    returns, before the commit's markers are written: the coordinator holds the verification
    until they are, so the marker voids the guard taken for it. The leader asks once more
    and appends, instead of answering INVALID_TXN_STATE to a transaction that is open."""
    async def main() -> None:
        coordinator = MarkerWritingCoordinator({("t", 0)}, commit=True)
        replica = coordinator.leader = await leader_of(tmp_path, Controller(coordinator))
        assert (await replica.produce_requests([(txn_batch(b"c0", 0), -1, 1000, "tx")]))[0].error is None
        coordinator.markers_to_write, calls_before = 1, coordinator.calls
        [next_first] = await replica.produce_requests([(txn_batch(b"a0", 0, epoch=EPOCH + 1), -1, 1000, "tx")])
        assert (next_first.error, next_first.base_offset) == (None, 2), next_first
        assert coordinator.calls - calls_before == 2, "asked again once the marker voided the first answer's guard"
        await replica.close()

    asyncio.run(main())


def test_a_transaction_that_ends_at_every_verification_is_refused_not_appended(tmp_path):
    """The marker that voids a guard may be the batch's own transaction's: when it lands
    while the second verification runs too, the write is refused, never appended into no
    transaction."""
    async def main() -> None:
        coordinator = MarkerWritingCoordinator({("t", 0)}, commit=False)
        replica = coordinator.leader = await leader_of(tmp_path, Controller(coordinator))
        assert (await replica.produce_requests([(txn_batch(b"c0", 0), -1, 1000, "tx")]))[0].error is None
        assert (await replica.write_txn_marker(PID, EPOCH, True, 0, 1000)).error is None  # offset 1
        coordinator.markers_to_write, calls_before = 2, coordinator.calls
        [late] = await replica.produce_requests([(txn_batch(b"late", 1), -1, 1000, "tx")])
        assert isinstance(late.error, InvalidTxnStateError) and coordinator.calls - calls_before == 2, late
        assert (await replica.describe())["log_end_offset"] == 4, "c0 and three markers; the late record not"
        await replica.close()

    asyncio.run(main())


@pytest.mark.parametrize(("coordinator_error", "answered"), [
    (NotCoordinatorError("moved"), NotEnoughReplicasError),
    (ProducerFencedError("a newer epoch"), InvalidProducerEpochError),
])
def test_a_verification_the_coordinator_cannot_give_is_answered_as_kafka_answers_it(tmp_path, coordinator_error, answered):
    async def main() -> None:
        replica = await leader_of(tmp_path, Controller(Coordinator(error=coordinator_error)))
        [result] = await replica.produce_requests([(txn_batch(b"a", 0), -1, 1000, "tx")])
        assert isinstance(result.error, answered), result
        await replica.close()

    asyncio.run(main())


def test_a_transactional_batch_without_its_transactional_id_is_an_invalid_record(tmp_path):
    async def main() -> None:
        coordinator = Coordinator({("t", 0)})
        replica = await leader_of(tmp_path, Controller(coordinator))
        result = await replica.produce(txn_batch(b"a", 0), -1, 1000)
        assert isinstance(result.error, InvalidRecordError) and coordinator.calls == 0
        await replica.close()

    asyncio.run(main())


# ---------------------------------------------------------------------------- the transaction coordinator's replica


def test_the_transaction_coordinator_replica_runs_a_transaction_and_its_successor_finishes_a_prepared_one(tmp_path):
    """InitProducerId, AddPartitionsToTxn, EndTxn through the replica; the markers reach the
    partition leader; a client's produce to __transaction_state is refused; a commit left
    prepared (its marker refused) is completed by the coordinator of the next epoch."""

    async def main() -> None:
        controller = Controller()
        data = await leader_of(tmp_path / "data", controller)
        controller.leaders[("t", 0)] = data
        controller.coordinator = coordinator = await leader_of(tmp_path, controller, TRANSACTION_STATE_TOPIC,
                                                               TransactionStatePartitionReplica)
        producer_id, epoch = await coordinator.init_producer_id("tx", 60_000)
        assert (producer_id, epoch) == (1001, 0)
        await coordinator.add_partitions_to_txn("tx", producer_id, epoch, [("t", 0)])
        batch = build_batch([SimpleRecord(b"v")], producer_id=producer_id, producer_epoch=epoch, base_sequence=0,
                            is_transactional=True)  # fmt: skip
        assert (await data.produce_requests([(batch, -1, 1000, "tx")]))[0].error is None
        assert await coordinator.end_txn("tx", producer_id, epoch, True) == (producer_id, epoch)

        async def state() -> TxnState:
            return (await coordinator.describe_transaction("tx")).state

        for _ in range(100):
            if await state() is TxnState.COMPLETE_COMMIT:
                break
            await asyncio.sleep(0.02)
        assert await state() is TxnState.COMPLETE_COMMIT
        assert (await data.describe())["log_end_offset"] == 2  # the record and its marker
        forged = await coordinator.produce(build_batch([SimpleRecord(b"x", b"tx")]), -1, 1000)
        assert isinstance(forged.error, InvalidTopicError)

        await coordinator.add_partitions_to_txn("tx", producer_id, epoch, [("t", 0)])
        await data.become_follower(2, 9, None)  # the marker is refused (NOT_LEADER) and retried
        await coordinator.end_txn("tx", producer_id, epoch, True)
        await asyncio.sleep(0.3)
        assert await state() is TxnState.PREPARE_COMMIT
        await coordinator.become_follower(2, 9, None)
        with pytest.raises(NotCoordinatorError):
            await coordinator.describe_transaction("tx")
        await data.become_leader(3, [0], [0])
        await coordinator.become_leader(3, [0], [0])  # loads the log: a prepared commit, its markers sent again
        for _ in range(100):
            if await state() is TxnState.COMPLETE_COMMIT:
                break
            await asyncio.sleep(0.02)
        assert await state() is TxnState.COMPLETE_COMMIT
        assert (await data.describe())["log_end_offset"] == 3
        await coordinator.close()
        await data.close()

    asyncio.run(main())


# ---------------------------------------------------------------------------- TxnOffsetCommit


def test_transactional_offsets_are_committed_by_the_marker_dropped_by_an_abort_and_replayed_from_the_log(tmp_path):
    async def main() -> None:
        controller = Controller(Coordinator({(OFFSETS_TOPIC, 0)}))
        replica = await leader_of(tmp_path, controller, OFFSETS_TOPIC, OffsetsPartitionReplica)
        await replica.commit_offsets("g", -1, "", {("t", 0): (1, "")})
        await replica.txn_commit_offsets("g", "tx", PID, EPOCH, -1, "", {("t", 0): (5, ""), ("t", 1): (7, "")})
        assert (await replica.fetch_offsets("g"))[("t", 0)].offset == 1, "pending until the marker"
        assert await replica.pending_partitions("g") == {("t", 0), ("t", 1)}
        with pytest.raises(UnstableOffsetCommitError):  # a consumer's lookup (require_stable) retries
            await replica.fetch_offsets("g", [("t", 1)], True)
        assert (await replica.fetch_offsets("other", [("t", 1)], True)) == {}
        assert (await replica.write_txn_marker(PID, EPOCH, True, 0, 1000)).error is None
        committed = await replica.fetch_offsets("g")
        assert (committed[("t", 0)].offset, committed[("t", 1)].offset) == (5, 7)
        assert await replica.pending_partitions("g") == set()

        await replica.txn_commit_offsets("g", "tx", PID, EPOCH, -1, "", {("t", 0): (9, "")})
        assert (await replica.write_txn_marker(PID, EPOCH, False, 0, 1000)).error is None
        assert (await replica.fetch_offsets("g"))[("t", 0)].offset == 5, "an abort drops them"

        await replica.txn_commit_offsets("g", "tx", PID, EPOCH, -1, "", {("t", 0): (11, ""), ("t", 1): (12, "")})
        await replica.commit_offsets("g", -1, "", {("t", 1): (3, "")})  # later in the log: it wins over the pending one
        await replica.become_follower(2, 9, None)
        await replica.become_leader(3, [0], [0])  # a new coordinator replays the log
        assert await replica.pending_partitions("g") == {("t", 0)}
        assert (await replica.write_txn_marker(PID, EPOCH, True, 3, 1000)).error is None
        committed = await replica.fetch_offsets("g")
        assert (committed[("t", 0)].offset, committed[("t", 1)].offset) == (11, 3)
        await replica.close()

        replayed = await leader_of(tmp_path, controller, OFFSETS_TOPIC, OffsetsPartitionReplica, epoch=4)
        committed = await replayed.fetch_offsets("g")
        assert (committed[("t", 0)].offset, committed[("t", 1)].offset) == (11, 3), "the markers replayed"
        await replayed.close()

    asyncio.run(main())
