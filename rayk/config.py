"""Broker and topic settings shared by every layer, with Kafka's names and defaults.

`BrokerConfig` holds the broker-level settings rayk honours (`broker.session.timeout.ms`,
`replica.lag.time.max.ms`, ...) as Python fields with units; `from_properties` accepts
Kafka's dotted names. Topic configs travel as Kafka's dotted name -> string maps (that is
what the Controller stores and what clients send); `validate_topic_configs` checks one
against the names rayk knows, and `log_config_of` / `replica_settings_of` split it into
what the storage layer and the replication layer need.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from rayk.errors import InvalidConfigurationError
from rayk.listeners import DEFAULT_SECURITY_PROTOCOL_MAP, Listener, parse_listeners
from rayk.storage.log_config import PROPERTY_FIELDS as LOG_PROPERTY_FIELDS
from rayk.storage.log_config import MAX_MESSAGE_BYTES_LIMIT, LogConfig
from rayk.storage.remote.remote_log_storage import RemoteStorageSettings


LISTENER_PREFIX = "listener.name."
# What listener.name.<name>.<setting> may set for one listener.
LISTENER_SETTINGS = (
    "ssl.keystore.type", "ssl.keystore.location", "ssl.key.password",
    "ssl.truststore.type", "ssl.truststore.location", "ssl.client.auth",
    "sasl.enabled.mechanisms", "sasl.server.max.receive.size", "sasl.server.authentication.timeout.ms",
)
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# rayk's ACL authorizer (rayk/acls.py) answers to the names of Kafka's.
AUTHORIZERS = ("", "org.apache.kafka.metadata.authorizer.StandardAuthorizer", "kafka.security.authorizer.AclAuthorizer")
SSL_CLIENT_AUTH = ("none", "requested", "required")

NEVER_ALLOWED_MS = ("broker_replacement_delay_ms", "broker_idle_removal_ms")  # -1 means never
ZERO_ALLOWED_MS = (  # 0 means none
    "group_initial_rebalance_delay_ms", "connections_max_reauth_ms", "metadata_log_max_snapshot_interval_ms",
)

UNLIMITED_RATE = (1 << 63) - 1  # Kafka's Long.MAX_VALUE: a throttle that is off

MIN_INSYNC_REPLICAS = "min.insync.replicas"
UNCLEAN_LEADER_ELECTION_ENABLE = "unclean.leader.election.enable"
# The topic configs the replication layer reads (LogConfig has the others), and what each
# does; a topic without its own takes the broker's setting of the same name.
REPLICATION_TOPIC_CONFIGS = {
    MIN_INSYNC_REPLICAS: "In-sync replicas an acks=all produce needs; below it, NOT_ENOUGH_REPLICAS.",
    UNCLEAN_LEADER_ELECTION_ENABLE: "Whether a replica out of the ISR may become leader when no replica in it is "
                                    "live (losing what it lacks).",
}

# BrokerConfig's counts and sizes that must be >= 1.
POSITIVE_SETTINGS = (
    "num_partitions",
    "default_replication_factor",
    "min_insync_replicas",
    "replica_fetch_max_bytes",
    "offsets_topic_num_partitions",
    "offsets_topic_replication_factor",
    "offsets_topic_segment_bytes",
    "transaction_state_log_num_partitions",
    "transaction_state_log_replication_factor",
    "transaction_state_log_min_isr",
    "transaction_state_log_segment_bytes",
    "queued_max_requests",
    "socket_request_max_bytes",
    "max_connections",
    "sasl_server_max_receive_size",
    "log_cleaner_io_max_bytes_per_second",
    "log_cleaner_dedupe_buffer_size",
    "quota_window_num",
    "offsets_retention_minutes",
    "quota_window_size_seconds",
    "metadata_log_max_record_bytes_between_snapshots",
    "group_share_delivery_count_limit",
    "group_share_partition_max_record_locks",
    "group_share_max_size",
    "group_consumer_max_size",
    "balancer_max_concurrent_moves_per_broker",
    "leader_replication_throttled_rate",
    "follower_replication_throttled_rate",
)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """A broker's settings: Kafka's dotted names with underscores, units last (`from_properties`
    takes the dotted ones). Checked on construction, in named steps: a value out of range or
    settings that do not fit together raise InvalidConfigurationError. Each field's docstring
    says what the setting does; the documentation's configuration reference is generated from
    them (docs/hooks.py)."""

    broker_session_timeout_ms: int = 9_000
    """A broker that sends no heartbeat to the Controller this long is fenced, and its partitions'
    leadership moves to other replicas."""
    broker_heartbeat_interval_ms: int = 2_000
    """How often a broker heartbeats to the Controller; below broker.session.timeout.ms."""
    replica_lag_time_max_ms: int = 10_000
    """A follower that has not caught up to the leader's log end for this long leaves the ISR (checked
    every half of it)."""
    replica_fetch_max_bytes: int = 1 << 20
    """Bytes a follower asks for per partition in one fetch from its leader."""
    replica_fetch_min_bytes: int = 1
    """Bytes a follower's fetch waits for before the leader answers it."""
    replica_fetch_wait_max_ms: int = 500
    """Longest a leader holds a follower's fetch while fewer than replica.fetch.min.bytes are there."""
    replica_socket_timeout_ms: int = 30_000
    """Bound on one follower fetch call to its leader."""
    broker_replacement_delay_ms: int = 300_000
    """A broker fenced this long has its replicas moved to live brokers; -1: never. rayk's own."""
    # rayk/controller/autoscaling.py. Ten minutes, twice Ray's default idle_timeout_minutes: a
    # topic deleted and made again, or a broker that just joined and waits for the balancer,
    # does not cost a node's start (minutes on a cloud) and a broker's.
    broker_idle_removal_ms: int = 600_000
    """With Ray's autoscaler (`rayk.start(autoscale=True)`), a broker that holds no replica this long
    is decommissioned so that its node can go; -1: never. rayk's own."""
    replica_high_watermark_checkpoint_interval_ms: int = 5_000
    """How often a broker writes its offset checkpoints (high watermark, log start offset, cleaner
    offsets)."""
    log_retention_check_interval_ms: int = 300_000
    """How often retention (retention.ms, retention.bytes) deletes old segments."""
    # The Controller snapshots its metadata image (rayk/metadata/) once this many bytes of
    # records were appended since the last snapshot, or this long after it if any were
    # (KRaft's names and defaults; an interval of 0 snapshots by bytes only).
    metadata_log_max_record_bytes_between_snapshots: int = 20 * 1024 * 1024
    """The Controller snapshots its metadata image once this many bytes of records were appended since
    the last snapshot."""
    metadata_log_max_snapshot_interval_ms: int = 3_600_000
    """The Controller snapshots its metadata image this long after the last snapshot if any record was
    appended since; 0: by bytes only."""
    # The log cleaner (compaction), one per broker: it cleans the filthiest compacted log,
    # then the next, and waits this long when none needs it.
    log_cleaner_enable: bool = True
    """Whether each broker runs a log cleaner, which compacts topics with cleanup.policy compact."""
    log_cleaner_backoff_ms: int = 15_000
    """How long the log cleaner waits when no log needs cleaning."""
    log_cleaner_io_max_bytes_per_second: int = (1 << 63) - 1
    """The log cleaner's read and write rate; Long.MAX_VALUE: no limit."""
    log_cleaner_dedupe_buffer_size: int = 128 * 1024 * 1024
    """Memory for one clean's key -> offset map."""
    # Consumer groups (Kafka's group.* and offsets.* names).
    group_initial_rebalance_delay_ms: int = 3_000
    """How long a new classic group's coordinator waits for more members before its first rebalance; 0:
    none."""
    group_min_session_timeout_ms: int = 6_000
    """The shortest session.timeout.ms a classic group's member may ask for."""
    group_max_session_timeout_ms: int = 1_800_000
    """The longest session.timeout.ms a classic group's member may ask for."""
    offset_metadata_max_bytes: int = 4096
    """The longest metadata string a committed offset may carry."""
    # KIP-848's consumer protocol groups: a member is removed after this long without a
    # heartbeat, and is told to heartbeat this often.
    group_consumer_session_timeout_ms: int = 45_000
    """A member of a consumer protocol group (KIP-848) is removed after this long without a heartbeat."""
    group_consumer_heartbeat_interval_ms: int = 5_000
    """How often a member of a consumer protocol group is told to heartbeat."""
    group_consumer_max_size: int = 2**31 - 1
    """Members of a consumer protocol group; one more is GROUP_MAX_SIZE_REACHED."""
    # KIP-932's share groups: member sessions as above; a record a member acquired comes back
    # after the lock duration, and is archived once delivered the count limit times; a
    # share-partition holds at most this many records in flight.
    group_share_session_timeout_ms: int = 45_000
    """A member of a share group (KIP-932) is removed after this long without a heartbeat."""
    group_share_heartbeat_interval_ms: int = 5_000
    """How often a member of a share group is told to heartbeat."""
    group_share_record_lock_duration_ms: int = 30_000
    """A record a share group member acquired and did not acknowledge comes back for delivery after
    this long."""
    group_share_delivery_count_limit: int = 5
    """A record delivered this many times without being accepted is archived."""
    group_share_partition_max_record_locks: int = 2_000
    """Records a share-partition holds in flight (acquired, not yet acknowledged)."""
    group_share_max_size: int = 200
    """Members of a share group."""
    offsets_retention_minutes: int = 10_080
    """Committed offsets of a group without members expire this long after it became empty (a
    standalone consumer's: after their commit), as KIP-211."""
    offsets_retention_check_interval_ms: int = 600_000
    """How often expired committed offsets are looked for."""
    offsets_topic_num_partitions: int = 3
    """Partitions of __consumer_offsets (Kafka has 50; each rayk partition replica is a process, so fewer)."""
    offsets_topic_replication_factor: int = 3
    """Replication factor of __consumer_offsets (at most the brokers there are when it is created)."""
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024
    """Segment size of __consumer_offsets: small, since the active segment is never compacted."""
    # Transactions (Kafka's transaction.* names). __transaction_state has 3 partitions, not
    # Kafka's 50, for the reason __consumer_offsets has; min.insync.replicas of the topic is
    # transaction.state.log.min.isr, at most its replication factor (a 1-broker cluster).
    transaction_state_log_num_partitions: int = 3
    """Partitions of __transaction_state (Kafka has 50)."""
    transaction_state_log_replication_factor: int = 3
    """Replication factor of __transaction_state."""
    transaction_state_log_min_isr: int = 2
    """min.insync.replicas of __transaction_state, at most its replication factor."""
    transaction_state_log_segment_bytes: int = 100 * 1024 * 1024
    """Segment size of __transaction_state."""
    transaction_max_timeout_ms: int = 900_000
    """The longest transaction.timeout.ms a producer may ask for."""
    transactional_id_expiration_ms: int = 604_800_000
    """A transactional id idle this long is forgotten."""
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    """How often each transaction coordinator aborts transactions past their timeout."""
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3_600_000
    """How often each transaction coordinator forgets expired transactional ids."""
    # Topic defaults (Kafka's broker-level names: num.partitions, default.replication.factor, ...).
    num_partitions: int = 1
    """Partitions of a topic created without a count (also by auto-creation)."""
    default_replication_factor: int = 1
    """Replication factor of a topic created without one."""
    min_insync_replicas: int = 1
    """In-sync replicas an acks=all produce needs; the default of each topic's min.insync.replicas."""
    unclean_leader_election_enable: bool = False
    """Whether a replica out of the ISR may become leader when none in it is live (losing what it
    lacks); the default of each topic's unclean.leader.election.enable."""
    auto_create_topics_enable: bool = True
    """A Metadata request for a missing topic creates it (never on a listener whose clients authenticate)."""
    # rayk/server/replica_capacity.py.
    max_replicas_per_broker: int = -1
    """Partition replicas a broker may hold (each is a process); -1: derived from its node's memory and
    cores. rayk's own."""
    # Preferred leaders (Kafka's names and defaults): a broker whose share of the partitions
    # it should lead but does not is over the percentage gets them back, checked this often.
    auto_leader_rebalance_enable: bool = True
    """Whether the Controller gives partitions back to their preferred leader."""
    leader_imbalance_check_interval_seconds: int = 300
    """How often the preferred leaders are checked."""
    leader_imbalance_per_broker_percentage: int = 10
    """A broker that does not lead more than this share of the partitions it prefers gets them back."""
    # The balancer (rayk/controller/balancer.py, after Cruise Control's goals). It runs as
    # soon as a broker registers for the first time or starts leaving, follows up as its
    # moves complete, and checks the cluster every balancer.interval.ms: Cruise Control's
    # anomaly.detection.interval.ms, 5 minutes, since joins and leaves do not wait for it
    # (a new broker takes its share within a minute) and the check only catches drift.
    # At most balancer.max.concurrent.moves.per.broker reassignments touch a broker at a
    # time (Cruise Control's num.concurrent.partition.movements.per.broker).
    auto_balance_enable: bool = True
    """Whether the balancer moves replicas and leaders to even out brokers (after Cruise Control's
    goals). rayk's own."""
    balancer_interval_ms: int = 300_000
    """How often the balancer checks the cluster (joins and leaves do not wait for it)."""
    balancer_max_concurrent_moves_per_broker: int = 5
    """Reassignments the balancer runs at once that touch one broker."""
    # Bytes/s of replication traffic for replicas a reassignment adds, per broker: what its
    # leaders send to adding followers, and what its adding followers fetch (Kafka's names;
    # Long.MAX_VALUE: no limit). See rayk/replication/replication_throttle.py.
    leader_replication_throttled_rate: int = UNLIMITED_RATE
    """Bytes/s a broker's leaders send to followers a reassignment adds; Long.MAX_VALUE: no limit."""
    follower_replication_throttled_rate: int = UNLIMITED_RATE
    """Bytes/s a broker's followers that a reassignment adds fetch; Long.MAX_VALUE: no limit."""
    # The Kafka listeners (rayk/listeners.py, rayk/net). Each broker listens on the port plus
    # its broker id (port 0: any free port); an empty host is the node's IP address. ""
    # turns the listeners off.
    listeners: str = "PLAINTEXT://:9092"
    """The Kafka listeners, NAME://host:port,...: each broker listens on the port plus its broker id
    (port 0: any free port); an empty host is the node's IP address; "" turns the listeners off."""
    advertised_listeners: str = ""
    """The addresses clients are given for each listener; "": what each listener is bound to."""
    listener_security_protocol_map: str = DEFAULT_SECURITY_PROTOCOL_MAP
    """Each listener name's security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)."""
    # TLS on SSL and SASL_SSL listeners (rayk/net/tls.py). rayk reads PEM files only: the
    # keystore holds the private key and its certificate chain, the truststore the CAs that
    # client certificates must chain to. Each can be set per listener as
    # listener.name.<name>.ssl.<setting>, as in Kafka.
    ssl_keystore_type: str = "PEM"
    """PEM only: rayk reads PEM files."""
    ssl_keystore_location: str = ""
    """A PEM file holding the broker's private key and certificate chain, for SSL and SASL_SSL listeners."""
    ssl_key_password: str = field(default="", repr=False)
    """The password of an encrypted private key."""
    ssl_truststore_type: str = "PEM"
    """PEM only."""
    ssl_truststore_location: str = ""
    """A PEM file of the CAs that client certificates must chain to."""
    ssl_client_auth: str = "none"
    """none, requested or required (mutual TLS)."""
    # SASL on SASL_PLAINTEXT and SASL_SSL listeners (rayk/net/sasl.py); per listener as
    # listener.name.<name>.sasl.enabled.mechanisms. Kafka's default is GSSAPI, which rayk lacks.
    sasl_enabled_mechanisms: str = "SCRAM-SHA-256,SCRAM-SHA-512"
    """Mechanisms served on SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (Kafka's default,
    GSSAPI, rayk lacks)."""
    connections_max_reauth_ms: int = 0
    """A SASL session's lifetime, after which the client authenticates again (KIP-368); 0: the
    connection's life."""
    # Before a connection on a SASL listener has authenticated, its frames are read outside
    # queued.max.request.bytes, one at a time, so an unauthenticated client can neither take
    # the listener's shared request memory nor hold more than this much of its own: a
    # larger frame closes the connection. Kafka's default is 512 KiB for custom mechanisms
    # and its docs say PLAIN and SCRAM need far less; rayk serves only those (their tokens
    # and ApiVersions are some hundred bytes), so 64 KiB: GSSAPI's own limit, and what the
    # listener's stream buffer holds anyway.
    sasl_server_max_receive_size: int = 65_536
    """The largest frame a connection on a SASL listener may send before it has authenticated; a larger
    one closes it."""
    # Kafka bounds it only by connections.max.idle.ms,
    # which a client keeps resetting with ApiVersions; a real exchange is a few round trips
    # and a credential lookup (at most 5 s), 30 s is Kafka's request.timeout.ms.
    sasl_server_authentication_timeout_ms: int = 30_000
    """A connection on a SASL listener that has not authenticated this long after its TLS handshake (if
    any) is closed. rayk's own."""
    super_users: str = ""
    """Principals that may do anything, "User:a;User:b" (without an authorizer: manage SCRAM credentials)."""
    # ACLs: rayk/acls.py.
    authorizer_class_name: str = ""
    """The ACL authorizer: Kafka's StandardAuthorizer by its class name
    (org.apache.kafka.metadata.authorizer.StandardAuthorizer); "": no ACL checks."""
    allow_everyone_if_no_acl_found: bool = False
    """With an authorizer, whether a resource that no ACL names is open to everyone."""
    listener_overrides: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """Per-listener settings over the broker's own, as listener.name.<name>.<setting> -> value."""
    queued_max_requests: int = 500
    """Requests read and not yet answered, over all of a listener's connections."""
    socket_request_max_bytes: int = 100 * 1024 * 1024
    """A larger request frame closes its connection."""
    queued_max_request_bytes: int = 200 * 1024 * 1024
    """Request bytes a listener holds read (reserved at the size prefix) and not yet answered; -1: no
    limit (Kafka's default; rayk bounds it so that a listener's memory is bounded)."""
    # Connections over all listeners, and from one client host (Kafka's defaults: no
    # limit); a connection past either is closed at once. Overrides: host:count,...
    max_connections: int = 2**31 - 1
    """Connections over all listeners; one more is closed at once."""
    max_connections_per_ip: int = 2**31 - 1
    """Connections from one client host."""
    max_connections_per_ip_overrides: str = ""
    """Per-host limits over max.connections.per.ip: host:count,..."""
    connections_max_idle_ms: int = 600_000
    """A connection that sends nothing this long is closed."""
    # Client quotas (rayk/net/client_quotas.py) measure each client over this many samples
    # of this many seconds, as Kafka's.
    quota_window_num: int = 11
    """Samples over which client quotas measure each client."""
    quota_window_size_seconds: int = 1
    """Length of each client quota sample."""
    # Fetch sessions (KIP-227) per listener; 0 slots: every fetch is a full one.
    max_incremental_fetch_session_cache_slots: int = 1000
    """Fetch sessions (KIP-227) a listener keeps; 0: every fetch is a full one."""
    min_incremental_fetch_session_eviction_ms: int = 120_000
    """A fetch session idle this long may be evicted for a new one."""
    # Tiered storage (KIP-405; rayk/storage/remote/, rayk/replication/remote_log_manager.py).
    remote_log_storage_system_enable: bool = False
    """Whether topics may set remote.storage.enable: their rolled segments go to remote.log.storage.uri."""
    remote_log_storage_uri: str = ""
    """Where remote log segments go: any pyarrow filesystem URI (s3://bucket/prefix, gs://bucket/prefix,
    file:///path). rayk's own (Kafka names a RemoteStorageManager class)."""
    remote_log_storage_s3_endpoint: str = ""
    """For s3://: the S3 API's endpoint (host:port), for an S3-compatible store; "": AWS."""
    remote_log_storage_s3_region: str = ""
    """For s3://: the bucket's region."""
    remote_log_storage_s3_scheme: str = "https"
    """For s3://: http or https."""
    remote_log_storage_s3_access_key: str = field(default="", repr=False)
    """For s3://: the access key; "": the environment's credentials (AWS_* variables, instance profile)."""
    remote_log_storage_s3_secret_key: str = field(default="", repr=False)
    """For s3://: the secret key. Never logged."""
    remote_log_manager_task_interval_ms: int = 30_000
    """How often a leader of a tiered topic copies its rolled segments and applies remote and local retention."""

    def remote_storage(self) -> RemoteStorageSettings | None:
        """The store tiered topics' replicas use; None unless remote.log.storage.system.enable."""
        if not self.remote_log_storage_system_enable:
            return None
        s3 = {"endpoint": self.remote_log_storage_s3_endpoint, "region": self.remote_log_storage_s3_region,
              "scheme": self.remote_log_storage_s3_scheme, "access.key": self.remote_log_storage_s3_access_key,
              "secret.key": self.remote_log_storage_s3_secret_key}  # fmt: skip
        if not self.remote_log_storage_uri.startswith("s3://"):
            s3 = {}
        return RemoteStorageSettings(self.remote_log_storage_uri, {k: v for k, v in s3.items() if v})

    def __post_init__(self) -> None:
        self._check_times()
        self._check_counts()
        for listener in self.kafka_listeners():
            self._check_tls(listener)
            if listener.uses_sasl:
                self.sasl_mechanisms(listener.name)
                self.sasl_server_max_receive_bytes(listener.name)
                self.sasl_server_authentication_timeout_s(listener.name)
        if self.authorizer_class_name not in AUTHORIZERS:
            raise InvalidConfigurationError(
                f"authorizer.class.name = {self.authorizer_class_name!r}: rayk has Kafka's StandardAuthorizer "
                f"({AUTHORIZERS[1]}), or \"\" for none"
            )
        self._check_request_limits()
        if self.remote_log_storage_system_enable and not self.remote_log_storage_uri:
            raise InvalidConfigurationError(
                "remote.log.storage.system.enable = true needs remote.log.storage.uri (s3://..., gs://..., file:///...)"
            )
        if self.remote_log_storage_s3_scheme not in ("http", "https"):
            raise InvalidConfigurationError(
                f"remote.log.storage.s3.scheme = {self.remote_log_storage_s3_scheme!r}: http or https"
            )

    def _check_times(self) -> None:
        """Every *_ms setting is >= 1 ms (those of ZERO_ALLOWED_MS >= 0); heartbeats come
        well within the session."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in NEVER_ALLOWED_MS and value == -1:
                continue  # -1 turns broker replacement / idle removal off
            if f.name.endswith("_ms") and value < (0 if f.name in ZERO_ALLOWED_MS else 1):
                raise InvalidConfigurationError(f"{_dotted(f.name)} must be >= 1 ms, got {value}")
        if self.broker_heartbeat_interval_ms >= self.broker_session_timeout_ms:
            raise InvalidConfigurationError(
                "broker.heartbeat.interval.ms must be below broker.session.timeout.ms "
                f"({self.broker_heartbeat_interval_ms} >= {self.broker_session_timeout_ms})"
            )

    def _check_counts(self) -> None:
        """Counts and sizes are in their ranges (POSITIVE_SETTINGS >= 1)."""
        for name in POSITIVE_SETTINGS:
            if getattr(self, name) < 1:
                raise InvalidConfigurationError(f"{_dotted(name)} must be >= 1, got {getattr(self, name)}")
        if self.leader_imbalance_check_interval_seconds < 1 or not 0 <= self.leader_imbalance_per_broker_percentage <= 100:
            raise InvalidConfigurationError(
                "leader.imbalance.check.interval.seconds must be >= 1 and leader.imbalance.per.broker.percentage "
                f"0..100, got {self.leader_imbalance_check_interval_seconds} and {self.leader_imbalance_per_broker_percentage}"
            )
        if self.max_incremental_fetch_session_cache_slots < 0:
            raise InvalidConfigurationError(
                f"max.incremental.fetch.session.cache.slots must be >= 0, got {self.max_incremental_fetch_session_cache_slots}"
            )

    def _check_request_limits(self) -> None:
        """The listener's request and connection limits fit together."""
        if self.queued_max_request_bytes != -1 and self.queued_max_request_bytes < self.socket_request_max_bytes:
            raise InvalidConfigurationError(
                f"queued.max.request.bytes ({self.queued_max_request_bytes}) must be -1 or at least socket.request.max.bytes "
                f"({self.socket_request_max_bytes}): a request of that size could never be read"
            )
        if not 0 < self.socket_request_max_bytes <= MAX_MESSAGE_BYTES_LIMIT:
            raise InvalidConfigurationError(
                f"socket.request.max.bytes ({self.socket_request_max_bytes}) must be in [1, {MAX_MESSAGE_BYTES_LIMIT}]: "
                "a request's records reach their replica in one data plane frame"
            )
        if self.max_connections_per_ip < 0:
            raise InvalidConfigurationError(f"max.connections.per.ip must be >= 0, got {self.max_connections_per_ip}")
        self.connection_limits_per_ip()

    def connection_limits_per_ip(self) -> dict[str, int]:
        """max.connections.per.ip.overrides as host -> limit."""
        out: dict[str, int] = {}
        for entry in filter(None, (e.strip() for e in self.max_connections_per_ip_overrides.split(","))):
            host, sep, count = entry.rpartition(":")
            if not sep or not host or not count.isdigit():
                raise InvalidConfigurationError(
                    f"max.connections.per.ip.overrides entry {entry!r}: expected host:count"
                )
            out[host.strip("[]")] = int(count)
        return out

    def kafka_listeners(self) -> tuple[Listener, ...]:
        """The named listeners every broker serves, in `listeners` order."""
        return parse_listeners(self.listeners, self.advertised_listeners, self.listener_security_protocol_map)

    def listener_setting(self, listener_name: str, name: str) -> str:
        """Setting `name` (a dotted name of LISTENER_SETTINGS) as `listener_name` sees it: its
        listener.name.<name>.<setting> override, or the broker's own."""
        overrides = dict(self.listener_overrides)
        own = overrides.get(f"{LISTENER_PREFIX}{listener_name.lower()}.{name}")
        return own if own is not None else str(getattr(self, name.replace(".", "_")))

    def sasl_mechanisms(self, listener_name: str) -> tuple[str, ...]:
        """sasl.enabled.mechanisms as one listener sees it; INVALID_CONFIG if empty or unknown."""
        text = self.listener_setting(listener_name, "sasl.enabled.mechanisms")
        mechanisms = tuple(m.strip().upper() for m in text.split(",") if m.strip())
        unknown = [m for m in mechanisms if m not in SASL_MECHANISMS]
        if unknown or not mechanisms:
            raise InvalidConfigurationError(
                f"sasl.enabled.mechanisms = {text!r} (listener {listener_name}): rayk serves {', '.join(SASL_MECHANISMS)}"
            )
        return mechanisms

    def sasl_server_max_receive_bytes(self, listener_name: str) -> int:
        """sasl.server.max.receive.size as one listener sees it."""
        return self._positive_listener_int(listener_name, "sasl.server.max.receive.size")

    def sasl_server_authentication_timeout_s(self, listener_name: str) -> float:
        """sasl.server.authentication.timeout.ms as one listener sees it, in seconds."""
        return self._positive_listener_int(listener_name, "sasl.server.authentication.timeout.ms") / 1000

    def _positive_listener_int(self, listener_name: str, name: str) -> int:
        value = _parse_int(f"{name} (listener {listener_name})", self.listener_setting(listener_name, name))
        if value < 1:
            raise InvalidConfigurationError(f"{name} (listener {listener_name}) must be >= 1, got {value}")
        return value

    @property
    def authorizes(self) -> bool:
        """Whether an authorizer checks ACLs (authorizer.class.name is set)."""
        return bool(self.authorizer_class_name)

    def super_user_set(self) -> frozenset[str]:
        """super.users as principals ("User:admin")."""
        return frozenset(u.strip() for u in self.super_users.split(";") if u.strip())

    def _check_tls(self, listener: Listener) -> None:
        if not listener.uses_tls:
            return
        setting = lambda name: self.listener_setting(listener.name, name)  # noqa: E731
        for store in ("ssl.keystore.type", "ssl.truststore.type"):
            if setting(store).upper() != "PEM":
                raise InvalidConfigurationError(f"{store} = {setting(store)!r} (listener {listener.name}): rayk reads PEM files only")
        if not setting("ssl.keystore.location"):
            raise InvalidConfigurationError(
                f"listener {listener.name} is {listener.security_protocol}: set ssl.keystore.location to a PEM file "
                "holding the broker's private key and certificate chain"
            )
        client_auth = setting("ssl.client.auth")
        if client_auth not in SSL_CLIENT_AUTH:
            raise InvalidConfigurationError(f"ssl.client.auth = {client_auth!r}: expected one of {', '.join(SSL_CLIENT_AUTH)}")
        if client_auth != "none" and not setting("ssl.truststore.location"):
            raise InvalidConfigurationError(
                f"ssl.client.auth = {client_auth} (listener {listener.name}) needs ssl.truststore.location: the CAs "
                "that client certificates must chain to"
            )

    @classmethod
    def from_properties(cls, props: Mapping[str, object] | None = None) -> BrokerConfig:
        """A config from Kafka's dotted names (`replica.lag.time.max.ms`); others raise."""
        known = {_dotted(f.name): f for f in fields(cls) if f.name != "listener_overrides"}
        changes: dict[str, object] = {}
        overrides: dict[str, str] = {}
        for name, raw in (props or {}).items():
            if name.startswith(LISTENER_PREFIX):
                overrides[_listener_override(name)] = str(raw)
                continue
            f = known.get(name)
            if f is None:
                raise InvalidConfigurationError(f"unknown broker config {name!r}; known: {', '.join(sorted(known))}")
            if f.type in (bool, "bool"):
                changes[f.name] = _parse_bool(name, raw)
            elif f.type in (str, "str"):
                changes[f.name] = str(raw)
            else:
                changes[f.name] = _parse_int(name, raw)
        if overrides:
            changes["listener_overrides"] = tuple(sorted(overrides.items()))
        return replace(cls(), **changes)

    def topic_defaults(self) -> dict[str, str]:
        return {
            MIN_INSYNC_REPLICAS: str(self.min_insync_replicas),
            UNCLEAN_LEADER_ELECTION_ENABLE: str(self.unclean_leader_election_enable).lower(),
        }


def _listener_override(name: str) -> str:
    """listener.name.<name>.<setting>, with the listener's name in lower case as Kafka
    writes it; the setting must be one a listener can override."""
    listener, _, setting = name[len(LISTENER_PREFIX):].partition(".")
    if not listener or setting not in LISTENER_SETTINGS:
        raise InvalidConfigurationError(
            f"unknown broker config {name!r}: per-listener settings are listener.name.<listener>.<setting> with a "
            f"setting in {', '.join(LISTENER_SETTINGS)}"
        )
    return f"{LISTENER_PREFIX}{listener.lower()}.{setting}"


def _dotted(field_name: str) -> str:
    return field_name.replace("_", ".")


def _parse_int(name: str, raw: object) -> int:
    if isinstance(raw, bool):
        raise InvalidConfigurationError(f"{name} = {raw!r}: expected an integer")
    try:
        return int(raw)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidConfigurationError(f"{name} = {raw!r}: expected an integer") from None


def _parse_bool(name: str, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise InvalidConfigurationError(f"{name} = {raw!r}: expected true or false")
    return text == "true"


def validate_topic_configs(configs: Mapping[str, object] | None, broker: BrokerConfig | None = None) -> dict[str, str]:
    """Checks a topic's configs (Kafka names) and returns them normalised to strings; with
    `broker`, also against the brokers' settings (remote.storage.enable needs their store)."""
    configs = dict(configs or {})
    log_part = {k: v for k, v in configs.items() if k in LOG_PROPERTY_FIELDS}
    log_config = LogConfig.from_properties(log_part)  # raises INVALID_CONFIG on a bad value
    if log_config.remote_storage_enable and broker is not None and not broker.remote_log_storage_system_enable:
        raise InvalidConfigurationError(
            "remote.storage.enable = true: the brokers have no remote log storage (set "
            "remote.log.storage.system.enable and remote.log.storage.uri)"
        )
    max_message_bytes = log_config.max_message_bytes
    if max_message_bytes > MAX_MESSAGE_BYTES_LIMIT:
        raise InvalidConfigurationError(
            f"max.message.bytes = {max_message_bytes}: must be <= {MAX_MESSAGE_BYTES_LIMIT} (a batch travels between "
            "rayk's processes in one frame)"
        )
    out = {k: str(v) for k, v in log_part.items()}
    for name, raw in configs.items():
        if name in log_part:
            continue
        if name == MIN_INSYNC_REPLICAS:
            value = _parse_int(name, raw)
            if value < 1:
                raise InvalidConfigurationError(f"{name} must be >= 1, got {value}")
            out[name] = str(value)
        elif name == UNCLEAN_LEADER_ELECTION_ENABLE:
            out[name] = str(_parse_bool(name, raw)).lower()
        else:
            known = sorted([*LOG_PROPERTY_FIELDS, *REPLICATION_TOPIC_CONFIGS])
            raise InvalidConfigurationError(f"unknown topic config {name!r}; known: {', '.join(known)}")
    return out


def topic_config_defaults(broker: BrokerConfig) -> dict[str, str]:
    """Every topic config rayk knows, at the value a topic without its own setting has, in
    the text Kafka's DescribeConfigs gives (flush.messages and flush.ms: Long.MAX_VALUE,
    never null; message.timestamp.type: CreateTime), so that each can be sent back as it is."""
    return {**LogConfig().to_properties(), **broker.topic_defaults()}


def log_config_of(configs: Mapping[str, str]) -> LogConfig:
    return LogConfig.from_properties({k: v for k, v in configs.items() if k in LOG_PROPERTY_FIELDS})


def min_insync_replicas_of(configs: Mapping[str, str], broker: BrokerConfig) -> int:
    return int(configs.get(MIN_INSYNC_REPLICAS, broker.min_insync_replicas))


def unclean_election_enabled(configs: Mapping[str, str], broker: BrokerConfig) -> bool:
    raw = configs.get(UNCLEAN_LEADER_ELECTION_ENABLE)
    return broker.unclean_leader_election_enable if raw is None else raw == "true"
