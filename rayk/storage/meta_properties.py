"""meta.properties: the identity card of a broker's data directory (Kafka's MetaProperties).

Kafka writes this file when it first formats a log directory and checks it on every
start, so a directory can never be mounted under the wrong broker or joined to the
wrong cluster and silently mix two clusters' logs. The format is a Java properties file:

    #rayk meta.properties
    cluster.id=<cluster id>
    node.id=<broker id>
    version=1

`ensure` creates the file on first use (temp file, fsync, rename, like the checkpoints)
and otherwise checks it: another broker id or another cluster id raises
`InconsistentClusterIdError`, and nothing in the directory is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rayk.errors import InconsistentClusterIdError, KafkaStorageError
from rayk.storage.checkpoint import read_text_if_exists, write_atomically

FILE_NAME = "meta.properties"
VERSION = 1


@dataclass(frozen=True, slots=True)
class MetaProperties:
    cluster_id: str
    node_id: int

    def to_text(self) -> str:
        return f"#rayk meta.properties\ncluster.id={self.cluster_id}\nnode.id={self.node_id}\nversion={VERSION}\n"

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
            return cls(props["cluster.id"], int(props["node.id"]))
        except KeyError as e:
            raise KafkaStorageError(f"{source}: missing {e.args[0]}") from None
        except ValueError as e:
            raise KafkaStorageError(f"{source}: {e}") from None


def read(directory: str | Path) -> MetaProperties | None:
    """The directory's identity, or None if it has never been formatted."""
    path = Path(directory) / FILE_NAME
    text = read_text_if_exists(path)
    if text is None:
        return None
    return MetaProperties.parse(text, str(path))


def ensure(directory: str | Path, expected: MetaProperties) -> MetaProperties:
    """Formats `directory` for `expected`, or checks that it already belongs to it."""
    directory = Path(directory)
    found = read(directory)
    if found is not None:
        if found != expected:
            raise InconsistentClusterIdError(
                f"{directory} belongs to broker {found.node_id} of cluster {found.cluster_id}, "
                f"not broker {expected.node_id} of cluster {expected.cluster_id}; "
                "use another data directory or remove this one"
            )
        return found
    directory.mkdir(parents=True, exist_ok=True)
    write_atomically(directory / FILE_NAME, expected.to_text().encode("utf-8"))
    return expected
