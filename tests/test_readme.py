"""The README's examples run here as written, so that the README cannot drift from the code.

Every fenced block of README.md is either run by `test_the_readme_python_examples_run_as_written`
(in order, each in the namespace the ones before it left, as a reader would type them into
one session) or listed in NOT_RUN_HERE with the test that covers what it shows, so a new
block fails `test_every_readme_block_is_run_or_accounted_for` until it is placed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rayk
import rayk.client
from tests.cluster_helpers import FAST_CONFIG, shared_local_ray

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)

# Blocks run here, by their first line.
RUN_HERE = (
    "import rayk",  # Using rayk from Python
    "import numpy as np, pyarrow as pa",  # send_batch
    'consumer = cluster.consumer(auto_offset_reset="earliest")',  # poll_batch
    "import ray, rayk",  # Topics as Ray Datasets (its Ray Data half; Spark's is in NOT_RUN_HERE)
    "from confluent_kafka import Producer",  # a Kafka client
    "from rayk.quotas import DEFAULT, QuotaEntity",  # client quotas
    "from rayk.storage import Log, LogConfig",  # the storage engine
    'cluster.create_topic("profiles", num_partitions=3, config={"cleanup.policy": "compact"})',  # compaction
)
# Blocks not run here, by their first line, with where what they show is tested.
NOT_RUN_HERE = {
    "ray start --head --metrics-export-port=8090       # each node: the same flag on `ray start`": "tests/test_metrics.py",
    "make demo    # 3 brokers on a local Ray: 1,000,000 records with acks=all (send_batch of numpy/Arrow": "CI runs make test; make demo is the main job",
    "ray start --head                                   # or use an existing Ray cluster": "tests/test_cli.py",
    "def process(df, batch_id):                           # Spark's Kafka schema": "tests/test_spark.py (needs a Spark session)",
    'spark = rayk_spark.session("etl", kafka_connector=True)': "tests/test_spark.py (the connector)",
    "cluster = rayk.start(brokers=3, config={": "tests/test_listener_sasl.py (needs certificates and fixed ports)",
    "from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,": "tests/test_listener_acls.py",
}
SPARK_PART = "spark = rayk_spark.session("  # the Ray Data block's second half, from this line


def readme_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block, in order."""
    return FENCE.findall(README.read_text())


def first_line(code: str) -> str:
    return code.splitlines()[0].rstrip() if code.strip() else ""


def test_every_readme_block_is_run_or_accounted_for():
    unplaced = []
    for language, code in readme_blocks():
        line = first_line(code)
        if language in ("", "text") or line in RUN_HERE or line in NOT_RUN_HERE:
            continue
        unplaced.append(line)
    assert not unplaced, f"README blocks neither run by this module nor listed in NOT_RUN_HERE: {unplaced}"
    present = {first_line(code) for _language, code in readme_blocks()}
    assert not (set(RUN_HERE) | set(NOT_RUN_HERE)) - present, "a listed block is gone from the README"


@pytest.fixture
def readme_session(tmp_path, monkeypatch):
    """The examples' setting: the current directory is a fresh one (they keep their data in
    ./rayk-data), and `rayk.start` binds the brokers' listeners to loopback, as every
    server in the tests does, with the tests' timeouts (FAST_CONFIG)."""
    monkeypatch.chdir(tmp_path)
    start = rayk.client.start

    def start_on_loopback(*args, config=None, **kwargs):
        return start(*args, config={**FAST_CONFIG, **(config or {})}, **kwargs)

    monkeypatch.setattr(rayk.client, "start", start_on_loopback)
    shared_local_ray()


def test_the_readme_python_examples_run_as_written(readme_session, capsys):
    blocks = [code for _language, code in readme_blocks() if first_line(code) in RUN_HERE]  # README's order
    assert len(blocks) == len(RUN_HERE)
    namespace: dict = {"__name__": "readme"}
    try:
        for code in blocks:
            exec(compile(code.split(SPARK_PART)[0], f"README: {first_line(code)}", "exec"), namespace)
            if code is blocks[0]:
                assert "ann" in capsys.readouterr().out, "the quickstart's consumer printed what its producer sent"
        cluster = namespace["cluster"]
        assert sorted(cluster.admin().list_topics()) == ["events", "events-clean", "profiles"]
        written = sum(p.high_watermark for p in cluster.describe_topic("events-clean"))
        assert written == 10_001, "write_topic wrote every row of the filtered Dataset"
    finally:
        if "cluster" in namespace:
            namespace["cluster"].shutdown()
