"""LogManager: partition directories and the three offset checkpoint files of a broker."""

from __future__ import annotations

import pytest

from rayk.errors import UnknownTopicOrPartitionError
from rayk.storage import LogConfig
from rayk.storage.log_manager import LogManager, partition_dir_name
from rayk.storage.records import SimpleRecord, build_batch


def batch(n: int = 2) -> bytes:
    return build_batch([SimpleRecord(b"v") for _ in range(n)])


def test_partition_directory_is_topic_dash_partition_and_topic_may_contain_dashes(tmp_path):
    manager = LogManager(tmp_path)
    manager.get_or_create("my-topic", 3)
    assert (tmp_path / "my-topic-3").is_dir()
    assert manager.partitions_on_disk() == [("my-topic", 3)]


def test_illegal_topic_names_are_rejected():
    for bad in ("", "a b", "../x", "t/1", "x" * 250):
        with pytest.raises(ValueError):
            partition_dir_name(bad, 0)


def test_clean_close_writes_all_three_checkpoints_in_kafka_format(tmp_path):
    manager = LogManager(tmp_path)
    log = manager.get_or_create("t", 0)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.high_watermark = 2
    manager.close()
    assert (tmp_path / "recovery-point-offset-checkpoint").read_text() == "0\n1\nt 0 3\n"
    assert (tmp_path / "replication-offset-checkpoint").read_text() == "0\n1\nt 0 2\n"
    assert (tmp_path / "log-start-offset-checkpoint").read_text() == "0\n1\nt 0 0\n"


def test_high_watermark_and_log_start_survive_a_restart(tmp_path):
    config = LogConfig(segment_bytes=200, retention_bytes=300, retention_ms=-1)
    manager = LogManager(tmp_path)
    log = manager.get_or_create("t", 0, config)
    for _ in range(6):
        log.append_as_leader(batch(2), leader_epoch=0)
    log.high_watermark = 10
    log.delete_expired_segments()
    start = log.log_start_offset
    assert start > 0
    manager.close()
    reopened = LogManager(tmp_path).get_or_create("t", 0, config)
    assert (reopened.high_watermark, reopened.log_start_offset, reopened.log_end_offset) == (10, start, 12)


def test_get_of_an_unopened_partition_is_unknown_topic_or_partition(tmp_path):
    with pytest.raises(UnknownTopicOrPartitionError):
        LogManager(tmp_path).get("t", 0)


def test_delete_removes_directory_and_checkpoint_entries(tmp_path):
    manager = LogManager(tmp_path)
    manager.get_or_create("t", 0).append_as_leader(batch(), leader_epoch=0)
    manager.get_or_create("u", 0)
    manager.checkpoint()
    manager.delete("t", 0)
    assert not (tmp_path / "t-0").exists()
    assert "t 0" not in (tmp_path / "recovery-point-offset-checkpoint").read_text()
    assert manager.partitions_on_disk() == [("u", 0)]
