"""A Ray that rayk starts itself runs its workers, rayk's actors among them, at a server's
CPU priority (nice 0), not Ray's 15 for user code; a broker in a Ray started otherwise says
so (rayk/ray_settings.py). clusters/*.yaml's `ray start` commands are checked in
tests/test_cluster_configs.py, and local.yaml's brokers' nice value in its `ray up` test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rayk import ray_settings
from rayk.ray_settings import RAY_SYSTEM_CONFIG, SERVER_NICENESS, lowered_priority_warning, ray_system_config_in_env


def test_a_ray_rayk_starts_runs_its_workers_at_a_server_s_priority_and_ray_gets_a_copy():
    assert RAY_SYSTEM_CONFIG["worker_niceness"] == SERVER_NICENESS == 0
    with pytest.raises(TypeError):  # Ray adds its session's settings to the dict it is given
        RAY_SYSTEM_CONFIG["object_spilling_config"] = "{}"  # type: ignore[index]


def test_the_settings_are_in_the_environment_only_while_ray_starts(monkeypatch):
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    monkeypatch.setenv("RAY_worker_maximum_startup_concurrency", "4")  # the user's: stays theirs
    with ray_system_config_in_env():
        assert os.environ["RAY_worker_niceness"] == "0"
        assert os.environ["RAY_worker_maximum_startup_concurrency"] == "4"
    assert "RAY_worker_niceness" not in os.environ
    assert os.environ["RAY_worker_maximum_startup_concurrency"] == "4"


def test_the_environment_is_restored_when_ray_fails_to_start(monkeypatch):
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    with pytest.raises(ConnectionError), ray_system_config_in_env():
        raise ConnectionError("no Ray at that address")
    assert "RAY_worker_niceness" not in os.environ


def test_rayk_start_starts_ray_with_them(monkeypatch):
    seen = {}

    class Started(Exception):
        pass

    def fake_init(**kwargs):
        seen.update(niceness=os.environ.get("RAY_worker_niceness"), kwargs=kwargs)
        raise Started

    import rayk.client.cluster as cluster_module

    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    monkeypatch.setattr(cluster_module.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster_module.ray, "init", fake_init)
    with pytest.raises(Started):
        cluster_module.start(1, "unused", address="10.0.0.1:6379")
    assert seen == {"niceness": "0", "kwargs": {"address": "10.0.0.1:6379", "namespace": "rayk"}}
    assert "RAY_worker_niceness" not in os.environ


@pytest.mark.parametrize("niceness, raylet, warned", [(0, 0, False), (15, 0, True), (-5, 0, False), (5, 5, False), (20, 5, True)])
def test_a_broker_below_its_raylet_s_priority_says_how_to_raise_it(monkeypatch, niceness, raylet, warned):
    monkeypatch.setattr(ray_settings.os, "getpriority", lambda which, pid: niceness if pid == 0 else raylet)
    warning = lowered_priority_warning("broker 2")
    if not warned:
        assert warning is None
    else:
        assert warning is not None
        assert warning.startswith(f"broker 2 runs at nice {niceness}, {niceness - raylet} below its raylet")
        assert "RAY_worker_niceness=0" in warning


def test_a_worker_whose_raylet_is_gone_compares_with_a_server_s_priority(monkeypatch):
    def getpriority(which, pid):
        if pid:
            raise ProcessLookupError(pid)
        return 15

    monkeypatch.setattr(ray_settings.os, "getpriority", getpriority)
    assert lowered_priority_warning("broker 0") is not None


SCRIPT = """
import json, os, sys
import ray
import rayk
from ray._private.state import actors  # this driver's Ray's actor table (list_actors would look for the Ray by itself)

cluster = rayk.start(1, sys.argv[1], namespace="niceness", address="local",  # a Ray of its own, whatever runs
                     config={"listeners": "", "offsets.topic.num.partitions": 1, "offsets.topic.replication.factor": 1})
try:
    cluster.create_topic("t", 1, 1)
    seen = [[a["ActorClassName"], os.getpriority(os.PRIO_PROCESS, a["Pid"])] for a in actors().values() if a["State"] == "ALIVE"]
finally:
    cluster.shutdown()
    ray.shutdown()
print(json.dumps({"actors": seen, "driver": os.nice(0), "driver_env": os.environ.get("RAY_worker_niceness")}))
"""


@pytest.mark.slow
def test_rayk_start_without_a_ray_runs_every_actor_at_nice_0(tmp_path):
    """The whole way: the Ray rayk.start starts reads the variable, and every actor of the
    cluster (the Controller, the broker, its partition replicas) runs at the driver's
    priority (nice 0 unless the test itself runs under `nice`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "data")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert {"Controller", "ReplicaManager", "PartitionReplica"} <= {name for name, _ in seen["actors"]}, seen
    assert {niceness for _, niceness in seen["actors"]} == {seen["driver"]}, seen
    assert seen["driver_env"] is None  # the driver's own environment is as it was
