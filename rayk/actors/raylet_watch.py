"""Ends a rayk actor's process once its node's raylet is gone.

Ray declares a node dead when its GCS cannot reach it for long enough (a network
partition), and the node's raylet exits when it reaches the GCS again. Its worker
processes do not: on Ray 2.60 a broker's processes ran on for as long as they were
watched (40 s) after their raylet had exited, still calling the Controller directly, so
the broker registered again and again and fenced its new incarnation on the node's new
raylet, while its replicas kept the partition directories locked
(tests/faults/test_network_faults.py, `node_declared_dead`). A process whose raylet is
gone is one Ray has given up on (its actors are DEAD in Ray's tables), so it must go too.

The raylet starts the workers and tells them its pid (RAY_RAYLET_PID). `start` begins a
daemon thread that checks every CHECK_INTERVAL_S that the process's parent is still that
raylet (a process whose parent exits is given another), and ends the process with
EXIT_CODE when it is not. It does nothing in a process the raylet did not start (a
driver, a test calling an actor class in-process), and starts one thread per process.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
EXIT_CODE = 75  # sysexits' EX_TEMPFAIL: Ray starts the actor again where it may
_started = False
_lock = threading.Lock()


def start() -> None:
    """Watches this process's raylet, if the raylet started it (idempotent)."""
    global _started
    raylet_pid = os.environ.get("RAY_RAYLET_PID", "")
    if not raylet_pid.isdigit() or os.getppid() != int(raylet_pid):
        return
    with _lock:
        if _started:
            return
        _started = True
    threading.Thread(target=_watch, args=(int(raylet_pid),), name="rayk-raylet-watch", daemon=True).start()


def _watch(raylet_pid: int) -> None:
    stop = threading.Event()
    while not stop.wait(CHECK_INTERVAL_S):
        if os.getppid() != raylet_pid:
            logger.critical("this node's raylet (pid %d) is gone: Ray declared the node dead; ending this process",
                            raylet_pid)  # fmt: skip
            os._exit(EXIT_CODE)
