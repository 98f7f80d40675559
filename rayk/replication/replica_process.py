"""The process a partition replica runs in: the libraries it keeps out.

Every partition replica is a Ray worker process of its own, so whatever such a process
imports costs memory and start time once per partition. Ray's worker imports `pyarrow`
and `pydantic` the first time it (de)serializes anything, only to register serializers
for their types (`ray.util.serialization_addons`): measured with py-spy while a broker
created 60 replicas, ~30% of the replicas' start CPU (benchmarks/replication_bench.py,
part 3). A replica never handles either kind of object (it stores and serves bytes), so
its process marks both absent before Ray gets to them, and Ray skips those serializers as
it does where they are not installed.

`keep_libraries_out` runs when a replica's class module is imported, which in a worker
creating a replica happens before the creation's arguments are deserialized. It acts only
there: drivers, Ray Data tasks and the other actors that import the module (to hold a
replica's handle) are left alone.
"""

from __future__ import annotations

import sys

import ray

REPLICA_CLASSES = ("PartitionReplica", "OffsetsPartitionReplica", "TransactionStatePartitionReplica")
KEPT_OUT = ("pyarrow", "pydantic")


def is_replica_creation(task_function_name: str | None) -> bool:
    """True for the creation task of a replica actor: Ray names it
    `<module>.<class>.__init__`."""
    if not task_function_name:
        return False
    qualified_class, _, method = task_function_name.rpartition(".")
    return method == "__init__" and qualified_class.rpartition(".")[2] in REPLICA_CLASSES


def keep_libraries_out() -> bool:
    """In the process creating a replica, marks KEPT_OUT absent (those already imported
    stay); returns whether this is such a process."""
    if not ray.is_initialized():
        return False
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE or not is_replica_creation(context.get_task_function_name()):
        return False  # a driver (which Ray would warn for asking a task's name), or another task
    for name in KEPT_OUT:
        sys.modules.setdefault(name, None)
    return True


def let_library_in(name: str) -> None:
    """Undoes `keep_libraries_out` for `name`, which this replica does need after all (a
    tiered replica's remote storage is a pyarrow filesystem): its next import loads it. Ray
    has skipped its serializers already, which a replica still never uses."""
    if name in sys.modules and sys.modules[name] is None:
        del sys.modules[name]
