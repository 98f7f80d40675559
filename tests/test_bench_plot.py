"""benchmarks/results.py writes what benchmarks/plot.py reads, and plot.py draws every plot
from such files (synthetic figures, shaped as each bench records them), the same bytes
when drawn again."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("matplotlib")

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def script(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module of its own name (benchmarks/ is no package, and not
    put on sys.path, where its generic module names would shadow others)."""
    spec = importlib.util.spec_from_file_location(f"rayk_benchmarks_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plot = script("plot")
results = script("results")

BROKERS = ["Tansu (memory)", "Apache Kafka 4.1.1, RF=3", "rayk, 3 brokers, RF=3", "rayk, 1 broker, RF=1"]


def per_broker(*values: float) -> dict[str, float]:
    return dict(zip(BROKERS, values))


FIGURES = {
    "kafka_protocol_bench": {
        "records": 1000, "value_bytes": 100, "rate": 1000, "latency_records": 200, "single_requests": 30,
        "produce_rec_s": per_broker(600e3, 200e3, 400e3, 500e3),
        "produce_mb_s": per_broker(60, 20, 40, 50),
        "consume_rec_s": per_broker(1.5e6, 1.6e6, 1.7e6, float("nan")),  # a NaN: written as null, drawn n/a
        "consume_mb_s": per_broker(150, 160, 170, 180),
        "cold_consume_rec_s": per_broker(1e5, 2e5, 3e5, 4e5),
        "ack_p50_ms": per_broker(0.5, 3, 1, 0.8), "ack_p99_ms": per_broker(2, 20, 10, 5),
        "e2e_p50_ms": per_broker(1, 80, 1.4, 1.2), "e2e_p99_ms": per_broker(5, 160, 21, 9),
        "single_p50_ms": per_broker(0.3, 2, 0.66, 0.5), "single_p99_ms": per_broker(1, 5, 3, 2),
    },
    "client_bench": {
        "records": 1000, "record_bytes": 100, "partitions": 3,
        "produce_rec_s": {"rayk send()": 5e5, "rayk send_batch()": 1.7e6, "confluent-kafka -> Tansu": 7e5,
                          "Ray Queue, batched": 3e5},
        "consume_rec_s": {"rayk poll()": 1.7e6, "rayk iteration": 2.5e6, "rayk poll_batch()": 7.5e6,
                          "Tansu -> confluent-kafka": 1.6e6, "Ray Queue, batched": 2e5},
        "low_load_rate": 5e4,
        "low_load_ack_ms": {"p50": 1, "p95": 2, "p99": 3, "p99.9": 9},
        "low_load_e2e_ms": {"p50": 2, "p95": 3, "p99": 5, "p99.9": 12},
    },
    "tail_bench": {
        "rounds": 2, "round_records": 100, "rate": 1000, "replica_processes": 54,
        "e2e_p50_ms": {"Ray's node processes running": 1.5, "Ray's node processes paused": 1.4},
        "e2e_p99_ms": {"Ray's node processes running": 20, "Ray's node processes paused": 8},
        "e2e_p999_ms": {"Ray's node processes running": 40, "Ray's node processes paused": 15},
        "records": {"Ray's node processes running": 100, "Ray's node processes paused": 100},
        "round_e2e_p50_ms": {"0 running": 1.5, "1 paused": 1.4},
        "round_e2e_p99_ms": {"0 running": 20, "1 paused": 8},
    },
    "capacity_bench": {
        "node": {"memory_gib": 23.5, "cores": 2.0, "brokers": 3},
        "capacity": {"replicas_per_node": 60, "by_cpu": 60, "by_memory": 378, "by_cpu_measured": 70,
                     "by_memory_measured": 300},
        "budget": {"cpu_share": 0.3, "memory_share": 0.8, "replica_idle_cpu_cores": 0.01,
                   "replica_node_memory_mib": 51},
        "fill": {"replicas": 60, "every_isr_full": True, "seconds": 32.0, "longest_heartbeat_gap_s": 6.8},
        "idle_cpu_pct_of_core": {"PartitionReplica (follower)": 0.81, "PartitionReplica (leader)": 0.93,
                                 "bare async Ray actor": 0.71, "replica at RF 3": 0.85},
        "uss_mib": {"PartitionReplica (follower)": 50, "PartitionReplica (leader)": 52, "bare async Ray actor": 58},
        "processes": {"PartitionReplica (follower)": 40, "PartitionReplica (leader)": 20, "bare async Ray actor": 20},
        "node_memory_used_per_process_mib": 61.0,
        "machine_busy_cores": 0.9,
        "window_s": 30.0,
    },
}


def test_record_writes_what_plot_reads(tmp_path: Path) -> None:
    path = results.record("kafka_protocol_bench", FIGURES["kafka_protocol_bench"], directory=tmp_path)
    assert path == tmp_path / "kafka_protocol_bench.json"
    run = json.loads(path.read_text())  # strict JSON: the NaN is null
    assert run["bench"] == "kafka_protocol_bench"
    assert run["date"].endswith("Z") and run["date"][:4].isdigit()
    assert run["machine"]["cpus"] >= 1 and run["machine"]["cpu_model"] and run["machine"]["python"]
    assert run["figures"]["consume_rec_s"]["rayk, 1 broker, RF=1"] is None
    assert run["rayk_uncommitted_changes"] in (True, False, None)
    assert run["figures"]["produce_rec_s"]["rayk, 3 brokers, RF=3"] == 400e3
    assert plot.load(tmp_path)["kafka_protocol_bench"] == run
    assert "kafka_protocol_bench, run of" in plot.caption(run)


def test_plot_draws_every_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYK_BENCH_RESULTS", str(tmp_path / "results"))
    for bench, figures in FIGURES.items():
        results.record(bench, figures)  # into RAYK_BENCH_RESULTS
    out = tmp_path / "img"
    drawn = plot.draw(tmp_path / "results", out)
    names = sorted(p.name for p in drawn)
    assert names == ["capacity.svg", "client.svg", "latency.svg", "tail.svg", "throughput.svg"]
    first = {p.name: p.read_bytes() for p in drawn}
    for svg in first.values():
        assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg
    plot.draw(tmp_path / "results", out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first  # deterministic


def test_plot_skips_benches_without_results(tmp_path: Path) -> None:
    results.record("tail_bench", FIGURES["tail_bench"], directory=tmp_path)
    assert [p.name for p in plot.draw(tmp_path, tmp_path / "img")] == ["tail.svg"]
