"""The examples of the README and of the documentation site's pages run here as written, so
that neither can drift from the code.

Every fenced block of README.md and of the pages in mkdocs.yml's navigation is either run
by `test_the_readme_python_examples_run_as_written` (in the order a reader meets them, each
in the namespace the ones before it left, as a reader would type them into one session),
or is the README's own example (run alone, as a new user would), or is listed in
RUN_ELSEWHERE with the tests that run it where its setting is (a Spark session,
certificates, the `rayk` command, Ray's metrics port), so a new block fails
`test_every_readme_block_is_run_here_or_by_a_test_named_for_it` until it is placed.
Diagrams (```mermaid) and illustrations (```text, or no language) are not code.
"""

from __future__ import annotations

import pytest

import rayk
import rayk.client
from tests.cluster_helpers import FAST_CONFIG, shared_local_ray
from tests.readme import README, block, first_line, page_blocks, readme_blocks

# The README's example, run alone in a fresh directory, as a new user would.
README_EXAMPLE = "import rayk, rayk.data"
# Blocks run here, by their first line.
RUN_HERE = (
    "import rayk",  # Getting started: a first producer and consumer
    "import numpy as np, pyarrow as pa",  # send_batch
    'producer = cluster.producer(transactional_id="etl-1")      # transaction_timeout_ms=60_000',  # transactions
    'consumer = cluster.consumer(auto_offset_reset="earliest")',  # poll_batch
    'cluster.create_topic("jobs", num_partitions=1)',  # share groups
    "from rayk.work_queue import WorkQueue",  # the work queue
    "import confluent_kafka                                    # ShareConsumer: confluent-kafka 2.16 (preview)",
    "from confluent_kafka import Producer",  # a Kafka client
    "import confluent_kafka",  # the consumer group protocol (KIP-848)
    "from rayk.quotas import DEFAULT, QuotaEntity",  # client quotas
    "from rayk.storage import Log, LogConfig",  # the storage engine
    'cluster.create_topic("profiles", num_partitions=3, config={"cleanup.policy": "compact"})',  # compaction
)
# Blocks run by the tests whose setting they need (a Spark session, certificates, the
# `rayk` command, Ray's metrics port), by their first line.
RUN_ELSEWHERE = {
    'cluster.create_topic("clickstream", num_partitions=1, replication_factor=3, config={': (
        "tests/test_tiered_storage.py::test_the_tiered_storage_guide_runs_as_written",),
    "import ray, rayk": ("tests/test_spark.py::test_the_readme_s_spark_examples_run_as_written",),
    "def enrich(df, batch_id):                            # returns the batch's output": (
        "tests/test_spark.py::test_the_readme_s_spark_examples_run_as_written",),
    "ray start --head --metrics-export-port=8090       # each node: the same flag on `ray start`": (
        "tests/test_metrics.py::test_the_readme_s_scrape_runs_as_written",),
    "make demo    # 3 brokers on a local Ray: 1,000,000 records with acks=all (send_batch of numpy/Arrow": (
        "tests/test_cli.py::test_the_demo_checks_what_it_produced_and_consumed",
        "tests/test_spark.py::test_make_demo_s_spark_pipeline_counts_every_click_once",
        "tests/test_share_consumer.py::test_make_demo_s_work_queue_does_every_job_with_duplicates_only_where_a_worker_died"),
    "rayk brokers add        # a new broker joins; the balancer moves its share of the replicas and leaders to it": (
        "tests/test_broker_lifecycle.py::test_the_quickstart_s_broker_commands_run_as_written",),
    "RAY_worker_niceness=0 ray start --head             # or use an existing Ray cluster": (
        "tests/test_cli.py::test_the_readme_s_rayk_commands_run_as_written",),
    'rayk.connect().create_topic("events-copy", num_partitions=3)': (
        "tests/test_spark.py::test_the_readme_s_spark_examples_run_as_written",),
    "rayk_spark.stop()                                    # the session above; one with the connector:": (
        "tests/test_spark.py::test_the_readme_s_spark_examples_run_as_written",),
    "cluster = rayk.start(brokers=3, config={": (
        "tests/test_listener_sasl.py::test_the_readme_s_sasl_setup_and_acls_run_as_written",),
    "from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,": (
        "tests/test_listener_sasl.py::test_the_readme_s_sasl_setup_and_acls_run_as_written",),
}


def test_every_readme_block_is_run_here_or_by_a_test_named_for_it():
    unplaced = []
    for language, code in readme_blocks():
        line = first_line(code)
        if language in ("", "text", "mermaid") or line in {README_EXAMPLE, *RUN_HERE, *RUN_ELSEWHERE}:
            continue
        unplaced.append(line)
    assert not unplaced, f"blocks neither run by this module nor listed in RUN_ELSEWHERE: {unplaced}"
    present = {first_line(code) for _language, code in readme_blocks()}
    assert not ({README_EXAMPLE, *RUN_HERE, *RUN_ELSEWHERE}) - present, "a listed block is gone from the pages"
    python = [code for language, code in page_blocks(README) if language == "python"]
    assert first_line(python[0]) == README_EXAMPLE, "the README's first Python block is its example"
    for test_id in {t for tests in RUN_ELSEWHERE.values() for t in tests}:
        path, name = test_id.split("::")
        assert f"def {name}(" in (README.parent / path).read_text(), f"{test_id} does not exist"


@pytest.fixture
def readme_session(tmp_path, monkeypatch):
    """The examples' setting: the current directory is a fresh one (they keep their data in
    ./rayk-data), and `rayk.start` binds the brokers' listeners to loopback, as every
    server in the tests does, with the tests' timeouts (FAST_CONFIG) and no wait for more
    members before a new group's first rebalance."""
    monkeypatch.chdir(tmp_path)
    start = rayk.client.start

    def start_on_loopback(*args, config=None, **kwargs):
        return start(*args, config={**FAST_CONFIG, "group.initial.rebalance.delay.ms": 0, **(config or {})}, **kwargs)

    monkeypatch.setattr(rayk.client, "start", start_on_loopback)
    shared_local_ray()


def test_the_readme_s_example_runs_alone_as_written(readme_session, capsys):
    namespace: dict = {"__name__": "readme"}
    try:
        exec(compile(block(README_EXAMPLE), "README: the example", "exec"), namespace)
        assert capsys.readouterr().out.splitlines()[-2:] == ["['ann', 'bob', 'cy']", "3"]
    finally:
        if "cluster" in namespace:
            namespace["cluster"].shutdown()


def test_the_readme_python_examples_run_as_written(readme_session, capsys):
    blocks = [code for _language, code in readme_blocks() if first_line(code) in RUN_HERE]  # a reader's order
    assert len(blocks) == len(RUN_HERE)
    namespace: dict = {"__name__": "readme"}
    try:
        for code in blocks:
            exec(compile(code, f"README: {first_line(code)}", "exec"), namespace)
            if code is blocks[0]:
                assert "ann" in capsys.readouterr().out, "the quickstart's consumer printed what its producer sent"
        cluster = namespace["cluster"]
        assert sorted(cluster.admin().list_topics()) == ["events", "events-upper", "jobs", "jobs-dlq", "orders", "profiles"]
    finally:
        if "cluster" in namespace:
            namespace["cluster"].shutdown()
