"""DirLock: one process at a time per partition directory."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rayk.errors import KafkaStorageError
from rayk.storage import Log
from rayk.storage.dir_lock import DirLock


def test_a_second_locked_log_on_the_same_directory_is_refused_after_waiting(tmp_path):
    first = Log(tmp_path / "t-0", lock_wait_ms=0)
    start = time.monotonic()
    with pytest.raises(KafkaStorageError, match="in use by another process"):
        Log(tmp_path / "t-0", lock_wait_ms=200)
    assert time.monotonic() - start >= 0.2
    first.close()
    Log(tmp_path / "t-0", lock_wait_ms=0).close()  # free once closed


def test_deleting_a_log_releases_its_lock(tmp_path):
    Log(tmp_path / "t-0", lock_wait_ms=0).delete()
    DirLock(tmp_path, wait_ms=0).release()


def test_the_lock_goes_with_a_process_that_dies_holding_it(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from rayk.storage.dir_lock import DirLock; DirLock({str(tmp_path)!r}); print('held', flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(KafkaStorageError):
            DirLock(tmp_path, wait_ms=0)
        holder.kill()
        holder.wait()
        DirLock(tmp_path, wait_ms=1000).release()  # a waiter gets it once the holder is gone
    finally:
        holder.kill()
