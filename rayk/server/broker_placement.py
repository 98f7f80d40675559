"""Where a broker runs: which Ray node, by hard node affinity.

A broker owns `<data_dir>/broker-<id>` on its node's disk, so it goes back to the node
whose disk holds that directory (found by asking every candidate node which `broker-*`
directories of this cluster it sees); a new broker goes to the candidate node that runs
the fewest brokers. Candidates are the alive nodes, or only those offering the custom
resource `node_resource` when one is given. A directory every node sees is on shared
storage: any node will do.

Used by whoever creates brokers: `rayk.start` for the first ones, the Controller for those
added at runtime (`Controller.add_broker`, the autoscaler's). No state; Ray calls only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

import ray
from ray.exceptions import GetTimeoutError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayk.errors import InvalidConfigurationError, RequestTimedOutError
from rayk.storage import meta_properties


def pinned(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Hard affinity: the actor runs on `node_id` or not at all (never moves off its disk)."""
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def candidate_nodes(node_resource: str | None) -> list[str]:
    """The alive Ray nodes a broker may run on (those offering `node_resource`, if given)."""
    return [
        n["NodeID"]
        for n in ray.nodes()
        if n["Alive"] and (node_resource is None or n["Resources"].get(node_resource, 0) > 0)
    ]


@ray.remote(num_cpus=0)
def _broker_dirs_on_this_node(data_dir: str, cluster_id: str) -> list[int]:
    found = []
    root = Path(data_dir)
    for path in root.glob("broker-*") if root.is_dir() else []:
        try:
            meta = meta_properties.read(path)
        except Exception:
            continue
        if meta is not None and meta.cluster_id == cluster_id:
            found.append(meta.node_id)
    return found


def place_brokers(
    broker_ids: Iterable[int], data_dir: Path, cluster_id: str, node_resource: str | None,
    brokers_per_node: Mapping[str, int] | None = None, timeout_s: float = 60,
) -> dict[int, str]:
    """broker id -> Ray node id: back where its directory is, else on the candidate node
    running the fewest brokers (`brokers_per_node`: those already placed, by node)."""
    nodes = candidate_nodes(node_resource)
    if not nodes:
        raise InvalidConfigurationError(
            f"no alive Ray node offers resource {node_resource!r}" if node_resource else "no alive Ray node"
        )
    seen: dict[str, set[int]] = {n: set() for n in nodes}
    if len(nodes) > 1:
        probes = [
            _broker_dirs_on_this_node.options(scheduling_strategy=pinned(n)).remote(str(data_dir), cluster_id)
            for n in nodes
        ]
        try:
            found = ray.get(probes, timeout=timeout_s)
        except GetTimeoutError:
            raise RequestTimedOutError(f"the nodes did not say which broker directories they hold within {timeout_s} s") from None
        seen = {n: set(f) for n, f in zip(nodes, found)}
    load: Counter[str] = Counter({n: c for n, c in (brokers_per_node or {}).items() if n in seen})
    placement = {}
    for b in broker_ids:
        local = [n for n in nodes if b in seen[n]]
        candidates = local if local and len(local) < len(nodes) else nodes
        node = least_loaded_node(candidates, load)
        placement[b] = node
        load[node] += 1
    return placement


def least_loaded_node(nodes: Iterable[str], brokers_per_node: Mapping[str, int]) -> str:
    """The node of `nodes` running the fewest brokers (ties: the smallest id, so that the
    choice is the same wherever it is made)."""
    return min(nodes, key=lambda n: (brokers_per_node.get(n, 0), n))
