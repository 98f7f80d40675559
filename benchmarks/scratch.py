"""Scratch data directories for the benchmarks' clusters, removed when the run ends.

A throughput run writes gigabytes of log segments (`latency_cpu_bench.py --throughput`
left 3-8 GB a run in /tmp); left behind, a few runs filled this machine's disk. The
directory goes at the interpreter's exit, after an exception too (not after SIGKILL).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile


def scratch_dir(prefix: str) -> str:
    """A new directory under the system's temporary directory, removed at exit."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path
