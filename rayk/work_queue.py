"""WorkQueue: a durable work queue for Ray on a share group (KIP-932).

A pool of Ray actors works through a topic. Each actor is a member of one share group
(a ShareConsumer in explicit mode) and calls the user's function for each record it
acquires, or, with `batch=True`, for each Arrow RecordBatch of them (the columns of
ShareConsumer.poll_batch). The share group hands every record to one member at a time,
so any number of actors can share one partition, and nothing is lost when one dies:

- the function returns: the record (every row of the batch) is accepted, and never
  delivered again;
- it raises one of `retriable` (by default any Exception): the record is released, and
  delivered again, to any actor, with its delivery count one higher; at
  `max_deliveries` (keep it at most the group's `group.share.delivery.count.limit`, 5 by
  default, past which the broker archives a record by itself) it goes to the dead-letter
  topic instead;
- it raises anything else: the record goes to the dead-letter topic at once.
A record sent to the dead-letter topic keeps its key, value and headers, and gains the
headers `rayk.dlq.topic`, `rayk.dlq.partition`, `rayk.dlq.offset`,
`rayk.dlq.delivery.count` and `rayk.dlq.error`; then it is rejected (archived). Without a
`dead_letter_topic` such records are only rejected. With `batch=True` every row of a batch shares the
batch's outcome (each row by its own delivery count).

An actor that dies (its process killed, its node lost) is restarted by Ray as a new
member; what it held goes to the others as soon as the group learns it left (its session
times out, `group.share.session.timeout.ms`) or when the records' locks expire
(`group.share.record.lock.duration.ms`), whichever comes first. A record whose function
ran but whose acceptance was not yet committed when its actor died is processed again:
the work queue is at-least-once, with duplicates only among what a dead actor held.
`resize(n)` adds or stops actors while the pool runs (a stopped one finishes the record or
batch in hand, gives the rest of its poll back and leaves); `stats()` counts what each did.
A poll's work that fails midway (its dead letter could not be sent) gives back what it did
not settle, and the worker goes on.

    pool = WorkQueue(cluster, "jobs", group_id="workers", fn=process, num_workers=4,
                     dead_letter_topic="jobs-dlq")
    pool.resize(8)
    pool.wait_until_idle(timeout_s=300)   # every record settled (the group's offset at the end)
    pool.stop()
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayError

from rayk.errors import KafkaError

logger = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 500
STATS_TIMEOUT_S = 30
STOP_TIMEOUT_S = 60  # a worker's function in hand may run this long after stop()
DLQ_HEADERS = ("rayk.dlq.topic", "rayk.dlq.partition", "rayk.dlq.offset", "rayk.dlq.delivery.count", "rayk.dlq.error")


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """What one worker actor did since it (re)started: its name (new at each restart) and
    how many records it accepted, released for retry and dead-lettered."""

    worker: str
    accepted: int  # records whose function returned
    released: int  # records given back after a retriable error
    dead_lettered: int  # records sent to the dead-letter topic (or only rejected, without one)


@ray.remote(num_cpus=0, max_restarts=-1)
class QueueWorker:
    """One member of the pool: polls, calls the function, settles, commits (its loop runs
    in a thread from construction on, so that a restarted actor works again at once)."""

    def __init__(self, cluster: Any, topic: str, group_id: str, fn: Callable[[Any], Any], batch: bool,
                 dead_letter_topic: str | None, max_deliveries: int, retriable: tuple[type[BaseException], ...],
                 max_poll_records: int) -> None:  # fmt: skip
        self.name = f"worker-{uuid.uuid4().hex[:8]}"
        self._fn, self._batch, self._topic = fn, batch, topic
        self._dead_letter_topic, self._max_deliveries, self._retriable = dead_letter_topic, max_deliveries, retriable
        self._consumer = cluster.share_consumer(topic, group_id=group_id, acknowledgement_mode="explicit",
                                                max_poll_records=max_poll_records, client_id=self.name)  # fmt: skip
        self._producer = cluster.producer(acks="all") if dead_letter_topic else None
        self._counts = {"accepted": 0, "released": 0, "dead_lettered": 0}
        self._stopping = threading.Event()
        self._loop = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._loop.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._work_through_a_poll()
            except KafkaError as e:  # the cluster moving (a leader, a coordinator): the next poll goes on
                logger.warning("%s: %s", self.name, e)
                time.sleep(0.2)
            except Exception:  # a dead letter not sent, or a bug: logged, and the worker goes on
                logger.exception("%s: a poll's work failed", self.name)
                time.sleep(1)
            finally:
                try:  # what the poll did not get to (stopping, or a failure) goes back; the rest is settled
                    self._consumer.release_unacknowledged()
                    self._consumer.commit()
                except Exception as e:  # not committed: those records come back when their locks expire
                    logger.warning("%s: commit failed: %r", self.name, e)

    def _work_through_a_poll(self) -> None:
        if self._batch:
            items, handle = list(self._consumer.poll_batch(POLL_TIMEOUT_MS).values()), self._handle_batch
        else:
            items, handle = self._consumer.poll(POLL_TIMEOUT_MS), self._handle
        for item in items:
            if self._stopping.is_set():
                return
            handle(item)

    def _handle(self, record: Any) -> None:
        try:
            self._fn(record)
        except Exception as e:
            self._failed([(record.topic, record.partition, record.offset, record.delivery_count, record.key,
                           record.value, record.headers)], e)  # fmt: skip
            return
        self._consumer.acknowledge(record, "accept")
        self._counts["accepted"] += 1

    def _handle_batch(self, batch: Any) -> None:
        try:
            self._fn(batch)
        except Exception as e:
            rows = zip(batch.column("topic").to_pylist(), batch.column("partition").to_pylist(),
                       batch.column("offset").to_pylist(), batch.column("deliveryCount").to_pylist(),
                       batch.column("key").to_pylist(), batch.column("value").to_pylist(),
                       [[(h["key"], h["value"]) for h in hs] for hs in batch.column("headers").to_pylist()])  # fmt: skip
            self._failed(list(rows), e)
            return
        self._consumer.acknowledge(batch, "accept")
        self._counts["accepted"] += batch.num_rows

    def _failed(self, rows: list[tuple], error: Exception) -> None:
        """Rows whose function raised: released while retriable and below max_deliveries,
        else dead-lettered and rejected."""
        retriable = isinstance(error, self._retriable)
        for topic, partition, offset, deliveries, key, value, headers in rows:
            if retriable and deliveries < self._max_deliveries:
                self._consumer.acknowledge_offsets(topic, partition, [offset], "release")
                self._counts["released"] += 1
                continue
            if self._producer is not None:
                dlq = [str(v).encode() for v in (topic, partition, offset, deliveries, repr(error)[:1000])]
                self._producer.send(self._dead_letter_topic, value, key=key,
                                    headers=list(headers) + list(zip(DLQ_HEADERS, dlq))).result(timeout=60)  # fmt: skip
            self._consumer.acknowledge_offsets(topic, partition, [offset], "reject")
            self._counts["dead_lettered"] += 1
            logger.info("%s: %s-%d@%d dead-lettered after %d deliveries: %r", self.name, topic, partition, offset,
                        deliveries, error)  # fmt: skip

    def stats(self) -> WorkerStats:
        return WorkerStats(self.name, **self._counts)

    def pid(self) -> int:
        """Its process (a test or the demo kills it)."""
        return os.getpid()

    def actor_id(self) -> str:
        """The actor's id, which a restart keeps."""
        return ray.get_runtime_context().get_actor_id()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> WorkerStats:
        """Finishes the record (or batch) in hand, gives back the rest of its poll,
        commits and leaves the group. A function still running after `timeout_s` is left
        to the caller, which kills the actor: its records come back when their locks
        expire."""
        self._stopping.set()
        self._loop.join(timeout_s)
        if not self._loop.is_alive():
            self._consumer.close()
            if self._producer is not None:
                self._producer.close()
        return self.stats()


class WorkQueue:
    """The driver's handle on a pool of QueueWorker actors of one share group: owns their
    handles (Ray restarts a dead one; `resize` starts and stops them, killing each it
    stops) and the stats of those it stopped. Lives until `stop`; not thread-safe (the
    driver's thread)."""

    def __init__(
        self, cluster: Any, topic: str, *, group_id: str, fn: Callable[[Any], Any], num_workers: int = 1,
        batch: bool = False, dead_letter_topic: str | None = None, max_deliveries: int = 5,
        retriable: tuple[type[BaseException], ...] = (Exception,), max_poll_records: int = 100,
    ) -> None:  # fmt: skip
        if num_workers < 0 or max_deliveries < 1 or max_poll_records < 1:
            raise ValueError("num_workers must be >= 0, max_deliveries and max_poll_records >= 1")
        self.cluster, self.topic, self.group_id = cluster, topic, group_id
        self._args = (cluster, topic, group_id, fn, batch, dead_letter_topic, max_deliveries, tuple(retriable),
                      max_poll_records)  # fmt: skip
        self._workers: list[Any] = []
        self._finished: list[WorkerStats] = []  # of workers stopped by resize
        self.resize(num_workers)

    @property
    def workers(self) -> list[Any]:
        """The actors' handles (a test kills one by its `pid()`)."""
        return list(self._workers)

    def resize(self, num_workers: int) -> None:
        """Starts or stops actors until `num_workers` run; a stopped one finishes its record
        in hand first."""
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        while len(self._workers) < num_workers:
            self._workers.append(QueueWorker.remote(*self._args))
        leaving, self._workers = self._workers[num_workers:], self._workers[:num_workers]
        for worker, stopping in zip(leaving, [w.stop.remote() for w in leaving]):
            try:
                self._finished.append(ray.get(stopping, timeout=STOP_TIMEOUT_S + STATS_TIMEOUT_S))
            except (RayError, TimeoutError) as e:  # dead, restarting or stuck: killed all the same
                logger.warning("a worker did not stop cleanly: %r", e)
            ray.kill(worker, no_restart=True)

    def stats(self) -> list[WorkerStats]:
        """What every actor did: those stopped by `resize`, and those running now (a
        restarted one counts from its restart; one restarting right now is left out)."""
        out = list(self._finished)
        for ref in [w.stats.remote() for w in self._workers]:
            try:
                out.append(ray.get(ref, timeout=STATS_TIMEOUT_S))
            except (RayError, TimeoutError) as e:  # (GetTimeoutError is a TimeoutError)
                logger.debug("a worker's stats: %r", e)
        return out

    def wait_until_idle(self, timeout_s: float = 300, poll_s: float = 0.5) -> None:
        """Returns once the group's start offset of every partition of the topic is the
        partition's end (every record settled); TimeoutError after `timeout_s`."""
        admin = self.cluster.admin()
        deadline = time.monotonic() + timeout_s
        while True:
            ends = {(self.topic, p.partition): p.high_watermark for p in self.cluster.describe_topic(self.topic)}
            try:
                offsets = admin.list_share_group_offsets(self.group_id)
            except KafkaError:
                offsets = {}
            if all(end is not None and offsets.get(tp, -1) >= end for tp, end in ends.items() if end != 0):
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"work queue {self.group_id!r} not idle after {timeout_s} s: {offsets} of {ends}")
            time.sleep(poll_s)

    def stop(self) -> list[WorkerStats]:
        """Stops every actor (each finishes its record in hand); returns `stats()`."""
        self.resize(0)
        return list(self._finished)
