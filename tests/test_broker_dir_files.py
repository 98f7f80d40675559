"""The small files of a broker data directory: meta.properties, partition.metadata,
checkpoints, the clean-shutdown marker."""

from __future__ import annotations

from pathlib import Path

import base64
import os
import stat
import uuid

import pytest

from rayk.errors import InconsistentClusterIdError, KafkaStorageError
from rayk.storage import clean_shutdown, meta_properties, partition_metadata
from rayk.storage.checkpoint import OffsetCheckpointFile
from rayk.storage.log_dir_checkpoints import LogDirCheckpoints, PartitionOffsets
from rayk.storage.meta_properties import MetaProperties

ME = MetaProperties("cluster-A", 3)


# --- meta.properties ----------------------------------------------------------------


def test_ensure_formats_meta_properties_in_kafkas_format_with_a_new_directory_id(tmp_path: Path):
    result = meta_properties.ensure(tmp_path, ME)
    assert result.formatted is True
    meta = result.meta
    assert (meta.cluster_id, meta.node_id) == ("cluster-A", 3)
    text = (tmp_path / "meta.properties").read_text("utf-8")
    assert text == (
        f"#rayk meta.properties\ncluster.id=cluster-A\ndirectory.id={meta.directory_id}\nnode.id=3\nversion=1\n"
    )
    assert not (tmp_path / "meta.properties.tmp").exists()
    assert meta_properties.read(tmp_path) == meta


def test_directory_ids_are_random_uuids_in_kafkas_url_safe_base64(tmp_path: Path):
    ids = {meta_properties.ensure(tmp_path / f"d{i}", ME).meta.directory_id for i in range(20)}
    assert len(ids) == 20
    for directory_id in ids:
        assert len(directory_id) == 22 and not directory_id.startswith("-")
        raw = base64.urlsafe_b64decode(directory_id + "==")
        assert uuid.UUID(bytes=raw).version == 4
        assert base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == directory_id


def test_ensure_formats_with_the_callers_directory_id_if_given(tmp_path: Path):
    given = MetaProperties("cluster-A", 3, "rJy3cB9aQ1q7dE5fG6hI8w")
    assert meta_properties.ensure(tmp_path, given).meta == given
    with pytest.raises(ValueError):
        meta_properties.ensure(tmp_path / "other", MetaProperties("cluster-A", 3, "not-an-id"))
    assert not (tmp_path / "other" / "meta.properties").exists()


def test_ensure_creates_a_missing_directory(tmp_path: Path):
    directory = tmp_path / "a" / "b"
    result = meta_properties.ensure(directory, ME)
    assert meta_properties.read(directory) == result.meta


def test_read_of_an_unformatted_directory_is_none(tmp_path: Path):
    assert meta_properties.read(tmp_path) is None


def test_ensure_is_idempotent_and_leaves_the_file_as_it_was(tmp_path: Path):
    first = meta_properties.ensure(tmp_path, ME).meta
    path = tmp_path / "meta.properties"
    before = (path.read_bytes(), path.stat().st_mtime_ns, path.stat().st_ino)
    again = meta_properties.ensure(tmp_path, MetaProperties("cluster-A", 3))
    assert (again.meta, again.formatted) == (first, False)
    assert (path.read_bytes(), path.stat().st_mtime_ns, path.stat().st_ino) == before


def test_ensure_does_not_compare_the_directory_id(tmp_path: Path):
    first = meta_properties.ensure(tmp_path, ME).meta
    other_id = MetaProperties("cluster-A", 3, meta_properties.new_directory_id())
    assert meta_properties.ensure(tmp_path, other_id).meta == first


def test_a_meta_properties_from_an_older_rayk_gets_a_directory_id(tmp_path: Path):
    old_text = "#rayk meta.properties\ncluster.id=cluster-A\nnode.id=3\nversion=1\n"
    (tmp_path / "meta.properties").write_text(old_text)
    assert meta_properties.read(tmp_path) == MetaProperties("cluster-A", 3, None)
    result = meta_properties.ensure(tmp_path, ME)
    assert result.formatted is False, "it held data: not formatted now"
    assert result.meta.directory_id is not None
    assert meta_properties.read(tmp_path) == result.meta
    assert not (tmp_path / "meta.properties.tmp").exists()
    assert meta_properties.ensure(tmp_path, ME).meta == result.meta, "and keeps it from then on"


@pytest.mark.parametrize("other", [MetaProperties("cluster-A", 4), MetaProperties("cluster-B", 3)])
def test_ensure_for_another_broker_or_cluster_raises_and_leaves_the_file_unchanged(tmp_path: Path, other):
    meta_properties.ensure(tmp_path, ME)
    before = (tmp_path / "meta.properties").read_bytes()
    with pytest.raises(InconsistentClusterIdError):
        meta_properties.ensure(tmp_path, other)
    assert (tmp_path / "meta.properties").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.properties"]


def test_an_older_file_of_another_broker_is_refused_without_adding_a_directory_id(tmp_path: Path):
    old_text = "cluster.id=cluster-A\nnode.id=4\nversion=1\n"
    (tmp_path / "meta.properties").write_text(old_text)
    with pytest.raises(InconsistentClusterIdError):
        meta_properties.ensure(tmp_path, ME)
    assert (tmp_path / "meta.properties").read_text() == old_text


def test_inconsistent_cluster_id_is_a_non_retriable_storage_error_with_kafkas_code():
    assert issubclass(InconsistentClusterIdError, KafkaStorageError)
    assert (InconsistentClusterIdError.code, InconsistentClusterIdError.retriable) == (104, False)


def test_read_accepts_comments_blank_lines_and_spaces_around_keys(tmp_path: Path):
    (tmp_path / "meta.properties").write_text("# a comment\n! another\n\n node.id = 7\ncluster.id=c\nversion=1\n")
    assert meta_properties.read(tmp_path) == MetaProperties("c", 7)


@pytest.mark.parametrize(
    "text",
    [
        "cluster.id=c\nnode.id=3\nversion=1\ngarbage line\n",  # not key=value
        "node.id=3\nversion=1\n",  # no cluster.id
        "cluster.id=c\nversion=1\n",  # no node.id
        "cluster.id=c\nnode.id=3\n",  # no version
        "cluster.id=c\nnode.id=three\nversion=1\n",  # node.id not a number
        "cluster.id=c\nnode.id=3\nversion=2\n",  # unknown version
        "cluster.id=c\nnode.id=3\nversion=one\n",
        "",
        "cluster.id=c\ndirectory.id=short\nnode.id=3\nversion=1\n",
        "cluster.id=c\ndirectory.id=AAAAAAAAAAAAAAAAAAAAA+\nnode.id=3\nversion=1\n",  # not URL-safe
        "cluster.id=c\ndirectory.id=AAAAAAAAAAAAAAAAAAAAAB\nnode.id=3\nversion=1\n",  # not canonical
        "cluster.id=c\ndirectory.id=AAAAAAAAAAAAAAAAAAAAAA\nnode.id=3\nversion=1\n",  # reserved: UNASSIGNED
        "cluster.id=c\ndirectory.id=AAAAAAAAAAAAAAAAAAAAAQ\nnode.id=3\nversion=1\n",  # reserved: LOST
    ],
)
def test_malformed_meta_properties_raises_storage_error(tmp_path: Path, text):
    (tmp_path / "meta.properties").write_text(text)
    with pytest.raises(KafkaStorageError) as info:
        meta_properties.read(tmp_path)
    assert type(info.value) is KafkaStorageError
    with pytest.raises(KafkaStorageError):
        meta_properties.ensure(tmp_path, ME)
    assert (tmp_path / "meta.properties").read_text() == text


# --- partition.metadata -------------------------------------------------------------


def test_partition_metadata_round_trips_the_topic_id(tmp_path: Path):
    partition_metadata.write(tmp_path / "orders-0", "AAAAAAAAAAAAAAAAAAAAAA")
    assert partition_metadata.read(tmp_path / "orders-0") == "AAAAAAAAAAAAAAAAAAAAAA"
    assert (tmp_path / "orders-0" / "partition.metadata").read_text() == "version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n"


def test_partition_metadata_write_replaces_the_old_id(tmp_path: Path):
    partition_metadata.write(tmp_path, "old")
    partition_metadata.write(tmp_path, "new")
    assert partition_metadata.read(tmp_path) == "new"
    assert not (tmp_path / "partition.metadata.tmp").exists()


def test_missing_partition_metadata_reads_as_none(tmp_path: Path):
    assert partition_metadata.read(tmp_path) is None
    assert partition_metadata.read(tmp_path / "no-such-dir") is None


@pytest.mark.parametrize(
    "text",
    ["", "version: 1\ntopic_id: x\n", "version: 0\n", "topic_id: x\n", "version=0\ntopic_id=x\n"],
)
def test_malformed_partition_metadata_raises_storage_error(tmp_path: Path, text):
    (tmp_path / "partition.metadata").write_text(text)
    with pytest.raises(KafkaStorageError):
        partition_metadata.read(tmp_path)


# --- LogDirCheckpoints --------------------------------------------------------------


def test_checkpoints_written_are_read_back_by_a_new_instance(tmp_path: Path):
    LogDirCheckpoints(tmp_path).write(
        {("a", 0): PartitionOffsets(10, 2, 8), ("b", 3): PartitionOffsets(0, 0, 0)}
    )
    again = LogDirCheckpoints(tmp_path)
    assert again.offsets(("a", 0)) == PartitionOffsets(10, 2, 8)
    assert again.offsets(("b", 3)) == PartitionOffsets(0, 0, 0)


def test_checkpoints_go_to_kafkas_four_files(tmp_path: Path):
    LogDirCheckpoints(tmp_path).write({("a", 0): PartitionOffsets(10, 2, 8, 6), ("b", 0): PartitionOffsets(1, 0, 1)})
    assert OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint").read() == {("a", 0): 10, ("b", 0): 1}
    assert OffsetCheckpointFile(tmp_path / "log-start-offset-checkpoint").read() == {("a", 0): 2, ("b", 0): 0}
    assert OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint").read() == {("a", 0): 8, ("b", 0): 1}
    assert OffsetCheckpointFile(tmp_path / "cleaner-offset-checkpoint").read() == {("a", 0): 6}, "compacted logs only"
    assert LogDirCheckpoints(tmp_path).offsets(("a", 0)).cleaner_offset == 6


def _inodes(data_dir: Path) -> dict[str, int]:
    names = ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint", "replication-offset-checkpoint",
             "cleaner-offset-checkpoint")  # fmt: skip
    return {name: (data_dir / name).stat().st_ino for name in names}


def test_a_checkpoint_rewrites_only_the_files_whose_offsets_changed(tmp_path: Path):
    """A broker checkpoints on a timer, moved or not: an unchanged file is not written again
    (each write is a new file renamed over the old, so a rewrite shows as a new inode)."""
    cps = LogDirCheckpoints(tmp_path)
    cps.write({("a", 0): PartitionOffsets(10, 2, 8)})
    first = _inodes(tmp_path)
    cps.write({("a", 0): PartitionOffsets(10, 2, 8)})
    assert _inodes(tmp_path) == first, "nothing changed: nothing rewritten"
    cps.write({("a", 0): PartitionOffsets(10, 2, 9)})  # the high watermark moved
    after = _inodes(tmp_path)
    assert {name for name in first if after[name] != first[name]} == {"replication-offset-checkpoint"}
    assert LogDirCheckpoints(tmp_path).offsets(("a", 0)) == PartitionOffsets(10, 2, 9)


def test_the_first_checkpoint_of_an_instance_writes_every_file_even_unchanged(tmp_path: Path):
    LogDirCheckpoints(tmp_path).write({})
    assert all(inode > 0 for inode in _inodes(tmp_path).values()), "all four files exist, empty"
    LogDirCheckpoints(tmp_path).write({("a", 0): PartitionOffsets(1, 0, 1)})
    before = _inodes(tmp_path)
    LogDirCheckpoints(tmp_path).write({})  # a new broker process: what it read is written once
    assert all(inode != before[name] for name, inode in _inodes(tmp_path).items())


def test_a_removed_partition_leaves_the_files_at_the_next_checkpoint(tmp_path: Path):
    cps = LogDirCheckpoints(tmp_path)
    cps.write({("a", 0): PartitionOffsets(10, 2, 8, 6), ("b", 0): PartitionOffsets(1, 0, 1)})
    cps.remove(("a", 0))
    cps.write({})
    assert LogDirCheckpoints(tmp_path).offsets(("a", 0)) == PartitionOffsets(None, None, None)
    assert OffsetCheckpointFile(tmp_path / "cleaner-offset-checkpoint").read() == {}
    assert LogDirCheckpoints(tmp_path).offsets(("b", 0)) == PartitionOffsets(1, 0, 1)


def test_unknown_partition_has_no_offsets(tmp_path: Path):
    assert LogDirCheckpoints(tmp_path).offsets(("a", 0)) == PartitionOffsets(None, None, None)


def test_partitions_not_passed_to_write_keep_their_previous_offsets(tmp_path: Path):
    cps = LogDirCheckpoints(tmp_path)
    cps.write({("a", 0): PartitionOffsets(10, 2, 8), ("b", 0): PartitionOffsets(5, 1, 4)})
    cps.write({("a", 0): PartitionOffsets(20, 3, 18)})
    again = LogDirCheckpoints(tmp_path)
    assert again.offsets(("a", 0)) == PartitionOffsets(20, 3, 18)
    assert again.offsets(("b", 0)) == PartitionOffsets(5, 1, 4)


def test_partitions_written_by_an_earlier_instance_survive_a_write_that_omits_them(tmp_path: Path):
    LogDirCheckpoints(tmp_path).write({("b", 0): PartitionOffsets(5, 1, 4)})
    LogDirCheckpoints(tmp_path).write({("a", 0): PartitionOffsets(1, 0, 1)})
    assert LogDirCheckpoints(tmp_path).offsets(("b", 0)) == PartitionOffsets(5, 1, 4)


def test_remove_forgets_one_partition_at_the_next_write(tmp_path: Path):
    cps = LogDirCheckpoints(tmp_path)
    cps.write({("a", 0): PartitionOffsets(10, 2, 8), ("a", 1): PartitionOffsets(5, 1, 4)})
    cps.remove(("a", 0))
    assert cps.offsets(("a", 0)) == PartitionOffsets(None, None, None)
    cps.write({})
    again = LogDirCheckpoints(tmp_path)
    assert again.offsets(("a", 0)) == PartitionOffsets(None, None, None)
    assert again.offsets(("a", 1)) == PartitionOffsets(5, 1, 4)


def test_remove_of_an_unknown_partition_is_harmless(tmp_path: Path):
    cps = LogDirCheckpoints(tmp_path)
    cps.remove(("nope", 0))
    cps.write({})
    assert OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint").read() == {}


def test_none_offsets_are_not_written(tmp_path: Path):
    LogDirCheckpoints(tmp_path).write({("a", 0): PartitionOffsets(recovery_point=7)})
    assert OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint").read() == {("a", 0): 7}
    assert OffsetCheckpointFile(tmp_path / "log-start-offset-checkpoint").read() == {}
    assert OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint").read() == {}
    assert LogDirCheckpoints(tmp_path).offsets(("a", 0)) == PartitionOffsets(7, None, None)


def test_none_offsets_keep_the_previously_checkpointed_value(tmp_path: Path):
    cps = LogDirCheckpoints(tmp_path)
    cps.write({("a", 0): PartitionOffsets(10, 2, 8)})
    cps.write({("a", 0): PartitionOffsets(recovery_point=None, log_start_offset=5, high_watermark=None)})
    assert LogDirCheckpoints(tmp_path).offsets(("a", 0)) == PartitionOffsets(10, 5, 8)


def test_partition_metadata_with_an_empty_topic_id_is_malformed(tmp_path):
    (tmp_path / partition_metadata.FILE_NAME).write_text("version: 0\ntopic_id: \n")
    with pytest.raises(KafkaStorageError):
        partition_metadata.read(tmp_path)


# --- .kafka_cleanshutdown (KIP-966) --------------------------------------------------


def test_clean_shutdown_marker_is_kip_966_json_written_atomically(tmp_path: Path):
    clean_shutdown.write(tmp_path, 42)
    assert (tmp_path / ".kafka_cleanshutdown").read_bytes() == b'{"version":0,"brokerEpoch":42}'
    assert not (tmp_path / ".kafka_cleanshutdown.tmp").exists()
    clean_shutdown.write(tmp_path)
    assert (tmp_path / ".kafka_cleanshutdown").read_bytes() == b'{"version":0,"brokerEpoch":-1}'


def test_clean_shutdown_marker_refuses_an_impossible_broker_epoch(tmp_path: Path):
    with pytest.raises(ValueError):
        clean_shutdown.write(tmp_path, -2)
    assert not (tmp_path / ".kafka_cleanshutdown").exists()


def test_consume_returns_the_marker_once_and_deletes_it(tmp_path: Path):
    clean_shutdown.write(tmp_path, 7)
    assert clean_shutdown.consume(tmp_path) == clean_shutdown.CleanShutdown(7)
    assert not (tmp_path / ".kafka_cleanshutdown").exists()
    assert clean_shutdown.consume(tmp_path) is None, "a crash after this start reads as unclean"


def test_consume_without_a_marker_or_a_directory_is_an_unclean_shutdown(tmp_path: Path):
    assert clean_shutdown.consume(tmp_path) is None
    assert clean_shutdown.consume(tmp_path / "never-made") is None


def test_consume_fsyncs_the_directory_after_deleting_the_marker(tmp_path: Path, monkeypatch):
    clean_shutdown.write(tmp_path, 1)
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append((stat.S_ISDIR(os.fstat(fd).st_mode), (tmp_path / ".kafka_cleanshutdown").exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    clean_shutdown.consume(tmp_path)
    assert synced == [(True, False)], "one fsync, of the directory, after the unlink"


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[0, 1]",
        b'{"version":1,"brokerEpoch":3}',
        b'{"version":"0","brokerEpoch":3}',
        b'{"version":true,"brokerEpoch":3}',
        b'{"brokerEpoch":3}',
        b'{"version":0}',
        b'{"version":0,"brokerEpoch":"3"}',
        b'{"version":0,"brokerEpoch":3.5}',
        b'{"version":0,"brokerEpoch":-2}',
        b'{"version":0,"brokerEpoch":3',
    ],
)
def test_a_marker_that_does_not_parse_is_an_unclean_shutdown_and_is_deleted(tmp_path: Path, content, caplog):
    (tmp_path / ".kafka_cleanshutdown").write_bytes(content)
    assert clean_shutdown.consume(tmp_path) is None
    assert not (tmp_path / ".kafka_cleanshutdown").exists()
    assert "unclean" in caplog.text


def test_a_marker_that_cannot_be_deleted_is_a_storage_error_not_a_clean_shutdown(tmp_path: Path, monkeypatch):
    clean_shutdown.write(tmp_path, 5)

    def failing_unlink(self, missing_ok=False):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(Path, "unlink", failing_unlink)
    with pytest.raises(KafkaStorageError):
        clean_shutdown.consume(tmp_path)
