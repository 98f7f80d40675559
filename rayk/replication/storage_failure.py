"""What a replica does when a write to its log fails (Kafka's LogDirFailureChannel, for the
one log a replica process holds).

Kafka takes a log directory that failed a write offline: its replicas stop, leave the ISR
and lose their leadership, and the broker serves the rest. A rayk replica is a process of
its own holding one log, so the same outcome is that process ending: its broker reports
the failure to the Controller, which moves the leadership and takes the replica out of the
ISR, and re-creates it from its log on disk, backing off while it keeps failing
(REPLICA_RESTARTS in the ReplicaManager), so that once the disk works again the replica
catches up and rejoins. The request that met the failure is answered KAFKA_STORAGE_ERROR,
which is retriable (the producer looks the leader up again), and so is every produce
after it, until the process ends EXIT_DELAY_S later: what the process holds in memory may
no longer match its disk.

Found by tests/faults/test_disk_faults.py: a leader whose disk filled answered every
produce UNKNOWN_SERVER_ERROR (not retriable: the records failed in the producer) and kept
its leadership for as long as the disk stayed full.
"""

from __future__ import annotations

import asyncio
import logging
import os

logger = logging.getLogger(__name__)

EXIT_DELAY_S = 0.05  # for the answers already made to leave
EXIT_CODE = 74  # sysexits' EX_IOERR


def end_process(name: str, error: OSError) -> None:
    """Ends this replica's process EXIT_DELAY_S from now, for `error` on its log's disk."""
    logger.critical("%s: a write to its log failed (%s): ending the replica's process; its broker re-creates it from "
                    "its log once the disk works", name, error)  # fmt: skip
    asyncio.get_running_loop().call_later(EXIT_DELAY_S, os._exit, EXIT_CODE)
