"""Ray's fake multi-node autoscaler, for the tests and benchmarks of rayk's autoscaling.

Ray's `fake_multinode` node provider "launches" a node by starting another raylet on this
machine, with the resources of its node type, and terminates it like a cloud node: the
real autoscaler (`ray start --head --autoscaling-config=F`, with RAY_FAKE_CLUSTER=1)
drives it. `ray.cluster_utils.AutoscalingCluster` fails with Ray's wheel (its base
config, example.yaml, is not shipped) and runs `ray stop --force`, which would stop every
Ray on the machine; so this module starts the head itself, in PID and network
namespaces of their own (tests/own_namespaces.py), where nothing else is seen or sees it.

Outside, a test calls `run("module:function", *args)`: it runs `python -m
tests.fake_autoscaler module:function args...` as the first process of the namespaces and
returns its output (AssertionError with the output if it failed or ran past its time).

Inside, `main` brings the loopback up, mounts a tmpfs on /tmp/ray (`ray start` writes the
current cluster's address there, which every `ray.init()` on the machine would otherwise
join), writes `fake_cluster_config` and starts the head with it (the autoscaler's loop
every second: AUTOSCALER_UPDATE_INTERVAL_S=1), connects, and calls the function with
the arguments. When it ends, so does the namespace, and every Ray process with it.

Measured here (Ray 2.60): a node came up 4-11 s after the request for it; an idle one went
~15 s after it was last used at idle_timeout_minutes 0.25; the default here is 0.1 (6 s).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests import own_namespaces
from tests.own_namespaces import STEP_PREFIX

BROKER_RESOURCE = "rayk_broker"
HEAD_NODE_TYPE = "ray.head.default"  # the fake provider's name for the head's type
BROKER_NODE_TYPE = "rayk.broker"
MAX_BROKER_NODES = 3  # the broker node type's max_workers
HEAD_START_ATTEMPTS = 2
FAKE_RAY_ENV = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
_started_s = time.monotonic()


def fake_cluster_config(max_broker_nodes: int, idle_timeout_minutes: float = 0.1) -> dict[str, Any]:
    """The whole autoscaling config: a head offering no broker resource and a broker node
    type offering one unit of it (as clusters/aws-autoscaling.yaml's), none at first."""
    return {
        "cluster_name": "rayk-fake",
        "max_workers": max_broker_nodes,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True},
        "available_node_types": {
            HEAD_NODE_TYPE: {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
            BROKER_NODE_TYPE: {"resources": {"CPU": 1, BROKER_RESOURCE: 1}, "node_config": {},
                               "min_workers": 0, "max_workers": max_broker_nodes},
        },
        "head_node_type": HEAD_NODE_TYPE,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }  # fmt: skip


TOOLS = ("ip", "mount")  # besides unshare, and root


def run(target: str, *args: str, timeout_s: float) -> str:
    """Runs `target` ("module:function") with `args` in a fake autoscaling Ray of its own
    (see the module docstring); its output (stdout and stderr). Needs root and TOOLS
    (tests skip without them: own_namespaces.skip_unless_root_with(*TOOLS))."""
    return own_namespaces.run_module("tests.fake_autoscaler", target, *args, timeout_s=timeout_s)


def log(message: str) -> None:
    """A step of a scenario, with the seconds since the namespace started."""
    print(f"{STEP_PREFIX}{time.monotonic() - _started_s:6.1f} s] {message}", flush=True)


def broker_nodes() -> list[str]:
    """The alive Ray nodes offering BROKER_RESOURCE."""
    import ray

    return sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(BROKER_RESOURCE, 0) > 0)


def _start_head(max_broker_nodes: int) -> None:
    """Loopback up, /tmp/ray on a tmpfs of this namespace's, and Ray's head with the fake
    autoscaler. Only as PID 1 of a namespace of its own (`run`)."""
    assert os.getpid() == 1, "starts a Ray head that `ray.init()` everywhere would join: only in a namespace (run)"
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    Path("/tmp/ray").mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/tmp/ray"], check=True)
    config = Path("/tmp/ray/autoscaling.json")
    config.write_text(json.dumps(fake_cluster_config(max_broker_nodes)))
    ray_command = str(Path(sys.executable).parent / "ray")
    for attempt in range(HEAD_START_ATTEMPTS):
        started = subprocess.run(
            [ray_command, "start", "--head", f"--autoscaling-config={config}", "--num-cpus=1", "--disable-usage-stats",
             "--include-dashboard=false"],
            env={**os.environ, **FAKE_RAY_ENV}, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        if started.returncode == 0:
            log("Ray's head started with the fake autoscaler")
            return
        # A raylet that timed out starting on a loaded machine: `ray stop` here reaches only
        # this namespace's processes.
        log(f"ray start failed (attempt {attempt + 1}); stopping what it left")
        subprocess.run([ray_command, "stop", "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raise AssertionError(f"ray start --head failed {HEAD_START_ATTEMPTS} times")


def main(argv: list[str]) -> None:
    """`python -m tests.fake_autoscaler module:function [args...]`, as `run` starts it."""
    import ray

    module, function = argv[0].split(":")
    _start_head(MAX_BROKER_NODES)
    ray.init(address="auto", namespace="rayk", logging_level="ERROR", log_to_driver=False)
    getattr(importlib.import_module(module), function)(*argv[1:])


if __name__ == "__main__":
    from tests.fake_autoscaler import main as imported_main  # one module, one clock for `log`, not two

    imported_main(sys.argv[1:])
