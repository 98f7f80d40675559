"""Spark's Python daemon for rayk's Spark sessions (`spark.python.daemon.module`):
PySpark's own daemon, with pyarrow, Ray and rayk's read and write paths imported once,
before it forks Spark's Python workers.

Spark ends a Python worker idle for a minute (PythonWorkerFactory, a constant in 3.5),
and the next task then runs in a worker forked from this daemon. With PySpark's daemon,
that worker imported pyarrow, Ray and rayk itself on its first rayk task (0.77 s on a
quiet machine, more on a busy one); forked from this one, it has them. Importing them
starts no thread, so forking after it is as safe as PySpark's daemon; each worker still
connects to Ray on its own, after the fork (rayk.spark._worker_cluster). Nothing here
writes to stdout, which carries the daemon's port to Spark.
"""

import importlib

from pyspark import daemon

PRELOADED_MODULES = ("pyarrow", "ray", "rayk.data", "rayk.spark")

if __name__ == "__main__":
    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    daemon.manager()
