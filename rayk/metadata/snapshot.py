"""Metadata snapshots: the whole metadata image as of one log offset, in one file.

This module owns the snapshot file: its name, its format, writing it so that a crash
never leaves half of one, and reading it back or refusing it. Which snapshots to keep
and when to take one is the MetadataLog's business; what the records mean is
ClusterMetadata's.

Name (KRaft's): `<end offset, 20 digits>-<epoch, 10 digits>.checkpoint`, in the metadata
log's partition directory. The end offset is the first log offset the snapshot does not
contain: a Controller restores the snapshot and replays the log from there.

Format: v2 record batches (Kafka's on-disk format, each with its CRC-32C), as KRaft
writes its snapshots. The first batch holds one record, the header: a msgpack map with
`snapshot_version`, `end_offset`, `epoch`, `acl_version`, `quota_version` and
`record_count`. The batches after it hold the image's records, `pack`ed as the log
stores them (`rayk/metadata/records.py`), `RECORDS_PER_BATCH` per batch. A snapshot is
whole only if every batch passes its CRC, the file ends exactly after the last one, and
it holds `record_count` records: a file that fails any of this is refused with
CORRUPT_MESSAGE, and the MetadataLog falls back to the snapshot before it.

Writing goes through `write_atomically` (`<name>.tmp`, fsync, rename, fsync of the
directory), so the `.checkpoint` name only ever names a complete file. A `.tmp` left by a
crash is deleted when the log opens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import msgpack

from rayk.errors import CorruptRecordError, KafkaError, UnsupportedVersionError
from rayk.metadata.records import MetadataRecord, pack, unpack
from rayk.storage.checkpoint import write_atomically
from rayk.storage.records import SimpleRecord, build_batch, decode_record_tuples, iter_batches, validate_batches

SNAPSHOT_SUFFIX = ".checkpoint"
SNAPSHOT_VERSION = 1
RECORDS_PER_BATCH = 4096
_NAME = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")


@dataclass(frozen=True, slots=True)
class MetadataSnapshot:
    """The metadata image as of `end_offset` (every record below it applied)."""

    end_offset: int
    epoch: int
    acl_version: int  # offset of the last ACL change, -1 if none
    quota_version: int  # offset of the last client quota change, -1 if none
    records: tuple[MetadataRecord, ...]

    def __post_init__(self) -> None:
        assert self.end_offset >= 0 and self.epoch >= 0, f"a snapshot's offset and epoch are >= 0: {self.end_offset}, {self.epoch}"
        assert max(self.acl_version, self.quota_version) < self.end_offset, "its versions are offsets it contains"


def file_name(end_offset: int, epoch: int) -> str:
    return f"{end_offset:020d}-{epoch:010d}{SNAPSHOT_SUFFIX}"


def snapshot_paths(directory: Path) -> list[tuple[int, Path]]:
    """The snapshot files of `directory` as (end offset, path), oldest first."""
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match is not None:
            found.append((int(match.group(1)), path))
    return sorted(found)


def delete_leftovers(directory: Path) -> None:
    """Removes `.checkpoint.tmp` files: snapshots a crash cut short, never renamed."""
    for path in directory.glob(f"*{SNAPSHOT_SUFFIX}.tmp"):
        path.unlink(missing_ok=True)


def to_bytes(snapshot: MetadataSnapshot) -> bytes:
    header = {
        "snapshot_version": SNAPSHOT_VERSION,
        "end_offset": snapshot.end_offset,
        "epoch": snapshot.epoch,
        "acl_version": snapshot.acl_version,
        "quota_version": snapshot.quota_version,
        "record_count": len(snapshot.records),
    }
    out = bytearray(build_batch([SimpleRecord(msgpack.packb(header))]))
    records = snapshot.records
    for start in range(0, len(records), RECORDS_PER_BATCH):
        chunk = records[start : start + RECORDS_PER_BATCH]
        out += build_batch([SimpleRecord(pack(r)) for r in chunk], base_offset=1 + start)
    return bytes(out)


def from_bytes(data: bytes, name: str = "snapshot") -> MetadataSnapshot:
    """The snapshot `data` holds; CORRUPT_MESSAGE if it is not whole, UNSUPPORTED_VERSION if
    a newer rayk wrote it (a newer snapshot version, or a record of a newer version or of a
    kind this rayk does not know): a downgrade must not rename a good snapshot as corrupt."""
    try:
        validate_batches(data, None, leader_checks=False)
        values = [r[3] for batch in iter_batches(data) for r in decode_record_tuples(batch.data)[1]]
        header = msgpack.unpackb(values[0]) if values else None
        newer = isinstance(header, dict) and type(header.get("snapshot_version")) is int
        if newer and header["snapshot_version"] > SNAPSHOT_VERSION:  # not damage: kept as it is, for that rayk
            raise UnsupportedVersionError(
                f"{name} is snapshot version {header['snapshot_version']}; this rayk reads {SNAPSHOT_VERSION}: upgrade rayk"
            )
        if not isinstance(header, dict) or header.get("snapshot_version") != SNAPSHOT_VERSION:
            raise CorruptRecordError(f"no snapshot header of version {SNAPSHOT_VERSION}")
        body = values[1:]
        if header.get("record_count") != len(body):
            raise CorruptRecordError(f"holds {len(body)} records, its header says {header.get('record_count')}")
        records = tuple(unpack(v) for v in body)
        return MetadataSnapshot(
            header["end_offset"], header["epoch"], header["acl_version"], header["quota_version"], records
        )
    except UnsupportedVersionError:
        raise  # written by a newer rayk: not damage, and no reason to fall back
    except KafkaError as e:
        raise CorruptRecordError(f"{name}: {e}") from e
    except (ValueError, KeyError, TypeError, AssertionError) as e:  # msgpack's errors, a header without a field
        raise CorruptRecordError(f"{name}: its header does not parse: {e!r}") from e


def write(directory: Path, snapshot: MetadataSnapshot) -> Path:
    """Writes `snapshot` durably under its name; returns the path."""
    path = directory / file_name(snapshot.end_offset, snapshot.epoch)
    write_atomically(path, to_bytes(snapshot))
    return path


def read(path: Path) -> MetadataSnapshot:
    snapshot = from_bytes(path.read_bytes(), path.name)
    match = _NAME.match(path.name)
    if match is None or int(match.group(1)) != snapshot.end_offset:
        raise CorruptRecordError(f"{path.name} holds the snapshot at end offset {snapshot.end_offset}")
    return snapshot
