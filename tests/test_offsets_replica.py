"""OffsetsPartitionReplica without Ray (its methods called on the object): the group
coordinator is the only writer of `__consumer_offsets` (a client's produce is
INVALID_TOPIC_EXCEPTION and appends nothing), and a leader whose log holds records the
coordinator did not write (a client's, from before that refusal) still coordinates the
partition's groups, also when a load failed outright and leadership is pushed again."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import msgpack
import pytest

from rayk.coordinator import coordinator_replica
from rayk.coordinator.group.offset_records import CommittedOffset, offset_key, offset_value
from rayk.coordinator.group.offsets_replica import OffsetsPartitionReplica
from rayk.errors import InvalidTopicError, NotCoordinatorError
from rayk.internal_topics import OFFSETS_TOPIC
from rayk.storage import Log
from rayk.storage.records import SimpleRecord, build_batch

PARTITION = 3
EPOCH = 1


def log_dir(tmp_path: Path) -> Path:
    return tmp_path / f"{OFFSETS_TOPIC}-{PARTITION}"


async def leader(tmp_path: Path) -> OffsetsPartitionReplica:
    replica = OffsetsPartitionReplica(OFFSETS_TOPIC, PARTITION, 0, log_dir(tmp_path))
    await replica.become_leader(EPOCH, [0], [0])
    return replica


def forged_commit(group_id: str, offset: int) -> bytes:
    return build_batch([SimpleRecord(offset_value(CommittedOffset(offset)), offset_key(group_id, "t", 0))])


def test_a_clients_produce_is_invalid_topic_and_appends_nothing_while_the_coordinator_writes(tmp_path):
    async def main() -> None:
        replica = await leader(tmp_path)
        await replica.commit_offsets("g", -1, "", {("t", 0): (5, "")})
        end_offset = (await replica.describe())["log_end_offset"]
        answers = [await replica.produce(forged_commit("g", 99), -1, 1_000)]
        answers += await replica.produce_requests([(forged_commit("g", 98), 1, 1_000), (b"\x00" * 70, 0, 1_000)])
        assert all(isinstance(a.error, InvalidTopicError) for a in answers), answers
        assert (await replica.describe())["log_end_offset"] == end_offset, "nothing was appended"
        assert (await replica.fetch_offsets("g"))[("t", 0)].offset == 5
        await replica.commit_offsets("g", -1, "", {("t", 0): (6, "")})  # the coordinator's own writes go on
        assert (await replica.describe())["log_end_offset"] > end_offset
        await replica.close()

    asyncio.run(main())


def test_a_leader_whose_log_holds_records_it_did_not_write_skips_them_and_coordinates(tmp_path, caplog):
    log = Log(log_dir(tmp_path))
    log.append_as_leader(forged_commit("before", 3), 0)
    log.append_as_leader(build_batch([SimpleRecord(b"value", b"\xc1not msgpack"),
                                      SimpleRecord(b"\xc1", offset_key("victim", "t", 0)),
                                      SimpleRecord(msgpack.packb({"offset": "1"}), offset_key("victim", "t", 1))]), 0)
    log.append_as_leader(forged_commit("after", 4), 0)
    log.close()

    async def main() -> None:
        with caplog.at_level(logging.ERROR):
            replica = await leader(tmp_path)
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert [m.split(":")[0] for m in errors] == [f"{OFFSETS_TOPIC}-{PARTITION} offset {o}" for o in (1, 2, 3)]
        assert await replica.committed_offsets() == {"before": {("t", 0): 3}, "after": {("t", 0): 4}}
        await replica.become_leader(EPOCH, [0], [0], partition_epoch=1)  # a push in the same epoch
        await replica.commit_offsets("victim", -1, "", {("t", 0): (2, "")})
        assert (await replica.fetch_offsets("victim"))[("t", 0)].offset == 2
        await replica.close()

    asyncio.run(main())


def test_a_load_that_fails_outright_is_not_coordinator_until_the_next_push_loads_again(tmp_path, monkeypatch):
    async def main() -> None:
        replica = await leader(tmp_path)
        await replica.commit_offsets("g", -1, "", {("t", 0): (5, "")})
        await replica.become_follower(EPOCH + 1, -1, None)

        def unreadable(log: object, source: str) -> list:
            raise OSError("a disk that cannot be read")

        monkeypatch.setattr(coordinator_replica, "read_coordinator_log", unreadable)
        await replica.become_leader(EPOCH + 2, [0], [0])  # logs the failure, raises nothing
        with pytest.raises(NotCoordinatorError):
            await replica.fetch_offsets("g")
        monkeypatch.undo()
        await replica.become_leader(EPOCH + 2, [0], [0], partition_epoch=1)  # the same epoch, pushed again
        assert (await replica.fetch_offsets("g"))[("t", 0)].offset == 5
        await replica.close()

    asyncio.run(main())
