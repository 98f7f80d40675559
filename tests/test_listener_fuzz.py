"""Bad input on the wire: garbage, truncated frames, absurd sizes, unknown API keys, wrong
versions and huge arrays get an error answer or a closed connection; the broker keeps
serving every other connection and nothing stored changes. A hypothesis fuzz run sends
random and mutated frames for a bounded time, in clear text and inside TLS, then a real
client must still work; others fuzz the TLS handshake itself (mutated ClientHellos) and
SASL exchanges (mutated SaslHandshake / SaslAuthenticate frames and bare tokens)."""

from __future__ import annotations

import os
import ssl
import struct
import time
from typing import Any

import confluent_kafka
import kafka
import pytest
import scramp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.structs import TopicPartition as KafkaTopicPartition

import rayk
from rayk.client.admin import ScramUpsertion
from rayk.net import api_versions as keys
from rayk.storage.records import ATTRIBUTES_POS, CRC_POS, SimpleRecord, build_batch, compute_crc
from tests.cluster_helpers import FAST_CONFIG, shared_local_ray
from tests.protocol_helpers import RawConnection, decode_response, request_frame, sized

UNSUPPORTED_VERSION, INVALID_REQUEST = 35, 42
KEPT = [f"kept-{i}".encode() for i in range(50)]
# Each fuzz test's time bound; longer runs: RAYK_FUZZ_SECONDS=300 .venv/bin/python -m pytest tests/test_listener_fuzz.py
FUZZ_SECONDS = float(os.environ.get("RAYK_FUZZ_SECONDS", 4))
MIN_FUZZED_FRAMES = 50  # a run sends at least this many, taking longer than FUZZ_SECONDS on a loaded machine
FUZZER_PASSWORD = "fuzzer-pw"


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tls):
    config = {**FAST_CONFIG, "socket.request.max.bytes": 1 << 20, "auto.create.topics.enable": "false",
              "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
              "ssl.keystore.location": tls.keystore, "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN"}
    c = rayk.start(brokers=1, data_dir=tmp_path_factory.mktemp("fuzz"), config=config, namespace="fuzz")
    c.admin().alter_user_scram_credentials([ScramUpsertion("fuzzer", "SCRAM-SHA-512", FUZZER_PASSWORD)])
    c.create_topic("kept", num_partitions=1, replication_factor=1)
    c.create_topic("fuzz", num_partitions=1, replication_factor=1)
    producer = c.producer()
    for value in KEPT:
        producer.send("kept", value)
    producer.flush()
    producer.close()
    yield c
    c.shutdown()


@pytest.fixture
def address(cluster):
    return cluster.bootstrap_servers


def assert_serves_and_kept_is_intact(address):
    consumer = kafka.KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False)
    tp = KafkaTopicPartition("kept", 0)
    consumer.assign([tp])
    consumer.seek_to_beginning()
    values = []
    deadline = time.monotonic() + 20
    while len(values) < len(KEPT) and time.monotonic() < deadline:
        values += [r.value for batch in consumer.poll(timeout_ms=500).values() for r in batch]
    assert values == KEPT
    assert consumer.end_offsets([tp])[tp] == len(KEPT)
    consumer.close()


def send_and_drain(address: str, payload: bytes, tls: ssl.SSLContext | None = None) -> bool:
    """Sends `payload` on a new connection, says it will send no more, and reads until the
    broker closes it (the broker answers what it read, then sees EOF). False if the
    connection did not open: a TLS handshake that did not finish in time on a busy
    machine, which is not the broker's answer to the payload."""
    try:
        conn = RawConnection(address, timeout_s=5, tls=tls)
    except OSError:
        return False
    try:
        conn.send(payload)
        conn.sock.shutdown(1)
        while conn.sock.recv(1 << 16):
            pass
    except OSError:
        pass  # the broker closed first
    finally:
        conn.close()
    return True


def metadata_ok(address) -> bool:
    conn = RawConnection(address)
    try:
        return any(t.name == "kept" for t in conn.call(keys.METADATA, 12, {"topics": None}).topics)
    finally:
        conn.close()


def test_absurd_sizes_and_truncated_frames_close_only_their_connection(address):
    for data in (struct.pack(">i", -5), struct.pack(">i", 2**31 - 1), struct.pack(">i", (1 << 20) + 1) + b"x" * 100):
        conn = RawConnection(address)
        conn.send(data)
        assert conn.receive() is None, "closed without reading the body"
        conn.close()
    conn = RawConnection(address)
    conn.send(struct.pack(">i", 100) + b"only ten b")
    conn.close()  # the broker waits for the rest, then sees EOF
    conn = RawConnection(address)
    conn.send(sized(b"\x00\x03"))  # too short for a header: no correlation id to answer to
    assert conn.receive() is None
    conn.close()
    assert metadata_ok(address)


def test_unknown_keys_and_versions_get_unsupported_version(address):
    conn = RawConnection(address)
    try:
        conn.send(sized(struct.pack(">hhi", 999, 0, 5) + b"\x00\x00"))
        assert struct.unpack(">ih", conn.receive()) == (5, UNSUPPORTED_VERSION)
        too_new = request_frame(keys.METADATA, 12, {}, correlation_id=6)
        conn.send(sized(too_new[:2] + struct.pack(">h", 13) + too_new[4:]))
        answer = conn.receive()
        assert struct.unpack_from(">i", answer)[0] == 6 and len(answer) > 4
        produce_v2 = struct.pack(">hhi", keys.PRODUCE, 2, 8) + b"\x00\x04test"
        conn.send(sized(produce_v2))  # below Kafka 4.0's floor
        assert struct.unpack(">ih", conn.receive()) == (8, UNSUPPORTED_VERSION)
        conn.send(sized(struct.pack(">hhi", keys.API_VERSIONS, 99, 9) + b"\x00\x04test"))
        answer = conn.receive()  # KIP-511: v0 answer with the error and the served versions
        correlation_id, error, count = struct.unpack_from(">ihi", answer)
        assert (correlation_id, error, count) == (9, UNSUPPORTED_VERSION, len(keys.SUPPORTED_VERSIONS))
        body = conn.call(keys.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}, 10)
        assert body.error_code.value == 0  # the same connection still serves
        # KIP-584's features: transaction version 2 finalized, so Kafka's clients run KIP-890 part 2,
        # group version 1 (KIP-848's consumer protocol), as Kafka 4.0 finalizes them, and share
        # version 1 (KIP-932's share groups, Kafka 4.1+). v3 leaves out a supported range from 0,
        # which clients before Kafka 3.7 refuse.
        finalized = {f.name: (f.min_version_level, f.max_version_level) for f in body.finalized_features}
        assert finalized == {"transaction.version": (2, 2), "group.version": (1, 1), "share.version": (1, 1)}
        assert body.finalized_features_epoch >= 0
        assert body.supported_features == ()
        v4 = conn.call(keys.API_VERSIONS, 4, {"client_software_name": "t", "client_software_version": "1"}, 11)
        assert {f.name: (f.min_version, f.max_version) for f in v4.supported_features} == {
            "transaction.version": (0, 2), "group.version": (0, 1), "share.version": (0, 1)}
    finally:
        conn.close()


def test_huge_arrays_and_garbage_bodies_are_invalid_requests(address):
    conn = RawConnection(address)
    try:
        header = request_frame(keys.METADATA, 4, {"topics": []}, correlation_id=11)[:-5]  # header of v4
        conn.send(sized(header + struct.pack(">i", 2**31 - 1) + b"\x00\x01a"))
        answer = conn.receive()
        assert answer is not None and struct.unpack_from(">i", answer)[0] == 11
        conn.send(sized(struct.pack(">hhi", keys.PRODUCE, 9, 12) + b"\xff" * 40))
        assert struct.unpack_from(">i", conn.receive())[0] == 12
        assert conn.call(keys.METADATA, 12, {"topics": None}, 13).cluster_id
    finally:
        conn.close()
    assert_serves_and_kept_is_intact(address)


def _valid_frames() -> list[bytes]:
    batch = b"\x00" * 61  # a record batch's size, but not a valid one
    return [
        request_frame(keys.METADATA, 12, {"topics": [{"name": "fuzz"}]}),
        request_frame(keys.PRODUCE, 9, {"acks": -1, "timeout": 1000, "topic_data": [
            {"name": "fuzz", "partition_data": [{"index": 0, "records": batch}]}]}),
        request_frame(keys.FETCH, 12, {"max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 16, "session_epoch": -1,
                                       "topics": [{"topic": "fuzz", "partitions": [
                                           {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 16}]}]}),
        request_frame(keys.LIST_OFFSETS, 6, {"topics": [{"name": "fuzz", "partitions": [
            {"partition_index": 0, "timestamp": -1}]}]}),
        request_frame(keys.FIND_COORDINATOR, 3, {"key": "g"}),
        request_frame(keys.OFFSET_FETCH, 7, {"group_id": "g", "topics": None}),
        request_frame(keys.API_VERSIONS, 3, {"client_software_name": "f", "client_software_version": "1"}),
    ]


@pytest.mark.parametrize("listener", ["PLAINTEXT", "SSL"])
def test_fuzzed_frames_for_a_bounded_time_then_a_real_client_works(address, cluster, tls, listener):
    fuzzed_address = cluster.bootstrap_servers_for(listener)
    context = ssl.create_default_context(cafile=tls.truststore) if listener == "SSL" else None
    valid = _valid_frames()
    deadline = time.monotonic() + FUZZ_SECONDS
    sent = {"n": 0}

    @settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.data())
    def fuzz(data):
        if data.draw(st.booleans()):
            frame = bytearray(data.draw(st.sampled_from(valid)))
            for _ in range(data.draw(st.integers(1, 6))):
                frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
            payload = sized(bytes(frame))
        else:
            payload = data.draw(st.binary(max_size=300))
        now = time.monotonic()
        if now > deadline + 3 * FUZZ_SECONDS or (now > deadline and sent["n"] > MIN_FUZZED_FRAMES):
            return  # time is up (on a loaded machine, once enough frames went): the remaining examples only draw
        sent["n"] += send_and_drain(fuzzed_address, payload, context)

    fuzz()
    assert sent["n"] > MIN_FUZZED_FRAMES, "the fuzz run sent frames"
    assert_serves_and_kept_is_intact(address)
    producer = kafka.KafkaProducer(bootstrap_servers=address)
    producer.send("fuzz", b"after the fuzz").get(timeout=20)
    producer.close()


def _client_hello(tls) -> bytes:
    """The first bytes a TLS client sends: its ClientHello record."""
    outgoing = ssl.MemoryBIO()
    client = ssl.create_default_context(cafile=tls.truststore).wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def test_fuzzed_tls_handshakes_close_only_their_connection(address, cluster, tls):
    ssl_address = cluster.bootstrap_servers_for("SSL")
    hello = _client_hello(tls)
    deadline = time.monotonic() + FUZZ_SECONDS
    sent = {"n": 0}

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.data())
    def fuzz(data):
        if data.draw(st.booleans()):
            frame = bytearray(hello)
            for _ in range(data.draw(st.integers(1, 8))):
                frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
            payload = bytes(frame[:data.draw(st.integers(1, len(frame)))])
        else:
            payload = data.draw(st.binary(min_size=1, max_size=300))
        if time.monotonic() > deadline:
            return
        sent["n"] += send_and_drain(ssl_address, payload)  # answered by an alert, a ServerHello, or nothing

    fuzz()
    assert sent["n"] > 50, "the fuzz run sent handshakes"
    tls_client = RawConnection(ssl_address, tls=ssl.create_default_context(cafile=tls.truststore))
    assert tls_client.call(keys.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}).api_keys
    tls_client.close()
    assert_serves_and_kept_is_intact(address)


def _sasl_frames() -> list[bytes]:
    client_first = scramp.ScramClient(["SCRAM-SHA-512"], "fuzzer", FUZZER_PASSWORD).get_client_first().encode()
    frames = [request_frame(keys.SASL_HANDSHAKE, v, {"mechanism": m}) for v in (0, 1) for m in ("SCRAM-SHA-512", "PLAIN")]
    frames += [request_frame(keys.SASL_AUTHENTICATE, v, {"auth_bytes": token})
               for v in (0, 1, 2) for token in (client_first, b"\0fuzzer\0" + FUZZER_PASSWORD.encode())]
    return frames + [client_first, b"c=biws,r=abc,p=" + b"A" * 88]  # bare tokens, as after a v0 handshake


def test_fuzzed_sasl_exchanges_close_only_their_connection(address, cluster, tls):
    """Sequences of valid and mutated SaslHandshake / SaslAuthenticate frames and bare
    tokens on the SASL_SSL listener; then a real client authenticates and produces."""
    sasl_address = cluster.bootstrap_servers_for("SASL_SSL")
    context = ssl.create_default_context(cafile=tls.truststore)
    frames = _sasl_frames()
    deadline = time.monotonic() + FUZZ_SECONDS
    sent = {"n": 0}

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.data())
    def fuzz(data):
        payload = b""
        for _ in range(data.draw(st.integers(1, 3))):
            frame = bytearray(data.draw(st.sampled_from(frames)))
            for _ in range(data.draw(st.integers(0, 4))):
                frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
            payload += sized(bytes(frame))
        if time.monotonic() > deadline:
            return
        sent["n"] += send_and_drain(sasl_address, payload, context)

    fuzz()
    assert sent["n"] > 50, "the fuzz run sent exchanges"
    producer = confluent_kafka.Producer({
        "bootstrap.servers": sasl_address, "security.protocol": "SASL_SSL", "ssl.ca.location": tls.truststore,
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "fuzzer", "sasl.password": FUZZER_PASSWORD})
    producer.produce("fuzz", b"after the SASL fuzz")
    assert producer.flush(30) == 0
    assert_serves_and_kept_is_intact(address)


def test_acks_0_gets_no_answer_and_a_failed_one_closes_the_connection(address, cluster):
    conn = RawConnection(address)
    try:
        batch = build_batch([SimpleRecord(b"quiet")])
        ok = request_frame(keys.PRODUCE, 9, {"acks": 0, "timeout": 1000, "topic_data": [
            {"name": "fuzz", "partition_data": [{"index": 0, "records": batch}]}]}, correlation_id=20)
        conn.send(sized(ok))
        # No answer to the acks=0 produce: the next answer on the connection is the Metadata one.
        assert conn.call(keys.METADATA, 12, {"topics": []}, 21).cluster_id
        failing = request_frame(keys.PRODUCE, 9, {"acks": 0, "timeout": 1000, "topic_data": [
            {"name": "no-such-topic", "partition_data": [{"index": 0, "records": batch}]}]}, correlation_id=22)
        conn.send(sized(failing))
        assert conn.receive() is None, "Kafka closes the connection of a failed acks=0 produce"
    finally:
        conn.close()
    assert metadata_ok(address)


def _produce_frame(topic: str, records: bytes, correlation_id: int) -> bytes:
    return sized(request_frame(keys.PRODUCE, 9, {"acks": -1, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": records}]}]}, correlation_id))


def _partition_answer(api_key: int, version: int, conn: RawConnection, correlation_id: int) -> Any:
    frame = conn.receive()
    assert frame is not None, "a connection the client did not close was closed"
    body = decode_response(api_key, version, frame, correlation_id)
    return body.responses[0].partition_responses[0] if api_key == keys.PRODUCE else body.responses[0].partitions[0]


def test_a_mutated_batch_fails_alone_while_other_clients_produce_and_long_poll_the_same_leader(cluster, address):
    """One client's produces carry mutated batches whose CRC is right again (a codec id
    that names no codec among them), while another client's long-poll fetch and a third's
    produce of the same partition are in flight: the listener shares one data-plane
    connection to the leader between them. The bad batch gets its own error; the others
    complete as if it were not there (before the fix, the leader's ValueError closed that
    connection: the fetch and the good produce failed too)."""
    cluster.create_topic("shared", num_partitions=1, replication_factor=1)
    good = [SimpleRecord(b"good")]
    fetcher, bad_client, good_client = RawConnection(address), RawConnection(address), RawConnection(address)
    counts = {"examples": 0, "refused": 0}

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(codec_id=st.integers(0, 7), mutations=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)),
                                                          max_size=3))
    def one_round(codec_id: int, mutations: list[tuple[int, int]]) -> None:
        n = counts["examples"] = counts["examples"] + 1
        end = fetcher.call(keys.LIST_OFFSETS, 6, {"topics": [{"name": "shared", "partitions": [
            {"partition_index": 0, "timestamp": -1}]}]}, 10 * n).topics[0].partitions[0].offset
        fetcher.send(sized(request_frame(keys.FETCH, 12, {
            "max_wait": 5000, "min_bytes": 1, "max_bytes": 1 << 16, "session_epoch": -1, "topics": [
                {"topic": "shared", "partitions": [{"partition": 0, "fetch_offset": end, "partition_max_bytes": 1 << 16}]}]},
            10 * n + 1)))  # held at the leader until a record comes
        bad = bytearray(build_batch([SimpleRecord(b"bad-%d" % i, b"k") for i in range(3)]))
        bad[ATTRIBUTES_POS + 1] = (bad[ATTRIBUTES_POS + 1] & ~0x07) | codec_id
        for position, value in mutations:
            bad[ATTRIBUTES_POS + position % (len(bad) - ATTRIBUTES_POS)] = value
        struct.pack_into(">I", bad, CRC_POS, compute_crc(bad))
        bad_client.send(_produce_frame("shared", bytes(bad), 10 * n + 2))
        good_client.send(_produce_frame("shared", build_batch(good), 10 * n + 3))
        refused = _partition_answer(keys.PRODUCE, 9, bad_client, 10 * n + 2).error_code.value != 0
        counts["refused"] += refused
        written = _partition_answer(keys.PRODUCE, 9, good_client, 10 * n + 3)
        assert written.error_code.value == 0, written
        fetched = _partition_answer(keys.FETCH, 12, fetcher, 10 * n + 1)
        assert fetched.error_code.value == 0 and fetched.records, fetched

    try:
        one_round()
    finally:
        for conn in (fetcher, bad_client, good_client):
            conn.close()
    assert counts["refused"] > 0, "some batches were bad"
    assert_serves_and_kept_is_intact(address)
