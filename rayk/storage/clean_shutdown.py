"""The clean-shutdown marker of a broker data directory (Kafka's `.kafka_cleanshutdown`,
KIP-966).

A broker that stops cleanly (every log flushed, closed and checkpointed) writes, as its
very last step, the file `.kafka_cleanshutdown` in its data directory, with KIP-966's
JSON content:

    {"version":0,"brokerEpoch":<broker epoch, -1 if unknown>}

At startup `consume` reads the marker and deletes it durably (unlink, then fsync of the
directory) BEFORE the broker does anything else, so that if this run crashes the next
start finds no marker. No marker means the last shutdown was unclean (or this is the
first start): the broker must recover its logs and, under KIP-966, stay out of leader
elections and the ISR until it has caught up. A marker that does not parse (not JSON,
not an object, another version, a broker epoch that is not an integer >= -1) is logged
and counts as an unclean shutdown, never as a clean one.

Crash behaviour: `write` is atomic (temp file, fsync, rename, directory fsync), so a
crash while writing leaves no marker (unclean, which is the safe answer). I/O failures
raise `KafkaStorageError`; in particular a marker that cannot be deleted is never
reported as a clean shutdown.

Not thread-safe: called once at startup and once at shutdown by the directory's owner.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from rayk.errors import KafkaStorageError
from rayk.storage.checkpoint import write_atomically

logger = logging.getLogger(__name__)

FILE_NAME = ".kafka_cleanshutdown"
VERSION = 0
NO_BROKER_EPOCH = -1


@dataclass(frozen=True, slots=True)
class CleanShutdown:
    """What the marker said: the last run shut down cleanly, in this broker epoch."""

    broker_epoch: int


def encode(broker_epoch: int) -> bytes:
    if broker_epoch < NO_BROKER_EPOCH:
        raise ValueError(f"broker epoch must be >= -1, got {broker_epoch}")
    return json.dumps({"version": VERSION, "brokerEpoch": broker_epoch}, separators=(",", ":")).encode("utf-8")


def decode(data: bytes) -> CleanShutdown:
    """The marker's content; `ValueError` saying why if it is not a version 0 marker."""
    try:
        content = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from e
    if not isinstance(content, dict):
        raise ValueError(f"not a JSON object: {content!r}")
    version, epoch = content.get("version"), content.get("brokerEpoch")
    if type(version) is not int or version != VERSION:
        raise ValueError(f"version {version!r}, expected {VERSION}")
    if type(epoch) is not int or epoch < NO_BROKER_EPOCH:
        raise ValueError(f"brokerEpoch {epoch!r} is not an integer >= -1")
    return CleanShutdown(epoch)


def write(data_dir: str | Path, broker_epoch: int = NO_BROKER_EPOCH) -> None:
    """Marks `data_dir` as cleanly shut down; call it last, after every log is closed."""
    write_atomically(Path(data_dir) / FILE_NAME, encode(broker_epoch))


def consume(data_dir: str | Path) -> CleanShutdown | None:
    """Reads and durably deletes the marker: what it said, or None for an unclean
    shutdown (no marker, or one that does not parse)."""
    data_dir = Path(data_dir)
    path = data_dir / FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise KafkaStorageError(f"cannot read the clean-shutdown marker {path}: {e}") from e
    try:
        path.unlink()
        fd = os.open(data_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise KafkaStorageError(f"cannot delete the clean-shutdown marker {path}: {e}") from e
    try:
        return decode(data)
    except ValueError as e:
        logger.warning("%s: unreadable clean-shutdown marker, treating the last shutdown as unclean: %s", path, e)
        return None
