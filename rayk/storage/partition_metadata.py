"""partition.metadata: which topic (by id) a partition directory belongs to (Kafka's file).

A topic deleted while a broker was down and then created again under the same name
must not inherit the old directory's records. Kafka guards this with a topic id written
next to the segments; rayk writes the same file:

    version: 0
    topic_id: <topic id>

`read` returns the id or None (no file: a directory from before ids, or a fresh one).
"""

from __future__ import annotations

from pathlib import Path

from rayk.errors import KafkaStorageError
from rayk.storage.checkpoint import read_text_if_exists, write_atomically

FILE_NAME = "partition.metadata"


def read(partition_dir: str | Path) -> str | None:
    path = Path(partition_dir) / FILE_NAME
    text = read_text_if_exists(path)
    if text is None:
        return None
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    if fields.get("version") != "0" or not fields.get("topic_id", "").strip():
        raise KafkaStorageError(f"{path} is not a version 0 partition.metadata file: {text!r}")
    return fields["topic_id"].strip()


def write(partition_dir: str | Path, topic_id: str) -> None:
    partition_dir = Path(partition_dir)
    partition_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(partition_dir / FILE_NAME, f"version: 0\ntopic_id: {topic_id}\n".encode())
