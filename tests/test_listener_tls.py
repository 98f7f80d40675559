"""Named listeners and TLS on a running cluster, through real Kafka clients: each broker
serves PLAINTEXT, SSL and an mTLS listener (MTLS, mapped to SSL, ssl.client.auth
required) at once; Metadata answers with the addresses of the listener it came on;
kafka-python, confluent-kafka, aiokafka and kcat produce and consume over SSL; mTLS
clients are named by their certificate's subject; a client without a certificate, or one
that does not speak TLS, is cut at the handshake while the listener keeps serving."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import uuid

import aiokafka
import aiokafka.helpers
import confluent_kafka
import confluent_kafka.admin
import kafka
import pytest
import ray

import rayk
from rayk.net import api_versions as keys
from tests.cluster_helpers import FAST_CONFIG, confluent_round_trip, shared_local_ray, wait_until
from tests.protocol_helpers import RawConnection, request_frame, sized
from tests.tls_helpers import CLIENT_SUBJECT, TlsFiles

RECORDS = 20
API_VERSIONS_BODY = {"client_software_name": "t", "client_software_version": "1"}


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tls):
    config = {
        **FAST_CONFIG,
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,MTLS://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": tls.keystore,
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.mtls.ssl.truststore.location": tls.truststore,
        "num.partitions": 2,
        "default.replication.factor": 2,
    }
    c = rayk.start(brokers=2, data_dir=tmp_path_factory.mktemp("tls-cluster"), config=config, namespace="listener-tls")
    yield c
    c.shutdown()


def new_topic(cluster) -> str:
    name = f"tls-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(name, num_partitions=2, replication_factor=2)
    return name


def values(tag: str) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(RECORDS)]


def is_refused(address: str, tls: ssl.SSLContext | None) -> bool:
    """True if the broker ends a connection (at the TLS handshake, or unanswered) that asks
    for ApiVersions; under TLS 1.3 a refused client certificate shows only at the first read."""
    try:
        connection = RawConnection(address, tls=tls)
        connection.send(sized(request_frame(keys.API_VERSIONS, 3, API_VERSIONS_BODY)))
        refused = connection.receive() is None
        connection.close()
        return refused
    except (ssl.SSLError, ConnectionError):
        return True


def client_tls(tls: TlsFiles, certificate: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls.truststore)
    if certificate:
        context.load_cert_chain(tls.client_cert, tls.client_key)
    return context


def test_each_broker_serves_every_listener_and_metadata_answers_on_the_listener_asked(cluster, tls):
    brokers = cluster.brokers()
    assert [list(b["endpoints"]) for b in brokers] == [["PLAINTEXT", "SSL", "MTLS"]] * 2
    ssl_servers = cluster.bootstrap_servers_for("ssl")
    assert cluster.bootstrap_servers == cluster.bootstrap_servers_for("PLAINTEXT") != ssl_servers
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": ssl_servers, "security.protocol": "SSL",
                                               "ssl.ca.location": tls.truststore})
    described = admin.list_topics(timeout=30).brokers
    assert sorted(f"{b.host}:{b.port}" for b in described.values()) == sorted(ssl_servers.split(","))


def test_confluent_kafka_produces_and_consumes_over_ssl(cluster, tls):
    topic = new_topic(cluster)
    settings = {"bootstrap.servers": cluster.bootstrap_servers_for("SSL"), "security.protocol": "SSL",
                "ssl.ca.location": tls.truststore}
    assert sorted(confluent_round_trip(settings, topic, values("confluent"))) == sorted(values("confluent"))


def test_kafka_python_produces_and_consumes_over_ssl(cluster, tls):
    topic = new_topic(cluster)
    settings = {"bootstrap_servers": cluster.bootstrap_servers_for("SSL"), "security_protocol": "SSL",
                "ssl_cafile": tls.truststore}
    producer = kafka.KafkaProducer(acks="all", **settings)
    for value in values("kafka-python"):
        producer.send(topic, value=value)
    producer.flush()
    producer.close()
    consumer = kafka.KafkaConsumer(topic, auto_offset_reset="earliest", enable_auto_commit=False,
                                   consumer_timeout_ms=20_000, **settings)
    got = [r.value for _, r in zip(range(RECORDS), consumer)]
    consumer.close()
    assert sorted(got) == sorted(values("kafka-python"))


def test_aiokafka_produces_and_consumes_over_ssl(cluster, tls):
    topic = new_topic(cluster)

    async def run() -> list[bytes]:
        settings = {"bootstrap_servers": cluster.bootstrap_servers_for("SSL"), "security_protocol": "SSL",
                    "ssl_context": aiokafka.helpers.create_ssl_context(cafile=tls.truststore)}
        producer = aiokafka.AIOKafkaProducer(acks="all", **settings)
        await producer.start()
        try:
            for value in values("aiokafka"):
                await producer.send_and_wait(topic, value)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(topic, auto_offset_reset="earliest", enable_auto_commit=False, **settings)
        await consumer.start()
        try:
            got: list[bytes] = []
            async with asyncio.timeout(30):
                async for record in consumer:
                    got.append(record.value)
                    if len(got) == RECORDS:
                        return got
        finally:
            await consumer.stop()
        return got

    assert sorted(asyncio.run(run())) == sorted(values("aiokafka"))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="needs kcat (`.ci/run` installs Debian's kcat)")
def test_kcat_produces_and_consumes_over_ssl(cluster, tls):
    topic = new_topic(cluster)
    kcat = ["kcat", "-b", cluster.bootstrap_servers_for("SSL"), "-X", "security.protocol=ssl",
            "-X", f"ssl.ca.location={tls.truststore}", "-t", topic]
    produced = subprocess.run([*kcat, "-P", "-K:"], input="a:1\nb:2\n", capture_output=True, text=True, timeout=60)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run([*kcat, "-C", "-o", "beginning", "-e", "-f", "%k=%s\\n"], capture_output=True, text=True,
                              timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == ["a=1", "b=2"]


def test_an_mtls_client_is_named_by_its_certificate_and_one_without_is_refused(cluster, tls):
    topic = new_topic(cluster)
    mtls = cluster.bootstrap_servers_for("MTLS")
    settings = {"bootstrap.servers": mtls, "security.protocol": "SSL", "ssl.ca.location": tls.truststore,
                "ssl.certificate.location": tls.client_cert, "ssl.key.location": tls.client_key}
    producer = confluent_kafka.Producer({**settings, "acks": "all"})
    producer.produce(topic, value=b"with a certificate", partition=0)
    assert producer.flush(30) == 0
    listeners = [ray.get(cluster.broker(b["broker_id"]).listener.remote()) for b in cluster.brokers()]
    seen = [c for listener in listeners for c in ray.get(listener.describe_connections.remote())]
    assert {(c.listener_name, c.security_protocol, c.principal) for c in seen if c.listener_name == "MTLS"} == {
        ("MTLS", "SSL", f"User:{CLIENT_SUBJECT}")
    }
    producer.flush(1)
    del producer

    assert is_refused(mtls, client_tls(tls)), "no client certificate: the handshake fails"
    with_certificate = RawConnection(mtls, tls=client_tls(tls, certificate=True))
    assert with_certificate.call(keys.API_VERSIONS, 3, API_VERSIONS_BODY).api_keys
    with_certificate.close()


def test_each_broker_s_process_leaves_the_wire_protocol_s_modules_to_its_listener_s(cluster):
    # A broker creates its listener's actor (socket_server_actor.py) without importing the
    # listener's modules: kio's schemas cost ~0.5 CPU-s of each broker's start.
    for b in cluster.brokers():
        manager = cluster.broker(b["broker_id"])
        listener = ray.get(manager.listener.remote())
        assert ray.get(listener.bound_ports.remote()), "its listener runs"
        modules = set(ray.get(manager.loaded_modules.remote()))
        assert "rayk.server.replica_manager" in modules, "the answer comes from the broker's own process"
        assert not {"kio", "rayk.net.socket_server", "rayk.net.codec", "rayk.net.kafka_apis"} & modules


def test_a_plaintext_client_on_a_tls_port_and_a_tls_client_on_a_plaintext_port_are_cut_cleanly(cluster, tls):
    ssl_address = cluster.bootstrap_servers_for("SSL").split(",")[0]
    plaintext_address = cluster.bootstrap_servers_for("PLAINTEXT").split(",")[0]
    for _ in range(3):
        assert is_refused(ssl_address, None), "a request in clear text on a TLS port is not answered"
    assert is_refused(plaintext_address, client_tls(tls)), "the broker reads a ClientHello as a bad frame size"
    for address, context in ((ssl_address, client_tls(tls)), (plaintext_address, None)):  # both still serve
        connection = RawConnection(address, tls=context)
        assert connection.call(keys.API_VERSIONS, 3, API_VERSIONS_BODY).api_keys
        connection.close()
    listener = ray.get(cluster.broker(0).listener.remote())
    wait_until(lambda: ray.get(listener.connections.remote()) <= 1, 10, "the cut connections closed")


def test_a_metadata_request_creates_topics_only_on_listeners_whose_clients_need_not_authenticate(cluster, tls):
    def ask(address: str, context: ssl.SSLContext | None, topic: str) -> int:
        connection = RawConnection(address, tls=context)
        try:
            answer = connection.call(keys.METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                                         "allow_auto_topic_creation": True,
                                                         "include_topic_authorized_operations": False})
        finally:
            connection.close()
        return answer.topics[0].error_code.value

    mtls = cluster.bootstrap_servers_for("MTLS").split(",")[0]
    assert ask(mtls, client_tls(tls, certificate=True), "not-auto-created") == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert "not-auto-created" not in cluster.list_topics()
    ssl_address = cluster.bootstrap_servers_for("SSL").split(",")[0]
    assert ask(ssl_address, client_tls(tls), "auto-created") == 5  # LEADER_NOT_AVAILABLE: being created
    wait_until(lambda: "auto-created" in cluster.list_topics(), 30, "the topic created by a Metadata request")
