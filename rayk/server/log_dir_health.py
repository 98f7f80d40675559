"""LogDirHealth: whether a broker's data directory works, Kafka's offline log directory
(KIP-112's LogDirFailureChannel) for rayk's one directory per broker.

A replica whose disk fails a write, a read or an fsync ends its own process
(rayk/replication/storage_failure.py); a failing device also kills replicas outright
(an mmap'd index page that cannot be read is a SIGBUS). Either way its broker sees a
replica die, and asks this object whether the directory itself works: `check` probes it
by writing PROBE_BYTES to a file of its own, fsyncing them, reading them back through a
new descriptor and deleting the file. A probe that fails takes the directory offline:
the broker stops every replica in it (they leave the ISRs and lose their leaderships,
as in Kafka), creates none there while it is offline, and reports it with
KAFKA_STORAGE_ERROR in DescribeLogDirs. The broker probes again every
`probe_interval_s` (`wait_online`); once a probe passes the directory is online, and
the broker has the Controller push its partitions, which re-creates their replicas
from their logs (recovery re-reads everything past the last successful fsync) and
they catch up and rejoin the ISRs.

Only an error of the disk makes a directory offline, never slowness: a probe that
takes long on a busy disk just takes long (a hung disk is not detected, as in Kafka).
A probe runs in a thread; one runs at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

logger = logging.getLogger(__name__)

PROBE_FILE = ".rayk-log-dir.probe"
PROBE_BYTES = 4096


def probe(directory: Path) -> OSError | None:
    """Writes, fsyncs, reads back and deletes a probe file in `directory`; the error that
    stopped it, or None if the directory works."""
    path = directory / PROBE_FILE
    payload = os.urandom(PROBE_BYTES)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, payload, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        try:
            read = os.pread(fd, PROBE_BYTES, 0)
        finally:
            os.close(fd)
        os.unlink(path)
    except OSError as e:
        return e
    if read != payload:
        return OSError(f"{path}: read back {len(read)} bytes that differ from the {PROBE_BYTES} written")
    return None


class LogDirHealth:
    """One broker directory's state: online, or offline since `offline_since_s` for `error`."""

    def __init__(self, directory: Path, probe_interval_s: float) -> None:
        self.directory = directory
        self.probe_interval_s = probe_interval_s
        self.error: str | None = None  # why it is offline; None while online
        self.offline_since_s: float | None = None  # time.monotonic() it went offline
        self._probing: asyncio.Lock | None = None
        self._waiting = False  # a wait_online loop runs

    @property
    def offline(self) -> bool:
        return self.error is not None

    async def check(self) -> bool:
        """Probes the directory (one probe at a time); whether it works. Updates the state."""
        if self._probing is None:
            self._probing = asyncio.Lock()
        async with self._probing:
            error = await asyncio.to_thread(probe, self.directory)
        if error is None:
            if self.offline:
                logger.warning("log directory %s is online again after %.1f s offline", self.directory,
                               time.monotonic() - (self.offline_since_s or 0.0))  # fmt: skip
            self.error, self.offline_since_s = None, None
            return True
        if not self.offline:
            logger.error("log directory %s is offline: %s", self.directory, error)
            self.offline_since_s = time.monotonic()
        self.error = str(error)
        return False

    async def wait_online(self, then: Callable[[], Awaitable[None]]) -> None:
        """Probes every `probe_interval_s` until the directory works, then calls `then`.
        One loop at a time: a second call while one waits returns at once."""
        if self._waiting:
            return
        self._waiting = True
        try:
            while not await self.check():
                await asyncio.sleep(self.probe_interval_s)
        finally:
            self._waiting = False
        await then()

    def usage_bytes(self) -> tuple[int, int]:
        """(total, usable) bytes of the directory's volume, (-1, -1) if unknown."""
        try:
            stat = os.statvfs(self.directory)
        except OSError:
            return -1, -1
        return stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize
