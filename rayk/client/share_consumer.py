"""ShareConsumer: a member of a share group (KIP-932), as Kafka's KafkaShareConsumer.

The members of a share group consume its topics' partitions together, record by record:
each record goes to one member at a time, locked for it for
`group.share.record.lock.duration.ms` (30 s). What a member does not settle in time goes
to another; a record delivered `group.share.delivery.count.limit` (5) times without
being accepted is archived. So more members than partitions all get work, and the
records a dead member held come back to the others.

`poll(timeout_ms)` returns the records acquired for this member (ShareConsumerRecord: a
ConsumerRecord with its delivery count); `poll_batch` returns them as one pyarrow
RecordBatch per partition (Consumer.poll_batch's columns and deliveryCount). Each is
settled with `acknowledge(record_or_batch, "accept" | "release" | "reject")`, or by offset
with `acknowledge_offsets`:
- accept: done; it is never delivered again;
- release: give it back now, to be delivered again (it counts a delivery);
- reject: done, unprocessable (archived).
With `acknowledgement_mode="implicit"` (the default, as Kafka's), every record of a poll
not acknowledged otherwise is accepted by the next `poll`, `commit` or `close`; with
"explicit", `poll` raises IllegalStateError while a record of the previous poll is
unacknowledged. Acknowledgements travel with the next fetch of their partition, or at
once with `commit()`, which returns per partition the error of those that failed (an
acknowledgement whose lock expired is INVALID_RECORD_STATE: the record went to another
member). `close()` settles what was acknowledged, gives back what was not, and leaves
the group, which makes the partitions' leaders hand out what this member held at once.

Membership is a heartbeat thread sending ShareGroupHeartbeat to the group's coordinator
every `group.share.heartbeat.interval.ms` the coordinator answers; the answer says which
partitions to fetch from. Fetches go to each assigned partition's leader over the data
plane (rayk.client.data_plane: the records are never pickled), several in flight at
once: a fetch waits at the leader up to `fetch_max_wait_ms` for records, and one
answered after its poll returned is kept for the next poll.

Not thread-safe apart from the heartbeat thread (as Kafka's consumers: one thread uses it).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

from rayk.coordinator.share.share_group import JOIN_EPOCH, LEAVE_EPOCH
from rayk.replication.share.share_partition import AcknowledgeType
from rayk.client import calls
from rayk.client.coordinator_link import CoordinatorLink
from rayk.client.data_plane import DataPlaneSession
from rayk.client.fetcher import gc_paused
from rayk.client.serializers import as_is, deserializer
from rayk.dataplane.frames import ShareFetchRequest, ShareFetchResult
from rayk.errors import FencedMemberEpochError, KafkaError, NotLeaderOrFollowerError, UnknownMemberIdError
from rayk.storage.records import decode_record_tuples, iter_batches

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
FIRST_HEARTBEAT_INTERVAL_MS = 1_000
ACKNOWLEDGE_TYPES = {"accept": AcknowledgeType.ACCEPT, "release": AcknowledgeType.RELEASE, "reject": AcknowledgeType.REJECT}


class IllegalStateError(RuntimeError):
    """The share consumer was used out of order (Kafka's IllegalStateException): closed,
    a record acknowledged that the last poll did not return, or a poll in explicit mode
    with records of the last one unacknowledged."""


class ShareConsumerRecord(NamedTuple):
    """One record a share consumer acquired: a ConsumerRecord's fields (timestamp in ms) and
    how many times it has been delivered, this time included."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms
    timestamp_type: int
    key: Any
    value: Any
    headers: list[tuple[str, bytes | None]]
    delivery_count: int  # 1: its first delivery


class ShareConsumer:
    """One member of a share group: owns its membership (member id, epoch, assignment) and the
    heartbeat thread, the fetches in flight to each partition's leader, and the records of
    the last poll with their acknowledgements. Lives until `close` leaves the group; used
    from one thread (besides its heartbeats)."""

    def __init__(
        self,
        cluster: Any,
        *topics: str,
        group_id: str,
        key_deserializer: Any = None,
        value_deserializer: Any = None,
        client_id: str = "rayk-share-consumer",
        acknowledgement_mode: str = "implicit",
        max_poll_records: int = 500,
        fetch_max_wait_ms: int = 500,
        request_timeout_ms: int = 30_000,
    ) -> None:
        if not group_id:
            raise ValueError("a share consumer needs a group_id")
        if acknowledgement_mode not in ("implicit", "explicit"):
            raise ValueError(f"acknowledgement_mode is 'implicit' or 'explicit', not {acknowledgement_mode!r}")
        if max_poll_records < 1 or fetch_max_wait_ms < 0:
            raise ValueError("max_poll_records must be >= 1 and fetch_max_wait_ms >= 0")
        self._cluster, self.group_id, self.client_id = cluster, group_id, client_id
        self._topics = sorted(set(topics))
        self._key_deserializer, self._value_deserializer = deserializer(key_deserializer), deserializer(value_deserializer)
        self._explicit = acknowledgement_mode == "explicit"
        self._max_poll_records, self._fetch_max_wait_ms = max_poll_records, fetch_max_wait_ms
        self._request_timeout_ms = request_timeout_ms
        self._link = CoordinatorLink(cluster.controller, group_id, request_timeout_ms, cluster.retry_backoff_ms)
        self.member_id = str(uuid.uuid4())
        self._lock = threading.Lock()  # the membership, which the heartbeat thread changes
        self._epoch = JOIN_EPOCH
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._interval_ms = FIRST_HEARTBEAT_INTERVAL_MS
        self._leaders: dict[TopicPartition, Any] = {}
        self._retry_backoff_s = cluster.retry_backoff_ms / 1000
        self._retry_at: dict[TopicPartition, float] = {}  # a partition whose fetch failed, until then
        self._data_plane = DataPlaneSession("share consumer")  # fetches and acknowledgements go to leaders there
        self._waiter = calls.ReadyWaiter()
        self._fetches: dict[TopicPartition, Any] = {}  # a fetch in flight per partition (a future)
        self._acks: dict[TopicPartition, list[tuple[int, int, int]]] = {}  # to send with the next fetch or commit
        # The last poll's records: their acquired ranges, and the offsets acknowledged since.
        self._polled: dict[TopicPartition, list[tuple[int, int]]] = {}
        self._acked: dict[TopicPartition, set[int]] = {}
        self._closed = False
        self._stop = threading.Event()
        self._heartbeat_once()  # joins (raises what the coordinator refuses: a group id of another kind, ...)
        self._heartbeats = threading.Thread(target=self._heartbeat_forever, name=f"share-heartbeat-{group_id}", daemon=True)
        self._heartbeats.start()

    # ------------------------------------------------------------------ membership

    def assignment(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._assignment)

    def _heartbeat_once(self, leave: bool = False) -> None:
        with self._lock:
            epoch = LEAVE_EPOCH if leave else self._epoch
            topics = self._topics if epoch == JOIN_EPOCH else None
        try:
            answer = self._link.call("share_heartbeat", self.group_id, self.member_id, epoch, topics, self.client_id,
                                     timeout_ms=self._request_timeout_ms)  # fmt: skip
        except (FencedMemberEpochError, UnknownMemberIdError) as e:
            logger.info("share group %s: member %s must join again: %s", self.group_id, self.member_id, e)
            with self._lock:
                self._epoch, self._assignment = JOIN_EPOCH, frozenset()
            return
        with self._lock:
            if leave:
                self._epoch, self._assignment = LEAVE_EPOCH, frozenset()
                return
            self._epoch = answer.member_epoch
            if answer.assignment is not None:
                self._assignment = frozenset(answer.assignment)
            self._interval_ms = answer.heartbeat_interval_ms or self._interval_ms

    def _heartbeat_forever(self) -> None:
        while not self._stop.wait(self._interval_ms / 1000):
            try:
                self._heartbeat_once()
            except KafkaError as e:  # the coordinator moving or away: next interval (the session is longer)
                logger.warning("share group %s: heartbeat failed: %s", self.group_id, e)

    # ------------------------------------------------------------------ consuming

    def poll(self, timeout_ms: int = 0) -> list[ShareConsumerRecord]:
        """The records acquired for this member (at most max_poll_records per partition),
        waiting up to `timeout_ms` for some."""
        results = self._poll(timeout_ms)
        with gc_paused():
            return self._delivered(results, lambda: [r for tp, result in results for r in self._decode(tp, result)])

    def poll_batch(self, timeout_ms: int = 0) -> dict[TopicPartition, Any]:
        """`poll` in columns: per partition one pyarrow RecordBatch of the acquired
        records, with the columns of Consumer.poll_batch (rayk.client.arrow_batches.SCHEMA:
        key, value, topic, partition, offset, timestamp, timestampType, headers, decoded by
        compiled code) and deliveryCount (int16). Keys and values are the stored bytes.
        Settle a whole batch with `acknowledge(batch, type)`, or rows with
        `acknowledge_offsets`."""
        results = self._poll(timeout_ms)
        return self._delivered(
            results, lambda: {tp: batch for tp, result in results if (batch := self._columns(tp, result)).num_rows})

    def _delivered(self, results: list[tuple[TopicPartition, ShareFetchResult]], decode: Any) -> Any:
        """The poll's records as `decode` makes them; they are the last poll's from now on.
        If decoding fails (a deserializer raised), none reached the application: all go back."""
        self._polled = {tp: [(a, b) for a, b, _ in r.acquired] for tp, r in results}
        self._acked = {}
        try:
            return decode()
        except BaseException:
            self.release_unacknowledged()
            raise

    def release_unacknowledged(self) -> None:
        """Gives back every record of the last poll not acknowledged yet (sent with the
        next fetch or commit), in either acknowledgement mode: what a worker that stops
        midway, or fails, did not get to."""
        for tp, ranges in self._polled.items():
            for first, last in _without(ranges, self._acked.get(tp, set())):
                self._acks.setdefault(tp, []).append((first, last, int(AcknowledgeType.RELEASE)))
        self._polled, self._acked = {}, {}

    def _poll(self, timeout_ms: int) -> list[tuple[TopicPartition, ShareFetchResult]]:
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
        self._check_open()
        self._settle_previous_poll()
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._start_fetches(max(0, min(self._fetch_max_wait_ms, int((deadline - time.monotonic()) * 1000))))
            wait_s = max(0.0, deadline - time.monotonic())
            if not self._fetches:  # nothing to wait for: look again soon (an assignment, a backoff's end)
                wait_s = min(wait_s, self._retry_backoff_s)
            results = self._collect(self._waiter.ready(list(self._fetches.values()), wait_s))
            if results or time.monotonic() >= deadline:
                return results

    def acknowledge(self, record: ShareConsumerRecord | Any, type: str = "accept") -> None:  # noqa: A002 (Kafka's name)
        """Settles one record of the last poll, or every row of one of its RecordBatches
        (see the module docstring)."""
        if isinstance(record, ShareConsumerRecord):
            self.acknowledge_offsets(record.topic, record.partition, [record.offset], type)
            return
        if record.num_rows:
            topic, partition = record.column("topic")[0].as_py(), record.column("partition")[0].as_py()
            self.acknowledge_offsets(topic, partition, record.column("offset").to_pylist(), type)

    def acknowledge_offsets(self, topic: str, partition: int, offsets: Iterable[int], type: str = "accept") -> None:  # noqa: A002
        """Settles records of the last poll by offset; IllegalStateError (and nothing
        settled) for one that is not an unacknowledged record of it."""
        self._check_open()
        kind = ACKNOWLEDGE_TYPES.get(type)
        if kind is None:
            raise ValueError(f"type is one of {sorted(ACKNOWLEDGE_TYPES)}, not {type!r}")
        tp = (topic, partition)
        offsets = list(offsets)
        acked = self._acked.setdefault(tp, set())
        stray = [o for o in offsets if o in acked or not self._polled_offset(tp, o)]
        if stray or len(set(offsets)) != len(offsets):
            raise IllegalStateError(f"{topic}-{partition}@{(stray or offsets)[0]} is not an unacknowledged record "
                                    "of the last poll")  # fmt: skip
        acked.update(offsets)
        self._acks.setdefault(tp, []).extend((o, o, int(kind)) for o in offsets)

    def _polled_offset(self, tp: TopicPartition, offset: int) -> bool:
        ranges = self._polled.get(tp, [])
        i = bisect.bisect_right(ranges, (offset, float("inf"))) - 1
        return i >= 0 and ranges[i][0] <= offset <= ranges[i][1]

    def commit(self) -> dict[TopicPartition, KafkaError | None]:
        """Sends the acknowledgements now (implicit mode: accepting the last poll's
        records first) and waits for them; per partition None or its error."""
        self._check_open()
        if not self._explicit:
            self._settle_previous_poll()
        return self._send_acks()

    def close(self) -> None:
        """Settles what was acknowledged (implicit mode: the last poll's records are
        accepted), gives back what in-flight fetches acquired, and leaves the group."""
        if self._closed:
            return
        if not self._explicit:
            self._settle_previous_poll()
        deadline = time.monotonic() + (self._fetch_max_wait_ms + self._request_timeout_ms) / 1000
        for tp, ref in list(self._fetches.items()):
            try:
                result: ShareFetchResult = calls.get(ref, deadline, "ShareFetch")
            except KafkaError:
                continue
            for first, last, _ in result.acquired:
                self._acks.setdefault(tp, []).append((first, last, int(AcknowledgeType.RELEASE)))
        self._fetches.clear()
        try:
            self._send_acks()
        finally:
            self._closed = True
            self._stop.set()
            self._heartbeats.join(timeout=self._request_timeout_ms / 1000)
            try:
                self._heartbeat_once(leave=True)
            except KafkaError as e:  # the coordinator times the member out instead
                logger.warning("share group %s: could not leave: %s", self.group_id, e)
            finally:
                self._data_plane.close()

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the parts

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("this share consumer is closed")

    def _settle_previous_poll(self) -> None:
        """Implicit mode: the last poll's records not acknowledged are accepted; explicit
        mode: IllegalStateError while there are such records."""
        left = {tp: _without(ranges, self._acked.get(tp, set())) for tp, ranges in self._polled.items()}
        left = {tp: ranges for tp, ranges in left.items() if ranges}
        if left and self._explicit:
            count = sum(b - a + 1 for ranges in left.values() for a, b in ranges)
            raise IllegalStateError(f"{count} record(s) of the last poll are not acknowledged")
        for tp, ranges in left.items():
            self._acks.setdefault(tp, []).extend((a, b, int(AcknowledgeType.ACCEPT)) for a, b in ranges)
        self._polled, self._acked = {}, {}

    def _leader(self, tp: TopicPartition) -> Any:
        handle = self._leaders.get(tp)
        if handle is None:
            handle = self._leaders[tp] = self._cluster.leader(*tp)
        return handle

    def _start_fetches(self, max_wait_ms: int) -> None:
        assignment = self.assignment()
        for tp in [tp for tp in self._acks if tp not in assignment and tp not in self._fetches]:
            # Moved to other members: its acknowledgements go now, not at commit (their locks run).
            try:
                self._acknowledge(tp, self._acks.pop(tp))
            except KafkaError as e:
                logger.warning("share consumer: %s-%d: acknowledgements not sent: %s", *tp, e)
        now = time.monotonic()
        for tp in sorted(assignment):
            if tp in self._fetches or self._retry_at.get(tp, 0) > now:
                continue
            try:
                leader = self._leader(tp)
            except KafkaError as e:  # no leader now: after a backoff
                logger.debug("share consumer: %s-%d: %s", *tp, e)
                self._retry_at[tp] = now + self._retry_backoff_s
                continue
            acks = _ranges(self._acks.pop(tp, []))
            self._fetches[tp] = self._data_plane.share_fetch(leader, ShareFetchRequest(
                self.group_id, self.member_id, self._max_poll_records, max_wait_ms, tuple(acks)))  # fmt: skip

    def _acknowledge(self, tp: TopicPartition, acks: list[tuple[int, int, int]]) -> Any:
        """Sends acknowledgements alone (a share fetch of no records): a future of its ShareFetchResult."""
        return self._data_plane.share_fetch(self._leader(tp), ShareFetchRequest(
            self.group_id, self.member_id, 0, 0, tuple(_ranges(acks))))  # fmt: skip

    def _collect(self, ready: set[Any]) -> list[tuple[TopicPartition, ShareFetchResult]]:
        """The answered fetches with records acquired."""
        results: list[tuple[TopicPartition, ShareFetchResult]] = []
        for tp, ref in list(self._fetches.items()):
            if ref not in ready:
                continue
            del self._fetches[tp]
            try:
                result: ShareFetchResult = calls.get(ref, time.monotonic() + 1, "ShareFetch")
            except KafkaError as e:
                result = ShareFetchResult(error=e)
            if result.acknowledge_error is not None:
                logger.warning("share consumer: %s-%d: acknowledgements failed: %s", *tp, result.acknowledge_error)
            if result.error is not None:
                if isinstance(result.error, NotLeaderOrFollowerError) or calls.unanswered(result.error):
                    self._leaders.pop(tp, None)
                logger.debug("share consumer: %s-%d: %s", *tp, result.error)
                self._retry_at[tp] = time.monotonic() + self._retry_backoff_s
                continue
            if result.acquired:
                results.append((tp, result))
        return results

    def _columns(self, tp: TopicPartition, result: ShareFetchResult) -> Any:
        """The acquired records of a fetch as a RecordBatch (see `poll_batch`); acquired
        offsets the log no longer holds are given back."""
        import numpy as np
        import pyarrow as pa

        from rayk.client.arrow_batches import numpy_array, numpy_view, records_batch, rows_where

        first, last = result.acquired[0][0], result.acquired[-1][1]
        batch = records_batch(result.records, tp[0], tp[1], first, last + 1)
        offsets = numpy_view(batch.column("offset"), np.int64)
        counts = np.zeros(len(offsets), dtype=np.int16)
        keep = np.zeros(len(offsets), dtype=bool)
        for a, b, n in result.acquired:
            inside = (offsets >= a) & (offsets <= b)
            keep |= inside
            counts[inside] = n
        batch = rows_where(batch, keep).append_column("deliveryCount", numpy_array(pa.int16(), counts[keep]))
        if batch.num_rows < sum(b - a + 1 for a, b, _ in result.acquired):
            found = set(batch.column("offset").to_pylist())
            self._settle_gaps(tp, [o for a, b, _ in result.acquired for o in range(a, b + 1) if o not in found])
        return batch

    def _decode(self, tp: TopicPartition, result: ShareFetchResult) -> list[ShareConsumerRecord]:
        acquired = result.acquired
        keys, values = self._key_deserializer, self._value_deserializer
        out = []
        found = 0
        i = 0
        for batch in iter_batches(result.records):
            header, decoded = decode_record_tuples(batch.data)
            for offset, timestamp, key, value, headers in decoded:
                while i < len(acquired) and acquired[i][1] < offset:
                    i += 1
                if i == len(acquired) or offset < acquired[i][0]:
                    continue  # in the batch, not acquired for this member
                found += 1
                out.append(ShareConsumerRecord(
                    tp[0], tp[1], offset, timestamp, int(header.timestamp_type),
                    key if keys is as_is else keys(key), value if values is as_is else values(value), headers,
                    acquired[i][2],
                ))  # fmt: skip
        if found < sum(b - a + 1 for a, b, _ in acquired):
            seen = {r.offset for r in out}
            self._settle_gaps(tp, [o for a, b, _ in acquired for o in range(a, b + 1) if o not in seen])
        return out

    def _settle_gaps(self, tp: TopicPartition, offsets: list[int]) -> None:
        """Acquired offsets without a record (compaction left a gap inside a batch, or
        retention removed them) are settled as Kafka's clients settle them (GAP, which the
        leader takes as ACCEPT): there is nothing to deliver."""
        if offsets:
            self._acked.setdefault(tp, set()).update(offsets)
            self._acks.setdefault(tp, []).extend((o, o, int(AcknowledgeType.ACCEPT)) for o in offsets)

    def _send_acks(self) -> dict[TopicPartition, KafkaError | None]:
        sent: dict[TopicPartition, Any] = {}
        for tp, acks in list(self._acks.items()):
            del self._acks[tp]
            try:
                sent[tp] = self._acknowledge(tp, acks)
            except KafkaError as e:
                sent[tp] = e
        out: dict[TopicPartition, KafkaError | None] = {}
        deadline = time.monotonic() + self._request_timeout_ms / 1000
        for tp, ref in sent.items():
            if isinstance(ref, KafkaError):
                out[tp] = ref
                continue
            try:
                acked: ShareFetchResult = calls.get(ref, deadline, "ShareAcknowledge")
                if acked.acknowledge_error is not None:
                    raise acked.acknowledge_error
                out[tp] = None
            except KafkaError as e:
                out[tp] = e
                if isinstance(e, NotLeaderOrFollowerError):
                    self._leaders.pop(tp, None)
        return out


def _without(ranges: list[tuple[int, int]], offsets: set[int]) -> list[tuple[int, int]]:
    """`ranges` (sorted, disjoint) less `offsets`."""
    if not offsets:
        return list(ranges)
    out = []
    cut = sorted(offsets)
    j = 0
    for first, last in ranges:
        while j < len(cut) and cut[j] < first:
            j += 1
        start = first
        while j < len(cut) and cut[j] <= last:
            if cut[j] > start:
                out.append((start, cut[j] - 1))
            start = cut[j] + 1
            j += 1
        if start <= last:
            out.append((start, last))
    return out


def _ranges(acks: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Acknowledgements merged into ranges of consecutive offsets of one type."""
    out: list[list[int]] = []
    for first, last, kind in sorted(acks):
        if out and out[-1][2] == kind and out[-1][1] + 1 == first:
            out[-1][1] = last
        else:
            out.append([first, last, kind])
    return [(a, b, k) for a, b, k in out]

