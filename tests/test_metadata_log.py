"""MetadataLog: the Controller's records, durably, one batch per change (snapshots: test_metadata_snapshots)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rayk.metadata.log import TOPIC_PARTITION_DIR, MetadataLog
from rayk.metadata.records import ClusterIdRecord, MetadataRecord, PartitionRecord, TopicConfigsRecord


def change(tag: str, n: int) -> list[MetadataRecord]:
    """`n` records tagged so they can be told apart after replay."""
    return [PartitionRecord(tag, i, (1, 2), (1, 2), 1, 0, i) for i in range(n)]


def replayed(log: MetadataLog) -> list[tuple[int, MetadataRecord]]:
    """Every record of a log without snapshots, with its offset."""
    snapshot, records = log.load()
    assert snapshot is None
    return list(records)


def segment_file(directory: Path) -> Path:
    (log_file,) = sorted((directory / TOPIC_PARTITION_DIR).glob("*.log"))
    return log_file


@pytest.fixture
def mlog(tmp_path: Path):
    log = MetadataLog(tmp_path)
    yield log
    log.close()


def test_append_returns_the_offset_of_each_changes_first_record(mlog: MetadataLog):
    assert mlog.append(change("a", 2)) == 0
    assert mlog.append(change("b", 2)) == 2
    assert mlog.append(change("c", 3)) == 4
    assert mlog.append(change("d", 1)) == 7


def test_replay_of_an_empty_log_yields_nothing(mlog: MetadataLog):
    assert replayed(mlog) == []


def test_append_of_an_empty_change_is_refused(mlog: MetadataLog):
    with pytest.raises(AssertionError):
        mlog.append([])


def test_log_lives_in_the_cluster_metadata_partition_directory(tmp_path: Path, mlog: MetadataLog):
    mlog.append(change("a", 1))
    assert TOPIC_PARTITION_DIR == "__cluster_metadata-0"
    assert segment_file(tmp_path).name == "00000000000000000000.log"


def test_replay_in_the_same_session_yields_every_record_with_its_offset(mlog: MetadataLog):
    records = change("a", 2) + change("b", 3)
    mlog.append(records[:2])
    mlog.append(records[2:])
    assert replayed(mlog) == list(enumerate(records))


def test_replay_after_close_and_reopen_yields_every_record_with_its_offset_in_order(tmp_path: Path):
    log = MetadataLog(tmp_path)
    changes = [change("a", 2), change("b", 1), change("c", 4), [ClusterIdRecord("xyz")]]
    for c in changes:
        log.append(c)
    log.close()
    reopened = MetadataLog(tmp_path)
    try:
        expected = [r for c in changes for r in c]
        assert replayed(reopened) == list(enumerate(expected))
    finally:
        reopened.close()


def test_replay_crosses_read_chunks_of_a_large_log(tmp_path: Path):
    log = MetadataLog(tmp_path)
    big = "x" * 60_000
    changes = [[TopicConfigsRecord(f"t{i}", {"k": big})] for i in range(30)]
    for c in changes:
        log.append(c)
    log.close()
    reopened = MetadataLog(tmp_path)
    try:
        records = replayed(reopened)
    finally:
        reopened.close()
    assert [offset for offset, _ in records] == list(range(30))
    assert [r.name for _, r in records] == [f"t{i}" for i in range(30)]
    assert all(r.configs["k"] == big for _, r in records)


def test_a_torn_last_batch_drops_that_whole_change_and_keeps_earlier_ones(tmp_path: Path):
    log = MetadataLog(tmp_path)
    log.append(change("a", 2))
    log.append(change("b", 3))
    log.close()
    path = segment_file(tmp_path)
    size = path.stat().st_size
    os.truncate(path, size - 7)  # cut inside the last batch (change "b")

    reopened = MetadataLog(tmp_path)
    try:
        assert replayed(reopened) == list(enumerate(change("a", 2)))
    finally:
        reopened.close()


def test_a_last_batch_torn_just_after_its_header_is_dropped_whole(tmp_path: Path):
    log = MetadataLog(tmp_path)
    log.append(change("a", 2))
    first_change_bytes = segment_file(tmp_path).stat().st_size
    log.append(change("b", 3))
    log.close()
    os.truncate(segment_file(tmp_path), first_change_bytes + 61)  # the v2 header, no records

    reopened = MetadataLog(tmp_path)
    try:
        assert [offset for offset, _ in replayed(reopened)] == [0, 1]
    finally:
        reopened.close()


def test_a_corrupted_last_batch_drops_that_whole_change(tmp_path: Path):
    log = MetadataLog(tmp_path)
    log.append(change("a", 2))
    log.append(change("b", 3))
    log.close()
    path = segment_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the records of the last batch: its CRC no longer matches
    path.write_bytes(bytes(data))

    reopened = MetadataLog(tmp_path)
    try:
        assert replayed(reopened) == list(enumerate(change("a", 2)))
    finally:
        reopened.close()


def test_appends_after_a_torn_tail_continue_at_the_offset_after_the_kept_changes(tmp_path: Path):
    log = MetadataLog(tmp_path)
    log.append(change("a", 2))
    log.append(change("b", 3))
    log.close()
    path = segment_file(tmp_path)
    os.truncate(path, path.stat().st_size - 7)

    reopened = MetadataLog(tmp_path)
    assert reopened.append(change("c", 2)) == 2
    assert reopened.append(change("d", 1)) == 4
    reopened.close()

    again = MetadataLog(tmp_path)
    try:
        expected = change("a", 2) + change("c", 2) + change("d", 1)
        assert replayed(again) == list(enumerate(expected))
    finally:
        again.close()
