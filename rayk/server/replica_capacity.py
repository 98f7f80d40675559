"""How many partition replicas a broker may hold (`max.replicas.per.broker`).

Every replica is a Ray actor process of its own, so a broker's replicas cost its node's
memory: 51 MiB each, measured on a node holding 400 of them
(benchmarks/replication_bench.py --parts capacity). A node past its memory has its
processes killed by Ray's memory monitor, so topics are refused before that:
CreateTopics and CreatePartitions that would put more replicas on a broker than its cap
fail with POLICY_VIOLATION, naming the limit, and nothing is created.

The cap is `max.replicas.per.broker` when set (> 0); otherwise REPLICA_MEMORY_SHARE of the
broker's node memory over the per-replica footprint, shared by the brokers on that node
(the rest is Ray's own processes, the page cache and the clients').
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from rayk.errors import PolicyViolationError

REPLICA_NODE_MEMORY_BYTES = 51 * 2**20  # node memory per replica process, measured
REPLICA_MEMORY_SHARE = 0.8  # of a node's memory, for its brokers' replicas


def derived_cap(node_memory_bytes: int, brokers_on_node: int) -> int:
    """A broker's share of what its node's memory holds."""
    node_cap = int(node_memory_bytes * REPLICA_MEMORY_SHARE) // REPLICA_NODE_MEMORY_BYTES
    return max(node_cap // max(brokers_on_node, 1), 1)


def replica_caps(configured_cap: int, node_memory_bytes: Mapping[int, int], node_of: Mapping[int, str]) -> dict[int, int]:
    """Per broker (of `node_of`) its cap: `configured_cap` when > 0, else derived from its
    node's memory (a broker that reported none has no derived cap)."""
    if configured_cap > 0:
        return {b: configured_cap for b in node_of}
    per_node = Counter(node_of.values())
    return {b: derived_cap(node_memory_bytes[b], per_node[node]) for b, node in node_of.items()
            if node_memory_bytes.get(b, 0) > 0}


def check_replica_caps(held: Counter[int], adding: Iterable[int], caps: Mapping[int, int], configured: bool) -> None:
    """POLICY_VIOLATION if `adding` (one broker id per new replica) puts a broker of `caps`
    past its cap, given the replicas it `held`."""
    after = held + Counter(adding)
    over = sorted(b for b, cap in caps.items() if after[b] > cap and after[b] > held[b])
    if not over:
        return
    how = "max.replicas.per.broker" if configured else (
        f"max.replicas.per.broker, derived from node memory at {REPLICA_NODE_MEMORY_BYTES >> 20} MiB per replica "
        "process; set it to override"
    )
    details = ", ".join(f"broker {b} would hold {after[b]} (cap {caps[b]})" for b in over)
    raise PolicyViolationError(f"too many partition replicas: {details}; the limit is {how}")
