"""What every fault test shares: a Ray cluster of a head and broker nodes, a rayk cluster
under continuous acks=all idempotent production, process kills by pid, and the checks.

Each test deploys a fresh rayk cluster (its own Ray namespace and data directory) on
the Ray cluster of its module (or the one the broker-node modules share), writes without
pause to a 3-partition RF=3 topic with min.insync.replicas=2 through rayk's own Producer,
injects one fault, and then checks what the issue asks of every fault:
- every acknowledged record is read back exactly once, at its acknowledged offset;
- no record shows up twice (acknowledged or not);
- writes resume on every partition within broker.session.timeout.ms + 10 s;
- afterwards every partition has a leader and a full ISR (no reassignment left).
Processes are killed by the pid in Ray's actor table, and only rayk's own actors.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import ray
from ray._private.state import actors as actor_table

import rayk
from rayk.errors import OffsetNotAvailableError
from tests.cluster_helpers import BROKER_RESOURCE, FAST_CONFIG, decode, pid_of, wait_until

TOPIC = "faults"
PARTITIONS = 3
# Short, as in the other cluster tests, but above FAST_CONFIG's 4 s: on this 2-core machine
# four Ray nodes restarting every process at once need a few seconds just to fork them.
SESSION_TIMEOUT_MS = 8_000
# No Kafka listener (the faults are driven through rayk's own clients; a listener is one
# more process per broker to start): the listener's own fault test asks for one.
CONFIG = {**FAST_CONFIG, "broker.session.timeout.ms": SESSION_TIMEOUT_MS, "broker.replacement.delay.ms": -1, "listeners": ""}
WITH_LISTENERS = {"listeners": FAST_CONFIG["listeners"]}
RESUME_BOUND_S = SESSION_TIMEOUT_MS / 1000 + 10  # the bound on writes resuming
SEND_RATE_PER_S = 1_500  # enough to keep every partition busy, little enough for 2 cores
RAYK_ACTOR_CLASSES = {
    "Controller", "ReplicaManager", "PartitionReplica", "OffsetsPartitionReplica", "SocketServerActor",
}
_namespaces = itertools.count()


def signal_actor(handle: Any, sig: int) -> int:
    pid = pid_of(handle)
    os.kill(pid, sig)
    return pid


def live_rayk_actor_pids() -> list[int]:
    """Pids of every live rayk actor process in this Ray cluster (only the fault and
    failover tests run rayk on it, and each shuts its cluster down before the next starts)."""
    return sorted(
        {
            info["Pid"]
            for info in actor_table().values()
            if info["State"] == "ALIVE" and info["ActorClassName"] in RAYK_ACTOR_CLASSES and info["Pid"]
        }
    )


def start_rayk(data_dir, brokers: int = 3, config: dict | None = None, namespace: str | None = None) -> Any:
    c = rayk.start(
        brokers=brokers,
        data_dir=data_dir,
        config={**CONFIG, **(config or {})},
        namespace=namespace or f"faults-{next(_namespaces)}",
        node_resource=BROKER_RESOURCE,
    )
    return c


@dataclass
class Traffic:
    """One idempotent acks=all Producer sending unique values without pause, round-robin
    over the partitions, recording what was acknowledged where and when."""

    cluster: Any
    topic: str = TOPIC
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # value -> (partition, offset)
    failed: Counter = field(default_factory=Counter)  # error name -> records
    sent_at: dict[bytes, float] = field(default_factory=dict)
    acked_at: dict[bytes, float] = field(default_factory=dict)
    rate_per_s: float = SEND_RATE_PER_S  # the nemesis sends slower: its consumers share the driver's CPU
    partitions: int = PARTITIONS  # sent to round-robin

    def __post_init__(self) -> None:
        self.producer = self.cluster.producer(acks="all", linger_ms=5, delivery_timeout_ms=120_000)
        RUNNING.append(self)
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval_s = 1 / self.rate_per_s
        for i in itertools.count():
            if self._halt.is_set():
                return
            value = b"record-%09d" % i
            partition = i % self.partitions
            with self._lock:
                self.sent_at[value] = time.monotonic()
            future = self.producer.send(self.topic, value=value, partition=partition)
            future.add_done_callback(lambda f, v=value: self._done(v, f))
            time.sleep(interval_s)

    def _done(self, value: bytes, future: Any) -> None:
        error = future.exception()
        with self._lock:
            if error is None:
                meta = future.result()
                self.acked[value] = (meta.partition, meta.offset)
                self.acked_at[value] = time.monotonic()
            else:
                self.failed[getattr(error, "name", type(error).__name__)] += 1

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def resumed_after(self, t0: float) -> dict[int, float]:
        """Per partition, seconds from `t0` to the first acknowledgement of a record sent after it."""
        out: dict[int, float] = {}
        with self._lock:
            for value, sent in self.sent_at.items():
                if sent > t0 and value in self.acked:
                    p = self.acked[value][0]
                    out[p] = min(out.get(p, float("inf")), self.acked_at[value] - t0)
        return out

    def wait_resumed(self, t0: float, bound_s: float = RESUME_BOUND_S) -> float:
        """Waits until every partition took a write sent after `t0`; returns the slowest's delay (s).
        Take `t0` once the fault is done, not before the lookups it starts with (a pid, a
        handle: long on loaded cores): a write the victim still took in between would count
        as resumed before the fault."""
        wait_until(lambda: len(self.resumed_after(t0)) == self.partitions, bound_s + 20, "writes on every partition")
        slowest = max(self.resumed_after(t0).values())
        assert slowest <= bound_s, f"writes resumed after {slowest:.1f} s, bound {bound_s} s"
        return slowest

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=30)
        self.producer.flush(180)
        self.producer.close()

    def abandon(self) -> None:
        """Stops sending at once, acknowledged or not (a test that failed)."""
        self._halt.set()
        self._thread.join(timeout=30)
        self.producer.close(timeout_s=0)


RUNNING: list[Traffic] = []


def abandon_running_traffic() -> None:
    while RUNNING:
        traffic = RUNNING.pop()
        try:
            traffic.abandon()
        except Exception:
            pass  # it was stopped already, or its cluster is gone


def read_partition(cluster: Any, partition: int, topic: str = TOPIC) -> dict[int, bytes]:
    """offset -> value of everything below the partition's high watermark, from its leader.
    The HW is what ListOffsets(latest) answers, as a consumer sees it: a new leader answers
    OFFSET_NOT_AVAILABLE until its HW has reached its predecessor's (KIP-207)."""
    leader = wait_until(lambda: _leader_or_none(cluster, partition, topic), 60, f"a leader for {topic}-{partition}")
    (hw,) = wait_until(lambda: _end_offset_or_none(leader), 60, f"the end offset of {topic}-{partition}")
    out: dict[int, bytes] = {}
    offset = 0
    while offset < hw:
        result = ray.get(leader.fetch.remote(offset, 1 << 20, 1, 0))
        assert result.error is None, result.error
        records = decode(result.records)
        assert records, f"no progress at offset {offset} of {topic}-{partition} (HW {hw})"
        out.update(records)
        offset = records[-1][0] + 1
    return out


def _end_offset_or_none(leader: Any) -> tuple[int] | None:
    try:
        return (ray.get(leader.list_offset.remote(-1))[0],)
    except OffsetNotAvailableError:
        return None


def _leader_or_none(cluster: Any, partition: int, topic: str = TOPIC) -> Any:
    try:
        return cluster.leader(topic, partition)
    except Exception:
        return None


def healthy(cluster: Any, topic: str = TOPIC) -> bool:
    try:
        parts = cluster.describe_topic(topic)
    except Exception:
        return False
    return all(
        p["leader"] >= 0
        and sorted(p["isr"]) == sorted(p["replicas"])
        and not p["adding_replicas"]
        and not p["removing_replicas"]
        and p["high_watermark"] is not None
        for p in parts
    )


@dataclass(frozen=True)
class Outcome:
    fault: str
    resume_s: float
    acknowledged: int
    lost: int
    duplicated: int
    failed: dict

    def line(self) -> str:
        return (
            f"FAULT {self.fault}: writes resumed on every partition after {self.resume_s:.1f} s; "
            f"{self.acknowledged} acknowledged, {self.lost} lost, {self.duplicated} duplicated; "
            f"unacknowledged: {dict(self.failed) or 'none'}"
        )


def lost_and_duplicated(traffic: Traffic, stored: dict[int, dict[int, bytes]]) -> tuple[list, list]:
    """The acknowledged records not at their acknowledged offsets ((value, (partition,
    offset)) pairs), and the values stored more than once."""
    lost = [(v, where) for v, where in traffic.acked.items() if stored[where[0]].get(where[1]) != v]
    counts = Counter(v for part in stored.values() for v in part.values())
    return lost, [v for v, n in counts.items() if n > 1]


def check(cluster: Any, traffic: Traffic, fault: str, resume_s: float) -> Outcome:
    """The checks every fault test ends with; returns (and prints) the figures."""
    traffic.stop()
    wait_until(lambda: healthy(cluster), 90, "every partition led, with its full ISR")
    stored = {p: read_partition(cluster, p) for p in range(PARTITIONS)}
    lost, duplicated = lost_and_duplicated(traffic, stored)
    outcome = Outcome(fault, resume_s, len(traffic.acked), len(lost), len(duplicated), dict(traffic.failed))
    print(outcome.line())
    assert traffic.acked, "nothing was acknowledged"
    assert not lost, f"{len(lost)} acknowledged records are not at their offsets, e.g. {lost[:3]}"
    assert not duplicated, f"{len(duplicated)} records are stored twice, e.g. {duplicated[:3]}"
    return outcome


def run_until_acked(traffic: Traffic, records: int, timeout_s: float = 60) -> None:
    start = traffic.acked_count()
    wait_until(lambda: traffic.acked_count() >= start + records, timeout_s, f"{records} more acknowledged records")


def broker_node(ray_cluster: Any, cluster: Any, broker_id: int) -> Any:
    node_id = next(b["node_id"] for b in cluster.brokers() if b["broker_id"] == broker_id)
    return next(n for n in ray_cluster.list_all_nodes() if n.node_id == node_id)


def kill_all(pids: list[int]) -> None:
    signal_all(pids, signal.SIGKILL)  # a pid gone already: a replica dies with its broker


def rayk_actor_pids_on_node(node_id: str) -> list[int]:
    """Pids of the live rayk actor processes on one Ray node (a broker's own processes)."""
    return sorted(
        {
            info["Pid"]
            for info in actor_table().values()
            if info["State"] == "ALIVE"
            and info["ActorClassName"] in RAYK_ACTOR_CLASSES
            and info["Pid"]
            and info["Address"]["NodeID"] == node_id
        }
    )


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass  # gone already
