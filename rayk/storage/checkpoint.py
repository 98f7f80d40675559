"""Kafka's checkpoint files: small text files a broker rewrites whole and reads at startup.

This module owns the on-disk format and the atomic replacement of every checkpoint rayk
keeps: the per-log-directory offset checkpoints (`recovery-point-offset-checkpoint`,
`replication-offset-checkpoint` for high watermarks, `log-start-offset-checkpoint`) and
the per-partition `leader-epoch-checkpoint`. What the numbers mean belongs to the callers.

File format (Kafka's `CheckpointFile`, byte for byte), UTF-8, every line ending in "\\n":

    <version>            line 1, a decimal integer; 0 for all of Kafka's checkpoints
    <count>              line 2, the number of entry lines that follow
    <entry>              `count` lines, fields separated by single spaces:
                           offset checkpoints:  `topic partition offset`
                           leader epochs:       `epoch start_offset`

e.g. "0\\n2\\nt 0 5\\nt 1 7\\n". The lines of an offset checkpoint are in no meaningful
order (rayk writes them sorted so the bytes are reproducible); a leader epoch checkpoint
lists its entries in the cache's order, ascending epoch.

Crash behaviour: `write` puts the whole file in `<path>.tmp`, flushes and fsyncs it,
`os.replace`s it onto `<path>`, then fsyncs the directory so the rename itself survives
a power loss. A crash at any point therefore leaves either the old file or the new one,
never a mix. A `<path>.tmp` left behind by a crash is never read and is simply
overwritten by the next `write`. A missing file reads as no entries (a fresh broker); a
zero-byte file also reads as no entries, as in Kafka. Any other damage (wrong version,
a count that disagrees with the lines, a line that does not parse, a negative offset)
raises `KafkaStorageError` naming the file and the line, because guessing would silently
lose a recovery point or a high watermark. I/O failures are raised as
`KafkaStorageError` too, like Kafka, so the owner can take the log directory offline.

Thread-safety: not thread-safe; the owner serialises calls. Two writers of one path
would race on the shared `<path>.tmp`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from rayk.errors import KafkaStorageError

__all__ = [
    "CheckpointFile",
    "EntryFormatter",
    "EpochEntry",
    "LeaderEpochCheckpointFile",
    "OffsetCheckpointFile",
]

T = TypeVar("T")

# Python's int() also accepts "+5", " 5 ", "5_000" and non-ASCII digits; Kafka's writer
# never produces those, so anything but plain decimal digits is treated as corruption.
_INT = re.compile(r"-?[0-9]+")
_CURRENT_VERSION = 0


def read_text_if_exists(path: str | os.PathLike[str]) -> str | None:
    """The UTF-8 text of a small metadata file, None if it does not exist; other I/O
    failures raise `KafkaStorageError`."""
    try:
        return Path(path).read_text("utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise KafkaStorageError(f"cannot read {path}: {e}") from e


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Replaces the file at `path` with `data`: a crash leaves the old file or the new one.

    Writes `<path>.tmp`, fsyncs it, renames it over `path` and fsyncs the directory (the
    rename is a change to the directory; without that fsync a power loss can bring back
    the old file even though this returned). Raises `KafkaStorageError` on I/O failure,
    leaving the old file in place. Also used for meta.properties and partition.metadata.
    """
    path = Path(path)
    tmp_path = path.with_name(path.name + ".tmp")
    try:
        # "wb" truncates, which is what makes a stale tmp from an earlier crash harmless.
        with open(tmp_path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        # Best effort: the tmp is harmless (readers ignore it), this only tidies up.
        try:
            tmp_path.unlink(missing_ok=True)
        except OSError:
            pass
        raise KafkaStorageError(f"error while writing {path}: {e}") from e


def _parse_int(text: str, what: str) -> int:
    if _INT.fullmatch(text) is None:
        raise ValueError(f"{what} {text!r} is not an integer")
    return int(text)


def _parse_non_negative(text: str, what: str) -> int:
    value = _parse_int(text, what)
    if value < 0:
        raise ValueError(f"{what} {value} is negative")
    return value


def _split_fields(line: str, expected: int) -> list[str]:
    # Single spaces only: Kafka writes exactly one space between fields, so a doubled
    # space or a tab means the line was not written by a checkpoint writer.
    fields = line.split(" ")
    if len(fields) != expected:
        raise ValueError(f"expected {expected} space-separated fields, found {len(fields)}")
    return fields


class EntryFormatter(Protocol[T]):
    """Turns one entry into one line (without the newline) and back.

    `from_line` raises `ValueError` saying what is wrong; `CheckpointFile` adds the file
    path and line number and re-raises it as `KafkaStorageError`.
    """

    def to_line(self, entry: T) -> str: ...

    def from_line(self, line: str) -> T: ...


class CheckpointFile(Generic[T]):
    """The mechanism shared by all checkpoints: version line, count line, entry lines,
    replaced atomically on every write."""

    def __init__(self, path: str | os.PathLike[str], version: int, formatter: EntryFormatter[T]) -> None:
        if version < 0:
            raise ValueError(f"checkpoint version must be non-negative, got {version}")
        self._path = Path(path)
        self._version = version
        self._formatter = formatter

    @property
    def path(self) -> Path:
        return self._path

    def write(self, entries: Iterable[T]) -> None:
        """Replace the file's contents with `entries`, durably and atomically.

        Raises `ValueError` for an entry the format cannot represent (nothing is written)
        and `KafkaStorageError` if the disk fails (the old file is left in place).
        """
        # Format everything before touching the disk so a bad entry cannot leave a
        # half-written tmp file behind.
        lines = [self._formatter.to_line(entry) for entry in entries]
        for line in lines:
            if "\n" in line or "\r" in line:
                raise ValueError(f"checkpoint entry line {line!r} contains a line break")
        text = f"{self._version}\n{len(lines)}\n" + "".join(line + "\n" for line in lines)
        write_atomically(self._path, text.encode("utf-8"))

    def read(self) -> list[T]:
        """The entries in file order; `[]` if the file does not exist."""
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise KafkaStorageError(f"error while reading checkpoint file {self._path}: {e}") from e
        if not data:
            # Kafka reads an empty file as no entries; keep that for compatibility.
            return []
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._malformed(f"not valid UTF-8 ({e})") from e

        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()  # the newline that ends the last line
        if len(lines) < 2:
            raise self._malformed("missing the entry count line (line 2)")
        try:
            version = _parse_int(lines[0], "version")
        except ValueError as e:
            raise self._malformed(f"line 1: {e}") from e
        if version != self._version:
            raise self._malformed(f"line 1: unrecognised version {version}, expected {self._version}")
        try:
            expected = _parse_non_negative(lines[1], "entry count")
        except ValueError as e:
            raise self._malformed(f"line 2: {e}") from e
        entry_lines = lines[2:]
        if len(entry_lines) != expected:
            raise self._malformed(
                f"line 2: entry count is {expected} but the file has {len(entry_lines)} entry lines"
            )
        entries: list[T] = []
        for number, line in enumerate(entry_lines, start=3):
            try:
                entries.append(self._formatter.from_line(line))
            except ValueError as e:
                raise self._malformed(f"line {number} {line!r}: {e}") from e
        return entries

    def _malformed(self, what: str) -> KafkaStorageError:
        return KafkaStorageError(f"malformed checkpoint file {self._path}: {what}")


class _OffsetFormatter:
    """`topic partition offset`."""

    def to_line(self, entry: tuple[tuple[str, int], int]) -> str:
        (topic, partition), offset = entry
        _check_topic(topic)
        if partition < 0:
            raise ValueError(f"partition {partition} of topic {topic!r} is negative")
        if offset < 0:
            raise ValueError(f"offset {offset} for {topic}-{partition} is negative")
        return f"{topic} {partition} {offset}"

    def from_line(self, line: str) -> tuple[tuple[str, int], int]:
        topic, partition, offset = _split_fields(line, 3)
        _check_topic(topic)
        return (topic, _parse_non_negative(partition, "partition")), _parse_non_negative(offset, "offset")


def _check_topic(topic: str) -> None:
    # A space would shift the fields and make the file unreadable, so refuse it up
    # front; Kafka's legal topic characters ([a-zA-Z0-9._-]) never include whitespace.
    if not topic:
        raise ValueError("topic name is empty")
    if any(ch.isspace() for ch in topic):
        raise ValueError(f"topic name {topic!r} contains whitespace")


class OffsetCheckpointFile:
    """A `topic partition offset` checkpoint: one offset per partition of a log directory."""

    RECOVERY_POINT = "recovery-point-offset-checkpoint"
    HIGH_WATERMARK = "replication-offset-checkpoint"
    LOG_START_OFFSET = "log-start-offset-checkpoint"
    CLEANER_OFFSET = "cleaner-offset-checkpoint"  # the log cleaner's first dirty offset per log

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file: CheckpointFile[tuple[tuple[str, int], int]] = CheckpointFile(
            path, _CURRENT_VERSION, _OffsetFormatter()
        )

    @property
    def path(self) -> Path:
        return self._file.path

    def write(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Replace the file with `offsets` ((topic, partition) -> offset).

        `ValueError` for an empty or whitespace-containing topic or a negative partition
        or offset; `KafkaStorageError` if the disk fails.
        """
        self._file.write(sorted(offsets.items()))

    def read(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> offset; `{}` if the file does not exist."""
        result: dict[tuple[str, int], int] = {}
        for key, offset in self._file.read():
            if key in result:
                # The writer takes a mapping, so a repeat means the file was not written
                # by it; picking either value could move an offset the wrong way.
                raise KafkaStorageError(
                    f"malformed checkpoint file {self.path}: {key[0]}-{key[1]} appears more than once"
                )
            result[key] = offset
        return result


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """Leader epoch `epoch` began at log offset `start_offset`."""

    epoch: int
    start_offset: int


class _EpochFormatter:
    """`epoch start_offset`."""

    def to_line(self, entry: EpochEntry) -> str:
        if entry.epoch < 0 or entry.start_offset < 0:
            raise ValueError(f"leader epoch entry {entry} has a negative field")
        return f"{entry.epoch} {entry.start_offset}"

    def from_line(self, line: str) -> EpochEntry:
        epoch, start_offset = _split_fields(line, 2)
        return EpochEntry(_parse_non_negative(epoch, "epoch"), _parse_non_negative(start_offset, "start offset"))


class LeaderEpochCheckpointFile:
    """A partition's `leader-epoch-checkpoint`: `epoch start_offset` lines.

    Only the format is checked here; ordering is the cache's business (it re-applies the
    entries on load, as Kafka's LeaderEpochFileCache does).
    """

    FILE_NAME = "leader-epoch-checkpoint"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file: CheckpointFile[EpochEntry] = CheckpointFile(path, _CURRENT_VERSION, _EpochFormatter())

    @property
    def path(self) -> Path:
        return self._file.path

    def write(self, entries: Iterable[EpochEntry]) -> None:
        """Replace the file with `entries`, in the given order."""
        self._file.write(entries)

    def read(self) -> list[EpochEntry]:
        """The entries in file order; `[]` if the file does not exist."""
        return self._file.read()
