"""Kafka's client-side partition assignors "range" and "roundrobin", as pure functions.

In a classic consumer group the leader member computes the assignment: given each
member's subscribed topics and each topic's partition count, it decides which member
consumes which partition. Every assignor here takes

    subscriptions:         member_id -> the topics that member subscribed to
    partitions_per_topic:  topic -> its partition count (partitions 0..n-1)

and returns member_id -> topic -> sorted partitions, with every member of
`subscriptions` present (an empty dict when it gets nothing) and a topic listed only when
the member gets at least one of its partitions, which is what Java sends on the wire. A
subscribed topic missing from `partitions_per_topic` (no metadata yet) is skipped, as in
Java's AbstractPartitionAssignor; a topic nobody subscribed to is never assigned.

Both follow Java's eager (non-cooperative) assignors without racks or static members:
members and topics are ordered as Java's String.compareTo orders them (by UTF-16 code
unit, which differs from Python's code point order only beyond the BMP), so a rayk
leader and a Java leader assign a group identically. Java puts static members (those
with a group.instance.id) first, ordered by instance id; that is not modelled here.

* range (RangeAssignor): per topic, the members subscribed to it in order split the
  partitions into contiguous ranges; the first `n % m` members get one extra.
* roundrobin (RoundRobinAssignor): all (topic, partition) pairs, sorted by topic then
  partition, are dealt to the sorted members in a cycle that skips a member not
  subscribed to the partition's topic. With identical subscriptions member loads
  differ by at most one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

__all__ = ["ASSIGNORS", "Assignor", "GroupAssignment", "range_assign", "round_robin_assign"]

# member_id -> topic -> partitions, ascending.
GroupAssignment = dict[str, dict[str, list[int]]]
Assignor = Callable[[Mapping[str, Iterable[str]], Mapping[str, int]], GroupAssignment]


def _java_order(s: str) -> bytes:
    """A sort key matching Java's String.compareTo (lexicographic over UTF-16 code units)."""
    return s.encode("utf-16-be", "surrogatepass")


def _topics_by_member(
    subscriptions: Mapping[str, Iterable[str]], partitions_per_topic: Mapping[str, int]
) -> dict[str, frozenset[str]]:
    """Each member's subscribed topics that have metadata, after checking the counts."""
    for topic, count in partitions_per_topic.items():
        if count < 0:
            raise ValueError(f"topic {topic!r} has a negative partition count {count}")
    by_member = {}
    for member, topics in subscriptions.items():
        if isinstance(topics, str):
            raise TypeError(f"member {member!r}: topics must be a collection of topic names, not one str")
        by_member[member] = frozenset(t for t in topics if t in partitions_per_topic)
    return by_member


def range_assign(
    subscriptions: Mapping[str, Iterable[str]], partitions_per_topic: Mapping[str, int]
) -> GroupAssignment:
    """Kafka's RangeAssignor: contiguous ranges of each topic, in member order."""
    topics_by_member = _topics_by_member(subscriptions, partitions_per_topic)
    members_by_topic: dict[str, list[str]] = {}
    for member, topics in topics_by_member.items():
        for topic in topics:
            members_by_topic.setdefault(topic, []).append(member)
    assignment: GroupAssignment = {member: {} for member in subscriptions}
    for topic in sorted(members_by_topic, key=_java_order):
        members = sorted(members_by_topic[topic], key=_java_order)
        per_member, with_extra = divmod(partitions_per_topic[topic], len(members))
        start = 0
        for i, member in enumerate(members):
            size = per_member + (1 if i < with_extra else 0)
            if size:
                assignment[member][topic] = list(range(start, start + size))
            start += size
    return assignment


def round_robin_assign(
    subscriptions: Mapping[str, Iterable[str]], partitions_per_topic: Mapping[str, int]
) -> GroupAssignment:
    """Kafka's RoundRobinAssignor: partitions dealt in turn, skipping unsubscribed members."""
    topics_by_member = _topics_by_member(subscriptions, partitions_per_topic)
    assignment: GroupAssignment = {member: {} for member in subscriptions}
    members = sorted(topics_by_member, key=_java_order)
    subscribed_topics = set().union(*topics_by_member.values())
    cursor = 0
    for topic in sorted(subscribed_topics, key=_java_order):
        for partition in range(partitions_per_topic[topic]):
            # Terminates: the topic is in subscribed_topics, so some member has it.
            while topic not in topics_by_member[members[cursor]]:
                cursor = (cursor + 1) % len(members)
            assignment[members[cursor]].setdefault(topic, []).append(partition)
            cursor = (cursor + 1) % len(members)
    return assignment


# Keyed by the protocol names Java's assignors announce in JoinGroup.
ASSIGNORS: dict[str, Assignor] = {"range": range_assign, "roundrobin": round_robin_assign}
