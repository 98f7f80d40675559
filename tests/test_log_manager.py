"""LogManager: partition directories, the three offset checkpoint files and the
clean-shutdown marker of a broker."""

from __future__ import annotations

import pytest

from rayk.errors import KafkaStorageError, UnknownTopicOrPartitionError
from rayk.storage import LogConfig, clean_shutdown
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


def test_a_log_missing_from_the_recovery_checkpoint_is_recovered_from_its_first_segment(tmp_path):
    """A crash before the first checkpoint that names a log: Kafka treats the missing
    recovery point as 0, so every segment is checked, not only the last."""
    config = LogConfig(segment_bytes=200, retention_ms=-1)
    manager = LogManager(tmp_path)
    log = manager.get_or_create("t", 0, config)
    for _ in range(6):
        log.append_as_leader(batch(2), leader_epoch=0)
    assert len(log.segment_base_offsets) > 2
    log.flush()  # the bytes are on disk, but no checkpoint names the log (then a crash)
    first = tmp_path / "t-0" / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF  # the first segment's last batch is torn
    first.write_bytes(bytes(data))
    del manager, log
    reopened = LogManager(tmp_path).get_or_create("t", 0, config)
    assert reopened.log_end_offset < 4, "the torn batch and everything after it are gone"
    assert len(reopened.segment_base_offsets) == 1


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


# ---------------------------------------------------------------------- clean-shutdown marker (KIP-966)


def test_a_fresh_directory_has_no_clean_shutdown(tmp_path):
    assert LogManager(tmp_path).had_clean_shutdown is False


def test_close_writes_the_marker_and_the_next_start_consumes_it(tmp_path):
    manager = LogManager(tmp_path)
    manager.get_or_create("t", 0).append_as_leader(batch(), leader_epoch=0)
    manager.close(broker_epoch=12)
    assert (tmp_path / ".kafka_cleanshutdown").read_bytes() == b'{"version":0,"brokerEpoch":12}'
    restarted = LogManager(tmp_path)
    assert restarted.had_clean_shutdown and restarted.clean_shutdown.broker_epoch == 12
    assert not (tmp_path / ".kafka_cleanshutdown").exists(), "consumed before anything else"


def test_a_crash_after_a_clean_start_reads_as_unclean_on_the_next_start(tmp_path):
    LogManager(tmp_path).close()
    crashed = LogManager(tmp_path)  # clean start ...
    crashed.get_or_create("t", 0).append_as_leader(batch(), leader_epoch=0)
    del crashed  # ... then a crash: no close
    assert LogManager(tmp_path).had_clean_shutdown is False


def test_the_marker_is_written_last_after_every_log_is_closed_and_checkpointed(tmp_path, monkeypatch):
    manager = LogManager(tmp_path)
    log = manager.get_or_create("t", 0)
    log.append_as_leader(batch(3), leader_epoch=0)
    seen = {}

    def write(data_dir, broker_epoch):
        seen["closed"] = log._closed
        seen["recovery_points"] = (tmp_path / "recovery-point-offset-checkpoint").read_text()
        seen["snapshot"] = (tmp_path / "t-0" / "00000000000000000003.snapshot").exists()

    monkeypatch.setattr(clean_shutdown, "write", write)
    manager.close()
    assert seen == {"closed": True, "recovery_points": "0\n1\nt 0 3\n", "snapshot": True}


def test_a_failing_close_leaves_no_marker(tmp_path, monkeypatch):
    manager = LogManager(tmp_path)
    log = manager.get_or_create("t", 0)

    def broken_close():
        raise KafkaStorageError("disk gone")

    monkeypatch.setattr(log, "close", broken_close)
    with pytest.raises(KafkaStorageError):
        manager.close()
    assert not (tmp_path / ".kafka_cleanshutdown").exists()
