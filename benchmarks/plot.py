"""Draws the figures the benchmarks recorded (benchmarks/results/*.json, written by
benchmarks/results.py) as SVG into docs/performance/img/, for the Performance page:

- throughput.svg, from kafka_protocol_bench: produce and consume records/s over Kafka's
  protocol, rayk's listener against Apache Kafka and Tansu;
- latency.svg, from kafka_protocol_bench: acknowledgement, end-to-end and one-request
  latency, p50 and p99, per broker;
- client.svg, from client_bench: rayk's Python client's ways to produce and consume
  against confluent-kafka with Tansu and a batched Ray Queue;
- tail.svg, from tail_bench: end-to-end p50 / p99 / p99.9 at 1,000 records/s with Ray's
  per-node processes running and paused;
- capacity.svg, from capacity_bench: replicas per node against the idle CPU and the
  memory they take, with the budget each is held to and the capacity the brokers derive.

A plot whose bench has no results file is left as it is. Each plot carries the run's
date, machine, commit and options. Drawing again from the same files gives the same bytes
(svg.hashsalt fixed, no date in the SVG's metadata).

    .venv/bin/python benchmarks/plot.py [--results DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
OUT_DIR = HERE.parent / "docs" / "performance" / "img"

RAYK = "#1f5fa8"
RAYK_LIGHT = "#7fa7d6"
KAFKA = "#444444"
TANSU = "#d9822b"
QUEUE = "#8a8a8a"


def style() -> None:
    plt.rcParams.update({
        "svg.hashsalt": "rayk-bench",  # the ids in the SVG, the same from one drawing to the next
        "svg.fonttype": "none",  # text as text: a smaller file, and searchable
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "axes.grid.axis": "y",
        "grid.alpha": 0.3,
        "figure.dpi": 100,
    })


def color(label: str) -> str:
    lowered = label.lower()
    if "tansu" in lowered:
        return TANSU
    if "kafka" in lowered and "rayk" not in lowered:
        return KAFKA
    if "queue" in lowered:
        return QUEUE
    if "rf=1" in lowered:
        return RAYK_LIGHT
    return RAYK


def load(results_dir: Path) -> dict[str, dict[str, Any]]:
    """bench name -> its recorded run."""
    runs = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        run = json.loads(path.read_text())
        runs[run.get("bench", path.stem)] = run
    return runs


def caption(run: dict[str, Any]) -> str:
    """The run's date, machine, commit and options, for under a plot."""
    m = run.get("machine", {})
    date = run.get("date", "?").replace("T", " ").replace("Z", " UTC")
    load_avg = m.get("load_average") or []
    options = " ".join(run.get("argv") or []) or "default options"
    commit = (run.get("commit") or "?")[:9] + (" + uncommitted changes" if run.get("rayk_uncommitted_changes") else "")
    return (f"{run.get('bench', '?')}, run of {date} (commit {commit}; {options})\n"
            f"{m.get('cpus', '?')} x {m.get('cpu_model', '?')}, {m.get('memory_gib', '?')} GiB, {m.get('kernel', '?')}, "
            f"Python {m.get('python', '?')}; load average {' / '.join(f'{x:g}' for x in load_avg) or '?'} "
            "(1 / 5 / 15 min) at its end")


def finish(fig: Any, run: dict[str, Any], path: Path) -> Path:
    fig.text(0.01, 0.005, caption(run), fontsize=7, color="#555555", ha="left", va="bottom")
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    return path


def value_labels(ax: Any, bars: Any, values: list[float | None], fmt: Callable[[float], str]) -> None:
    for bar, value in zip(bars, values):
        text = "n/a" if value is None else fmt(value)
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=6.5)


def legend_above(ax: Any, columns: int) -> None:
    """The legend in a row between the title and the bars, clear of both."""
    ax.legend(frameon=False, fontsize=8, ncol=columns, loc="lower center", bbox_to_anchor=(0.5, 1.0))


def grouped_bars(ax: Any, groups: list[str], series: dict[str, list[float | None]], fmt: Callable[[float], str],
                 colors: dict[str, str] | None = None, hatches: dict[str, str] | None = None) -> None:
    """Bars of each series side by side in each group; a missing value (None) is marked n/a."""
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [0 if v is None else v for v in values]
        bars = ax.bar(xs, heights, width * 0.92, label=label, color=(colors or {}).get(label, color(label)),
                      hatch=(hatches or {}).get(label))
        value_labels(ax, bars, values, fmt)
    ax.set_xticks(range(len(groups)), groups)


def thousands(value: float) -> str:
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k"


def ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def throughput(run: dict[str, Any], out: Path) -> Path:
    f = run["figures"]
    brokers = list(f["produce_rec_s"])
    fig, ax = plt.subplots(figsize=(8, 4.8))
    fig.subplots_adjust(bottom=0.19, top=0.8)
    grouped_bars(ax, ["produce", "consume"], {b: [f["produce_rec_s"][b], f["consume_rec_s"][b]] for b in brokers},
                 thousands)
    ax.set_ylabel("records/s")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: thousands(v) if v else "0"))
    ax.set_title(f"Kafka protocol throughput: {f.get('records', 0):,} records of {f.get('value_bytes', '?')} B, acks=all, "
                 "3 partitions,\nconfluent-kafka producer (batch.size 1 MiB, linger.ms 5) and consumer", pad=24)
    legend_above(ax, len(brokers))
    return finish(fig, run, out / "throughput.svg")


def latency(run: dict[str, Any], out: Path) -> Path:
    f = run["figures"]
    brokers = list(f["e2e_p50_ms"])
    groups = [("ack\np50", "ack_p50_ms"), ("ack\np99", "ack_p99_ms"),
              ("end to end\np50", "e2e_p50_ms"), ("end to end\np99", "e2e_p99_ms"),
              ("one request\np50", "single_p50_ms"), ("one request\np99", "single_p99_ms")]
    fig, ax = plt.subplots(figsize=(10, 5))
    fig.subplots_adjust(bottom=0.2, top=0.8)
    grouped_bars(ax, [g for g, _ in groups], {b: [f[key][b] for _, key in groups] for b in brokers}, ms)
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 2)  # room for the labels over the tallest bars
    ax.set_ylabel("ms (log scale)")
    ax.set_title(f"Latency at {f.get('rate', 0):,} records/s ({f.get('latency_records', 0):,} records, linger.ms 0, "
                 f"acks=all): the producer's acknowledgement,\nsend to a consumer's poll (end to end), and one "
                 f"produce at a time ({f.get('single_requests', 0):,} of them)", pad=24)
    legend_above(ax, len(brokers))
    return finish(fig, run, out / "latency.svg")


def client(run: dict[str, Any], out: Path) -> Path:
    f = run["figures"]
    fig, (produce_ax, consume_ax) = plt.subplots(1, 2, figsize=(9.5, 4.4))
    fig.subplots_adjust(bottom=0.2, top=0.86, wspace=0.75, left=0.2, right=0.95)
    for ax, key, title in ((produce_ax, "produce_rec_s", "produce"), (consume_ax, "consume_rec_s", "consume")):
        labels = list(f[key])
        values = [f[key][k] for k in labels]
        bars = ax.barh(range(len(labels)), [v or 0 for v in values], color=[color(k) for k in labels])
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        ax.grid(axis="y", visible=False)
        for bar, value in zip(bars, values):
            ax.annotate("n/a" if value is None else thousands(value), (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                        xytext=(2, 0), textcoords="offset points", va="center", fontsize=7)
        ax.set_xlim(0, 1.2 * max([v for v in values if v is not None] or [1]))  # room for the labels
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: thousands(v) if v else "0"))
        ax.set_xlabel("records/s")
        ax.set_title(title)
    fig.suptitle(f"rayk's Python client, {f.get('records', 0):,} records of {f.get('record_bytes', '?')} B, "
                 f"acks=all, RF=3, {f.get('partitions', '?')} partitions")
    return finish(fig, run, out / "client.svg")


def tail(run: dict[str, Any], out: Path) -> Path:
    f = run["figures"]
    conditions = list(f["e2e_p50_ms"])
    groups = [("p50", "e2e_p50_ms"), ("p99", "e2e_p99_ms"), ("p99.9", "e2e_p999_ms")]
    rounds = list(f.get("round_e2e_p99_ms") or {})
    fig, axes = plt.subplots(1, 2 if rounds else 1, figsize=(10 if rounds else 7, 4.6), squeeze=False)
    pooled_ax = axes[0][0]
    fig.subplots_adjust(bottom=0.19, top=0.76, wspace=0.25)
    colors = {c: RAYK if "running" in c else RAYK_LIGHT for c in conditions}
    grouped_bars(pooled_ax, [g for g, _ in groups], {c: [f[key][c] for _, key in groups] for c in conditions}, ms,
                 colors)
    pooled_ax.set_ylabel("end to end, ms")
    pooled_ax.set_title("pooled over the rounds of each kind", pad=24)
    legend_above(pooled_ax, len(conditions))
    if rounds:
        ax = axes[0][1]
        p99 = [f["round_e2e_p99_ms"][r] for r in rounds]
        ax.bar(range(len(rounds)), [v or 0 for v in p99], color=[RAYK if "running" in r else RAYK_LIGHT for r in rounds],
               label="p99")
        ax.plot(range(len(rounds)), [f["round_e2e_p50_ms"].get(r) for r in rounds], "o", color=KAFKA, ms=4, label="p50")
        ax.set_xticks(range(len(rounds)), [r.split()[0] for r in rounds])
        ax.set_yscale("log")
        ax.set_xlabel("round (dark: running, light: paused)")
        ax.set_ylabel("end to end, ms (log scale)")
        ax.set_title("each round, in the order run", pad=24)
        legend_above(ax, 2)
    fig.suptitle(f"rayk end to end at {f.get('rate', 0):,} records/s: {f.get('rounds', 0)} alternating rounds of "
                 f"{f.get('round_records', 0):,} records,\nRay's per-node processes running or paused (SIGSTOP); "
                 f"3 brokers, RF=3, {f.get('replica_processes', '?')} replica processes")
    return finish(fig, run, out / "tail.svg")


def capacity(run: dict[str, Any], out: Path) -> Path:
    """Idle CPU and memory of n replicas on the node: the per-replica figures measured with
    the node filled, times n; the budgets and the derived capacity as lines."""
    f = run["figures"]
    node, cap, budget, fill = f["node"], f["capacity"], f["budget"], f["fill"]
    cpu_each = f["idle_cpu_pct_of_core"]
    replica_cpu = cpu_each["replica at RF 3"] / 100
    bare_cpu = (cpu_each.get("bare async Ray actor") or 0) / 100
    memory_each = f["node_memory_used_per_process_mib"] / 1024
    per_node = cap["replicas_per_node"]
    fig, (cpu_ax, mem_ax) = plt.subplots(1, 2, figsize=(9, 4.4))
    fig.subplots_adjust(bottom=0.22, top=0.8, wspace=0.3)

    cpu_budget = budget["cpu_share"] * node["cores"]
    top = max(2 * per_node, fill["replicas"] * 1.2, 10)
    xs = [0, top]
    cpu_ax.plot(xs, [0, top * replica_cpu], color=RAYK, label=f"replicas, {100 * replica_cpu:.2f}% of a core each")
    if bare_cpu:
        cpu_ax.plot(xs, [0, top * bare_cpu], color=QUEUE, ls="--", label=f"bare Ray actors, {100 * bare_cpu:.2f}% each")
    cpu_ax.plot(xs, [0, top * budget["replica_idle_cpu_cores"]], color=RAYK, lw=0.8, ls=":",
                label=f"the capacity's constant, {budget['replica_idle_cpu_cores']:.0%} of a core each")
    cpu_ax.scatter([fill["replicas"]], [fill["replicas"] * replica_cpu], color=RAYK, zorder=3,
                   label=f"measured: {fill['replicas']} replicas idle")
    cpu_ax.axhline(cpu_budget, color=TANSU, lw=1, label=f"budget: {budget['cpu_share']:.0%} of {node['cores']:g} cores")
    cpu_ax.axvline(per_node, color=KAFKA, lw=1, ls=":", label=f"capacity: {per_node} per node")
    cpu_ax.set_ylim(0, 1.7 * top * max(replica_cpu, budget["replica_idle_cpu_cores"]))
    cpu_ax.set_xlabel("replicas on the node")
    cpu_ax.set_ylabel("idle CPU, cores")
    cpu_ax.set_title("idle CPU")
    cpu_ax.legend(frameon=False, fontsize=7, loc="upper left")

    memory_budget = budget["memory_share"] * node["memory_gib"]
    top = max(cap["by_memory"], cap.get("by_memory_measured") or 0) * 1.15
    xs = [0, top]
    mem_ax.plot(xs, [0, top * memory_each], color=RAYK,
                label=f"node memory used, {1024 * memory_each:.0f} MiB per replica")
    mem_ax.plot(xs, [0, top * budget["replica_node_memory_mib"] / 1024], color=RAYK, lw=0.8, ls=":",
                label=f"the capacity's constant, {budget['replica_node_memory_mib']:.0f} MiB each")
    mem_ax.scatter([fill["replicas"]], [fill["replicas"] * memory_each], color=RAYK, zorder=3,
                   label=f"measured: {fill['replicas']} replicas idle")
    mem_ax.axhline(memory_budget, color=TANSU, lw=1,
                   label=f"budget: {budget['memory_share']:.0%} of {node['memory_gib']:.1f} GiB")
    mem_ax.axvline(per_node, color=KAFKA, lw=1, ls=":", label=f"capacity: {per_node} per node (by CPU)"
                   if cap.get("by_cpu") is not None and cap["by_cpu"] <= cap["by_memory"] else f"capacity: {per_node}")
    mem_ax.axvline(cap["by_memory"], color=KAFKA, lw=1, ls="--", label=f"by memory alone (constant): {cap['by_memory']}")
    mem_ax.set_ylim(0, 1.7 * top * max(memory_each, budget["replica_node_memory_mib"] / 1024))
    mem_ax.set_xlabel("replicas on the node")
    mem_ax.set_ylabel("memory, GiB")
    mem_ax.set_title("memory")
    mem_ax.legend(frameon=False, fontsize=7, loc="upper left")
    fig.suptitle(f"Replicas per node: {node['brokers']} brokers on {node['cores']:g} cores and "
                 f"{node['memory_gib']:.1f} GiB; per-replica figures measured\nwith the node filled to "
                 f"{fill['replicas']} replicas, no traffic, over {f.get('window_s', 0):g} s, times the replicas")
    return finish(fig, run, out / "capacity.svg")


PLOTS: dict[str, list[Callable[[dict[str, Any], Path], Path]]] = {
    "kafka_protocol_bench": [throughput, latency],
    "client_bench": [client],
    "tail_bench": [tail],
    "capacity_bench": [capacity],
}


def draw(results_dir: Path = RESULTS_DIR, out_dir: Path = OUT_DIR) -> list[Path]:
    """Every plot whose bench has a results file in `results_dir`, into `out_dir`."""
    style()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = []
    runs = load(Path(results_dir))
    for bench, plots in PLOTS.items():
        if bench not in runs:
            print(f"no results of {bench} in {results_dir}: its plots are left as they are")
            continue
        for plot in plots:
            drawn.append(plot(runs[bench], out_dir))
    return drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    for path in draw(args.results, args.out):
        print(f"drew {path}")


if __name__ == "__main__":
    main()
