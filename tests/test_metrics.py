"""rayk's metrics on Ray's Prometheus endpoint, scraped over HTTP as Prometheus would.

The module starts a Ray of its own with a metrics export port on 127.0.0.1 (Ray's metrics
agent, part of ray[default], serves it; reports every second instead of every ten), a
rayk cluster of 3 brokers, produces through the Python client and a Kafka client,
consumes in a group, produces again, and then scrapes until what it did shows: records
and bytes in, produce and fetch requests, the listener's request times, the brokers'
leader and partition counts with nothing under-replicated, the Controller's gauges, log
sizes, and the group's lag. Gauges are refreshed every 5 s (rayk/metrics.py), so the
scrape waits a bounded while. Without Ray: how a leader's counts reach Ray's counters,
and that the Grafana dashboard charts every metric rayk/metrics.py names.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import confluent_kafka
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

import rayk
from rayk import metrics
from rayk.coordinator.group.group_coordinator import OFFSETS_TOPIC
from tests import readme
from tests.cluster_helpers import FAST_CONFIG, release_shared_local_ray

RUNS_ON = "own Ray"  # a Ray of its own: tests/conftest.py runs this module before those sharing the local one

TOPIC, GROUP = "metered", "metered-group"
PYTHON_RECORDS, KAFKA_RECORDS, LAGGING_RECORDS = 3000, 200, 70
PARTITIONS = 3
SCRAPE_TIMEOUT_S = 60
CONFIG = {**FAST_CONFIG, "group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 3}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def metrics_port():
    release_shared_local_ray()  # the shared one exports no metrics
    port = free_port()
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
        _metrics_export_port=port, _node_ip_address="127.0.0.1",
        _system_config={"metrics_report_interval_ms": 1000},
    )  # fmt: skip
    try:
        yield port
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def workload(metrics_port, tmp_path_factory):
    """A cluster that had PYTHON_RECORDS + KAFKA_RECORDS produced and consumed by GROUP, then
    LAGGING_RECORDS more that GROUP has not consumed."""
    cluster = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("metrics"), config=CONFIG, namespace="metrics-test")
    try:
        cluster.create_topic(TOPIC, num_partitions=PARTITIONS, replication_factor=3)
        with cluster.producer() as producer:
            # Round robin: sticky partitioning may leave a partition empty, and every replica's
            # log should have something to measure.
            values = [b"v%05d" % i for i in range(PYTHON_RECORDS)]
            producer.send_batch(TOPIC, values, partition=[i % PARTITIONS for i in range(PYTHON_RECORDS)]).result(timeout=60)
        kafka_producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
        for i in range(KAFKA_RECORDS):
            kafka_producer.produce(TOPIC, b"k%05d" % i)
        assert kafka_producer.flush(30) == 0, "every Kafka record acknowledged"
        consumer = cluster.consumer(TOPIC, group_id=GROUP, auto_offset_reset="earliest", consumer_timeout_ms=20_000)
        consumed = sum(1 for _ in zip(range(PYTHON_RECORDS + KAFKA_RECORDS), consumer))
        consumer.commit()
        consumer.close()
        assert consumed == PYTHON_RECORDS + KAFKA_RECORDS
        with cluster.producer() as producer:
            producer.send_batch(TOPIC, [b"late%03d" % i for i in range(LAGGING_RECORDS)]).result(timeout=60)
        yield cluster
    finally:
        cluster.shutdown()


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of the endpoint by sample name: (labels, value)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum over processes of a metric's samples with `labels`; fails (so that the
    scrape is tried again) while there are none."""
    found = [v for sample_labels, v in samples.get(name, []) if labels.items() <= sample_labels.items()]
    assert found, f"{name} {labels} is not exported yet"
    return sum(found)


def total_or_zero(samples: dict, name: str, **labels: str) -> float:
    """As `total`, for a counter that is exported only once something counted (failures)."""
    return sum(v for sample_labels, v in samples.get(name, []) if labels.items() <= sample_labels.items())


def exported(name: str, kind: str = "") -> str:
    """The name Ray serves a rayk metric under (`ray_` first; counters end in `_total`)."""
    return f"ray_{name}{kind}"


def scrape_until_checked(port: int, check: Callable[[dict], None]) -> None:
    """Scrapes until `check` passes on what the endpoint serves, for at most SCRAPE_TIMEOUT_S
    (Ray exports every second; rayk's gauges are set every 5 s), then fails as it does."""
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    while True:
        samples = scrape(port)
        try:
            check(samples)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(1)


def test_prometheus_endpoint_shows_what_the_cluster_did(workload, metrics_port):
    produced = PYTHON_RECORDS + KAFKA_RECORDS + LAGGING_RECORDS
    topics = {t: workload.describe_topic(t) for t in (TOPIC, OFFSETS_TOPIC)}
    leaders = sum(len(parts) for parts in topics.values())
    replicas = sum(len(p["replicas"]) for parts in topics.values() for p in parts)

    def check(s: dict) -> None:
        assert total(s, exported(metrics.MESSAGES_IN, "_total"), topic=TOPIC) == produced, "each record, once"
        assert total(s, exported(metrics.BYTES_IN, "_total"), topic=TOPIC) > produced * 5
        assert total(s, exported(metrics.BYTES_OUT, "_total"), topic=TOPIC) > (PYTHON_RECORDS + KAFKA_RECORDS) * 5
        assert total(s, exported(metrics.TOTAL_PRODUCE_REQUESTS, "_total"), topic=TOPIC) >= 3
        assert not total_or_zero(s, exported(metrics.FAILED_PRODUCE_REQUESTS, "_total"), topic=TOPIC)
        assert not total_or_zero(s, exported(metrics.BYTES_REJECTED, "_total"), topic=TOPIC)
        assert total(s, exported(metrics.TOTAL_FETCH_REQUESTS, "_total"), topic=TOPIC) > 0
        leader_count = exported(metrics.LEADER_COUNT)
        for broker in ("0", "1", "2"):
            assert total(s, leader_count, broker=broker) >= 1, f"broker {broker} leads its share"
        assert total(s, leader_count) == leaders
        assert total(s, exported(metrics.PARTITION_COUNT)) == replicas
        assert total(s, exported(metrics.UNDER_REPLICATED_PARTITIONS)) == 0
        assert total(s, exported(metrics.UNDER_MIN_ISR_PARTITION_COUNT)) == 0
        assert total(s, exported(metrics.ACTIVE_CONTROLLER_COUNT)) == 1
        assert total(s, exported(metrics.OFFLINE_PARTITIONS_COUNT)) == 0
        assert total(s, exported(metrics.EVENT_QUEUE_TIME_MS, "_count")) > 0
        sizes = [v for labels, v in s.get(exported(metrics.LOG_SIZE), []) if labels["topic"] == TOPIC]
        assert len(sizes) == PARTITIONS * 3 and all(v > 0 for v in sizes), "every replica's log on every broker"
        lag = exported(metrics.CONSUMER_GROUP_LAG)
        assert total(s, lag, group=GROUP) == LAGGING_RECORDS, "the records produced after the group's commit"
        request_times = exported(metrics.REQUEST_TOTAL_TIME_MS, "_count")
        assert total(s, request_times, request="Produce", listener="PLAINTEXT") > 0, "the Kafka client's produces"
        assert total(s, request_times, request="Metadata") > 0

    scrape_until_checked(metrics_port, check)


README_SCRAPE = "ray start --head --metrics-export-port=8090"


def test_the_readme_s_scrape_runs_as_written(workload, metrics_port):
    """README's two lines: this module's Ray stands in for the first (its metrics port
    for 8090), and the second runs in a shell as written."""
    ray_start, scrape_line = readme.block(README_SCRAPE).splitlines()
    assert readme.shell_commands(ray_start) == [["ray", "start", "--head", "--metrics-export-port=8090"]]
    shown = subprocess.run(["bash", "-c", scrape_line.replace(":8090/", f":{metrics_port}/")],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    leaders = [line for line in shown.stdout.splitlines() if line.startswith(exported(metrics.LEADER_COUNT) + "{")]
    assert len(leaders) == 3 and all('broker="' in line for line in leaders), shown.stdout


def test_cluster_health_is_what_the_gauges_say(workload):
    health = workload.health()
    assert health["active_controller_count"] == 1 and health["offline_partitions_count"] == 0
    brokers = health["brokers"]
    assert sorted(brokers) == [0, 1, 2]
    assert sum(h.leader_count for h in brokers.values()) == 2 * PARTITIONS, f"{TOPIC} and {OFFSETS_TOPIC}"
    assert all(h.partition_count == 2 * PARTITIONS for h in brokers.values()), "RF 3 on 3 brokers"
    assert all(h.under_replicated_partitions == h.under_min_isr_partition_count == 0 for h in brokers.values())


class RecordedCounter:
    def __init__(self) -> None:
        self.incs: list[tuple[float, dict]] = []

    def inc(self, value: float, tags: dict) -> None:
        self.incs.append((value, tags))


def test_a_leader_s_counts_reach_ray_at_most_once_a_second_and_whenever_flushed(monkeypatch):
    recorded: dict[str, RecordedCounter] = {}
    monkeypatch.setattr(metrics, "metric", lambda name: recorded.setdefault(name, RecordedCounter()))
    counters = metrics.BrokerTopicCounters(2, "t")
    counters.messages_in += 5
    counters.maybe_flush()  # the first goes at once
    counters.messages_in += 7
    counters.bytes_in += 700
    counters.maybe_flush()  # within the second: held back
    assert recorded[metrics.MESSAGES_IN].incs == [(5, {"broker": "2", "topic": "t"})]
    assert metrics.BYTES_IN not in recorded
    counters.flush()  # the broker's checkpoint loop asks
    counters.flush()  # nothing new: nothing recorded
    assert [v for v, _ in recorded[metrics.MESSAGES_IN].incs] == [5, 7]
    assert [v for v, _ in recorded[metrics.BYTES_IN].incs] == [700]
    assert set(recorded) == {metrics.MESSAGES_IN, metrics.BYTES_IN}, "zero counts are not recorded"


def test_the_grafana_dashboard_charts_every_metric_and_no_other():
    dashboard = (Path(__file__).resolve().parent.parent / "clusters" / "grafana-rayk.json").read_text()
    charted = {
        re.sub(r"_(total|bucket|count|sum)$", "", name)
        for name in re.findall(r"\bray_(rayk_[a-z_]+)", dashboard)
    }
    assert charted == set(metrics.SPECS)
    # Panels reach Ray's Prometheus datasource through the variable Ray's own dashboards use.
    variable = json.loads(dashboard)["templating"]["list"][0]
    assert (variable["name"], variable["type"], variable["query"]) == ("datasource", "datasource", "prometheus")
