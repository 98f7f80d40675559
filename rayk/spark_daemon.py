"""Spark's Python daemon for rayk's Spark sessions (`spark.python.daemon.module`):
PySpark's own daemon, with pyarrow, Ray and rayk's read and write paths imported once,
before it forks Spark's Python workers, and without three costs that Spark and PySpark put
on every task (80 ms of a task's time against 15 after, for a mapInArrow task that does
nothing, in a RayDP executor on the 2-core machine; Spark's task metrics and strace).

Spark ends a Python worker idle for a minute (PythonWorkerFactory, a constant in 3.5),
and the next task then runs in a worker forked from this daemon. With PySpark's daemon,
that worker imported pyarrow, Ray and rayk itself on its first rayk task (0.77 s on a
quiet machine, more on a busy one); forked from this one, it has them. Importing them
starts no thread, so forking after it is as safe as PySpark's daemon; each worker still
connects to Ray on its own, after the fork (rayk.spark._worker_cluster). Nothing here
writes to stdout, which carries the daemon's port to Spark.

Spark puts the jar that holds its PythonUtils on the workers' PYTHONPATH (spark-core's,
5,221 entries and no Python in a pip-installed PySpark), for builds that ship PySpark
inside that jar. A zip importer then serves the jar, and two more serve its `google/`
and `org/` directories as portions of those namespace packages. PySpark's worker calls
`importlib.invalidate_caches()` before every task, and Python 3.11's zip importers
read their archive's whole directory again on it: 40 ms a task, on the task's path
(measured in a RayDP executor). This daemon takes the jars without Python in them off
`sys.path` before it imports anything, so no worker it forks holds such an importer; the
environment's PYTHONPATH is left as Spark set it.

PySpark's daemon runs `gc.collect()` in a reused worker after every task: a full
collection of everything the daemon imported (140,000 objects here, 25 ms). This daemon
freezes its heap after its imports (`gc.freeze()`, Python's advice before forking), so a
worker's collections scan only what the worker made itself.

The executor writes a task's header and then its command on the worker's TCP socket; its
socket delays the command (Nagle) until the worker's kernel acknowledges the header, and
that kernel holds the acknowledgement back for its delayed-ACK timer: 40 ms every task,
seen with strace. The worker asks its socket for an immediate acknowledgement
(TCP_QUICKACK) before each task.
"""

import gc
import importlib
import socket
import sys
import zipfile
from collections.abc import Callable

PRELOADED_MODULES = ("pyarrow", "ray", "rayk.data", "rayk.spark")
# What a worker would otherwise import in its first task, each time Spark starts one: Ray's
# serializers import pydantic (its v1 API too) when the worker's first Ray call returns,
# and PySpark's Arrow types import distutils.version (setuptools, via its distutils shim).
# 160 ms on a quiet machine, ~250 ms of a first read in py-spy. Optional: a module that is
# not there is left to whoever needs it.
FIRST_TASK_MODULES = ("ray._common.pydantic_compat", "pydantic.v1", "distutils.version")
QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux's


def holds_no_python(path: str) -> bool:
    """Whether `path` is a Java archive that Python cannot import anything from: a jar with
    no `.py` or `.pyc` in it (Python's zip importer loads no extension modules). A jar it
    cannot read is taken to hold some."""
    if not path.lower().endswith(".jar"):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            return not any(name.endswith((".py", ".pyc")) for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _acking_at_once(run_task: Callable[[socket.socket, bool], int]) -> Callable[[socket.socket, bool], int]:
    """PySpark's `daemon.worker` (one task on the socket from the executor), with the
    socket told to acknowledge what arrives at once first."""

    def run(sock: socket.socket, authenticated: bool) -> int:
        if QUICKACK is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
            except OSError:
                pass  # only a delay saved; the task runs either way
        return run_task(sock, authenticated)

    return run


if __name__ == "__main__":
    # The imports above already cached an importer for each jar on the path (and, for a
    # namespace package's lookup, for its `<jar>/org` and `<jar>/google` too).
    dropped = [entry for entry in sys.path if holds_no_python(entry)]
    sys.path[:] = [entry for entry in sys.path if entry not in dropped]
    for key in [key for key in sys.path_importer_cache if any(key.startswith(jar) for jar in dropped)]:
        del sys.path_importer_cache[key]
    from pyspark import daemon

    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    for name in FIRST_TASK_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    gc.collect()  # what the imports left as garbage, not frozen with the rest
    gc.freeze()
    daemon.worker = _acking_at_once(daemon.worker)
    daemon.manager()
