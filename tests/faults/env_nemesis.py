"""The environment nemesis (issue 68, item 5): env_schedule.py's seeded schedules of
network, disk and clock faults, mixed with process faults, run on a multi-host cluster of
network namespaces (netns_cluster.py) under nemesis.py's Workload, with its checks; and
`python -m tests.faults.env_nemesis`, which `make chaos` runs, a netns cluster per seed.

    .venv/bin/python -m tests.faults.env_nemesis --seed 1 --count 3   # seeds 1, 2, 3
    .venv/bin/python -m tests.faults.env_nemesis --seed 2 --count 1   # replays seed 2

Each seed runs as the driver of a netns cluster of its own (`run_seed`, in the client's
namespace): rayk's Controller on the head, a broker on each of three nodes, RF=3 and
min.insync.replicas=2, FAILING_DISK_NODE's disk through failing_fs.py, and each broker
node's wall clock under libfaketime (fake_clock.py) where Debian's libfaketime is
installed (without it, a drawn clock step is skipped and the report says so). The
`EnvNemesis` is nemesis.Nemesis with the netns cluster's faults: each environment fault is
resolved against the live cluster (a partition's leader, the node of a broker), applied,
held for its duration and healed; process faults go to Nemesis.apply (pids are those of
one PID namespace: the netns cluster's). The Workload is nemesis.py's whole: the
idempotent producer, the consumer group and its observer, the rayk.data.stream_topic
pipeline (its Ray Data tasks take a broker node's CPU or the head's: each has 1, and the
read tasks prefer their leader's node), the transactional producer and the share group;
and so are its checks (every acknowledged record stored exactly once at its offset, the
group's, the pipeline's, the transactions' and the share group's checks) and the cluster
healthy within nemesis.HEAL_BOUND_S of the last fault. Each network or disk fault notes
how long after its heal the cluster was whole again.

A seed's whole output (its steps, a Timeline line a second and, if it failed, the end of
the Controller's and the brokers' logs) is kept in LOG_DIR/env-nemesis-seed-<seed>.log, and a
failed one's also under a name of its own that its replays do not overwrite
(env-nemesis-seed-<seed>-failed-<time>.log); a failed seed prints the command that replays it. A netns cluster that does not start (Ray's
fixed 30 s for a node, on a busy machine) is started again, as chaos.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.faults import nemesis as nm
from tests.faults import netns_cluster as nc
from tests.faults.chaos import STARTUP_ATTEMPTS, STARTUP_RETRY_S
from tests.faults.env_schedule import (
    CLOCK_STEP, CUT_LEADER, DISK_FAILING, DISK_FULL, ENV_BROKERS, ENV_CONTROL, ENV_DOWN, FLAP_DOWN_S,
    FLAP_LINK, FLAP_UP_S, ISOLATE_BROKER, MAX_ENV_FAULTS, MIN_ENV_FAULTS, ONE_WAY, SLOW_LINK, SLOW_LINK_MS, EnvFault,
    EnvSchedule, draw_env_schedule,
)  # fmt: skip

BROKER_NODES = [node for node in nc.ADDRESSES if node not in (nc.HEAD, nc.CLIENT)]
# rayk's nemesis settings, but no broker is replaced: there is no spare node to move to.
ENV_CONFIG = {**nm.NEMESIS_CONFIG, "broker.replacement.delay.ms": -1}
SEED_TIMEOUT_S = 15 * 60  # a seed takes 4-7 minutes; past this its namespace is killed
LOG_DIR = Path(tempfile.gettempdir())
REPORT_PREFIX = "ENV-NEMESIS| "  # the driver's report lines, for the runner outside to print
RESULT_PREFIX = "ENV-NEMESIS-RESULT "  # then its figures, in JSON
RUNNING_STEP = "env nemesis: running "  # the driver's first step: the cluster started


class EnvNemesis(nm.Nemesis):
    """nemesis.Nemesis on the netns cluster, with the environment's faults (see the module
    docstring). Runs in the driver of a netns cluster."""

    def __init__(self, schedule: EnvSchedule) -> None:
        super().__init__(None, nc.DATA_DIR, schedule, log=nc.log)  # type: ignore[arg-type]
        self.rng = random.Random(f"env-nemesis-targets-{schedule.seed}")
        self.net = nc.Network()
        self.timeline: nc.Timeline | None = None
        self.whole_again: WholeAgain | None = None  # measuring the last network or disk fault's healing
        self.clock_files = json.loads(os.environ.get(nc.NODE_ENV_VAR, "{}"))  # the nodes under libfaketime

    def run(self) -> nm.Report:
        try:
            return super().run()
        finally:
            if self.timeline is not None:
                self.timeline.stop()

    def start_cluster(self, namespace: str) -> Any:
        return nc.start_rayk(namespace, brokers=ENV_BROKERS, config=ENV_CONFIG)

    def live_brokers(self) -> set[int]:
        return set(range(ENV_BROKERS)) - self.gone

    def node_of(self, broker: int) -> str:
        return nm.ask(lambda: nc.broker_node_of(self.cluster, broker), f"the node of broker {broker}")

    # ------------------------------------------------------------------ the faults

    def apply(self, fault: EnvFault) -> str:  # type: ignore[override]  # an EnvFault, not a nemesis.Fault
        if self.timeline is None and self.workload is not None:  # the workload's traffic exists from the first fault
            self.timeline = nc.Timeline(self.cluster, self.workload.traffic)
        if fault.kind not in ENV_DOWN | ENV_CONTROL:
            return super().apply(nm.Fault(fault.kind, fault.partition, fault.pick, fault.gap_ms, fault.barrier))
        nc.log(f"env nemesis: {fault} begins")  # its line in the report comes once it is healed
        try:
            done = self.apply_environment(fault)
        finally:
            self.heal_everything()  # also when the fault failed half-way: the next one finds the cluster as it was
        if fault.kind in ENV_DOWN:  # (a process fault's copy leaves the ISR after it is applied: no figure)
            self.whole_again = WholeAgain(self, done)
            self.whole_again.start()
        return done

    def wait_healthy(self, when: str) -> None:
        super().wait_healthy(when)
        if self.whole_again is not None:  # healthy now, if its thread did not see it first (slow answers)
            self.whole_again.record("within ")

    def apply_environment(self, fault: EnvFault) -> str:
        """Applies one environment fault, holds it for its duration and heals it; what it did."""
        state = self.partition_state(fault.partition)
        leader, replicas, hold_s = state["leader"], nm.target_replicas(state), fault.duration_ms / 1000
        broker = replicas[fault.pick % len(replicas)]
        if fault.kind in (CUT_LEADER, ONE_WAY, FLAP_LINK):
            node = self.node_of(leader)
            others = [n for n in nc.ADDRESSES if n not in (node, nc.CLIENT)]  # the head and the other brokers
            if fault.kind == FLAP_LINK:
                flaps = flap(self.net, node, others, hold_s)
                done = f"broker {leader} ({node}, partition {fault.partition}'s leader)'s link to {others} flapped {flaps} times"
            else:
                self.net.cut(node, others, inbound=fault.kind == CUT_LEADER)
                time.sleep(hold_s)
                how = "cut from" if fault.kind == CUT_LEADER else "sending nothing to"
                done = f"broker {leader} ({node}, partition {fault.partition}'s leader) {how} {others} for {hold_s:.0f} s"
            return done + self.revived(leader, node)
        if fault.kind == ISOLATE_BROKER:
            node = self.node_of(broker)
            self.net.isolate(node)
            time.sleep(hold_s)
            return f"broker {broker} ({node}) isolated from every node for {hold_s:.0f} s" + self.revived(broker, node)
        if fault.kind == SLOW_LINK:
            followers = [b for b in replicas if b != leader] or [broker]
            follower = followers[fault.pick % len(followers)]
            node, follower_node = self.node_of(leader), self.node_of(follower)
            self.net.delay(node, follower_node, SLOW_LINK_MS)
            self.net.delay(follower_node, node, SLOW_LINK_MS)
            time.sleep(hold_s)
            return f"{SLOW_LINK_MS} ms each way between leader {leader} ({node}) and follower {follower} for {hold_s:.0f} s"
        if fault.kind == DISK_FULL:
            node = self.node_of(broker)
            nc.resize_disk(node, nc.disk_used_bytes(node) + (64 << 10))
            time.sleep(hold_s)
            return f"broker {broker}'s disk ({node}) full for {hold_s:.0f} s"
        if fault.kind == DISK_FAILING:
            return self.fail_disk(fault.variant, hold_s)
        if fault.kind == CLOCK_STEP:
            node = self.node_of(broker)
            if node not in self.clock_files:
                return f"clock step {fault.variant} of {node} skipped: its processes are not under libfaketime"
            from tests.faults import fake_clock

            fake_clock.step(node, fault.variant)
            read_s = wall_clock_offset_s(node)
            time.sleep(hold_s)
            fake_clock.step(node, "+0")
            return (f"broker {broker}'s wall clock ({node}) stepped {fault.variant} (a task there read {read_s:+.0f} s) "
                    f"for {hold_s:.0f} s, then back")  # fmt: skip
        raise AssertionError(f"unknown fault {fault.kind}")

    def fail_disk(self, ops: str, hold_s: float) -> str:
        if not os.environ.get(nc.FAILING_DISK_VAR):
            return f"disk failing {ops} skipped: the cluster runs without failing_fs.py"
        broker = next(b["broker_id"] for b in self.cluster.brokers()
                      if self.node_of(b["broker_id"]) == nc.FAILING_DISK_NODE)  # fmt: skip
        nc.fail_disk(tuple(ops.split(",")))
        if ops == "read":  # only reads the page cache cannot serve reach the disk
            Path("/proc/sys/vm/drop_caches").write_text("1")
        time.sleep(hold_s)
        return f"broker {broker}'s disk ({nc.FAILING_DISK_NODE}) failing {ops} with EIO for {hold_s:.0f} s"

    def heal_everything(self) -> None:
        """Every link back, every disk with room and working, every clock at the real time."""
        self.net.heal_all()
        for node in BROKER_NODES:
            nc.resize_disk(node, nc.NODE_DISK_BYTES)
        if os.environ.get(nc.FAILING_DISK_VAR):
            nc.fail_disk(())
        if self.clock_files:
            from tests.faults import fake_clock

            for node in self.clock_files:
                fake_clock.step(node, "+0")

    def revived(self, broker: int, node: str) -> str:
        """Once a cut is healed: if Ray declared `node` dead meanwhile (a cut is drawn shorter
        than that, but a loaded machine is slow), Ray started on it again and its broker
        restarted, as its supervisor and operator would; what was done, in words."""
        if node in nc.node_ids():
            return ""
        nc.restart_node(node)
        nm.ask(lambda: self.cluster.restart_broker(broker), f"restarting broker {broker}", 120)
        return f"; Ray declared {node} dead: started again, broker {broker} restarted"


class WholeAgain(threading.Thread):
    """Notes how long after an environment fault that may take a copy away was healed the
    cluster was healthy again (every partition led with its full ISR, every broker back):
    each fault's figure. While a later fault cuts a broker off, each look at the cluster
    takes seconds (the Controller's calls to it time out), so the next barrier that finds
    the cluster healthy records it first if this thread has not (an upper bound: "within").
    Gives up at nemesis.HEAL_BOUND_S (the next barrier fails the run then)."""

    def __init__(self, nemesis: EnvNemesis, fault: str) -> None:
        super().__init__(daemon=True, name="env-nemesis-whole-again")
        self.nemesis, self.fault, self.started = nemesis, fault, time.monotonic()
        self._lock = threading.Lock()
        self._recorded = False

    def record(self, bound: str = "") -> None:
        with self._lock:
            if self._recorded:
                return
            self._recorded = True
        self.nemesis.notes.append(f"whole {bound}{time.monotonic() - self.started:.1f} s after healing: {self.fault}")

    def run(self) -> None:
        while not self._recorded and time.monotonic() - self.started < nm.HEAL_BOUND_S:
            try:
                if not self.nemesis.unhealthy():
                    self.record()
                    return
            except Exception:
                pass  # the Controller is restarting: ask again
            time.sleep(0.5)


def wall_clock_offset_s(node: str) -> float:
    """How far ahead of the driver's wall clock a Ray task on `node` reads it: that a step
    took (a task runs under the node's libfaketime as its broker does)."""
    import ray

    from rayk.server.broker_placement import pinned

    @ray.remote(num_cpus=0)
    def read_clock() -> float:
        return time.time()

    before = time.time()
    return ray.get(read_clock.options(scheduling_strategy=pinned(nc.node_ids()[node])).remote(), timeout=60) - before


def flap(net: nc.Network, node: str, peers: list[str], for_s: float) -> int:
    """`node`'s link to `peers` down FLAP_DOWN_S, up FLAP_UP_S, for `for_s`; the outages."""
    t0, flaps = time.monotonic(), 0
    while time.monotonic() - t0 < for_s:
        net.cut(node, peers)
        flaps += 1
        time.sleep(FLAP_DOWN_S)
        net.heal(node)
        time.sleep(FLAP_UP_S)
    return flaps


# ---------------------------------------------------------------------------- the driver, inside


def run_seed(seed: str, max_faults: str = str(MAX_ENV_FAULTS), only: str = "") -> None:
    """The scenario netns_cluster's driver calls: one schedule, its report on stdout."""
    schedule = draw_env_schedule(int(seed), int(max_faults))
    if only:
        schedule = schedule.reduced(tuple(int(n) for n in only.split(",")))
    nc.log(f"{RUNNING_STEP}{schedule}")
    report = EnvNemesis(schedule).run()
    if not report.ok:  # what the Controller and the brokers said, for the seed's log
        print(nc.actor_logs(tail_chars=20_000), flush=True)
    for line in report.lines():
        print(REPORT_PREFIX + line, flush=True)
    figures = {"ok": report.ok, "faults": len(schedule.faults), "acknowledged": report.acknowledged,
               "records_checked": report.records_checked, "seconds": round(report.seconds),
               "first_failure": report.failures[0][:300] if report.failures else ""}  # fmt: skip
    print(RESULT_PREFIX + json.dumps(figures), flush=True)


# ---------------------------------------------------------------------------- the runner, outside


def missing_requirements() -> str:
    """What this machine lacks to run a netns cluster with a failing disk ("" if nothing)."""
    if os.geteuid() != 0:
        return "needs root"
    missing = [tool for tool in nc.TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)}"
    return "" if os.path.exists("/dev/fuse") else "needs /dev/fuse"


def clock_env(directory: Path) -> dict[str, dict[str, str]] | None:
    """The broker nodes under libfaketime if it is installed (fake_clock.py), else None."""
    from tests.faults import fake_clock

    if not fake_clock.LIBFAKETIME.exists() or shutil.which("cc") is None:
        print(f"env nemesis: no libfaketime ({fake_clock.LIBFAKETIME}): clock steps are skipped", flush=True)
        return None
    return fake_clock.node_env(BROKER_NODES, directory)


def run_in_netns(seed: int, max_faults: int, only: str, node_env: dict | None) -> str:
    """`run_seed` as the driver of a netns cluster of its own; its output. A cluster that did
    not start (Ray's fixed 30 s for a node to start, on a busy machine) is started again,
    up to STARTUP_ATTEMPTS times, as chaos.py does."""
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        try:
            return nc.run("tests.faults.env_nemesis:run_seed", str(seed), str(max_faults), only,
                          timeout_s=SEED_TIMEOUT_S, node_env=node_env, failing_disk=True)  # fmt: skip
        except AssertionError as e:  # the driver crashed or ran out of time: no report
            output = str(e)
        if RUNNING_STEP in output or attempt == STARTUP_ATTEMPTS:
            return output
        print(f"env nemesis: the netns cluster did not start (attempt {attempt}); again in {STARTUP_RETRY_S} s",
              flush=True)  # fmt: skip
        time.sleep(STARTUP_RETRY_S)
    raise AssertionError("unreachable")


def run_one(seed: int, max_faults: int, only: str, node_env: dict | None) -> dict:
    """Runs seed `seed` on a netns cluster of its own; prints its report; its figures."""
    replay = draw_env_schedule(seed, max_faults)
    replay = replay.reduced(tuple(int(n) for n in only.split(","))) if only else replay
    print(f"env nemesis: running {replay}", flush=True)
    output = run_in_netns(seed, max_faults, only, node_env)
    log = LOG_DIR / f"env-nemesis-seed-{seed}.log"
    log.write_text(output)
    print("\n".join(line.removeprefix(REPORT_PREFIX) for line in output.splitlines() if line.startswith(REPORT_PREFIX)))
    result = next((json.loads(line.removeprefix(RESULT_PREFIX)) for line in output.splitlines()
                   if line.startswith(RESULT_PREFIX)), None)  # fmt: skip
    if result is None:
        result = {"ok": False, "faults": len(replay.faults), "acknowledged": 0, "records_checked": 0, "seconds": 0,
                  "first_failure": f"no report: {output[-300:]}"}  # fmt: skip
    if not result["ok"]:  # a rare failure's log outlives the replays that look for it
        kept = LOG_DIR / f"env-nemesis-seed-{seed}-failed-{time.strftime('%Y%m%dT%H%M%S')}.log"
        kept.write_text(output)
        log = kept
    print(f"  output: {log}", flush=True)
    return {**result, "seed": seed, "replay": replay.replay()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1, help="the first schedule's seed")
    parser.add_argument("--count", type=int, default=3, help="how many seeds, from --seed")
    parser.add_argument("--max-faults", type=int, default=MAX_ENV_FAULTS,
                        choices=range(MIN_ENV_FAULTS, MAX_ENV_FAULTS + 1))  # fmt: skip
    parser.add_argument("--only", default="", help="keep only these faults of the schedule (numbers from 1, e.g. 2,4)")
    args = parser.parse_args(argv)
    missing = missing_requirements()
    if missing:
        print(f"env nemesis: skipped ({missing}: a netns cluster with a failing disk)")
        return 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rayk-env-nemesis-") as clock_dir:
        node_env = clock_env(Path(clock_dir))
        seeds = range(args.seed, args.seed + args.count)
        results = [run_one(seed, args.max_faults, args.only, node_env) for seed in seeds]
    failed = [r for r in results if not r["ok"]]
    print(f"\nENV NEMESIS SUMMARY: {len(results)} schedules (seeds {args.seed}..{args.seed + args.count - 1}), "
          f"{sum(r['faults'] for r in results)} faults, {sum(r['records_checked'] for r in results)} records checked, "
          f"{(time.monotonic() - t0) / 60:.1f} minutes; {len(failed)} failed")  # fmt: skip
    for r in failed:
        print(f"  seed {r['seed']} FAILED: {r['first_failure']}\n    replay: {r['replay']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
