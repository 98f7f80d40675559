"""Metadata records: typed and versioned, stored and read back, older ones upgraded in place."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import msgpack
import pytest
from hypothesis import given

from rayk.metadata.cluster_metadata import ClusterMetadata
from rayk.errors import CorruptRecordError, UnsupportedVersionError
from rayk.metadata import records as r
from rayk.metadata.log import TOPIC_PARTITION_DIR, MetadataLog
from rayk.metadata.records import RECORD_KINDS, pack, unpack
from rayk.storage.records import decode_records, iter_batches
from tests.metadata_helpers import RECORDS, image_summary

FIXTURE_V0 = Path(__file__).parent / "fixtures" / "metadata_v0"
# Kinds that came after records had versions: a log written before could not hold them.
KINDS_SINCE_VERSIONS = {"decommission_broker", "unregister_broker"}

def stored(record: r.MetadataRecord) -> dict:
    """The map the log holds for the record."""
    return msgpack.unpackb(pack(record))


@given(RECORDS)
def test_every_kind_reads_back_as_the_record_written(record):
    assert unpack(pack(record)) == record


def test_every_kind_has_one_class_and_is_written_with_its_kind_and_version():
    assert len(RECORD_KINDS) == 15
    for kind, cls in RECORD_KINDS.items():
        assert cls.KIND == kind and cls.VERSION == 1
    written = stored(r.FenceBrokerRecord(3, True))
    assert written == {"type": "fence_broker", "version": 1, "broker_id": 3, "fenced": True}


def test_an_unversioned_record_reads_as_version_0_with_the_fields_it_lacked_at_their_defaults():
    old_registration = {"type": "register_broker", "broker_id": 1, "node_id": "a"}
    assert unpack(msgpack.packb(old_registration)) == r.RegisterBrokerRecord(1, "a", "", "", True, -1)
    old_partition = {"type": "partition", "topic": "t", "partition": 0, "replicas": [1, 2], "isr": [1],
                     "leader": 1, "leader_epoch": 2, "partition_epoch": 3}
    assert unpack(msgpack.packb(old_partition)) == r.PartitionRecord("t", 0, (1, 2), (1,), 1, 2, 3, (), (), ())


@pytest.mark.parametrize(
    ("stored_value", "error", "says"),
    [
        ({"type": "nonsense", "x": 1}, UnsupportedVersionError, "unknown metadata record kind 'nonsense'"),
        ({"type": "fence_broker", "version": 2, "broker_id": 1, "fenced": True}, UnsupportedVersionError,
         "version 2; this rayk reads up to 1"),
        ({"type": "fence_broker", "version": -1, "broker_id": 1, "fenced": True}, CorruptRecordError, "invalid version"),
        ({"type": "fence_broker", "version": "1", "broker_id": 1, "fenced": True}, CorruptRecordError, "invalid version"),
        ({"type": "fence_broker", "version": 1, "broker_id": 1}, CorruptRecordError, "missing ['fenced']"),
        ({"type": "fence_broker", "version": 1, "broker_id": 1, "fenced": True, "why": "x"}, CorruptRecordError,
         "unknown fields ['why']"),
        ({"version": 1}, CorruptRecordError, "a string 'type'"),
        ([1, 2], CorruptRecordError, "a string 'type'"),
        ({"type": "register_broker", "version": 1, "broker_id": 1, "node_id": "a", "epoch": -5}, CorruptRecordError,
         "does not parse"),
        ({"type": "fence_broker", "version": 1, "broker_id": 1, "fenced": True, "broker_id ": 2}, CorruptRecordError,
         "unknown fields"),
    ],
)
def test_a_record_this_code_cannot_read_is_refused_with_a_typed_error_not_skipped(stored_value, error, says):
    """The Controller then does not start (a clear error in its log), rather than build a
    cluster without that record."""
    with pytest.raises(error, match=re.escape(says)):
        unpack(msgpack.packb(stored_value))


# --- an existing cluster's metadata, written before records had versions -----------------


def test_bytes_that_are_not_msgpack_are_a_corrupt_record():
    with pytest.raises(CorruptRecordError, match="not msgpack"):
        unpack(b"\xc1")
    with pytest.raises(CorruptRecordError, match="not msgpack"):
        unpack(None)  # a record with a null value


@pytest.fixture
def v0_dir(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE_V0 / TOPIC_PARTITION_DIR, tmp_path / TOPIC_PARTITION_DIR)
    return tmp_path


def load(directory: Path) -> tuple[ClusterMetadata, MetadataLog]:
    log = MetadataLog(directory)
    meta = ClusterMetadata()
    meta.load(log)
    return meta, log


def test_the_fixture_holds_every_kind_unversioned():
    data = (FIXTURE_V0 / TOPIC_PARTITION_DIR / "00000000000000000000.log").read_bytes()
    values = [msgpack.unpackb(rec.value) for b in iter_batches(data) for rec in decode_records(b.data)]
    assert {v["type"] for v in values} == set(RECORD_KINDS) - KINDS_SINCE_VERSIONS
    assert all("version" not in v for v in values)


def test_a_metadata_log_written_before_versions_loads_as_the_image_that_code_built(v0_dir: Path):
    meta, log = load(v0_dir)
    log.close()
    assert image_summary(meta) == json.loads((FIXTURE_V0 / "image.json").read_text())


def test_a_cluster_upgraded_in_place_goes_on_appending_and_snapshots_its_mixed_log(v0_dir: Path):
    meta, log = load(v0_dir)
    records = meta.replication.plan_create_topic("after-upgrade", 2, 3, {}, "topic-id-after-upgrade")
    first = log.append(records)
    for i, record in enumerate(records):
        meta.apply(record, first + i)
    log.write_snapshot(meta.snapshot())
    log.close()

    log = MetadataLog(v0_dir)
    snapshot, after = log.load()
    assert snapshot is not None and snapshot.end_offset == 30 + len(records) and list(after) == []
    log.close()
    again, log = load(v0_dir)  # from the snapshot, which covers the old records and the new
    log.close()
    assert image_summary(again) == image_summary(meta)
    assert image_summary(again)["brokers"] == json.loads((FIXTURE_V0 / "image.json").read_text())["brokers"]
