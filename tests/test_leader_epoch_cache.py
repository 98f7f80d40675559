"""Tests for rayk.storage.leader_epoch_cache: Kafka's LeaderEpochFileCache semantics."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.errors import KafkaStorageError
from rayk.storage.checkpoint import EpochEntry, LeaderEpochCheckpointFile
from rayk.storage.leader_epoch_cache import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    LeaderEpochCache,
)

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
E = EpochEntry


@pytest.fixture
def checkpoint(tmp_path: Path) -> LeaderEpochCheckpointFile:
    return LeaderEpochCheckpointFile(tmp_path / LeaderEpochCheckpointFile.FILE_NAME)


def cache_with(*entries: tuple[int, int], checkpoint: LeaderEpochCheckpointFile | None = None) -> LeaderEpochCache:
    cache = LeaderEpochCache(checkpoint)
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


# --- assign -------------------------------------------------------------------------


def test_empty_cache_has_undefined_latest_epoch() -> None:
    cache = LeaderEpochCache(None)
    assert cache.entries == []
    assert cache.latest_epoch == UNDEFINED_EPOCH
    assert cache.latest_entry is None


def test_assign_appends_new_epochs_in_order() -> None:
    cache = cache_with((2, 6), (3, 8), (4, 11))
    assert cache.entries == [E(2, 6), E(3, 8), E(4, 11)]
    assert cache.latest_epoch == 4
    assert cache.latest_entry == E(4, 11)


def test_assign_keeps_first_offset_of_an_epoch() -> None:
    cache = cache_with((2, 6), (2, 7), (2, 10))
    assert cache.entries == [E(2, 6)]


def test_assign_ignores_negative_epoch() -> None:
    cache = cache_with((2, 6), (-1, 9))
    assert cache.entries == [E(2, 6)]


def test_assign_same_epoch_at_earlier_offset_moves_its_start_down() -> None:
    # Kafka's isUpdateNeeded: the latest epoch at a *lower* offset replaces the entry.
    cache = cache_with((2, 6), (3, 8), (4, 11), (4, 9))
    assert cache.entries == [E(2, 6), E(3, 8), E(4, 9)]


def test_assign_lower_epoch_removes_later_epochs() -> None:
    cache = cache_with((2, 6), (3, 8), (1, 10))
    assert cache.entries == [E(1, 10)]


def test_assign_lower_start_offset_removes_entries_at_or_after_it() -> None:
    cache = cache_with((2, 6), (3, 8), (4, 11), (5, 8))
    assert cache.entries == [E(2, 6), E(5, 8)]


def test_assign_rejects_negative_start_offset() -> None:
    with pytest.raises(ValueError):
        LeaderEpochCache(None).assign(1, -1)


def test_assign_persists_to_checkpoint(checkpoint: LeaderEpochCheckpointFile) -> None:
    cache_with((0, 0), (3, 10), checkpoint=checkpoint)
    assert checkpoint.path.read_bytes() == b"0\n2\n0 0\n3 10\n"


def test_entries_survive_reopen(checkpoint: LeaderEpochCheckpointFile) -> None:
    cache_with((2, 6), (3, 8), (4, 11), checkpoint=checkpoint)
    assert LeaderEpochCache(checkpoint).entries == [E(2, 6), E(3, 8), E(4, 11)]


def test_loading_out_of_order_file_applies_assign_rule(checkpoint: LeaderEpochCheckpointFile) -> None:
    checkpoint.write([E(2, 6), E(4, 11), E(3, 8)])
    assert LeaderEpochCache(checkpoint).entries == [E(2, 6), E(3, 8)]


def test_loading_malformed_checkpoint_raises_storage_error(checkpoint: LeaderEpochCheckpointFile) -> None:
    checkpoint.path.write_bytes(b"0\n1\n2 six\n")
    with pytest.raises(KafkaStorageError):
        LeaderEpochCache(checkpoint)


def test_failed_persist_leaves_cache_unchanged(
    checkpoint: LeaderEpochCheckpointFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = cache_with((2, 6), checkpoint=checkpoint)

    def failing_replace(src: object, dst: object) -> None:
        raise OSError("simulated disk failure")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(KafkaStorageError):
        cache.assign(3, 8)
    assert cache.entries == [E(2, 6)]
    monkeypatch.undo()
    assert LeaderEpochCache(checkpoint).entries == [E(2, 6)]


# --- recover (crash recovery re-read batches) -------------------------------------------


def test_recover_rederives_every_entry_from_the_rescanned_offset_on() -> None:
    cache = cache_with((0, 0), (1, 40), (2, 95), (5, 120))  # 2 and 5 are stale: the log says otherwise
    cache.recover(90, [E(1, 90), E(3, 100)])
    assert cache.entries == [E(0, 0), E(1, 40), E(3, 100)]


def test_recover_adds_epochs_from_before_the_rescanned_offset_only_when_newer() -> None:
    cache = cache_with((0, 0), (4, 50))
    cache.recover(100, [E(0, 0), E(2, 30), E(4, 100)])  # 0 and 2 were re-read for an index only
    assert cache.entries == [E(0, 0), E(4, 50)]
    empty = LeaderEpochCache(None)
    empty.recover(100, [E(0, 0), E(2, 30), E(4, 100)])  # a lost checkpoint
    assert empty.entries == [E(0, 0), E(2, 30), E(4, 100)]


def test_recover_ignores_batches_without_a_leader_epoch() -> None:
    cache = cache_with((1, 0))
    cache.recover(10, [E(-1, 10), E(2, 12)])
    assert cache.entries == [E(1, 0), E(2, 12)]


def test_recover_persists_only_a_change(checkpoint: LeaderEpochCheckpointFile) -> None:
    cache = cache_with((0, 0), (1, 10), checkpoint=checkpoint)
    before = checkpoint.path.stat().st_ino
    cache.recover(5, [E(0, 5), E(1, 10)])
    assert checkpoint.path.stat().st_ino == before, "nothing changed, nothing written"
    cache.recover(5, [E(0, 5), E(1, 8)])
    assert LeaderEpochCache(checkpoint).entries == [E(0, 0), E(1, 8)]


def test_entries_is_a_copy() -> None:
    cache = cache_with((2, 6))
    cache.entries.append(E(9, 99))
    assert cache.entries == [E(2, 6)]


# --- end_offset_for: Kafka's LeaderEpochFileCacheTest examples ----------------------


def test_end_offset_for_undefined_epoch_is_undefined() -> None:
    assert cache_with((2, 6)).end_offset_for(UNDEFINED_EPOCH, 20) == UNDEFINED


def test_end_offset_for_empty_cache_is_undefined() -> None:
    assert LeaderEpochCache(None).end_offset_for(0, 20) == UNDEFINED


def test_end_offset_for_latest_epoch_is_log_end_offset() -> None:
    assert cache_with((2, 6), (3, 8), (4, 11)).end_offset_for(4, 20) == (4, 20)


def test_end_offset_for_epoch_below_first_is_requested_epoch_and_first_start() -> None:
    assert cache_with((5, 11), (6, 12)).end_offset_for(4, 20) == (4, 11)


def test_end_offset_for_cached_epoch_is_start_of_next_epoch() -> None:
    assert cache_with((0, 10), (2, 13), (4, 17)).end_offset_for(2, 20) == (2, 17)


def test_end_offset_for_epoch_between_two_is_floor_epoch_and_next_start() -> None:
    cache = cache_with((0, 10), (2, 13), (4, 17))
    assert cache.end_offset_for(1, 20) == (0, 13)
    assert cache.end_offset_for(3, 20) == (2, 17)


def test_end_offset_for_epoch_above_latest_is_undefined() -> None:
    assert cache_with((2, 6), (3, 8)).end_offset_for(4, 20) == UNDEFINED


# --- truncation ---------------------------------------------------------------------


def test_truncate_from_end_drops_entries_at_and_after_offset() -> None:
    cache = cache_with((2, 6), (3, 8), (4, 11))
    cache.truncate_from_end(8)
    assert cache.entries == [E(2, 6)]


def test_truncate_from_end_inside_latest_epoch_changes_nothing() -> None:
    cache = cache_with((2, 6), (3, 8), (4, 11))
    cache.truncate_from_end(12)
    assert cache.entries == [E(2, 6), E(3, 8), E(4, 11)]


def test_truncate_from_end_with_undefined_offset_changes_nothing() -> None:
    cache = cache_with((2, 6), (3, 8))
    cache.truncate_from_end(UNDEFINED_EPOCH_OFFSET)
    assert cache.entries == [E(2, 6), E(3, 8)]


def test_truncate_from_end_to_zero_empties_cache_and_persists(checkpoint: LeaderEpochCheckpointFile) -> None:
    cache = cache_with((0, 0), (1, 5), checkpoint=checkpoint)
    cache.truncate_from_end(0)
    assert cache.entries == []
    assert checkpoint.read() == []


def test_truncate_from_start_between_epochs_moves_floor_entry_up() -> None:
    cache = cache_with((2, 6), (3, 8), (4, 11))
    cache.truncate_from_start(9)
    assert cache.entries == [E(3, 9), E(4, 11)]


def test_truncate_from_start_on_an_epoch_boundary_keeps_that_epoch() -> None:
    cache = cache_with((2, 6), (3, 8), (4, 11))
    cache.truncate_from_start(8)
    assert cache.entries == [E(3, 8), E(4, 11)]


def test_truncate_from_start_past_all_starts_keeps_latest_epoch() -> None:
    cache = cache_with((2, 6), (3, 8), (4, 11))
    cache.truncate_from_start(12)
    assert cache.entries == [E(4, 12)]


def test_truncate_from_start_before_first_entry_changes_nothing() -> None:
    cache = cache_with((2, 6), (3, 8))
    cache.truncate_from_start(5)
    assert cache.entries == [E(2, 6), E(3, 8)]


def test_truncate_from_start_persists(checkpoint: LeaderEpochCheckpointFile) -> None:
    cache_with((2, 6), (3, 8), (4, 11), checkpoint=checkpoint).truncate_from_start(9)
    assert checkpoint.read() == [E(3, 9), E(4, 11)]


def test_clear_empties_cache_and_checkpoint(checkpoint: LeaderEpochCheckpointFile) -> None:
    cache = cache_with((2, 6), (3, 8), checkpoint=checkpoint)
    cache.clear()
    assert cache.entries == []
    assert LeaderEpochCache(checkpoint).entries == []


# --- property test against a reference model ----------------------------------------


class Model:
    """The rules written as plainly as possible, as whole-list filters."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []

    def assign(self, epoch: int, start: int) -> None:
        if epoch < 0:
            return
        if self.entries and self.entries[-1][0] == epoch and self.entries[-1][1] <= start:
            return
        self.entries = [(e, s) for e, s in self.entries if e < epoch and s < start] + [(epoch, start)]

    def truncate_from_end(self, end: int) -> None:
        if end >= 0:
            self.entries = [(e, s) for e, s in self.entries if s < end]

    def truncate_from_start(self, start: int) -> None:
        at_or_below = [(e, s) for e, s in self.entries if s <= start]
        if at_or_below:
            self.entries = [(at_or_below[-1][0], start)] + [(e, s) for e, s in self.entries if s > start]

    def clear(self) -> None:
        self.entries = []

    def end_offset_for(self, requested: int, leo: int) -> tuple[int, int]:
        if requested == UNDEFINED_EPOCH or not self.entries:
            return UNDEFINED
        epochs = [e for e, _ in self.entries]
        if requested == epochs[-1]:
            return (requested, leo)
        higher = [(e, s) for e, s in self.entries if e > requested]
        if not higher:
            return UNDEFINED
        floor = [e for e in epochs if e <= requested]
        return (floor[-1] if floor else requested, higher[0][1])


_epochs = st.integers(-2, 12)
_offsets = st.integers(0, 40)
_ops = st.one_of(
    st.tuples(st.just("assign"), _epochs, _offsets),
    st.tuples(st.just("truncate_from_end"), st.integers(-1, 45)),
    st.tuples(st.just("truncate_from_start"), st.integers(0, 45)),
    st.tuples(st.just("clear")),
    st.tuples(st.just("reopen")),
)


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(_ops, max_size=25),
    persist=st.booleans(),
    probes=st.lists(_epochs, min_size=1, max_size=5),
)
def test_cache_matches_reference_model(ops: list[tuple], persist: bool, probes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as d:
        checkpoint = LeaderEpochCheckpointFile(Path(d) / LeaderEpochCheckpointFile.FILE_NAME) if persist else None
        cache = LeaderEpochCache(checkpoint)
        model = Model()
        for op in ops:
            name, *args = op
            if name == "reopen":
                if checkpoint is not None:
                    cache = LeaderEpochCache(checkpoint)
            else:
                getattr(cache, name)(*args)
                getattr(model, name)(*args)

            entries = cache.entries
            assert [(x.epoch, x.start_offset) for x in entries] == model.entries
            assert all(a.epoch < b.epoch and a.start_offset < b.start_offset for a, b in zip(entries, entries[1:]))
            assert all(x.epoch >= 0 and x.start_offset >= 0 for x in entries)
            assert cache.latest_epoch == (entries[-1].epoch if entries else UNDEFINED_EPOCH)
            if checkpoint is not None:
                # Every change is persisted at once (a never-changed cache has no file,
                # which reads as []), so the file always equals memory.
                assert checkpoint.read() == entries
            leo = (entries[-1].start_offset if entries else 0) + 3
            for requested in probes:
                assert cache.end_offset_for(requested, leo) == model.end_offset_for(requested, leo)
