"""Crash recovery brings the leader epoch cache forward from the batches it re-reads
(Kafka's LogSegment.recover), so a lost or stale leader-epoch-checkpoint is repaired."""

from __future__ import annotations

from pathlib import Path

from rayk.storage import Log, LogConfig
from rayk.storage.checkpoint import EpochEntry, LeaderEpochCheckpointFile
from rayk.storage.records import SimpleRecord, build_batch

E = EpochEntry
ONE_BATCH = build_batch([SimpleRecord(b"v" * 20, timestamp_ms=1_000)] * 2)  # 2 records


def append_in_epochs(log: Log, epochs: list[int]) -> None:
    for epoch in epochs:
        log.append_as_leader(ONE_BATCH, leader_epoch=epoch)


def checkpoint_of(path: Path) -> LeaderEpochCheckpointFile:
    return LeaderEpochCheckpointFile(path / LeaderEpochCheckpointFile.FILE_NAME)


def test_a_deleted_checkpoint_is_rebuilt_from_the_batches_after_a_crash(tmp_path):
    log = Log(tmp_path)
    append_in_epochs(log, [0, 0, 1, 1, 3])
    assert log.leader_epoch_cache.entries == [E(0, 0), E(1, 4), E(3, 8)]
    checkpoint_of(tmp_path).path.unlink()
    del log  # crash: no close
    reopened = Log(tmp_path)
    assert reopened.leader_epoch_cache.entries == [E(0, 0), E(1, 4), E(3, 8)]
    assert checkpoint_of(tmp_path).read() == [E(0, 0), E(1, 4), E(3, 8)], "and written back"
    assert reopened.end_offset_for_epoch(1) == (1, 8)


def test_a_checkpoint_missing_its_newest_epochs_is_brought_forward(tmp_path):
    log = Log(tmp_path)
    append_in_epochs(log, [0, 2, 2, 5])
    del log
    checkpoint_of(tmp_path).write([E(0, 0)])  # a crash mid-write left the previous file
    assert Log(tmp_path).leader_epoch_cache.entries == [E(0, 0), E(2, 2), E(5, 6)]


def test_stale_entries_inside_the_rescanned_range_are_corrected_from_the_batches(tmp_path):
    log = Log(tmp_path)
    append_in_epochs(log, [0, 0, 1, 3])
    del log
    checkpoint_of(tmp_path).write([E(0, 0), E(1, 2), E(7, 7)])  # wrong start, unknown epoch
    assert Log(tmp_path).leader_epoch_cache.entries == [E(0, 0), E(1, 4), E(3, 6)]


def test_a_torn_tail_still_cuts_the_epochs_it_held(tmp_path):
    log = Log(tmp_path)
    append_in_epochs(log, [0, 0, 2])
    checkpoint_of(tmp_path).path.unlink()
    del log
    segment = tmp_path / "00000000000000000000.log"
    with open(segment, "r+b") as f:
        f.truncate(segment.stat().st_size - 3)  # the epoch 2 batch is torn
    reopened = Log(tmp_path)
    assert reopened.log_end_offset == 4
    assert reopened.leader_epoch_cache.entries == [E(0, 0)]
    assert checkpoint_of(tmp_path).read() == [E(0, 0)]


def test_every_segment_from_the_recovery_point_contributes_its_epochs(tmp_path):
    config = LogConfig(segment_bytes=len(ONE_BATCH) * 2)
    log = Log(tmp_path, config)
    append_in_epochs(log, [0, 0, 1, 1, 2, 2, 4])
    assert len(log.segment_base_offsets) == 4
    checkpoint_of(tmp_path).path.unlink()
    del log
    reopened = Log(tmp_path, config, recovery_point=0)
    assert reopened.leader_epoch_cache.entries == [E(0, 0), E(1, 4), E(2, 8), E(4, 12)]


def test_an_index_rebuild_of_an_old_segment_does_not_disturb_later_epochs(tmp_path):
    config = LogConfig(segment_bytes=len(ONE_BATCH) * 2)
    log = Log(tmp_path, config)
    append_in_epochs(log, [0, 0, 1, 1, 2, 2, 4])
    log.close()
    (tmp_path / "00000000000000000000.index").unlink()  # segment 0 is re-read for its index
    assert Log(tmp_path, config).leader_epoch_cache.entries == [E(0, 0), E(1, 4), E(2, 8), E(4, 12)]


def test_a_clean_reopen_does_not_rewrite_the_checkpoint(tmp_path):
    log = Log(tmp_path)
    append_in_epochs(log, [0, 1, 1, 2])
    log.close()
    before = checkpoint_of(tmp_path).path.stat().st_ino
    Log(tmp_path).close()
    assert checkpoint_of(tmp_path).path.stat().st_ino == before
