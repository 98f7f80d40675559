"""The server-side assignors of KIP-848's consumer group protocol, "uniform" (the default)
and "range", as pure functions.

The group coordinator runs one whenever the group epoch moves, to get the group's target
assignment (rayk.coordinator.group.member_reconciliation moves each member towards its part). Both take

    subscriptions:  member id -> the topics it subscribed to
    partitions:     topic -> its partition count (partitions 0..n-1)
    current:        member id -> the partitions (topic, partition) it is assigned now

and return member id -> frozenset of (topic, partition), with every member present. A
subscribed topic with no partition count (not created yet) gets nothing.

* uniform (Kafka's UniformAssignor): every partition of a subscribed topic goes to one of
  its subscribers, and the counts are balanced: no partition's owner has two or more
  partitions more than another subscriber of its topic (with identical subscriptions:
  counts differ by at most one). It is sticky: a partition stays with its current owner
  while that keeps the balance, so a member joining or leaving moves only the partitions
  it must.
* range (Kafka's server-side RangeAssignor): per topic, its subscribers in member id order
  take contiguous ranges, the first `n % m` one partition more, so that members with the
  same subscriptions get the same partition numbers of co-partitioned topics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

TopicPartition = tuple[str, int]
Assignment = dict[str, frozenset[TopicPartition]]


def uniform_assign(
    subscriptions: Mapping[str, Iterable[str]], partitions: Mapping[str, int],
    current: Mapping[str, Iterable[TopicPartition]] | None = None,
) -> Assignment:
    subscribers = _subscribers(subscriptions, partitions)
    owned: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    previous = {tp: m for m, tps in (current or {}).items() if m in owned for tp in tps}
    # Every partition first stays with its current owner if that one still subscribes.
    # Then the others, of the topics with the fewest subscribers first (they have the
    # fewest places to go), each go to the subscriber with the fewest partitions: counted
    # after every kept partition, so that a member leaving moves only its own partitions.
    orphans = []
    for topic in sorted(subscribers, key=lambda t: (len(subscribers[t]), t)):
        for p in range(partitions[topic]):
            keeper = previous.get((topic, p))
            if keeper in subscribers[topic]:
                owned[keeper].add((topic, p))
            else:
                orphans.append((topic, p))
    for topic, p in orphans:
        owned[min(subscribers[topic], key=lambda m: (len(owned[m]), m))].add((topic, p))
    _balance(owned, subscribers)
    return {m: frozenset(tps) for m, tps in owned.items()}


def _balance(owned: dict[str, set[TopicPartition]], subscribers: dict[str, list[str]]) -> None:
    """Moves partitions from a member to a subscriber of their topic with two or more
    fewer, until there is none: each move lowers the sum of squared counts, so it ends."""
    moved = True
    while moved:
        moved = False
        for giver in sorted(owned, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[giver]):
                taker = min(subscribers[tp[0]], key=lambda m: (len(owned[m]), m))
                if len(owned[taker]) + 1 < len(owned[giver]):
                    owned[giver].remove(tp)
                    owned[taker].add(tp)
                    moved = True


def range_assign(
    subscriptions: Mapping[str, Iterable[str]], partitions: Mapping[str, int],
    current: Mapping[str, Iterable[TopicPartition]] | None = None,
) -> Assignment:
    owned: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    for topic, members in _subscribers(subscriptions, partitions).items():
        count = partitions[topic]
        share, extra = divmod(count, len(members))
        start = 0
        for i, member in enumerate(members):
            end = start + share + (1 if i < extra else 0)
            owned[member].update((topic, p) for p in range(start, end))
            start = end
    return {m: frozenset(tps) for m, tps in owned.items()}


def _subscribers(subscriptions: Mapping[str, Iterable[str]], partitions: Mapping[str, int]) -> dict[str, list[str]]:
    """Each subscribed topic that has a partition count -> its subscribers, sorted."""
    by_topic: dict[str, list[str]] = {}
    for member in sorted(subscriptions):
        topics = subscriptions[member]
        if isinstance(topics, str):
            raise TypeError(f"member {member!r}: topics must be a collection of topic names, not one str")
        for topic in set(topics):
            if partitions.get(topic, -1) < 0:
                continue
            by_topic.setdefault(topic, []).append(member)
    return by_topic


ASSIGNORS = {"uniform": uniform_assign, "range": range_assign}
