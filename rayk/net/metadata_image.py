"""MetadataImage: a listener's copy of what the Controller answers Metadata with (Kafka's
MetadataCache, which every broker keeps from the metadata log).

The listener takes it with a long poll (`Controller.client_metadata_image`), which the
Controller answers when a commit, a leader taking up its epoch or a broker's listeners
change it, so a client's Metadata request is answered in the listener's own process
instead of by a Ray call to the one Controller actor (one topic's Metadata: 200 µs
instead of 1,760, and no Controller CPU instead of ~700 µs; metadata_request_bench.py).

Like Kafka's brokers, the image may be a little behind the Controller: a client sent to
a leader that moved meanwhile gets NOT_LEADER_OR_FOLLOWER and asks again. What a client
could not retry past stays exact: `answer` answers only for topics the image holds with a
leader for every partition, and a topic it does not hold (just created, or about to be
auto-created) or a partition without a leader is asked of the Controller, as every
request was before. Not thread-safe: the listener's event loop.
"""

from __future__ import annotations

from typing import Any


class MetadataImage:
    """The Controller's `client_metadata` of every topic at one version, or nothing yet."""

    def __init__(self) -> None:
        self.version: tuple[str, int] | None = None
        self._described: dict[str, Any] | None = None

    def take(self, version: tuple[str, int], described: dict[str, Any]) -> bool:
        """Takes an image from the Controller unless it is older than the one held (two
        lookups can answer out of order: the long poll and a refresh after a change made
        here); whether it took it. A restarted Controller counts again under a new
        incarnation, so an image of another incarnation is always taken."""
        held = self.version
        if held is not None and held[0] == version[0] and version[1] <= held[1]:
            return False
        self.version, self._described = version, described
        return True

    def answer(self, topics: list[str]) -> dict[str, Any] | None:
        """`client_metadata(topics)` as the image has it, or None when the image cannot
        answer: nothing taken yet, a topic it does not hold, or one whose partitions are
        not all led. An empty `topics` asks for the brokers alone (DescribeCluster)."""
        described = self._described
        if described is None:
            return None
        held = described["topics"]
        for name in topics:
            topic = held.get(name)
            if topic is None or any(p["leader"] < 0 for p in topic["partitions"].values()):
                return None
        return {"cluster_id": described["cluster_id"], "brokers": described["brokers"],
                "topics": {name: held[name] for name in dict.fromkeys(topics)}}
