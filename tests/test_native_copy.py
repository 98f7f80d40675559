"""The native copy loop (rayk/replication/native_copy.py, native/src/follower_copy.rs)
against the leader it copies: whatever the leader appends, in whatever steps (idempotent
and transactional producers, markers, new leader epochs, segment rolls, indexes filled at a
small interval), the follower's log ends the same, file for file; what it cannot write
natively it hands back, and the Python loop appends that. Then its failures: a write the
disk refuses, a leader that breaks the connection or answers garbage, a stop in the middle
of a long poll."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayk.dataplane import frames
from rayk.errors import KafkaStorageError, NetworkError
from rayk.replication import native_copy
from rayk.replication.partition_replica import ReplicaConfig
from rayk.replication.replica_fetcher import ReplicaFetcher
from rayk.replication.replication_throttle import ReplicationThrottle
from rayk.storage import Log
from rayk.storage.log_config import LogConfig
from rayk.storage.records import SimpleRecord, build_batch
from tests.test_replica_fetcher import FakeLeader, _recv_exactly, served_socket

pytestmark = pytest.mark.skipif(not native_copy.available(), reason="rayk._native is not built")

SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=150)


def plain(n: int, size: int, tag: int) -> bytes:
    return build_batch([SimpleRecord(bytes([tag % 256]) * size) for _ in range(n)])


def idempotent(pid: int, seq: int, n: int) -> bytes:
    return build_batch([SimpleRecord(b"i%d" % i) for i in range(n)], producer_id=pid, producer_epoch=0, base_sequence=seq)


def transactional(pid: int, seq: int, n: int) -> bytes:
    return build_batch([SimpleRecord(b"t%d" % i) for i in range(n)], producer_id=pid, producer_epoch=0,
                       base_sequence=seq, is_transactional=True)  # fmt: skip


class Leader:
    """Appends steps to a leader's log the way a partition leader does."""

    def __init__(self, log: Log) -> None:
        self.log, self.epoch, self.sequences = log, 0, {}
        log.assign_leader_epoch(0)

    def apply(self, step: tuple) -> None:
        kind, *args = step
        log = self.log
        if kind == "plain":
            log.append_as_leader(plain(*args), self.epoch)
        elif kind == "epoch":
            self.epoch += 1  # its first batch starts it (a follower learns an epoch from batches)
        elif kind in ("idempotent", "txn"):
            pid, n = args
            pid += 0 if kind == "idempotent" else 100
            seq = self.sequences.get(pid, 0)
            self.sequences[pid] = seq + n
            if kind == "idempotent":
                log.append_as_leader(idempotent(pid, seq, n), self.epoch)
            else:
                log.append_as_leader(transactional(pid, seq, n), self.epoch, allow_transactional=True,
                                     verification_guard=log.verification_guard(pid))  # fmt: skip
                log.append_txn_marker(pid, 0, commit=seq % 2 == 0, coordinator_epoch=0, leader_epoch=self.epoch)
        log.high_watermark = log.log_end_offset


STEPS = st.one_of(
    st.tuples(st.just("plain"), st.integers(1, 6), st.integers(1, 300), st.integers(0, 255)),
    st.tuples(st.just("epoch")),
    st.tuples(st.just("idempotent"), st.integers(1, 3), st.integers(1, 4)),
    st.tuples(st.just("txn"), st.integers(1, 2), st.integers(1, 3)),
)


def files_of(log: Log) -> dict[str, bytes]:
    """Every segment file's bytes, the indexes cut to their entries (preallocated space aside)."""
    out = {}
    for path in sorted(Path(log.dir_path).iterdir()):
        if path.suffix in (".log", ".txnindex"):
            out[path.name] = path.read_bytes()
    for segment in log._local.segments:
        out[f"{segment.base_offset}.index"] = bytes(segment.offset_index._mmap[: segment.offset_index.size_bytes])
        out[f"{segment.base_offset}.timeindex"] = bytes(segment.time_index._mmap[: segment.time_index.size_bytes])
    return out


def state_of(log: Log) -> tuple:
    producers = {pid: (e.epoch, list(e.batches), e.coordinator_epoch, e.current_txn_first_offset)
                 for pid, e in log.producer_state.producers.items()}
    epochs = [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.entries]
    return log.log_end_offset, log.high_watermark, log.last_stable_offset, producers, epochs, files_of(log)


async def follow(leader: Leader, follower: Log, steps: list[tuple], pause_s: float = 0.0) -> ReplicaFetcher:
    """Runs a fetcher while the leader takes `steps`, until the follower caught up."""
    fetcher = ReplicaFetcher(follower, "t-0", 2, FakeLeader(leader.log), 0, ReplicaConfig(), lambda: None)
    task = asyncio.get_running_loop().create_task(fetcher.run())
    try:
        for step in steps:
            leader.apply(step)
            await asyncio.sleep(pause_s)
        deadline = time.monotonic() + 10
        while (follower.log_end_offset, follower.high_watermark) != (leader.log.log_end_offset, leader.log.high_watermark):
            assert time.monotonic() < deadline, f"LEO {follower.log_end_offset} of {leader.log.log_end_offset}"
            await asyncio.sleep(0.005)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return fetcher


@pytest.fixture
def native_on(monkeypatch):
    monkeypatch.setenv("RAYK_NATIVE", "all")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEPS, min_size=1, max_size=25), pause=st.sampled_from([0.0, 0.003]))
def test_the_follower_ends_as_the_leader_file_for_file(tmp_path_factory, native_on, steps, pause):
    root = tmp_path_factory.mktemp("copy")
    leader = Leader(Log(root / "leader" / "t-0", SMALL))
    leader.apply(("plain", 1, 10, 0))  # a non-empty segment: the native loop starts at once
    follower = Log(root / "follower" / "t-0", SMALL)
    fetcher = asyncio.run(follow(leader, follower, steps, pause))
    assert fetcher._native.runs >= 1
    assert state_of(follower) == state_of(leader.log)


def test_steady_appends_are_written_natively_and_taken_in_by_python(tmp_path, native_on):
    leader = Leader(Log(tmp_path / "leader" / "t-0", SMALL))
    leader.apply(("plain", 1, 10, 0))
    follower = Log(tmp_path / "follower" / "t-0", SMALL)
    fake_steps = [("plain", 1, 20, i) for i in range(60)]
    fetcher = asyncio.run(follow(leader, follower, fake_steps, pause_s=0.002))
    # One run took in most of them: a hand-back (the segment rolls every ~100 records) starts another.
    assert 1 <= fetcher._native.runs <= 10
    assert state_of(follower) == state_of(leader.log)


def test_a_throttle_that_applies_ends_the_run_at_once_and_the_rest_is_copied_at_its_pace(tmp_path, native_on):
    """A reassignment's throttle starts while the native loop waits on its long poll: the run
    ends then, not at its next write, and what comes after is copied by the paced Python loop."""
    leader = Leader(Log(tmp_path / "leader" / "t-0", SMALL))
    leader.apply(("plain", 3, 20, 0))
    follower = Log(tmp_path / "follower" / "t-0", SMALL)
    throttle = ReplicationThrottle()
    fetcher = ReplicaFetcher(follower, "t-0", 2, FakeLeader(leader.log), 0, ReplicaConfig(), lambda: None,
                             throttle=throttle)  # fmt: skip

    async def go():
        task = asyncio.get_running_loop().create_task(fetcher.run())
        try:
            while fetcher._native._run is None or follower.log_end_offset < 3:
                await asyncio.sleep(0.005)
            runs = fetcher.native_copy_runs
            throttle.set_rate(1_000_000)
            fetcher.throttle_changed()
            started = time.monotonic()
            while fetcher._native._run is not None:
                assert time.monotonic() - started < 0.3, "the run went on under the throttle"
                await asyncio.sleep(0.005)
            leader.apply(("plain", 2, 20, 1))
            leader.apply(("plain", 2, 20, 2))
            while follower.log_end_offset < 7:
                await asyncio.sleep(0.005)
            assert fetcher.native_copy_runs == runs  # the Python loop copied them, at the throttle's pace
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    assert state_of(follower)[:3] == state_of(leader.log)[:3]


def test_a_throttle_that_applies_while_the_connection_opens_stops_the_run_before_it_writes(tmp_path, native_on):
    """`stop_run` finds no run while the connection opens: the run checks once it starts."""
    follower = started_follower(tmp_path)
    more = build_batch([SimpleRecord(b"y")], base_offset=1, partition_leader_epoch=0)
    throttled = []

    class ThrottledWhileOpening(ScriptedLeader):
        async def open_socket(self) -> int:
            throttled.append(True)  # a reassignment's throttle applies meanwhile
            return await super().open_socket()

    def slow_answer(c: int) -> bytes:
        time.sleep(0.3)  # the stop comes first
        return records_answer(more, 2, 2)(c)

    copy = native_copy.NativeCopy(follower, "t-0", ThrottledWhileOpening([slow_answer]), lambda: None)
    assert run_copy(copy, keep_running=lambda: not throttled) is None
    assert follower.log_end_offset == 1  # nothing copied unpaced: the Python loop copies it, at the throttle's pace


def test_a_write_the_disk_refuses_raises_a_storage_error_and_the_log_is_unchanged(tmp_path, native_on, monkeypatch):
    leader = Leader(Log(tmp_path / "leader" / "t-0"))
    leader.apply(("plain", 1, 10, 0))
    follower = Log(tmp_path / "follower" / "t-0")
    follower.append_as_follower(leader.log.read(0, 1 << 20).records)
    leader.apply(("plain", 3, 10, 1))
    window, *rest = follower.follower_append_window()
    read_only = os.open(follower._local.segments.active.log_path, os.O_RDONLY)
    monkeypatch.setattr(follower, "follower_append_window", lambda: (window._replace(fd=read_only), *rest))
    before = (follower.log_end_offset, os.path.getsize(follower._local.segments.active.log_path))
    copy = native_copy.NativeCopy(follower, "t-0", FakeLeader(leader.log), lambda: None)

    async def go():
        return await copy.copy(frames.FetchRequest(0, 1 << 20, 1, 500, 2, 0), 5_000, lambda: True)

    with pytest.raises(KafkaStorageError, match="writing"):
        asyncio.run(go())
    copy.close()
    os.close(read_only)
    assert (follower.log_end_offset, os.path.getsize(follower._local.segments.active.log_path)) == before


class ScriptedLeader:
    """Answers each FETCH with the next of `answers` (frame bytes after the size; None: no answer)."""

    def __init__(self, answers: list) -> None:
        self.answers, self.requests = answers, []

    def reset(self) -> None:
        pass

    async def open_socket(self) -> int:
        return served_socket(self._serve)

    def _serve(self, sock: socket.socket) -> None:
        with sock:
            while (size := _recv_exactly(sock, 4)) is not None:
                body = _recv_exactly(sock, int.from_bytes(size, "big"))
                correlation_id = int.from_bytes(body[:4], "big")
                self.requests.append(frames.decode_fetch_request(body[5:]))
                answer = self.answers.pop(0) if self.answers else None
                if answer is None:
                    time.sleep(30)
                    return
                if answer == "close":
                    return
                try:
                    sock.sendall(answer(correlation_id))
                except (BrokenPipeError, ConnectionResetError):
                    return  # the copy loop closed its end first (a run told to stop)


def started_follower(tmp_path) -> Log:
    follower = Log(tmp_path / "follower" / "t-0")
    follower.assign_leader_epoch(0)
    follower.append_as_follower(build_batch([SimpleRecord(b"x")], partition_leader_epoch=0))
    return follower


def run_copy(copy: native_copy.NativeCopy, keep_running=lambda: True, timeout_ms: int = 5_000):
    return asyncio.run(copy.copy(frames.FetchRequest(0, 1 << 20, 1, 500, 2, 0), timeout_ms, keep_running))


@pytest.mark.parametrize("answer, error", [
    ("close", "closed the connection"),
    (lambda c: frames.SIZE.pack(5) + (c + 1).to_bytes(4, "big") + b"\0", "not the one in flight"),
    (lambda c: frames.SIZE.pack(9) + c.to_bytes(4, "big") + b"\0" + b"abcd", "shorter than its header"),
])  # fmt: skip
def test_a_leader_that_breaks_off_or_answers_garbage_is_a_network_error_with_nothing_written(tmp_path, native_on, answer, error):
    follower = started_follower(tmp_path)
    copy = native_copy.NativeCopy(follower, "t-0", ScriptedLeader([answer]), lambda: None)
    with pytest.raises(NetworkError, match=error):
        run_copy(copy)
    assert follower.log_end_offset == 1 and copy._sock is None


def test_no_answer_within_the_timeout_is_a_network_error(tmp_path, native_on):
    copy = native_copy.NativeCopy(started_follower(tmp_path), "t-0", ScriptedLeader([None]), lambda: None)
    started = time.monotonic()
    with pytest.raises(NetworkError, match="no answer to a fetch within 300 ms"):
        run_copy(copy, timeout_ms=300)
    assert time.monotonic() - started < 3


def test_an_answer_it_does_not_write_is_handed_back_whole(tmp_path, native_on):
    follower = started_follower(tmp_path)
    epoch_1 = build_batch([SimpleRecord(b"y")], base_offset=1, partition_leader_epoch=1)
    result = frames.FetchResult(epoch_1, 2, 2, 0)

    def answer(c: int) -> bytes:
        return frames.answer_frame_head(c, frames.encode_fetch_answer_head(result), len(epoch_1)) + epoch_1

    copy = native_copy.NativeCopy(follower, "t-0", ScriptedLeader([answer]), lambda: None)
    assert run_copy(copy) == result
    assert follower.log_end_offset == 1  # the Python loop appends it (a new epoch)


def test_stopping_in_the_middle_of_a_long_poll_ends_the_run_at_once(tmp_path, native_on):
    follower = started_follower(tmp_path)
    copy = native_copy.NativeCopy(follower, "t-0", ScriptedLeader([None]), lambda: None)

    async def go():
        task = asyncio.get_running_loop().create_task(
            copy.copy(frames.FetchRequest(0, 1 << 20, 1, 500, 2, 0), 60_000, lambda: True))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return time.monotonic() - started

    assert asyncio.run(go()) < 0.5
    assert not [t for t in os.listdir("/proc/self/task")
                if open(f"/proc/self/task/{t}/comm").read().strip() == "rayk-follower-c"]


def records_answer(records: bytes, hw: int, leo: int):
    result = frames.FetchResult(records, hw, leo, 0)
    return lambda c: frames.answer_frame_head(c, frames.encode_fetch_answer_head(result), len(records)) + records


def test_a_roll_of_its_own_during_a_run_ends_the_run_first_and_takes_its_writes_in(tmp_path, native_on):
    """Retention rolls an expired active segment on its own (a follower's idle partition):
    the run that writes that segment is ended first, so nothing lands in a sealed segment."""
    follower = started_follower(tmp_path)
    more = build_batch([SimpleRecord(b"y"), SimpleRecord(b"z")], base_offset=1, partition_leader_epoch=0)
    leader = ScriptedLeader([records_answer(more, 3, 3), None])
    progress = []
    copy = native_copy.NativeCopy(follower, "t-0", leader, lambda: progress.append(follower.log_end_offset))

    async def go():
        task = asyncio.get_running_loop().create_task(
            copy.copy(frames.FetchRequest(0, 1 << 20, 1, 500, 2, 0), 60_000, lambda: True))
        while len(leader.requests) < 2:  # the second fetch waits: the first answer was written
            await asyncio.sleep(0.005)
        follower.roll()
        return await asyncio.wait_for(task, 5)

    assert asyncio.run(go()) is None  # stopped; the fetcher's loop goes on
    assert follower.log_end_offset == 3 and follower.segment_base_offsets == [0, 3]
    assert follower.high_watermark == 3 and progress and progress[-1] == 3
    follower.close()
    assert Log(follower.dir_path).log_end_offset == 3
    assert copy._sock is None  # a fetch may still be out on it: the next run opens another


class PanickingRun:
    """A FollowerCopy whose run ends in a panic (the thread's catch_unwind outcome, which no
    input is known to reach): the real run, its outcome replaced once it has one."""

    def __init__(self, *args) -> None:
        self._run = REAL_FOLLOWER_COPY(*args)

    def __getattr__(self, name: str):
        return getattr(self._run, name)

    def outcome(self):
        return None if self._run.outcome() is None else (native_copy.PANICKED, "index out of bounds (injected)")


REAL_FOLLOWER_COPY = native_copy._native.FollowerCopy if native_copy._native is not None else None


def test_a_panic_of_the_run_keeps_what_it_wrote_and_the_fetcher_copies_in_python(tmp_path, native_on, monkeypatch, caplog):
    follower = started_follower(tmp_path)
    more = build_batch([SimpleRecord(b"y"), SimpleRecord(b"z")], base_offset=1, partition_leader_epoch=0)
    monkeypatch.setattr(native_copy._native, "FollowerCopy", PanickingRun)
    copy = native_copy.NativeCopy(follower, "t-0", ScriptedLeader([records_answer(more, 3, 3), "close"]), lambda: None)
    assert run_copy(copy) is None
    assert copy.unusable and copy._sock is None  # the fetcher's own loop copies from now on
    assert "the native copy loop failed (index out of bounds (injected)); copying in Python" in caplog.text
    assert (follower.log_end_offset, follower.high_watermark) == (3, 3)  # what it wrote, taken in
    follower.close()
    assert Log(follower.dir_path).log_end_offset == 3


def run_then(follower: Log, answers: list, action) -> object:
    """Starts a run, lets it write the first answer's records, then does `action` on the log
    while the run waits on its second fetch; returns what the run returned."""
    leader = ScriptedLeader(answers)
    copy = native_copy.NativeCopy(follower, "t-0", leader, lambda: None)

    async def go():
        task = asyncio.get_running_loop().create_task(
            copy.copy(frames.FetchRequest(0, 1 << 20, 1, 500, 2, 0), 60_000, lambda: True))
        while len(leader.requests) < 2:
            await asyncio.sleep(0.001)
        action()
        return await asyncio.wait_for(task, 5)

    return asyncio.run(go())


def test_retention_counts_what_the_run_wrote_before_it_deletes_anything(tmp_path, native_on):
    """An idle follower's active segment passed retention.ms with its HW at its LEO, and a
    record arrives: the retention check that comes before Python took the write in must not
    roll and delete the segment that now holds it (the leader counts that record)."""
    follower = Log(tmp_path / "follower" / "t-0", LogConfig(retention_ms=60_000))
    follower.assign_leader_epoch(0)
    old_ms = int(time.time() * 1000) - 3_600_000
    follower.append_as_follower(build_batch([SimpleRecord(b"x")], partition_leader_epoch=0, now_ms=old_ms))
    follower.high_watermark = 1
    fresh = build_batch([SimpleRecord(b"y"), SimpleRecord(b"z")], base_offset=1, partition_leader_epoch=0)
    assert run_then(follower, [records_answer(fresh, 3, 3), None], follower.delete_expired_segments) is None
    assert (follower.log_start_offset, follower.log_end_offset, follower.high_watermark) == (0, 3, 3)
    assert follower.segment_base_offsets == [0]


def test_a_new_segment_config_ends_the_run_before_it_applies(tmp_path, native_on):
    follower = started_follower(tmp_path)
    fresh = build_batch([SimpleRecord(b"y" * 100)], base_offset=1, partition_leader_epoch=0)
    smaller = LogConfig(segment_bytes=150)  # what the run wrote no longer fits: the next append rolls
    assert run_then(follower, [records_answer(fresh, 2, 2), None], lambda: follower.update_config(smaller)) is None
    assert follower.log_end_offset == 2 and follower.segment_base_offsets == [0]
    follower.append_as_follower(build_batch([SimpleRecord(b"w")], base_offset=2, partition_leader_epoch=0))
    assert follower.segment_base_offsets == [0, 2]


@pytest.mark.parametrize("config", [LogConfig(flush_messages=1), LogConfig(flush_ms=0)])
def test_a_log_that_fsyncs_by_flush_settings_copies_in_python(tmp_path, config):
    """Its fsync must come before the next fetch tells the leader the follower has the records."""
    follower = Log(tmp_path / "t-0", config)
    follower.assign_leader_epoch(0)
    follower.append_as_follower(build_batch([SimpleRecord(b"x")], partition_leader_epoch=0))
    assert follower.follower_append_window() is None
