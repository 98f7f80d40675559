"""What a replica does when its log's disk fails a write, a read or an fsync (Kafka's
LogDirFailureChannel, for the one log a replica process holds).

Kafka takes a log directory that failed a write offline: its replicas stop, leave the ISR
and lose their leadership, and the broker serves the rest. A rayk replica is a process of
its own holding one log, so the same outcome is that process ending: its broker reports
the failure to the Controller, which moves the leadership and takes the replica out of the
ISR, and re-creates it from its log on disk, backing off while it keeps failing
(REPLICA_RESTARTS in the ReplicaManager), so that once the disk works again the replica
catches up and rejoins. The request that met the failure is answered KAFKA_STORAGE_ERROR,
which is retriable (the producer looks the leader up again), and so is every produce
after it, until the process ends EXIT_DELAY_S later: what the process holds in memory may
no longer match its disk. Its broker probes the directory when the process ends, and
takes it offline if the probe fails too (rayk/server/log_dir_health.py).

An fsync that fails is never retried (PostgreSQL's lesson: after a failed fsync the
kernel may have dropped the dirty pages and marked them clean, so a second fsync
"succeeds" over lost data): the process ends, and the replica's next life recovers its
log from what the disk really holds (log recovery re-reads every segment past the
recovery point, which only a successful fsync moves) and fetches the rest from the leader.

Found by tests/faults/test_disk_faults.py: a leader whose disk filled answered every
produce UNKNOWN_SERVER_ERROR (not retriable: the records failed in the producer) and kept
its leadership for as long as the disk stayed full.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)

EXIT_DELAY_S = 0.05  # for the answers already made to leave
EXIT_CODE = 74  # sysexits' EX_IOERR


def end_process(name: str, error: BaseException) -> None:
    """Ends this replica's process EXIT_DELAY_S from now, for `error` on its log's disk.
    Callable from any thread (the background fsync's too)."""
    logger.critical("%s: its log's disk failed (%s): ending the replica's process; its broker re-creates it from "
                    "its log once the disk works", name, error)  # fmt: skip
    timer = threading.Timer(EXIT_DELAY_S, os._exit, (EXIT_CODE,))
    timer.daemon = True
    timer.start()
