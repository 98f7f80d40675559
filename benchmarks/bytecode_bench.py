"""What a process start costs with the dependencies' bytecode compiled ahead, against
compiling their sources on every import, as every process did when `make` installed the
venv without bytecode and the environment sets PYTHONDONTWRITEBYTECODE (so no import
ever writes a .pyc).

Every partition replica is a Ray worker process of its own, so a cluster start, a topic's
creation and every replica restart pay a process's imports again. `make` now installs the
venv with `uv sync --compile-bytecode`; this script compares, in one run, alternating:

- "sources": PYTHONPYCACHEPREFIX pointing to a directory that holds rayk's bytecode alone
  (`make bytecode` compiled rayk before) and PYTHONDONTWRITEBYTECODE=1, so every module
  of the dependencies is compiled from its source at import, in every process (what the
  venv behaved like before);
- "bytecode": the venv as installed, each module read from its `__pycache__`.

Two figures per mode: the CPU (user + system) of a fresh interpreter importing what a
partition replica's worker imports (`ray` and `rayk.replication.partition_replica`), and
the CPU of a whole local cluster's life: `ray.init`, `rayk.start(brokers=3)`, a 3-partition
RF=3 topic, one acks=all record, shutdown (every process of the tree: this script is
their subreaper, so Ray's processes orphaned at the driver's exit are reaped and counted
here too).

    .venv/bin/python benchmarks/bytecode_bench.py [--rounds N]

Starts and stops its own local Ray instances; prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import rayk

IMPORTS = "import ray, rayk.replication.partition_replica"

CLUSTER_LIFE = """
import shutil, tempfile, ray, rayk
ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
data_dir = tempfile.mkdtemp(prefix="rayk-bytecode-bench-")
cluster = rayk.start(brokers=3, data_dir=data_dir, namespace="bytecode-bench")
cluster.create_topic("t", num_partitions=3, replication_factor=3)
producer = cluster.producer(acks="all")
producer.send("t", b"x").get(60)
producer.close()
cluster.shutdown()
ray.shutdown()
shutil.rmtree(data_dir, ignore_errors=True)
"""


PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def become_subreaper() -> None:
    """Processes orphaned under this one (Ray's, once the driver exits) become its children,
    so their CPU is counted when it reaps them."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_all(timeout_s: float = 60) -> None:
    """Waits for every child, the adopted ones included."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)
    raise TimeoutError("children still running")


def children_cpu_s(code: str, env: dict[str, str]) -> float:
    """CPU seconds of `python -c code` and every process under it."""
    before = os.times()
    subprocess.run([sys.executable, "-c", code], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reap_all()
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def compiled_share() -> float:
    """The share of site-packages' modules that have a .pyc of this interpreter."""
    site = Path(sysconfig.get_paths()["purelib"])
    sources = list(site.rglob("*.py"))
    tag = sys.implementation.cache_tag
    compiled = sum(1 for s in sources if (s.parent / "__pycache__" / f"{s.stem}.{tag}.pyc").exists())
    return compiled / max(1, len(sources))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each mode; default 3")
    args = parser.parse_args()
    share = compiled_share()
    print(f"machine: {os.cpu_count()} CPUs; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{share:.0%} of site-packages' modules have bytecode")
    if share < 0.9:
        print("  (install with `make` first: the comparison needs the venv's bytecode)")
    figures: dict[str, dict[str, list[float]]] = {m: {"imports": [], "cluster": []} for m in ("sources", "bytecode")}
    become_subreaper()
    with tempfile.TemporaryDirectory(prefix="rayk-no-pyc-") as rayk_only:
        # rayk's own modules compiled (`make bytecode` did that before), its dependencies not.
        sources_env = {**os.environ, "PYTHONPYCACHEPREFIX": rayk_only, "PYTHONDONTWRITEBYTECODE": "1"}
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(rayk.__file__).parent)],
                       env=sources_env, check=True)
        envs = {
            "sources": sources_env,
            "bytecode": {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"},
        }
        for round_ in range(args.rounds):
            for mode, env in envs.items():
                figures[mode]["imports"].append(children_cpu_s(IMPORTS, env))
                figures[mode]["cluster"].append(children_cpu_s(CLUSTER_LIFE, env))
                print(f"  round {round_ + 1} {mode:<9} imports {figures[mode]['imports'][-1]:.2f} CPU-s, "
                      f"cluster's life {figures[mode]['cluster'][-1]:.2f} CPU-s", flush=True)
    print()
    print(f"{'':<34} {'sources':>9} {'bytecode':>9} {'ratio':>7}")
    for what, label in (("imports", "a replica's imports, CPU-s"), ("cluster", "a 3-broker cluster's life, CPU-s")):
        src, pyc = (statistics.median(figures[m][what]) for m in ("sources", "bytecode"))
        print(f"{label:<34} {src:>9.2f} {pyc:>9.2f} {src / pyc:>6.2f}x")


if __name__ == "__main__":
    main()
