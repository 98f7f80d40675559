"""rayk.ray_console against the real warning: a driver of its own Ray makes the raylet warn
that it started too many worker processes, and the warning reaches rayk's filter (which
counts what it drops) and stays off the console; another message that Ray pushes to the
driver the same way is printed. That the filter drops that message only, and that it
can be taken away, is tested on the function itself.

The driver is a subprocess: the filter is process-wide, and the driver needs a Ray of its
own with one CPU. The raylet warns once its worker processes, less twice `max_io_workers`
(slots it keeps for spilling), reach 4x its maximum startup concurrency (the node's CPUs):
with `max_io_workers` 0, at 4 worker processes rather than 12, which saves starting 8 of
them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rayk.ray_console import hide_worker_pool_warning, show_worker_pool_warning

DRIVER = r"""
import json
import sys
import threading
import time

import ray

from rayk import ray_console


class Console:
    # sys.stdout as Ray's printing finds it: every line kept.
    def __init__(self):
        self.text = ""
        self.lock = threading.Lock()

    def write(self, s):
        with self.lock:
            self.text += s
        return len(s)

    def flush(self):
        pass

    def lines(self):
        with self.lock:
            return self.text.splitlines()


def wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


is_warning = ray_console.is_worker_pool_warning
dropped = []
def counted(line):
    hit = is_warning(line)
    if hit:
        dropped.append(line)
    return hit
ray_console.is_worker_pool_warning = counted  # the filter looks it up on each line

real_stdout, console = sys.stdout, Console()
sys.stdout = console
ray_console.hide_worker_pool_warning()
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
         _system_config={"max_io_workers": 0})
try:
    @ray.remote(num_cpus=0)
    class Replica:
        def ping(self):
            return 1

    replicas = [Replica.remote() for _ in range(6)]
    ray.get([r.ping.remote() for r in replicas])
    wait_for(lambda: dropped, 15, "the raylet's warning")

    # Another message the cluster pushes to drivers: a remote function this large.
    ballast = b"x" * 11_000_000
    @ray.remote(num_cpus=0)
    def large():
        return len(ballast)
    ray.get(large.remote())
    wait_for(lambda: any("is very large" in line for line in console.lines()), 15, "the large-function warning")
    filtered = console.lines()
finally:
    ray.shutdown()
    sys.stdout = real_stdout
print(json.dumps({"filtered": filtered, "dropped": dropped}))
"""


@pytest.mark.slow
def test_the_raylets_worker_pool_warning_is_hidden_and_other_messages_are_not(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_COLOR_PREFIX"] = "0"  # lines as "(raylet) WARNING: ..."
    done = subprocess.run(
        [sys.executable, "-c", DRIVER], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])

    assert seen["dropped"], "the raylet did not warn: nothing was filtered"
    assert all("worker processes have been started on node" in line for line in seen["dropped"])
    assert not [line for line in seen["filtered"] if "worker processes have been started" in line]
    # Printed the same way (pushed by the cluster, "raylet" as its pid), and not filtered:
    assert [line for line in seen["filtered"] if line.startswith("(raylet) Warning: The remote function")]


def test_the_filter_drops_that_message_only_and_can_be_taken_away():
    import ray._private.worker as ray_worker

    printed = []
    original = ray_worker.print_to_stdstream
    ray_worker.print_to_stdstream = lambda data, ignore_prefix: printed.append(data)
    try:
        hide_worker_pool_warning()
        hide_worker_pool_warning()  # a second call does nothing
        warning = (
            "WARNING: 102 PYTHON worker processes have been started on node: 75d2226 with address: 10.0.0.5, "
            "which is 51x the maximum expected startup concurrency (2). This could be a result of using a large "
            "number of actors, tasks blocked in ray.get() calls, or tasks with fractional CPU requests."
        )
        other = "Warning: The remote function __main__.f is very large (10 MiB)."
        ray_worker.print_to_stdstream({"lines": [warning], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        ray_worker.print_to_stdstream({"lines": [warning, other], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        ray_worker.print_to_stdstream({"lines": [warning], "pid": 4242, "is_err": False}, ignore_prefix=False)  # an actor's own print
        assert printed == [
            {"lines": [other], "pid": "raylet", "is_err": False},
            {"lines": [warning], "pid": 4242, "is_err": False},
        ]
        show_worker_pool_warning()
        ray_worker.print_to_stdstream({"lines": [warning], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        assert printed[-1]["lines"] == [warning]
    finally:
        ray_worker.print_to_stdstream = original
