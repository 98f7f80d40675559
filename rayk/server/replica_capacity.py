"""How many partition replicas a broker may hold (`max.replicas.per.broker`).

Every replica is a Ray actor process of its own, so a broker's replicas cost its node two
things even when idle, each measured per replica process:
- memory: 51 MiB of node memory each, measured on a node holding 400 of them
  (benchmarks/replication_bench.py --parts capacity). A node past its memory has its
  processes killed by Ray's memory monitor;
- CPU: ~0.8-0.9% of a core each when idle, leaders and followers at RF 3 together, of which
  ~0.7% is a bare Ray actor's own (benchmarks/capacity_bench.py). Counted as 1%. A node
  whose idle replicas take its cores has none left for heartbeats, elections and traffic:
  on a 2-core machine 3 brokers stayed healthy at 60 replicas (0.6 cores idle) and
  collapsed between 60 and 120 before overload was handled (issue 67), and the 120 now
  ride out busy-loop tasks on every core slowly, without fencing (tests/faults/
  test_overload.py).
A node's capacity is the smaller of what its memory and its cores hold: REPLICA_MEMORY_SHARE
of its memory (the rest is Ray's own processes, the page cache and the clients') over the
memory per replica, and REPLICA_CPU_SHARE of its cores over the idle CPU per replica. The
CPU share is 30%: the figure where 3 brokers were last healthy on 2 cores, leaving 70% of
the cores to Ray's own processes (raylet, GCS, agents: ~0.1 core here), the brokers, the
listeners and the Controller (~1-1.5% of a core each), and the traffic the replicas are
there for. Brokers on one node share its capacity evenly.

CreateTopics and CreatePartitions that would put more replicas on a broker than its cap fail
with POLICY_VIOLATION, naming the limit and what bounds it, and nothing is created.
`replicas_over` is the pure check: per broker, how many replicas past its cap a placement
would be (what a caller that can add nodes, the autoscaler, needs to know), and
`check_replica_caps` turns that into the refusal. `max.replicas.per.broker` (> 0) overrides
the derived cap.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rayk.errors import PolicyViolationError

REPLICA_NODE_MEMORY_BYTES = 51 * 2**20  # node memory per replica process, measured
REPLICA_MEMORY_SHARE = 0.8  # of a node's memory, for its brokers' replicas
REPLICA_IDLE_CPU_CORES = 0.01  # CPU of an idle replica process, in cores, measured (0.8-0.9%, rounded up)
REPLICA_CPU_SHARE = 0.3  # of a node's cores, for its brokers' idle replicas


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """What one node holds: replicas by its memory and by its cores (0 cores: not reported,
    so memory alone bounds it), and which of the two binds."""

    by_memory: int
    by_cpu: int | None

    @property
    def replicas(self) -> int:
        return self.by_memory if self.by_cpu is None else min(self.by_memory, self.by_cpu)

    @property
    def bound(self) -> str:
        return "node CPU" if self.by_cpu is not None and self.by_cpu < self.by_memory else "node memory"


def node_capacity(node_memory_bytes: int, node_cpus: float = 0) -> NodeCapacity:
    """The replicas a node of `node_memory_bytes` and `node_cpus` cores holds."""
    assert node_memory_bytes > 0 and node_cpus >= 0, (node_memory_bytes, node_cpus)
    by_memory = int(node_memory_bytes * REPLICA_MEMORY_SHARE) // REPLICA_NODE_MEMORY_BYTES
    # A tiny rounding margin: 2 cores x 0.3 / 0.01 is 59.999... in floating point.
    by_cpu = math.floor(node_cpus * REPLICA_CPU_SHARE / REPLICA_IDLE_CPU_CORES + 1e-9) if node_cpus > 0 else None
    return NodeCapacity(by_memory, by_cpu)


def derived_cap(node_memory_bytes: int, brokers_on_node: int, node_cpus: float = 0) -> int:
    """A broker's share of what its node holds (at least one replica)."""
    return max(node_capacity(node_memory_bytes, node_cpus).replicas // max(brokers_on_node, 1), 1)


def replica_caps(
    configured_cap: int, node_memory_bytes: Mapping[int, int], node_of: Mapping[int, str],
    node_cpus: Mapping[int, float] | None = None,
) -> dict[int, int]:
    """Per broker (of `node_of`) its cap: `configured_cap` when > 0, else derived from its
    node's memory and cores as it registered them (a broker that reported no memory has no
    derived cap; one that reported no cores is capped by memory alone)."""
    if configured_cap > 0:
        return {b: configured_cap for b in node_of}
    cpus = node_cpus or {}
    per_node = Counter(node_of.values())
    return {b: derived_cap(node_memory_bytes[b], per_node[node], cpus.get(b, 0)) for b, node in node_of.items()
            if node_memory_bytes.get(b, 0) > 0}


def replicas_over(held: Counter[int], adding: Iterable[int], caps: Mapping[int, int]) -> dict[int, int]:
    """Per broker of `caps` that `adding` (one broker id per new replica) puts past its cap,
    given the replicas it `held`: how many replicas past it. A broker already past its cap
    (the cap was lowered, or set) that gains nothing is not counted."""
    after = held + Counter(adding)
    return {b: after[b] - cap for b, cap in sorted(caps.items()) if after[b] > cap and after[b] > held[b]}


def check_replica_caps(
    held: Counter[int], adding: Iterable[int], caps: Mapping[int, int], configured: bool,
    bounds: Mapping[int, NodeCapacity] | None = None,
) -> None:
    """POLICY_VIOLATION if `adding` puts a broker of `caps` past its cap (`replicas_over`),
    naming each such broker, its cap, and what the cap comes from (`bounds`: each broker's
    node capacity, when derived)."""
    adding = list(adding)
    over = replicas_over(held, adding, caps)
    if not over:
        return
    after = held + Counter(adding)
    if configured:
        how = "max.replicas.per.broker"
    else:
        why = sorted({(bounds or {})[b].bound for b in over if b in (bounds or {})}) or ["node memory"]
        how = (
            f"max.replicas.per.broker, derived from {' and '.join(why)} ({REPLICA_NODE_MEMORY_BYTES >> 20} MiB and "
            f"{REPLICA_IDLE_CPU_CORES:.0%} of a core per replica process; {REPLICA_MEMORY_SHARE:.0%} of a node's memory "
            f"and {REPLICA_CPU_SHARE:.0%} of its cores, shared by its brokers); set it to override"
        )
    details = ", ".join(f"broker {b} would hold {after[b]} (cap {caps[b]}, {n} over)" for b, n in over.items())
    raise PolicyViolationError(f"too many partition replicas: {details}; the limit is {how}")
