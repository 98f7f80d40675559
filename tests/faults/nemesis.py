"""The nemesis: a randomized, seeded schedule of faults against a rayk cluster under load,
and the checks that every acknowledged record survives it exactly once.

A seed draws a `Schedule` of 3 to 10 `Fault`s (`draw_schedule`, pure: no Ray needed, so a
unit test pins it). Each fault names its target abstractly (the leader of partition 1,
a follower of partition 2, the broker holding partition 0's second replica...); the
`Nemesis` resolves that against the live cluster when the fault's turn comes, with a
random generator seeded from the same seed. The schedule is therefore exactly
reproducible; which pid dies is as reproducible as the cluster's own timing allows.

The safety rule (Kafka's guarantee, RF=3 and min.insync.replicas=2 on every topic):
an acks=all record is acknowledged once it is on every ISR member, at least
min.insync.replicas = 2 copies, so it survives the loss of any RF - min.insync = 1 of them.
Hence:
- every fault that takes a copy away (a replica, broker or node killed, stopped or
  removed; a disk emptied; every process killed with one node's unflushed tail lost) is
  applied only once the cluster is `healthy` again: every partition of every topic led,
  with its full ISR, no reassignment under way, every broker expected back registered.
  So at most one copy of any partition is down or behind at a time, and a copy that lost
  data (`DATA_LOSS`) has caught up before any other copy can be lost. (Kill -9 of every
  process takes every copy down at once, but a killed process loses nothing the page
  cache holds: only the one node whose unflushed tails are cut loses records, which is
  one copy, as Kafka's guarantee allows; an emptied disk there as well could lose
  acknowledged records legitimately, and the barrier rules that out);
- faults that take no copy away (`CONTROL`: the Controller killed, a preferred election,
  an automatic leader rebalance, a reassignment) need no barrier and land while the
  fault before them is still being healed: that overlap is where elections race;
- at most `BROKERS - RF` nodes are removed for good in a schedule, so that the
  Controller can always move their replicas to a live broker and a full ISR stays
  possible.
`check_rule` states the same rule over a drawn schedule.

The workload during a schedule (`Workload`): the harness's idempotent acks=all Traffic; a
consumer group of two members that commit after each poll; and a `rayk.data.stream_topic`
pipeline copying the topic into COPY_TOPIC with `rayk.data.write_topic`, restarted from
its committed progress whenever it fails, as its users would; and a transactional producer
(`Transactions`) writing TXN_TOPIC in transactions of TXN_RECORDS records, a fourth of
them aborted on purpose, made again whenever it fails; and a share group (KIP-932) of two
members reading TOPIC too, accepting every record explicitly. What `Workload.check`
asserts at the end: every acknowledged record is stored exactly once at its acknowledged
offset; every record the group or the pipeline read is stored where it was read; the
group's committed offsets never went backwards nor past a record the group had not
processed; the group and the pipeline reach the end of every partition; the copy holds
every record (twice only if the pipeline replayed a batch after a failure); and within
HEAL_BOUND_S every partition is led with its full ISR and writes go on on every partition;
and no send failed with UNKNOWN_SERVER_ERROR (a replica raising what no fault explains;
other unacknowledged sends, e.g. a delivery timeout, are reported, not failed); the
share group settles every record (its start offset reaches the end of every partition),
no record's acceptance is confirmed twice (every record is accepted exactly once, unless
it was archived), and the share group read every record where it is stored.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from rayk.controller.broker_heartbeat_manager import LATE_FENCE_SESSIONS
from rayk.storage.checkpoint import OffsetCheckpointFile
from rayk.storage.log_manager import partition_dir_name
from tests.cluster_helpers import BROKER_RESOURCE
from tests.faults.harness import (
    CONFIG,
    PARTITIONS,
    SESSION_TIMEOUT_MS,
    TOPIC,
    Traffic,
    broker_node,
    live_rayk_actor_pids,
    lost_and_duplicated,
    rayk_actor_pids_on_node,
    read_partition,
    signal_actor,
    signal_all,
    start_rayk,
)

logger = logging.getLogger(__name__)

BROKERS = 4  # one more than RF: a node lost for good has somewhere for its replicas to go
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
MIN_FAULTS, MAX_FAULTS = 3, 10
MAX_GAP_MS = 6_000  # the longest pause between two faults (a barrier's wait comes on top)
COPY_TOPIC = "faults-copy"
TXN_TOPIC = "faults-transactions"
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
TXN_RECORDS = 20  # per transaction, over the TXN_TOPIC's partitions
TXN_ABORT_EVERY = 4  # every fourth transaction is aborted on purpose
HEALTH_TOPICS = (TOPIC, COPY_TOPIC, TXN_TOPIC, OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC)  # what `healthy` looks at
GROUP = "nemesis-group"
STREAM_GROUP = "nemesis-stream"
GROUP_MEMBERS = 2
SHARE_GROUP = "nemesis-share"  # a share group (KIP-932) reading TOPIC too
SHARE_MEMBERS = 2
SHARE_LOCK_MS = 5_000  # group.share.record.lock.duration.ms: what a lost acknowledgement holds comes back this soon
LEADER_IMBALANCE_CHECK_S = 5  # the automatic leader rebalance runs this often during a schedule
REPLACEMENT_DELAY_MS = 20_000  # a node not replaced by then has its replicas moved (KIP-455)
SEND_RATE_PER_S = 500  # the driver also runs two consumers, an observer and the pipeline
# A fault's own wait: a paused replica's SIGSTOP lasts past the session timeout, so that its
# broker kills it (a stopped process is not running: not late, wedged); a paused broker's
# past LATE_FENCE_SESSIONS session timeouts, since Ray has its process alive (late, not
# dead) and the Controller fences it only then: it wakes up as a zombie all the same.
PAUSE_S = SESSION_TIMEOUT_MS / 1000 + 3
PAUSE_BROKER_S = SESSION_TIMEOUT_MS / 1000 * LATE_FENCE_SESSIONS + 3
# How long the cluster may take to heal from one fault (every copy back in the ISR): a broker
# fenced after the session timeout, a node's replicas moved after the replacement delay, then
# each copy catching up under load on 2 busy cores; and the same again for the last fault.
HEAL_BOUND_S = SESSION_TIMEOUT_MS / 1000 + REPLACEMENT_DELAY_MS / 1000 + 90
CATCH_UP_BOUND_S = 120  # the group and the pipeline reach the end of every partition after the traffic stops
PIPELINE_PLANS_KEPT = 12  # the stream's last plans a stalled pipeline's failure shows
# A batch that neither completed nor failed for this long is stuck where nothing of rayk's
# waits (each read gives up after 60 s without progress, a write after the producer's
# delivery timeout, 120 s): the pipeline starts its stream again, as a supervisor would.
BATCH_STALL_S = 180
STOP_WAIT_S = 115  # how long `stop` waits for the stream to end at its next step
CALL_TIMEOUT_S = 60  # a query of the cluster (the Controller may be restarting)
NEMESIS_CONFIG = {
    **CONFIG,
    "broker.replacement.delay.ms": REPLACEMENT_DELAY_MS,
    "leader.imbalance.check.interval.seconds": LEADER_IMBALANCE_CHECK_S,
    "offsets.topic.num.partitions": 1,  # one coordinator: fewer processes on 2 cores
    "offsets.topic.replication.factor": REPLICATION_FACTOR,
    "group.share.record.lock.duration.ms": SHARE_LOCK_MS,
    # Its own reassignments and rotations (then waiting for their preferred leaders) are the
    # schedule; a balancer check evening them out meanwhile would undo what it waits for.
    "auto.balance.enable": False,
}
TOPIC_CONFIG = {"min.insync.replicas": str(MIN_INSYNC_REPLICAS)}

# ---------------------------------------------------------------------------- the faults

KILL_LEADER = "kill-leader-replica"  # SIGKILL of a partition's leader PartitionReplica
KILL_FOLLOWER = "kill-follower-replica"  # SIGKILL of one of its followers
KILL_BROKER = "kill-broker"  # SIGKILL of a ReplicaManager (Ray restarts it on its node)
KILL_CONTROLLER = "kill-controller"  # SIGKILL of the Controller (Ray restarts it)
PAUSE_LEADER = "pause-leader-replica"  # SIGSTOP past the session timeout, then SIGCONT
PAUSE_BROKER = "pause-broker"  # the same, of a ReplicaManager, past the bound of a late broker (fenced)
REPLACE_NODE = "replace-node"  # a broker's node removed; a new node takes the broker and its disk
LOSE_NODE = "lose-node"  # a broker's node removed for good: the Controller moves its replicas
ELECT_PREFERRED = "elect-preferred"  # Admin.elect_leaders() of every partition
AUTO_REBALANCE = "auto-rebalance"  # a replica order rotated; the automatic rebalance follows it
REASSIGN = "reassign"  # Admin.alter_partition_reassignments: one replica moved to another broker
EMPTY_DISK = "empty-disk"  # a broker's data directory emptied while its processes are dead
CRASH_ALL = "crash-all-lose-tail"  # kill -9 of every rayk process; one node loses its unflushed tails

DATA_LOSS = frozenset({EMPTY_DISK, CRASH_ALL, LOSE_NODE})  # a copy's acknowledged records go
DOWN = frozenset({KILL_LEADER, KILL_FOLLOWER, KILL_BROKER, PAUSE_LEADER, PAUSE_BROKER, REPLACE_NODE}) | DATA_LOSS
CONTROL = frozenset({KILL_CONTROLLER, ELECT_PREFERRED, AUTO_REBALANCE, REASSIGN})
KINDS = tuple(sorted(DOWN | CONTROL))
# How often each kind is drawn (relative): the cheap process faults most, the slow ones less.
WEIGHTS = {
    KILL_LEADER: 4, KILL_FOLLOWER: 3, KILL_BROKER: 3, KILL_CONTROLLER: 3, PAUSE_LEADER: 2, PAUSE_BROKER: 2,
    REPLACE_NODE: 2, LOSE_NODE: 1, ELECT_PREFERRED: 3, AUTO_REBALANCE: 2, REASSIGN: 3, EMPTY_DISK: 2, CRASH_ALL: 2,
}  # fmt: skip

HEALTHY, NONE = "healthy", "none"  # a fault's barrier: what it waits for before it is applied


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of a schedule. `partition` and `pick` name its target abstractly (the
    partition whose leader, follower or replica's broker it hits; which of several
    candidates); `gap_ms` is the pause after the fault before; `barrier` what it waits
    for first (HEALTHY or NONE)."""

    kind: str
    partition: int
    pick: int
    gap_ms: int
    barrier: str

    def __str__(self) -> str:
        return f"{self.kind}(p{self.partition}, pick {self.pick}, after {self.gap_ms} ms, barrier {self.barrier})"


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    faults: tuple[Fault, ...]
    max_faults: int = MAX_FAULTS  # what it was drawn with (part of what replays it)
    only: tuple[int, ...] = ()  # a reduced schedule: the numbers (from 1) of the drawn faults kept

    def __str__(self) -> str:
        kept = f" (faults {','.join(map(str, self.only))} only)" if self.only else ""
        return f"seed {self.seed}{kept}: " + "; ".join(str(f) for f in self.faults)

    def replay(self) -> str:
        """The command that runs this schedule again."""
        limit = "" if self.max_faults == MAX_FAULTS else f" --max-faults {self.max_faults}"
        kept = f" --only {','.join(map(str, self.only))}" if self.only else ""
        return f".venv/bin/python -m tests.faults.chaos --seed {self.seed} --count 1{limit}{kept}"

    def reduced(self, numbers: tuple[int, ...]) -> Schedule:
        """The schedule with only the faults numbered `numbers` (from 1): how a failing seed
        is cut down to the faults that make it fail. The kept faults keep their barriers."""
        assert not self.only and numbers and all(1 <= n <= len(self.faults) for n in numbers), numbers
        return Schedule(self.seed, tuple(self.faults[n - 1] for n in sorted(set(numbers))), self.max_faults,
                        tuple(sorted(set(numbers))))  # fmt: skip


def draw_schedule(seed: int, max_faults: int = MAX_FAULTS) -> Schedule:
    """The schedule `seed` stands for: MIN_FAULTS to `max_faults` faults, obeying the
    safety rule of the module docstring."""
    assert MIN_FAULTS <= max_faults <= MAX_FAULTS, max_faults
    rng = random.Random(f"nemesis-schedule-{seed}")
    faults = []
    nodes_lost = 0
    for _ in range(rng.randint(MIN_FAULTS, max_faults)):
        kinds = [k for k in KINDS if k != LOSE_NODE or nodes_lost < BROKERS - REPLICATION_FACTOR]
        kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        nodes_lost += kind == LOSE_NODE
        faults.append(
            Fault(
                kind=kind,
                partition=rng.randrange(PARTITIONS),
                pick=rng.randrange(REPLICATION_FACTOR),
                gap_ms=rng.randrange(0, MAX_GAP_MS + 1, 100),
                barrier=HEALTHY if kind in DOWN else NONE,
            )
        )
    schedule = Schedule(seed, tuple(faults), max_faults)
    check_rule(schedule)
    return schedule


def check_rule(schedule: Schedule) -> None:
    """Raises AssertionError if `schedule` breaks the safety rule."""
    assert MIN_FAULTS <= len(schedule.faults) <= MAX_FAULTS or schedule.only, f"{len(schedule.faults)} faults"
    for f in schedule.faults:
        assert f.kind in KINDS, f.kind
        assert f.kind not in DOWN or f.barrier == HEALTHY, f"{f}: takes a copy away without waiting for a full ISR"
        assert 0 <= f.partition < PARTITIONS and 0 <= f.pick < REPLICATION_FACTOR and 0 <= f.gap_ms <= MAX_GAP_MS, f
    lost = sum(f.kind == LOSE_NODE for f in schedule.faults)
    assert lost <= BROKERS - REPLICATION_FACTOR, f"{lost} nodes lost for good: no full ISR would be possible"


# ---------------------------------------------------------------------------- asking the cluster


def ask(call: Callable[[], Any], what: str, timeout_s: float = CALL_TIMEOUT_S) -> Any:
    """`call()`, retried while it raises (the Controller may be restarting, a leader moving)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except Exception as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: still failing after {timeout_s} s: {e!r}") from e
            time.sleep(0.5)


def present(value: Any, what: str) -> Any:
    """`value`, or LookupError if it is None (for `ask` to try again)."""
    if value is None:
        raise LookupError(f"no {what} yet")
    return value


def target_replicas(state: dict) -> list[int]:
    """A partition's replicas once its reassignment under way (if any) completes."""
    return [b for b in state["replicas"] if b not in state["removing_replicas"]]


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Like cluster_helpers.wait_until, but a predicate that raises counts as not yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except Exception:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


def topic_unhealthy(parts: list[dict], live: set[int]) -> list[str]:
    """Why a topic is not healthy: a partition not led, not with its full ISR, under
    reassignment, or with a replica on a broker that is not live (none: healthy)."""
    out = []
    for p in parts:
        name = f"{p['topic']}-{p['partition']}"
        if p["leader"] < 0 or p["high_watermark"] is None:
            out.append(f"{name} has no leader ready (leader {p['leader']})")
        elif sorted(p["isr"]) != sorted(p["replicas"]):
            out.append(f"{name} ISR {sorted(p['isr'])} of replicas {p['replicas']}")
        elif p["adding_replicas"] or p["removing_replicas"]:
            out.append(f"{name} is being reassigned (+{p['adding_replicas']} -{p['removing_replicas']})")
        elif not set(p["replicas"]) <= live:
            out.append(f"{name} has replicas {p['replicas']} on brokers not live ({sorted(live)} are)")
    return out


# ---------------------------------------------------------------------------- the workload


@dataclass
class GroupLedger:
    """What the consumer group processed and committed, and what an observer saw of its
    committed offsets: the evidence for the group's checks."""

    processed: dict[int, set[int]] = field(default_factory=lambda: {p: set() for p in range(PARTITIONS)})
    read: dict[tuple[int, int], bytes] = field(default_factory=dict)  # (partition, offset) -> value read
    contiguous: dict[int, int] = field(default_factory=lambda: {p: 0 for p in range(PARTITIONS)})
    committed_seen: dict[int, int] = field(default_factory=dict)  # the observer's last view
    violations: list[str] = field(default_factory=list)
    commits: int = 0
    commit_errors: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def processed_records(self, records: list[tuple[int, int, bytes]]) -> None:
        with self.lock:
            for partition, offset, value in records:
                self.processed[partition].add(offset)
                seen = self.read.setdefault((partition, offset), value)
                if seen != value:
                    self.violations.append(f"the group read {value!r} at {partition}/{offset}, earlier {seen!r}")
            for p, done in self.processed.items():
                while self.contiguous[p] in done:
                    self.contiguous[p] += 1

    def observed(self, committed: dict[int, int]) -> None:
        """The group's committed offsets as seen from outside, at one moment."""
        with self.lock:
            for p, offset in committed.items():
                before = self.committed_seen.get(p, -1)
                if offset < before:
                    self.violations.append(f"partition {p}: committed offset went back from {before} to {offset}")
                if offset > self.contiguous[p]:
                    self.violations.append(
                        f"partition {p}: committed offset {offset} skips records the group did not process "
                        f"(it processed every offset below {self.contiguous[p]} only)"
                    )
                self.committed_seen[p] = offset


class Member(threading.Thread):
    """One consumer of the group: polls, 'processes' (records into the ledger) and
    commits what it processed after each poll, without auto-commit."""

    def __init__(self, cluster: Any, ledger: GroupLedger, index: int) -> None:
        super().__init__(daemon=True, name=f"nemesis-member-{index}")
        self.cluster, self.ledger = cluster, ledger
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from rayk.errors import KafkaError

        try:
            consumer = self.cluster.consumer(
                TOPIC, group_id=GROUP, enable_auto_commit=False, auto_offset_reset="earliest",
                session_timeout_ms=SESSION_TIMEOUT_MS * 2, heartbeat_interval_ms=1_000, max_poll_records=2_000,
            )  # fmt: skip
        except BaseException as e:
            self.error = e
            return
        try:
            while not self.halt.is_set():
                batch = consumer.poll(timeout_ms=500)
                if not batch:
                    continue
                self.ledger.processed_records([(tp.partition, r.offset, r.value) for tp, rs in batch.items() for r in rs])
                try:
                    consumer.commit()
                    with self.ledger.lock:
                        self.ledger.commits += 1
                except KafkaError as e:  # a rebalance took the partitions, the coordinator moved
                    with self.ledger.lock:
                        self.ledger.commit_errors[e.name] += 1
        except BaseException as e:
            self.error = e
        finally:
            try:
                consumer.close(autocommit=False, timeout_ms=5_000)
            except Exception:
                pass  # the coordinator is away: the session times out instead


@dataclass
class ShareLedger:
    """What the share group's members accepted (by commits answered without an error) and
    read: the evidence for the share group's checks."""

    accepted: Counter = field(default_factory=Counter)  # (partition, offset) -> accepts answered
    read: dict[tuple[int, int], bytes] = field(default_factory=dict)
    commit_errors: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class ShareMember(threading.Thread):
    """One member of the share group: polls, accepts every record explicitly, commits, and
    counts what each commit confirmed."""

    def __init__(self, cluster: Any, ledger: ShareLedger, index: int) -> None:
        super().__init__(daemon=True, name=f"nemesis-share-member-{index}")
        self.cluster, self.ledger = cluster, ledger
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from rayk.errors import KafkaError

        try:
            consumer = self.cluster.share_consumer(TOPIC, group_id=SHARE_GROUP, acknowledgement_mode="explicit",
                                                   max_poll_records=500, request_timeout_ms=10_000)  # fmt: skip
        except BaseException as e:
            self.error = e
            return
        ledger = self.ledger
        try:
            while not self.halt.is_set():
                try:
                    records = consumer.poll(500)
                    for r in records:
                        consumer.acknowledge(r, "accept")
                    outcome = consumer.commit()
                except KafkaError as e:  # a leader or the coordinator moving: the next poll goes on
                    with ledger.lock:
                        ledger.commit_errors[e.name] += 1
                    time.sleep(0.5)
                    continue
                with ledger.lock:
                    for r in records:
                        seen = ledger.read.setdefault((r.partition, r.offset), r.value)
                        if seen != r.value:
                            ledger.violations.append(f"read {r.value!r} at {r.partition}/{r.offset}, earlier {seen!r}")
                        error = outcome.get((TOPIC, r.partition), "not sent")
                        if error is None:
                            ledger.accepted[(r.partition, r.offset)] += 1
                    for error in outcome.values():
                        if error is not None:
                            ledger.commit_errors[error.name] += 1
        except BaseException as e:
            self.error = e
        finally:
            try:
                consumer.close()
            except Exception:
                pass  # the coordinator is away: the session times out instead


class Observer(threading.Thread):
    """Reads the group's committed offsets about once a second (a consumer of the group
    that does not join it) and hands them to the ledger."""

    def __init__(self, cluster: Any, ledger: GroupLedger) -> None:
        super().__init__(daemon=True, name="nemesis-observer")
        self.cluster, self.ledger = cluster, ledger
        self.halt = threading.Event()
        self.consumer = cluster.consumer(group_id=GROUP, enable_auto_commit=False, default_api_timeout_ms=10_000)
        self._lock = threading.Lock()  # the check asks too, and a Consumer is not thread-safe

    def committed(self) -> dict[int, int]:
        from rayk.client.types import TopicPartition

        with self._lock:
            found = self.consumer.committed_offsets([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        return {tp.partition: om.offset for tp, om in found.items()}

    def run(self) -> None:
        while not self.halt.wait(1.0):
            try:
                self.ledger.observed(self.committed())
            except Exception:
                pass  # the coordinator is moving: look again in a second

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        if not self.consumer._closed:
            self.consumer.close(autocommit=False, timeout_ms=5_000)


class _LastLines(logging.Handler):
    """Keeps a logger's last `count` lines in memory, for a report."""

    def __init__(self, count: int) -> None:
        super().__init__(logging.DEBUG)
        self.lines: deque[str] = deque(maxlen=count)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.getMessage()}")


def _running_reads() -> list[str]:
    """Where each process running a stream's read task (a Ray worker titled
    "ray::ReadTopic", on any node: the netns cluster is one PID namespace) is now, by
    py-spy if it is installed."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            title = cmdline.read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:  # it ended meanwhile
            continue
        if "ReadTopic" not in title:
            continue
        pid = cmdline.parent.name
        line = f"{title} (pid {pid})"
        if os.path.exists(py_spy):  # with its native frames where py-spy can unwind them (a call into Ray's core)
            for native in (["--native"], []):
                dump = subprocess.run([py_spy, "dump", *native, "--pid", pid], capture_output=True, text=True, timeout=60)
                if dump.returncode == 0:
                    break
            frames = [f.strip()[:100] for f in dump.stdout.splitlines() if "(" in f and not f.strip().startswith("std::")]
            line += " at: " + " | ".join(frames)[:6000]
        lines.append(line)
    return lines or ["no read task running"]


class Pipeline(threading.Thread):
    """A rayk.data.stream_topic pipeline copying TOPIC into COPY_TOPIC with write_topic,
    started again from its committed progress whenever it fails, or when a batch has made
    no progress for BATCH_STALL_S (as a user's job would be by its supervisor). The stream
    runs in a thread of its own, so that a batch stuck where nothing of rayk's waits (a
    Ray task that Ray never runs, across a flapping link) can be left behind: a new stream
    replays the batch, and the one left behind is fenced at its next commit, if it ever
    makes one. It keeps the stream's last plans (positions and the ends its ListOffsets
    answered) for `diagnosis`, should it stop making progress."""

    def __init__(self, cluster: Any) -> None:
        super().__init__(daemon=True, name="nemesis-pipeline")
        self.cluster = cluster
        self.halt = threading.Event()
        self.batches = 0
        self.restarts: Counter = Counter()  # why the stream failed -> times
        self.read: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> value, as each batch read it
        self._attempt: _StreamAttempt | None = None  # the stream running now
        self._plans = _LastLines(PIPELINE_PLANS_KEPT)
        self._last_stream: Any = None  # the last stream started, kept for `diagnosis` after it ended

    def diagnosis(self) -> str:
        """What the stream saw last: its last plans, and what each leader replica it asks
        for the partitions' ends (its consumer's metadata cache) says of itself now."""
        lines = [f"the stream's last plans: {list(self._plans.lines) or 'none'}"]
        stream = self._last_stream
        cached = getattr(getattr(getattr(stream, "_batches", None), "_consumer", None), "_metadata", None)
        leaders = dict(getattr(cached, "_topics", {}).get(TOPIC, {})) if cached is not None else {}
        for partition, handle in sorted(leaders.items()):
            try:
                d = ray.get(handle.describe.remote(), timeout=10) if handle is not None else None
                seen = "none cached" if d is None else (
                    f"broker {d['broker_id']} {d['role']} in epoch {d['leader_epoch']}, hw {d['high_watermark']}")
            except Exception as e:  # gone: what the stream asked is what matters
                seen = f"unreachable ({type(e).__name__})"
            lines.append(f"partition {partition}'s cached leader: {seen}")
        attempt = self._attempt
        frame = sys._current_frames().get(attempt.ident) if attempt is not None and attempt.ident is not None else None
        if frame is not None:  # where its thread waits now
            lines.append("the stream's thread at: " + " < ".join(
                f"{f.name} ({Path(f.filename).name}:{f.lineno})" for f in reversed(traceback.extract_stack(frame)[-12:])))
        lines += _running_reads()
        try:  # a read task that never runs: is there a CPU for it anywhere?
            lines.append(f"resources available: {ray.available_resources()} of {ray.cluster_resources()}")
        except Exception as e:
            lines.append(f"resources: not read ({type(e).__name__})")
        return "; ".join(lines)

    def run(self) -> None:
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # a line per micro-batch otherwise
        planner = logging.getLogger("rayk.client.micro_batches")
        planner.setLevel(logging.DEBUG)
        planner.addHandler(self._plans)
        ray.data.DataContext.get_current().enable_progress_bars = False
        while not self.halt.is_set():
            attempt = self._attempt = _StreamAttempt(self)
            attempt.start()
            while attempt.is_alive() and not self.halt.is_set():
                attempt.join(timeout=1)
                started = attempt.batch_started_s
                if started is not None and time.monotonic() - started > BATCH_STALL_S:
                    self.restarts[f"a batch made no progress for {BATCH_STALL_S} s"] += 1
                    logger.warning("pipeline: a batch made no progress for %d s (%s); starting the stream again",
                                   BATCH_STALL_S, self.diagnosis())  # fmt: skip
                    attempt.abandon()
                    break
        attempt = self._attempt
        if attempt is not None and not attempt.abandoned:
            attempt.join(timeout=STOP_WAIT_S)  # a stream stops at its next step

    def stop(self) -> None:
        self.halt.set()
        attempt = self._attempt
        if attempt is not None and attempt.stream is not None:
            attempt.stream.stop()
        self.join(timeout=STOP_WAIT_S + 5)

    @property
    def stopped(self) -> bool:
        """Whether it ended, its stream too (one left behind stuck does not count)."""
        attempt = self._attempt
        return not self.is_alive() and (attempt is None or attempt.abandoned or not attempt.is_alive())


class _StreamAttempt(threading.Thread):
    """One stream of the Pipeline, from its start to its end or failure; `batch_started_s`
    says since when the batch it has out is being processed (None: none is)."""

    def __init__(self, pipeline: Pipeline) -> None:
        super().__init__(daemon=True, name="nemesis-pipeline-stream")
        self.pipeline = pipeline
        self.stream: Any = None
        self.batch_started_s: float | None = None
        self.abandoned = False

    def abandon(self) -> None:
        """Left behind stuck: its stream is told to stop, and what it does from now on
        (should it ever go on) is not counted."""
        self.abandoned = True
        if self.stream is not None:
            self.stream.stop()

    def run(self) -> None:
        import rayk.data

        pipeline = self.pipeline
        try:
            with rayk.data.stream_topic(
                TOPIC, STREAM_GROUP, cluster=pipeline.cluster, trigger_ms=2_000, starting_offsets="earliest",
                max_records_per_batch=20_000,
            ) as stream:  # fmt: skip
                self.stream = pipeline._last_stream = stream
                if pipeline.halt.is_set():
                    stream.stop()
                for ds in stream:
                    self.batch_started_s = time.monotonic()
                    table = ds.to_arrow_refs()
                    for t in ray.get(table):
                        for p, o, v in zip(t["partition"].to_pylist(), t["offset"].to_pylist(), t["value"].to_pylist()):
                            pipeline.read.setdefault((p, o), v)
                    rayk.data.write_topic(ray.data.from_arrow_refs(table).select_columns(["value"]), COPY_TOPIC,
                                          cluster=pipeline.cluster)  # fmt: skip
                    self.batch_started_s = None
                    if not self.abandoned:
                        pipeline.batches += 1
        except Exception as e:
            if not self.abandoned:
                pipeline.restarts[type(e).__name__] += 1
                logger.info("pipeline failed, starting it again: %r", e)
                time.sleep(1)


class Transactions(threading.Thread):
    """A transactional producer writing TXN_TOPIC: transaction n holds the records
    b"n:i", i < TXN_RECORDS, spread over the partitions; every TXN_ABORT_EVERY-th is aborted
    on purpose. A transaction that failed (a fault got in its way) is aborted if the
    producer can, else the producer is made again, whose init_transactions fences the old
    one and aborts what it left open; its outcome counts as unknown (the commit may have
    been decided before the failure), so the check wants all of its records or none."""

    def __init__(self, cluster: Any) -> None:
        super().__init__(daemon=True, name="nemesis-transactions")
        self.cluster = cluster
        self.halt = threading.Event()
        self.committed: list[int] = []
        self.aborted: list[int] = []
        self.unknown: list[int] = []
        self.failures: Counter = Counter()  # why a transaction failed -> times

    def run(self) -> None:
        producer = None
        n = 0
        while not self.halt.is_set():
            try:
                if producer is None:
                    producer = self.cluster.producer(transactional_id="nemesis-txn", max_block_ms=30_000,
                                                     transaction_timeout_ms=20_000)  # fmt: skip
                    producer.init_transactions()
                producer.begin_transaction()
                for i in range(TXN_RECORDS):
                    producer.send(TXN_TOPIC, b"%d:%d" % (n, i), partition=i % PARTITIONS)
                if n % TXN_ABORT_EVERY == 0:
                    producer.abort_transaction()
                    self.aborted.append(n)
                else:
                    producer.commit_transaction()
                    self.committed.append(n)
            except Exception as e:
                self.failures[type(e).__name__] += 1
                self.unknown.append(n)
                producer = self._abort_or_drop(producer)
            n += 1
            time.sleep(0.05)
        if producer is not None:
            producer.close()

    @staticmethod
    def _abort_or_drop(producer: Any) -> Any:
        if producer is None:
            return None
        try:
            producer.abort_transaction()
            return producer
        except Exception:
            try:
                producer.close(timeout_s=5)
            except Exception:
                pass
            return None  # the next one fences it

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=120)

    def check(self) -> list[str]:
        """What a read_committed reader of TXN_TOPIC sees, against the outcomes (see the
        class docstring); call after `stop`."""
        seen = Counter(int(v.split(b":")[0]) for v in read_committed_values(self.cluster, TXN_TOPIC, PARTITIONS))
        failures = []
        aborted = [n for n in self.aborted if seen[n]]
        if aborted:
            failures.append(f"read_committed saw records of {len(aborted)} aborted transactions, e.g. {aborted[:3]}")
        short = [(n, seen[n]) for n in self.committed if seen[n] != TXN_RECORDS]
        if short:
            failures.append(f"{len(short)} committed transactions are not read_committed whole and once, e.g. {short[:3]}")
        partial = [(n, seen[n]) for n in self.unknown if seen[n] not in (0, TXN_RECORDS)]
        if partial:
            failures.append(f"{len(partial)} transactions are read_committed in part, e.g. {partial[:3]}")
        return failures


def read_committed_values(cluster: Any, topic: str, partitions: int) -> list[bytes]:
    """Every value a read_committed consumer reads from the topic's start to its LSO, once
    no transaction is open on any partition (every LSO at its high watermark). A commit
    returns once the coordinator wrote its decision, and the markers follow (Kafka's
    EndTxn does the same), so a reader right after the last commit could see its
    records on the partitions whose marker landed and not yet on the others; and a
    transaction left open (none is, past the producer's transaction timeout) fails the
    wait."""
    from rayk.client.types import TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = cluster.consumer(isolation_level="read_committed", enable_auto_commit=False, default_api_timeout_ms=30_000)
    uncommitted = cluster.consumer(enable_auto_commit=False, default_api_timeout_ms=30_000)
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = wait_for(lambda: (lso := consumer.end_offsets(tps)) == uncommitted.end_offsets(tps) and lso,
                        CATCH_UP_BOUND_S, f"every transaction on {topic} to be complete (each LSO at its high watermark)")
        values: list[bytes] = []
        deadline = time.monotonic() + CATCH_UP_BOUND_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise AssertionError(f"read_committed did not reach the LSO of {topic} within {CATCH_UP_BOUND_S} s")
            values += [r.value for batch in consumer.poll(timeout_ms=500).values() for r in batch]
        return values
    finally:
        consumer.close(autocommit=False)
        uncommitted.close(autocommit=False)


def committed_of(cluster: Any, group: str, topic: str, partitions: int) -> dict[int, int]:
    from rayk.client.types import TopicPartition

    consumer = cluster.consumer(group_id=group, enable_auto_commit=False, default_api_timeout_ms=10_000)
    try:
        found = consumer.committed_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: om.offset for tp, om in found.items()}
    finally:
        consumer.close(autocommit=False, timeout_ms=5_000)


@dataclass(frozen=True)
class Report:
    """What one schedule's run found."""

    schedule: Schedule
    applied: tuple[str, ...]  # each fault as it was resolved and applied
    acknowledged: int
    records_checked: int  # records of the log compared with what was acknowledged and read
    failures: tuple[str, ...]
    seconds: float
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        out = [f"NEMESIS {self.schedule}", *(f"  applied: {a}" for a in self.applied)]
        out += [f"  note: {n}" for n in self.notes]
        out.append(
            f"  {'OK' if self.ok else 'FAILED'}: {self.acknowledged} acknowledged, {self.records_checked} records "
            f"checked, {self.seconds:.0f} s"
        )
        out += [f"  FAILURE: {f}" for f in self.failures]
        if not self.ok:
            out.append(f"  replay: {self.schedule.replay()}")
        return out


class Nemesis:
    """Runs one schedule against a rayk cluster it deploys on `ray_cluster` (a
    ray.cluster_utils.Cluster with BROKERS broker nodes), under the workload, and checks."""

    def __init__(self, ray_cluster: Any, data_dir: Path, schedule: Schedule, log: Callable[[str], None] = print) -> None:
        self.ray_cluster, self.data_dir, self.schedule, self.log = ray_cluster, Path(data_dir), schedule, log
        self.rng = random.Random(f"nemesis-targets-{schedule.seed}")
        self.gone: set[int] = set()  # brokers whose node was removed for good
        self.applied: list[str] = []
        self.notes: list[str] = []
        self.cluster: Any = None
        self.workload: Workload | None = None

    # ------------------------------------------------------------------ the run

    def run(self) -> Report:
        t0 = time.monotonic()
        failures: list[str] = []
        acknowledged = checked = 0
        self.cluster = c = self.start_cluster(f"nemesis-{self.schedule.seed}-{os.getpid()}-{int(t0)}")
        workload = None
        try:
            for topic, partitions in ((TOPIC, PARTITIONS), (COPY_TOPIC, 1), (TXN_TOPIC, PARTITIONS)):
                c.create_topic(topic, num_partitions=partitions, replication_factor=REPLICATION_FACTOR, config=TOPIC_CONFIG)
            self.workload = workload = Workload(c)
            workload.wait_started()
            for i, fault in enumerate(self.schedule.faults):
                time.sleep(fault.gap_ms / 1000)
                if fault.barrier == HEALTHY:
                    self.wait_healthy(f"before fault {i + 1} ({fault.kind})")
                applied = self.apply(fault)
                self.applied.append(f"{i + 1}. {fault.kind}: {applied}")
                self.log(f"nemesis seed {self.schedule.seed}: {self.applied[-1]}")
            healed_at = time.monotonic()
            self.wait_healthy("after the last fault")
            workload.wait_resumed(healed_at)
            acknowledged, checked, found = workload.check(self.live_brokers())
            failures += found
            self.notes += workload.notes
        except AssertionError as e:
            failures.append(str(e))
        except Exception as e:
            failures.append(f"{type(e).__name__}: {e}")
            self.log(traceback.format_exc())
        finally:
            if failures:
                self.notes.append(f"cluster at the failure: {self.describe_all()}")
            if workload is not None:
                workload.abandon()
            try:
                c.shutdown()
            except Exception:
                pass
        return Report(self.schedule, tuple(self.applied), acknowledged, checked, tuple(failures),
                      time.monotonic() - t0, tuple(self.notes))  # fmt: skip

    def start_cluster(self, namespace: str) -> Any:
        """The rayk cluster the schedule runs on (env_nemesis.py deploys it on a netns cluster)."""
        return start_rayk(self.data_dir, brokers=BROKERS, config=NEMESIS_CONFIG, namespace=namespace)

    def live_brokers(self) -> set[int]:
        return set(range(BROKERS)) - self.gone

    def describe_all(self) -> str:
        try:
            parts = [p for t in HEALTH_TOPICS for p in self.cluster.describe_topic(t)]
            brokers = self.cluster.brokers()
        except Exception as e:
            return f"(could not describe: {e!r})"
        return "; ".join(
            [f"broker {b['broker_id']} epoch {b['epoch']} fenced={b['fenced']} connected={b['connected']}" for b in brokers]
            + [f"{p['topic']}-{p['partition']} leader {p['leader']} epoch {p['leader_epoch']} replicas {p['replicas']} "
               f"isr {p['isr']} recovering {p['recovering']} +{p['adding_replicas']} -{p['removing_replicas']} "
               f"hw {p['high_watermark']} leo {p['log_end_offset']}" for p in parts]
        )  # fmt: skip

    def unhealthy(self) -> list[str]:
        live = self.live_brokers()
        brokers = {b["broker_id"]: b for b in self.cluster.brokers()}
        out = [f"broker {b} is not back" for b in sorted(live) if b not in brokers or brokers[b]["fenced"] or not brokers[b]["connected"]]
        for topic in HEALTH_TOPICS:
            out += topic_unhealthy(self.cluster.describe_topic(topic), live)
        return out

    def wait_healthy(self, when: str) -> None:
        last: list[str] = []

        def healed() -> bool:
            nonlocal last
            last = self.unhealthy()
            return not last

        try:
            wait_for(healed, HEAL_BOUND_S, "every partition led with its full ISR")
        except AssertionError:
            raise AssertionError(f"not healed within {HEAL_BOUND_S:.0f} s {when}: {'; '.join(last) or 'no answer'}") from None

    # ------------------------------------------------------------------ the faults

    def partition_state(self, partition: int, topic: str = TOPIC) -> dict:
        return ask(lambda: self.cluster.describe_topic(topic)[partition], f"describing {topic}-{partition}")

    def apply(self, fault: Fault) -> str:
        """Applies one fault to the live cluster; what it did, in words."""
        c, p = self.cluster, fault.partition
        state = self.partition_state(p)
        live_replicas = [b for b in state["replicas"] if b not in self.gone]
        broker = live_replicas[fault.pick % len(live_replicas)]
        if fault.kind == KILL_LEADER:
            handle = ask(lambda: c.leader(TOPIC, p), f"the leader of partition {p}")
            signal_actor(handle, signal.SIGKILL)
            return f"SIGKILL of partition {p}'s leader replica on broker {state['leader']} (epoch {state['leader_epoch']})"
        if fault.kind == KILL_FOLLOWER:
            followers = [b for b in state["replicas"] if b != state["leader"] and b in state["isr"]]
            followers = followers or [b for b in live_replicas if b != state["leader"]]
            target = followers[fault.pick % len(followers)]
            handle = ask(lambda: present(c.replica(TOPIC, p, target), "replica"), f"partition {p}'s replica on broker {target}")
            signal_actor(handle, signal.SIGKILL)
            return f"SIGKILL of partition {p}'s follower replica on broker {target}"
        if fault.kind == KILL_BROKER:
            signal_actor(ask(lambda: present(c.broker(broker), "broker"), f"broker {broker}"), signal.SIGKILL)
            return f"SIGKILL of broker {broker}'s ReplicaManager"
        if fault.kind == KILL_CONTROLLER:
            signal_actor(c.controller, signal.SIGKILL)
            return "SIGKILL of the Controller"
        if fault.kind in (PAUSE_LEADER, PAUSE_BROKER):
            if fault.kind == PAUSE_LEADER:
                handle, what = ask(lambda: c.leader(TOPIC, p), "a leader"), f"partition {p}'s leader replica on broker {state['leader']}"
            else:
                handle, what = ask(lambda: present(c.broker(broker), "broker"), f"broker {broker}"), f"broker {broker}'s ReplicaManager"
            pause_s = PAUSE_S if fault.kind == PAUSE_LEADER else PAUSE_BROKER_S
            pid = signal_actor(handle, signal.SIGSTOP)
            time.sleep(pause_s)
            signal_all([pid], signal.SIGCONT)
            return f"SIGSTOP of {what} for {pause_s:.0f} s, then SIGCONT"
        if fault.kind in (REPLACE_NODE, LOSE_NODE):
            node = broker_node(self.ray_cluster, c, broker)
            self.ray_cluster.remove_node(node)
            if fault.kind == LOSE_NODE:
                self.gone.add(broker)
                return f"node of broker {broker} removed for good"
            wait_for(lambda: next(b for b in c.brokers() if b["broker_id"] == broker)["fenced"] and c.broker(broker) is None,
                     SESSION_TIMEOUT_MS / 1000 + 30, f"broker {broker} fenced")  # fmt: skip
            replacement = self.ray_cluster.add_node(num_cpus=1, resources={BROKER_RESOURCE: 1})
            ask(lambda: c.restart_broker(broker, node_id=replacement.node_id), f"restarting broker {broker}", 120)
            return f"node of broker {broker} removed; broker {broker} started on a replacement node with its disk"
        if fault.kind == ELECT_PREFERRED:
            results = ask(lambda: c.admin().elect_leaders(), "Admin.elect_leaders")
            return "preferred elections: " + (", ".join(f"{tp.topic}-{tp.partition}: {e.name if e else 'elected'}"
                                                        for tp, e in sorted(results.items())) or "none needed")  # fmt: skip
        if fault.kind == AUTO_REBALANCE:
            return self.rotate_and_rebalance(p, state)
        if fault.kind == REASSIGN:
            return self.reassign(p, state, fault.pick)
        if fault.kind == EMPTY_DISK:
            node_id = broker_node(self.ray_cluster, c, broker).node_id
            pids = rayk_actor_pids_on_node(node_id)
            signal_all(pids, signal.SIGSTOP)  # nothing writes while the disk is swapped
            # Swapped in one step: a process the actor table did not show yet (a replica being
            # created) may be renaming a checkpoint in there, and rmtree would trip over it.
            old_disk = self.data_dir / f"broker-{broker}.replaced-{time.monotonic_ns()}"
            os.rename(self.data_dir / f"broker-{broker}", old_disk)
            signal_all(pids, signal.SIGKILL)
            shutil.rmtree(old_disk, ignore_errors=True)
            return f"broker {broker}'s data directory emptied under its {len(pids)} stopped processes, then SIGKILL"
        if fault.kind == CRASH_ALL:
            pids = live_rayk_actor_pids()
            signal_all(pids, signal.SIGSTOP)  # a power cut: every process stops at once
            cut = cut_unflushed_tails(self.data_dir / f"broker-{broker}", self.rng)
            signal_all(pids, signal.SIGKILL)
            return f"kill -9 of {len(pids)} rayk processes; broker {broker} lost unflushed tails: {cut}"
        raise AssertionError(f"unknown fault {fault.kind}")

    def rotate_and_rebalance(self, p: int, state: dict) -> str:
        """Rotates partition p's replica order (a reassignment that moves no data: only the
        preferred leader changes), then waits for the automatic leader rebalance to make
        the new preferred replica the leader."""
        replicas = target_replicas(state)
        target = replicas[1:] + replicas[:1]
        results = ask(lambda: self.cluster.admin().alter_partition_reassignments({(TOPIC, p): target}), "reassigning")
        error = next(iter(results.values()))
        if error is not None:
            return f"rotating partition {p} to {target} refused: {error.name} (no rebalance to wait for)"
        bound_s = 2 * LEADER_IMBALANCE_CHECK_S + HEAL_BOUND_S
        wait_for(lambda: self.partition_state(p)["leader"] == target[0], bound_s,
                 f"the automatic rebalance to give partition {p} to its new preferred leader {target[0]}")  # fmt: skip
        return f"partition {p} replicas {replicas} -> {target}; the automatic rebalance made {target[0]} its leader"

    def reassign(self, p: int, state: dict, pick: int) -> str:
        """Moves one replica of partition p to a live broker that holds none (KIP-455)."""
        replicas = target_replicas(state)
        spare = sorted(self.live_brokers() - set(replicas))
        target = list(replicas)
        if spare:
            target[pick % len(target)] = spare[self.rng.randrange(len(spare))]
        self.rng.shuffle(target)
        results = ask(lambda: self.cluster.admin().alter_partition_reassignments({(TOPIC, p): target}), "reassigning")
        error = next(iter(results.values()))
        return f"partition {p} reassigned {replicas} -> {target}: {error.name if error else 'started'}"


def cut_unflushed_tails(broker_dir: Path, rng: random.Random) -> dict[str, int]:
    """What a power cut does to a node's logs: each partition's active segment loses a
    random part of what lies past its recovery point (the part never fsynced), torn
    mid-batch as likely as not. Returns the bytes cut per partition directory."""
    recovery = OffsetCheckpointFile(broker_dir / OffsetCheckpointFile.RECOVERY_POINT).read()
    cut = {}
    for (topic, partition), point in sorted(recovery.items()):
        directory = broker_dir / partition_dir_name(topic, partition)
        segments = sorted(directory.glob("*.log")) if directory.is_dir() else []
        if not segments:
            continue
        segment = segments[-1]
        flushed = flushed_bytes(segment, int(segment.stem), point)
        size = segment.stat().st_size
        if size <= flushed:
            continue
        keep = rng.randint(flushed, size - 1)
        os.truncate(segment, keep)
        cut[directory.name] = size - keep
    return cut


def flushed_bytes(segment: Path, base_offset: int, recovery_point: int) -> int:
    """The length of the segment's prefix that lies below `recovery_point` (on disk for sure)."""
    if recovery_point <= base_offset:
        return 0
    data = segment.read_bytes()
    position = 0
    while position + 27 <= len(data):
        batch_base = int.from_bytes(data[position : position + 8], "big")
        length = int.from_bytes(data[position + 8 : position + 12], "big")
        last = batch_base + int.from_bytes(data[position + 23 : position + 27], "big")
        if last >= recovery_point:
            return position
        position += 12 + length
    return min(position, len(data))


class Workload:
    """The producer, the consumer group (and its observer) and the pipeline, together."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.traffic = Traffic(cluster, rate_per_s=SEND_RATE_PER_S)
        self.ledger = GroupLedger()
        self.members = [Member(cluster, self.ledger, i) for i in range(GROUP_MEMBERS)]
        for m in self.members:
            m.start()
        self.observer = Observer(cluster, self.ledger)
        self.observer.start()
        self.pipeline = Pipeline(cluster)
        self.pipeline.start()
        self.transactions = Transactions(cluster)
        self.transactions.start()
        cluster.admin().alter_share_group_config(SHARE_GROUP, {"share.auto.offset.reset": "earliest"})
        self.share_ledger = ShareLedger()
        self.share_members = [ShareMember(cluster, self.share_ledger, i) for i in range(SHARE_MEMBERS)]
        for m in self.share_members:
            m.start()
        self.notes: list[str] = []

    def wait_started(self) -> None:
        wait_for(lambda: self.traffic.acked_count() >= 1_000 and all(self.ledger.processed.values())
                 and len(self.transactions.committed) >= 2, 120, "the workload to produce and consume")  # fmt: skip

    def wait_resumed(self, t0: float) -> None:
        """Writes go on on every partition once the cluster healed (the harness's bound)."""
        self.traffic.wait_resumed(t0)

    def abandon(self) -> None:
        """Stops everything at once (a failed run): every thread is joined and every client
        closed, so that none calls into Ray after the cluster is gone."""
        try:
            self.traffic.abandon()
        except Exception:
            pass  # records in flight: abandoned
        for m in self.members + self.share_members:
            m.halt.set()
        self.pipeline.halt.set()
        self.transactions.halt.set()
        for m in self.members + self.share_members:
            m.join(timeout=30)
        self.transactions.join(timeout=60)
        try:
            self.observer.stop()
        except Exception:
            pass
        self.pipeline.stop()

    def check(self, live: set[int]) -> tuple[int, int, list[str]]:
        """Stops the traffic, lets the group and the pipeline catch up, then checks; returns
        (acknowledged, records checked, failures)."""
        failures: list[str] = []
        c, traffic, ledger = self.cluster, self.traffic, self.ledger
        traffic.stop()
        # A leader may move while it is read (the automatic rebalance runs every few seconds,
        # and a new leader answers NOT_LEADER_OR_FOLLOWER until its push arrives): read again.
        stored = {p: ask(lambda p=p: read_partition(c, p), f"reading partition {p}") for p in range(PARTITIONS)}
        ends = {p: max(s, default=-1) + 1 for p, s in stored.items()}
        lost, duplicated = lost_and_duplicated(traffic, stored)
        if lost:
            failures.append(f"{len(lost)} acknowledged records are not at their offsets, e.g. {lost[:3]}")
        if duplicated:
            failures.append(f"{len(duplicated)} records are stored twice, e.g. {duplicated[:3]}")
        holes = {p: sorted(set(range(ends[p])) - set(s))[:5] for p, s in stored.items() if len(s) != ends[p]}
        if holes:
            failures.append(f"offsets missing below the end of the log: {holes}")
        self.notes.append(f"unacknowledged sends: {dict(traffic.failed) or 'none'}")
        if traffic.failed.get("UNKNOWN_SERVER_ERROR"):  # an unexpected exception in a replica, not a fault's effect
            failures.append(f"{traffic.failed['UNKNOWN_SERVER_ERROR']} sends failed with UNKNOWN_SERVER_ERROR")

        # The group reaches the end of every partition, then its offsets are compared.
        try:
            wait_for(lambda: all(ledger.contiguous[p] >= ends[p] for p in range(PARTITIONS))
                     and self.observer.committed() == ends, CATCH_UP_BOUND_S, "the group to commit the end of every partition")  # fmt: skip
        except AssertionError as e:
            failures.append(f"{e}: processed up to {dict(ledger.contiguous)}, committed {ledger.committed_seen}, ends {ends}")
        ledger.observed(ask(self.observer.committed, "the group's committed offsets"))
        for m in self.members:
            m.halt.set()
        for m in self.members:
            m.join(timeout=30)
            if m.error is not None:
                failures.append(f"{m.name} failed: {m.error!r}")
        self.observer.stop()
        wrong_reads = [(where, v, stored[where[0]].get(where[1])) for where, v in ledger.read.items() if stored[where[0]].get(where[1]) != v]
        if wrong_reads:
            failures.append(f"the group read {len(wrong_reads)} records not stored where it read them, e.g. {wrong_reads[:3]}")
        failures += [f"group: {v}" for v in ledger.violations[:10]]
        self.notes.append(f"group: {ledger.commits} commits, refused {dict(ledger.commit_errors) or 'none'}")

        # The pipeline reaches the end too; its copy holds every record.
        try:
            wait_for(lambda: committed_of(c, STREAM_GROUP, TOPIC, PARTITIONS) == ends, CATCH_UP_BOUND_S,
                     "the pipeline to commit the end of every partition")  # fmt: skip
        except AssertionError as e:
            failures.append(f"{e} ({self.pipeline.diagnosis()})")
        self.pipeline.stop()
        if not self.pipeline.stopped:
            failures.append("the pipeline did not stop within 120 s")
        copy = ask(lambda: read_partition(c, 0, COPY_TOPIC), "reading the copy")
        copied = Counter(copy.values())
        source = Counter(v for s in stored.values() for v in s.values())
        missing = [v for v in source if v not in copied]
        if missing:
            failures.append(f"the copy lacks {len(missing)} records, e.g. {sorted(missing)[:3]}")
        foreign = [v for v in copied if v not in source]
        if foreign:
            failures.append(f"the copy holds {len(foreign)} records the topic does not, e.g. {foreign[:3]}")
        twice = sum(n - 1 for n in copied.values() if n > 1)
        if twice and not self.pipeline.restarts:
            failures.append(f"the copy holds {twice} records twice though the pipeline never restarted")
        wrong_stream = [(w, v) for w, v in self.pipeline.read.items() if stored[w[0]].get(w[1]) != v]
        if wrong_stream:
            failures.append(f"the pipeline read {len(wrong_stream)} records not stored where it read them, e.g. {wrong_stream[:3]}")
        self.notes.append(
            f"pipeline: {self.pipeline.batches} batches, restarts {dict(self.pipeline.restarts) or 'none'}, "
            f"{twice} records copied twice"
        )
        # The share group settles every record, and accepts none twice.
        failures += self.check_share_group(stored, ends)
        # The transactions: what read_committed readers see is what the producer decided.
        self.transactions.stop()
        if self.transactions.is_alive():
            failures.append("the transactional producer did not stop within 120 s")
        else:
            try:
                failures += self.transactions.check()
            except AssertionError as e:
                failures.append(str(e))
        t = self.transactions
        self.notes.append(f"transactions: {len(t.committed)} committed, {len(t.aborted)} aborted, {len(t.unknown)} "
                          f"unknown ({dict(t.failures) or 'no failures'})")  # fmt: skip
        checked = sum(len(s) for s in stored.values()) + len(copy)
        return len(traffic.acked), checked, failures

    def check_share_group(self, stored: dict[int, dict[int, bytes]], ends: dict[int, int]) -> list[str]:
        """Every record is accepted exactly once by the share group, unless it was archived
        (its deliveries spent by lost acknowledgements or expired locks): the group's start
        offset reaches the end of every partition, no record's acceptance was confirmed
        twice, and what the members read is what is stored there."""
        failures: list[str] = []
        admin, ledger = self.cluster.admin(), self.share_ledger

        def settled() -> bool:
            offsets = admin.list_share_group_offsets(SHARE_GROUP)
            return all(offsets.get((TOPIC, p), 0) >= end for p, end in ends.items())

        try:
            wait_for(settled, CATCH_UP_BOUND_S, "the share group to settle the end of every partition")
        except AssertionError as e:
            failures.append(f"{e}: {ask(lambda: admin.list_share_group_offsets(SHARE_GROUP), 'share offsets')}, ends {ends}")
        for m in self.share_members:
            m.halt.set()
        for m in self.share_members:
            m.join(timeout=30)
            if m.error is not None:
                failures.append(f"{m.name} failed: {m.error!r}")
        with ledger.lock:
            twice = sorted(where for where, n in ledger.accepted.items() if n > 1)
            wrong = [(w, v) for w, v in ledger.read.items() if stored[w[0]].get(w[1]) != v]
            violations = list(ledger.violations)
        if twice:
            failures.append(f"the share group accepted {len(twice)} records twice, e.g. {twice[:3]}")
        if wrong:
            failures.append(f"the share group read {len(wrong)} records not stored where it read them, e.g. {wrong[:3]}")
        failures += [f"share group: {v}" for v in violations[:10]]
        records = sum(len(s) for s in stored.values())
        self.notes.append(f"share group: {len(ledger.accepted)} of {records} records accepted (the rest archived or "
                          f"their acceptance unconfirmed), errors {dict(ledger.commit_errors) or 'none'}")  # fmt: skip
        return failures
