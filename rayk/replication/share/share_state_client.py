"""ShareStateClient: a partition leader's way to its share groups' states.

A share-partition's state (Kafka's share-group state, KIP-932) lives with the group's
coordinator, an OffsetsPartitionReplica of __consumer_offsets. The leader reads it once
when a group first fetches here, with a Ray call (`read_share_state`), and writes it at
every settled acknowledgement, over the data plane (frames.WRITE_SHARE_STATE), since that
write is on the path of every share fetch.

The client finds a group's coordinator through the Controller and keeps its handle, and a
data plane link per coordinator. A call that fails forgets the handle, and a link that
broke is closed. If the call failed because the coordinator moved (NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE, or no answer: its actor or the connection is gone), the
coordinator is found and asked once more. Any other error is the coordinator's
KafkaError, raised to the caller as it is. Once the replica closes the client, calls
are NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import ray

from rayk.actors.named_actor import handle_of
from rayk.replication.share.share_state import ShareStateRecord
from rayk.dataplane.frames import ShareStateWrite
from rayk.dataplane.replica_link import ReplicaLink
from rayk.errors import (
    CoordinatorNotAvailableError,
    KafkaError,
    NetworkError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
)

T = TypeVar("T")


class _Answered(Exception):
    """The coordinator answered `error` over the data plane (the link is fine)."""

    def __init__(self, error: KafkaError) -> None:
        self.error = error


def _link_to(coordinator: Any) -> ReplicaLink:
    return ReplicaLink(coordinator, ray.get_runtime_context().get_node_id(),
                       f"the group coordinator {coordinator._actor_id.hex()[:8]}")  # fmt: skip


class ShareStateClient:
    """A partition replica's client of its share groups' coordinators: owns each group's
    coordinator handle, as last found through the Controller, and a data plane link per
    coordinator. Lives as long as the replica (`close` with it); not thread-safe (the
    replica's event loop)."""

    def __init__(self, controller: Any, link_to: Callable[[Any], ReplicaLink] = _link_to) -> None:
        """`controller` finds coordinators; `link_to` opens a data plane link to one."""
        self._controller = controller
        self._link_to = link_to
        self._coordinators: dict[str, Any] = {}  # share group -> its coordinator's handle, as last found
        self._links: dict[Any, ReplicaLink] = {}  # by coordinator actor id: where share states are written
        self._closed = False

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
            link = self._link(coordinator)
            try:
                error = await link.write_share_state(write)
            except (ray.exceptions.RayError, NetworkError):
                if self._links.get(coordinator._actor_id) is link:  # (not a newer one another call opened)
                    del self._links[coordinator._actor_id]
                link.close()
                raise
            if error is not None:
                raise _Answered(error)

        await self._with_coordinator(group_id, send)

    def close(self) -> None:
        """The replica closes: the links close, and later calls are refused."""
        self._closed = True
        links, self._links = self._links, {}
        for link in links.values():
            link.close()
        self._coordinators.clear()

    async def _with_coordinator(self, group_id: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """`call` on the group's coordinator, raising its KafkaError (see the module docstring)."""
        for attempt in (1, 2):
            if self._closed:
                raise NotLeaderOrFollowerError("this replica closed: its share states are written no more")
            try:
                coordinator = self._coordinators.get(group_id)
                if coordinator is None:
                    controller = await handle_of(self._controller)
                    _, coordinator = await controller.find_coordinator.remote(group_id)
                    self._coordinators[group_id] = coordinator
                return await call(coordinator)
            except _Answered as e:
                error = e.error
            except ray.exceptions.RayTaskError as e:  # (first: it is also an instance of its cause's class)
                error = e.cause if isinstance(e.cause, KafkaError) else CoordinatorNotAvailableError(
                    f"the coordinator of share group {group_id!r}: {e.cause!r}")  # fmt: skip
            except (ray.exceptions.RayError, NetworkError) as e:  # no answer: the actor or the connection is gone
                error = CoordinatorNotAvailableError(f"the coordinator of share group {group_id!r}: {e}")
            self._coordinators.pop(group_id, None)
            if attempt == 2 or not isinstance(error, (NotCoordinatorError, CoordinatorNotAvailableError)):
                raise error
        raise AssertionError("unreachable")

    def _link(self, coordinator: Any) -> ReplicaLink:
        link = self._links.get(coordinator._actor_id)
        if link is None:
            link = self._links[coordinator._actor_id] = self._link_to(coordinator)
        return link
