"""The start-up notices of child processes are dropped; everything else they write to
stderr, before or after the block ends, still arrives."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rayk.child_stderr import filtered_stderr, is_notice

CHILD = r"""
import sys, time
sys.stderr.write('Setting default log level to "WARN".\n')
sys.stderr.write("To adjust logging level use sc.setLogLevel(newLevel). For SparkR, use setLogLevel(newLevel).\n")
sys.stderr.write("[2026-11-24 03:49:57,794 I 8322 8383] gcs_client.cc:96: GcsClient has no Cluster ID set, and won't fetch from GCS.\n")
sys.stderr.write("ERROR a real problem\n"); sys.stderr.flush()
time.sleep(0.5)  # outlives the block
sys.stderr.write("WARN later, still shown\nno newline at the end")
"""


def test_notices_are_recognised_and_nothing_else():
    assert is_notice(b"Setting default log level to \"WARN\".")
    assert is_notice(b"[... I 1 2] logging.cc:303: Set ray log level from environment variable RAY_BACKEND_LOG_LEVEL to 1")
    assert not is_notice(b"ERROR SparkContext: Error initializing SparkContext.")
    assert not is_notice(b"")


def test_a_child_started_in_the_block_keeps_its_real_output(tmp_path):
    captured = tmp_path / "stderr"
    saved = os.dup(2)
    with open(captured, "wb") as sink:
        os.dup2(sink.fileno(), 2)  # stands for the terminal
    try:
        with filtered_stderr():
            child = subprocess.Popen([sys.executable, "-c", CHILD])
            os.write(2, b"this process, in the block\n")
        os.write(2, b"this process, after the block\n")
        assert child.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while b"no newline at the end" not in captured.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    lines = captured.read_bytes().decode().splitlines()
    assert sorted(lines) == sorted(
        [
            "this process, in the block",
            "this process, after the block",
            "ERROR a real problem",
            "WARN later, still shown",
            "no newline at the end",
        ]
    )


def test_without_a_python_stderr_the_block_still_runs(monkeypatch):
    monkeypatch.setattr(sys, "stderr", None)  # pythonw, some service launchers
    with filtered_stderr():
        ran = True
    assert ran and os.fstat(2)  # fd 2 is back and open
