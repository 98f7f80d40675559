"""meta.properties: the identity card of a broker's data directory (Kafka's MetaProperties).

Kafka writes this file when it first formats a log directory and checks it on every
start, so a directory can never be mounted under the wrong broker or joined to the
wrong cluster and silently mix two clusters' logs. The format is a Java properties file:

    #rayk meta.properties
    cluster.id=<cluster id>
    directory.id=<directory id>
    node.id=<broker id>
    version=1

`directory.id` (Kafka's KIP-858) names this directory itself: a random UUID in Kafka's
form, URL-safe base64 without padding (22 characters), generated when the directory is
formatted and never changed. A broker reports it when it registers, so the Controller
can tell a broker whose disk was replaced (a new, empty directory with a new id) from
one that kept its data, and keep the empty one out of leader elections. Kafka reserves
the ids whose first 64 bits are 0 and last 64 bits below 100 (UNASSIGNED, LOST,
MIGRATING, ...); a file naming one is rejected.

`ensure` formats a directory on first use and otherwise checks it: another broker id or
another cluster id raises `InconsistentClusterIdError` and nothing in the directory is
touched (directory.id is not compared: it is the directory's, not the broker's). A file
written by an older rayk, without directory.id, gets one and is rewritten. Every write
is atomic (temp file, fsync, rename, directory fsync, like the checkpoints). A file that
does not parse raises `KafkaStorageError`.

Not thread-safe: one broker owns a directory and calls `ensure` once at startup.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from rayk.errors import InconsistentClusterIdError, KafkaStorageError
from rayk.storage.checkpoint import read_text_if_exists, write_atomically

FILE_NAME = "meta.properties"
VERSION = 1
DIRECTORY_ID_CHARS = 22  # 16 bytes in URL-safe base64, unpadded
RESERVED_DIRECTORY_IDS = 100  # Kafka's DirectoryId: Uuid(0, 0..99) are reserved

_DIRECTORY_ID = re.compile(r"[A-Za-z0-9_-]{22}")


def _encode_uuid(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _is_reserved(raw: bytes) -> bool:
    return int.from_bytes(raw[:8], "big") == 0 and int.from_bytes(raw[8:], "big") < RESERVED_DIRECTORY_IDS


def new_directory_id() -> str:
    """A fresh random directory id, as Kafka's DirectoryId.random() makes them."""
    while True:
        raw = uuid.uuid4().bytes
        text = _encode_uuid(raw)
        # Kafka's Uuid.randomUuid() never starts with '-' (it would read as a command-line flag).
        if not _is_reserved(raw) and not text.startswith("-"):
            return text


def check_directory_id(text: str) -> str:
    """`text` if it is a valid, unreserved directory id; `ValueError` otherwise."""
    if not _DIRECTORY_ID.fullmatch(text):
        raise ValueError(f"directory.id {text!r} is not {DIRECTORY_ID_CHARS} URL-safe base64 characters")
    raw = base64.urlsafe_b64decode(text + "==")
    if _encode_uuid(raw) != text:
        raise ValueError(f"directory.id {text!r} is not a canonical base64 UUID")
    if _is_reserved(raw):
        raise ValueError(f"directory.id {text!r} is reserved")
    return text


@dataclass(frozen=True, slots=True)
class MetaProperties:
    """The identity a data directory's meta.properties records: the cluster and broker it
    belongs to, and its own directory id. `parse` and `to_text` are the file's format."""

    cluster_id: str
    node_id: int
    directory_id: str | None = None  # None: not known yet (an `expected` value, or a pre-KIP-858 file)

    def to_text(self) -> str:
        directory = "" if self.directory_id is None else f"directory.id={self.directory_id}\n"
        return f"#rayk meta.properties\ncluster.id={self.cluster_id}\n{directory}node.id={self.node_id}\nversion={VERSION}\n"

    @classmethod
    def parse(cls, text: str, source: str = FILE_NAME) -> MetaProperties:
        props = {}
        for line in text.splitlines():
            line = line.strip()
            if not line or line[0] in "#!":
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise KafkaStorageError(f"{source}: line {line!r} is not key=value")
            props[key.strip()] = value.strip()
        try:
            if int(props["version"]) != VERSION:
                raise KafkaStorageError(f"{source}: version {props['version']} is not supported (want {VERSION})")
            directory_id = props.get("directory.id")
            if directory_id is not None:
                check_directory_id(directory_id)
            return cls(props["cluster.id"], int(props["node.id"]), directory_id)
        except KeyError as e:
            raise KafkaStorageError(f"{source}: missing {e.args[0]}") from None
        except ValueError as e:
            raise KafkaStorageError(f"{source}: {e}") from None


@dataclass(frozen=True, slots=True)
class EnsureResult:
    """What `ensure` found or made: the directory's identity as on disk now, and whether the
    directory was formatted by this call (a new or replaced disk)."""

    meta: MetaProperties  # as on disk now, directory_id included
    formatted: bool  # True: the directory had no meta.properties and was formatted just now


def read(directory: str | Path) -> MetaProperties | None:
    """The directory's identity, or None if it has never been formatted."""
    path = Path(directory) / FILE_NAME
    text = read_text_if_exists(path)
    if text is None:
        return None
    return MetaProperties.parse(text, str(path))


def ensure(directory: str | Path, expected: MetaProperties) -> EnsureResult:
    """Formats `directory` for `expected` (with `expected.directory_id`, or a new random
    one), or checks that it already belongs to the same broker of the same cluster."""
    directory = Path(directory)
    found = read(directory)
    if found is not None:
        if (found.cluster_id, found.node_id) != (expected.cluster_id, expected.node_id):
            raise InconsistentClusterIdError(
                f"{directory} belongs to broker {found.node_id} of cluster {found.cluster_id}, "
                f"not broker {expected.node_id} of cluster {expected.cluster_id}; "
                "use another data directory or remove this one"
            )
        if found.directory_id is None:  # written before directory ids: give it one now
            found = dataclasses.replace(found, directory_id=_directory_id_for(expected))
            write_atomically(directory / FILE_NAME, found.to_text().encode("utf-8"))
        return EnsureResult(found, formatted=False)
    directory.mkdir(parents=True, exist_ok=True)
    meta = dataclasses.replace(expected, directory_id=_directory_id_for(expected))
    write_atomically(directory / FILE_NAME, meta.to_text().encode("utf-8"))
    return EnsureResult(meta, formatted=True)


def _directory_id_for(expected: MetaProperties) -> str:
    """The caller's id (`ValueError` if it is not a valid one) or a new random one."""
    return new_directory_id() if expected.directory_id is None else check_directory_id(expected.directory_id)
