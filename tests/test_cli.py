"""The `rayk` command line against this module's own Ray instance.

The module starts one local Ray instance and one rayk cluster (namespace "cli-test").
`run_subprocess` runs `python -m rayk.cli ... --address <that instance> --namespace
cli-test`, as a user on the same machine would, with RAY_AUTH_MODE=token so the explicit
address authenticates with the local token: the tests of connecting, starting and stopping
use it. The others call `rayk.cli.main` in this process (`run`), which keeps this process's
Ray connection: a subprocess costs ~2 s of Ray start-up, and the suite's budget counts.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import time

import pytest
import ray

import rayk
from rayk import cli
from rayk.client import PartitionReassignment, TopicPartition
from rayk.errors import UnknownTopicOrPartitionError
from tests import readme
from tests.cluster_helpers import FAST_CONFIG, shared_local_ray, wait_until

NAMESPACE = "cli-test"
LOOPBACK_LISTENER = "PLAINTEXT://127.0.0.1:0"  # tests bind to loopback, on free ports


@pytest.fixture(scope="module")
def address():
    return shared_local_ray()


@pytest.fixture(scope="module")
def cluster(address, tmp_path_factory):
    c = rayk.start(
        brokers=3,
        data_dir=tmp_path_factory.mktemp("cli-data"),
        namespace=NAMESPACE,
        config={"group.initial.rebalance.delay.ms": 0, "listeners": LOOPBACK_LISTENER, "offsets.topic.num.partitions": 1},
    )
    yield c
    c.shutdown()


@pytest.fixture
def run(address, cluster, monkeypatch):
    """run(*args, stdin=None, namespace=...) -> CompletedProcess of `rayk.cli.main(args)`
    called in this process, with stdin, stdout and stderr of its own."""

    def run_main(*args: str, stdin: str | None = None, namespace: str = NAMESPACE) -> subprocess.CompletedProcess:
        argv = [*args, "--address", address, "--namespace", namespace]
        out, err = io.TextIOWrapper(io.BytesIO(), write_through=True), io.StringIO()  # (`consume` writes bytes)
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((stdin or "").encode())))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
        assert ray.is_initialized(), "the command left this process's Ray connection alone"
        out.flush()
        return subprocess.CompletedProcess(argv, code, out.buffer.getvalue().decode(), err.getvalue())

    return run_main


@pytest.fixture
def run_subprocess(address, cluster):
    """run_subprocess(*args, stdin=None, namespace=...) -> CompletedProcess of `rayk args...`,
    run in the current directory."""

    def run_cli(*args: str, stdin: str | None = None, namespace: str = NAMESPACE) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "rayk.cli", *args, "--address", address, "--namespace", namespace]
        return subprocess.run(
            command,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "RAY_AUTH_MODE": "token"},
        )

    return run_cli


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result.stdout


# Ray's driver thread prints cluster-wide raylet notices (e.g. "N worker processes have been
# started") into any connected process, the CLI included; they are Ray's lines, not rayk's.
RAY_NOTICE = re.compile(r"^(\x1b\[\d+m)?\((raylet|autoscaler)[^)]*\)")


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1, f"exit {result.returncode}\nstderr: {result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.strip().splitlines() if not RAY_NOTICE.match(line)]
    assert len(lines) == 1 and lines[0].startswith("rayk: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def rows(table_text: str) -> list[list[str]]:
    """The data rows of a table printed by the CLI (whitespace-separated cells)."""
    return [line.split() for line in table_text.strip().splitlines()[1:]]


# ---------------------------------------------------------------------------- no cluster needed


@pytest.mark.parametrize(
    "command",
    [[], ["start"], ["status"], ["stop"], ["topics"], ["topics", "create"], ["topics", "alter"], ["groups"],
     ["groups", "describe"], ["produce"], ["consume"], ["perf"], ["perf", "produce"], ["perf", "consume"], ["demo"],
     ["topics", "reassign"], ["topics", "reassignments"], ["users"], ["users", "set"], ["users", "list"], ["acls"], ["acls", "add"], ["acls", "remove"]],
)  # fmt: skip
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: rayk" in capsys.readouterr().out


def test_version_prints_the_installed_distribution_s(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"rayk {version('rayk')}\n" == f"rayk {rayk.__version__}\n"


def test_perf_produce_defaults_are_the_producer_s():
    from rayk.client.producer import DEFAULT_BATCH_SIZE, DEFAULT_LINGER_MS

    assert (cli.PERF_BATCH_SIZE, cli.PERF_LINGER_MS) == (DEFAULT_BATCH_SIZE, DEFAULT_LINGER_MS)


def test_bad_options_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["topics", "create", "t", "--partitions", "many"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["topics", "alter", "t", "--config", "no-equals-sign"])
    assert "expected key=value" in capsys.readouterr().err


def test_reassign_options_are_checked_before_connecting(capsys):
    for argv in (["topics", "reassign", "t", "--partition", "0"],
                 ["topics", "reassign", "t", "--partition", "0", "--replicas", "1,2", "--cancel"],
                 ["topics", "reassign", "t", "--partition", "-1", "--replicas", "1,2"],
                 ["topics", "reassign", "t", "--partition", "0", "--replicas", "3,x"]):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2, argv
    assert "expected comma-separated broker ids such as 3,1,2, got '3,x'" in capsys.readouterr().err


class StandInCluster:
    """What the reassignment commands use of a Cluster, with two reassignments under way."""

    ONGOING = {
        TopicPartition("a", 0): PartitionReassignment([3, 1, 2, 0], [3], [0]),
        TopicPartition("b", 1): PartitionReassignment([1, 2], [], [2]),
    }

    def __init__(self) -> None:
        self.altered: list[dict] = []
        self.listed: list = []

    def admin(self) -> StandInCluster:
        return self

    def describe_topic(self, name: str) -> list[dict]:
        if name not in ("a", "b"):
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return [{"partition": p, "replicas": [0, 1, 2]} for p in range(2)]

    def alter_partition_reassignments(self, reassignments: dict) -> dict:
        self.altered.append(reassignments)
        return {tp: None for tp in reassignments}

    def list_partition_reassignments(self, partitions=None) -> dict:
        self.listed.append(partitions)
        return {tp: r for tp, r in self.ONGOING.items() if partitions is None or tp in partitions}


@pytest.fixture
def stand_in(monkeypatch):
    c = StandInCluster()
    monkeypatch.setattr(cli, "_connect", lambda args: c)
    monkeypatch.setattr(cli, "_shutdown_ray", lambda: None)  # never this module's Ray instance
    return c


def test_reassignments_prints_one_row_per_partition_moving(stand_in, capsys):
    assert cli.main(["topics", "reassignments"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["topic", "partition", "replicas", "adding", "removing"]
    assert rows(out) == [["a", "0", "3,1,2,0", "3", "0"], ["b", "1", "1,2", "-", "2"]]
    assert cli.main(["topics", "reassignments", "b"]) == 0
    assert rows(capsys.readouterr().out) == [["b", "1", "1,2", "-", "2"]]
    assert stand_in.listed == [None, [TopicPartition("b", 0), TopicPartition("b", 1)]]


def test_reassign_starts_or_cancels_one_partition_and_says_what_moves(stand_in, capsys):
    assert cli.main(["topics", "reassign", "a", "--partition", "0", "--replicas", "3,1,2"]) == 0
    assert capsys.readouterr().out.startswith("reassigning a-0 to replicas 3,1,2: adding 3, removing 0;")
    assert cli.main(["topics", "reassign", "a", "--partition", "1", "--cancel"]) == 0
    assert capsys.readouterr().out.strip() == "cancelled the reassignment of a-1; its replicas are 0,1,2"
    assert stand_in.altered == [{TopicPartition("a", 0): [3, 1, 2]}, {TopicPartition("a", 1): None}]


def test_status_health_shows_each_broker_s_gauges_and_dashes_for_one_that_did_not_answer():
    from rayk.metrics import BrokerHealth

    brokers = {0: BrokerHealth(0, 3, 9, 1, 0), 1: None}
    health = {"active_controller_count": 1, "offline_partitions_count": 2, "brokers": brokers}
    controller, brokers = cli._health_block(health).split("\n", 1)
    assert controller == "active controllers: 1; offline partitions: 2"
    assert brokers.splitlines()[0].split() == ["broker", "leaders", "partitions", "under-replicated", "under-min-isr"]
    assert rows(brokers) == [["0", "3", "9", "1", "0"], ["1", "-", "-", "-", "-"]]


def test_status_prints_bootstrap_servers_for_each_listener():
    from rayk.client.cluster import Cluster

    class TwoListeners:
        def brokers(self):
            return [{"broker_id": b, "fenced": b == 2,
                     "endpoints": {"INTERNAL": ("10.0.0.1", 9092 + b), "EXTERNAL": ("kafka.example.com", 9192 + b)}}
                    for b in range(3)]

        bootstrap_servers_for = Cluster.bootstrap_servers_for

    assert cli._bootstrap_line(TwoListeners()).splitlines() == [
        "bootstrap.servers=10.0.0.1:9092,10.0.0.1:9093",
        "  on EXTERNAL: bootstrap.servers=kafka.example.com:9192,kafka.example.com:9193",
    ]
    assert cli._listener(TwoListeners().brokers()[0]) == "INTERNAL://10.0.0.1:9092,EXTERNAL://kafka.example.com:9192"


def test_no_ray_cluster_is_a_one_line_error(monkeypatch, capsys):
    def no_cluster(address=None, **kwargs):
        assert address == "auto"
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "init", no_cluster)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # (whether or not this process is connected)
    monkeypatch.setattr(cli, "_shutdown_ray", lambda: None)  # never this module's Ray instance
    assert cli.main(["status"]) == 1
    assert capsys.readouterr().err == f"rayk: error: {cli.NO_RAY_CLUSTER}\n"


# ---------------------------------------------------------------------------- against the cluster


def test_topic_lifecycle(run, cluster):
    ok(run("topics", "create", "orders", "--partitions", "3", "--replication-factor", "3",
           "--config", "min.insync.replicas=2"))  # fmt: skip
    assert "orders" in ok(run("topics", "list")).split()
    described = ok(run("topics", "describe", "orders"))
    assert "min.insync.replicas=2" in described
    partitions = rows(described.split("\n", 1)[1])
    assert [(r[0], r[1]) for r in partitions] == [("orders", "0"), ("orders", "1"), ("orders", "2")]
    assert all(sorted(r[3].split(",")) == ["0", "1", "2"] == sorted(r[4].split(",")) for r in partitions)

    assert "retention.ms=3600000" in ok(run("topics", "alter", "orders", "--config", "retention.ms=3600000"))
    assert ok(run("topics", "alter", "orders", "--partitions", "4")).strip() == "topic 'orders' has 4 partitions"
    assert len(cluster.describe_topic("orders")) == 4
    assert "INVALID_PARTITIONS" in run("topics", "alter", "orders", "--partitions", "2").stderr
    [row] = rows(ok(run("topics", "elect-leaders", "orders", "--partition", "0")))
    assert (row[0], row[1], row[3]) == ("orders", "0", "ELECTION_NOT_NEEDED")
    assert cluster.admin().describe_topic_configs("orders") == {"min.insync.replicas": "2", "retention.ms": "3600000"}

    assert ok(run("topics", "delete", "orders")).strip() == "deleted topic 'orders'"
    assert "orders" not in cluster.list_topics()


def test_produce_lines_then_consume_them_from_the_beginning(run, cluster):
    cluster.create_topic("lines", num_partitions=2)  # few replicas: each is a process on 2 cores
    sent = [f"k{i % 3}:value {i}" for i in range(30)]
    produced = run("produce", "lines", "--key-separator", ":", stdin="\n".join(sent) + "\n")
    assert ok(produced) == "" and produced.stderr.strip() == "30 records produced"

    consumed = run("consume", "lines", "--from-beginning", "--max-messages", "30", "--print-key")
    lines = ok(consumed).splitlines()
    assert sorted(lines) == sorted(line.replace(":", "\t", 1) for line in sent)
    for key in ("k0", "k1", "k2"):  # one key, one partition: the order it was produced in
        values = [int(line.split()[-1]) for line in lines if line.startswith(key + "\t")]
        assert values == sorted(values) and len(values) == 10
    assert consumed.stderr.strip() == "30 messages consumed"

    missing_separator = run("produce", "lines", "--key-separator", ":", stdin="no separator here\n")
    assert_one_line_error(missing_separator, "no key separator")


def test_group_consumption_shows_in_groups_list_and_describe_with_no_lag(run, cluster):
    cluster.create_topic("events", num_partitions=3)
    # Keyed, so that every partition holds records (these 12 keys hash to partitions 0, 1
    # and 2) and reading all 12 takes a position on each: a partition whose position the
    # consumer never learnt has nothing to commit, as in Kafka.
    lines = "".join(f"user-{i}:event {i}\n" for i in range(12))
    assert ok(run("produce", "events", "--acks", "1", "--key-separator", ":", stdin=lines)) == ""
    consumed = run("consume", "events", "--group", "cli-group", "--from-beginning", "--max-messages", "12")
    assert sorted(ok(consumed).splitlines()) == sorted(f"event {i}" for i in range(12))

    groups = rows(ok(run("groups", "list")))
    assert ["cli-group", "Empty"] in groups
    described = ok(run("groups", "describe", "cli-group"))
    assert described.startswith("group cli-group")
    offsets = [r for r in rows(described.rsplit("\n\n", 1)[1]) if r[0] == "events"]
    assert len(offsets) == 3
    assert sum(int(r[3]) for r in offsets) == 12, "end offsets add up to the records produced"
    assert all(r[2] == r[3] and r[4] == "0" for r in offsets), "committed = end offset, lag 0"

    deleted = rows(ok(run("groups", "delete-offsets", "cli-group", "events", "--partition", "0")))
    assert ["events", "0", "deleted"] in deleted
    offsets = [r for r in rows(ok(run("groups", "describe", "cli-group")).rsplit("\n\n", 1)[1]) if r[0] == "events"]
    assert sorted(r[1] for r in offsets) == ["1", "2"], "partition 0's committed offset is gone"

    assert ok(run("groups", "delete", "cli-group")).startswith("deleted group cli-group")
    assert "cli-group" not in ok(run("groups", "list"))
    assert_one_line_error(run("groups", "delete", "cli-group"), "GROUP_ID_NOT_FOUND")


def test_status_lists_brokers_topics_and_under_replicated_partitions(run, cluster):
    cluster.create_topic("status-topic", num_partitions=1, replication_factor=3)
    status = ok(run("status"))
    brokers = rows(status.split("\n\n")[1])
    assert [r[0] for r in brokers] == ["0", "1", "2"] and all(r[-3:] == ["no", "yes", "no"] for r in brokers)  # fenced, connected, leaving
    assert all(r[3].startswith("PLAINTEXT://127.0.0.1:") for r in brokers), "each broker's Kafka listener"
    assert status.split("\n\n")[2] == f"bootstrap.servers={cluster.bootstrap_servers}"
    assert cluster.bootstrap_servers.count("127.0.0.1:") == 3
    assert ["status-topic", "1", "3", "0"] in rows(status.split("\n\n")[3])
    assert "under-replicated partitions: none" in status
    controller, health = status.split("\n\n")[5].split("\n", 1)
    assert controller == "active controllers: 1; offline partitions: 0"
    partitions = [p for t in cluster.admin().list_topics(include_internal=True) for p in cluster.describe_topic(t)]
    per_broker = rows(health)  # broker, leaders, partitions, under-replicated, under-min-isr
    assert [r[0] for r in per_broker] == ["0", "1", "2"]
    assert sum(int(r[1]) for r in per_broker) == len(partitions), "each partition led once"
    assert sum(int(r[2]) for r in per_broker) == sum(len(p["replicas"]) for p in partitions)
    assert all(r[3:] == ["0", "0"] for r in per_broker)


def test_perf_produce_and_consume_print_their_summaries(run, cluster):
    cluster.create_topic("perf", num_partitions=2)
    keys = ["records", "records/s", "MB/s", "avg ms", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms", "max ms"]
    produced = run("perf", "produce", "--topic", "perf", "--num-records", "3000", "--record-size", "100",
                   "--throughput", "10000", "--linger-ms", "2")  # fmt: skip
    header, values = ok(produced).strip().splitlines()
    assert all(key in header for key in keys) and values.split()[0] == "3000"
    assert "produce [" in produced.stderr and "3,000/3,000 100.0%" in produced.stderr, "the progress bar"

    consumed = run("perf", "consume", "--topic", "perf", "--messages", "3000", "--group", "perf-group")
    header, values = ok(consumed).strip().splitlines()
    assert all(key in header for key in keys) and values.split()[0] == "3000"


def test_reassign_moves_a_partition_to_another_broker_and_mistakes_are_one_line_errors(run, cluster):
    cluster.create_topic("relocated", num_partitions=1, replication_factor=2)
    replicas = cluster.describe_topic("relocated")[0]["replicas"]
    spare = next(b for b in range(3) if b not in replicas)
    target = [spare, replicas[1]]
    ids = ",".join(map(str, target))
    started = ok(run("topics", "reassign", "relocated", "--partition", "0", "--replicas", ids)).strip()
    assert started.startswith(f"reassigning relocated-0 to replicas {ids}: adding {spare}, removing {replicas[0]};") \
        or started == f"relocated-0 has replicas {ids}", "or it completed already"  # fmt: skip

    def moved() -> bool:
        p = cluster.describe_topic("relocated")[0]
        return p["replicas"] == target and sorted(p["isr"]) == sorted(target) and not p["removing_replicas"]

    wait_until(moved, 60, "the move to complete")
    assert ok(run("topics", "reassignments")).strip() == "no partition reassignments in progress"
    assert ok(run("topics", "reassignments", "relocated")).strip() == (
        "no partition reassignments in progress for topic 'relocated'"
    )
    twice = run("topics", "reassign", "relocated", "--partition", "0", "--replicas", f"{spare},{spare}")
    assert_one_line_error(twice, "INVALID_REPLICA_ASSIGNMENT")
    nothing = run("topics", "reassign", "relocated", "--partition", "0", "--cancel")
    assert_one_line_error(nothing, "NO_REASSIGNMENT_IN_PROGRESS")
    unknown = run("topics", "reassign", "no-such-topic", "--partition", "0", "--replicas", "0")
    assert_one_line_error(unknown, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_one_line_error(run("topics", "reassignments", "no-such-topic"), "UNKNOWN_TOPIC_OR_PARTITION")


def test_user_mistakes_are_one_line_errors(run_subprocess):
    run = run_subprocess  # a real `rayk` process
    assert_one_line_error(run("topics", "describe", "no-such-topic"), "UNKNOWN_TOPIC_OR_PARTITION")
    assert_one_line_error(run("topics", "list", namespace="cli-nobody-here"), "no rayk cluster")
    assert_one_line_error(run("groups", "describe", "no-such-group"), "does not exist")
    waited = run("start", "--brokers", "2", "--node-resource", "rayk_nowhere", "--wait-for-nodes", "1",
                 namespace="cli-nowhere")  # fmt: skip
    assert_one_line_error(waited, "only 0 Ray nodes offering 'rayk_nowhere' after 1 s")
    assert_one_line_error(run("start", "--node-resource", "rayk_nowhere", namespace="cli-nowhere"), "rayk_nowhere")


README_COMMANDS = "RAY_worker_niceness=0 ray start --head             # or use"  # the `rayk` block
README_DEMO = "make demo    # 3 brokers on a local Ray"


def test_the_readme_s_rayk_commands_run_as_written(run, run_subprocess, tmp_path, monkeypatch):
    """README's `rayk` block, command by command, in a Ray namespace of its own: this
    module's Ray stands in for `ray start`, and `rayk start` gets the tests' settings (its
    listeners on loopback, as every server in the tests, and FAST_CONFIG's one offsets
    partition). `start` and `stop` run as real processes (the brokers outlive the one that
    started them), the others in this one."""
    monkeypatch.chdir(tmp_path)
    [ray_start, *commands] = readme.shell_commands(readme.block(README_COMMANDS))
    assert ray_start[:3] == ["RAY_worker_niceness=0", "ray", "start"]  # the brokers at nice 0 (rayk/ray_settings.py)
    assert commands[0][:2] == ["rayk", "start"] and commands[-1] == ["rayk", "stop"]
    outputs, stopped = [], False
    try:
        for command in commands:
            stdin = None
            if "|" in command:  # printf '...' | rayk ...
                feed, command = command[: command.index("|")], command[command.index("|") + 1 :]
                assert feed[0] == "printf"
                stdin = feed[1].encode().decode("unicode_escape")
            assert command[0] == "rayk", command
            args = command[1:]
            if args[0] == "start":
                settings = {**FAST_CONFIG, "group.initial.rebalance.delay.ms": 0}
                args += ["--config", *(f"{key}={value}" for key, value in settings.items())]
            real_process = args[0] in ("start", "stop")
            outputs.append(ok((run_subprocess if real_process else run)(*args, stdin=stdin, namespace="cli-readme")))
            stopped = args == ["stop"]
            if args[0] == "start":
                assert_one_line_error(run(*args, namespace="cli-readme"), "already running")
    finally:
        if not stopped:
            run("stop", namespace="cli-readme")
    said = dict(zip((" ".join(c[1:3]) for c in commands), outputs))
    started = said["start --brokers"].split("\n\n")
    assert "started in Ray namespace 'cli-readme'" in started[0] and "cpus" in started[2], "brokers and nodes listed"
    assert [row[0] for row in rows(started[1])] == ["0", "1", "2"]
    assert [row[0] for row in rows(said["status"].split("\n\n")[1])] == ["0", "1", "2"]
    assert said["consume events"].splitlines() == ["a", "b"]
    assert "readers" in said["groups list"] and "readers" in said["groups delete"]
    assert said["topics alter"].strip() == "topic 'events' has 6 partitions"
    assert said["perf produce"].strip().splitlines()[1].split()[0] == "100000"
    assert "stopped" in said["stop"] and (tmp_path / "rayk-data" / "broker-2").is_dir(), "the data stays"
    assert_one_line_error(run("status", namespace="cli-readme"), "no rayk cluster")


def test_the_demo_checks_what_it_produced_and_consumed(cluster, capsys):
    """`make demo`'s first half (`rayk demo`) on this module's cluster, with fewer records;
    its second half, examples/spark_pipeline.py, runs in tests/test_spark.py."""
    readme.block(README_DEMO)
    args = cli.build_parser().parse_args(["demo", "--records", "20000"])
    args.out = sys.stdout
    assert cli.run_demo(args, cluster, time.monotonic()) == 0
    summary = capsys.readouterr().out
    assert "exactly once" in summary and "20,000 x" in summary


def test_the_demo_s_columns_are_the_demo_s_records():
    from rayk.cli import demo_columns, demo_record

    for first, count in [(0, 5), (999, 3), (123_456_789_000, 2)]:
        keys, values = demo_columns(first, count)
        expected = [demo_record(seq) for seq in range(first, first + count)]
        assert list(zip(keys.to_pylist(), [bytes(v) for v in values])) == expected


def test_users_set_list_and_delete_scram_credentials(run, cluster):
    ok(run("users", "set", "carol", "--mechanism", "SCRAM-SHA-256", "--iterations", "4096", stdin="carol-pw\n"))
    ok(run("users", "set", "carol", stdin="carol-pw\n"))  # SCRAM-SHA-512 by default
    listed = ok(run("users", "list"))
    assert [line.split() for line in listed.strip().splitlines()[1:]] == [
        ["carol", "SCRAM-SHA-256", "4096"], ["carol", "SCRAM-SHA-512", "8192"]]
    from rayk.scram import password_matches

    credentials = ray.get(cluster.controller.scram_credentials.remote("carol"))
    assert password_matches(credentials["SCRAM-SHA-512"], "carol-pw"), "the password reached nothing but its keys"
    ok(run("users", "delete", "carol", "--mechanism", "SCRAM-SHA-256"))
    assert "SCRAM-SHA-256" not in ok(run("users", "list", "carol"))
    assert_one_line_error(run("users", "delete", "carol", "--mechanism", "SCRAM-SHA-256"), "RESOURCE_NOT_FOUND")
    assert_one_line_error(run("users", "set", "dave", "--iterations", "10", stdin="pw\n"), "UNACCEPTABLE_CREDENTIAL")
    assert_one_line_error(run("users", "set", "dave", stdin=""), "no password on stdin")


def test_acls_add_list_and_remove(run, cluster):
    added = ok(run("acls", "add", "--allow-principal", "User:alice", "--operation", "read", "--operation", "describe",
                   "--topic", "orders"))
    assert len(added.strip().splitlines()) == 3  # a header and the two ACLs
    ok(run("acls", "add", "--deny-principal", "User:*", "--operation", "write", "--topic", "logs-",
           "--resource-pattern-type", "prefixed"))
    listed = [line.split() for line in ok(run("acls", "list", "--principal", "User:alice")).strip().splitlines()[1:]]
    assert listed == [["User:alice", "allow", "read", "*", "topic", "orders", "literal"],
                      ["User:alice", "allow", "describe", "*", "topic", "orders", "literal"]]
    assert "logs-" in ok(run("acls", "list", "--topic", "logs-", "--resource-pattern-type", "prefixed"))
    assert_one_line_error(run("acls", "remove"), "name what to remove")
    assert ok(run("acls", "remove", "--topic", "orders")).startswith("removed 2 ACL(s)")
    assert "orders" not in ok(run("acls", "list"))
    assert ok(run("acls", "remove", "--topic", "logs")).startswith("removed 0 ACL(s)"), "literal: not the logs- prefix"
    assert "logs-" in ok(run("acls", "list"))
    assert_one_line_error(run("acls", "add", "--allow-principal", "alice", "--operation", "read", "--topic", "t"),
                          "INVALID_REQUEST")
    assert_one_line_error(run("acls", "add", "--operation", "read", "--topic", "t"), "--allow-principal")


def test_quotas_set_list_and_delete(run, cluster):
    assert ok(run("quotas", "set", "--user", "alice", "--client-id-default", "producer_byte_rate=1048576",
                  "request_percentage=50")).startswith("set producer_byte_rate=1048576, request_percentage=50")
    ok(run("quotas", "set", "--client-id", "etl", "consumer_byte_rate=2048"))
    listed = [line.split() for line in ok(run("quotas", "list")).strip().splitlines()[1:]]
    assert ["alice", "<default>", "producer_byte_rate", "1048576"] in listed
    assert ["alice", "<default>", "request_percentage", "50"] in listed
    assert ["etl", "consumer_byte_rate", "2048"] in listed, "no user: an empty cell"
    only_etl = ok(run("quotas", "list", "--client-id", "etl"))
    assert "etl" in only_etl and "alice" not in only_etl
    ok(run("quotas", "delete", "--user", "alice", "--client-id-default", "request_percentage"))
    assert "request_percentage" not in ok(run("quotas", "list", "--user", "alice"))
    assert_one_line_error(run("quotas", "set", "producer_byte_rate=1"), "name a user")
    assert_one_line_error(run("quotas", "set", "--user", "bob", "producer_byte_rate=1.5"), "INVALID_REQUEST")
    assert_one_line_error(run("quotas", "set", "--user", "bob", "producer_byte_rate=fast"), "is a number")
    ok(run("quotas", "delete", "--user", "alice", "--client-id-default", "producer_byte_rate"))
    ok(run("quotas", "delete", "--client-id", "etl", "consumer_byte_rate"))
    assert not ok(run("quotas", "list")).strip()
