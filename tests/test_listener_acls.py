"""ACLs on a running cluster, as a Kafka user configures them (StandardAuthorizer,
super.users, an INTERNAL PLAINTEXT listener whose ANONYMOUS clients are super users, an
EXTERNAL SASL_SSL one): a principal without ACLs is refused with Kafka's
*_AUTHORIZATION_FAILED on produce, fetch, group join, topic creation and deletion, and
does not see topics in Metadata; ACLs granted with confluent-kafka's AdminClient then
let it do exactly that much; deleting them takes it back; ACLs and credentials survive
a restart of the whole cluster."""

from __future__ import annotations

import ssl
import time
import uuid

import confluent_kafka
import confluent_kafka.admin as confluent_admin
import pytest
import ray
from confluent_kafka import KafkaError as ConfluentError

import rayk
from rayk.acls import ALLOW, DELETE, DESCRIBE, GROUP, LITERAL, READ, TOPIC, AclBinding, AclFilter
from rayk.client.admin import ScramUpsertion
from rayk.errors import GroupIdNotFoundError
from rayk.net.api_versions import (
    API_VERSIONS,
    CREATE_ACLS,
    DELETE_ACLS,
    DELETE_RECORDS,
    DESCRIBE_ACLS,
    INCREMENTAL_ALTER_CONFIGS,
    OFFSET_DELETE,
    SHARE_FETCH,
    SHARE_GROUP_HEARTBEAT,
)
from rayk.net.config_apis import GROUP_RESOURCE, SET
from rayk.net.entities import kafka_uuid
from tests.cluster_helpers import FAST_CONFIG, assert_lookup_is_a_long_poll, shared_local_ray, wait_until
from tests.protocol_helpers import RawConnection, scram_login
from tests.tls_helpers import TlsFiles

PASSWORD = "alice-secret"
ACL_PROPAGATION_S = 3  # listeners take ACL changes as the Controller commits them (a long poll)
CLUSTER_AUTHORIZATION_FAILED = 31


def config_for(tls: TlsFiles) -> dict:
    return {
        **FAST_CONFIG,
        "listeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512", "ssl.keystore.location": tls.keystore,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS;User:admin",
        "num.partitions": 1, "default.replication.factor": 1,
        "group.initial.rebalance.delay.ms": 0, "offsets.topic.replication.factor": 1,
    }


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("acl-cluster")


@pytest.fixture(scope="module")
def cluster(data_dir, tls):
    shared_local_ray()
    c = rayk.start(brokers=1, data_dir=data_dir, config=config_for(tls), namespace="listener-acls")
    c.admin().alter_user_scram_credentials([ScramUpsertion("alice", "SCRAM-SHA-512", PASSWORD)])
    yield c
    c.shutdown()


def as_alice(cluster, tls) -> dict:
    return {"bootstrap.servers": cluster.bootstrap_servers_for("EXTERNAL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": tls.truststore, "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
            "sasl.password": PASSWORD}


def internal_admin(cluster) -> confluent_admin.AdminClient:
    return confluent_admin.AdminClient({"bootstrap.servers": cluster.bootstrap_servers_for("INTERNAL")})


def produce_error(settings: dict, topic: str) -> int | None:
    """The code a produce of one record ends with (None: delivered)."""
    outcome: list = []
    producer = confluent_kafka.Producer({**settings, "acks": "all", "message.timeout.ms": 10_000})
    producer.produce(topic, b"x", on_delivery=lambda err, msg: outcome.append(err))
    producer.flush(20)
    return outcome[0].code() if outcome and outcome[0] is not None else None


def consume_errors(settings: dict, topic: str, group: str) -> tuple[list[int], list[bytes]]:
    """Subscribes as `group`; the error codes and the values seen within a few seconds."""
    consumer = confluent_kafka.Consumer({**settings, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    errors, values = [], []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not errors and not values:
        message = consumer.poll(0.5)
        if message is None:
            continue
        (errors.append(message.error().code()) if message.error() else values.append(message.value()))
    consumer.close()
    return errors, values


def admin_error(future) -> int | None:
    try:
        future.result(20)
    except confluent_kafka.KafkaException as e:
        return e.args[0].code()
    return None


def grant(cluster, *bindings: confluent_admin.AclBinding) -> None:
    admin = internal_admin(cluster)  # held until the futures are done: a collected client cancels them
    for future in admin.create_acls(list(bindings)).values():
        future.result(20)


def topic_acl(operation, name: str, pattern=confluent_admin.ResourcePatternType.LITERAL) -> confluent_admin.AclBinding:
    return confluent_admin.AclBinding(confluent_admin.ResourceType.TOPIC, name, pattern, "User:alice", "*", operation,
                                      confluent_admin.AclPermissionType.ALLOW)


def test_without_acls_everything_is_refused_with_kafkas_codes(cluster, tls):
    cluster.create_topic("orders", num_partitions=1, replication_factor=1)
    alice = as_alice(cluster, tls)
    assert produce_error(alice, "orders") == ConfluentError.TOPIC_AUTHORIZATION_FAILED
    errors, _ = consume_errors(alice, "orders", "alice-group")
    assert errors and errors[0] in (ConfluentError.GROUP_AUTHORIZATION_FAILED, ConfluentError.TOPIC_AUTHORIZATION_FAILED)
    admin = confluent_admin.AdminClient(alice)
    assert "orders" not in admin.list_topics(timeout=20).topics, "Metadata hides what alice may not describe"
    created = admin.create_topics([confluent_admin.NewTopic("alice-topic", 1, 1)])["alice-topic"]
    assert admin_error(created) == ConfluentError.TOPIC_AUTHORIZATION_FAILED
    assert admin_error(admin.delete_topics(["orders"])["orders"]) == ConfluentError.TOPIC_AUTHORIZATION_FAILED
    assert "orders" in cluster.list_topics() and "alice-topic" not in cluster.list_topics()
    connection = RawConnection(cluster.bootstrap_servers_for("EXTERNAL"),
                               tls=ssl.create_default_context(cafile=tls.truststore))
    scram_login(connection, "alice", PASSWORD)
    any_acl = {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
               "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}
    assert connection.call(DESCRIBE_ACLS, 3, any_acl).error_code.value == CLUSTER_AUTHORIZATION_FAILED
    creation = {"resource_type": TOPIC, "resource_name": "orders", "resource_pattern_type": LITERAL,
                "principal": "User:alice", "host": "*", "operation": READ, "permission_type": ALLOW}
    created = connection.call(CREATE_ACLS, 3, {"creations": [creation]})
    assert [r.error_code.value for r in created.results] == [CLUSTER_AUTHORIZATION_FAILED], "no granting oneself"
    connection.close()


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")  # the legacy AlterConfigs is checked too
def test_altering_configs_and_deleting_records_need_alter_configs_and_delete(cluster, tls):
    """As Kafka checks them: ALTER_CONFIGS on the topic (IncrementalAlterConfigs and
    AlterConfigs) or on the cluster (broker configs), DELETE on the topic (DeleteRecords)."""
    cluster.create_topic("configured", num_partitions=1, replication_factor=1)
    ops = confluent_admin.AlterConfigOpType
    set_retention = [confluent_admin.ConfigEntry("retention.ms", "60000", incremental_operation=ops.SET)]
    topic = confluent_admin.ConfigResource(confluent_admin.ResourceType.TOPIC, "configured", incremental_configs=set_retention)
    broker = confluent_admin.ConfigResource(confluent_admin.ResourceType.BROKER, "0", incremental_configs=set_retention)
    records = confluent_kafka.TopicPartition("configured", 0, 0)
    alice = confluent_admin.AdminClient(as_alice(cluster, tls))
    assert admin_error(alice.incremental_alter_configs([topic])[topic]) == ConfluentError.TOPIC_AUTHORIZATION_FAILED
    legacy = confluent_admin.ConfigResource(confluent_admin.ResourceType.TOPIC, "configured", set_config={"retention.ms": "1"})
    assert admin_error(alice.alter_configs([legacy])[legacy]) == ConfluentError.TOPIC_AUTHORIZATION_FAILED
    assert admin_error(alice.incremental_alter_configs([broker])[broker]) == ConfluentError.CLUSTER_AUTHORIZATION_FAILED
    # (raw: alice's client cannot see the topic's leader in Metadata, so it would not ask)
    connection = RawConnection(cluster.bootstrap_servers_for("EXTERNAL"),
                               tls=ssl.create_default_context(cafile=tls.truststore))
    scram_login(connection, "alice", PASSWORD)
    deletion = connection.call(DELETE_RECORDS, 2, {"timeout": 5000, "topics": [
        {"name": "configured", "partitions": [{"partition_index": 0, "offset": 0}]}]})
    connection.close()
    assert deletion.topics[0].partitions[0].error_code.value == ConfluentError.TOPIC_AUTHORIZATION_FAILED
    assert cluster.admin().describe_topic_configs("configured") == {}
    admin = internal_admin(cluster)  # a super user may
    assert admin_error(admin.incremental_alter_configs([topic])[topic]) is None
    (deletion,) = admin.delete_records([records]).values()
    assert admin_error(deletion) is None
    assert cluster.admin().describe_topic_configs("configured") == {"retention.ms": "60000"}


def test_granted_acls_allow_exactly_that_much(cluster, tls):
    ops = confluent_admin.AclOperation
    grant(cluster, topic_acl(ops.WRITE, "orders"), topic_acl(ops.READ, "orders"),
          topic_acl(ops.CREATE, "scratch-", confluent_admin.ResourcePatternType.PREFIXED),
          topic_acl(ops.DELETE, "scratch-", confluent_admin.ResourcePatternType.PREFIXED),
          confluent_admin.AclBinding(confluent_admin.ResourceType.GROUP, "alice-group",
                                     confluent_admin.ResourcePatternType.LITERAL, "User:alice", "*", ops.READ,
                                     confluent_admin.AclPermissionType.ALLOW))
    alice = as_alice(cluster, tls)
    wait_until(lambda: produce_error(alice, "orders") is None, ACL_PROPAGATION_S * 5, "alice may write")
    errors, values = consume_errors(alice, "orders", "alice-group")
    assert errors == [] and values == [b"x"]
    admin = confluent_admin.AdminClient(alice)
    assert "orders" in admin.list_topics(timeout=20).topics
    assert admin_error(admin.create_topics([confluent_admin.NewTopic("scratch-1", 1, 1)])["scratch-1"]) is None
    assert admin_error(admin.delete_topics(["scratch-1"])["scratch-1"]) is None
    refused = admin.create_topics([confluent_admin.NewTopic("elsewhere", 1, 1)])["elsewhere"]
    assert admin_error(refused) == ConfluentError.TOPIC_AUTHORIZATION_FAILED
    assert produce_error(alice, "other-topic") == ConfluentError.TOPIC_AUTHORIZATION_FAILED
    described = cluster.admin().describe_acls(AclFilter(principal="User:alice", resource_type=TOPIC))
    assert AclBinding(TOPIC, "orders", LITERAL, "User:alice", "*", READ, ALLOW) in described and len(described) == 4


def test_listeners_take_acl_changes_from_a_long_poll_at_the_controller(cluster):
    binding = AclBinding(TOPIC, "long-poll", LITERAL, "User:carol", "*", READ, ALLOW)

    def change() -> None:
        assert cluster.admin().create_acls([binding]) == [None]

    try:
        assert binding in assert_lookup_is_a_long_poll(cluster.controller, "acls", change)
    finally:
        cluster.admin().delete_acls([AclFilter(principal="User:carol")])


def test_authorized_operations_are_reported_when_asked_for(cluster, tls):
    """KIP-430: Metadata, DescribeCluster and DescribeGroups say what the principal may do
    when the client asks (they always answered 'not asked for')."""
    ops = confluent_admin.AclOperation
    alice = confluent_admin.AdminClient(as_alice(cluster, tls))
    topic = alice.describe_topics(confluent_kafka.TopicCollection(["orders"]), include_authorized_operations=True)
    assert set(topic["orders"].result(20).authorized_operations) == {ops.READ, ops.WRITE, ops.DESCRIBE}
    assert not alice.describe_cluster(include_authorized_operations=True).result(20).authorized_operations
    group = alice.describe_consumer_groups(["alice-group"], include_authorized_operations=True)["alice-group"]
    assert set(group.result(20).authorized_operations) == {ops.READ, ops.DESCRIBE}
    internal = internal_admin(cluster)  # held until the future is done
    everything = internal.describe_cluster(include_authorized_operations=True).result(20)
    assert set(everything.authorized_operations) == {ops.CREATE, ops.CLUSTER_ACTION, ops.DESCRIBE_CONFIGS, ops.ALTER_CONFIGS,
                                                     ops.IDEMPOTENT_WRITE, ops.ALTER, ops.DESCRIBE}, "a super user"


def test_deleted_acls_take_the_rights_back(cluster, tls):
    ops = confluent_admin.AclOperation
    delete = confluent_admin.AclBindingFilter(confluent_admin.ResourceType.TOPIC, "orders",
                                              confluent_admin.ResourcePatternType.LITERAL, "User:alice", None, ops.WRITE,
                                              confluent_admin.AclPermissionType.ANY)
    admin = internal_admin(cluster)
    (deleted,) = admin.delete_acls([delete]).values()
    assert len(deleted.result(20)) == 1
    alice = as_alice(cluster, tls)
    wait_until(lambda: produce_error(alice, "orders") == ConfluentError.TOPIC_AUTHORIZATION_FAILED,
               ACL_PROPAGATION_S * 5, "alice's write taken back")
    producer = cluster.producer()  # a record alice's group has not read yet
    producer.send("orders", b"y")
    producer.flush()
    producer.close()
    errors, values = consume_errors(alice, "orders", "alice-group")
    assert errors == [] and values == [b"y"], "READ stays"


def test_acl_apis_are_served_from_version_1_as_kafka_4_serves_them(cluster):
    """librdkafka up to 2.12 asks for CreateAcls / DescribeAcls / DeleteAcls v0-1: served
    from v2 only, ACL management from every such client failed against rayk."""
    connection = RawConnection(cluster.bootstrap_servers_for("INTERNAL"))
    try:
        versions = {k.api_key: (k.min_version, k.max_version) for k in connection.call(API_VERSIONS, 3, {
            "client_software_name": "test", "client_software_version": "1"}).api_keys}
        assert versions[CREATE_ACLS] == versions[DESCRIBE_ACLS] == versions[DELETE_ACLS] == (1, 3)
        creation = {"resource_type": TOPIC, "resource_name": "v1-topic", "resource_pattern_type": LITERAL,
                    "principal": "User:bob", "host": "*", "operation": READ, "permission_type": ALLOW}
        created = connection.call(CREATE_ACLS, 1, {"creations": [creation]})
        assert [r.error_code.value for r in created.results] == [0]
        bob = {"resource_type_filter": TOPIC, "resource_name_filter": "v1-topic", "pattern_type_filter": LITERAL,
               "principal_filter": "User:bob", "host_filter": None, "operation": READ, "permission_type": ALLOW}
        described = connection.call(DESCRIBE_ACLS, 1, bob)
        assert described.error_code.value == 0 and [r.resource_name for r in described.resources] == ["v1-topic"]
        deleted = connection.call(DELETE_ACLS, 1, {"filters": [bob]})
        assert [len(r.matching_acls) for r in deleted.filter_results] == [1]
    finally:
        connection.close()


def test_offset_delete_needs_delete_on_the_group_and_read_on_the_topic(cluster, tls):
    """As Kafka's KafkaApis: without DELETE on the group the whole request is
    GROUP_AUTHORIZATION_FAILED, without READ on a topic its partitions are
    TOPIC_AUTHORIZATION_FAILED and keep their offsets."""
    cluster.create_topic("offsets-acl", num_partitions=1, replication_factor=1)
    group = f"alice-offsets-{uuid.uuid4().hex[:8]}"
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap_servers_for("INTERNAL"), "group.id": group})

    def commit() -> bool:
        try:
            consumer.commit(offsets=[confluent_kafka.TopicPartition("offsets-acl", 0, 1)], asynchronous=False)
        except confluent_kafka.KafkaException as e:  # (the coordinator may be starting)
            if not (e.args[0].retriable() or e.args[0].code() == ConfluentError._WAIT_COORD):
                raise
            time.sleep(0.5)
            return False
        return True

    wait_until(commit, 60, "a commit")
    consumer.close()
    connection = RawConnection(cluster.bootstrap_servers_for("EXTERNAL"),
                               tls=ssl.create_default_context(cafile=tls.truststore))
    scram_login(connection, "alice", PASSWORD)
    request = {"group_id": group, "topics": [{"name": "offsets-acl", "partitions": [{"partition_index": 0}]}]}
    try:
        assert connection.call(OFFSET_DELETE, 0, request).error_code.value == ConfluentError.GROUP_AUTHORIZATION_FAILED
        cluster.admin().create_acls([AclBinding(GROUP, group, LITERAL, "User:alice", "*", DELETE, ALLOW)])
        answer = wait_until(lambda: (a := connection.call(OFFSET_DELETE, 0, request)).error_code.value == 0 and a,
                            30, "the group ACL to arrive")
        assert answer.topics[0].partitions[0].error_code.value == ConfluentError.TOPIC_AUTHORIZATION_FAILED
        assert cluster.admin().describe_consumer_groups([group])[group]["partitions"], "the offset stays"
        cluster.admin().create_acls([AclBinding(TOPIC, "offsets-acl", LITERAL, "User:alice", "*", READ, ALLOW)])
        wait_until(lambda: connection.call(OFFSET_DELETE, 0, request).topics[0].partitions[0].error_code.value == 0,
                   30, "the topic ACL to arrive")
    finally:
        connection.close()
    with pytest.raises(GroupIdNotFoundError):  # its only offset is gone, and with it the group
        cluster.admin().describe_consumer_groups([group])[group]


def test_share_groups_need_read_on_the_group_and_on_the_topics(cluster, tls):
    """As Kafka's KafkaApis for KIP-932: without READ on the group a ShareGroupHeartbeat
    and a whole ShareFetch are GROUP_AUTHORIZATION_FAILED; a heartbeat naming a topic
    without DESCRIBE is TOPIC_AUTHORIZATION_FAILED; a fetched partition of a topic without
    READ is TOPIC_AUTHORIZATION_FAILED, and served once READ is granted; the group's configs
    need ALTER_CONFIGS on it."""
    cluster.create_topic("share-acl", num_partitions=1, replication_factor=1)
    group = f"alice-share-{uuid.uuid4().hex[:8]}"
    topic_id = kafka_uuid(ray.get(cluster.controller.client_metadata.remote(["share-acl"]))["topics"]["share-acl"]["topic_id"])
    connection = RawConnection(cluster.bootstrap_servers_for("EXTERNAL"),
                               tls=ssl.create_default_context(cafile=tls.truststore))
    scram_login(connection, "alice", PASSWORD)
    heartbeat = {"group_id": group, "member_id": "alice-1", "member_epoch": 0, "subscribed_topic_names": ["share-acl"]}
    fetch = {"group_id": group, "member_id": "alice-1", "share_session_epoch": 0, "max_wait": 0, "min_bytes": 1,
             "max_records": 10, "batch_size": 10, "forgotten_topics_data": [],
             "topics": [{"topic_id": topic_id, "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}]}
    try:
        assert connection.call(SHARE_GROUP_HEARTBEAT, 1, heartbeat).error_code.value == ConfluentError.GROUP_AUTHORIZATION_FAILED
        assert connection.call(SHARE_FETCH, 1, fetch).error_code.value == ConfluentError.GROUP_AUTHORIZATION_FAILED
        cluster.admin().create_acls([AclBinding(GROUP, group, LITERAL, "User:alice", "*", READ, ALLOW)])
        wait_until(lambda: connection.call(SHARE_GROUP_HEARTBEAT, 1, heartbeat).error_code.value
                   == ConfluentError.TOPIC_AUTHORIZATION_FAILED, 30, "the group ACL to arrive")  # fmt: skip
        answer = connection.call(SHARE_FETCH, 1, fetch)
        assert answer.error_code.value == 0
        assert answer.responses[0].partitions[0].error_code.value == ConfluentError.TOPIC_AUTHORIZATION_FAILED
        cluster.admin().create_acls([AclBinding(TOPIC, "share-acl", LITERAL, "User:alice", "*", READ, ALLOW)])
        wait_until(lambda: connection.call(SHARE_GROUP_HEARTBEAT, 1, heartbeat).error_code.value == 0, 30,
                   "the topic ACL to arrive (READ implies DESCRIBE)")
        wait_until(lambda: connection.call(SHARE_FETCH, 1, fetch).responses[0].partitions[0].error_code.value == 0, 30,
                   "the fetch to be served")
        # The group's configs need ALTER_CONFIGS on it (READ is not enough), as in Kafka.
        configs = {"validate_only": False, "resources": [{"resource_type": GROUP_RESOURCE, "resource_name": group, "configs": [
            {"name": "share.auto.offset.reset", "config_operation": SET, "value": "earliest"}]}]}
        assert connection.call(INCREMENTAL_ALTER_CONFIGS, 1, configs).responses[0].error_code.value == (
            ConfluentError.GROUP_AUTHORIZATION_FAILED)
    finally:
        connection.close()


def test_the_java_admin_client_manages_scram_users_and_acls_over_sasl_ssl(cluster, tls, jvm):
    """Kafka's Java AdminClient, logged in over SASL_SSL as a super user, adds a SCRAM user
    and its ACLs; that user's Java producer and consumer then write and read over SASL_SSL;
    once the AdminClient deletes both, the user can no longer log in."""
    cluster.admin().alter_user_scram_credentials([ScramUpsertion("admin", "SCRAM-SHA-512", "admin-secret")])
    cluster.create_topic("java-orders", num_partitions=1, replication_factor=1)
    bootstrap = cluster.bootstrap_servers_for("EXTERNAL")
    as_admin = (bootstrap, tls.truststore, "admin", "admin-secret")
    as_bob = (bootstrap, tls.truststore, "bob", "bob-secret")
    events = jvm.run("rayk.jvm.SecureCheck", *as_admin, "grant", "bob", "bob-secret", "java-orders", "bob-group")
    assert events[0] == {"event": "credentials", "user": "bob", "mechanisms": ["SCRAM_SHA_512:8192"]}
    assert events[1]["bindings"] == ["GROUP:bob-group:READ", "TOPIC:java-orders:DESCRIBE", "TOPIC:java-orders:READ",
                                     "TOPIC:java-orders:WRITE"]
    assert cluster.admin().describe_user_scram_credentials(["bob"]) == {"bob": [("SCRAM-SHA-512", 8192)]}
    time.sleep(ACL_PROPAGATION_S)
    used = jvm.run("rayk.jvm.SecureCheck", *as_bob, "use", "java-orders", "bob-group")
    assert used[:2] == [{"event": "produced", "records": 5},
                        {"event": "consumed", "values": [f"secure-{i}" for i in range(5)]}]

    revoked = jvm.run("rayk.jvm.SecureCheck", *as_admin, "revoke", "bob")[0]
    assert revoked["acls"] == 4 and "bob" not in revoked["users"]
    assert cluster.admin().describe_acls(AclFilter(principal="User:bob")) == []
    assert jvm.run("rayk.jvm.SecureCheck", *as_bob, "use", "java-orders", "bob-group")[0] == {
        "event": "produced", "error": "SaslAuthenticationException"}


def test_kafka_acls_tool_adds_lists_and_removes_acls(cluster, jvm):
    """kafka-acls (Kafka's AclCommand) against the listener whose clients are super users."""
    acls = lambda *args: jvm.tool("org.apache.kafka.tools.AclCommand",  # noqa: E731
                                  "--bootstrap-server", cluster.bootstrap_servers_for("INTERNAL"), *args)
    acls("--add", "--allow-principal", "User:carol", "--operation", "Read", "--operation", "Describe",
         "--topic", "carol-topic", "--group", "carol-group")
    listed = acls("--list", "--principal", "User:carol")
    assert "name=carol-topic, patternType=LITERAL" in listed and "name=carol-group, patternType=LITERAL" in listed
    assert "(principal=User:carol, host=*, operation=READ, permissionType=ALLOW)" in listed
    assert len(cluster.admin().describe_acls(AclFilter(principal="User:carol"))) == 4
    acls("--remove", "--allow-principal", "User:carol", "--operation", "Read", "--topic", "carol-topic", "--force")
    left = cluster.admin().describe_acls(AclFilter(principal="User:carol"))
    assert sorted((b.resource_type, b.resource_name, b.operation) for b in left) == sorted([
        (GROUP, "carol-group", DESCRIBE), (GROUP, "carol-group", READ), (TOPIC, "carol-topic", DESCRIBE)])


# Last: it restarts the module's cluster.
def test_acls_and_credentials_survive_a_restart_of_the_whole_cluster(cluster, data_dir, tls):
    """Runs last in this module: it restarts the cluster."""
    topic = f"after-{uuid.uuid4().hex[:6]}"
    grant(cluster, topic_acl(confluent_admin.AclOperation.WRITE, topic))
    cluster.shutdown()
    again = rayk.start(brokers=1, data_dir=data_dir, config=config_for(tls), namespace="listener-acls")
    try:
        again.create_topic(topic, num_partitions=1, replication_factor=1)
        alice = as_alice(again, tls)
        assert produce_error(alice, topic) is None
        assert produce_error(alice, "orders") == ConfluentError.TOPIC_AUTHORIZATION_FAILED
    finally:
        again.shutdown()
