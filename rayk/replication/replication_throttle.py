"""Replication throttles: Kafka's `leader.replication.throttled.rate` and
`follower.replication.throttled.rate` (bytes/s per broker), on the traffic of the replicas
a reassignment adds, so that moving partitions does not take the disks and the network
from producers and consumers.

Kafka applies each rate once per broker, over all its throttled replicas (a quota its
fetcher threads and its leaders' answers share). In rayk every replica is a process of its
own, so a broker's rate is shared out: its ReplicaManager divides the leader rate equally
among the partitions it leads that are adding replicas, and the follower rate among its
replicas being added (`throttle_settings`), and tells each replica its share with its
role (become_leader / become_follower: no call per fetch), telling the others their new
share as moves start and complete. The balancer bounds the moves a broker takes part in
(balancer.max.concurrent.moves.per.broker, 5), so each of its moves gets at least a fifth
of the rate; the sum never exceeds it.

Each replica paces its own share (`ReplicationThrottle`, a virtual clock: bytes may go at
`ready_at`, which moves on by bytes / rate each time, never earlier than now, so nothing
is saved up while idle):
- leader side (leader_fetch.py): its answer to an adding follower's fetch waits until its
  bytes fit the rate;
- follower side (replica_fetcher.py): an adding follower appends what it fetched only once
  its bytes fit the rate, and fetches again after.
Either way the copy of B bytes takes at least B / rate seconds, and one request carries
at most THROTTLE_QUANTUM_S worth of the rate (but always one batch whole), so a wait is
short. Where both brokers throttle, the waits add up. Replicas not being added (the
ISR's followers, consumers) are never throttled, and the default rates (Long.MAX_VALUE)
throttle nothing. Not thread-safe: one replica's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a replica's process has no use for the Controller's rules
    from rayk.metadata.elections import PartitionState

THROTTLE_QUANTUM_S = 0.5  # at most this long a throttled request's bytes take at the rate

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ThrottleSetting:
    """A replica's share of its broker's throttles: as a leader, the byte rate of its
    answers to the `adding` followers; as a follower being added, the byte rate of its
    fetches (None: no limit)."""

    leader_rate_bytes_per_s: int | None = None
    adding: tuple[int, ...] = ()
    follower_rate_bytes_per_s: int | None = None


UNTHROTTLED = ThrottleSetting()


def throttle_settings(
    broker_id: int, states: Mapping[TopicPartition, PartitionState],
    leader_rate_bytes_per_s: int | None, follower_rate_bytes_per_s: int | None,
) -> dict[TopicPartition, ThrottleSetting]:
    """Each throttled replica of broker `broker_id` (its partitions' `states`) with its
    share of the broker's rates (None: no limit); replicas left out are not throttled."""
    leading = sorted(tp for tp, s in states.items() if s.leader == broker_id and set(s.adding) - {broker_id})
    adding = sorted(tp for tp, s in states.items() if broker_id in s.adding and s.leader != broker_id)
    out: dict[TopicPartition, ThrottleSetting] = {}
    if leader_rate_bytes_per_s is not None:
        share = max(1, leader_rate_bytes_per_s // max(1, len(leading)))
        for tp in leading:
            out[tp] = ThrottleSetting(share, tuple(r for r in states[tp].adding if r != broker_id))
    if follower_rate_bytes_per_s is not None:
        share = max(1, follower_rate_bytes_per_s // max(1, len(adding)))
        for tp in adding:
            out[tp] = ThrottleSetting(follower_rate_bytes_per_s=share)
    return out


class ReplicationThrottle:
    """Paces one replica's throttled bytes to a rate (see the module docstring)."""

    def __init__(self, rate_bytes_per_s: int | None = None) -> None:
        self.rate_bytes_per_s = rate_bytes_per_s
        self._ready_at_s = 0.0  # monotonic: when the next bytes may go

    @property
    def active(self) -> bool:
        return self.rate_bytes_per_s is not None

    def set_rate(self, rate_bytes_per_s: int | None) -> None:
        assert rate_bytes_per_s is None or rate_bytes_per_s > 0, rate_bytes_per_s
        self.rate_bytes_per_s = rate_bytes_per_s

    def max_bytes(self, max_bytes: int) -> int:
        """What one request may ask for: at most THROTTLE_QUANTUM_S worth of the rate."""
        if self.rate_bytes_per_s is None:
            return max_bytes
        return max(1, min(max_bytes, int(self.rate_bytes_per_s * THROTTLE_QUANTUM_S)))

    def charge(self, n_bytes: int, now_s: float) -> float:
        """Counts `n_bytes` going now; the seconds to wait before they may (0 unthrottled)."""
        rate = self.rate_bytes_per_s
        if rate is None or n_bytes <= 0:
            return 0.0
        self._ready_at_s = max(self._ready_at_s, now_s) + n_bytes / rate
        return self._ready_at_s - now_s

    async def pace(self, n_bytes: int) -> None:
        """Waits until `n_bytes` fit the rate."""
        delay_s = self.charge(n_bytes, time.monotonic())
        if delay_s > 0:
            await asyncio.sleep(delay_s)
