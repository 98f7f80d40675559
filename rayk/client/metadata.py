"""MetadataCache: the client's view of where partitions lead (Kafka's client Metadata).

It asks the Controller for a topic's partitions and their leader replicas' handles once,
and again when told a leader moved (`invalidate(topic, partition)`, after
NOT_LEADER_OR_FOLLOWER, a dead actor, ...), or in the background once what it holds is
older than `metadata_max_age_ms` (Kafka's metadata.max.age.ms: how a producer learns that
a topic grew partitions). Invalidating forgets that partition's leader
only: the topic's partition count and the other partitions' leaders stay usable.

Two ways to ask, for two kinds of caller:
- blocking (`partition_count`, `leader`), for user threads: Controller calls go through
  `calls.call`, so they retry across a Controller restart (Ray restarts it; it replays
  its metadata log) and through elections (no leader yet, or a restarted Controller that
  has not heard from the brokers again), until `timeout_ms`; then KafkaTimeoutError.
- non-blocking (`leader_nowait`), for the producer's sender thread and `poll`: an unknown
  leader answers None and starts one background refresh (at most one in flight, at most
  one per `retry_backoff_ms`, each bounded by `request_timeout_ms`); when it completes the
  `on_update` callbacks run (the sender wakes up), and `pending()` gives its ref to
  `ray.wait` callers, who hand ready refs back through `collect`.

Thread-safe: the producer's sender thread and the user's thread share it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from rayk.client import calls
from rayk.errors import (
    FencedLeaderEpochError,
    KafkaError,
    KafkaStorageError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    NetworkError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_METADATA_MAX_AGE_MS = 300_000  # Kafka's metadata.max.age.ms
ABSENT_TOPIC_RECHECK_MS = 1_000  # a topic found not to exist (a consumer waits for it) is looked up this often
# Errors after which a partition's leader is looked up again (Kafka's InvalidMetadataException
# family, plus a dead or silent leader actor).
STALE_LEADER_ERRORS = (
    NotLeaderOrFollowerError,
    LeaderNotAvailableError,
    UnknownTopicOrPartitionError,
    FencedLeaderEpochError,
    UnknownLeaderEpochError,
    KafkaStorageError,
    NetworkError,
    RequestTimedOutError,
)


class MetadataCache:
    """A client's map of topics to their partitions' leader replica handles (or None, unknown),
    when each topic was stored, and the background refresh in flight. A Producer or
    Consumer keeps its own (so do the data readers); thread-safe (one lock)."""

    def __init__(
        self,
        controller: Any,
        request_timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retry_backoff_ms: int = calls.RETRY_BACKOFF_MS,
        metadata_max_age_ms: int = DEFAULT_METADATA_MAX_AGE_MS,
    ) -> None:
        self._controller = controller
        self._max_age_s = metadata_max_age_ms / 1000
        self._stored_at_s: dict[str, float] = {}  # topic -> when its partitions were last stored
        self._request_timeout_s = request_timeout_ms / 1000
        self._retry_backoff_ms = retry_backoff_ms
        self._topics: dict[str, dict[int, Any]] = {}  # topic -> partition -> leader handle or None
        self._absent: set[str] = set()  # topics the last refresh of them found not to exist
        self._lock = threading.Lock()
        self._refresh: calls.Pending | None = None  # the background refresh in flight
        self._refresh_topics: set[str] = set()
        self._wanted: set[str] = set()  # topics the next background refresh asks for
        self._next_refresh_s = 0.0
        self._listeners: list[Callable[[], None]] = []

    def on_update(self, listener: Callable[[], None]) -> None:
        """`listener()` runs (in a Ray thread) whenever a background refresh completes."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ blocking lookups

    def refresh(self, topics: list[str], timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        fresh = calls.call(
            lambda: self._controller.metadata.remote(list(topics)),
            time.monotonic() + timeout_ms / 1000,
            f"metadata of {sorted(topics)}",
            retry_backoff_ms=self._retry_backoff_ms,
        )
        self._store(topics, fresh)

    def _store(self, topics: list[str] | set[str], fresh: dict) -> None:
        now = time.monotonic()
        with self._lock:
            for topic in topics:
                if topic in fresh:
                    self._topics[topic] = {p: info["leader_handle"] for p, info in fresh[topic]["partitions"].items()}
                    self._absent.discard(topic)
                else:  # deleted, or not created yet (see request_update)
                    self._topics.pop(topic, None)
                    self._absent.add(topic)
                self._stored_at_s[topic] = now

    def _partitions(self, topic: str, timeout_ms: int) -> dict[int, Any]:
        """The topic's partitions as stored, looked up (blocking) if it is not known. What
        is older than `metadata_max_age_ms` is answered as it is and looked up again in
        the background, as `leader_nowait` does: a leader that answers without an error
        but leads no more (a replica cut off from the Controller while the others elected
        another) is then asked no longer than that."""
        now = time.monotonic()
        with self._lock:
            known = self._topics.get(topic)
            stale = known is not None and now - self._stored_at_s.get(topic, now) > self._max_age_s
        if stale:
            self.request_update([topic])
        if known is None:
            self.refresh([topic], timeout_ms)
            with self._lock:
                known = self._topics.get(topic)
        if known is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist: create it first (admin.create_topic)")
        return known

    def partition_count(self, topic: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
        return len(self._partitions(topic, timeout_ms))

    def leader(self, topic: str, partition: int, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Any:
        """The leader replica's handle, waiting (up to `timeout_ms`) through an election or a
        Controller restart."""
        deadline = time.monotonic() + timeout_ms / 1000
        looked_again = False
        while True:
            partitions = self._partitions(topic, _ms_left(deadline))
            if partition not in partitions:
                raise UnknownTopicOrPartitionError(f"{topic} has no partition {partition}")
            if partitions[partition] is not None:
                return partitions[partition]
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise KafkaTimeoutError(f"{topic}-{partition} had no leader for {timeout_ms} ms (LEADER_NOT_AVAILABLE)")
            if looked_again:
                time.sleep(min(self._retry_backoff_ms / 1000, remaining_s))
            self.refresh([topic], _ms_left(deadline))
            looked_again = True

    # ------------------------------------------------------------------ non-blocking lookups

    def cached_partition_count(self, topic: str) -> int | None:
        """The partition count if known. No lock: send() calls it per record, and a dict
        read is atomic under the GIL (refreshes replace a topic's dict whole)."""
        known = self._topics.get(topic)
        return None if known is None else len(known)

    def known_absent(self, topic: str) -> bool:
        """Whether the last lookup of `topic` found that it does not exist."""
        return topic in self._absent

    def partition_counts_nowait(self, topics: list[str]) -> dict[str, int] | None:
        """The topics' partition counts as a group's leader assigns them, without blocking:
        0 for a topic known not to exist (deleted, or not created yet: nothing to assign, as
        in Kafka's assignors; once it exists its count changes and the leader rejoins).
        None while one was never looked up (its lookup is on its way). Topics whose
        metadata is stale are looked up again in the background: that is how a group's
        leader sees a topic grow or go."""
        self.request_update_if_stale(topics)
        counts = {t: self.cached_partition_count(t) for t in topics}
        unknown = [t for t, n in counts.items() if n is None]
        if unknown:  # looked up again (a topic found absent: every ABSENT_TOPIC_RECHECK_MS, to see it come)
            self.request_update(unknown)
        counts = {t: 0 if n is None and self.known_absent(t) else n for t, n in counts.items()}
        known = {t: n for t, n in counts.items() if n is not None}
        if len(known) < len(counts):
            return None  # never looked up yet: its metadata is on its way
        return known

    def cached_leader(self, topic: str, partition: int) -> Any | None:
        """The leader's handle as last stored (None if unknown); starts nothing."""
        with self._lock:
            return self._topics.get(topic, {}).get(partition)

    def leader_nowait(self, topic: str, partition: int) -> Any | None:
        """The leader's handle if known, else None; a background refresh is started if it
        is unknown or the topic's metadata is older than `metadata_max_age_ms`."""
        now = time.monotonic()
        with self._lock:
            handle = self._topics.get(topic, {}).get(partition)
            if handle is not None and now - self._stored_at_s.get(topic, now) <= self._max_age_s:
                return handle
            self._wanted.add(topic)  # unknown, or known too long: look again in the background
            started = self._maybe_start_refresh(now)
        self._watch(started)
        return handle

    def request_update_if_stale(self, topics: list[str]) -> None:
        """Starts a background refresh of those `topics` last stored over `metadata_max_age_ms` ago."""
        now = time.monotonic()
        with self._lock:
            stale = [t for t in topics if now - self._stored_at_s.get(t, now) > self._max_age_s]
        if stale:
            self.request_update(stale)

    def request_update(self, topics: list[str]) -> None:
        """Starts a background refresh of `topics` (non-blocking). A topic found absent is
        looked up again no sooner than ABSENT_TOPIC_RECHECK_MS after."""
        now = time.monotonic()
        with self._lock:
            self._wanted.update(t for t in topics if t not in self._absent
                                or now - self._stored_at_s.get(t, 0.0) >= ABSENT_TOPIC_RECHECK_MS / 1000)
            started = self._maybe_start_refresh(now)
        self._watch(started)

    def _maybe_start_refresh(self, now: float) -> calls.Pending | None:
        """Starts a background refresh if one is wanted and allowed (lock held); returns it."""
        if self._refresh is not None and self._refresh.expired(now):
            self._refresh = None
            self._next_refresh_s = now + self._retry_backoff_ms / 1000
        if self._refresh is not None or not self._wanted or now < self._next_refresh_s:
            return None
        topics, self._wanted = self._wanted, set()
        try:
            ref = self._controller.metadata.remote(sorted(topics))
        except Exception as e:  # the handle itself failed; try again after the backoff
            logger.debug("metadata refresh: %s", calls.translate(e))
            self._wanted |= topics
            self._next_refresh_s = now + self._retry_backoff_ms / 1000
            return None
        self._refresh = calls.Pending(ref, now + self._request_timeout_s, f"metadata of {sorted(topics)}")
        self._refresh_topics = topics
        return self._refresh

    def _watch(self, pending: calls.Pending | None) -> None:
        # Outside the lock: the callback runs at once if the answer is already there.
        if pending is not None:
            pending.ref.future().add_done_callback(lambda f: self._finish_refresh(pending, f.result))

    def _finish_refresh(self, pending: calls.Pending, outcome: Callable[[], Any]) -> None:
        """Takes in a completed refresh; `outcome()` returns its result or raises."""
        with self._lock:
            if self._refresh is not pending:
                return  # expired and replaced, or already collected
            self._refresh, topics = None, self._refresh_topics
        try:
            try:
                fresh = outcome()
            except Exception as e:
                raise calls.translate(e, pending.what) from None
            self._store(topics, fresh)
        except KafkaError as e:
            logger.debug("%s failed: %s", pending.what, e)
            with self._lock:
                self._wanted |= topics
                self._next_refresh_s = time.monotonic() + self._retry_backoff_ms / 1000
        else:
            with self._lock:
                # Leaders still unknown are asked for again after the backoff (an election).
                if any(h is None for t in topics for h in self._topics.get(t, {}).values()):
                    self._next_refresh_s = time.monotonic() + self._retry_backoff_ms / 1000
        for listener in self._listeners:
            listener()

    def pending(self) -> list[Any]:
        with self._lock:
            return [self._refresh.ref] if self._refresh is not None else []

    def collect(self, ready: set[Any]) -> None:
        """Takes in a background refresh that `ray.wait` found ready."""
        with self._lock:
            pending = self._refresh
        if pending is not None and pending.ref in ready:
            self._finish_refresh(pending, pending.result)

    def wake_at_s(self) -> float | None:
        """When a caller waiting for a leader should look again: the running refresh's
        deadline, or when the next one may start (None: no leader is wanted)."""
        with self._lock:
            if self._refresh is not None:
                return self._refresh.deadline_s
            return self._next_refresh_s if self._wanted else None

    def invalidate(self, topic: str, partition: int | None = None) -> None:
        """Forgets a partition's leader (all of the topic's, if `partition` is None)."""
        with self._lock:
            known = self._topics.get(topic)
            if known is None:
                return
            for p in [partition] if partition is not None else list(known):
                if p in known:
                    known[p] = None


def _ms_left(deadline_s: float) -> int:
    return max(1, int((deadline_s - time.monotonic()) * 1000))
