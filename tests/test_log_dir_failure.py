"""A log's disk failing a read or an fsync (Kafka's LogDirFailureChannel): what the replica
answers, that it never tries a failed fsync again, and how its broker's data directory
goes offline and comes back (rayk/server/log_dir_health.py); DescribeLogDirs' answer.

The same faults on a real failing device (a FUSE file system) under traffic are
tests/faults/test_disk_faults.py's, in `make chaos`.
"""

from __future__ import annotations

import asyncio
import errno
import os

import pytest

from rayk.errors import KafkaStorageError
from rayk.net.log_dir_apis import log_dir_result
from rayk.replication import storage_failure
from rayk.replication.partition_replica import PartitionReplica
from rayk.server import log_dir_health
from rayk.server.log_dir_health import LogDirHealth
from rayk.storage import Log
from rayk.storage.log_config import LogConfig
from rayk.storage.records import SimpleRecord, build_batch, iter_batches
from tests.transaction_fakes import Controller, Handle


def _eio(*args, **kwargs):
    raise OSError(errno.EIO, "Input/output error")


@pytest.fixture
def ended(monkeypatch) -> list[tuple[str, int]]:
    """The replica processes told to end (name, errno), instead of ending this one."""
    calls: list[tuple[str, int]] = []

    def end(name: str, error: BaseException) -> None:
        calls.append((name, getattr(error, "errno", None) or getattr(error.__cause__, "errno", None)))

    monkeypatch.setattr(storage_failure, "end_process", end)
    return calls


async def _leader(tmp_path, config: LogConfig | None = None) -> PartitionReplica:
    replica = PartitionReplica("t", 0, 0, tmp_path / "t-0", config, controller=Handle(Controller()))
    await replica.become_leader(1, [0], [0])
    return replica


def _records(replica: PartitionReplica) -> list[bytes | None]:
    data = replica._log.read(0, 1 << 20).records
    return [r.value for b in iter_batches(data) for r in b.records()]


def test_a_write_whose_fsync_fails_is_never_acknowledged_and_ends_the_replicas_process(tmp_path, monkeypatch, ended):
    """flush.messages=1: the fsync is part of the write. It fails: the write is answered
    KAFKA_STORAGE_ERROR (retriable), not acknowledged, and so is every later one."""

    async def main() -> None:
        replica = await _leader(tmp_path, LogConfig(flush_messages=1))
        assert (await replica.produce(build_batch([SimpleRecord(b"before")]), -1, 5_000)).error is None
        monkeypatch.setattr(os, "fsync", _eio)
        answers = [await replica.produce(build_batch([SimpleRecord(b"%d" % i)]), -1, 5_000) for i in range(2)]
        assert all(isinstance(a.error, KafkaStorageError) and a.error.retriable for a in answers), answers
        assert all(a.base_offset == -1 for a in answers), "nothing acknowledged at an offset"
        assert ended == [("t-0", errno.EIO)], "ended once, for the first failure"

    asyncio.run(main())


def test_a_failed_fsync_of_a_rolled_segment_is_reported_at_once_and_never_tried_again(tmp_path, monkeypatch):
    """The PostgreSQL lesson: after a failed fsync the kernel may have dropped the pages and
    marked them clean, so a second fsync would "succeed" over lost data."""
    failed: list[OSError] = []
    calls = []
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:  # the segments' fsyncs fail, the checkpoints' pass
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            return real_fsync(fd)
        calls.append(fd)
        _eio()

    log = Log(tmp_path / "t-0", LogConfig(segment_bytes=200), on_storage_error=failed.append)
    monkeypatch.setattr(os, "fsync", failing_fsync)
    for i in range(3):  # each batch is 170 bytes: two rolls
        try:
            log.append_as_leader(build_batch([SimpleRecord(b"x" * 100)]), 0)
        except KafkaStorageError:
            assert i > 1, "the first roll's fsync runs in the background"
    log._flusher.close()
    assert len(failed) == 1 and failed[0].errno == errno.EIO, failed
    fsyncs = len(calls)
    with pytest.raises(KafkaStorageError, match="fsync"):
        log.append_as_leader(build_batch([SimpleRecord(b"after")]), 0)
    assert len(calls) == fsyncs, "no fsync tried again"


def test_a_read_the_disk_fails_is_a_storage_error_and_ends_the_replicas_process(tmp_path, monkeypatch, ended):
    async def main() -> None:
        replica = await _leader(tmp_path)
        assert (await replica.produce(build_batch([SimpleRecord(b"v")]), -1, 5_000)).error is None
        monkeypatch.setattr(replica._log, "read", _eio)
        result = await replica.fetch(0, 1 << 20, max_wait_ms=0)
        assert isinstance(result.error, KafkaStorageError) and result.records == b"", result
        assert ended == [("t-0", errno.EIO)]

    asyncio.run(main())


def test_a_directory_whose_probe_fails_is_offline_until_a_probe_passes(tmp_path, monkeypatch):
    async def main() -> None:
        health = LogDirHealth(tmp_path, probe_interval_s=0.01)
        assert await health.check() and not health.offline
        assert not (tmp_path / log_dir_health.PROBE_FILE).exists(), "the probe leaves nothing behind"
        monkeypatch.setattr(os, "fsync", _eio)
        assert not await health.check()
        assert health.offline and "Input/output error" in health.error and health.offline_since_s is not None
        came_back = asyncio.Event()

        async def online() -> None:
            came_back.set()

        waiting = asyncio.create_task(health.wait_online(online))
        await asyncio.sleep(0.05)
        assert not came_back.is_set() and health.offline
        monkeypatch.undo()
        await asyncio.wait_for(waiting, 5)
        assert came_back.is_set() and not health.offline and health.error is None

    asyncio.run(main())


def test_a_probe_that_reads_back_other_bytes_fails(tmp_path, monkeypatch):
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: bytes(len(real_pread(fd, n, at))))
    error = log_dir_health.probe(tmp_path)
    assert error is not None and "differ" in str(error)


def test_describe_log_dirs_answers_an_offline_directory_with_a_storage_error_and_no_partitions():
    online = {"path": "/d/broker-1", "error": None, "total_bytes": 100, "usable_bytes": 40,
              "partitions": {("t", 1): 30, ("t", 0): 10, ("u", 0): 5}}  # fmt: skip
    result = log_dir_result(online, None)
    assert result["error_code"] == 0 and result["log_dir"] == "/d/broker-1"
    assert [(t["name"], [(p["partition_index"], p["partition_size"]) for p in t["partitions"]]) for t in result["topics"]] \
        == [("t", [(0, 10), (1, 30)]), ("u", [(0, 5)])]
    assert [t["name"] for t in log_dir_result(online, {("u", 0)})["topics"]] == ["u"]
    offline = log_dir_result({**online, "error": "[Errno 5] Input/output error", "partitions": {}}, None)
    assert offline["error_code"] == KafkaStorageError.code and offline["topics"] == []


# ---------------------------------------------------------------------------- a broker's directory offline, on a cluster


def test_a_broker_whose_directory_fails_its_probe_stops_its_replicas_and_starts_them_once_it_works(tmp_path):
    """A replica dies and its broker's probe of the directory fails (here the probe's file
    is a directory: every probe fails with EISDIR): every replica of the broker is stopped,
    leaves the ISRs and its leaderships, DescribeLogDirs says KAFKA_STORAGE_ERROR, writes go
    on through the other brokers; once a probe passes, the replicas come back and catch up."""
    import signal

    import ray
    from kafka.admin import KafkaAdminClient

    import rayk
    from tests.cluster_helpers import FAST_CONFIG, pid_of, produce_to_leader, read_from_leader, shared_local_ray, \
        wait_until  # fmt: skip

    shared_local_ray()
    c = rayk.start(brokers=3, data_dir=tmp_path, config=FAST_CONFIG, namespace="log-dir-failure")
    admin = None
    try:
        c.create_topic("d", num_partitions=3, replication_factor=3, config={"min.insync.replicas": "2"})
        for p in range(3):
            produce_to_leader(c, "d", p, [b"before-%d" % p])
        victim = ray.get(c.broker(0).replica_handles.remote())[("d", 0)]
        blocker = tmp_path / "broker-0" / log_dir_health.PROBE_FILE
        blocker.mkdir()
        os.kill(pid_of(victim), signal.SIGKILL)

        def offline() -> bool:
            parts = c.describe_topic("d")
            return all(0 not in p["isr"] and p["leader"] != 0 for p in parts) and \
                not ray.get(c.broker(0).replica_handles.remote())  # fmt: skip

        wait_until(offline, 60, "broker 0's replicas stopped, out of every ISR and leadership")
        described = c.admin().describe_log_dirs()
        assert sorted(described) == [0, 1, 2] and isinstance(described[0].error, KafkaStorageError), described
        assert described[0].replica_sizes == {} and described[0].path == str(tmp_path / "broker-0")
        assert described[1].error is None and len(described[1].replica_sizes) == 3
        admin = KafkaAdminClient(bootstrap_servers=c.bootstrap_servers)
        [answer] = admin.describe_log_dirs(brokers=[0])  # over the wire, as kafka-log-dirs.sh asks
        assert [(d["error_code"], d["log_dir"], d["topics"]) for d in answer["log_dirs"]] == \
            [(KafkaStorageError.code, str(tmp_path / "broker-0"), [])], answer  # fmt: skip
        for p in range(3):
            produce_to_leader(c, "d", p, [b"while-offline-%d" % p])

        blocker.rmdir()
        wait_until(lambda: all(sorted(p["isr"]) == [0, 1, 2] for p in c.describe_topic("d")), 90,
                   "broker 0 back in every ISR once its directory works")  # fmt: skip
        described = c.admin().describe_log_dirs([0])[0]
        assert described.error is None and sorted(described.replica_sizes) == [("d", 0), ("d", 1), ("d", 2)]
        [answer] = admin.describe_log_dirs(brokers=[0])
        [log_dir] = answer["log_dirs"]
        assert log_dir["error_code"] == 0 and log_dir["total_bytes"] > 0, answer
        assert any(t["name"] == "d" and len(t["partitions"]) == 3 for t in log_dir["topics"]), answer
        for p in range(3):
            values = [v for _, v in read_from_leader(c, "d", p, 2)]
            assert values == [b"before-%d" % p, b"while-offline-%d" % p], values
    finally:
        if admin is not None:
            admin.close()
        c.shutdown()
