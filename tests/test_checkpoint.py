"""Tests for rayk.storage.checkpoint: Kafka's checkpoint file format and atomic writes."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.errors import KafkaStorageError
from rayk.storage.checkpoint import (
    CheckpointFile,
    EpochEntry,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
)


@pytest.fixture
def offset_path(tmp_path: Path) -> Path:
    return tmp_path / OffsetCheckpointFile.RECOVERY_POINT


@pytest.fixture
def epoch_path(tmp_path: Path) -> Path:
    return tmp_path / LeaderEpochCheckpointFile.FILE_NAME


# --- file names ---------------------------------------------------------------------


def test_file_name_constants_are_kafkas() -> None:
    assert OffsetCheckpointFile.RECOVERY_POINT == "recovery-point-offset-checkpoint"
    assert OffsetCheckpointFile.HIGH_WATERMARK == "replication-offset-checkpoint"
    assert OffsetCheckpointFile.LOG_START_OFFSET == "log-start-offset-checkpoint"
    assert LeaderEpochCheckpointFile.FILE_NAME == "leader-epoch-checkpoint"


# --- round trips --------------------------------------------------------------------


def test_offset_checkpoint_round_trips_empty(offset_path: Path) -> None:
    cp = OffsetCheckpointFile(offset_path)
    cp.write({})
    assert offset_path.exists()
    assert cp.read() == {}


def test_offset_checkpoint_round_trips_several_entries(offset_path: Path) -> None:
    offsets = {("orders", 0): 5, ("orders", 3): 0, ("a.b-c_d", 1): 2**62}
    OffsetCheckpointFile(offset_path).write(offsets)
    assert OffsetCheckpointFile(offset_path).read() == offsets


def test_leader_epoch_checkpoint_round_trips_empty(epoch_path: Path) -> None:
    cp = LeaderEpochCheckpointFile(epoch_path)
    cp.write([])
    assert epoch_path.exists()
    assert cp.read() == []


def test_leader_epoch_checkpoint_round_trips_several_entries_in_order(epoch_path: Path) -> None:
    entries = [EpochEntry(0, 0), EpochEntry(2, 10), EpochEntry(7, 12)]
    LeaderEpochCheckpointFile(epoch_path).write(entries)
    assert LeaderEpochCheckpointFile(epoch_path).read() == entries


def test_generic_checkpoint_file_writes_its_version_and_round_trips(tmp_path: Path) -> None:
    class WordFormatter:
        def to_line(self, entry: str) -> str:
            return entry

        def from_line(self, line: str) -> str:
            return line

    cp: CheckpointFile[str] = CheckpointFile(tmp_path / "words", 3, WordFormatter())
    cp.write(["x", "y z"])
    assert (tmp_path / "words").read_bytes() == b"3\n2\nx\ny z\n"
    assert cp.read() == ["x", "y z"]


def test_rewrite_replaces_previous_entries(offset_path: Path) -> None:
    cp = OffsetCheckpointFile(offset_path)
    cp.write({("t", 0): 1, ("t", 1): 2})
    cp.write({("u", 0): 9})
    assert cp.read() == {("u", 0): 9}


_topics = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=12)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.tuples(_topics, st.integers(0, 1000)), st.integers(0, 2**63 - 1), max_size=10))
def test_offset_checkpoint_round_trips_any_legal_offsets(offsets: dict[tuple[str, int], int]) -> None:
    with tempfile.TemporaryDirectory() as d:
        cp = OffsetCheckpointFile(Path(d) / "cp")
        cp.write(offsets)
        assert cp.read() == offsets


# --- exact bytes --------------------------------------------------------------------


def test_offset_checkpoint_bytes_match_kafkas_format(offset_path: Path) -> None:
    OffsetCheckpointFile(offset_path).write({("t", 1): 7, ("t", 0): 5})
    lines = offset_path.read_bytes().split(b"\n")
    assert lines[:2] == [b"0", b"2"]
    assert lines[-1] == b""  # every line, the last included, ends in "\n"
    assert sorted(lines[2:-1]) == [b"t 0 5", b"t 1 7"]


def test_empty_offset_checkpoint_bytes_are_version_and_zero_count(offset_path: Path) -> None:
    OffsetCheckpointFile(offset_path).write({})
    assert offset_path.read_bytes() == b"0\n0\n"


def test_leader_epoch_checkpoint_bytes_match_kafkas_format(epoch_path: Path) -> None:
    LeaderEpochCheckpointFile(epoch_path).write([EpochEntry(0, 0), EpochEntry(3, 10)])
    assert epoch_path.read_bytes() == b"0\n2\n0 0\n3 10\n"


def test_reads_a_file_written_by_kafka(offset_path: Path) -> None:
    offset_path.write_bytes(b"0\n3\nfoo 0 100\nbar 2 0\nfoo 1 42\n")
    assert OffsetCheckpointFile(offset_path).read() == {("foo", 0): 100, ("bar", 2): 0, ("foo", 1): 42}


# --- missing / empty ----------------------------------------------------------------


def test_missing_offset_checkpoint_reads_empty(offset_path: Path) -> None:
    assert OffsetCheckpointFile(offset_path).read() == {}


def test_missing_leader_epoch_checkpoint_reads_empty(epoch_path: Path) -> None:
    assert LeaderEpochCheckpointFile(epoch_path).read() == []


def test_zero_byte_file_reads_empty_like_kafka(offset_path: Path) -> None:
    offset_path.write_bytes(b"")
    assert OffsetCheckpointFile(offset_path).read() == {}


# --- malformed files ----------------------------------------------------------------

_MALFORMED_OFFSETS = {
    "wrong version": (b"1\n1\nt 0 5\n", "line 1"),
    "non-integer version": (b"zero\n1\nt 0 5\n", "line 1"),
    "missing count line": (b"0\n", "line 2"),
    "non-integer count": (b"0\ntwo\nt 0 5\nt 1 7\n", "line 2"),
    "negative count": (b"0\n-1\n", "line 2"),
    "count larger than lines": (b"0\n3\nt 0 5\nt 1 7\n", "line 2"),
    "count smaller than lines": (b"0\n1\nt 0 5\nt 1 7\n", "line 2"),
    "non-integer offset": (b"0\n2\nt 0 5\nt 1 x7\n", "line 4"),
    "non-integer partition": (b"0\n1\nt p 5\n", "line 3"),
    "too few fields": (b"0\n1\nt 5\n", "line 3"),
    "too many fields": (b"0\n1\nt 0 5 6\n", "line 3"),
    "double space": (b"0\n1\nt  0 5\n", "line 3"),
    "blank entry line": (b"0\n2\nt 0 5\n\n", "line 4"),
    "negative offset": (b"0\n1\nt 0 -5\n", "line 3"),
    "negative partition": (b"0\n1\nt -1 5\n", "line 3"),
    "plus-signed offset": (b"0\n1\nt 0 +5\n", "line 3"),
    "crlf line endings": (b"0\r\n1\r\nt 0 5\r\n", "line 1"),
    "duplicate partition": (b"0\n2\nt 0 5\nt 0 6\n", "t-0"),
    "invalid utf-8": (b"0\n1\n\xff 0 5\n", "UTF-8"),
}


@pytest.mark.parametrize("content, where", _MALFORMED_OFFSETS.values(), ids=_MALFORMED_OFFSETS.keys())
def test_malformed_offset_checkpoint_raises_storage_error_naming_path_and_line(
    offset_path: Path, content: bytes, where: str
) -> None:
    offset_path.write_bytes(content)
    with pytest.raises(KafkaStorageError) as info:
        OffsetCheckpointFile(offset_path).read()
    assert str(offset_path) in str(info.value)
    assert where in str(info.value)


_MALFORMED_EPOCHS = {
    "wrong version": (b"2\n1\n0 0\n", "line 1"),
    "count mismatch": (b"0\n2\n0 0\n", "line 2"),
    "non-integer epoch": (b"0\n1\none 0\n", "line 3"),
    "three fields": (b"0\n1\n0 0 0\n", "line 3"),
    "one field": (b"0\n2\n0 0\n5\n", "line 4"),
    "negative start offset": (b"0\n1\n0 -3\n", "line 3"),
    "negative epoch": (b"0\n1\n-1 3\n", "line 3"),
}


@pytest.mark.parametrize("content, where", _MALFORMED_EPOCHS.values(), ids=_MALFORMED_EPOCHS.keys())
def test_malformed_leader_epoch_checkpoint_raises_storage_error_naming_path_and_line(
    epoch_path: Path, content: bytes, where: str
) -> None:
    epoch_path.write_bytes(content)
    with pytest.raises(KafkaStorageError) as info:
        LeaderEpochCheckpointFile(epoch_path).read()
    assert str(epoch_path) in str(info.value)
    assert where in str(info.value)


# --- invalid entries on write -------------------------------------------------------


@pytest.mark.parametrize("topic", ["my topic", "tab\there", "new\nline", " ", ""])
def test_write_rejects_topic_that_would_break_the_format(offset_path: Path, topic: str) -> None:
    with pytest.raises(ValueError):
        OffsetCheckpointFile(offset_path).write({(topic, 0): 1})
    assert not offset_path.exists()


def test_write_rejects_negative_offset(offset_path: Path) -> None:
    with pytest.raises(ValueError):
        OffsetCheckpointFile(offset_path).write({("t", 0): -1})


def test_rejected_write_leaves_previous_file_untouched(offset_path: Path) -> None:
    cp = OffsetCheckpointFile(offset_path)
    cp.write({("t", 0): 1})
    with pytest.raises(ValueError):
        cp.write({("t", 0): 2, ("bad topic", 0): 3})
    assert cp.read() == {("t", 0): 1}


def test_write_rejects_negative_epoch_entry(epoch_path: Path) -> None:
    with pytest.raises(ValueError):
        LeaderEpochCheckpointFile(epoch_path).write([EpochEntry(-1, 0)])


# --- crash behaviour ----------------------------------------------------------------


def test_stale_tmp_is_ignored_by_read(offset_path: Path) -> None:
    cp = OffsetCheckpointFile(offset_path)
    cp.write({("t", 0): 5})
    Path(str(offset_path) + ".tmp").write_bytes(b"0\n1\nt 0 999\n")
    assert cp.read() == {("t", 0): 5}


def test_stale_tmp_without_a_file_reads_empty(offset_path: Path) -> None:
    Path(str(offset_path) + ".tmp").write_bytes(b"garbage that is longer than the new file\n" * 10)
    assert OffsetCheckpointFile(offset_path).read() == {}


def test_stale_tmp_is_overwritten_by_next_write(offset_path: Path) -> None:
    tmp = Path(str(offset_path) + ".tmp")
    tmp.write_bytes(b"garbage that is longer than the new file\n" * 10)
    OffsetCheckpointFile(offset_path).write({("t", 0): 5})
    assert offset_path.read_bytes() == b"0\n1\nt 0 5\n"
    assert not tmp.exists()


def test_failed_rename_keeps_old_content(offset_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = OffsetCheckpointFile(offset_path)
    cp.write({("t", 0): 5, ("t", 1): 7})

    def failing_replace(src: object, dst: object) -> None:
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(KafkaStorageError) as info:
        cp.write({("t", 0): 100})
    assert str(offset_path) in str(info.value)
    monkeypatch.undo()
    assert cp.read() == {("t", 0): 5, ("t", 1): 7}


def test_failed_tmp_fsync_keeps_old_content(epoch_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = LeaderEpochCheckpointFile(epoch_path)
    cp.write([EpochEntry(1, 0)])

    def failing_fsync(fd: int) -> None:
        raise OSError("simulated disk failure")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(KafkaStorageError):
        cp.write([EpochEntry(1, 0), EpochEntry(2, 9)])
    monkeypatch.undo()
    assert cp.read() == [EpochEntry(1, 0)]


def test_write_fsyncs_the_file_before_rename_and_the_directory_after(
    offset_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        events.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def spy_replace(src: str, dst: str) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    OffsetCheckpointFile(offset_path).write({("t", 0): 1})
    assert events == ["fsync-file", "replace", "fsync-dir"]


def test_unreadable_path_raises_storage_error(tmp_path: Path) -> None:
    # A directory where the file should be: reading fails with an OSError other than
    # "not found", which must surface as a storage error, not as "no checkpoint".
    (tmp_path / "cp").mkdir()
    with pytest.raises(KafkaStorageError):
        OffsetCheckpointFile(tmp_path / "cp").read()
