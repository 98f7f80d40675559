"""The environment nemesis's schedules (issue 68, item 5): a seeded draw of faults of the
network, the disks and the clocks, mixed with the process faults that work on the
multi-host cluster of network namespaces (netns_cluster.py), and the safety rule they
keep. Pure: no Ray needed, so a unit test pins them (tests/faults/test_env_schedule.py);
env_nemesis.py runs them.

A seed draws an `EnvSchedule` of MIN_ENV_FAULTS to MAX_ENV_FAULTS `EnvFault`s
(`draw_env_schedule`). As in nemesis.py, a fault names its target abstractly (partition
p's leader, the broker holding its `pick`-th replica); unlike a process fault, each
environment fault lasts `duration_ms` and is then healed (the link back, the disk with
room or working, the clock back to the real time) before the next fault's gap starts.
These schedules are drawn with a generator of their own: nemesis.py's process-fault
schedules are what they were, seed for seed.

The netns cluster has 3 broker nodes for RF=3 (min.insync.replicas=2 on every topic), so
there is no spare broker: nothing removes a node for good or moves a replica to another
broker here (nemesis.py's node and disk-swap faults need ray.cluster_utils.Cluster and
stay there).

The safety rule (nemesis.py's, for these faults): an acks=all record is on at least 2
copies, so it survives one copy away. Hence
- every fault that takes a copy away waits for the cluster `healthy` (nemesis.HEALTHY):
  the process DOWN faults, and every network and disk fault (a cut or isolated broker is
  fenced, a one-way or flapping link and added latency can drop a follower from the ISR,
  a full or failing disk takes the broker's directory offline); and since each is healed
  before the next fault is applied, at most one copy of a partition is away or behind at
  a time;
- a clock step takes no copy away (Kafka's rule, kept by rayk: timeouts and ISR lag are
  measured on the monotonic clock; a wall-clock step moves neither), nor do the CONTROL
  faults (the Controller killed, a preferred election): they need no barrier and may land
  while the previous fault's copy is still catching up;
- a cut lasts less than RAY_DEAD_MIN_MS, the earliest Ray's GCS declares a node it cannot
  reach dead (netns_cluster.HEALTH_CHECK_FAILURES health checks): the cut broker is fenced
  by rayk (after LATE_FENCE_SESSIONS session timeouts) but keeps its processes and
  rejoins by itself, which is what these schedules test (a node declared dead is
  test_network_faults.node_declared_dead's).
`check_env_rule` states the same over a drawn schedule.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tests.faults import nemesis as nm
from tests.faults.harness import PARTITIONS
from tests.faults.netns_cluster import HEALTH_CHECK_FAILURES, RAY_ENV

ENV_BROKERS = 3  # the netns cluster's broker nodes: one per replica, no spare
MIN_ENV_FAULTS, MAX_ENV_FAULTS = 3, 5  # each lasts up to 45 s: a seed runs in ~5 minutes
RAY_DEAD_MIN_MS = HEALTH_CHECK_FAILURES * int(RAY_ENV["RAY_health_check_period_ms"])

# ---------------------------------------------------------------------------- the faults

# Partition p's leader's node cut from the head and its followers' nodes; the client still reaches it.
CUT_LEADER = "cut-leader"
ISOLATE_BROKER = "isolate-broker"  # a broker's node cut from every node, the head and the client included
ONE_WAY = "one-way-cut"  # the leader's node receives from the head and the other brokers but sends them nothing
# The leader's link to the head and the other brokers down FLAP_DOWN_S, up FLAP_UP_S, for the duration.
FLAP_LINK = "flap-link"
SLOW_LINK = "slow-link"  # SLOW_LINK_MS more each way between the leader's node and a follower's
DISK_FULL = "disk-full"  # a broker's disk shrunk to what it holds: every write that needs a page fails (ENOSPC)
DISK_FAILING = "disk-failing"  # netns_cluster.FAILING_DISK_NODE's disk fails the ops named by `variant` with EIO
CLOCK_STEP = "clock-step"  # a broker node's wall clock stepped by `variant` (fake_clock.py), then back

FLAP_DOWN_S, FLAP_UP_S = 5.0, 2.0  # each outage shorter than a session timeout
SLOW_LINK_MS = 200
CUTS = frozenset({CUT_LEADER, ISOLATE_BROKER, ONE_WAY, FLAP_LINK})
ENV_DOWN = CUTS | {SLOW_LINK, DISK_FULL, DISK_FAILING}  # may take a copy away: wait for HEALTHY
ENV_CONTROL = frozenset({CLOCK_STEP})  # takes no copy away
PROCESS_KINDS = frozenset({nm.KILL_LEADER, nm.KILL_FOLLOWER, nm.KILL_BROKER, nm.KILL_CONTROLLER, nm.ELECT_PREFERRED})
COPY_AWAY = ENV_DOWN | (PROCESS_KINDS & nm.DOWN)
ENV_KINDS = tuple(sorted(ENV_DOWN | ENV_CONTROL | PROCESS_KINDS))
# How often each kind is drawn (relative): the environment's faults are the point, the
# process faults keep a failover racing some of them.
ENV_WEIGHTS = {
    CUT_LEADER: 3, ISOLATE_BROKER: 2, ONE_WAY: 2, FLAP_LINK: 2, SLOW_LINK: 2, DISK_FULL: 2, DISK_FAILING: 2,
    CLOCK_STEP: 2, nm.KILL_LEADER: 1, nm.KILL_FOLLOWER: 1, nm.KILL_BROKER: 1, nm.KILL_CONTROLLER: 1,
    nm.ELECT_PREFERRED: 1,
}  # fmt: skip
# Each kind's duration (ms, drawn in whole seconds): a cut from shorter than a session
# timeout (nothing fenced, the ISR may shrink) to past LATE_FENCE_SESSIONS session timeouts
# (32 s: fenced, its leaderships elsewhere), always short of RAY_DEAD_MIN_MS.
DURATIONS_MS = {
    CUT_LEADER: (5_000, 45_000), ISOLATE_BROKER: (5_000, 45_000), ONE_WAY: (5_000, 45_000),
    FLAP_LINK: (14_000, 35_000), SLOW_LINK: (10_000, 30_000), DISK_FULL: (10_000, 30_000),
    DISK_FAILING: (10_000, 30_000), CLOCK_STEP: (10_000, 30_000),
}  # fmt: skip
VARIANTS = {
    DISK_FAILING: ("read,write,fsync", "write", "fsync", "read"),  # the ops failing_fs.py fails
    CLOCK_STEP: ("+1h", "-1h"),  # fake_clock.step's offsets: an hour forward or back
}


@dataclass(frozen=True, slots=True)
class EnvFault:
    """One fault of an environment schedule: nemesis.Fault's fields (what it hits, the
    pause before it, its barrier) and how long it lasts before it is healed, and its
    variant (the disk ops failing, the clock's offset; "" for the other kinds)."""

    kind: str
    partition: int
    pick: int
    gap_ms: int
    barrier: str
    duration_ms: int = 0
    variant: str = ""

    def __str__(self) -> str:
        lasting = f", {self.duration_ms // 1000} s" if self.duration_ms else ""
        variant = f" {self.variant}" if self.variant else ""
        return f"{self.kind}{variant}(p{self.partition}, pick {self.pick}{lasting}, after {self.gap_ms} ms, barrier {self.barrier})"


@dataclass(frozen=True, slots=True)
class EnvSchedule:
    seed: int
    faults: tuple[EnvFault, ...]
    max_faults: int = MAX_ENV_FAULTS
    only: tuple[int, ...] = ()  # a reduced schedule: the numbers (from 1) of the drawn faults kept

    def __str__(self) -> str:
        kept = f" (faults {','.join(map(str, self.only))} only)" if self.only else ""
        return f"environment seed {self.seed}{kept}: " + "; ".join(str(f) for f in self.faults)

    def replay(self) -> str:
        """The command that runs this schedule again (on a netns cluster of its own)."""
        limit = "" if self.max_faults == MAX_ENV_FAULTS else f" --max-faults {self.max_faults}"
        kept = f" --only {','.join(map(str, self.only))}" if self.only else ""
        return f".venv/bin/python -m tests.faults.env_nemesis --seed {self.seed} --count 1{limit}{kept}"

    def reduced(self, numbers: tuple[int, ...]) -> EnvSchedule:
        """The schedule with only the faults numbered `numbers` (from 1), barriers kept."""
        assert not self.only and numbers and all(1 <= n <= len(self.faults) for n in numbers), numbers
        kept = tuple(sorted(set(numbers)))
        return EnvSchedule(self.seed, tuple(self.faults[n - 1] for n in kept), self.max_faults, kept)


def draw_env_fault(rng: random.Random) -> EnvFault:
    kind = rng.choices(ENV_KINDS, weights=[ENV_WEIGHTS[k] for k in ENV_KINDS])[0]
    low_ms, high_ms = DURATIONS_MS.get(kind, (0, 0))
    return EnvFault(
        kind=kind,
        partition=rng.randrange(PARTITIONS),
        pick=rng.randrange(nm.REPLICATION_FACTOR),
        gap_ms=rng.randrange(0, nm.MAX_GAP_MS + 1, 100),
        barrier=nm.HEALTHY if kind in COPY_AWAY else nm.NONE,
        duration_ms=rng.randrange(low_ms, high_ms + 1, 1_000) if high_ms else 0,
        variant=rng.choice(VARIANTS[kind]) if kind in VARIANTS else "",
    )


def draw_env_schedule(seed: int, max_faults: int = MAX_ENV_FAULTS) -> EnvSchedule:
    """The environment schedule `seed` stands for: MIN_ENV_FAULTS to `max_faults` faults,
    obeying the safety rule of the module docstring."""
    assert MIN_ENV_FAULTS <= max_faults <= MAX_ENV_FAULTS, max_faults
    rng = random.Random(f"env-nemesis-schedule-{seed}")
    count = rng.randint(MIN_ENV_FAULTS, max_faults)
    schedule = EnvSchedule(seed, tuple(draw_env_fault(rng) for _ in range(count)), max_faults)
    check_env_rule(schedule)
    return schedule


def check_env_rule(schedule: EnvSchedule) -> None:
    """Raises AssertionError if `schedule` breaks the safety rule of the module docstring."""
    count = len(schedule.faults)
    assert MIN_ENV_FAULTS <= count <= MAX_ENV_FAULTS or schedule.only, f"{count} faults"
    for f in schedule.faults:
        assert f.kind in ENV_KINDS, f"{f}: not a fault of the netns cluster"
        assert f.kind not in COPY_AWAY or f.barrier == nm.HEALTHY, f"{f}: takes a copy away without waiting for a full ISR"
        assert 0 <= f.partition < PARTITIONS and 0 <= f.pick < nm.REPLICATION_FACTOR, f
        assert 0 <= f.gap_ms <= nm.MAX_GAP_MS, f
        low_ms, high_ms = DURATIONS_MS.get(f.kind, (0, 0))
        assert low_ms <= f.duration_ms <= high_ms, f"{f}: lasts {f.duration_ms} ms, not in [{low_ms}, {high_ms}]"
        assert f.kind not in CUTS or f.duration_ms < RAY_DEAD_MIN_MS, f"{f}: Ray may declare the node dead"
        assert f.variant in VARIANTS.get(f.kind, ("",)), f"{f}: no such variant"
