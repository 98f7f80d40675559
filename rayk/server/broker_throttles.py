"""BrokerThrottles: a broker's replication throttles (leader.replication.throttled.rate,
follower.replication.throttled.rate) shared out among its replicas that take part in a
reassignment (the rules: rayk/replication/replication_throttle.py).

The ReplicaManager asks it, as it gives a replica its role, for that replica's share
(`setting_for`: sent with become_leader / become_follower), and after every push or stop
for the replicas whose share changed since they were last told (`changed`: the moves a
broker takes part in started or completed, so the rate divides among more or fewer).
With both rates unlimited (Kafka's default, Long.MAX_VALUE) it is `off`: every share is
UNTHROTTLED and nobody is told anything. Keeps what each replica was last told. Not
thread-safe: the ReplicaManager's event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rayk.config import UNLIMITED_RATE, BrokerConfig
from rayk.metadata.elections import PartitionState
from rayk.replication.replication_throttle import UNTHROTTLED, ThrottleSetting, throttle_settings

TopicPartition = tuple[str, int]


class BrokerThrottles:
    """Each of a broker's replicas' share of its replication throttles, and what it was told."""

    def __init__(self, broker_id: int, config: BrokerConfig) -> None:
        self.broker_id = broker_id
        self.leader_rate_bytes_per_s = _limit(config.leader_replication_throttled_rate)
        self.follower_rate_bytes_per_s = _limit(config.follower_replication_throttled_rate)
        self._told: dict[TopicPartition, ThrottleSetting] = {}

    @property
    def off(self) -> bool:
        return self.leader_rate_bytes_per_s is None and self.follower_rate_bytes_per_s is None

    def _settings(self, states: Mapping[TopicPartition, PartitionState]) -> dict[TopicPartition, ThrottleSetting]:
        return throttle_settings(self.broker_id, states, self.leader_rate_bytes_per_s, self.follower_rate_bytes_per_s)

    def setting_for(self, tp: TopicPartition, states: Mapping[TopicPartition, PartitionState]) -> ThrottleSetting:
        """The share `tp`'s replica is told with its role now, among the broker's `states`."""
        setting = UNTHROTTLED if self.off else self._settings(states).get(tp, UNTHROTTLED)
        self._told[tp] = setting
        return setting

    def changed(self, states: Mapping[TopicPartition, PartitionState], handles: Mapping[TopicPartition, Any]) -> list[tuple[Any, ThrottleSetting]]:
        """(handle, new share) of each running replica (of `handles`) whose share is not
        what it was last told; from now on it counts as told."""
        for tp in [tp for tp in self._told if tp not in states]:
            del self._told[tp]  # stopped
        if self.off:
            return []
        settings = self._settings(states)
        out = []
        for tp, handle in handles.items():
            setting = settings.get(tp, UNTHROTTLED)
            if self._told.get(tp, UNTHROTTLED) != setting:
                self._told[tp] = setting
                out.append((handle, setting))
        return out


def _limit(rate_bytes_per_s: int) -> int | None:
    """A configured rate, None for Kafka's "no limit" (Long.MAX_VALUE)."""
    return None if rate_bytes_per_s >= UNLIMITED_RATE else rate_bytes_per_s
