"""MetadataCache: the client's view of where partitions lead (Kafka's client Metadata).

It asks the Controller once per topic for partition counts and leader replica handles,
and again only when told a leader moved (`invalidate`, after NOT_LEADER_OR_FOLLOWER, a
dead actor, ...). Thread-safe: the producer's sender thread and the user's thread share it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ray

from rayk.errors import LeaderNotAvailableError, UnknownTopicOrPartitionError

METADATA_RETRY_BACKOFF_MS = 100


class MetadataCache:
    def __init__(self, controller: Any) -> None:
        self._controller = controller
        self._topics: dict[str, dict[int, dict]] = {}
        self._lock = threading.Lock()

    def refresh(self, topics: list[str]) -> None:
        fresh = ray.get(self._controller.metadata.remote(list(topics)))
        with self._lock:
            for topic in topics:
                if topic in fresh:
                    self._topics[topic] = fresh[topic]["partitions"]
                else:
                    self._topics.pop(topic, None)

    def _partitions(self, topic: str) -> dict[int, dict]:
        with self._lock:
            known = self._topics.get(topic)
        if known is None:
            self.refresh([topic])
            with self._lock:
                known = self._topics.get(topic)
        if known is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist: create it first (admin.create_topic)")
        return known

    def partition_count(self, topic: str) -> int:
        return len(self._partitions(topic))

    def leader(self, topic: str, partition: int, timeout_ms: int = 30_000) -> Any:
        """The leader replica's handle, waiting (up to `timeout_ms`) through an election."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            info = self._partitions(topic).get(partition)
            if info is None:
                raise UnknownTopicOrPartitionError(f"{topic} has no partition {partition}")
            if info["leader_handle"] is not None:
                return info["leader_handle"]
            if time.monotonic() > deadline:
                raise LeaderNotAvailableError(f"{topic}-{partition} has had no leader for {timeout_ms} ms")
            time.sleep(METADATA_RETRY_BACKOFF_MS / 1000)
            self.refresh([topic])

    def invalidate(self, topic: str) -> None:
        with self._lock:
            self._topics.pop(topic, None)
