"""BatchTransactions: the exactly-once half of a micro-batch stream (`stream_topic(...,
exactly_once=True)` in rayk.data and rayk.spark): what a batch writes to rayk topics and
the group's offsets after the batch are one Kafka transaction (KIP-98's
consume-transform-produce, as Kafka Streams' exactly_once_v2 runs it), committed together
or not at all.

The stream writes through one transactional Producer on its driver, whose
`transactional.id` is the stream's own (`stream_transactional_id`: the group and the
input topic). Starting a stream initialises that id first, before the group's offsets
are read: a stream of the same group and topic still running elsewhere (a driver
thought dead) is fenced (PRODUCER_FENCED at its next write or commit) and its open
transaction aborted, so what it wrote never reaches read_committed readers, and the
offsets read next are those of the last committed batch (read as Kafka's consumer reads
them, once no transaction's offsets await their marker). A batch's transaction begins
when the batch is handed out and commits with its offsets; a batch whose processing
raised, or a stream closed mid-batch, aborts it, and the next stream of the group
processes the batch again.

Downstream readers see a batch's output once only if they read read_committed, and the
stream reads its input read_committed (it must not act on records that may yet be
aborted), as Kafka Streams does. One producer per stream means the output goes through
the driver: rayk has no way for several processes to write one transaction (Kafka has
none either until KIP-939's two-phase commit).
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from rayk.client.resumable_write import send_table
from rayk.client.types import OffsetAndMetadata, TopicPartition
from rayk.errors import InvalidTxnStateError, KafkaError, ProducerFencedError

logger = logging.getLogger(__name__)

DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000  # a batch open longer is aborted by its coordinator


def stream_transactional_id(group_id: str, topic: str) -> str:
    """The transactional.id of the exactly-once stream of `group_id` over `topic`."""
    return f"rayk-stream.{group_id}.{topic}"


class BatchTransactions:
    """An exactly-once stream's transactions: owns its transactional Producer (initialised, and
    so fencing an older stream, when constructed) and whether a batch's transaction is open.
    Made by MicroBatches with `exactly_once`, closed with it; not thread-safe (the driver's
    thread)."""

    def __init__(self, cluster: Any, group_id: str, topic: str, transaction_timeout_ms: int) -> None:
        self.group_id = group_id
        self.producer = cluster.producer(
            transactional_id=stream_transactional_id(group_id, topic), acks="all",
            transaction_timeout_ms=transaction_timeout_ms,
        )  # fmt: skip
        try:
            self.producer.init_transactions()  # fences an older stream and aborts its batch
        except BaseException:
            self.producer.close()
            raise
        self._open = False

    def begin(self) -> None:
        """A batch is handed out: its transaction starts."""
        self.producer.begin_transaction()
        self._open = True

    def write(self, topic: str, table: pa.Table) -> int:
        """Queues `table`'s rows (a `value` column; `key`, `partition`, `headers`,
        `timestamp` optional) to `topic` in the open batch's transaction; returns the row
        count. A record that fails makes the batch's commit raise."""
        if not self._open:
            raise InvalidTxnStateError("an exactly-once stream writes only while a batch is handed out")
        send_table(self.producer, topic, table)
        return table.num_rows

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """Commits the batch's writes with the group's `offsets`. If that fails, the
        transaction is aborted (unless this stream was fenced) and the error raised."""
        assert self._open, "commit without a batch handed out"
        try:
            self.producer.send_offsets_to_transaction(offsets, self.group_id)
            self.producer.commit_transaction()
        except KafkaError:
            self.abort()
            raise
        finally:
            self._open = False

    def abort(self) -> None:
        """Aborts the open batch's transaction, if any (best effort: if the coordinator
        cannot be reached, the transaction times out)."""
        if not self._open:
            return
        self._open = False
        try:
            self.producer.abort_transaction()
        except ProducerFencedError:
            pass  # a newer stream took over: it aborted this one's batch
        except KafkaError as e:
            logger.warning("stream %s: aborting a batch's transaction failed (%s); its timeout aborts it", self.group_id, e)

    def close(self) -> None:
        self.abort()
        self.producer.close()
