"""ReplicaFetcher without Ray: a fake LeaderLink answers OffsetsForLeaderEpoch and fetches.
Every test runs twice: with the Python loop, and with the native one where it is built
(its fetches come over a socket the fake serves with the same answers)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

import pytest

from rayk.dataplane import frames
from rayk.replication import native_copy
from rayk.replication.partition_replica import ReplicaConfig
from rayk.replication.replica_fetcher import ReplicaFetcher
from rayk.dataplane.frames import FetchRequest, FetchResult
from rayk.errors import KafkaError, NotLeaderOrFollowerError, UnknownServerError
from rayk.storage import Log
from rayk.storage.records import SimpleRecord, build_batch, iter_batches


@pytest.fixture(autouse=True, params=["python", "native"])
def copy_loop(request, monkeypatch) -> str:
    """Which copy loop the fetcher runs (RAYK_NATIVE's "follower" path)."""
    if request.param == "native" and not native_paths_built():
        pytest.skip("rayk._native is not built")
    monkeypatch.setenv("RAYK_NATIVE", "all" if request.param == "native" else "-follower")
    return request.param


def native_paths_built() -> bool:
    from rayk import native_paths

    return native_paths.built()


def batch(n: int, tag: str) -> bytes:
    return build_batch([SimpleRecord(f"{tag}{i}".encode()) for i in range(n)])


class Method:
    """Stands in for a LeaderLink method: calling it gives an awaitable."""

    def __init__(self, fn: Callable) -> None:
        self.fn, self.calls = fn, []

    def __call__(self, *args):
        self.calls.append(args)

        async def call():
            await asyncio.sleep(0.001)  # a real request yields to the event loop
            return self.fn(*args)

        return call()


class FakeLeader:
    """A LeaderLink onto a leader's log in this process."""

    def __init__(self, log: Log, unanswered_epoch_requests: int = 0) -> None:
        self.log = log
        self.unanswered = unanswered_epoch_requests
        self.offsets_for_leader_epoch = Method(self._offsets_for_leader_epoch)
        self.fetch = Method(self._fetch)
        self.closed = 0

    def close(self) -> None:
        self.closed += 1

    def reset(self) -> None:
        pass  # the Python loop's connection (a fake has none)

    async def open_socket(self) -> int:
        """The native loop's connection: a socket whose other end a thread serves, each
        FETCH answered as `fetch` answers it (a long poll at the log end); a fetch that
        raises is a FAILED answer."""
        self.sockets = getattr(self, "sockets", 0) + 1
        return served_socket(self._serve)

    def _serve(self, sock: socket.socket) -> None:
        with sock:
            while (size := _recv_exactly(sock, 4)) is not None:
                body = _recv_exactly(sock, struct.unpack(">I", size)[0])
                if body is None:
                    return
                correlation_id, kind = frames.REQUEST_HEADER.unpack_from(body)
                assert kind == frames.FETCH
                request = frames.decode_fetch_request(body[frames.REQUEST_HEADER.size:])
                deadline = time.monotonic() + request.max_wait_ms / 1000
                while request.offset == self.log.log_end_offset and time.monotonic() < deadline:
                    time.sleep(0.002)  # the leader's long poll
                self.fetch.calls.append((request,))
                try:
                    result = self.fetch.fn(request)
                except Exception as e:
                    error = e if isinstance(e, KafkaError) else UnknownServerError(str(e))
                    frame = frames.failed_answer_frame(correlation_id, error)
                else:
                    records = bytes(result.records)
                    frame = frames.answer_frame_head(correlation_id, frames.encode_fetch_answer_head(result),
                                                     len(records)) + records
                try:
                    sock.sendall(frame)
                except OSError:
                    return

    def _offsets_for_leader_epoch(self, epoch: int):
        if self.unanswered:
            self.unanswered -= 1
            raise NotLeaderOrFollowerError("not leading yet")
        return self.log.end_offset_for_epoch(epoch)

    def _fetch(self, request: FetchRequest):
        log = self.log
        if request.last_fetched_epoch >= 0:
            epoch, end = log.end_offset_for_epoch(request.last_fetched_epoch)
            if epoch < request.last_fetched_epoch or end < request.offset:
                return FetchResult(b"", log.high_watermark, log.log_end_offset, log.log_start_offset, None, (epoch, end))
        read = log.read(request.offset, request.max_bytes)
        return FetchResult(read.records, log.high_watermark, log.log_end_offset, log.log_start_offset)


def served_socket(serve: Callable[[socket.socket], None]) -> int:
    """One end of a socket pair as a native loop takes it (a non-blocking descriptor of
    its own); `serve` runs on the other end in a thread."""
    ours, theirs = socket.socketpair()
    threading.Thread(target=serve, args=(ours,), daemon=True).start()
    fd = os.dup(theirs.fileno())
    theirs.close()
    os.set_blocking(fd, False)
    return fd


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    out = b""
    while len(out) < n:
        try:
            got = sock.recv(n - len(out))
        except OSError:
            return None
        if not got:
            return None
        out += got
    return out


def values(log: Log) -> list[bytes]:
    log.high_watermark = log.log_end_offset
    return [r.value for b in iter_batches(log.read(0, 1 << 20).records) for r in b.records()]


def copy_until(fetcher: ReplicaFetcher, follower: Log, leader: Log, timeout_s: float = 5.0) -> None:
    async def go():
        task = asyncio.get_running_loop().create_task(fetcher.run())
        deadline = asyncio.get_running_loop().time() + timeout_s
        while follower.log_end_offset != leader.log_end_offset or values(follower) != values(leader):
            assert asyncio.get_running_loop().time() < deadline, f"follower {values(follower)} != {values(leader)}"
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(go())


def leader_and_follower(tmp_path, leader_batches, follower_batches) -> tuple[Log, Log]:
    logs = []
    for name, batches in (("leader", leader_batches), ("follower", follower_batches)):
        log = Log(tmp_path / name / "t-0")
        for epoch, n, tag in batches:
            log.append_as_leader(batch(n, tag), epoch)
        logs.append(log)
    return logs[0], logs[1]


def test_offsets_for_leader_epoch_is_asked_again_until_answered_before_any_fetch(tmp_path):
    leader, follower = leader_and_follower(tmp_path, [(0, 4, "v"), (2, 2, "n")], [(0, 4, "v"), (1, 3, "div")])
    fake = FakeLeader(leader, unanswered_epoch_requests=3)
    fetcher = ReplicaFetcher(follower, "t-0", 2, fake, 2, ReplicaConfig(), lambda: None)
    copy_until(fetcher, follower, leader)
    assert len(fake.offsets_for_leader_epoch.calls) == 4
    assert values(follower) == [b"v0", b"v1", b"v2", b"v3", b"n0", b"n1"]


def test_a_diverging_epoch_in_a_fetch_answer_truncates_and_fetching_goes_on(tmp_path):
    leader, follower = leader_and_follower(tmp_path, [(0, 4, "v"), (2, 2, "n")], [(0, 4, "v"), (1, 3, "div")])
    fake = FakeLeader(leader)
    # A stale answer that lets the divergent epoch-1 records stand: only the fetch path can tell.
    fake.offsets_for_leader_epoch = Method(lambda epoch: (epoch, 7))
    fetcher = ReplicaFetcher(follower, "t-0", 2, fake, 2, ReplicaConfig(), lambda: None)
    copy_until(fetcher, follower, leader)
    assert any(request.last_fetched_epoch == 1 for (request,) in fake.fetch.calls), "divergence found on the fetch path"
    assert values(follower) == [b"v0", b"v1", b"v2", b"v3", b"n0", b"n1"]


def test_a_log_ending_inside_the_leaders_batch_takes_the_batch_whole(tmp_path):
    leader, follower = leader_and_follower(tmp_path, [(0, 6, "v")], [(0, 3, "v")])
    fetcher = ReplicaFetcher(follower, "t-0", 2, FakeLeader(leader), 0, ReplicaConfig(), lambda: None)
    copy_until(fetcher, follower, leader)
    assert values(follower) == [b"v0", b"v1", b"v2", b"v3", b"v4", b"v5"]


def test_a_cancelled_fetcher_closes_its_connection_to_the_leader(tmp_path):
    leader, follower = leader_and_follower(tmp_path, [(0, 2, "v")], [])
    fake = FakeLeader(leader)
    copy_until(ReplicaFetcher(follower, "t-0", 2, fake, 0, ReplicaConfig(), lambda: None), follower, leader)
    assert fake.closed == 1


def test_a_failing_fetch_call_is_retried(tmp_path):
    leader, follower = leader_and_follower(tmp_path, [(0, 3, "v")], [])
    fake = FakeLeader(leader)
    real_fetch, failures = fake._fetch, [ConnectionError("leader gone"), ConnectionError("still gone")]

    def flaky(*args, **kwargs):
        if failures:
            raise failures.pop()
        return real_fetch(*args, **kwargs)

    fake.fetch = Method(flaky)
    copy_until(ReplicaFetcher(follower, "t-0", 2, fake, 0, ReplicaConfig(), lambda: None), follower, leader)
    assert len(fake.fetch.calls) >= 3


def test_a_follower_that_led_an_epoch_without_appending_drops_it_and_catches_up(tmp_path):
    """Issue 66's stuck follower: broker B led epoch 1 and appended nothing (its cache ends
    with (1, LEO)); the old leader A leads again in epoch 2 and never had epoch 1. A answers
    OffsetsForLeaderEpoch(1) with the end of epoch 0, which is B's LEO: no record of B's goes,
    but its (1, LEO) must, else every fetch names epoch 1, A answers "diverging at epoch 0,
    LEO" and B never copies a record again (it fell out of the ISR for good)."""
    leader, follower = leader_and_follower(tmp_path, [(0, 4, "v")], [(0, 4, "v")])
    follower.assign_leader_epoch(1)  # B led epoch 1 and wrote nothing in it
    leader.assign_leader_epoch(2)
    leader.append_as_leader(batch(2, "n"), 2)
    fake = FakeLeader(leader)
    fetcher = ReplicaFetcher(follower, "t-0", 2, fake, 2, ReplicaConfig(), lambda: None)
    copy_until(fetcher, follower, leader)
    assert values(follower) == [b"v0", b"v1", b"v2", b"v3", b"n0", b"n1"]
    assert [(e.epoch, e.start_offset) for e in follower.leader_epoch_cache.entries] == [(0, 0), (2, 4)]


def test_a_follower_whose_disk_fails_an_append_ends_its_process_and_appends_nothing_more(tmp_path, monkeypatch):
    """A failed write leaves the log in memory unlike the one on disk: the replica's process
    ends (storage_failure.py) and its next life recovers the log from the disk; the fetcher
    does not go on appending over it, as it does after other errors."""
    import errno

    from rayk.replication import storage_failure

    ended = []
    monkeypatch.setattr(storage_failure, "end_process", lambda name, error: ended.append((name, error.errno)))
    leader, follower = leader_and_follower(tmp_path, [(0, 4, "v")], [])
    appends = []

    def failing_append(records: bytes) -> None:
        appends.append(records)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(follower, "append_as_follower", failing_append)
    fetcher = ReplicaFetcher(follower, "t-0", 2, FakeLeader(leader), 0, ReplicaConfig(), lambda: None)

    async def go() -> None:
        task = asyncio.get_running_loop().create_task(fetcher.run())
        while not ended:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # several fetch backoffs: no append comes after the failure
        task.cancel()

    asyncio.run(asyncio.wait_for(go(), 10))
    assert ended == [("t-0", errno.EIO)] and len(appends) == 1
