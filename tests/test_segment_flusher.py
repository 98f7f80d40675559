"""A rolled segment is fsynced in the background (SegmentFlusher), not on the append path:
the append returns while the disk works, the recovery point moves past the segment only
once its fsync is done and only if no truncation rewrote that history meanwhile, a failed
fsync fails the log's next append with KafkaStorageError, and close waits for the flush."""

from __future__ import annotations

import os
import threading
import time

import pytest

from rayk.errors import KafkaStorageError
from rayk.storage import Log, LogConfig, segment_flusher
from tests.test_log import batch

ONE = len(batch())


@pytest.fixture
def held_fsync(monkeypatch):
    """fsyncs of the flusher's thread wait for `release`; `synced` lists the inodes they
    synced. (os.fsync is patched for all; other threads' calls go through.)"""
    release, synced = threading.Event(), []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if threading.current_thread().name.startswith("rayk-flush"):
            assert release.wait(30)
            synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(segment_flusher.os, "fsync", fsync)
    return release, synced


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_append_that_rolls_does_not_wait_for_the_fsync(tmp_path, held_fsync):
    release, synced = held_fsync
    log = Log(tmp_path, LogConfig(segment_bytes=ONE * 2))
    for _ in range(2):
        log.append_as_leader(batch(), leader_epoch=0)
    log.append_as_leader(batch(), leader_epoch=0)  # rolls: offsets 0..5 are in the closed segment
    assert log.log_end_offset == 9 and log.recovery_point == 0, "not durable yet"
    release.set()
    wait_for(lambda: log.recovery_point == 6)
    closed = tmp_path / f"{0:020d}.log"
    assert os.stat(closed).st_ino in synced
    assert {os.stat(tmp_path / f"{0:020d}{suffix}").st_ino for suffix in (".index", ".timeindex")} <= set(synced)
    log.close()


def test_a_truncation_while_the_flush_runs_keeps_the_recovery_point(tmp_path, held_fsync):
    release, _ = held_fsync
    log = Log(tmp_path, LogConfig(segment_bytes=ONE * 2))
    for _ in range(3):
        log.append_as_leader(batch(), leader_epoch=0)
    log.truncate_to(3)  # the rolled segment's history is rewritten...
    log.append_as_leader(batch(), leader_epoch=1)  # ... and the log grows past it again
    release.set()
    log.close()  # waits for the flush
    assert log.recovery_point == 6, "close flushed everything itself"
    reopened = Log(tmp_path, LogConfig(segment_bytes=ONE * 2))
    assert reopened.log_end_offset == 6
    reopened.close()


def test_the_recovery_point_stays_when_the_flush_finds_the_log_truncated(tmp_path, held_fsync):
    release, synced = held_fsync
    log = Log(tmp_path, LogConfig(segment_bytes=ONE * 2))
    for _ in range(3):
        log.append_as_leader(batch(), leader_epoch=0)
    log.truncate_to(3)
    log.append_as_leader(batch(), leader_epoch=1)
    release.set()
    wait_for(lambda: len(synced) == 3)
    time.sleep(0.05)  # the callback runs after the last fsync
    assert log.recovery_point == 0, "offsets 3..5 were rewritten after the roll: not durable"
    log.close()


def test_a_failed_fsync_fails_the_next_append(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if threading.current_thread().name.startswith("rayk-flush"):
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(segment_flusher.os, "fsync", fsync)
    log = Log(tmp_path, LogConfig(segment_bytes=ONE * 2))
    for _ in range(3):
        log.append_as_leader(batch(), leader_epoch=0)
    wait_for(lambda: log._flusher.error is not None)
    with pytest.raises(KafkaStorageError, match="fsync of a rolled segment failed"):
        log.append_as_leader(batch(), leader_epoch=0)
    assert log.log_end_offset == 9, "nothing written after the failure"
