"""The compiled HandOut (rayk/client/_hand_out.c) against its Python reference
(rayk.client.hand_out.hand_out_reference): the same records, the same positions, the same
calls to the fetcher and the same counts sent to the source, whatever the program does
between two records (polls, seeks, pauses, closes); and its errors."""

from __future__ import annotations

import collections
import gc
import weakref
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rayk.client.fetcher as fetcher_module
from rayk.client.fetcher import DECODE_AHEAD_RECORDS
from rayk.client.hand_out import HandOut, hand_out_reference
from rayk.client.types import ConsumerRecord, TopicPartition
from tests.test_fetcher import ScriptedLeader, batch, fetch_round, fetcher_for

IMPLEMENTATIONS = {"compiled": HandOut, "reference": hand_out_reference}
PARTITIONS = [TopicPartition("t", p) for p in range(3)]


def test_the_compiled_hand_out_is_built():
    assert HandOut is not hand_out_reference, "rayk.client._hand_out is not built: `make` builds it"


def record(offset: int) -> ConsumerRecord:
    return ConsumerRecord("t", 0, offset, 0, 0, None, b"v", [], -1, 1)


class Chunk:
    """A chunk whose records are decoded so far (`offsets`) and, batch by batch, as
    `decode_more` is called (`later`: the offsets of each batch left)."""

    def __init__(self, offsets: list[int], end: int, later: tuple[list[int], ...] = ()) -> None:
        self.tp, self.records, self.end = PARTITIONS[0], deque(record(o) for o in offsets), end
        self.later = list(later)
        self.more = bool(later)


class RecordingFetcher:
    """A fetcher as HandOut sees it: `_changes`, `decode_more` and `_drop_if_first`,
    the two calls recorded."""

    def __init__(self) -> None:
        self._changes = 0
        self.dropped: list[Any] = []
        self.decoded: list[tuple[Any, int]] = []  # (chunk, records left undelivered when called)

    def decode_more(self, chunk: Any) -> None:
        self.decoded.append((chunk, len(chunk.records)))
        chunk.records.extend(record(o) for o in chunk.later.pop(0))
        chunk.more = bool(chunk.later)

    def _drop_if_first(self, chunk: Any) -> None:
        self.dropped.append(chunk)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_the_source_is_sent_each_chunks_count_and_records_before_the_position_are_skipped(implementation):
    chunks = [Chunk([0, 1, 2, 3], end=6), Chunk([], end=8), Chunk([8, 9], end=10)]
    sent: list[int | None] = []

    def source():
        for chunk in chunks:
            sent.append((yield chunk))

    fetcher, positions = RecordingFetcher(), {PARTITIONS[0]: 2}
    handed = [r.offset for r in IMPLEMENTATIONS[implementation](source(), positions, fetcher)]
    assert handed == [2, 3, 8, 9]
    assert sent == [2, 0, 2], "how many records each chunk gave"
    assert positions[PARTITIONS[0]] == 10
    # each chunk is dropped at its last record and again once found empty (a no-op for the fetcher)
    assert [chunks.index(c) for c in fetcher.dropped] == [0, 0, 1, 2, 2]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_chunk_is_decoded_as_it_is_handed_out_and_its_last_record_is_known_as_such(implementation):
    # Batches decoded as the records run out: one left (is it the last?) or none; batches
    # that give no record (control batches, or before the position) are walked past.
    chunk = Chunk([0, 1], end=12, later=([2], [], [3, 4, 5], [6], [7, 8], []))
    empty_first = Chunk([], end=3, later=([], [1, 2]))  # as every FetchedChunk begins: nothing decoded yet
    fetcher, positions = RecordingFetcher(), {PARTITIONS[0]: 4}
    handing = IMPLEMENTATIONS[implementation]((c for c in [chunk]), positions, fetcher)
    assert next(handing).offset == 4
    assert [left for _, left in fetcher.decoded] == [1, 1, 1], "decoded only when one record was left: the last?"
    assert positions[PARTITIONS[0]] == 5 and fetcher.dropped == []
    assert next(handing).offset == 5 and positions[PARTITIONS[0]] == 6
    assert [r.offset for r in handing] == [6, 7, 8]
    assert [left for _, left in fetcher.decoded] == [1, 1, 1, 1, 1, 1]
    assert positions[PARTITIONS[0]] == 12, "the last record moved the position to the chunk's end"
    assert not chunk.more and not chunk.later
    assert fetcher.dropped == [chunk, chunk], "dropped at its last record, and once found empty"
    fetcher = RecordingFetcher()
    handing = IMPLEMENTATIONS[implementation]((c for c in [empty_first]), {PARTITIONS[0]: 0}, fetcher)
    handed = [r.offset for r in handing]
    assert handed == [1, 2] and [left for _, left in fetcher.decoded] == [0, 0]

    def failing_decode(chunk: Any) -> None:
        raise ValueError("batch at offset 2: a corrupt record")

    fetcher = RecordingFetcher()
    fetcher.decode_more = failing_decode
    chunk, positions = Chunk([0, 1], end=3, later=([2],)), {PARTITIONS[0]: 0}
    handing = IMPLEMENTATIONS[implementation]((c for c in [chunk]), positions, fetcher)
    assert [next(handing).offset for _ in range(2)] == [0, 1], "every record before the batch goes out"
    assert positions[PARTITIONS[0]] == 2 and fetcher.dropped == [], "1 went out as not the chunk's last"
    with pytest.raises(ValueError, match="corrupt"):
        next(handing)  # none left: the batch's error now
    assert list(handing) == [] and positions[PARTITIONS[0]] == 2

    class Interrupted(RecordingFetcher):
        def decode_more(self, chunk: Any) -> None:
            raise KeyboardInterrupt  # not an Exception: it goes out at once, the record kept

    chunk = Chunk([0, 1], end=3, later=([2],))
    handing = IMPLEMENTATIONS[implementation]((c for c in [chunk]), {PARTITIONS[0]: 0}, Interrupted())
    assert next(handing).offset == 0
    with pytest.raises(KeyboardInterrupt):
        next(handing)
    assert [r.offset for r in chunk.records] == [1]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("change", ["seek", "forget"])
def test_a_seek_or_a_forget_while_a_chunk_is_decoded_leaves_the_chunk(implementation, change):
    # decode_more runs the deserializers: one that seeks (or forgets) is seen at once,
    # as a seek between two records is, not after the next record.
    positions = {PARTITIONS[0]: 0}

    class Seeking(RecordingFetcher):
        def decode_more(self, chunk: Any) -> None:
            RecordingFetcher.decode_more(self, chunk)
            if change == "seek":
                positions[PARTITIONS[0]] = 10
            else:
                self._changes += 1

    sent: list[Any] = []

    def source():
        sent.append((yield Chunk([0, 1], end=4, later=([2, 3],))))
        sent.append((yield Chunk([10, 11] if change == "seek" else [2, 3], end=12)))

    handed = [r.offset for r in IMPLEMENTATIONS[implementation](source(), positions, Seeking())]
    assert handed == ([0, 10, 11] if change == "seek" else [0, 2, 3])
    assert sent == [1, 2], "the first chunk was left after one record"


class ChangesOnTheClass(RecordingFetcher):
    """`_changes` a class value until the first change sets it on the instance."""

    _changes = 0

    def __init__(self) -> None:
        RecordingFetcher.__init__(self)
        del self.__dict__["_changes"]


class ChangesAsAProperty(RecordingFetcher):
    """`_changes` a property (getattr never reads the instance's __dict__ for it, though a
    stale value sits there)."""

    def __init__(self) -> None:
        RecordingFetcher.__init__(self)
        self.counted = 0
        self.__dict__["_changes"] = "stale"

    @property  # type: ignore[override]
    def _changes(self) -> int:
        return self.counted

    @_changes.setter
    def _changes(self, value: int) -> None:
        self.counted = value


class ChangesInSlots:
    __slots__ = ("_changes", "dropped", "decoded")

    def __init__(self) -> None:
        self._changes, self.dropped, self.decoded = 0, [], []

    def _drop_if_first(self, chunk: Any) -> None:
        self.dropped.append(chunk)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("fetcher_class", [RecordingFetcher, ChangesOnTheClass, ChangesAsAProperty, ChangesInSlots])
def test_a_change_of_the_fetcher_is_seen_however_it_keeps_its_changes(implementation, fetcher_class):
    # The compiled HandOut reads `_changes` from the instance's __dict__ where getattr
    # would: a class value, a property or slots must be seen as getattr sees them.
    fetcher = fetcher_class()
    sent: list[Any] = []

    def source():
        sent.append((yield Chunk([0, 1, 2], end=3)))
        sent.append((yield Chunk([1, 2], end=3)))

    handing = IMPLEMENTATIONS[implementation](source(), {PARTITIONS[0]: 0}, fetcher)
    assert next(handing).offset == 0
    fetcher._changes += 1  # a forget: the chunk is left, and the next one comes
    assert [r.offset for r in handing] == [1, 2]
    assert sent == [1, 2], "the first chunk gave one record, the second the rest"


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_what_the_source_raises_comes_out_of_the_iteration_and_bad_chunks_are_type_errors(implementation):
    def failing():
        yield Chunk([0], end=1)
        raise RuntimeError("the consumer is closed")

    handing = IMPLEMENTATIONS[implementation](failing(), {PARTITIONS[0]: 0}, RecordingFetcher())
    assert next(handing).offset == 0
    with pytest.raises(RuntimeError, match="closed"):
        next(handing)

    bad = Chunk([0], end=1)
    bad.records = deque([("not", "a record")])
    with pytest.raises((TypeError, IndexError)):
        list(IMPLEMENTATIONS[implementation]((c for c in [bad]), {PARTITIONS[0]: 0}, RecordingFetcher()))
    with pytest.raises(KeyError):
        list(IMPLEMENTATIONS[implementation]((c for c in [Chunk([0], end=1)]), {}, RecordingFetcher()))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_once_it_raised_it_is_over_and_a_nested_next_is_refused(implementation):
    class DropFails(RecordingFetcher):
        def _drop_if_first(self, chunk):
            raise OSError("the fetcher broke")

    handing = IMPLEMENTATIONS[implementation]((c for c in [Chunk([0], end=1), Chunk([1, 2], end=3)]),
                                              {PARTITIONS[0]: 0}, DropFails())
    with pytest.raises(OSError):
        next(handing)  # the chunk's last record drops the chunk, which raises
    assert list(handing) == [], "as a generator: over once it raised"

    class Nested(RecordingFetcher):
        def _drop_if_first(self, chunk):
            next(self.handing)  # Python code the iteration runs, stepping the same iteration

    fetcher = Nested()
    fetcher.handing = IMPLEMENTATIONS[implementation]((c for c in [Chunk([0], end=1)]), {PARTITIONS[0]: 0}, fetcher)
    with pytest.raises(ValueError, match="already executing"):
        next(fetcher.handing)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_position_may_be_any_integer_type(implementation):
    np = pytest.importorskip("numpy")
    positions = {PARTITIONS[0]: np.int64(1)}  # as Consumer.seek stores what it is given
    handing = IMPLEMENTATIONS[implementation]((c for c in [Chunk([0, 1, 2, 3], end=4)]), positions, RecordingFetcher())
    assert next(handing).offset == 1
    positions[PARTITIONS[0]] = np.int64(2)  # unchanged, as a numpy integer
    assert [r.offset for r in handing] == [2, 3] and positions[PARTITIONS[0]] == 4


def test_the_compiled_hand_out_refuses_bad_arguments_and_is_collected_in_a_cycle():
    with pytest.raises(TypeError):
        HandOut(iter(()), {}, RecordingFetcher())  # not a generator: it could not be sent the counts
    with pytest.raises(TypeError):
        HandOut((c for c in ()), [], RecordingFetcher())  # positions must be a dict
    with pytest.raises(TypeError):
        HandOut((c for c in ()), collections.OrderedDict(), RecordingFetcher())  # exactly a dict
    fetcher = RecordingFetcher()
    handing = HandOut((c for c in ()), {}, fetcher)
    fetcher.handing = handing  # a cycle through the fetcher
    alive = weakref.ref(fetcher)
    del fetcher, handing
    gc.collect()
    assert alive() is None


# -------------------------------------------------------------- the model: compiled == reference

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("next"), st.integers(1, 6)),
        st.tuples(st.just("drain"), st.integers(1, 5)),
        st.tuples(st.just("fetch"), st.just(0)),
        st.tuples(st.just("forget"), st.integers(0, 2)),
        st.tuples(st.just("seek"), st.integers(0, 2), st.integers(0, 20)),
        st.tuples(st.just("unassign"), st.integers(0, 2)),
        st.tuples(st.just("restart"), st.just(0)),
        st.tuples(st.just("close"), st.just(0)),
    ),
    max_size=25,
)


def scripted_fetcher() -> tuple[Any, dict[TopicPartition, int]]:
    """Three partitions, each answering in batches of a few records with control batches
    between, a fetch at every offset a batch starts (so a seek can fetch again); some
    answers hold two batches of records, which the chunk decodes one at a time."""
    leaders = {}
    for p, tp in enumerate(PARTITIONS):
        answers, offset = {}, 0
        while offset < 20:
            count = 2 + (offset + p) % 3
            data = batch(offset, count) + (batch(offset + count, 1, control=True) if (offset + p) % 2 else b"")
            end = offset + count + (1 if (offset + p) % 2 else 0)
            if (offset + p) % 3 == 0:  # a second batch of records behind
                data += batch(end, 2)
                end += 2
            for o in range(offset, end):
                answers[o] = data
            offset = end
        leaders[tp] = ScriptedLeader(answers)
    return fetcher_for(leaders), {tp: 0 for tp in PARTITIONS}


def recording(source: Any, sent: list[Any]) -> Any:
    """`source`, passing on (and keeping) what HandOut sends it."""
    value = None
    while True:
        try:
            chunk = source.send(value)
        except StopIteration:
            return
        value = yield chunk
        sent.append(value)


def run(implementation: Any, operations: list[tuple]) -> list[Any]:
    """What the program sees, step by step, under `operations`: the records, the
    positions, what the iteration sent its source and which chunks it dropped."""
    fetcher_module.HandOut = implementation
    fetcher_module.DECODE_AHEAD_RECORDS = 1  # a batch at a time, so the chunks are decoded as they go out
    try:
        fetcher, positions = scripted_fetcher()
        fetch_round(fetcher, positions)
        sent: list[Any] = []
        drops: list[Any] = []
        drop = fetcher._drop_if_first
        fetcher._drop_if_first = lambda chunk: (drops.append((chunk.tp.partition, chunk.start)), drop(chunk))[1]
        handing = fetcher.hand_out(positions, recording(fetcher._chunks_at_positions(positions), sent))
        seen: list[Any] = []
        for op in operations:
            kind = op[0]
            if kind == "next":
                seen.append([(r.partition, r.offset) for _, r in zip(range(op[1]), handing)])
            elif kind == "drain":
                seen.append({tp.partition: [r.offset for r in rs] for tp, rs in fetcher.drain(positions, op[1]).items()})
            elif kind == "fetch" and not fetcher._closed:
                fetch_round(fetcher, positions)
            elif kind in ("forget", "seek", "unassign"):
                tp = PARTITIONS[op[1]]
                fetcher.forget(tp)
                if kind == "seek":
                    positions[tp] = op[2]
                elif kind == "unassign":
                    positions.pop(tp, None)
            elif kind == "restart":
                handing = fetcher.hand_out(positions, recording(fetcher._chunks_at_positions(positions), sent))
            elif kind == "close":
                fetcher.close()
            seen.append(dict(positions))
        seen.append([(r.partition, r.offset) for r in handing])
        seen.append(dict(positions))
        return seen + [sent, drops]
    finally:
        fetcher_module.HandOut = HandOut
        fetcher_module.DECODE_AHEAD_RECORDS = DECODE_AHEAD_RECORDS


@settings(max_examples=300, deadline=None)
@given(OPERATIONS)
def test_the_compiled_hand_out_gives_what_the_reference_gives(operations):
    assert run(HandOut, operations) == run(hand_out_reference, operations)
