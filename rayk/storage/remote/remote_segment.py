"""RemoteSegmentMetadata: one log segment copied to remote storage, and its object names.

Where Kafka keeps remote segment metadata in its `__remote_log_metadata` topic (the default
TopicBasedRemoteLogMetadataManager), rayk keeps it next to the segment, in the store: each
copy is a set of objects under the partition's prefix

    <uri>/<topic>-<partition>-<topic id>/<base offset:020d>-<segment id>.<kind>

(`log`, `index`, `timeindex`, `txnindex`, `snapshot` — the producer snapshot at the
segment's end — and `leader-epoch-checkpoint`), and then, last, its metadata as
`<base offset:020d>-<segment id>.json`. The metadata object is the commit: a segment is
remote once it exists, and a copy cut short (a crash, a leader change, the store failing)
leaves only data objects that nothing lists. Deleting goes the other way (metadata first).

Why the store and not a topic: the store is the one thing every reader of remote data
must reach anyway, so a listing there is all a new leader, a rebuilding follower or a Ray
Data job planning its tasks needs, with no broker in the path and no second copy of the
truth to keep consistent with the first; a topic would add a replicated log, its
consumers and their catch-up to every one of them. The price is a LIST per partition
where Kafka reads a topic, paid once per leader election, retention pass and plan.

Two leaders copying the same segment during a leader change write two copies under
different segment ids; both hold the same committed batches (everything copied is below
the high watermark), so readers take either (`newest_per_offset`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field

METADATA_SUFFIX = ".json"
# The objects of one copied segment, by kind, in the order they are written.
DATA_KINDS = ("log", "index", "timeindex", "txnindex", "snapshot", "leader-epoch-checkpoint")
FORMAT_VERSION = 1


def partition_prefix(topic: str, partition: int, topic_id: str | None) -> str:
    """The partition's folder in the store, relative to the store's root."""
    return f"{topic}-{partition}-{topic_id or 'none'}"


def new_segment_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class RemoteSegmentMetadata:
    """A copied segment: offsets [base_offset, end_offset), its figures, its leader epochs
    (epoch, first offset) in order, who copied it in which leader epoch, and the sizes of
    its objects (a kind absent: no such file, e.g. no aborted transaction)."""

    topic: str
    partition: int
    topic_id: str | None
    base_offset: int
    end_offset: int  # exclusive: the next segment's base offset
    max_timestamp_ms: int
    size_bytes: int
    segment_id: str
    leader_epochs: tuple[tuple[int, int], ...]
    copied_by_broker: int
    copied_in_leader_epoch: int
    created_ms: int
    object_bytes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert 0 <= self.base_offset < self.end_offset, f"a copied segment holds offsets: {self}"

    @property
    def name(self) -> str:
        return f"{self.base_offset:020d}-{self.segment_id}"

    def object_name(self, kind: str) -> str:
        return f"{self.name}.{kind}"

    @property
    def metadata_name(self) -> str:
        return self.name + METADATA_SUFFIX

    def holds(self, offset: int) -> bool:
        return self.base_offset <= offset < self.end_offset

    def to_json(self) -> bytes:
        out = asdict(self)
        out["version"] = FORMAT_VERSION
        out["leader_epochs"] = [list(e) for e in self.leader_epochs]
        return json.dumps(out, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RemoteSegmentMetadata:
        """Raises ValueError (or KeyError/TypeError) on anything but a metadata object."""
        raw = json.loads(data)
        if raw.pop("version", None) != FORMAT_VERSION:
            raise ValueError(f"unsupported remote segment metadata version in {raw!r}")
        raw["leader_epochs"] = tuple((int(e), int(o)) for e, o in raw["leader_epochs"])
        return cls(**raw)


def newest_per_offset(segments: list[RemoteSegmentMetadata]) -> list[RemoteSegmentMetadata]:
    """One copy per stretch of offsets, oldest offsets first: where copies overlap (two
    leaders copied the same segment) the one that reaches furthest, then the newer, wins,
    and a copy wholly inside one already taken is left out."""
    chosen: list[RemoteSegmentMetadata] = []
    for s in sorted(segments, key=lambda s: (s.base_offset, -s.end_offset, -s.created_ms)):
        if chosen and s.end_offset <= chosen[-1].end_offset:
            continue
        chosen.append(s)
    return chosen
