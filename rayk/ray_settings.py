"""What a Ray that rayk starts itself is set up with, chiefly the CPU priority (nice value)
its workers, rayk's actors among them, run at.

Ray starts every worker process at `worker_niceness`, 15 by default, so that its raylet
and GCS win the CPU from user code. rayk's actors are servers, not user code: at nice 15 a
listener or a replica loses the CPU, for tens of milliseconds at a time, to every process
of default priority on its node (clients, a driver, Ray's own agents), which are weighted
~28 times as heavily by the scheduler. At 500 acks=all records/s through the listener at
RF=3 on a 2-core node that was most of the end-to-end tail: p99 11-32 ms at nice 15,
7-14 ms at nice 0 (benchmarks/niceness_bench.py).

A worker's nice value is set by the raylet that starts it, and a process may not lower
its own without privilege; so it is a property of the Ray, not of an actor. (An actor's
runtime_env can carry `RAY_worker_niceness`, as Ray's job supervisor does, but a worker
with a runtime_env starts through Ray's setup_worker.py, a second Python start: 20 actors
took 12.5 s instead of 7-8 s on this machine, and a 36-replica topic 20-25 s instead of
12.5.) So a Ray that rayk starts (`rayk.start` without a Ray, `rayk demo`, the examples,
clusters/*.yaml) runs its workers at nice 0, Ray's `RAY_SYSTEM_CONFIG` below; a broker in
a Ray started otherwise says so once (`lowered_priority_warning`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

SERVER_NICENESS = 0  # Ray's own processes' nice value, and a Kafka broker's

# For a Ray that rayk starts on its own. worker_maximum_startup_concurrency: every replica
# is an actor process, and Ray starts at most as many worker processes at once as the node
# has CPUs and warns ("N PYTHON worker processes have been started ... 4x the maximum
# expected startup concurrency") once four times that many run; a 3-broker demo on two
# cores runs ~26 and was warned three times, as if something were wrong.
RAY_SYSTEM_CONFIG: Mapping[str, int] = {"worker_maximum_startup_concurrency": 16, "worker_niceness": SERVER_NICENESS}


@contextmanager
def ray_system_config_in_env() -> Iterator[None]:
    """RAY_SYSTEM_CONFIG as the `RAY_<name>` variables a Ray started meanwhile by this
    process reads (its raylet and GCS inherit the environment), for `ray.init(address=None)`,
    which starts a Ray or joins one and refuses `_system_config` when it joins. A variable
    the user set stays theirs; the environment is as it was afterwards."""
    added = [f"RAY_{name}" for name in RAY_SYSTEM_CONFIG if f"RAY_{name}" not in os.environ]
    for name in added:
        os.environ[name] = str(RAY_SYSTEM_CONFIG[name.removeprefix("RAY_")])
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def lowered_priority_warning(who: str) -> str | None:
    """What to tell the operator when this process runs below a server's priority (None if
    it does not): `who` loses the CPU to every default-priority process of its node."""
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    if niceness <= SERVER_NICENESS:
        return None
    return (
        f"{who} runs at nice {niceness} (Ray's worker_niceness), below the processes of default priority on "
        f"its node, which take the CPU from it first: expect latency spikes of tens of ms when the node is busy. "
        f"Start Ray with RAY_worker_niceness={SERVER_NICENESS} in the environment of `ray start` (as clusters/*.yaml "
        f"do) or let rayk.start() start it"
    )
