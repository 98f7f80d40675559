"""The replica board alone (rayk/replication/replica_board.py): what a replica publishes is what
its broker reads, a slot given to another replica hides what the last one wrote late, and
a broker's next incarnation does not see the last one's replicas."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.replication import replica_board
from rayk.replication.replica_board import SLOTS_PER_PAGE, ReplicaBoard, SlotWriter
from rayk.storage.log_dir_checkpoints import PartitionOffsets

offsets_strategy = st.builds(
    PartitionOffsets,
    *(st.none() | st.integers(0, 2**63 - 1) for _ in range(4)),
)


def test_what_a_replica_publishes_its_broker_reads_with_the_time_it_was_published(tmp_path: Path):
    board = ReplicaBoard(tmp_path, publish_interval_ms=2_250, directory=tmp_path)
    slot = board.assign()
    assert slot.publish_interval_ms == 2_250
    writer = SlotWriter(slot)
    assert board.read(slot) is None, "nothing published yet"
    before = time.monotonic()
    writer.publish(PartitionOffsets(10, 2, 8, None), 4_096)
    published = board.read(slot)
    assert published is not None and published.offsets == PartitionOffsets(10, 2, 8, None)
    assert published.size_bytes == 4_096
    assert before <= published.at_s <= time.monotonic(), "the node's monotonic clock, as the broker's supervisor reads it"
    writer.publish(PartitionOffsets(11, 2, 11, 5), 4_200)
    assert board.read(slot).offsets == PartitionOffsets(11, 2, 11, 5)


@settings(max_examples=200, deadline=None)
@given(offsets=offsets_strategy, size_bytes=st.integers(0, 2**63 - 1))
def test_offsets_round_trip_unknown_ones_included(tmp_path_factory, offsets: PartitionOffsets, size_bytes: int):
    board = ReplicaBoard(d := tmp_path_factory.mktemp("board"), publish_interval_ms=1_000, directory=d)
    slot = board.assign()
    SlotWriter(slot).publish(offsets, size_bytes)
    published = board.read(slot)
    assert (published.offsets, published.size_bytes) == (offsets, size_bytes)


def test_a_slot_given_out_again_ignores_what_its_last_replica_writes_late(tmp_path: Path):
    board = ReplicaBoard(tmp_path, publish_interval_ms=1_000, initial_slots=1, directory=tmp_path)
    old, *_ = [board.assign() for _ in range(board.capacity)]  # every slot taken
    late = SlotWriter(old)
    board.release(old)
    new = board.assign()
    assert new.index == old.index and new.token != old.token
    late.publish(PartitionOffsets(99, 0, 99, None), 1)  # a stopped replica's last, late publication
    assert board.read(new) is None, "another replica's offsets are never taken for this one's"
    SlotWriter(new).publish(PartitionOffsets(3, 0, 3, None), 7)
    assert board.read(new).offsets.high_watermark == 3
    assert board.read(old) is None, "the old token reads nothing once the slot is another's"
    board.release(old)  # a second release of the old token frees nothing
    assert board.read(new) is not None


def test_released_slots_are_given_out_again_oldest_first(tmp_path: Path):
    board = ReplicaBoard(tmp_path, publish_interval_ms=1_000, initial_slots=3, directory=tmp_path)
    capacity = board.capacity
    slots = [board.assign() for _ in range(capacity)]
    board.release(slots[1])
    board.release(slots[0])
    assert [board.assign().index for _ in range(2)] == [1, 0]


def test_the_board_grows_past_a_page_and_each_replica_maps_only_its_own(tmp_path: Path):
    board = ReplicaBoard(tmp_path, publish_interval_ms=1_000, initial_slots=1, directory=tmp_path)
    first = board.capacity
    assert first == SLOTS_PER_PAGE
    slots = [board.assign() for _ in range(first * 2 + 1)]
    assert board.capacity >= len(slots) and len({s.index for s in slots}) == len(slots)
    writers = [SlotWriter(slot) for slot in slots]
    for i, writer in enumerate(writers):
        writer.publish(PartitionOffsets(i, 0, i, None), i)
    assert [board.read(slot).size_bytes for slot in slots] == list(range(len(slots)))


def test_a_new_incarnation_of_the_broker_does_not_see_the_last_ones_replicas(tmp_path: Path):
    last = ReplicaBoard(tmp_path, publish_interval_ms=1_000, directory=tmp_path)
    zombie = SlotWriter(last.assign())
    board = ReplicaBoard(tmp_path, publish_interval_ms=1_000, directory=tmp_path)  # the broker, restarted by Ray
    slot = board.assign()
    zombie.publish(PartitionOffsets(50, 0, 50, None), 1)  # into the old file, not over the new slot
    assert board.read(slot) is None
    SlotWriter(slot).publish(PartitionOffsets(1, 0, 1, None), 1)
    assert board.read(slot).offsets.high_watermark == 1


def test_a_slot_read_while_being_written_is_not_taken(tmp_path: Path, monkeypatch):
    board = ReplicaBoard(tmp_path, publish_interval_ms=1_000, directory=tmp_path)
    slot = board.assign()
    writer = SlotWriter(slot)
    writer.publish(PartitionOffsets(1, 0, 1, None), 1)
    replica_board.SEQ.pack_into(board._map, slot.index * replica_board.SLOT_BYTES, 3)  # odd: a write under way
    assert board.read(slot) is None, "the next round reads it"
    writer.publish(PartitionOffsets(2, 0, 2, None), 1)
    assert board.read(slot).offsets.high_watermark == 2


def test_a_closed_writer_publishes_nothing(tmp_path: Path):
    board = ReplicaBoard(tmp_path, publish_interval_ms=1_000, directory=tmp_path)
    slot = board.assign()
    writer = SlotWriter(slot)
    writer.close()
    writer.publish(PartitionOffsets(1, 0, 1, None), 1)
    assert board.read(slot) is None


def test_the_board_goes_to_tmpfs_by_default_and_a_clean_shutdown_removes_it(tmp_path: Path):
    board = ReplicaBoard(tmp_path, publish_interval_ms=1_000)
    try:
        expected = replica_board.candidate_paths(tmp_path)[0]
        assert board.path == expected and board.path.exists()
        if os.path.isdir(replica_board.SHM_DIR):
            assert str(board.path).startswith(replica_board.SHM_DIR), "memory, not the data disk"
        assert os.stat(board.path).st_blocks * 512 >= os.path.getsize(board.path), "every block allocated"
        slot = board.assign()
        SlotWriter(slot).publish(PartitionOffsets(1, 0, 1, None), 1)
    finally:
        board.close(remove=True)
    assert not board.path.exists()
    assert board.read(slot) is None, "a closed board reads nothing"
    board.release(slot)  # a replica's death reported after the shutdown: nothing happens
    with pytest.raises(RuntimeError, match="closed"):
        board.assign()
    board.close(remove=True)  # twice: nothing happens


def test_no_room_is_an_error_the_board_survives_and_the_data_directory_is_the_fallback(tmp_path: Path, monkeypatch):
    real = os.posix_fallocate
    full = {replica_board.SHM_DIR}

    def fallocate(fd, offset, length):
        if os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")) in full:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, offset, length)

    monkeypatch.setattr(replica_board.os, "posix_fallocate", fallocate)
    board = ReplicaBoard(tmp_path, publish_interval_ms=1_000, initial_slots=1)  # tmpfs full: the data directory
    try:
        assert board.path == tmp_path / replica_board.BOARD_FILE
        slots = [board.assign() for _ in range(board.capacity)]
        full.add(str(tmp_path))
        with pytest.raises(OSError):
            board.assign()  # no room to grow: an error, not a SIGBUS at the first write
        for slot in slots:
            SlotWriter(slot).publish(PartitionOffsets(2, 0, 2, None), 2)
        assert all(board.read(slot).offsets.high_watermark == 2 for slot in slots), "what was there still works"
        full.discard(str(tmp_path))
        board.release(slots[0])
        assert board.assign().index == slots[0].index
    finally:
        board.close(remove=True)
