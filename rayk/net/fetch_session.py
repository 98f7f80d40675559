"""Fetch sessions (KIP-227): a consumer polling the same partitions over and over sends,
and is answered, only what changed.

One `FetchSessionCache` per listener (per broker, as Kafka's FetchManager) holds sessions
by id. A Fetch request's (session_id, session_epoch) says what it is:

| session_id | epoch | the request                                                         |
|------------|-------|---------------------------------------------------------------------|
| 0          | -1    | a sessionless full fetch (librdkafka, old clients): no session      |
| 0          | 0     | a full fetch asking for a session: a new id if a slot is free       |
| id         | 0     | closes session `id`, then as (0, 0)                                 |
| id         | -1    | closes session `id`, then as (0, -1)                                |
| id         | n > 0 | incremental: names only added or changed partitions, and forgotten  |

A full fetch reads and answers every partition it names, in its order. An incremental
fetch reads every partition of the session, in the session's order, and answers only
those with records, an error, or a high watermark or log start offset other than the one
the client last got; partitions that returned records move to the end of the session's
order, so that under `fetch.max.bytes` each partition gets its turn (Kafka's rotation).
A partition answered with an error forgets its high watermark, so it is answered again
once the error is gone. An incremental fetch that forgets every partition of its session
closes the session and is answered as a sessionless fetch (id 0), as in Kafka.

An incremental fetch naming an unknown session (evicted, or the listener restarted) is
answered FETCH_SESSION_ID_NOT_FOUND, one with another epoch than the session's next
INVALID_FETCH_SESSION_EPOCH, one that mixes topic names and topic ids (Fetch < v13 and
>= v13) FETCH_SESSION_TOPIC_ID_ERROR; the client then starts over with a full fetch.

At `max.incremental.fetch.session.cache.slots` sessions, a new one evicts the least
recently used session if that one has been idle `min.incremental.fetch.session.eviction.ms`;
otherwise the full fetch is answered without a session (id 0). (Kafka also weighs a
session's partition count; rayk's cache evicts by age alone.) Not thread-safe: the
listener's event loop is its only user.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rayk.errors import (
    FetchSessionIdNotFoundError,
    FetchSessionTopicIdError,
    InvalidFetchSessionEpochError,
)

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0  # a full fetch that asks for a session
FINAL_EPOCH = -1  # a full fetch without a session (or closing one)
MAX_SESSION_ID = 2**31 - 1

TopicKey = str | uuid.UUID  # a topic's name (Fetch < v13) or id (v13+)
PartitionKey = tuple[TopicKey, int]


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """One partition as a Fetch request names it."""

    topic: TopicKey
    partition: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1

    @property
    def key(self) -> PartitionKey:
        return self.topic, self.partition


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    """What a read of one partition found: what decides whether an incremental response
    carries the partition."""

    error_code: int
    high_watermark: int
    log_start_offset: int
    records_bytes: int


@dataclass(slots=True)
class _CachedPartition:
    wanted: FetchPartition
    high_watermark: int = -1  # as the client was last told; -1: tell it again
    log_start_offset: int = -1

    def must_answer(self, answer: PartitionAnswer) -> bool:
        """Kafka's CachedPartition.maybeUpdateResponseData, updating what the client knows."""
        must = answer.records_bytes > 0 or answer.error_code != 0
        if answer.high_watermark != self.high_watermark or answer.log_start_offset != self.log_start_offset:
            must = True
            self.high_watermark, self.log_start_offset = answer.high_watermark, answer.log_start_offset
        if answer.error_code != 0:
            self.high_watermark = -1
        return must


@dataclass(slots=True)
class FetchSession:
    """One KIP-227 fetch session: its partitions in rotation order, each with the HW and log
    start offset the client was last told, the epoch its next incremental fetch must
    carry, and when it was last used (monotonic s), by which the cache evicts."""

    id: int
    uses_topic_ids: bool
    partitions: OrderedDict[PartitionKey, _CachedPartition]
    epoch: int = 1  # the epoch the next incremental fetch must carry
    last_used_s: float = 0.0


@dataclass(slots=True)
class FetchContext:
    """How one Fetch request is served: `partitions` are read in this order; `answer` then
    picks what the response carries and gives the session id to answer with."""

    kind: str  # "sessionless" | "full" | "incremental"
    partitions: list[FetchPartition]
    uses_topic_ids: bool
    session: FetchSession | None = None
    expected_epoch: int = 0
    _cache: FetchSessionCache | None = field(default=None, repr=False)

    def answer(self, answers: list[PartitionAnswer]) -> tuple[int, list[int]]:
        """(session id for the response, indexes into `partitions` to answer with).

        Raises INVALID_FETCH_SESSION_EPOCH if the session moved on while this fetch was
        read (another fetch of the same session was served in between)."""
        assert len(answers) == len(self.partitions), "one answer per partition read"
        everything = list(range(len(answers)))
        if self.kind == "sessionless":
            return INVALID_SESSION_ID, everything
        if self.kind == "full":
            assert self._cache is not None
            session = self._cache.create(self.partitions, answers, self.uses_topic_ids)
            return (session.id if session else INVALID_SESSION_ID), everything
        session = self.session
        assert session is not None
        if session.epoch != self.expected_epoch:
            raise InvalidFetchSessionEpochError(
                f"fetch session {session.id} moved to epoch {session.epoch} while a fetch in epoch "
                f"{self.expected_epoch - 1} was served"
            )
        chosen = []
        for i, (wanted, answer) in enumerate(zip(self.partitions, answers)):
            cached = session.partitions.get(wanted.key)
            if cached is None:  # forgotten by a later request in the meantime
                continue
            if cached.must_answer(answer):
                chosen.append(i)
                if answer.records_bytes > 0:
                    session.partitions.move_to_end(wanted.key)
        return session.id, chosen


    def throttled(self) -> int:
        """The session id for the answer to a fetch that was throttled before anything was
        read (it answers no partition), as Kafka's getThrottledResponse: a full fetch makes
        no session; an incremental one keeps its session, whose epoch has moved on."""
        if self.kind != "incremental":
            return INVALID_SESSION_ID
        session = self.session
        assert session is not None
        if session.epoch != self.expected_epoch:
            raise InvalidFetchSessionEpochError(f"fetch session {session.id} moved on while a fetch was throttled")
        return session.id


class FetchSessionCache:
    """A listener's fetch sessions, least recently used first, bounded by `max_slots`; turns
    each Fetch's (session id, epoch) into its FetchContext. Held by the BrokerView; not
    thread-safe (the listener's event loop)."""

    def __init__(
        self,
        max_slots: int = 1000,
        min_eviction_ms: int = 120_000,
        clock_s: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        assert max_slots >= 0 and min_eviction_ms >= 0
        self.max_slots = max_slots
        self.min_eviction_ms = min_eviction_ms
        self._clock_s = clock_s
        self._rng = rng or random.Random()
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def new_context(
        self,
        session_id: int,
        epoch: int,
        wanted: list[FetchPartition],
        forgotten: Iterable[PartitionKey],
        uses_topic_ids: bool,
    ) -> FetchContext:
        """The context of one request; a session error raises its KafkaError."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self._close(session_id)
            kind = "full" if epoch == INITIAL_EPOCH else "sessionless"
            return FetchContext(kind, list(wanted), uses_topic_ids, _cache=self)
        session = self._sessions.get(session_id)
        if session is None:
            raise FetchSessionIdNotFoundError(f"no fetch session {session_id} on this broker")
        if session.epoch != epoch:
            raise InvalidFetchSessionEpochError(f"fetch session {session_id} expects epoch {session.epoch}, got {epoch}")
        if session.uses_topic_ids != uses_topic_ids:
            raise FetchSessionTopicIdError(
                f"fetch session {session_id} was created with topic {'ids' if session.uses_topic_ids else 'names'}"
            )
        for partition in wanted:  # added or changed: new position or max bytes, known state kept
            cached = session.partitions.get(partition.key)
            if cached is None:
                session.partitions[partition.key] = _CachedPartition(partition)
            else:
                cached.wanted = partition
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:  # Kafka closes a session left with no partitions
            self._close(session.id)
            return FetchContext("sessionless", [], uses_topic_ids, _cache=self)
        session.epoch = _next_epoch(session.epoch)
        self._touch(session)
        partitions = [cached.wanted for cached in session.partitions.values()]
        return FetchContext("incremental", partitions, uses_topic_ids, session, session.epoch, self)

    def create(self, wanted: list[FetchPartition], answers: list[PartitionAnswer], uses_topic_ids: bool) -> FetchSession | None:
        """A new session holding what a full fetch answered; None if every slot is taken by
        a session used within `min_eviction_ms`."""
        if len(self._sessions) >= self.max_slots:
            if not self._sessions:
                return None
            oldest = next(iter(self._sessions.values()))
            if (self._clock_s() - oldest.last_used_s) * 1000 < self.min_eviction_ms:
                return None
            self._close(oldest.id)
        partitions: OrderedDict[PartitionKey, _CachedPartition] = OrderedDict()
        for partition, answer in zip(wanted, answers):
            cached = _CachedPartition(partition)
            cached.must_answer(answer)
            partitions[partition.key] = cached
        session = FetchSession(self._new_id(), uses_topic_ids, partitions)
        self._sessions[session.id] = session
        self._touch(session)
        return session

    def _close(self, session_id: int) -> None:
        """Forgets a session; its epoch moves on, so a fetch of it still being served fails
        its epoch check instead of answering with the closed session's id."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.epoch = _next_epoch(session.epoch)

    def _touch(self, session: FetchSession) -> None:
        session.last_used_s = self._clock_s()
        self._sessions.move_to_end(session.id)

    def _new_id(self) -> int:
        while True:
            session_id = self._rng.randint(1, MAX_SESSION_ID)
            if session_id not in self._sessions:
                return session_id


def _next_epoch(epoch: int) -> int:
    """Kafka's FetchMetadata.nextEpoch: epochs run 1..2^31-1, then wrap to 1."""
    return 1 if epoch >= MAX_SESSION_ID else epoch + 1
