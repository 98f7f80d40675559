"""The figures a benchmark run printed, kept as data for benchmarks/plot.py to draw.

`record(bench, figures)` writes benchmarks/results/<bench>.json (the latest run of that
bench; an earlier one is in git's history):

    {
      "bench": "kafka_protocol_bench",
      "date": "2026-12-02T20:15:04Z",           # when the run ended, UTC
      "machine": {"cpus": 2, "cpu_model": "...", "memory_gib": 23.5, "kernel": "...",
                  "python": "3.11.2", "load_average": [1.2, 0.9, 0.7]},
      "commit": "c97d290...",                    # git HEAD of the checkout that ran it
      "rayk_uncommitted_changes": false,         # whether rayk/ differed from it
      "argv": ["--records", "1000000"],          # the options of the run
      "figures": {"produce_rec_s": {"Tansu": 597000.0, "rayk, 3 brokers, RF=3": 421767.0}, ...}
    }

`figures` maps a series' name to a number, or to {label: number} (one series, labelled
points); a number that is not finite (NaN: a yardstick that did not run) is written as
null. The load average is the machine's at the end of the run: the benchmarks share this
machine with other work, and their figures are best compared within one run.

`RAYK_BENCH_RESULTS=DIR` writes into DIR instead (a trial run that should not replace
the figures in git).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def commit() -> str | None:
    return git("rev-parse", "HEAD")


def rayk_changed() -> bool | None:
    """Whether rayk/ had changes not committed (the run measured more than the commit)."""
    status = git("status", "--porcelain", "--", "rayk")
    return None if status is None else bool(status)


def _plain(value: Any) -> Any:
    """JSON-ready: numbers as floats or ints (not finite: None), mappings and lists walked."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    number = float(value)
    return round(number, 6) if math.isfinite(number) else None


def record(bench: str, figures: dict, *, directory: Path | str | None = None) -> Path:
    """Writes `figures` of the run of `bench` (the script's name without .py) with the
    date, the machine, the commit and the options; returns the file written."""
    directory = Path(directory or os.environ.get("RAYK_BENCH_RESULTS") or RESULTS_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": bench,
        "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "machine": machine(),
        "commit": commit(),
        "rayk_uncommitted_changes": rayk_changed(),
        "argv": sys.argv[1:],
        "figures": _plain(figures),
    }
    path = directory / f"{bench}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"figures written to {path}")
    return path
