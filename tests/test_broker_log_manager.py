"""BrokerLogManager's partition directories (rayk/server/broker_log_manager.py): at
registration the strays go, and a directory a push gives to a new replica meanwhile is never
taken for one, whatever the lock made the stray check wait for."""

from __future__ import annotations

import asyncio

from rayk.config import BrokerConfig
from rayk.server.broker_log_manager import BrokerLogManager
from rayk.storage import partition_metadata


def manager(tmp_path, replicas: dict) -> BrokerLogManager:
    return BrokerLogManager(1, tmp_path, board=None, replicas=replicas, config=BrokerConfig())  # type: ignore[arg-type]


def partition_dir(tmp_path, name: str, topic_id: str):
    path = tmp_path / name
    path.mkdir()
    partition_metadata.write(path, topic_id)
    (path / "00000000000000000000.log").write_bytes(b"records")
    return path


def test_strays_go_and_assigned_or_hosted_directories_stay(tmp_path):
    gone = partition_dir(tmp_path, "deleted-0", "id-deleted")
    recreated = partition_dir(tmp_path, "t-0", "id-old")  # t was deleted and made again while away
    kept = partition_dir(tmp_path, "kept-0", "id-kept")
    hosted = partition_dir(tmp_path, "hosted-0", "id-hosted")
    logs = manager(tmp_path, {("hosted", 0): object()})
    asyncio.run(logs.delete_strays({("t", 0): "id-new", ("kept", 0): "id-kept"}))
    assert not gone.exists() and not recreated.exists()
    assert kept.exists() and hosted.exists()


def test_a_directory_given_to_a_replica_while_the_stray_check_waits_is_not_deleted(tmp_path):
    """The registration named no replica of `moved-0` here (it was reassigned away, then
    back); while delete_strays waited for the lock (a checkpoint being written), a push gave
    the directory to a new replica whose process was still starting (not yet among the
    replicas). The check made before the wait deleted the log under the starting replica."""
    log_dir = partition_dir(tmp_path, "moved-0", "id-moved")

    async def main() -> None:
        logs = manager(tmp_path, {})
        async with logs._lock:  # a checkpoint write holds the lock
            strays = asyncio.create_task(logs.delete_strays({}))
            await asyncio.sleep(0)  # it decided, and waits for the lock
            assert await logs.prepare_dir(("moved", 0), "id-moved") == log_dir  # the push: same topic id, kept
        await strays
        assert (log_dir / "00000000000000000000.log").exists(), "the new replica's log was deleted as a stray"
        logs.release_dir(("moved", 0))  # its replica stops: a later registration may find it a stray
        await logs.delete_strays({})
        assert not log_dir.exists()

    asyncio.run(main())
