"""Which processes keep pyarrow and pydantic out: only a worker creating a replica."""

from __future__ import annotations

import logging
import sys

import pytest

from rayk.replication.replica_process import is_replica_creation, keep_libraries_out
from tests.cluster_helpers import shared_local_ray


@pytest.mark.parametrize(
    "name, creating",
    [
        ("rayk.replication.partition_replica.PartitionReplica.__init__", True),
        ("rayk.coordinator.group.offsets_replica.OffsetsPartitionReplica.__init__", True),
        ("rayk.replication.partition_replica.PartitionReplica.fetch", False),  # a call, not the creation
        ("rayk.server.replica_manager.ReplicaManager.__init__", False),
        ("ray.data._internal.execution.operators.map_operator._map_task", False),
        ("mymodule.NotAPartitionReplica.__init__", False),
        ("", False),
        (None, False),
    ],
)
def test_only_a_replica_creation_task_counts(name, creating):
    assert is_replica_creation(name) is creating


@pytest.mark.parametrize("with_ray", [False, True])
def test_a_driver_keeps_its_libraries_and_is_not_warned(with_ray, caplog):
    if with_ray:
        shared_local_ray()
        caplog.clear()  # what Ray's start logged
    before = {name: sys.modules.get(name) for name in ("pyarrow", "pydantic")}
    assert keep_libraries_out() is False
    assert {name: sys.modules.get(name) for name in ("pyarrow", "pydantic")} == before
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "nothing logged in the driver"
