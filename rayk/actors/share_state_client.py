"""ShareStateClient: a partition leader's way to its share groups' states.

A share-partition's state (Kafka's share-group state, KIP-932) lives with the group's
coordinator, an OffsetsPartitionReplica of __consumer_offsets. The leader reads it once
when a group first fetches here, with a Ray call (`read_share_state`), and writes it at
every settled acknowledgement, over the data plane (frames.WRITE_SHARE_STATE), since that
write is on the path of every share fetch.

The client finds a group's coordinator through the Controller and keeps its handle, and a
data plane link per coordinator, until a call fails. A failed call forgets them; if it
failed because the coordinator moved (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE), the
coordinator is found and asked once more. Every other error is the coordinator's
KafkaError, raised to the caller as it is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import ray

from rayk.actors.group_records import ShareStateRecord
from rayk.dataplane.frames import ShareStateWrite
from rayk.dataplane.replica_link import ReplicaLink
from rayk.errors import CoordinatorNotAvailableError, KafkaError, NetworkError, NotCoordinatorError

T = TypeVar("T")


class ShareStateClient:
    def __init__(self, controller: Any) -> None:
        self._controller = controller
        self._coordinators: dict[str, Any] = {}  # share group -> its coordinator's handle, as last found
        self._links: dict[Any, ReplicaLink] = {}  # by coordinator actor id: where share states are written

    async def read_share_state(self, group_id: str, topic: str, partition: int,
                               leader_epoch: int) -> tuple[ShareStateRecord | None, int, str]:  # fmt: skip
        """OffsetsPartitionReplica.read_share_state, with a Ray call."""
        async def read(coordinator: Any) -> tuple[ShareStateRecord | None, int, str]:
            return await coordinator.read_share_state.remote(group_id, topic, partition, leader_epoch)

        return await self._with_coordinator(group_id, read)

    async def write_share_state(self, group_id: str, topic: str, partition: int, leader_epoch: int, state_epoch: int,
                                start_offset: int, batches: list[tuple[int, int, str, int]],
                                create: bool = False) -> None:  # fmt: skip
        """OffsetsPartitionReplica.write_share_state, over the data plane."""
        write = ShareStateWrite(group_id, topic, partition, leader_epoch, state_epoch, start_offset, tuple(batches), create)

        async def send(coordinator: Any) -> None:
            error = await self._link(coordinator).write_share_state(write)
            if error is not None:
                raise error

        await self._with_coordinator(group_id, send)

    def close(self) -> None:
        """Leadership or the replica ended: the links close; handles are found again when needed."""
        links, self._links = self._links, {}
        for link in links.values():
            link.close()
        self._coordinators.clear()

    async def _with_coordinator(self, group_id: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """`call` on the group's coordinator, raising its KafkaError (see the module docstring)."""
        for attempt in (1, 2):
            coordinator = None
            try:
                coordinator = self._coordinators.get(group_id)
                if coordinator is None:
                    _, coordinator = await self._controller.find_coordinator.remote(group_id)
                    self._coordinators[group_id] = coordinator
                return await call(coordinator)
            except ray.exceptions.RayTaskError as e:  # (first: it is also an instance of its cause's class)
                error = e.cause if isinstance(e.cause, KafkaError) else CoordinatorNotAvailableError(
                    f"the coordinator of share group {group_id!r}: {e.cause!r}")  # fmt: skip
            except (ray.exceptions.RayError, NetworkError) as e:  # no answer: the actor or the connection is gone
                error = CoordinatorNotAvailableError(f"the coordinator of share group {group_id!r}: {e}")
                if coordinator is not None:
                    self._drop_link(coordinator)
            except KafkaError as e:  # the coordinator's answer over the data plane
                error = e
            self._coordinators.pop(group_id, None)
            if attempt == 2 or not isinstance(error, (NotCoordinatorError, CoordinatorNotAvailableError)):
                raise error
        raise AssertionError("unreachable")

    def _link(self, coordinator: Any) -> ReplicaLink:
        link = self._links.get(coordinator._actor_id)
        if link is None:
            link = self._links[coordinator._actor_id] = ReplicaLink(
                coordinator, ray.get_runtime_context().get_node_id(),
                f"the group coordinator {coordinator._actor_id.hex()[:8]}")  # fmt: skip
        return link

    def _drop_link(self, coordinator: Any) -> None:
        link = self._links.pop(coordinator._actor_id, None)
        if link is not None:
            link.close()
