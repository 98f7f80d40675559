"""The balancer's planner: where partition replicas should be, after Cruise Control's
goals (pure: no I/O, no Ray). The Controller's Balancer (controller/balancer.py) runs it
and commits its moves; new topics' placement (ReplicationControlManager) runs it on the
new partitions alone, to polish where they go before they hold data.

Input: the brokers (Ray node, replica capacity, whether it is leaving: decommissioning),
the partitions (replicas in preference order, leader, ISR, a KIP-455 reassignment under
way) and, optionally, each partition's size in bytes. Output (`plan_balance`): a bounded
list of `Move`s, per partition the replica list it should have, to be started as KIP-455
reassignments; a list that only reorders the same replicas moves no data (the leader
then follows by preferred election).

Goals, in Cruise Control's order (its goal in brackets). Each has a measure of how far
the placement is from meeting it; a placement's score is the tuple of the measures:
0. leaving: replicas on leaving brokers (decommissioning; before every goal);
1. node diversity: per partition, how many fewer distinct nodes its replicas use than
   it could (min of its replica count and the nodes of the placeable brokers) [RackAwareGoal];
2. capacity: replicas past a broker's cap [ReplicaCapacityGoal];
3. replicas per broker: how far each placeable broker's count is outside [floor, ceil]
   of the mean, so a balanced cluster has every count within 1 of the mean
   [ReplicaDistributionGoal];
4. leaders per broker: the same of preferred leaders (first replicas), changed by
   reordering replicas only, a chain of them where one is not enough
   [LeaderReplicaDistributionGoal];
   a periodic check (`settle` False) starts on goals 3 and 4 only once a broker is
   outside BALANCE_BAND of the mean (Cruise Control's balance thresholds); a broker
   joining or leaving, and the plans that follow up on moves under way, settle them;
5. bytes per broker: the sum of the squares of the bytes each placeable broker holds,
   acted on only once a broker holds DISK_BALANCE_THRESHOLD times the mean and
   DISK_BALANCE_MIN_GAP_BYTES more than the emptiest [DiskUsageDistributionGoal].
Every step of a plan (one partition's new replicas, or two partitions swapping replicas
for the disk goal) makes the score strictly smaller in that order, so no move for a goal
makes a higher one worse; and since the placements are finitely many and every plan
lowers the score, plans applied one after another reach one where no move is left
(no oscillation). A move never puts a broker past its cap, never onto a leaving one, and
never leaves a partition on fewer nodes than before (only a leaving broker's replicas may
have to, when no other node can take them).

Which partitions move: partitions under reassignment are left alone (counted by their
target replicas), and so are those with a replica on a broker not given (fenced or
unknown: not the balancer's to decide); to serve the goals after "leaving", only
partitions with a leader and every replica in sync move. Internal topics' partitions move
last among equal choices: a coordinator that moves makes its clients look for it again.

Bound: at most `max_moves_per_broker` reassignments touching a broker (adding or
removing a replica on it) at a time, those already under way included (Cruise Control's
num.concurrent.partition.movements.per.broker). Reorders move no data and count only
against MAX_LEADER_MOVES_PER_PLAN.

Deterministic: the same input gives the same plan (ties go by topic, partition, broker id).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from rayk.internal_topics import is_internal
from rayk.metadata.elections import NO_LEADER, PartitionState

DEFAULT_MAX_MOVES_PER_BROKER = 5  # Cruise Control's num.concurrent.partition.movements.per.broker
MAX_LEADER_MOVES_PER_PLAN = 1000  # Cruise Control's num.concurrent.leader.movements
# A periodic check leaves counts within the larger of these of the mean (Cruise Control's
# replica.count.balance.threshold and leader.replica.count.balance.threshold, 1.10; and 1,
# since its rounding makes small counts as tolerant).
BALANCE_BAND = 0.10
BALANCE_BAND_MIN = 1.0
DISK_BALANCE_THRESHOLD = 1.10  # Cruise Control's disk.balance.threshold
DISK_BALANCE_MIN_GAP_BYTES = 64 * 2**20  # less than this between brokers is not worth a copy
DISK_SWAP_CANDIDATES = 32  # partitions of each broker tried for a swap: the largest, the smallest
MAX_STEPS_PER_GOAL = 10_000  # a safety bound: each step lowers the score, which is finite anyway

GOALS = ("leaving", "node diversity", "capacity", "replicas per broker", "leaders per broker", "bytes per broker")
LEAVING, DIVERSITY, CAPACITY, REPLICAS, LEADERS, DISK = range(len(GOALS))

Key = tuple[str, int]
Change = tuple[Key, tuple[int, ...]]  # a partition and the replicas it would have
Score = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BalancerBroker:
    """A broker as the planner sees it: `capacity` is the replicas it may hold (None: no
    cap); a `leaving` broker (decommissioning) takes no replica and must lose its own."""

    broker_id: int
    node_id: str
    capacity: int | None = None
    leaving: bool = False


@dataclass(frozen=True, slots=True)
class BalancerPartition:
    """A partition as the planner sees it (a PartitionState's fields, and its size)."""

    topic: str
    partition: int
    replicas: tuple[int, ...]  # in preference order; during a reassignment, target + removing
    leader: int
    isr: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()
    size_bytes: int = 0

    @classmethod
    def of(cls, topic: str, partition: int, state: PartitionState, size_bytes: int = 0) -> BalancerPartition:
        return cls(topic, partition, state.replicas, state.leader, state.isr, state.adding, state.removing, size_bytes)

    @property
    def key(self) -> Key:
        return (self.topic, self.partition)

    @property
    def target(self) -> tuple[int, ...]:
        """Its replicas once its reassignment (if any) completes."""
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def moving(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def steady(self) -> bool:
        """Led, and every replica in sync: it may move for the goals after "leaving"."""
        return not self.moving and self.leader != NO_LEADER and set(self.isr) == set(self.replicas)


@dataclass(frozen=True, slots=True)
class Move:
    """One partition's new replicas (a KIP-455 target), and the ones it had."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    previous: tuple[int, ...]

    @property
    def moves_data(self) -> bool:
        """False for a reorder: the same replicas, another preferred leader."""
        return set(self.replicas) != set(self.previous)


@dataclass(frozen=True, slots=True)
class BalancePlan:
    """The moves, the scores before and after them (per goal, GOALS order), and whether
    more may be done later: the bound held moves back, or some partitions could not be
    considered (being reassigned, leaderless or not in sync)."""

    moves: tuple[Move, ...]
    score_before: Score
    score_after: Score
    incomplete: bool


def plan_balance(
    brokers: Sequence[BalancerBroker],
    partitions: Iterable[BalancerPartition],
    max_moves_per_broker: int = DEFAULT_MAX_MOVES_PER_BROKER,
    settle: bool = True,
    only: Collection[Key] | None = None,
) -> BalancePlan:
    """The moves that bring the placement closer to the goals (see the module docstring).

    With `settle` (a broker joined or is leaving, or the moves of an earlier plan are
    under way) the counts go as close to the mean as the goals allow; without it (a
    periodic check) the replicas-per-broker and leaders-per-broker goals start moving
    only once a broker is outside BALANCE_BAND of the mean, so a cluster is not
    reshuffled for a difference of one or two replicas. With `only`, only those
    partitions move (a topic being created: its placement polished before it holds data)."""
    assert max_moves_per_broker >= 1, max_moves_per_broker
    placement = _Placement(brokers, list(partitions), max_moves_per_broker, only)
    placement.settle = settle
    before = placement.score
    placement.evacuate()
    for goal in (DIVERSITY, CAPACITY, REPLICAS, LEADERS, DISK):
        placement.improve(goal)
    after = placement.score
    assert after <= before, f"a plan never makes the score worse: {before} -> {after}"
    return BalancePlan(tuple(placement.moves()), before, after, placement.incomplete)


def score_of(brokers: Sequence[BalancerBroker], partitions: Iterable[BalancerPartition]) -> Score:
    """The placement's score, per goal in GOALS order (0 everywhere: nothing to do)."""
    return _Placement(brokers, list(partitions), DEFAULT_MAX_MOVES_PER_BROKER).score


def _deviation(count: int, total: int, brokers: int) -> int:
    """How far `count` is outside [floor, ceil] of total / brokers (0 with no brokers)."""
    if not brokers:
        return 0
    low, high = total // brokers, -(-total // brokers)
    return max(0, count - high) + max(0, low - count)


class _Placement:
    """The placement being planned: targets per partition, the counts per broker, the
    score (kept as changes are made and undone) and the bound's touches per broker."""

    def __init__(self, brokers: Sequence[BalancerBroker], partitions: list[BalancerPartition], max_moves: int,
                 only: Collection[Key] | None = None) -> None:
        self.node = {b.broker_id: b.node_id for b in brokers}
        assert len(self.node) == len(brokers), "each broker once"
        self.placeable = sorted(b.broker_id for b in brokers if not b.leaving)
        self.leaving = {b.broker_id for b in brokers if b.leaving}
        self.cap = {b.broker_id: b.capacity for b in brokers if b.capacity is not None}
        self.nodes = len({self.node[b] for b in self.placeable})
        self.max_moves = max_moves
        self.original = {p.key: p.target for p in partitions}
        self.target = dict(self.original)
        self.size = {p.key: p.size_bytes for p in partitions}
        known = [p for p in partitions if all(r in self.node for r in p.replicas) and (only is None or p.key in only)]
        self.evacuable = {p.key for p in known if not p.moving and p.leader != NO_LEADER}
        self.movable = {p.key for p in known if p.steady}
        self.movable_order = sorted(self.movable)
        self.count: Counter[int] = Counter()
        self.leads: Counter[int] = Counter()
        self.bytes: Counter[int] = Counter()
        self.touches: Counter[int] = Counter(b for p in partitions for b in (*p.adding, *p.removing))
        for key, target in self.target.items():
            self._add(key, target, 1)
        self.replica_total = sum(self.count[b] for b in self.node)
        self.leader_total = sum(self.leads[b] for b in self.node)
        self.incomplete = any(not p.steady for p in known)  # once moved or back in sync, they may move
        self.leader_moves = 0
        self.settle = True
        self._score = [0] * len(GOALS)
        for b in self.node:
            self._add_terms(self._broker_terms(b), 1)
        for key in self.target:
            self._score[DIVERSITY] += self._shortfall(self.target[key])

    @property
    def score(self) -> Score:
        return tuple(self._score)

    # ------------------------------------------------------------------ the measures

    def _shortfall(self, target: tuple[int, ...]) -> int:
        """How many fewer nodes the replicas use than they could (goal 1)."""
        known = [r for r in target if r in self.node]
        return max(0, min(len(known), self.nodes) - len({self.node[r] for r in known}))

    def _broker_terms(self, b: int) -> list[int]:
        """Broker `b`'s share of each goal's measure."""
        terms = [0] * len(GOALS)
        if b in self.leaving:
            terms[LEAVING] = self.count[b]
            return terms
        if b in self.cap:
            terms[CAPACITY] = max(0, self.count[b] - self.cap[b])
        placeable = len(self.placeable)
        terms[REPLICAS] = _deviation(self.count[b], self.replica_total, placeable)
        terms[LEADERS] = _deviation(self.leads[b], self.leader_total, placeable)
        terms[DISK] = self.bytes[b] ** 2
        return terms

    def _add_terms(self, terms: list[int], sign: int) -> None:
        for goal, term in enumerate(terms):
            self._score[goal] += sign * term

    def _add(self, key: Key, target: tuple[int, ...], sign: int) -> None:
        """Counts (sign 1) or uncounts (-1) a partition's replicas on its brokers."""
        for r in target:
            if r in self.node:
                self.count[r] += sign
                self.bytes[r] += sign * self.size[key]
        if target and target[0] in self.node:
            self.leads[target[0]] += sign
        for r in set(target) ^ set(self.original[key]):
            self.touches[r] += sign

    # ------------------------------------------------------------------ changes

    def change(self, key: Key, new: tuple[int, ...]) -> None:
        """Gives the partition `new` replicas, keeping the counts and the score."""
        old = self.target[key]
        brokers = {r for r in (*old, *new) if r in self.node}
        for b in brokers:
            self._add_terms(self._broker_terms(b), -1)
        self._score[DIVERSITY] += self._shortfall(new) - self._shortfall(old)
        self._add(key, old, -1)
        self.target[key] = new
        self._add(key, new, 1)
        for b in brokers:
            self._add_terms(self._broker_terms(b), 1)

    def _try(self, changes: Sequence[Change]) -> tuple[Score, bool]:
        """The score after `changes`, and whether the bound allows them; changes nothing."""
        olds = [(key, self.target[key]) for key, _ in changes]
        touched_before = {b: self.touches[b] for key, new in changes for b in (*self.target[key], *new)}
        for key, new in changes:
            self.change(key, new)
        score = self.score
        fits = all(self.touches[b] <= max(self.max_moves, before) for b, before in touched_before.items())
        for key, old in reversed(olds):
            self.change(key, old)
        return score, fits

    def _best(self, goal: int, candidates: Iterable[Sequence[Change]]) -> Sequence[Change] | None:
        """Of `candidates`, the one that lowers the score most (ties: internal topics
        last, then by topic and partition) and that the bound allows, among those that
        lower it by `goal` or a higher one (so a step for one goal is never taken for
        the sake of a lower one: the disk goal's threshold holds); None if none does."""
        current = self.score
        best: tuple[tuple, Sequence[Change]] | None = None
        for changes in candidates:
            if goal != LEAVING and any(self._shortfall(new) > self._shortfall(self.target[k]) for k, new in changes):
                continue  # node diversity is never broken for a lower goal, not even for a better sum
            score, fits = self._try(changes)
            if score[:goal + 1] >= current[:goal + 1]:
                continue
            if not fits:
                self.incomplete = True  # held back by the bound: once moves complete, more
                continue
            rank = (score, [(_order(k), new) for k, new in changes])
            if best is None or rank < best[0]:
                best = (rank, changes)
        return None if best is None else best[1]

    def moves(self) -> Iterator[Move]:
        for key in sorted(self.target):
            if self.target[key] != self.original[key]:
                yield Move(key[0], key[1], self.target[key], self.original[key])

    # ------------------------------------------------------------------ the goals

    def evacuate(self) -> None:
        """Goal 0: each replica on a leaving broker to a placeable one, partition by partition."""
        for key in sorted(self.evacuable, key=_order):
            for _ in range(len(self.target[key])):
                target = self.target[key]
                leaving = [i for i, r in enumerate(target) if r in self.leaving]
                if not leaving:
                    break
                step = self._best(LEAVING, ([(key, _replaced(target, leaving[0], b))] for b in self._takers(target)))
                if step is None:
                    break  # nowhere to go (capacity, the bound): the next plan tries again
                self.change(*step[0])

    def improve(self, goal: int) -> None:
        """Steps that lower the score for `goal`, best first, until none is left."""
        if not self.placeable or (goal in (REPLICAS, LEADERS) and not self.settle and self._within_band(goal)):
            return
        for _ in range(MAX_STEPS_PER_GOAL):
            if self.score[goal] == 0:
                return
            step = self._step(goal)
            if step is None:
                return
            for key, new in step:
                self.change(key, new)
            if goal == LEADERS:
                self.leader_moves += 1

    def _step(self, goal: int) -> Sequence[Change] | None:
        if goal == DIVERSITY:
            return self._best(goal, self._diversity_candidates())
        if goal == CAPACITY:
            over = [b for b in self.placeable if b in self.cap and self.count[b] > self.cap[b]]
            return self._best(goal, self._moves_off(over))
        if goal == REPLICAS:
            return self._first_pair(goal, self.count, self._moves_between)
        if goal == LEADERS:
            return None if self.leader_moves >= MAX_LEADER_MOVES_PER_PLAN else self._first_pair(goal, self.leads, self._reorders)
        return self._disk_step()

    def _within_band(self, goal: int) -> bool:
        """Whether every placeable broker's count for `goal` is within BALANCE_BAND of the mean."""
        counts, total = (self.count, self.replica_total) if goal == REPLICAS else (self.leads, self.leader_total)
        mean = total / len(self.placeable)
        slack = max(BALANCE_BAND_MIN, BALANCE_BAND * mean)
        return all(abs(counts[b] - mean) <= slack for b in self.placeable)

    def _takers(self, target: tuple[int, ...]) -> list[int]:
        """Placeable brokers that may take one more replica of a partition with `target`."""
        return [b for b in self.placeable if b not in target and (b not in self.cap or self.count[b] < self.cap[b])]

    def _diversity_candidates(self) -> Iterator[list[Change]]:
        for key in self.movable_order:
            target = self.target[key]
            if not self._shortfall(target):
                continue
            nodes = Counter(self.node[r] for r in target)
            for i, r in enumerate(target):
                if nodes[self.node[r]] > 1:
                    for b in self._takers(target):
                        if self.node[b] not in nodes:
                            yield [(key, _replaced(target, i, b))]

    def _moves_off(self, sources: list[int], destinations: list[int] | None = None) -> Iterator[list[Change]]:
        """Each replica of `sources` moved to each broker that may take it (of `destinations`)."""
        for key in self.movable_order:
            target = self.target[key]
            for i, r in enumerate(target):
                if r in sources:
                    for b in self._takers(target):
                        if destinations is None or b in destinations:
                            yield [(key, _replaced(target, i, b))]

    def _moves_between(self, source: int, destination: int) -> Iterator[list[Change]]:
        return self._moves_off([source], [destination])

    def _reorders(self, source: int, destination: int) -> Iterator[list[Change]]:
        """The shortest chain of reorders that hands one preferred leadership from
        `source` to `destination`: a partition `source` leads that `destination` holds,
        or one whose other replica b then hands one of b's on, and so on (each broker in
        between gives one and takes one). Breadth first, brokers and partitions in order."""
        led: dict[int, list[Key]] = {}
        for key in self.movable_order:
            led.setdefault(self.target[key][0], []).append(key)
        came_from: dict[int, tuple[int, Key] | None] = {source: None}
        frontier = [source]
        while frontier and destination not in came_from:
            following = []
            for broker in frontier:
                for key in led.get(broker, ()):
                    for other in sorted(self.target[key][1:]):
                        if other not in came_from and other not in self.leaving:  # a leaving broker leads nothing new
                            came_from[other] = (broker, key)
                            following.append(other)
            frontier = following
        if destination not in came_from:
            return
        chain, broker = [], destination
        while (step := came_from[broker]) is not None:
            giver, key = step
            target = self.target[key]
            chain.append((key, _replaced(_replaced(target, target.index(broker), giver), 0, broker)))
            broker = giver
        yield chain[::-1]

    def _first_pair(self, goal: int, counts: Counter[int],
                    candidates_of: Callable[[int, int], Iterator[list[Change]]]) -> Sequence[Change] | None:
        """The best step between the most uneven pair of placeable brokers (fullest
        source, emptiest destination) that has one."""
        by_count = sorted(self.placeable, key=lambda b: (counts[b], b))
        pairs = [(s, d) for s in reversed(by_count) for d in by_count if counts[s] - counts[d] >= 2]
        pairs.sort(key=lambda pair: (counts[pair[1]] - counts[pair[0]], pair))
        for source, destination in pairs:
            step = self._best(goal, candidates_of(source, destination))
            if step is not None:
                return step
        return None

    def _disk_step(self) -> Sequence[Change] | None:
        """A replica moved, or two swapped, from the broker with the most bytes to the one
        with the fewest, once they are far enough apart to be worth a copy."""
        if len(self.placeable) < 2:
            return None
        by_bytes = sorted(self.placeable, key=lambda b: (self.bytes[b], b))
        emptiest, fullest = by_bytes[0], by_bytes[-1]
        mean = sum(self.bytes[b] for b in self.placeable) / len(self.placeable)
        gap = self.bytes[fullest] - self.bytes[emptiest]
        if self.bytes[fullest] <= mean * DISK_BALANCE_THRESHOLD or gap <= DISK_BALANCE_MIN_GAP_BYTES:
            return None
        return self._best(DISK, [*self._moves_between(fullest, emptiest), *self._swaps(fullest, emptiest)])

    def _swaps(self, fullest: int, emptiest: int) -> Iterator[list[Change]]:
        """A larger replica of `fullest` for a smaller one of `emptiest`: no counts change."""
        mine = sorted((k for k in self.movable if fullest in self.target[k] and emptiest not in self.target[k]),
                      key=lambda k: (-self.size[k], k))[:DISK_SWAP_CANDIDATES]
        theirs = sorted((k for k in self.movable if emptiest in self.target[k] and fullest not in self.target[k]),
                        key=lambda k: (self.size[k], k))[:DISK_SWAP_CANDIDATES]
        for a in mine:
            for b in theirs:
                if self.size[a] > self.size[b]:
                    ta, tb = self.target[a], self.target[b]
                    yield [(a, _replaced(ta, ta.index(fullest), emptiest)), (b, _replaced(tb, tb.index(emptiest), fullest))]


def _order(key: Key) -> tuple[bool, Key]:
    """Which partition goes first among equals: internal topics' last."""
    return is_internal(key[0]), key


def _replaced(target: tuple[int, ...], index: int, broker: int) -> tuple[int, ...]:
    return (*target[:index], broker, *target[index + 1:])


def partitions_of(states: Iterable[tuple[str, int, PartitionState]], sizes: Mapping[Key, int] | None = None) -> list[BalancerPartition]:
    """The planner's partitions from the image's (topic, partition, state), with their sizes."""
    sizes = sizes or {}
    return [BalancerPartition.of(t, p, s, sizes.get((t, p), 0)) for t, p, s in states]
