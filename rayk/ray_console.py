"""The driver's console under rayk: Ray's worker-pool warning left out of it.

Every partition replica is a Ray actor, and every actor is a worker process of its own.
The raylet counts a node's Python worker processes each time it starts one for a task or
an actor (WorkerPool::WarnAboutSize, src/ray/raylet/worker_pool.cc), and once they are
four times its "maximum expected startup concurrency" (`worker_maximum_startup_concurrency`,
by default the node's CPUs) and at each higher multiple it warns:

    WARNING: 102 PYTHON worker processes have been started on node: <id> with address:
    <ip>, which is 51x the maximum expected startup concurrency (2). This could be a
    result of using a large number of actors, ...

It writes that to its log (raylet.out) and publishes it to the GCS as an error of type
"worker_pool_large" for every job (ray_constants.WORKER_POOL_LARGE_ERROR). On each driver
the thread `ray_listen_error_messages` (ray/_private/worker.py, `listen_error_messages`)
receives it, whether or not `log_to_driver` is set, and hands it to
`ray._private.worker.print_to_stdstream` as a batch of lines from pid "raylet", which
de-duplicates it (one line, then "[repeated Nx across cluster]") and prints it on
sys.stdout. A script with a hundred partitions saw it five times.

For rayk that many actors is the design, not a mistake, so `hide_worker_pool_warning` (which
`rayk.start` and `rayk.connect` call) puts a filter in front of that function: batches from
"raylet" lose the lines that are this warning, before the de-duplication sees them, and
everything else reaches Ray's printing as it was. The raylet still logs the warning.
(Ray's own way to drop driver lines, the RAY_DEDUP_LOGS_SKIP_REGEX environment variable, is
read once when Ray is imported, before rayk can set it, and is applied by the
de-duplication only, which RAY_DEDUP_LOGS=0 turns off; it also applies to every worker's
output, not only to the messages pushed from the cluster.)
`rayk demo` also starts its own Ray with a higher `worker_maximum_startup_concurrency`
(rayk.ray_settings.RAY_SYSTEM_CONFIG), and the `rayk` CLI prints whatever Ray prints to stdout
on stderr (rayk/cli.py), so that a command's output holds its results only.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from typing import Any

import ray._private.worker as ray_worker

# The raylet's message (a format string in the raylet binary of the pinned Ray). Matched
# whole: if Ray rewords it, the warning shows again rather than something else hiding.
WORKER_POOL_WARNING = re.compile(
    r"WARNING: \d+ \w+ worker processes have been started on node: \S+ with address: \S+, "
    r"which is \d+x the maximum expected startup concurrency \(\d+\)\. "
)
PUSHED_ERROR_PID = "raylet"  # the "pid" of the batches `listen_error_messages` prints

_lock = threading.Lock()


def is_worker_pool_warning(line: str) -> bool:
    return WORKER_POOL_WARNING.match(line) is not None


def hide_worker_pool_warning() -> None:
    """Keeps Ray's "N PYTHON worker processes have been started on node ... Nx the maximum
    expected startup concurrency" warning off this driver's console; any other message of
    Ray's is printed as before. Call it before or after `ray.init` (the filter stays for
    the life of the process, over later `ray.init`s too); calling it again does nothing.
    `show_worker_pool_warning` takes it away.

    It replaces `ray._private.worker.print_to_stdstream`, through which the driver prints
    the errors the cluster pushes to it (see this module's docstring), with a function
    that drops this one message and calls the original for the rest.
    """
    with _lock:
        current = ray_worker.print_to_stdstream
        if getattr(current, "_rayk_original", None) is None:
            ray_worker.print_to_stdstream = _without_worker_pool_warning(current)


def show_worker_pool_warning() -> None:
    """Undoes `hide_worker_pool_warning`."""
    with _lock:
        original = getattr(ray_worker.print_to_stdstream, "_rayk_original", None)
        if original is not None:
            ray_worker.print_to_stdstream = original


def _without_worker_pool_warning(print_to_stdstream: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(print_to_stdstream)
    def filtered(data: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if data.get("pid") == PUSHED_ERROR_PID:
            lines = data.get("lines") or []
            kept = [line for line in lines if not is_worker_pool_warning(line)]
            if not kept and lines:
                return None
            if len(kept) != len(lines):
                data = {**data, "lines": kept}
        return print_to_stdstream(data, *args, **kwargs)

    filtered._rayk_original = print_to_stdstream  # type: ignore[attr-defined]
    return filtered
