"""Reading a tiered topic's history straight from remote storage, with no broker in the
path: the remote part of a batch read's offset ranges as `RemoteSlice`s, one remote
segment each, that a task reads with one GET of the segment's .log object and decodes to
Arrow where it runs.

Planning (`RemotePlanner`, in the driver): the topic's configs and the brokers' store
settings come from the Controller; the store's listing of each partition (its metadata
objects, see rayk/storage/remote/remote_segment.py) says which segments are remote; the
part of a range below the remote end becomes slices, the rest stays a range the leaders
serve. A read_committed range asks its leader once for the aborted transactions over the
remote part (metadata, no records: KIP-405's remote transaction index and the local one
behind it), and each slice drops the batches of those over it, as a read_committed fetch
of its offsets would.

A slice whose segment retention deleted after planning fails its task with a retriable
KAFKA_STORAGE_ERROR, as an unreadable store does; the records are gone from the leader too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayk.client.offset_ranges import OffsetRange
from rayk.config import log_config_of
from rayk.storage.read_committed import committed_batches
from rayk.storage.remote import RemoteSegmentMetadata, RemoteStorageSettings
from rayk.storage.remote.remote_segment import partition_prefix

NO_LEADER = -1  # a slice needs none: its task runs wherever Ray puts it


@dataclass(frozen=True)
class RemoteSlice:
    """Offsets [start, end) of one partition, all in one remote segment; `aborted` (producer
    id, first offset) of the aborted transactions over them, for a read_committed read."""

    settings: RemoteStorageSettings
    prefix: str
    segment: RemoteSegmentMetadata
    topic: str
    partition: int
    start: int
    end: int
    read_committed: bool = False
    aborted: tuple[tuple[int, int], ...] = ()
    leader: int = NO_LEADER

    @property
    def size(self) -> int:
        return self.end - self.start

    def read(self) -> bytes:
        """The batches of the slice's segment that hold its offsets (one GET of the .log
        object, the part of it from the slice's start), aborted ones left out."""
        from rayk.storage.remote.remote_read import index_position

        storage = self.settings.open()
        position = 0
        if self.start > self.segment.base_offset:
            position = index_position(storage.read(self.prefix, self.segment, "index"), self.segment.base_offset, self.start)
        data = storage.read(self.prefix, self.segment, "log", position)
        if self.read_committed and self.aborted:
            data = b"".join(batch.data for batch in committed_batches(data, self.aborted))
        return data


class RemotePlanner:
    """Cuts a tiered topic's ranges into remote slices and leader ranges (see the module
    docstring), listing each partition's remote segments once."""

    def __init__(self, cluster: Any, topic: str, settings: RemoteStorageSettings) -> None:
        self._cluster, self._topic, self._settings = cluster, topic, settings
        self._topic_ids = {p.partition: p.topic_id for p in cluster.describe_topic(topic)}
        self._storage = settings.open()
        self._listings: dict[int, list[RemoteSegmentMetadata]] = {}
        self._log_starts: dict[int, int] = {}  # a DeleteRecords' offset the store records

    @classmethod
    def for_topic(cls, cluster: Any, topic: str) -> RemotePlanner | None:
        """A planner if `topic` is tiered on brokers with remote storage, else None."""
        api = cluster.api_calls
        topic_configs = api(lambda: cluster.controller.topic_configs.remote(topic), f"DescribeConfigs {topic!r}")
        broker_config = api(lambda: cluster.controller.broker_config.remote(), "the brokers' configuration")
        settings = broker_config.remote_storage()
        if settings is None or not log_config_of(topic_configs).remote_storage_enable:
            return None
        return cls(cluster, topic, settings)

    def _segments(self, partition: int) -> list[RemoteSegmentMetadata]:
        if partition not in self._listings:
            self._listings[partition] = self._storage.list_segments(self._prefix(partition))
            self._log_starts[partition] = self._storage.read_log_start(self._prefix(partition))
        return self._listings[partition]

    def _prefix(self, partition: int) -> str:
        return partition_prefix(self._topic, partition, self._topic_ids[partition])

    def split(self, r: OffsetRange) -> list[OffsetRange | RemoteSlice]:
        """`r`'s remote part as slices, one per remote segment, then the rest as a range."""
        segments = self._segments(r.partition)
        start = max(r.start, min(self._log_starts[r.partition], r.end))  # nothing below a DeleteRecords
        out: list[OffsetRange | RemoteSlice] = []
        spans: list[tuple[int, int, int]] = []
        remote_end = min(r.end, max((s.end_offset for s in segments), default=r.start))
        if r.read_committed and remote_end > start:
            leader = self._cluster.leader(self._topic, r.partition)
            spans = self._cluster.api_calls(
                lambda: leader.aborted_transactions.remote(start, remote_end),
                f"aborted transactions of {self._topic}-{r.partition}",
            )
        for segment in segments:
            if start >= r.end or segment.base_offset > start:
                break  # a gap (retention at work): the leaders say what is there
            if segment.end_offset <= start:
                continue
            end = min(segment.end_offset, r.end)
            # Only the transactions over this slice: one whose marker came before it would
            # otherwise mark its producer's later, committed batches aborted.
            aborted = tuple((pid, first) for pid, first, last in spans if last >= start and first < end)
            out.append(RemoteSlice(self._settings, self._prefix(r.partition), segment, self._topic, r.partition, start,
                                   end, r.read_committed, aborted))  # fmt: skip
            start = end
        if start < r.end:
            out.append(OffsetRange(r.topic, r.partition, start, r.end, r.leader, r.read_committed))
        return out

    def split_tasks(self, tasks: list[list[OffsetRange]]) -> list[list[OffsetRange | RemoteSlice]]:
        """Each task's ranges cut: every remote slice a task of its own, what the leaders
        serve kept together as the task it was."""
        out: list[list[OffsetRange | RemoteSlice]] = []
        for ranges in tasks:
            local: list[OffsetRange | RemoteSlice] = []
            for r in ranges:
                for piece in self.split(r):
                    if isinstance(piece, RemoteSlice):
                        out.append([piece])
                    else:
                        local.append(piece)
            if local or not ranges:
                out.append(local)
        return out
