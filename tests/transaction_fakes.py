"""Stand-ins for what a partition leader's transactional writes talk to, without Ray: actor
handles whose methods have `.remote`, a transaction coordinator that answers verifications
(and can hold them), and a Controller that finds it."""

from __future__ import annotations

import asyncio
import inspect
import traceback
from pathlib import Path
from typing import Any

from ray.exceptions import RayTaskError

from rayk.replication.partition_replica import PartitionReplica
from rayk.storage.records import SimpleRecord, build_batch

PID, EPOCH = 40, 0


class Handle:
    """A stand-in for a Ray actor handle: `await handle.method.remote(*args)`; what the
    method raises comes wrapped in a RayTaskError, as Ray wraps it."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)

        class Remote:
            @staticmethod
            async def remote(*args: Any, **kwargs: Any) -> Any:
                try:
                    result = method(*args, **kwargs)
                    return await result if inspect.isawaitable(result) else result
                except Exception as e:
                    raise RayTaskError(name, traceback.format_exc(), e).as_instanceof_cause() from None

        return Remote


class Coordinator:
    """What a transaction coordinator answers to a leader's verification; after `hold()`,
    each verification waits until `release()` (or for good: a coordinator that hangs)."""

    def __init__(self, partitions: set[tuple[str, int]] | None = None, error: Exception | None = None) -> None:
        self.partitions = partitions or set()
        self.error = error
        self.calls = 0
        self._held: asyncio.Event | None = None
        self.waiting = 0  # verifications held now

    def hold(self) -> None:
        self._held = asyncio.Event()

    def release(self) -> None:
        assert self._held is not None
        self._held.set()

    async def verify_partitions(self, transactional_id: str, producer_id: int, epoch: int, partitions: list) -> list:
        self.calls += 1
        if self._held is not None:
            self.waiting += 1
            try:
                await self._held.wait()
            finally:
                self.waiting -= 1
        if self.error is not None:
            raise self.error
        return [tp for tp in partitions if tp not in self.partitions]


class Controller:
    def __init__(self, coordinator: Any = None) -> None:
        self.coordinator = coordinator
        self.leaders: dict[tuple[str, int], Any] = {}
        self.next_producer_id = 1000

    def find_transaction_coordinator(self, transactional_id: str) -> tuple[int, Any]:
        return 0, Handle(self.coordinator)

    def init_producer_id(self) -> int:
        self.next_producer_id += 1
        return self.next_producer_id

    def leader(self, topic: str, partition: int) -> Any:
        return Handle(self.leaders[(topic, partition)])


def txn_batch(value: bytes, sequence: int, epoch: int = EPOCH) -> bytes:
    return build_batch([SimpleRecord(value)], producer_id=PID, producer_epoch=epoch, base_sequence=sequence,
                       is_transactional=True)


async def leader_of(tmp_path: Path, controller: Controller, topic: str = "t", cls: type = PartitionReplica,
                    epoch: int = 1, replicas: tuple[int, ...] = (0,)) -> Any:
    """Broker 0's replica of `topic`-0, leading `epoch` with `replicas` all in sync."""
    replica = cls(topic, 0, 0, tmp_path / f"{topic}-0", controller=Handle(controller))
    await replica.become_leader(epoch, list(replicas), list(replicas))
    return replica
