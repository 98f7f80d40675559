"""Client quotas on a running cluster, as Kafka clients meet them: AlterClientQuotas and
DescribeClientQuotas over the wire (and the Python Admin seeing the same quotas); a
producer over its producer_byte_rate is throttled (throttle_time_ms in its answers, its
connection muted meanwhile; an old Produce version's answer waits instead) while a
producer of another client id is not; a consumer over its consumer_byte_rate reads at
most its window's worth and then gets empty answers with a throttle time; a client over
its request_percentage gets throttle times capped at one sample.

The quota window is 3 samples of 1 s here (Kafka: 11), so a burst allowance is 2 s of
the quota and tests wait seconds, not tens of seconds."""

from __future__ import annotations

import time

import confluent_kafka
import pytest

import rayk
from rayk.net.api_versions import (
    ALTER_CLIENT_QUOTAS, API_VERSIONS, DESCRIBE_CLIENT_QUOTAS, FETCH, METADATA, PRODUCE,
)
from rayk.quotas import DEFAULT, PRODUCER_BYTE_RATE, QuotaEntity, QuotaFilterComponent, MATCH_DEFAULT, USER
from tests.cluster_helpers import FAST_CONFIG, assert_lookup_is_a_long_poll, batch_of, shared_local_ray, wait_until
from tests.protocol_helpers import RawConnection, decode_response, request_frame, sized

TOPIC = "quota-topic"
INVALID_REQUEST = 42
QUOTA_PROPAGATION_S = 1.0  # listeners take quota changes as the Controller commits them (a long poll)
WINDOW_S = 2  # (quota.window.num - 1) * quota.window.size.seconds: what a first burst is measured over


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    shared_local_ray()
    c = rayk.start(brokers=1, data_dir=tmp_path_factory.mktemp("quotas"), namespace="listener-quotas", config={
        **FAST_CONFIG, "quota.window.num": 3, "quota.window.size.seconds": 1,
        "num.partitions": 1, "default.replication.factor": 1, "offsets.topic.replication.factor": 1,
    })
    c.create_topic(TOPIC, num_partitions=1, replication_factor=1)
    yield c
    c.shutdown()


def alter(connection: RawConnection, entries: list[tuple[list, list]], validate_only: bool = False) -> list[tuple[int, str]]:
    """AlterClientQuotas v1: entries of ([(type, name)], [(key, value or None to remove)]);
    per entry (error code, message)."""
    response = connection.call(ALTER_CLIENT_QUOTAS, 1, {"validate_only": validate_only, "entries": [
        {"entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
         "ops": [{"key": k, "value": v or 0.0, "remove": v is None} for k, v in ops]}
        for entity, ops in entries]})
    return [(e.error_code.value, e.error_message) for e in response.entries]


def describe(connection: RawConnection, components: list[dict], strict: bool = False) -> dict:
    response = connection.call(DESCRIBE_CLIENT_QUOTAS, 1, {"components": components, "strict": strict})
    assert response.error_code.value == 0, response.error_message
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
            for entry in response.entries}


def set_quota(cluster, client_id: str, key: str, value: float | None) -> None:
    """Sets (or with None removes) a quota and waits for the listeners to have it; a
    removal does not wait, since no test uses that client id again."""
    (error,) = cluster.admin().alter_client_quotas({QuotaEntity(client_id=client_id): {key: value}}).values()
    assert error is None, error
    if value is not None:
        time.sleep(QUOTA_PROPAGATION_S)


def test_listeners_take_quota_changes_from_a_long_poll_at_the_controller(cluster):
    entity = QuotaEntity(client_id="long-poll")

    def change() -> None:
        (error,) = cluster.admin().alter_client_quotas({entity: {PRODUCER_BYTE_RATE: 1234.0}}).values()
        assert error is None, error

    try:
        quotas = assert_lookup_is_a_long_poll(cluster.controller, "client_quotas", change)
        assert quotas[entity] == {PRODUCER_BYTE_RATE: 1234.0}
    finally:
        cluster.admin().alter_client_quotas({entity: {PRODUCER_BYTE_RATE: None}})


def produce_frame(client_id: str, values: list[bytes], version: int = 9, correlation_id: int = 7) -> bytes:
    return sized(request_frame(PRODUCE, version, {"acks": -1, "timeout": 10_000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": 0, "records": batch_of(values)}]}]}, correlation_id, client_id))


def test_quotas_are_altered_and_described_over_the_wire_as_the_admin_sees_them(cluster):
    connection = RawConnection(cluster.bootstrap_servers)
    try:
        results = alter(connection, [
            ([("user", None)], [("producer_byte_rate", 1_048_576.0)]),
            ([("user", "alice"), ("client-id", "app")], [("consumer_byte_rate", 2048.0), ("request_percentage", 25.0)]),
            ([("user", "bob")], [("controller_mutation_rate", 1.0)]),
            ([("ip", "10.0.0.1")], [("connection_creation_rate", 1.0)]),
            ([("user", "carol")], [("producer_byte_rate", -5.0)]),
        ])
        assert [code for code, _ in results] == [0, 0, INVALID_REQUEST, INVALID_REQUEST, INVALID_REQUEST], results
        assert "controller_mutation_rate" in results[2][1] and "positive" in results[4][1]
        assert alter(connection, [([("user", "dave")], [("producer_byte_rate", 1.0)])], validate_only=True) == [(0, None)]

        everything = describe(connection, [])
        assert everything == {(("user", None),): {"producer_byte_rate": 1_048_576.0},
                              (("user", "alice"), ("client-id", "app")): {"consumer_byte_rate": 2048.0,
                                                                          "request_percentage": 25.0}}, "not dave's"
        assert list(describe(connection, [{"entity_type": "user", "match_type": 1, "match": None}])) == [(("user", None),)]
        assert list(describe(connection, [{"entity_type": "user", "match_type": 0, "match": "alice"}], strict=True)) == []
        assert cluster.admin().describe_client_quotas() == {
            QuotaEntity(DEFAULT): {"producer_byte_rate": 1_048_576.0},
            QuotaEntity("alice", "app"): {"consumer_byte_rate": 2048.0, "request_percentage": 25.0},
        }
        assert list(cluster.admin().describe_client_quotas([QuotaFilterComponent(USER, MATCH_DEFAULT)])) == [QuotaEntity(DEFAULT)]
        bad_filter = connection.call(DESCRIBE_CLIENT_QUOTAS, 1, {"components": [
            {"entity_type": "user", "match_type": 0, "match": None}], "strict": False})
        assert bad_filter.error_code.value == INVALID_REQUEST

        assert alter(connection, [([("user", None)], [("producer_byte_rate", None)]),
                                  ([("user", "alice"), ("client-id", "app")],
                                   [("consumer_byte_rate", None), ("request_percentage", None)])]) == [(0, None), (0, None)]
        assert describe(connection, []) == {}
    finally:
        connection.close()


def test_a_producer_over_its_byte_rate_is_throttled_and_another_client_id_is_not(cluster):
    rate_bytes_per_s, rounds, round_bytes = 25_000, 5, 25_000
    set_quota(cluster, "slow-producer", "producer_byte_rate", rate_bytes_per_s)
    throttles: dict[str, list[int]] = {"slow-producer": [], "fast-producer": []}
    elapsed_s = {}
    for client_id in throttles:
        producer = confluent_kafka.Producer({
            "bootstrap.servers": cluster.bootstrap_servers, "client.id": client_id, "acks": "all", "linger.ms": 5,
            "throttle_cb": lambda event, client_id=client_id: throttles[client_id].append(event.throttle_time),
        })
        started = time.monotonic()
        for _ in range(rounds):  # a throttle holds back the requests after the one it answers
            for i in range(round_bytes // 1000):
                producer.produce(TOPIC, b"%06d" % i + b"x" * 994)
            assert producer.flush(60) == 0
        elapsed_s[client_id] = time.monotonic() - started
        del producer
    assert throttles["slow-producer"] and max(throttles["slow-producer"]) > 0, "its answers carried throttle times"
    assert not any(throttles["fast-producer"]), "no quota, no throttle"
    # After the first window's burst, the quota's pace (half of it: the quota is an average).
    expected_s = (rounds * round_bytes - WINDOW_S * rate_bytes_per_s) / rate_bytes_per_s
    assert elapsed_s["slow-producer"] > 0.5 * expected_s, elapsed_s
    set_quota(cluster, "slow-producer", "producer_byte_rate", None)


def test_a_throttled_connection_starts_nothing_until_its_throttle_time_has_passed(cluster):
    set_quota(cluster, "muted", "producer_byte_rate", 1_000)
    connection = RawConnection(cluster.bootstrap_servers, timeout_s=30)
    try:
        connection.send(produce_frame("muted", [b"x" * 1000] * 5))  # 2.5 times the window's allowance
        produced = decode_response(PRODUCE, 9, connection.receive())
        assert produced.responses[0].partition_responses[0].error_code.value == 0, "a request over quota is served"
        throttle_s = produced.throttle_time.total_seconds()
        assert throttle_s > 1, produced.throttle_time
        started = time.monotonic()
        versions = connection.call(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"},
                                   client_id="muted")
        assert versions.error_code.value == 0
        assert time.monotonic() - started > 0.8 * throttle_s, "the connection was muted (KIP-219)"
    finally:
        connection.close()

    old = RawConnection(cluster.bootstrap_servers, timeout_s=30)  # Produce v5: the client does not throttle itself
    try:
        started = time.monotonic()
        old.send(produce_frame("muted", [b"y" * 1000] * 5, version=5))
        produced = decode_response(PRODUCE, 5, old.receive())
        throttle_s = produced.throttle_time.total_seconds()
        assert throttle_s > 1 and time.monotonic() - started > 0.8 * throttle_s, "the answer itself waited"
    finally:
        old.close()
    set_quota(cluster, "muted", "producer_byte_rate", None)


def fetch(connection: RawConnection, client_id: str, topic: str, max_bytes: int = 50 * 1024 * 1024) -> tuple[int, float]:
    """A sessionless Fetch v11 of partition 0 from offset 0: (record bytes answered, throttle s)."""
    connection.send(sized(request_frame(FETCH, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": max_bytes, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0, "log_start_offset": -1,
                                                    "partition_max_bytes": max_bytes, "current_leader_epoch": -1}]}],
    }, client_id=client_id)))
    answer = decode_response(FETCH, 11, connection.receive())
    assert answer.error_code.value == 0
    records = sum(len(p.records or b"") for t in answer.responses for p in t.partitions)
    return records, answer.throttle_time.total_seconds()


def test_a_consumer_reads_at_most_its_windows_worth_then_gets_empty_throttled_answers(cluster):
    topic, batch_bytes = "quota-fetch-topic", 3_000
    cluster.create_topic(topic, num_partitions=1, replication_factor=1)
    with cluster.producer() as producer:
        for _ in range(10):  # ten batches of three 1,000-byte records
            producer.send_batch(topic, [b"z" * 1000] * 3, partition=0).result(timeout=30)
    rate_bytes_per_s = 1_000  # the window allows 2,000 bytes: less than one batch
    set_quota(cluster, "reader", "consumer_byte_rate", rate_bytes_per_s)
    first = RawConnection(cluster.bootstrap_servers, timeout_s=30)
    second = RawConnection(cluster.bootstrap_servers, timeout_s=30)  # a new connection: not muted
    try:
        records, _ = fetch(first, "reader", topic)
        assert batch_bytes <= records < 2 * batch_bytes, "one whole batch (at least one is always answered)"
        read_again, throttle_s = fetch(second, "reader", topic)
        assert read_again == 0 and throttle_s > 0, "over quota: an empty answer and how long to wait"
    finally:
        first.close()
        second.close()
    other = RawConnection(cluster.bootstrap_servers)
    try:
        unthrottled, _ = fetch(other, "other-reader", topic)
        assert unthrottled > 9 * batch_bytes, "another client id reads as much as it asks for"
    finally:
        other.close()
    set_quota(cluster, "reader", "consumer_byte_rate", None)


def test_request_time_over_its_percentage_is_throttled_by_at_most_one_sample(cluster):
    set_quota(cluster, "chatty", "request_percentage", 0.01)  # 0.1 ms of listener thread time per second
    connection = RawConnection(cluster.bootstrap_servers, timeout_s=30)
    try:
        def throttled() -> float:
            answer = connection.call(METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                    "include_topic_authorized_operations": False}, client_id="chatty")
            return answer.throttle_time.total_seconds()

        throttle_s = wait_until(throttled, 30, "a Metadata request throttled for its request time")
        assert 0 < throttle_s <= 1.0, "capped at quota.window.size.seconds"
    finally:
        connection.close()
    set_quota(cluster, "chatty", "request_percentage", None)


def test_a_throttled_consumer_with_a_fetch_session_reads_every_record_once_in_order(cluster):
    """kafka-python keeps a fetch session (KIP-227): throttled empty answers must keep it
    in step, so that nothing is skipped or read twice."""
    import kafka

    topic, count = "quota-session-topic", 300
    cluster.create_topic(topic, num_partitions=2, replication_factor=1)
    with cluster.producer() as producer:
        producer.send_batch(topic, [b"%04d" % i + b"v" * 196 for i in range(count)],
                            partition=[i % 2 for i in range(count)]).result(timeout=30)
    rate_bytes_per_s = 10_000
    set_quota(cluster, "session-reader", "consumer_byte_rate", rate_bytes_per_s)
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=cluster.bootstrap_servers, client_id="session-reader",
                                   auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=20_000,
                                   max_partition_fetch_bytes=4096)
    try:
        started = time.monotonic()
        seen = [(m.partition, int(m.value[:4])) for _, m in zip(range(count), consumer)]
        assert next(iter(consumer.poll(timeout_ms=1000).values()), []) == [], "nothing more"
        elapsed_s = time.monotonic() - started
    finally:
        consumer.close()
    for partition in (0, 1):
        assert [i for p, i in seen if p == partition] == list(range(partition, count, 2)), "all, once, in order"
    assert elapsed_s > 0.5 * (count * 200 / rate_bytes_per_s - WINDOW_S), elapsed_s
    set_quota(cluster, "session-reader", "consumer_byte_rate", None)
