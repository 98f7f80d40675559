"""rayk's metrics: their names, and the Ray metric objects (`ray.util.metrics`) that record them.

This module owns every metric rayk exports and nothing else; the actors and the listener
call its functions. Ray's metrics agent on each node serves them on Ray's Prometheus
endpoint (`ray start --metrics-export-port=PORT`, `http://<node>:PORT/metrics`), so no
server of rayk's own is needed.

Names are Kafka's JMX names as the Prometheus JMX exporter's usual Kafka rules write them,
`kafka_<domain>_<type>_<name>` in lower case with `PerSec` dropped from counters (Prometheus
makes the rate), after `rayk_`: Kafka's `kafka.server:type=BrokerTopicMetrics,
name=MessagesInPerSec` is `rayk_kafka_server_brokertopicmetrics_messagesin`. Ray adds its
prefix `ray_` and, to counters, the suffix `_total`: on the endpoint it is
`ray_rayk_kafka_server_brokertopicmetrics_messagesin_total`. Labels are Kafka's tags in
lower case: `broker`, `topic`, `partition`, `request` (an API's name, as in Kafka's
RequestMetrics), `listener`, and `group` for consumer lag. Ray adds its own (`SessionName`,
`NodeAddress`, `WorkerId`, ...): sum over `WorkerId`, since every process reports its own
series. Broker ids are a rayk cluster's: two rayk clusters on one Ray cluster (two Ray
namespaces) report under the same `broker` values.

Where each is counted: BrokerTopicMetrics at the partition leader (PartitionReplica), where
both front doors (actor calls and the Kafka listener) arrive, per request in a call: a
listener's Fetch of several partitions may call a partition twice (a read, then a wait
for `min_bytes`), and BytesOut counts what the leader answered, before the listener trims
an answer to the request's `max_bytes`. The ReplicaManager gauges, log sizes, ISR changes
and group lag at each broker's ReplicaManager; the Controller's at the Controller;
TotalTimeMs at the listener (SocketServer).

Cost: one record into a Ray metric costs 1-7 us (measured), so hot paths never record per
record. The partition leader's per-request counters are plain ints, added to Ray's counters
at most every COUNTER_FLUSH_INTERVAL_MS and at each of the replica's publications on its
broker's board (`BrokerTopicCounters`); the listener records one latency per request.

Gauges: Ray drops a gauge that is not set again within about 20 s (measured with Ray
2.60), which is also how a dead broker's or a moved partition's gauges go away; their
owners set them again every GAUGE_REFRESH_INTERVAL_MS.

Metric objects are created on first use, once per process; until Ray is connected,
records go nowhere (as in a unit test that uses an actor's class directly).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ray.util.metrics import Counter, Gauge, Histogram

GAUGE_REFRESH_INTERVAL_MS = 5_000
COUNTER_FLUSH_INTERVAL_MS = 1_000

# Kafka's BrokerTopicMetrics, per broker and topic (counters; Kafka's names end in PerSec)
MESSAGES_IN = "rayk_kafka_server_brokertopicmetrics_messagesin"
BYTES_IN = "rayk_kafka_server_brokertopicmetrics_bytesin"
BYTES_OUT = "rayk_kafka_server_brokertopicmetrics_bytesout"
BYTES_REJECTED = "rayk_kafka_server_brokertopicmetrics_bytesrejected"
TOTAL_PRODUCE_REQUESTS = "rayk_kafka_server_brokertopicmetrics_totalproducerequests"
FAILED_PRODUCE_REQUESTS = "rayk_kafka_server_brokertopicmetrics_failedproducerequests"
TOTAL_FETCH_REQUESTS = "rayk_kafka_server_brokertopicmetrics_totalfetchrequests"
FAILED_FETCH_REQUESTS = "rayk_kafka_server_brokertopicmetrics_failedfetchrequests"
# Kafka's ReplicaManager, per broker
ISR_SHRINKS = "rayk_kafka_server_replicamanager_isrshrinks"
ISR_EXPANDS = "rayk_kafka_server_replicamanager_isrexpands"
UNDER_REPLICATED_PARTITIONS = "rayk_kafka_server_replicamanager_underreplicatedpartitions"
UNDER_MIN_ISR_PARTITION_COUNT = "rayk_kafka_server_replicamanager_underminisrpartitioncount"
LEADER_COUNT = "rayk_kafka_server_replicamanager_leadercount"
PARTITION_COUNT = "rayk_kafka_server_replicamanager_partitioncount"
# Kafka's Log, per broker, topic and partition
LOG_SIZE = "rayk_kafka_log_log_size"
# Kafka's KafkaController and ControllerEventManager
OFFLINE_PARTITIONS_COUNT = "rayk_kafka_controller_kafkacontroller_offlinepartitionscount"
ACTIVE_CONTROLLER_COUNT = "rayk_kafka_controller_kafkacontroller_activecontrollercount"
EVENT_QUEUE_TIME_MS = "rayk_kafka_controller_controllereventmanager_eventqueuetimems"
# Kafka's RequestMetrics, per broker, listener and request (API)
REQUEST_TOTAL_TIME_MS = "rayk_kafka_network_requestmetrics_totaltimems"
# Consumer lag per group and partition (no broker JMX name: kafka_exporter's, after `rayk_`)
CONSUMER_GROUP_LAG = "rayk_kafka_consumergroup_lag"

_BROKER_TOPIC = ("broker", "topic")
_LATENCY_BOUNDARIES_MS = [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000]
_QUEUE_TIME_BOUNDARIES_MS = [0.1, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 5_000]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """How one metric name is made into a Ray metric on first use: its kind, its description,
    its label names and, for a histogram, its bucket boundaries (in the metric's unit)."""

    kind: type  # Counter, Gauge or Histogram
    description: str
    tag_keys: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()  # histograms only


def _counter(description: str, tag_keys: tuple[str, ...] = _BROKER_TOPIC) -> MetricSpec:
    return MetricSpec(Counter, description, tag_keys)


def _gauge(description: str, tag_keys: tuple[str, ...] = ("broker",)) -> MetricSpec:
    return MetricSpec(Gauge, description, tag_keys)


SPECS: dict[str, MetricSpec] = {
    MESSAGES_IN: _counter("Records appended by partition leaders (MessagesInPerSec)."),
    BYTES_IN: _counter("Bytes of records appended by partition leaders (BytesInPerSec)."),
    BYTES_OUT: _counter("Bytes of records answered to consumer fetches, not followers' (BytesOutPerSec)."),
    BYTES_REJECTED: _counter("Bytes of produced records the log refused: too large, corrupt, invalid."),
    TOTAL_PRODUCE_REQUESTS: _counter("Produce requests per partition at its leader (TotalProduceRequestsPerSec)."),
    FAILED_PRODUCE_REQUESTS: _counter("Produce requests per partition answered with an error."),
    TOTAL_FETCH_REQUESTS: _counter("Fetch calls per partition at its leader, consumers' and followers'."),
    FAILED_FETCH_REQUESTS: _counter("Fetch calls per partition answered with an error."),
    ISR_SHRINKS: _counter("ISR shrinks committed for partitions this broker leads (IsrShrinksPerSec).", ("broker",)),
    ISR_EXPANDS: _counter("ISR expansions committed for partitions this broker leads (IsrExpandsPerSec).", ("broker",)),
    UNDER_REPLICATED_PARTITIONS: _gauge("Partitions this broker leads whose ISR is smaller than their replicas."),
    UNDER_MIN_ISR_PARTITION_COUNT: _gauge("Partitions this broker leads whose ISR is below min.insync.replicas."),
    LEADER_COUNT: _gauge("Partitions this broker leads."),
    PARTITION_COUNT: _gauge("Partition replicas this broker holds, leaders and followers."),
    LOG_SIZE: _gauge("Bytes on disk of one replica's log (Log Size).", ("broker", "topic", "partition")),
    OFFLINE_PARTITIONS_COUNT: _gauge("Partitions without a leader, as the Controller sees them.", ()),
    ACTIVE_CONTROLLER_COUNT: _gauge("1 from the running Controller (no series: none runs).", ()),
    EVENT_QUEUE_TIME_MS: MetricSpec(
        Histogram, "How long a ready event waits for the Controller's event loop (sampled each maintenance tick), ms.",
        boundaries=tuple(_QUEUE_TIME_BOUNDARIES_MS),
    ),
    REQUEST_TOTAL_TIME_MS: MetricSpec(
        Histogram, "Kafka listener requests, read off the socket to answer written, ms (RequestMetrics TotalTimeMs).",
        ("broker", "listener", "request"), tuple(_LATENCY_BOUNDARIES_MS),
    ),
    CONSUMER_GROUP_LAG: _gauge("A group's lag on a partition: high watermark minus committed offset.",
                               ("group", "topic", "partition")),
}

_objects: dict[str, Any] = {}


def metric(name: str) -> Any:
    """The Ray metric object of `name`, created on first use in this process."""
    found = _objects.get(name)
    if found is None:
        spec = SPECS[name]
        if spec.kind is Histogram:
            found = Histogram(name, spec.description, list(spec.boundaries), spec.tag_keys)
        else:
            found = spec.kind(name, spec.description, spec.tag_keys)
        _objects[name] = found
    return found


# ---------------------------------------------------------------------------- partition leaders


class BrokerTopicCounters:
    """Kafka's BrokerTopicMetrics of one topic on one broker, as a partition leader counts
    them: plain ints bumped per request, added to Ray's counters by `flush` (at most every
    COUNTER_FLUSH_INTERVAL_MS from the hot path, `maybe_flush`, and at each of the replica's
    publications on its broker's board, so that an idle partition's last counts are not
    held back).
    Not thread-safe: the replica's event loop owns it."""

    __slots__ = ("_tags", "_next_flush_s", "messages_in", "bytes_in", "bytes_out", "bytes_rejected",
                 "produce_requests", "failed_produce_requests", "fetch_requests", "failed_fetch_requests")

    def __init__(self, broker_id: int, topic: str) -> None:
        self._tags = {"broker": str(broker_id), "topic": topic}
        self._next_flush_s = 0.0
        self._reset()

    def _reset(self) -> None:
        self.messages_in = self.bytes_in = self.bytes_out = self.bytes_rejected = 0
        self.produce_requests = self.failed_produce_requests = 0
        self.fetch_requests = self.failed_fetch_requests = 0

    def maybe_flush(self) -> None:
        now_s = time.monotonic()
        if now_s >= self._next_flush_s:
            self._next_flush_s = now_s + COUNTER_FLUSH_INTERVAL_MS / 1000
            self.flush()

    def flush(self) -> None:
        counts = (
            (MESSAGES_IN, self.messages_in), (BYTES_IN, self.bytes_in), (BYTES_OUT, self.bytes_out),
            (BYTES_REJECTED, self.bytes_rejected), (TOTAL_PRODUCE_REQUESTS, self.produce_requests),
            (FAILED_PRODUCE_REQUESTS, self.failed_produce_requests), (TOTAL_FETCH_REQUESTS, self.fetch_requests),
            (FAILED_FETCH_REQUESTS, self.failed_fetch_requests),
        )
        self._reset()
        for name, count in counts:
            if count:
                metric(name).inc(count, self._tags)


# ---------------------------------------------------------------------------- brokers


@dataclass(frozen=True, slots=True)
class BrokerHealth:
    """Kafka's ReplicaManager gauges of one broker (what `rayk status` prints, too)."""

    broker_id: int
    leader_count: int
    partition_count: int
    under_replicated_partitions: int
    under_min_isr_partition_count: int


def record_broker_health(health: BrokerHealth) -> None:
    tags = {"broker": str(health.broker_id)}
    metric(LEADER_COUNT).set(health.leader_count, tags)
    metric(PARTITION_COUNT).set(health.partition_count, tags)
    metric(UNDER_REPLICATED_PARTITIONS).set(health.under_replicated_partitions, tags)
    metric(UNDER_MIN_ISR_PARTITION_COUNT).set(health.under_min_isr_partition_count, tags)


def record_log_size(broker_id: int, topic: str, partition: int, size_bytes: int) -> None:
    metric(LOG_SIZE).set(size_bytes, {"broker": str(broker_id), "topic": topic, "partition": str(partition)})


def record_isr_change(broker_id: int, shrink: bool) -> None:
    metric(ISR_SHRINKS if shrink else ISR_EXPANDS).inc(1, {"broker": str(broker_id)})


def record_group_lag(group: str, topic: str, partition: int, lag: int) -> None:
    metric(CONSUMER_GROUP_LAG).set(lag, {"group": group, "topic": topic, "partition": str(partition)})


# ---------------------------------------------------------------------------- the Controller


def record_controller(offline_partitions_count: int) -> None:
    """The running Controller's gauges (ActiveControllerCount is 1 from whoever records it)."""
    metric(ACTIVE_CONTROLLER_COUNT).set(1)
    metric(OFFLINE_PARTITIONS_COUNT).set(offline_partitions_count)


def record_event_queue_time(queue_time_ms: float) -> None:
    metric(EVENT_QUEUE_TIME_MS).observe(max(queue_time_ms, 0.0))


# ---------------------------------------------------------------------------- the Kafka listener


class RequestTimer:
    """One listener's TotalTimeMs histogram, with each API's tags built once."""

    def __init__(self, broker_id: int, listener: str) -> None:
        self._broker, self._listener = str(broker_id), listener
        self._tags: dict[str, dict[str, str]] = {}

    def record(self, request: str, received_s: float) -> None:
        """A request named `request` (Kafka's API name), read at monotonic `received_s`, was answered now."""
        tags = self._tags.get(request)
        if tags is None:
            tags = self._tags[request] = {"broker": self._broker, "listener": self._listener, "request": request}
        metric(REQUEST_TOTAL_TIME_MS).observe((time.monotonic() - received_s) * 1000, tags)
