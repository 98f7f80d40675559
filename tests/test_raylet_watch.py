"""raylet_watch: a rayk actor process ends once the raylet that started it is gone (Ray
declared its node dead), and a process the raylet did not start is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from rayk.actors import raylet_watch
from tests.cluster_helpers import wait_until

REPO = Path(__file__).resolve().parent.parent
# A stand-in for the raylet: starts a worker that watches it, prints the worker's pid, waits.
RAYLET = textwrap.dedent("""
    import os, subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "from rayk.actors import raylet_watch; import time; "
                               "raylet_watch.start(); time.sleep(60)"],
                              env={**os.environ, "RAY_RAYLET_PID": str(os.getpid())})
    print(worker.pid, flush=True)
    time.sleep(60)
""")


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")  # exited, not reaped yet by whoever adopted it


def test_a_worker_ends_once_its_raylet_is_gone():
    raylet = subprocess.Popen([sys.executable, "-c", RAYLET], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        worker = int(raylet.stdout.readline())
        time.sleep(2 * raylet_watch.CHECK_INTERVAL_S)
        assert not _ended(worker), "the worker ended while its raylet ran"
        os.kill(raylet.pid, signal.SIGKILL)
        raylet.wait()
        wait_until(lambda: _ended(worker), 10 * raylet_watch.CHECK_INTERVAL_S, "the worker to end with its raylet")
    finally:
        raylet.kill()


def test_a_process_the_raylet_did_not_start_is_not_watched(monkeypatch):
    monkeypatch.setenv("RAY_RAYLET_PID", str(os.getppid() + 1))
    before = threading.active_count()
    raylet_watch.start()
    assert threading.active_count() == before
    monkeypatch.delenv("RAY_RAYLET_PID")
    raylet_watch.start()
    assert threading.active_count() == before
