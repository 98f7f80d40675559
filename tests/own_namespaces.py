"""Running a test's processes in a PID namespace (and maybe a network namespace) of their own.

`ray stop` and `ray down` stop every Ray process they can see, and `ray start` makes every
`ray.init()` on the machine join its cluster (/tmp/ray/ray_current_cluster): a test that
needs them runs them where they see, and are seen by, nothing else. `unshare --pid --fork
--mount-proc` makes the command the first process (PID 1) of a new PID namespace, with a
mount namespace of its own; `--net` adds a network namespace with only a loopback (down
until the command brings it up), so its ports collide with nothing either. When the
first process ends, the kernel ends every process of the namespace: whatever the test
started through it (Ray's GCS, raylets, workers) goes with it. `--kill-child` ends the
first process if `unshare` itself is killed; PID 1 ignores signals it has no handler for,
so a test ends the namespace by signalling `unshare`'s process group (`end`).

Needs root (skips otherwise) and util-linux's `unshare`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import pytest


def skip_unless_root_with(*tools: str) -> None:
    """Skips the test unless it runs as root with `unshare` and `tools` on PATH."""
    if os.geteuid() != 0:
        pytest.skip("needs root for PID and network namespaces of its own")
    if missing := [tool for tool in ("unshare", *tools) if shutil.which(tool) is None]:
        pytest.skip(f"needs {', '.join(missing)} (`.ci/run` installs them)")


def start(argv: Sequence[str], *, net: bool, stdout: IO[Any] | int | None = None,
          stderr: IO[Any] | int | None = None, **popen: Any) -> subprocess.Popen:  # fmt: skip
    """`argv` as the first process of a PID namespace of its own (and a network namespace
    of its own if `net`), in a new process group for `end`."""
    flags = ["--pid", "--fork", "--mount-proc", "--kill-child", *(["--net"] if net else [])]
    return subprocess.Popen(["unshare", *flags, *argv], stdout=stdout, stderr=stderr, start_new_session=True, **popen)


def end(process: subprocess.Popen, timeout_s: float = 10) -> None:
    """Ends the namespace, and so every process in it: SIGTERM to `unshare`'s group, then
    SIGKILL if it has not ended within `timeout_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue
    process.wait()


REPO = Path(__file__).resolve().parent.parent
STEP_PREFIX = "[step "  # what a scenario's `log` lines start with: a failure shows them, whatever else was printed


def run_module(module: str, target: str, *args: str, timeout_s: float) -> str:
    """Runs `python -m module target args...` as the first process of PID, mount and
    network namespaces of its own; its output (stdout and stderr). AssertionError with the
    scenario's steps and the output's end if it failed or ran past `timeout_s`."""
    with tempfile.TemporaryFile("w+") as out:
        process = start([sys.executable, "-m", module, target, *args], net=True, stdout=out,
                        stderr=subprocess.STDOUT, cwd=REPO)  # fmt: skip
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            end(process)
        out.seek(0)
        output = out.read()
    if process.returncode != 0:
        steps = "\n".join(line for line in output.splitlines() if line.startswith(STEP_PREFIX))
        raise AssertionError(f"{target} failed (exit status {process.returncode}; -9: past {timeout_s} s) after the "
                             f"steps:\n{steps}\n... output's end:\n{output[-8000:]}")
    return output
