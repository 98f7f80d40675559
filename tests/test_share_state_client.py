"""ShareStateClient: a leader finds a share group's coordinator through the Controller, reads
its state with a Ray call and writes it over the data plane; a coordinator that moved is
found and asked once more, and every other error reaches the caller as the coordinator's
KafkaError. The Controller, the coordinators' handles and the data plane link are fakes here;
the real ones are exercised end to end by tests/test_share_consumer.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import ray

from rayk.replication.share.share_state_client import ShareStateClient
from rayk.dataplane.frames import ShareStateWrite
from rayk.errors import (
    CoordinatorNotAvailableError,
    FencedStateEpochError,
    KafkaError,
    NetworkError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
)


class _Method:
    def __init__(self, answer: Any) -> None:
        self._answer = answer

    async def remote(self, *args: Any) -> Any:
        answer = self._answer(*args)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _as_ray_raises(error: KafkaError) -> ray.exceptions.RayTaskError:
    """What a Ray call whose actor method raised `error` raises at the caller."""
    return ray.exceptions.RayTaskError("read_share_state", "traceback", error).as_instanceof_cause()


class _Coordinator:
    """A coordinator's handle: `read_answers` are what its reads answer, in turn."""

    def __init__(self, name: str, read_answers: list[Any]) -> None:
        self._actor_id = _ActorId(name)
        self.reads: list[tuple] = []
        answers = iter(read_answers)

        def read(*args: Any) -> Any:
            self.reads.append(args)
            return next(answers)

        self.read_share_state = _Method(read)


class _ActorId:
    def __init__(self, name: str) -> None:
        self.name = name

    def hex(self) -> str:
        return self.name.encode().hex()

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ActorId) and other.name == self.name


class _Controller:
    """Names the coordinators in turn, one per find_coordinator."""

    def __init__(self, *coordinators: _Coordinator) -> None:
        found = iter(coordinators)
        self.finds = 0

        def find(group_id: str) -> tuple[int, _Coordinator]:
            self.finds += 1
            return 0, next(found)

        self.find_coordinator = _Method(find)


class _Link:
    """The data plane link to one coordinator: `answers` are what its writes answer, in turn."""

    def __init__(self, answers: list[Any]) -> None:
        self._answers = iter(answers)
        self.writes: list[ShareStateWrite] = []
        self.connected = self.closed = False

    async def write_share_state(self, write: ShareStateWrite) -> KafkaError | None:
        self.writes.append(write)
        answer = next(self._answers)
        if isinstance(answer, NetworkError):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True


def _client(controller: _Controller, links: dict[str, _Link]) -> ShareStateClient:
    """A client whose data plane links to coordinator "cN" are `links["cN"]`, one per connect."""
    def link_to(coordinator: _Coordinator) -> Any:
        link = links[coordinator._actor_id.name]
        assert not link.connected, "a link is opened once and kept until it breaks"
        link.connected = True
        return link

    return ShareStateClient(controller, link_to)


def test_a_read_goes_to_the_coordinator_found_and_its_handle_is_kept():
    coordinator = _Coordinator("c1", [(None, 3, "latest"), (None, 3, "latest")])
    controller = _Controller(coordinator)
    client = _client(controller, {})
    assert asyncio.run(client.read_share_state("g", "t", 0, 7)) == (None, 3, "latest")
    assert asyncio.run(client.read_share_state("g", "t", 0, 7)) == (None, 3, "latest")
    assert coordinator.reads == [("g", "t", 0, 7)] * 2 and controller.finds == 1


@pytest.mark.parametrize("moved", [NotCoordinatorError("moved"), CoordinatorNotAvailableError("loading")])
def test_a_coordinator_that_moved_is_found_again_and_asked_once_more(moved):
    old = _Coordinator("c1", [_as_ray_raises(moved)])
    new = _Coordinator("c2", [(None, 4, "earliest")])
    controller = _Controller(old, new)
    assert asyncio.run(_client(controller, {}).read_share_state("g", "t", 0, 1)) == (None, 4, "earliest")
    assert controller.finds == 2 and len(new.reads) == 1


def test_a_coordinator_that_moved_twice_in_a_row_is_the_caller_s_error():
    controller = _Controller(_Coordinator("c1", [_as_ray_raises(NotCoordinatorError("a"))]),
                             _Coordinator("c2", [_as_ray_raises(NotCoordinatorError("b"))]))  # fmt: skip
    with pytest.raises(NotCoordinatorError, match="b") as raised:
        asyncio.run(_client(controller, {}).read_share_state("g", "t", 0, 1))
    assert type(raised.value) is NotCoordinatorError  # the coordinator's error, not Ray's wrapper


def test_a_coordinator_s_own_error_is_raised_as_it_is_without_asking_again():
    controller = _Controller(_Coordinator("c1", [_as_ray_raises(FencedStateEpochError("reset"))]))
    with pytest.raises(FencedStateEpochError) as raised:
        asyncio.run(_client(controller, {}).read_share_state("g", "t", 0, 1))
    assert type(raised.value) is FencedStateEpochError and controller.finds == 1


def test_a_dead_coordinator_is_coordinator_not_available_and_the_next_one_is_asked():
    dead = _Coordinator("c1", [ray.exceptions.RayActorError()])
    controller = _Controller(dead, _Coordinator("c2", [(None, 1, "latest")]))
    assert asyncio.run(_client(controller, {}).read_share_state("g", "t", 0, 1)) == (None, 1, "latest")
    controller = _Controller(_Coordinator("c1", [ray.exceptions.RayActorError()]),
                             _Coordinator("c2", [ray.exceptions.RayActorError()]))  # fmt: skip
    with pytest.raises(CoordinatorNotAvailableError):
        asyncio.run(_client(controller, {}).read_share_state("g", "t", 0, 1))


def test_writes_go_over_one_kept_link_and_a_broken_one_is_closed_before_the_next_coordinator_is_asked():
    links = {"c1": _Link([None, NetworkError("reset by peer")]), "c2": _Link([None])}
    controller = _Controller(_Coordinator("c1", []), _Coordinator("c2", []))
    client = _client(controller, links)

    async def main() -> None:
        await client.write_share_state("g", "t", 0, 2, 5, 10, [])
        await client.write_share_state("g", "t", 0, 2, 5, 10, [(10, 12, "acquired", 1)], create=True)

    asyncio.run(main())
    assert len(links["c1"].writes) == 2 and links["c1"].closed and controller.finds == 2
    assert links["c2"].writes == [ShareStateWrite("g", "t", 0, 2, 5, 10, ((10, 12, "acquired", 1),), True)]
    assert not links["c2"].closed


def test_a_write_answered_not_coordinator_goes_to_the_coordinator_found_next_over_the_same_kind_of_link():
    links = {"c1": _Link([NotCoordinatorError("moved")]), "c2": _Link([None])}
    controller = _Controller(_Coordinator("c1", []), _Coordinator("c2", []))
    asyncio.run(_client(controller, links).write_share_state("g", "t", 0, 2, 5, 10, []))
    assert controller.finds == 2 and len(links["c2"].writes) == 1
    assert not links["c1"].closed, "an answer, even a refusal, says the link works"


def test_a_write_the_coordinator_refuses_raises_its_error_and_an_answered_network_error_is_not_a_broken_link():
    links = {"c1": _Link([FencedStateEpochError("another leader's state")])}
    client = _client(_Controller(_Coordinator("c1", [])), links)
    with pytest.raises(FencedStateEpochError):
        asyncio.run(client.write_share_state("g", "t", 0, 2, 5, 10, []))

    class AnsweringNetworkError(_Link):
        async def write_share_state(self, write: ShareStateWrite) -> KafkaError | None:
            return NetworkError("the coordinator's own answer")

    links = {"c1": AnsweringNetworkError([])}
    with pytest.raises(NetworkError):
        asyncio.run(_client(_Controller(_Coordinator("c1", [])), links).write_share_state("g", "t", 0, 2, 5, 10, []))
    assert not links["c1"].closed


def test_a_closed_client_closes_its_links_and_refuses_later_calls():
    links = {"c1": _Link([None])}
    client = _client(_Controller(_Coordinator("c1", [])), links)
    asyncio.run(client.write_share_state("g", "t", 0, 2, 5, 10, []))
    client.close()
    assert links["c1"].closed
    with pytest.raises(NotLeaderOrFollowerError):
        asyncio.run(client.write_share_state("g", "t", 0, 2, 5, 10, []))
    with pytest.raises(NotLeaderOrFollowerError):
        asyncio.run(client.read_share_state("g", "t", 0, 2))
