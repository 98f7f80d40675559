"""`make chaos SEED=... MINUTES=...`: runs nemesis schedules with seeds SEED, SEED+1, ...
until MINUTES have passed (or --count schedules ran), on one Ray cluster of a head and
BROKERS broker nodes, each schedule on a rayk cluster of its own; then prints a summary
(schedules, faults, records checked, minutes) and, per failed seed, the command that
replays it. Exits 1 if any schedule failed.

    .venv/bin/python -m tests.faults.chaos --seed 7 --minutes 30
    .venv/bin/python -m tests.faults.chaos --seed 7 --count 1      # replays seed 7
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

from tests.cluster_helpers import BROKER_RESOURCE, broker_node_cluster
from tests.faults.harness import abandon_running_traffic
from tests.faults.nemesis import BROKERS, MAX_FAULTS, MIN_FAULTS, Nemesis, Report, draw_schedule


STARTUP_ATTEMPTS = 3  # a raylet that does not register within Ray's fixed 30 s on a busy machine
STARTUP_RETRY_S = 30


def top_up_broker_nodes(ray_cluster) -> None:
    """Adds nodes until BROKERS live ones offer a broker's resource (a schedule removes nodes)."""
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        live = [n for n in ray_cluster.list_all_nodes() if n is not ray_cluster.head_node]
        try:
            for _ in range(BROKERS - len(live)):
                ray_cluster.add_node(num_cpus=1, resources={BROKER_RESOURCE: 1})
            ray_cluster.wait_for_nodes()
            return
        except Exception as e:
            if attempt == STARTUP_ATTEMPTS:
                raise
            print(f"chaos: adding a node failed ({e}); trying again in {STARTUP_RETRY_S} s", flush=True)
            time.sleep(STARTUP_RETRY_S)


@contextlib.contextmanager
def chaos_ray_cluster():
    """broker_node_cluster(BROKERS), tried again when a node does not start in time."""
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        started = broker_node_cluster(BROKERS)
        try:
            ray_cluster = started.__enter__()
            break
        except Exception as e:
            if attempt == STARTUP_ATTEMPTS:
                raise
            print(f"chaos: starting the Ray cluster failed ({e}); trying again in {STARTUP_RETRY_S} s", flush=True)
            time.sleep(STARTUP_RETRY_S)
    try:
        yield ray_cluster
    finally:
        started.__exit__(None, None, None)


def run_schedule(ray_cluster, data_dir: Path, seed: int, max_faults: int = MAX_FAULTS, only: tuple[int, ...] = ()) -> Report:
    top_up_broker_nodes(ray_cluster)
    schedule = draw_schedule(seed, max_faults)
    if only:
        schedule = schedule.reduced(only)
    print(f"nemesis: running {schedule}", flush=True)
    try:
        report = Nemesis(ray_cluster, data_dir, schedule, log=lambda line: print(line, flush=True)).run()
    finally:
        abandon_running_traffic()
    print("\n".join(report.lines()), flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1, help="the first schedule's seed")
    parser.add_argument("--minutes", type=float, default=10, help="start no schedule after this many minutes")
    parser.add_argument("--count", type=int, default=None, help="run at most this many schedules")
    parser.add_argument("--max-faults", type=int, default=MAX_FAULTS, choices=range(MIN_FAULTS, MAX_FAULTS + 1))
    parser.add_argument("--only", default="", help="keep only these faults of each schedule (numbers from 1, e.g. 2,5): to reduce a failure")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    reports: list[Report] = []
    with tempfile.TemporaryDirectory(prefix="rayk-chaos-") as tmp, chaos_ray_cluster() as ray_cluster:
        seed = args.seed
        while (args.count is None or len(reports) < args.count) and (
            not reports or time.monotonic() - t0 < args.minutes * 60
        ):
            only = tuple(int(n) for n in args.only.split(",") if n)
            reports.append(run_schedule(ray_cluster, Path(tmp) / f"seed-{seed}", seed, args.max_faults, only))
            seed += 1
    failed = [r for r in reports if not r.ok]
    print(
        f"\nCHAOS SUMMARY: {len(reports)} schedules (seeds {args.seed}..{args.seed + len(reports) - 1}), "
        f"{sum(len(r.schedule.faults) for r in reports)} faults, "
        f"{sum(r.records_checked for r in reports)} records checked, "
        f"{(time.monotonic() - t0) / 60:.1f} minutes; {len(failed)} failed"
    )
    for r in failed:
        print(f"  seed {r.schedule.seed} FAILED: {r.failures[0][:300]}\n    replay: {r.schedule.replay()}")
        print(f"    its faults: {r.schedule}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
