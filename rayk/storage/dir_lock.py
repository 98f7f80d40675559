"""DirLock: one process at a time per log directory (Kafka's `.lock` file, FileLock).

Kafka's LogManager takes an exclusive lock on `<log dir>/.lock` at startup so that two
brokers can never write one directory. rayk's unit of ownership is a partition replica,
each its own process, so the lock is per partition directory: `<topic>-<partition>/.lock`,
held with `flock(LOCK_EX)` from the moment a `Log` opens until it closes or is deleted.

A lock dies with its process, so a replica re-created after a crash finds it free. One
re-created while its predecessor is still being killed (Ray kills a dead owner's actors
asynchronously) waits up to `wait_ms` for it, then raises `KafkaStorageError`: two
processes appending to one log would interleave their writes.

The file's content is not used. Not thread-safe; one DirLock per open Log.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from rayk.errors import KafkaStorageError

FILE_NAME = ".lock"
RETRY_INTERVAL_MS = 50


class DirLock:
    """The held `flock` on one partition directory's `.lock`: constructing it takes the lock
    (waiting up to `wait_ms`, else KafkaStorageError), `release` or the process's death drops
    it. One per open Log; not thread-safe."""

    def __init__(self, directory: str | Path, wait_ms: int = 0) -> None:
        self.path = Path(directory) / FILE_NAME
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise KafkaStorageError(f"cannot open {self.path}: {e}") from e
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self._fd)
                    self._fd = -1
                    raise KafkaStorageError(
                        f"{self.path.parent} is in use by another process (waited {wait_ms} ms for its lock)"
                    ) from None
                time.sleep(RETRY_INTERVAL_MS / 1000)

    def release(self) -> None:
        """Idempotent; the lock also goes with the process."""
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1
