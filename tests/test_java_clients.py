"""Kafka's JVM side against rayk's listeners, with kafka-clients, kafka-streams and
kafka-tools 4.2.1 (the programs in tests/jvm, built by Maven; tests/jvm_programs.py):

- the Java producer, idempotent with acks=all, read back by rayk's consumer;
- a classic consumer group with the cooperative-sticky assignor and static members,
  rebalancing as members come and go;
- the AdminClient on topics, configs, partitions and groups; APIs rayk leaves out of
  ApiVersions fail in the client, and a version rayk does not serve is answered
  UNSUPPORTED_VERSION on a connection that stays usable;
- Kafka's command-line tools for topics, consumer groups and configs;
- Kafka Streams' word count (at-least-once) across a restart of the application and of
  a broker; exactly_once_v2 fails at once, as rayk has no transactions;
- Kafka's VerifiableProducer and VerifiableConsumer while a broker's process is killed
  and comes back (last: it kills a broker).

ACLs and SCRAM users through the AdminClient and kafka-acls over SASL_SSL are in
test_listener_acls.py, on its secured cluster."""

from __future__ import annotations

import collections
import itertools
import os
import signal
import struct
import time
import uuid
from collections import Counter

import pytest
import ray

import rayk
from rayk.client import TopicPartition
from rayk.client.partitioner import partition_for_key
from rayk.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, coordinator_partition
from rayk.net.api_versions import METADATA, SUPPORTED_VERSIONS
from tests.cluster_helpers import FAST_CONFIG, consume_topic, pid_of, shared_local_ray, wait_for_live_brokers, wait_until
from tests.faults.harness import healthy
from tests.jvm_programs import JavaProcess, Jvm

CONFIG = {
    **FAST_CONFIG,
    "group.initial.rebalance.delay.ms": 0,
    "group.min.session.timeout.ms": 1000,
    "num.partitions": 3,
    "default.replication.factor": 3,
    "auto.leader.rebalance.enable": False,
    "group.consumer.heartbeat.interval.ms": 500,  # KIP-848 members' (the broker's setting)
    "group.consumer.session.timeout.ms": 30000,  # outlasts a static member's JVM restart on a busy machine
}
TOPICS_TOOL = "org.apache.kafka.tools.TopicCommand"  # kafka-topics.sh
GROUPS_TOOL = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"  # kafka-consumer-groups.sh
CONFIGS_TOOL = "kafka.admin.ConfigCommand"  # kafka-configs.sh
SHARE_GROUPS_TOOL = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"  # kafka-share-groups.sh
_names = itertools.count()
pytestmark = pytest.mark.usefixtures("delete_topics_after_test")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, jvm):
    shared_local_ray()
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("java-clients"), config=CONFIG, namespace="java-clients")
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def bootstrap(cluster) -> str:
    return cluster.bootstrap_servers


def new_topic(cluster, partitions: int = 3, replication_factor: int = 3, **config: str) -> str:
    name = f"j{next(_names)}-{uuid.uuid4().hex[:6]}"
    wait_for_live_brokers(cluster, replication_factor)  # (an earlier test may have killed one)
    cluster.create_topic(name, num_partitions=partitions, replication_factor=replication_factor, config=config or None)
    return name


def test_the_java_producer_idempotent_with_acks_all_writes_what_rayk_reads(cluster, bootstrap, jvm):
    """Kafka's Java producer with its defaults (idempotent, acks=all): every record is
    acknowledged once, at the partition of Kafka's murmur2 key partitioner, and rayk's
    consumer reads keys, values and headers back at the acknowledged offsets."""
    topic = new_topic(cluster)
    events = jvm.run("rayk.jvm.ProduceCheck", bootstrap, topic, 300)
    acked = {e["seq"]: (e["partition"], e["offset"]) for e in events if e["event"] == "acked"}
    assert sorted(acked) == list(range(300)) and events[-1]["event"] == "done"
    assert all(partition == partition_for_key(f"k{seq}".encode(), 3) for seq, (partition, _) in acked.items())
    records = consume_topic(cluster, topic, 300)
    stored = {(r.partition, r.offset): r for r in records}
    assert len(records) == len(stored) == 300
    for seq, where in acked.items():
        record = stored[where]
        assert (record.key, record.value, record.headers) == (f"k{seq}".encode(), f"v{seq}".encode(),
                                                              [("seq", str(seq).encode())])


def member(jvm: Jvm, bootstrap: str, topic: str, group: str, instance_id: str = "-", *settings: str) -> JavaProcess:
    return jvm.start("rayk.jvm.GroupMember", bootstrap, topic, group, instance_id, *settings)


def consumed_values(*members: JavaProcess) -> Counter:
    return Counter(r.split(":", 2)[2] for m in members for e in m.events if e["event"] == "consumed" for r in e["records"])


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_java_group_moves_only_what_must_and_keeps_static_members(cluster, bootstrap, jvm, protocol):
    """A group of Java consumers, of the classic protocol with the cooperative-sticky
    assignor or of KIP-848's (group.protocol=consumer): a second member takes half the
    partitions while the first revokes only those, once; a static member that restarts
    within its session gets its partitions back and no one else is touched (classic: a
    rejoin in the same generation; consumer: it left with epoch -2 and its instance id
    takes its place over); one that leaves (by its instance id) hands them back at once.
    Every record is consumed, and the group commits to the end."""
    topic, group = new_topic(cluster, partitions=4, replication_factor=1), f"java-{protocol}-{uuid.uuid4().hex[:6]}"
    partitions = [f"{topic}-{p}" for p in range(4)]
    # A static member's session outlasts its restart: a JVM's start can take more than 6 s
    # on a busy machine (with consumer, the broker's group.consumer.session.timeout.ms).
    settings = [f"group.protocol={protocol}"] + (["session.timeout.ms=30000"] if protocol == "classic" else [])
    a = member(jvm, bootstrap, topic, group, "a", *settings)
    b = b_again = None
    try:
        a.wait_for("assigned", where=lambda e: e["owned"] == partitions)
        b = member(jvm, bootstrap, topic, group, "b", *settings)
        moved = sorted(b.wait_for("assigned", where=lambda e: e["partitions"])["partitions"])
        assert len(moved) == 2
        wait_until(lambda: [sorted(e["partitions"]) for e in a.events if e["event"] == "revoked"] == [moved], 30,
                   "the first member to revoke only what moves, once")
        assert not any(e["event"] == "lost" for e in a.events)

        jvm.run("rayk.jvm.ProduceCheck", bootstrap, topic, 60)
        wait_until(lambda: len(consumed_values(a, b)) == 60, 30, "both members to consume the 60 records")

        events_of_a = len(a.events)
        assert b.stop("close") == 0  # a static member's close() does not leave the group
        b_again = member(jvm, bootstrap, topic, group, "b", *settings)
        assert sorted(b_again.wait_for("assigned", where=lambda e: e["partitions"])["partitions"]) == moved
        time.sleep(1)
        assert a.events[events_of_a:] == [], "a static member's return moves nothing"

        assert b_again.stop("leave") == 0
        wait_until(lambda: any(e["event"] == "assigned" and sorted(e["owned"]) == partitions for e in a.events[events_of_a:]),
                   30, "the first member to get every partition back")
    finally:
        for process in (a, b, b_again):
            if process is not None:
                process.stop("halt")
    assert sorted(consumed_values(a, b, b_again)) == sorted(f"v{i}" for i in range(60))
    assert sum(committed_offsets(cluster, group).values()) == 60


def committed_offsets(cluster, group: str) -> dict[int, int]:
    return {tp.partition: p["committed"] for tp, p in cluster.admin().describe_consumer_groups([group])[group]["partitions"].items()}


def test_the_java_admin_client_manages_topics_configs_and_partitions(cluster, bootstrap, jvm):
    topic = f"j{next(_names)}-admin-{uuid.uuid4().hex[:6]}"
    events = {e["event"] if e["event"] != "error" else e["step"]: e
              for e in jvm.run("rayk.jvm.AdminCheck", bootstrap, "topics", topic)}
    assert events["cluster"]["brokers"] == 3 and events["cluster"]["cluster_id"] == ray.get(cluster.controller.cluster_id.remote())
    assert events["create_existing"]["error"] == "TopicExistsException"
    described = events["described"]["partitions"]
    assert [(p["replicas"], p["isr"]) for p in described] == [(3, 3), (3, 3)]
    assert events["configs"]["dynamic"] == {"cleanup.policy": "compact"}  # retention.ms set, then deleted
    assert events["partitions"]["count"] == 4
    assert events["shrink"]["error"] == "InvalidPartitionsException"
    assert events["offsets"]["latest"] == [0, 0, 0, 0]
    assert events["deleted"]["topics"] == [] and topic not in cluster.list_topics()
    assert events["delete_missing"]["error"] == "UnknownTopicOrPartitionException"


def test_the_java_admin_client_lists_describes_alters_and_deletes_groups(cluster, bootstrap, jvm):
    topic, group = new_topic(cluster, partitions=2, replication_factor=1), f"java-admin-group-{uuid.uuid4().hex[:6]}"
    producer = cluster.producer()
    for i in range(10):
        producer.send(topic, f"v{i}".encode(), partition=i % 2)
    producer.flush()
    consumer = cluster.consumer(topic, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False)
    wait_until(lambda: sum(len(b) for b in consumer.poll(timeout_ms=200).values()) or consumer.assignment(), 30,
               "rayk's consumer to join")
    to_the_end = {TopicPartition(topic, p): 5 for p in range(2)}
    consumer.commit(to_the_end)
    consumer.close(autocommit=False)
    events = {e["event"] if e["event"] != "error" else e["step"]: e
              for e in jvm.run("rayk.jvm.AdminCheck", bootstrap, "groups", group, topic)}
    assert group in events["listed"]["groups"] and events["listed"]["types"] == ["Classic"]
    assert (events["described"]["state"], events["described"]["members"]) == ("Empty", 0)
    assert events["committed"]["offsets"] == {f"{topic}-0": 5, f"{topic}-1": 5}
    assert events["altered"]["offsets"] == {f"{topic}-0": 1, f"{topic}-1": 5}
    assert events["altered"]["metadata"] == "moved by AdminCheck"
    assert events["deleted"]["groups"] == []
    assert events["describe_deleted"]["error"] == "GroupIdNotFoundException"


def test_apis_rayk_does_not_serve_fail_in_the_java_client_before_any_request(cluster, bootstrap, jvm):
    """ApiVersions lists only what rayk serves, so the Java client refuses the rest itself
    (UnsupportedVersionException) and its connections go on serving. DescribeLogDirs is
    served (kafka-log-dirs.sh uses it): broker 0's one data directory, online."""
    events = {e["event"] if e["event"] != "error" else e["step"]: e
              for e in jvm.run("rayk.jvm.AdminCheck", bootstrap, "unsupported", new_topic(cluster, partitions=1))}
    described = events["described_log_dirs"]
    assert described["dirs"] == 1 and described["path"].endswith("broker-0") and described["error"] == "", described
    assert described["total_bytes"] > 0 and described["replicas"] >= 1, described
    assert events["alter_replica_log_dirs"]["error"] == "UnsupportedVersionException", events
    assert "ALTER_REPLICA_LOG_DIRS" in events["alter_replica_log_dirs"]["message"]
    assert events["still_usable"]["topics"] >= 0


def test_java_share_consumers_share_one_partition_release_and_accept_each_record_once(cluster, bootstrap, jvm):
    """Two of Kafka's KafkaShareConsumers (KIP-932) in one share group on a 1-partition
    topic, with explicit acknowledgement: between them every record is accepted once; the
    records each releases come back, to either, with delivery count 2; the group's start
    offset ends past them all. kafka-configs sets the group's share.auto.offset.reset first;
    kafka-share-groups.sh and Kafka's Admin describe, alter and delete its offsets after."""
    topic, group = new_topic(cluster, partitions=1, replication_factor=1), f"java-share-{uuid.uuid4().hex[:6]}"
    group_configs = lambda *args: jvm.tool(CONFIGS_TOOL, "--bootstrap-server", bootstrap, "--entity-type", "groups",  # noqa: E731
                                           "--entity-name", group, *args)
    group_configs("--alter", "--add-config", "share.auto.offset.reset=earliest")  # (IncrementalAlterConfigs, GROUP)
    assert "share.auto.offset.reset=earliest" in group_configs("--describe")
    assert cluster.admin().describe_share_groups([group])[group]["configs"] == {"share.auto.offset.reset": "earliest"}
    with cluster.producer() as producer:
        for i in range(100):
            producer.send(topic, (f"release-{i}" if i % 10 == 0 else str(i)).encode())
    members = [jvm.start("rayk.jvm.ShareMember", bootstrap, topic, group, "max.poll.records=10") for _ in range(2)]
    try:
        def accepted() -> Counter:
            seen = Counter()
            for m in members:
                for e in m.events:
                    for record in e.get("records", ()) if e["event"] == "consumed" else ():
                        _partition, _offset, value, deliveries = record.split(":")
                        if not (value.startswith("release-") and deliveries == "1"):
                            seen[value] += 1
            return seen

        wait_until(lambda: len(accepted()) == 100, 90, "every record accepted")
        assert set(accepted().values()) == {1}  # none twice
        redelivered = [r for m in members for e in m.events if e["event"] == "consumed" for r in e["records"]
                       if r.split(":")[2].startswith("release-") and r.endswith(":2")]  # fmt: skip
        assert len(redelivered) == 10
        assert all(e["failed"] == [] for m in members for e in m.events if e["event"] == "committed")
        wait_until(lambda: cluster.admin().list_share_group_offsets(group) == {(topic, 0): 100}, 30, "SPSO at the end")
        wait_until(lambda: len(cluster.admin().describe_share_groups([group])[group]["members"]) == 2, 30,
                   "both Java members in the group")  # (the second JVM may join after the first did all the work)
    finally:
        for m in members:
            m.stop()

    # The group's offsets once its members left, from kafka-share-groups.sh and Kafka's Admin:
    # DescribeShareGroupOffsets, DeleteShareGroupOffsets and AlterShareGroupOffsets.
    share_groups = lambda *args: jvm.tool(SHARE_GROUPS_TOOL, "--bootstrap-server", bootstrap, "--group", group, *args)  # noqa: E731
    wait_until(lambda: cluster.admin().describe_share_groups([group])[group]["state"] == "Empty", 30, "members to leave")
    shown = [line.split() for line in share_groups("--describe", "--offsets").splitlines() if line.strip()]
    header = next(row for row in shown if row[0] == "GROUP")
    columns = [header.index(name) for name in ("TOPIC", "PARTITION", "START-OFFSET")]
    assert [tuple(row[c] for c in columns) for row in shown if row[0] == group] == [(topic, "0", "100")], shown
    share_groups("--delete-offsets", "--topic", topic)
    assert cluster.admin().list_share_group_offsets(group) == {}
    share_groups("--reset-offsets", "--topic", topic, "--to-latest", "--execute")
    assert cluster.admin().list_share_group_offsets(group) == {(topic, 0): 100}
    events = {e["event"]: e for e in jvm.run("rayk.jvm.AdminCheck", bootstrap, "share-offsets", group, topic)}
    assert events["share_listed"]["offsets"] == {f"{topic}-0": 100}, events
    assert events["share_altered"]["offsets"] == {f"{topic}-0": 0}, events
    assert events["error"]["error"] == "UnknownTopicOrPartitionException", events
    assert events["share_deleted"]["offsets"] == {}, events


def test_a_version_rayk_does_not_serve_is_answered_unsupported_and_the_connection_stays(bootstrap, jvm):
    """Requests framed by kafka-clients' own classes on a bare socket: Metadata one version
    above rayk's ceiling gets UNSUPPORTED_VERSION and the next request on the same
    connection is served; a malformed frame closes only its own connection."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    ceiling = SUPPORTED_VERSIONS[METADATA][1]
    answers = jvm.run("rayk.jvm.RawRequests", host, port, "version", ceiling)
    assert [(a["version"], a["error"]) for a in answers] == [(ceiling + 1, "UNSUPPORTED_VERSION"), (ceiling, "NONE")]
    [garbage] = jvm.run("rayk.jvm.RawRequests", host, port, "garbage", ceiling)
    assert garbage == {"event": "garbage", "closed": True, "other_connection": "NONE"}


def test_the_java_transactional_producer_commits_aborts_and_is_fenced_and_the_admin_describes_it(cluster, bootstrap, jvm):
    """Kafka's Java producer with a transactional.id: a committed transaction is what a
    read_committed reader sees, an aborted one and a zombie's are not; a second producer
    with the same id fences the first (ProducerFencedException at its commit); and the
    admin client's describeProducers, listTransactions and describeTransactions answer."""
    topic, txn_id = new_topic(cluster, 1, replication_factor=1), f"java-tx-{uuid.uuid4().hex[:6]}"
    events = {e["event"]: e for e in jvm.run("rayk.jvm.TxnCheck", bootstrap, topic, txn_id)}
    assert {"committed", "aborted", "committed_new", "done"} <= set(events), events
    assert events["fenced"]["error"] == "ProducerFencedException", events["fenced"]
    assert events["producers"] == {"event": "producers", "count": 1, "open": 0}, events["producers"]
    assert events["transactions"]["state"] == "CompleteCommit", events["transactions"]
    assert events["described"]["state"] == "CompleteCommit" and events["described"]["partitions"] == 0
    # Transaction version 2 (KIP-890), which rayk finalizes: every commit and abort bumped the
    # epoch (0, then 1, 2; the second producer's init fenced the open transaction with 3 and
    # took 4; its commit 5). Under version 1 it would be 2: the init's two bumps only.
    assert events["described"]["epoch"] == 5, events["described"]
    committed = consume_topic(cluster, topic, 6, isolation_level="read_committed")
    assert [r.value for r in committed] == [b"c0", b"c1", b"c2", b"n0", b"n1", b"n2"]
    everything = consume_topic(cluster, topic, 10)
    assert [r.value for r in everything] == [b"c0", b"c1", b"c2", b"a0", b"a1", b"a2", b"z0", b"n0", b"n1", b"n2"]


def test_kafka_topics_consumer_groups_and_configs_tools_work_against_rayk(cluster, bootstrap, jvm):
    """kafka-topics, kafka-consumer-groups and kafka-configs (Kafka's own main classes),
    each verb an operator runs daily, once."""
    topic = f"j{next(_names)}-tools-{uuid.uuid4().hex[:6]}"
    topics = lambda *args: jvm.tool(TOPICS_TOOL, "--bootstrap-server", bootstrap, *args)  # noqa: E731
    assert f"Created topic {topic}." in topics("--create", "--topic", topic, "--partitions", "2",
                                               "--replication-factor", "3", "--config", "retention.ms=600000")
    assert topic in topics("--list").split()
    topics("--alter", "--topic", topic, "--partitions", "3")
    described = topics("--describe", "--topic", topic)
    assert "PartitionCount: 3\tReplicationFactor: 3\tConfigs: retention.ms=600000" in described
    assert described.count("Isr: ") == 3

    configs = lambda *args: jvm.tool(CONFIGS_TOOL, "--bootstrap-server", bootstrap, "--entity-type", "topics",  # noqa: E731
                                     "--entity-name", topic, *args)
    configs("--alter", "--add-config", "cleanup.policy=compact,max.message.bytes=100000")
    configs("--alter", "--delete-config", "retention.ms")
    shown = configs("--describe")
    assert "cleanup.policy=compact" in shown and "max.message.bytes=100000" in shown and "retention.ms" not in shown
    assert cluster.admin().describe_topic_configs(topic) == {"cleanup.policy": "compact", "max.message.bytes": "100000"}

    group = f"tools-group-{uuid.uuid4().hex[:6]}"
    jvm.run("rayk.jvm.ProduceCheck", bootstrap, topic, 30)
    consumer = cluster.consumer(topic, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False)
    wait_until(lambda: consumer.poll(timeout_ms=200) or consumer.assignment(), 30, "rayk's consumer to join")
    consumer.commit({TopicPartition(topic, p): 2 for p in range(3)})
    consumer.close(autocommit=False)
    groups = lambda *args: jvm.tool(GROUPS_TOOL, "--bootstrap-server", bootstrap, *args)  # noqa: E731
    assert group in groups("--list").split()
    rows = [line.split() for line in groups("--describe", "--group", group).splitlines() if line.startswith(group)]
    assert sorted((row[2], row[3]) for row in rows) == [("0", "2"), ("1", "2"), ("2", "2")]
    assert sum(int(row[5]) for row in rows) == 30 - 6  # LAG
    groups("--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute")
    assert committed_offsets(cluster, group) == {0: 0, 1: 0, 2: 0}
    assert "Deletion of requested consumer groups" in groups("--delete", "--group", group)
    assert group not in groups("--list").split()

    topics("--delete", "--topic", topic)
    wait_until(lambda: topic not in cluster.list_topics(), 30, "the topic to be deleted")


def word_counts(cluster, topic: str, isolation_level: str = "read_uncommitted") -> dict[str, int]:
    """The last count of each word in Streams' output topic (String keys, Long values), read
    to the partitions' ends (the LSO, read_committed)."""
    partitions = [TopicPartition(topic, p) for p in range(len(cluster.describe_topic(topic)))]
    reader = cluster.consumer(enable_auto_commit=False, isolation_level=isolation_level)
    try:
        reader.assign(partitions)
        reader.seek_to_beginning()
        ends = reader.end_offsets(partitions)
        records: list = []
        deadline = time.monotonic() + 30
        while any(reader.position(tp) < ends[tp] for tp in partitions) and time.monotonic() < deadline:
            for batch in reader.poll(timeout_ms=500).values():
                records += batch
    finally:
        reader.close()
    return {r.key.decode(): struct.unpack(">q", r.value)[0] for r in sorted(records, key=lambda r: r.offset)}


def write_lines(producer, topic: str, lines: list[str]) -> None:
    """Each line a record keyed by itself, all acknowledged."""
    for line in lines:
        producer.send(topic, line.encode(), key=line.encode())
    producer.flush()


def start_word_count(jvm, bootstrap, app, source, sink, state_dir, guarantee="at_least_once") -> JavaProcess:
    return jvm.start("rayk.jvm.WordCount", bootstrap, app, source, sink, state_dir, guarantee)


@pytest.mark.chaos  # 19 s: in `make chaos`, where the suite's 25-minute budget does not bind
def test_kafka_streams_word_count_is_right_across_a_broker_restart(cluster, bootstrap, jvm, tmp_path):
    """Kafka Streams (at-least-once) creates its repartition topic and its compacted
    changelog on rayk and counts words right, also after the broker coordinating its group
    restarts under it (the new coordinator takes the group's members over, so no commit
    fails and nothing is counted twice). (An application restarting from its changelog and
    committed offsets is the exactly-once test's, which kills it.)"""
    source, sink, app = new_topic(cluster, 2), new_topic(cluster, 2), f"wordcount-{uuid.uuid4().hex[:6]}"
    producer = cluster.producer(acks="all")

    def write(lines: list[str]) -> None:
        write_lines(producer, source, lines)

    changelog, repartition = f"{app}-counts-changelog", f"{app}-words-repartition"
    expected: Counter = Counter()
    lines = [f"the quick brown fox {i % 7} jumps" for i in range(100)]
    write(lines)
    expected.update(w for line in lines for w in line.split())
    streams = start_word_count(jvm, bootstrap, app, source, sink, tmp_path / "state")
    try:
        streams.wait_for("state", 120, where=lambda e: e["state"] == "RUNNING")
        wait_until(lambda: word_counts(cluster, sink) == expected, 60, "the first counts")
        assert {changelog, repartition} <= set(cluster.list_topics())
        assert cluster.admin().describe_topic_configs(changelog)["cleanup.policy"] == "compact"

        offsets_partition = coordinator_partition(app, len(cluster.describe_topic(OFFSETS_TOPIC)))
        coordinator = cluster.describe_topic(OFFSETS_TOPIC)[offsets_partition]["leader"]
        os.kill(pid_of(cluster.broker(coordinator)), signal.SIGKILL)  # Ray restarts its ReplicaManager
        lines = [f"after the broker {i % 2}" for i in range(40)]
        write(lines)
        expected.update(w for line in lines for w in line.split())
        wait_until(lambda: word_counts(cluster, sink) == expected, 90, "the counts across a broker restart")
        assert not [e for e in streams.events if e["event"] == "error"]
        assert streams.stop("close") == 0 and {"event": "closed"} in streams.events, streams.events
    finally:
        streams.stop("close")  # (stopped already, unless the test failed)
    wait_until(lambda: all(healthy(cluster, t) for t in (source, sink, changelog, repartition)), 90,
               "every partition led with its full ISR")


@pytest.mark.chaos  # 30 s: in `make chaos`, where the suite's 25-minute budget does not bind
def test_kafka_streams_exactly_once_v2_counts_exactly_across_an_application_kill_and_a_broker_kill(
        cluster, bootstrap, jvm, tmp_path):
    """Kafka Streams with exactly_once_v2 (transactional producers, offsets committed in the
    transactions, read_committed consumers) counts exactly: what read_committed readers of
    its output see matches the input after its process is SIGKILLed mid-work (its open
    transaction is aborted when the next instance fences it) and after the broker
    coordinating its transactions is SIGKILLed (the new coordinator completes or aborts
    what was in flight)."""
    source, sink, app = new_topic(cluster, 2), new_topic(cluster, 2), f"eos-{uuid.uuid4().hex[:6]}"
    producer = cluster.producer(acks="all")

    def write(lines: list[str]) -> None:
        write_lines(producer, source, lines)

    def counted(what: str, timeout_s: float = 90) -> None:
        wait_until(lambda: word_counts(cluster, sink, "read_committed") == expected, timeout_s, what)

    expected: Counter = Counter()
    lines = [f"one two {i % 5} three" for i in range(60)]
    write(lines)
    expected.update(w for line in lines for w in line.split())
    streams = start_word_count(jvm, bootstrap, app, source, sink, tmp_path / "state", "exactly_once_v2")
    try:
        streams.wait_for("state", 120, where=lambda e: e["state"] == "RUNNING")
        counted("the first counts")

        lines = [f"two {i % 4} four" for i in range(200)]
        write(lines)
        expected.update(w for line in lines for w in line.split())
        streams.process.kill()  # mid-work: a transaction may be open
        streams.stop()
        streams = start_word_count(jvm, bootstrap, app, source, sink, tmp_path / "state", "exactly_once_v2")
        streams.wait_for("state", 120, where=lambda e: e["state"] == "RUNNING")
        counted("the counts after the application was killed")

        lines = [f"five {i % 3}" for i in range(100)]
        write(lines)
        expected.update(w for line in lines for w in line.split())
        os.kill(pid_of(cluster.broker(transaction_coordinator_of(cluster, app))), signal.SIGKILL)  # Ray restarts it
        counted("the counts across a broker kill", 120)
    finally:
        streams.stop("close")
    internal = (f"{app}-counts-changelog", f"{app}-words-repartition")
    wait_until(lambda: all(healthy(cluster, t) for t in (source, sink, *internal)), 90, "every partition led with its full ISR")


def transaction_coordinator_of(cluster, prefix: str) -> int:
    """The broker coordinating the (first) transactional id that starts with `prefix`."""
    for p, state in enumerate(cluster.describe_topic(TRANSACTION_STATE_TOPIC)):
        leader = ray.get(cluster.controller.leader.remote(TRANSACTION_STATE_TOPIC, p))
        if any(md.transactional_id.startswith(prefix) for md in ray.get(leader.transactions.remote())):
            return state["leader"]
    raise AssertionError(f"no transactional id starts with {prefix!r}")


# Last in the module: it kills a broker's process.
SENDS = 3500  # 7 s at 500/s: the broker is killed ~1 s in


@pytest.mark.chaos  # in `make chaos` with the test above
def test_verifiable_producer_and_consumer_lose_nothing_while_a_broker_is_killed(cluster, bootstrap, jvm):
    """Kafka's own replication check (its system tests' VerifiableProducer and
    VerifiableConsumer, acks=all, min.insync.replicas=2): a broker's process is killed with
    SIGKILL while they run and Ray brings it back. Every acknowledged record is consumed,
    and no committed offset of the group goes backwards. VerifiableProducer sets retries=0,
    so the sends in flight to partitions the killed broker led fail until their leaders have
    moved (~1-2 s on 2 busy cores); the sends after that are acknowledged again."""
    topic, group = new_topic(cluster, **{"min.insync.replicas": "2"}), f"verifiable-{uuid.uuid4().hex[:6]}"
    consumer = jvm.start("org.apache.kafka.tools.VerifiableConsumer", "--bootstrap-server", bootstrap,
                         "--topic", topic, "--group-id", group, "--verbose", "--reset-policy", "earliest",
                         "--session-timeout", "6000")
    producer = None
    try:
        consumer.wait_for("partitions_assigned", 60, where=lambda e: e["partitions"])
        producer = jvm.start("org.apache.kafka.tools.VerifiableProducer", "--bootstrap-server", bootstrap,
                             "--topic", topic, "--max-messages", str(SENDS), "--throughput", "500", "--acks", "-1")
        producer.wait_for("producer_send_success", 60)
        time.sleep(1)
        os.kill(pid_of(cluster.broker(0)), signal.SIGKILL)
        producer.wait_for("shutdown_complete", 120)
        acked = {e["value"] for e in producer.events if e["event"] == "producer_send_success"}
        errors = [e for e in producer.events if e["event"] == "producer_send_error"]
        why = collections.Counter((e.get("exception"), e.get("message")) for e in errors)
        assert len(acked) + len(errors) == SENDS, (len(acked), why)
        assert {str(v) for v in range(SENDS - 500, SENDS)} <= acked, ("the last second of sends failed", len(acked), why)
        consumed = lambda: {e["value"] for e in consumer.events if e["event"] == "record_data"}  # noqa: E731
        wait_until(lambda: acked <= consumed(), 120, "the consumer to read every acknowledged record")
    finally:
        if producer is not None:
            producer.stop(None)
        consumer.stop(None)
    last: dict[tuple[str, int], int] = {}
    for event in consumer.events:
        if event["event"] == "offsets_committed" and event["success"]:
            for o in event["offsets"]:
                where = (o["topic"], o["partition"])
                assert o["offset"] >= last.get(where, 0), f"the committed offset of {where} went back"
                last[where] = o["offset"]
    wait_until(lambda: healthy(cluster, topic), 90, "every partition led with its full ISR")
