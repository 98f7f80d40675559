"""A node's wall clock, stepped while its processes run: libfaketime (Debian's
`libfaketime`) preloaded into the node's Ray processes, its offset read from a file of its
own on every clock read, so that writing "+1h" or "-1h" there steps the wall clock of every
process of that node (its raylet and the workers it starts: the broker, its replicas and
coordinators) at once, as `date -s` on a host would. Only CLOCK_REALTIME moves
(FAKETIME_DONT_FAKE_MONOTONIC): a real step leaves the monotonic clock alone.

`node_env(nodes, directory)` is the environment of those nodes' processes, for
netns_cluster.run's `node_env` (it builds the shim below into `directory`, where each
node's clock file also lives); `step(node, offset)` steps a node's clock from the driver.

libfaketime 0.9.10 fails every clock_nanosleep on the monotonic clock when told not to
fake it (EINVAL: Python's time.sleep raises), so a shim preloaded before it
(clock_nanosleep_shim.c) sends those to the kernel.

Needs libfaketime and a C compiler (`skip_unless_available`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SHIM_SOURCE = Path(__file__).with_name("clock_nanosleep_shim.c")


def skip_unless_available() -> None:
    if not LIBFAKETIME.exists():
        pytest.skip(f"needs libfaketime ({LIBFAKETIME}: `.ci/run` installs Debian's libfaketime)")
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler for the clock_nanosleep shim")


def build_shim(directory: Path) -> Path:
    shim = directory / "clock_nanosleep_shim.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(SHIM_SOURCE), "-ldl"], check=True)
    return shim


def node_env(nodes: list[str], directory: Path) -> dict[str, dict[str, str]]:
    """The environment that puts each of `nodes` under a wall clock of its own, at the
    real time until `step`ped (each node's offset in `directory`/<node>.faketime)."""
    shim = build_shim(directory)
    env = {}
    for node in nodes:
        clock_file = directory / f"{node}.faketime"
        clock_file.write_text("+0\n")
        env[node] = {
            "LD_PRELOAD": f"{shim}:{LIBFAKETIME}",
            "FAKETIME_TIMESTAMP_FILE": str(clock_file),
            # A step is seen by the next clock read. The cost: a wall-clock read opens the
            # file, 5 us instead of 0.1 (FAKETIME_CACHE_DURATION=1 instead left a worker on
            # the old offset more than 1.5 s after a step).
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
    return env


def step(node: str, offset: str) -> None:
    """Sets `node`'s wall clock to real time + `offset` ("+1h", "-1h", "+0"), from
    anywhere in the netns cluster (the clock file's path is in the nodes' environment)."""
    from tests.faults.netns_cluster import NODE_ENV_VAR
    clock_file = Path(json.loads(os.environ[NODE_ENV_VAR])[node]["FAKETIME_TIMESTAMP_FILE"])
    temporary = clock_file.with_suffix(".new")
    temporary.write_text(offset + "\n")
    temporary.replace(clock_file)  # a reader sees the old offset or the new, never an empty file
