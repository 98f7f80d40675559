"""Metadata snapshots: the file, when the log takes one, what it deletes, crash cuts, and
that a restored snapshot is the image a full replay builds."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rayk.acls import AclBinding, AclFilter
from rayk.metadata.cluster_metadata import ClusterMetadata
from rayk.errors import CorruptRecordError, UnsupportedVersionError
from rayk.metadata import snapshot
from rayk.metadata.log import TOPIC_PARTITION_DIR, MetadataLog
from rayk.metadata.records import ClusterIdRecord, MetadataRecord, TopicConfigsRecord
from rayk.metadata.snapshot import MetadataSnapshot
from rayk.quotas import QuotaEntity
from rayk.scram import ScramCredential
from rayk.storage.log import Log
from rayk.storage.records import SimpleRecord, build_batch
from tests.metadata_helpers import RECORDS, image_summary


# --- the file -------------------------------------------------------------------------


@given(st.lists(RECORDS, max_size=30), st.integers(0, 2**40), st.integers(0, 5))
def test_a_snapshot_file_reads_back_as_written(records, end_offset, epoch):
    end_offset += 1
    image = MetadataSnapshot(end_offset, epoch, end_offset - 1, -1, tuple(records))
    assert snapshot.from_bytes(snapshot.to_bytes(image)) == image


def test_a_large_snapshot_spans_batches():
    records = tuple(TopicConfigsRecord(f"t{i}", {"k": "v"}) for i in range(2 * snapshot.RECORDS_PER_BATCH + 5))
    image = MetadataSnapshot(10**6, 0, -1, -1, records)
    assert snapshot.from_bytes(snapshot.to_bytes(image)) == image


SMALL = MetadataSnapshot(7, 0, 3, 5, (ClusterIdRecord("c"), TopicConfigsRecord("t", {"a": "b"})))


@given(st.data())
def test_a_damaged_or_cut_snapshot_is_refused_or_reads_as_written(data):
    """Bytes no CRC covers (a batch's base offset and leader epoch) may change without
    changing what the snapshot says; any other damage, and any cut, is refused."""
    good = snapshot.to_bytes(SMALL)
    if data.draw(st.booleans(), "cut"):
        damaged = good[: data.draw(st.integers(0, len(good) - 1), "length")]
    else:
        position = data.draw(st.integers(0, len(good) - 1), "position")
        damaged = bytearray(good)
        damaged[position] ^= data.draw(st.integers(1, 255), "xor")
        damaged = bytes(damaged)
    try:
        assert snapshot.from_bytes(damaged) == SMALL
    except CorruptRecordError:
        pass


def test_a_snapshot_whose_name_disagrees_with_its_offset_is_refused(tmp_path: Path):
    path = snapshot.write(tmp_path, SMALL)
    wrong = path.rename(tmp_path / snapshot.file_name(8, 0))
    with pytest.raises(CorruptRecordError, match="end offset 7"):
        snapshot.read(wrong)


def test_snapshot_names_are_krafts():
    assert snapshot.file_name(1234, 0) == "00000000000000001234-0000000000.checkpoint"


# --- the metadata log's snapshots -----------------------------------------------------


class Controller:
    """What the Controller does with its metadata: plan, append, apply, snapshot when due."""

    def __init__(self, directory: Path, max_bytes: int = 1 << 30, interval_ms: int = 0, clock=None) -> None:
        kwargs = {} if clock is None else {"clock_ms": clock}
        self.log = MetadataLog(directory, max_bytes, interval_ms, **kwargs)
        self.meta = ClusterMetadata()
        self.meta.load(self.log)
        if self.meta.cluster_id is None:
            self.commit([ClusterIdRecord("cluster")])

    def commit(self, records: list[MetadataRecord]) -> None:
        if records:
            first = self.log.append(records)
            for i, record in enumerate(records):
                self.meta.apply(record, first + i)

    def snapshot(self) -> Path:
        return self.log.write_snapshot(self.meta.snapshot())

    def changes(self, n: int, prefix: str = "t") -> None:
        """`n` changes of one record of ~150 bytes each (ACLs on long topic names)."""
        for i in range(n):
            name = f"{prefix}{i}-" + "x" * 100
            self.commit(self.meta.acl.plan_create_acls([AclBinding(2, name, 3, "User:alice", "*", 2, 3)])[0])

    def close(self) -> None:
        self.log.close()


def setup_cluster(c: Controller) -> None:
    for broker_id, node in [(1, "a"), (2, "b"), (3, "c")]:
        c.commit(c.meta.plan_register_broker(broker_id, node, f"inc-{broker_id}", f"dir-{broker_id}"))
        c.meta.attached.add(broker_id)


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in (directory / TOPIC_PARTITION_DIR).iterdir()
                  if p.name.endswith((".log", ".checkpoint")) or ".checkpoint." in p.name)


def reopened(directory: Path) -> ClusterMetadata:
    c = Controller(directory)
    c.close()
    return c.meta


def test_a_start_restores_the_newest_snapshot_and_replays_only_what_follows_it(tmp_path: Path):
    c = Controller(tmp_path)
    setup_cluster(c)
    c.commit(c.meta.replication.plan_create_topic("orders", 3, 3, {}, "orders-id"))
    c.snapshot()
    c.commit(c.meta.configs.plan_alter_topic_configs("orders", {"retention.ms": "5"}))
    c.close()
    log = MetadataLog(tmp_path)
    image, after = log.load()
    assert image is not None and image.end_offset == c.meta.last_offset
    assert [offset for offset, _ in after] == [c.meta.last_offset]
    log.close()
    assert image_summary(reopened(tmp_path)) == image_summary(c.meta)


def test_the_log_keeps_two_snapshots_and_the_segments_from_the_older_one_on(tmp_path: Path):
    c = Controller(tmp_path)
    ends = []
    for round_ in range(4):
        c.changes(5, prefix=f"r{round_}-")
        c.snapshot()
        ends.append(c.meta.last_offset + 1)
    c.close()
    assert files(tmp_path) == sorted([
        f"{ends[2]:020d}.log", f"{ends[3]:020d}.log",
        snapshot.file_name(ends[2], 0), snapshot.file_name(ends[3], 0),
    ])
    assert image_summary(reopened(tmp_path)) == image_summary(c.meta)


def test_an_unreadable_newest_snapshot_is_set_aside_for_the_one_before_it_and_nothing_is_lost(tmp_path: Path):
    c = Controller(tmp_path)
    setup_cluster(c)
    for round_ in range(3):
        c.commit(c.meta.replication.plan_create_topic(f"topic{round_}", 2, 2, {}, f"id-{round_}"))
        newest = c.snapshot()
    c.commit(c.meta.configs.plan_alter_topic_configs("topic0", {"retention.ms": "5"}))
    c.close()
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x40
    newest.write_bytes(bytes(data))

    assert image_summary(reopened(tmp_path)) == image_summary(c.meta)
    assert newest.with_name(newest.name + ".corrupt").exists() and not newest.exists()


def test_without_a_readable_snapshot_for_the_deleted_records_the_start_fails_loudly(tmp_path: Path):
    c = Controller(tmp_path)
    for round_ in range(3):
        c.changes(3, prefix=f"r{round_}-")
        c.snapshot()
    c.close()
    for _, path in snapshot.snapshot_paths(tmp_path / TOPIC_PARTITION_DIR):
        path.write_bytes(b"garbage")
    log = MetadataLog(tmp_path)
    with pytest.raises(Exception, match="no readable snapshot covers the records before it"):
        log.load()
    log.close()


@pytest.mark.parametrize(
    "snapshot_version, newer, error",
    [(1, {"type": "cluster", "version": 99, "cluster_id": "cluster", "region": "eu"}, "version 99"),
     (1, {"type": "tiered_segment", "segment": 7}, "unknown metadata record kind 'tiered_segment'"),
     (2, {"type": "cluster", "cluster_id": "cluster"}, "snapshot version 2")],
    ids=["a newer record version", "a record kind added later", "a newer snapshot version"],
)  # fmt: skip
def test_a_snapshot_from_a_newer_rayk_stops_the_start_and_is_kept(tmp_path: Path, snapshot_version, newer, error):
    """A downgrade: refusing to start is right; setting the snapshot aside as corrupt is not
    (the newer rayk, started again, would then find no snapshot of its own)."""
    c = Controller(tmp_path)
    c.changes(2)
    c.close()
    end = c.meta.last_offset + 1
    header = {"snapshot_version": snapshot_version, "end_offset": end, "epoch": 0, "acl_version": -1,
              "quota_version": -1, "record_count": 1}  # fmt: skip
    path = tmp_path / TOPIC_PARTITION_DIR / snapshot.file_name(end, 0)
    path.write_bytes(build_batch([SimpleRecord(msgpack.packb(header))])
                     + build_batch([SimpleRecord(msgpack.packb(newer))], base_offset=1))
    log = MetadataLog(tmp_path)
    with pytest.raises(UnsupportedVersionError, match=error):
        log.load()
    log.close()
    assert path.exists() and not list(path.parent.glob("*.corrupt"))


def test_a_leftover_temporary_snapshot_is_deleted_and_never_read(tmp_path: Path):
    c = Controller(tmp_path)
    c.changes(2)
    c.close()
    leftover = tmp_path / TOPIC_PARTITION_DIR / (snapshot.file_name(3, 0) + ".tmp")
    leftover.write_bytes(b"half a snapsh")
    assert image_summary(reopened(tmp_path)) == image_summary(c.meta)
    assert not leftover.exists()


def test_a_snapshot_is_due_after_enough_bytes_or_time_and_only_if_records_came(tmp_path: Path):
    now = [0]
    c = Controller(tmp_path, max_bytes=2_000, interval_ms=60_000, clock=lambda: now[0])
    assert c.log.snapshot_due() is False
    c.changes(3, "a")  # ~450 bytes
    assert c.log.snapshot_due() is False
    c.changes(20, "b")
    assert c.log.snapshot_due() is True, "more than max bytes since the last snapshot"
    c.snapshot()
    assert c.log.snapshot_due() is False
    now[0] += 60_000
    assert c.log.snapshot_due() is False, "nothing appended since the last snapshot"
    c.changes(1, "c")
    assert c.log.snapshot_due() is True, "the interval passed and a record came"
    c.close()


def test_an_interval_of_0_snapshots_by_bytes_only(tmp_path: Path):
    now = [0]
    c = Controller(tmp_path, max_bytes=1 << 20, interval_ms=0, clock=lambda: now[0])
    c.changes(1)
    now[0] += 10**9
    assert c.log.snapshot_due() is False
    c.close()


def test_bytes_since_the_last_snapshot_count_the_records_replayed_at_a_start(tmp_path: Path):
    c = Controller(tmp_path, max_bytes=4_000)
    c.snapshot()
    c.changes(15)
    c.close()
    again = Controller(tmp_path, max_bytes=4_000)
    assert again.log.snapshot_due() is False
    again.changes(10, "more")
    assert again.log.snapshot_due() is True
    again.close()


# --- crash cuts ---------------------------------------------------------------------


class Crash(BaseException):
    """The process died here (a BaseException, so no `except Exception` tidies up)."""


class CrashAt:
    """Counts the file-system and log steps a snapshot takes; the `at`-th one crashes,
    leaving a torn temporary file if it was the rename that makes a snapshot visible."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: int | None) -> None:
        self.at, self.count = at, 0
        self.thread = threading.get_ident()  # the Controller's; not the log's segment flusher
        for owner, name in [(os, "replace"), (os, "fsync"), (os, "remove"), (Path, "unlink"), (Path, "rename"),
                            (Log, "roll"), (Log, "maybe_increment_log_start_offset"),
                            (Log, "delete_expired_segments")]:
            monkeypatch.setattr(owner, name, self.wrap(getattr(owner, name), name))

    def wrap(self, original, name):
        def step(*args, **kwargs):
            if threading.get_ident() != self.thread:
                return original(*args, **kwargs)
            if self.count == self.at:
                self.count += 1
                if name == "replace" and str(args[0]).endswith(".checkpoint.tmp"):
                    torn = Path(args[0])
                    torn.write_bytes(torn.read_bytes()[: max(1, torn.stat().st_size // 2)])
                raise Crash(name)
            self.count += 1
            return original(*args, **kwargs)

        return step


def history(c: Controller, changes: list[int]) -> None:
    """Changes of the given sizes, with a snapshot after every second one."""
    setup_cluster(c)
    for i, size in enumerate(changes):
        c.commit(c.meta.replication.plan_create_topic(f"topic{i}", size, 2, {}, f"id-{i}"))
        if i % 2:
            c.snapshot()
    c.commit(c.meta.configs.plan_alter_topic_configs("topic0", {"retention.ms": "5"}))


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 4), min_size=2, max_size=6))
def test_a_crash_at_any_step_of_a_snapshot_loses_nothing(monkeypatch, changes):
    base = Path(tempfile.mkdtemp(prefix="crash-cut-"))
    try:
        with monkeypatch.context() as m:  # how many steps a snapshot takes here
            c = Controller(base / "count")
            history(c, changes)
            counter = CrashAt(m, None)
            c.snapshot()
            steps = counter.count
        c.close()
        assert steps >= 6
        for at in range(steps):
            directory = base / f"cut-{at}"
            c = Controller(directory)
            history(c, changes)
            expected = image_summary(c.meta)
            with monkeypatch.context() as m:
                CrashAt(m, at)
                with pytest.raises(Crash):
                    c.snapshot()
            c.close()
            damaged = base / f"cut-{at}-damaged"  # and then the newest snapshot is lost too
            shutil.copytree(directory, damaged)
            kept = snapshot.snapshot_paths(damaged / TOPIC_PARTITION_DIR)
            kept[-1][1].write_bytes(b"")
            assert image_summary(reopened(damaged)) == expected, f"crash at step {at}, newest snapshot lost"
            again = Controller(directory)
            assert image_summary(again.meta) == expected, f"crash at step {at} of {steps}"
            again.commit(again.meta.replication.plan_create_topic("after-crash", 1, 1, {}, "id-after"))
            again.snapshot()
            expected = image_summary(again.meta)
            again.close()
            assert image_summary(reopened(directory)) == expected, f"after a crash at step {at}, a snapshot"
    finally:
        shutil.rmtree(base)


# --- snapshots and replays build the same image ----------------------------------------


ALICE_CREDENTIAL = ScramCredential("SCRAM-SHA-256", b"salt", b"s" * 32, b"k" * 32, 4096)


class SnapshotMachine(RuleBasedStateMachine):
    """Every kind of metadata change, snapshots at random points and restarts, on disk.
    The image a start restores (newest snapshot plus the records after it) is always the
    one a replay of every record ever appended builds, and the one in memory."""

    @initialize()
    def start(self):
        self.dir = Path(tempfile.mkdtemp(prefix="snapshot-machine-"))
        self.c = Controller(self.dir)
        self.appended: list[tuple[int, MetadataRecord]] = [(0, ClusterIdRecord("cluster"))]
        self.topics = 0

    def teardown(self):
        if hasattr(self, "c"):
            self.c.close()
            shutil.rmtree(self.dir)

    def commit(self, records: list[MetadataRecord]) -> None:
        first = self.c.meta.last_offset + 1
        self.c.commit(records)
        self.appended += [(first + i, r) for i, r in enumerate(records)]

    @rule(broker=st.integers(1, 4))
    def register(self, broker):
        self.commit(self.c.meta.plan_register_broker(broker, f"node-{broker % 3}", f"inc-{self.c.meta.last_offset}"))
        self.c.meta.attached.add(broker)

    @rule(broker=st.integers(1, 4))
    def fence(self, broker):
        self.commit(self.c.meta.plan_fence_broker(broker))
        self.c.meta.attached.discard(broker)

    @precondition(lambda self: len(self.c.meta.live_brokers) >= 2)
    @rule(partitions=st.integers(1, 3))
    def create_topic(self, partitions):
        self.topics += 1
        self.commit(self.c.meta.replication.plan_create_topic(f"t{self.topics}", partitions, 2, {}, f"id-{self.topics}"))

    @precondition(lambda self: self.c.meta.topics)
    @rule(data=st.data())
    def shrink_isr(self, data):
        name, p, s = data.draw(st.sampled_from(self.c.meta.all_partitions()))
        if s.leader >= 0 and len(s.isr) > 1:
            self.commit(self.c.meta.replication.plan_alter_partition(name, p, s.leader, s.leader_epoch, s.partition_epoch,
                                                         [s.leader]))

    @precondition(lambda self: self.c.meta.topics)
    @rule(data=st.data())
    def delete_topic(self, data):
        self.commit(self.c.meta.replication.plan_delete_topic(data.draw(st.sampled_from(sorted(self.c.meta.topics)))))

    @rule(user=st.sampled_from(["alice", "bob"]), operation=st.integers(2, 4))
    def create_acl(self, user, operation):
        records, _ = self.c.meta.acl.plan_create_acls([AclBinding(2, "t", 3, f"User:{user}", "*", operation, 3)])
        self.commit(records)

    @rule(user=st.sampled_from(["alice", "bob"]))
    def delete_acls(self, user):
        self.commit(self.c.meta.acl.plan_delete_acls([AclFilter(principal=f"User:{user}")])[0])

    @rule(user=st.sampled_from(["alice", "bob"]), delete=st.booleans())
    def alter_scram(self, user, delete):
        held = ALICE_CREDENTIAL.mechanism in self.c.meta.scram.credentials.get(user, {})
        ops = ([(user, ALICE_CREDENTIAL.mechanism)], []) if delete and held else ([], [(user, ALICE_CREDENTIAL)])
        self.commit(self.c.meta.scram.plan_alter(*ops)[0])

    @rule(user=st.sampled_from(["alice", "bob"]), value=st.none() | st.floats(1, 1e9))
    def alter_quota(self, user, value):
        self.commit(self.c.meta.quotas.plan_alter([(QuotaEntity(user), [("producer_byte_rate", value)])])[0])

    @rule(count=st.integers(1, 5000))
    def producer_ids(self, count):
        self.commit(self.c.meta.producer_ids.plan_allocate(count)[0])

    @rule()
    def snapshot(self):
        self.c.snapshot()

    @rule()
    def restart(self):
        before = image_summary(self.c.meta)
        self.c.close()
        self.c = Controller(self.dir)
        assert image_summary(self.c.meta) == before

    @invariant()
    def restored_snapshot_and_full_replay_build_the_same_image(self):
        if not hasattr(self, "c"):
            return
        image = image_summary(self.c.meta)
        replayed = ClusterMetadata()
        for offset, record in self.appended:
            replayed.apply(record, offset)
        assert image_summary(replayed) == image
        restored = ClusterMetadata()
        restored.restore(snapshot.from_bytes(snapshot.to_bytes(self.c.meta.snapshot())))
        assert image_summary(restored) == image


SnapshotMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_snapshot_state_machine = SnapshotMachine.TestCase
