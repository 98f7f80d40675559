"""SASL on a running cluster, configured as a Kafka user would: an INTERNAL PLAINTEXT
listener whose ANONYMOUS principal is a super user, and an EXTERNAL SASL_SSL one with
SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN. Credentials made over the wire (confluent-kafka's
AdminClient) and from Python; confluent-kafka, kafka-python, aiokafka and kcat then
produce and consume on EXTERNAL; a wrong password is SASL_AUTHENTICATION_FAILED, an
unknown mechanism UNSUPPORTED_SASL_MECHANISM, a request before authenticating closes
the connection, a non-super user may not manage credentials, and credentials survive a
restart of the whole cluster."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import uuid
from pathlib import Path

import aiokafka
import aiokafka.helpers
import confluent_kafka
import confluent_kafka.admin as confluent_admin
import kafka
import pytest
import scramp

import rayk
from rayk.client.admin import ScramDeletion, ScramUpsertion
from rayk.errors import ResourceNotFoundError
from rayk.net import api_versions as keys
from tests import readme
from tests.cluster_helpers import FAST_CONFIG, confluent_round_trip, shared_local_ray, wait_until
from tests.protocol_helpers import RawConnection, request_frame, sized
from tests.tls_helpers import TlsFiles

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}
RECORDS = 10
SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE = 58, 33, 34
CLUSTER_AUTHORIZATION_FAILED = 31


def config_for(tls: TlsFiles) -> dict:
    return {
        **FAST_CONFIG,
        "listeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": tls.keystore,
        "ssl.truststore.type": "PEM", "ssl.truststore.location": tls.truststore,
        "super.users": "User:ANONYMOUS;User:admin",
        "num.partitions": 1, "default.replication.factor": 1,
    }


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sasl-cluster")


@pytest.fixture(scope="module")
def cluster(data_dir, tls):
    shared_local_ray()
    c = rayk.start(brokers=1, data_dir=data_dir, config=config_for(tls), namespace="listener-sasl")
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def alice(cluster):
    """alice's SCRAM-SHA-512 credential, made by confluent-kafka's AdminClient on INTERNAL."""
    admin = confluent_admin.AdminClient({"bootstrap.servers": cluster.bootstrap_servers_for("INTERNAL")})
    info = confluent_admin.ScramCredentialInfo(confluent_admin.ScramMechanism.SCRAM_SHA_512, 8192)
    futures = admin.alter_user_scram_credentials(
        [confluent_admin.UserScramCredentialUpsertion("alice", info, PASSWORDS["alice"].encode())])
    futures["alice"].result(30)
    described = admin.describe_user_scram_credentials(["alice"])["alice"].result(30)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (confluent_admin.ScramMechanism.SCRAM_SHA_512, 8192)]
    return "alice"


def new_topic(cluster) -> str:
    name = f"sasl-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(name, num_partitions=1, replication_factor=1)
    return name


def confluent_settings(cluster, tls, mechanism: str, user: str, password: str) -> dict:
    return {"bootstrap.servers": cluster.bootstrap_servers_for("EXTERNAL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": tls.truststore, "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": password}


def round_trip(settings: dict, topic: str) -> list[bytes]:
    return confluent_round_trip(settings, topic, [b"%d" % i for i in range(RECORDS)])


def test_confluent_kafka_on_sasl_ssl_with_scram_sha_512(cluster, tls, alice):
    topic = new_topic(cluster)
    got = round_trip(confluent_settings(cluster, tls, "SCRAM-SHA-512", alice, PASSWORDS[alice]), topic)
    assert sorted(got) == sorted(b"%d" % i for i in range(RECORDS))


def test_a_credential_made_from_python_and_plain_against_it(cluster, tls, alice):
    results = cluster.admin().alter_user_scram_credentials([ScramUpsertion("bob", "SCRAM-SHA-256", PASSWORDS["bob"])])
    assert results == {"bob": None}
    topic = new_topic(cluster)
    got = round_trip(confluent_settings(cluster, tls, "SCRAM-SHA-256", "bob", PASSWORDS["bob"]), topic)
    assert len(got) == RECORDS
    plain = round_trip(confluent_settings(cluster, tls, "PLAIN", "bob", PASSWORDS["bob"]), new_topic(cluster))
    assert len(plain) == RECORDS
    assert cluster.admin().describe_user_scram_credentials(["bob"]) == {"bob": [("SCRAM-SHA-256", 8192)]}


def test_kafka_python_and_aiokafka_on_sasl_ssl(cluster, tls, alice):
    topic = new_topic(cluster)
    common = {"bootstrap_servers": cluster.bootstrap_servers_for("EXTERNAL"), "security_protocol": "SASL_SSL",
              "sasl_plain_username": alice, "sasl_plain_password": PASSWORDS[alice]}
    producer = kafka.KafkaProducer(acks="all", sasl_mechanism="PLAIN", ssl_cafile=tls.truststore, **common)
    for i in range(RECORDS):
        producer.send(topic, b"kp-%d" % i)
    producer.flush()
    producer.close()

    async def consume() -> list[bytes]:
        consumer = aiokafka.AIOKafkaConsumer(
            topic, auto_offset_reset="earliest", enable_auto_commit=False, sasl_mechanism="SCRAM-SHA-512",
            ssl_context=aiokafka.helpers.create_ssl_context(cafile=tls.truststore), **common)
        await consumer.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(30):
                async for record in consumer:
                    got.append(record.value)
                    if len(got) == RECORDS:
                        break
        finally:
            await consumer.stop()
        return got

    assert sorted(asyncio.run(consume())) == sorted(b"kp-%d" % i for i in range(RECORDS))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="needs kcat (`.ci/run` installs Debian's kcat)")
def test_kcat_on_sasl_ssl_with_scram_sha_512(cluster, tls, alice):
    topic = new_topic(cluster)
    kcat = ["kcat", "-b", cluster.bootstrap_servers_for("EXTERNAL"), "-X", "security.protocol=SASL_SSL",
            "-X", f"ssl.ca.location={tls.truststore}", "-X", "sasl.mechanisms=SCRAM-SHA-512",
            "-X", f"sasl.username={alice}", "-X", f"sasl.password={PASSWORDS[alice]}", "-t", topic]
    produced = subprocess.run([*kcat, "-P"], input="one\ntwo\n", capture_output=True, text=True, timeout=60)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run([*kcat, "-C", "-o", "beginning", "-e"], capture_output=True, text=True, timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.split() == ["one", "two"]


def sasl_connection(cluster, tls) -> RawConnection:
    address = cluster.bootstrap_servers_for("EXTERNAL")
    return RawConnection(address, tls=ssl.create_default_context(cafile=tls.truststore))


def test_a_wrong_password_an_unknown_mechanism_and_skipping_authentication(cluster, tls, alice):
    for user, password in ((alice, "wrong"), ("mallory", "whatever")):
        connection = sasl_connection(cluster, tls)
        assert connection.call(keys.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"}).error_code.value == 0
        client = scramp.ScramClient(["SCRAM-SHA-512"], user, password)
        first = connection.call(keys.SASL_AUTHENTICATE, 2, {"auth_bytes": client.get_client_first().encode()})
        if first.error_code.value == 0:  # a known user: the proof fails
            client.set_server_first(first.auth_bytes.decode())
            final = connection.call(keys.SASL_AUTHENTICATE, 2, {"auth_bytes": client.get_client_final().encode()})
        else:
            final = first
        assert final.error_code.value == SASL_AUTHENTICATION_FAILED
        assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in final.error_message
        assert connection.receive() is None, "closed after the failure"
        connection.close()

    connection = sasl_connection(cluster, tls)
    answer = connection.call(keys.SASL_HANDSHAKE, 1, {"mechanism": "GSSAPI"})
    assert answer.error_code.value == UNSUPPORTED_SASL_MECHANISM
    assert list(answer.mechanisms) == ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]
    assert connection.receive() is None
    connection.close()

    connection = sasl_connection(cluster, tls)
    connection.send(sized(request_frame(keys.METADATA, 12, {"topics": None})))
    assert connection.receive() is None, "a Metadata request before authenticating closes the connection"
    connection.close()

    plaintext = RawConnection(cluster.bootstrap_servers_for("INTERNAL"))
    answer = plaintext.call(keys.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    assert answer.error_code.value == ILLEGAL_SASL_STATE, "no SASL on a PLAINTEXT listener"
    plaintext.close()

    errors: list[confluent_kafka.KafkaError] = []
    client = confluent_admin.AdminClient({**confluent_settings(cluster, tls, "SCRAM-SHA-512", alice, "wrong"),
                                          "error_cb": errors.append})
    with pytest.raises(confluent_kafka.KafkaException):
        client.list_topics(timeout=2)

    def refused() -> bool:
        client.poll(0.2)  # serves error_cb
        return any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION and "SASL_AUTHENTICATION_FAILED" in e.str()
                   for e in errors)  # fmt: skip

    wait_until(refused, 15, f"SASL_AUTHENTICATION_FAILED among {errors}")


def test_a_v0_handshake_takes_bare_tokens(cluster, tls, alice):
    """SaslHandshake v0 (pre-Kafka 1.0 clients): the SASL tokens follow as bare frames."""
    connection = sasl_connection(cluster, tls)
    assert connection.call(keys.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"}).error_code.value == 0
    connection.send(sized(f"\0{alice}\0{PASSWORDS[alice]}".encode()))
    assert connection.receive() == b"", "PLAIN's empty server token, bare"
    assert connection.call(keys.METADATA, 12, {"topics": None}).cluster_id  # authenticated
    connection.close()

    connection = sasl_connection(cluster, tls)
    assert connection.call(keys.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"}).error_code.value == 0
    connection.send(sized(f"\0{alice}\0wrong".encode()))
    assert connection.receive() is None, "a failure closes the connection: v0 has no error to send"
    connection.close()


def test_only_super_users_manage_credentials_over_the_wire(cluster, tls, alice):
    admin = confluent_admin.AdminClient(confluent_settings(cluster, tls, "SCRAM-SHA-512", alice, PASSWORDS[alice]))
    info = confluent_admin.ScramCredentialInfo(confluent_admin.ScramMechanism.SCRAM_SHA_256, 4096)
    futures = admin.alter_user_scram_credentials(
        [confluent_admin.UserScramCredentialUpsertion("mallory", info, b"taken-over")])
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        futures["mallory"].result(30)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert "mallory" not in cluster.admin().describe_user_scram_credentials()
    with pytest.raises(ResourceNotFoundError):
        cluster.admin().describe_user_scram_credentials(["mallory"])
    results = cluster.admin().alter_user_scram_credentials([ScramDeletion("mallory", "SCRAM-SHA-256")])
    assert isinstance(results["mallory"], ResourceNotFoundError)


README_SETUP = "cluster = rayk.start(brokers=3, config={"
README_ACLS = "from confluent_kafka.admin import (AclBinding,"


def test_the_readme_s_sasl_setup_and_acls_run_as_written(tls, tmp_path, monkeypatch):
    """README's setup and ACL blocks in one namespace, as written but for where they
    point outside the test: the certificates are this module's (in the current directory,
    for the client's "ca.pem"), the listeners bind loopback on free ports, and `rayk.start`
    gets the tests' timeouts and a namespace of its own. alice then writes to the topic she
    was granted, and to no other."""
    shared_local_ray()
    certificates = Path(tls.truststore).parent
    monkeypatch.chdir(certificates)
    start, started = rayk.start, []

    def start_here(*args, config, **kwargs):
        started.append(start(*args, config={**FAST_CONFIG, **config}, data_dir=tmp_path, namespace="readme-sasl",
                             **kwargs))  # fmt: skip
        return started[-1]

    monkeypatch.setattr(rayk, "start", start_here)
    here = {"127.0.0.1:9092": "127.0.0.1:0", "0.0.0.0:9192": "127.0.0.1:0", "/etc/rayk/": f"{certificates}/"}
    namespace = {"__name__": "readme", "rayk": rayk}
    try:
        readme.run(README_SETUP, namespace, here)
        readme.run(README_ACLS, namespace)
        cluster = namespace["cluster"]
        for topic in ("orders", "payroll"):
            cluster.create_topic(topic, num_partitions=1, replication_factor=3)
        settings = confluent_settings(cluster, tls, "SCRAM-SHA-512", "alice", "alice-secret")

        def alice_writes_orders() -> bool:  # the ACLs reach every listener as they are committed
            probe = confluent_kafka.Producer({**settings, "message.timeout.ms": 2000})
            outcome: list = []
            probe.produce("orders", b"probe", on_delivery=lambda err, _msg: outcome.append(err))
            probe.flush(5)
            return outcome == [None]

        wait_until(alice_writes_orders, 30, "alice's grant to reach the listeners")
        outcomes: dict = {}
        producer = namespace["producer"]  # the README's
        for topic in ("orders", "payroll"):
            producer.produce(topic, b"from alice", on_delivery=lambda err, msg: outcomes.update({msg.topic(): err}))
        assert producer.flush(30) == 0
        assert outcomes["orders"] is None
        assert outcomes["payroll"].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        for cluster in started:
            cluster.shutdown()


# In `make chaos`: test_listener_acls.py's restart test logs alice in with SCRAM-SHA-512 after
# the whole cluster's restart, through the same Controller.alter_user_scram_credentials.
@pytest.mark.chaos
def test_credentials_survive_a_restart_of_the_whole_cluster(cluster, data_dir, tls, alice):
    """Runs last in this module: it restarts the cluster."""
    cluster.shutdown()
    again = rayk.start(brokers=1, data_dir=data_dir, config=config_for(tls), namespace="listener-sasl")
    try:
        topic = new_topic(again)
        got = round_trip(confluent_settings(again, tls, "SCRAM-SHA-512", alice, PASSWORDS[alice]), topic)
        assert len(got) == RECORDS
    finally:
        again.shutdown()


def test_librdkafka_reauthenticates_on_its_connection_before_its_session_ends(tmp_path):
    """KIP-368 with a real client: sessions of 1.5 s, a producer sending for 4 s. The
    listener closes a connection whose session ended (tests/test_socket_server_sasl.py), so
    no disconnect means librdkafka re-authenticated on the same connection, in time."""
    import json
    import time

    shared_local_ray()
    c = rayk.start(brokers=1, data_dir=tmp_path, namespace="listener-reauth", config={
        **FAST_CONFIG, "listeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512", "connections.max.reauth.ms": 1500,
        "num.partitions": 1, "default.replication.factor": 1,
    })
    try:
        c.admin().alter_user_scram_credentials([ScramUpsertion("alice", "SCRAM-SHA-512", PASSWORDS["alice"])])
        c.create_topic("reauth", num_partitions=1, replication_factor=1)
        stats: list[dict] = []
        delivered: list = []
        producer = confluent_kafka.Producer({
            "bootstrap.servers": c.bootstrap_servers_for("EXTERNAL"), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": PASSWORDS["alice"],
            "acks": "all", "statistics.interval.ms": 500, "stats_cb": lambda s: stats.append(json.loads(s)),
        })
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            producer.produce("reauth", b"x", on_delivery=lambda err, _: delivered.append(err))
            producer.poll(0.1)
        assert producer.flush(30) == 0
        assert len(delivered) > 20 and all(err is None for err in delivered), delivered[:3]
        brokers = [b for b in stats[-1]["brokers"].values() if b["nodeid"] >= 0]
        assert brokers and all(b["connects"] == 1 and b["disconnects"] == 0 for b in brokers), brokers
    finally:
        c.shutdown()
