"""Fixtures shared by the modules that run one cluster for all their tests."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import uvloop

from rayk.replication.replica_board import SHM_DIR, candidate_paths
from tests.cluster_helpers import release_shared_local_ray
from tests.jvm_programs import Jvm, build
from tests.tls_helpers import TlsFiles, write_tls_files


# Ray Data's usage collection starts a thread in the driver, here the test process, that asks
# a Prometheus at localhost:9090 for cluster counters every 10 s and, none answering, logs the
# failure with its traceback. On Python 3.11 formatting a traceback parses source with `ast`,
# whose AST construction keeps its recursion depth in state shared by every thread (CPython
# gh-106905), so a test parsing source at the same moment (test_layering, test_docstrings)
# failed once with "SystemError: AST constructor recursion depth mismatch".
os.environ.setdefault("RAY_DATA_USAGE_DISABLED", "1")

RUN_ORDER = {"broker nodes": 0, "own Ray": 1, "shared local Ray": 2}  # by a module's RUNS_ON


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules sharing the broker-node cluster (`RUNS_ON = "broker nodes"`,
    cluster_helpers.shared_broker_node_cluster) run first, then those with a Ray of their
    own (`RUNS_ON = "own Ray"`), each group in its order, and the modules sharing the local Ray
    last: one among those shut the shared Ray down and the next module started it again,
    ~5 s each time (~12 s for the broker nodes)."""
    items.sort(key=lambda item: RUN_ORDER[getattr(getattr(item, "module", None), "RUNS_ON", "shared local Ray")])


@pytest.fixture(scope="session", autouse=True)
def stop_the_shared_local_ray(tmp_path_factory):
    yield
    try:
        release_shared_local_ray()
    finally:
        remove_replica_boards(tmp_path_factory.getbasetemp())


def remove_replica_boards(base: Path) -> None:
    """Removes the tmpfs replica boards of the brokers whose data directories the tests
    made under `base`: a broker whose Ray instance a test shut down, or whose process it
    killed, had no clean shutdown to remove its own (replica_board.py)."""
    for parent, dirs, _files in os.walk(base):  # a directory a dying broker removes mid-walk is skipped
        for name in dirs:
            if name.startswith("broker-"):
                for path in candidate_paths(Path(parent) / name):
                    if str(path).startswith(SHM_DIR + "/"):
                        path.unlink(missing_ok=True)


@pytest.fixture(params=["asyncio", "uvloop"])
def each_event_loop(request):
    """The test's `asyncio.run` runs on asyncio's own loop, then on uvloop, which Ray runs
    every actor on wherever it is installed (a test dependency here)."""
    if request.param == "uvloop":
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        yield request.param
    finally:
        asyncio.set_event_loop_policy(None)


@pytest.fixture
def delete_topics_after_test(cluster):
    """Deletes the topics a test created (internal ones stay), so that a broker restarted
    by a later test of the module brings back only that test's replicas: each replica is
    an actor, and restarting a broker after a dozen tests recreated dozens of them."""
    before = set(cluster.list_topics())
    yield
    for name in set(cluster.list_topics()) - before:
        if not name.startswith("__"):
            cluster.delete_topic(name)


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    """A CA, the broker's PEM keystore and truststore, and a client certificate, made for
    the module (tls_helpers.py)."""
    return write_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def jvm() -> Jvm:
    """Kafka's Java clients, tools and Streams with the programs of tests/jvm, built with
    Maven on first use (jvm_programs.py)."""
    return build()
