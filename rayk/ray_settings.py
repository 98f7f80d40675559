"""What a Ray that rayk starts itself is set up with, chiefly the CPU priority (nice value)
its workers, rayk's actors among them, run at.

Ray runs every worker process `worker_niceness` (15 by default) above the nice value it
started with, so that its raylet and GCS win the CPU from user code. rayk's actors are
servers, not user code: at nice 15 a listener or a replica loses the CPU, for tens of
milliseconds at a time, to every process of default priority on its node (clients, a
driver, Ray's own agents), which the scheduler weights ~28 times as heavily. At 500
acks=all records/s through the listener at RF=3 on a 2-core node that was most of the
end-to-end tail when the machine was busy: p99 13-32 ms at nice 15 against 7-14 ms at
nice 0 in one probe's alternating rounds, 45.2 against 25.0 ms (medians) in
benchmarks/niceness_bench.py's.

A worker adjusts its nice value itself when it starts, from its Ray config: the raylet's
environment (`RAY_worker_niceness`) or `_system_config`, which every worker of that Ray
shares, or an actor's runtime_env, as Ray's job supervisor uses it. The runtime_env would
scope it to rayk's actors, but a worker with a runtime_env starts through Ray's
setup_worker.py, a second Python start: 20 actors took 12.5 s instead of 7-8 s on this
machine, and a 36-replica topic 20-25 s instead of 12.5. So it is the Ray's setting: a Ray
that rayk starts (`rayk.start` without a Ray, `rayk demo`, `rayk.spark` when it starts
one, the examples, clusters/*.yaml) runs its workers at nice 0 (`RAY_SYSTEM_CONFIG`), and
a broker in a Ray started otherwise says so when it starts (`lowered_priority_warning`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import MappingProxyType

SERVER_NICENESS = 0  # how far above its raylet a worker runs: Ray's own processes', and a Kafka broker's, priority

# For a Ray that rayk starts on its own; read-only, since Ray adds its session's settings
# to the dict it is given: pass `dict(RAY_SYSTEM_CONFIG)` as ray.init's _system_config.
# worker_maximum_startup_concurrency: every replica is an actor process, and Ray starts at
# most as many worker processes at once as the node has CPUs and warns ("N PYTHON worker
# processes have been started ... 4x the maximum expected startup concurrency") once four
# times that many run; a 3-broker demo on two cores runs ~26 and was warned three times.
RAY_SYSTEM_CONFIG = MappingProxyType({"worker_maximum_startup_concurrency": 16, "worker_niceness": SERVER_NICENESS})

_environment_lock = threading.RLock()  # os.environ is the process's: one Ray start edits it at a time


@contextmanager
def ray_system_config_in_env() -> Iterator[None]:
    """RAY_SYSTEM_CONFIG as the `RAY_<name>` variables a Ray started meanwhile by this
    process reads (its raylet and GCS inherit the environment), for `ray.init(address=None)`,
    which starts a Ray or joins one and refuses `_system_config` when it joins. A variable
    the user set stays theirs; the environment is as it was afterwards."""
    wanted = {f"RAY_{name}": str(value) for name, value in RAY_SYSTEM_CONFIG.items()}
    with _environment_lock:
        added: list[str] = []
        try:
            for name, value in wanted.items():
                if name not in os.environ:
                    os.environ[name] = value
                    added.append(name)
            yield
        finally:
            for name in added:
                os.environ.pop(name, None)


def lowered_priority_warning(who: str) -> str | None:
    """What to tell the operator when this worker runs below its raylet's CPU priority
    (None if it does not): `who` loses the CPU to every process of the raylet's priority."""
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        raylet = os.getpriority(os.PRIO_PROCESS, os.getppid())  # a worker's parent is its raylet
    except OSError:
        raylet = SERVER_NICENESS
    if niceness <= raylet + SERVER_NICENESS:
        return None
    return (
        f"{who} runs at nice {niceness}, {niceness - raylet} below its raylet (Ray's worker_niceness): "
        f"processes of the raylet's priority on its node take the CPU from it first, which shows as latency "
        f"spikes of tens of ms when the node is busy. Start Ray with RAY_worker_niceness={SERVER_NICENESS} in the "
        f"environment of `ray start` (as clusters/*.yaml do), or let rayk.start() start it"
    )
