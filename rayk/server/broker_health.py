"""What a broker's partition states say about its health: Kafka's ReplicaManager gauges.

A broker knows each partition it replicates through the state the Controller last pushed
to it (leader, replicas, ISR, a reassignment's adding replicas) and the topic's
`min.insync.replicas`. From these, as Kafka's ReplicaManager counts them:
- LeaderCount: partitions this broker leads;
- PartitionCount: partitions it holds a replica of, leading or following;
- UnderReplicatedPartitions: led partitions whose ISR is smaller than their replication
  factor, which during a reassignment is the replica set without the replicas being added
  (Kafka's `replicas.size - addingReplicas.size`): a partition is not under-replicated
  because a new copy is still catching up;
- UnderMinIsrPartitionCount: led partitions whose ISR is smaller than min.insync.replicas,
  where acks=all produces are refused.
Only leaders count partitions as under-replicated, so a cluster-wide sum counts each once.

Pure logic: no Ray, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from rayk.metadata.elections import PartitionState
from rayk.metrics import BrokerHealth


def broker_health(broker_id: int, partitions: Iterable[tuple[PartitionState, int]]) -> BrokerHealth:
    """The gauges of broker `broker_id` from (state, min.insync.replicas) of each partition it holds."""
    leaders = held = under_replicated = under_min_isr = 0
    for state, min_insync_replicas in partitions:
        held += 1
        if state.leader != broker_id:
            continue
        leaders += 1
        replication_factor = len(state.replicas) - len(state.adding)
        if len(state.isr) < replication_factor:
            under_replicated += 1
        if len(state.isr) < min_insync_replicas:
            under_min_isr += 1
    return BrokerHealth(broker_id, leaders, held, under_replicated, under_min_isr)
