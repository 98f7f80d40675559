"""BrokerView's data plane lanes to a replica: a connection that breaks on one lane
closes that lane only, and a replica whose actor is gone is forgotten with every lane."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import RayActorError

from rayk.config import BrokerConfig
from rayk.dataplane.frames import FetchRequest, FetchResult, ShareFetchRequest
from rayk.errors import NetworkError, NotLeaderOrFollowerError
from rayk.net.broker_view import BrokerView

TP = ("t", 0)


class FakeLink:
    """A ReplicaLink that answers fetches and fails share fetches with `failure`."""

    def __init__(self, replica: object, failure: BaseException | None = None) -> None:
        self.replica, self.failure, self.closed = replica, failure, False

    async def fetch(self, request: FetchRequest) -> FetchResult:
        return FetchResult(b"", 0, 0, 0)

    async def share_fetch(self, request: ShareFetchRequest) -> None:
        raise self.failure

    def close(self) -> None:
        self.closed = True


def view_with_lanes(failure: BaseException) -> tuple[BrokerView, FakeLink, FakeLink]:
    """A view holding a replica's handle, its fetch lane (0) and a share lane (1) whose
    share fetches fail with `failure`."""
    view = BrokerView(0, controller=None, config=BrokerConfig())
    handle = object()
    view._replicas[TP] = handle
    fetch_lane, share_lane = FakeLink(handle), FakeLink(handle, failure)
    view._links[(TP, 0)], view._links[(TP, 1)] = fetch_lane, share_lane
    return view, fetch_lane, share_lane


def share_fetch_fails(view: BrokerView) -> None:
    with pytest.raises(NotLeaderOrFollowerError):
        asyncio.run(view.share_fetch(*TP, ShareFetchRequest("g", "m", 10, 0, ())))


def test_a_broken_share_lane_is_closed_alone_and_the_fetch_lane_goes_on():
    view, fetch_lane, share_lane = view_with_lanes(NetworkError("connection reset"))
    share_fetch_fails(view)
    assert share_lane.closed and (TP, 1) not in view._links
    assert not fetch_lane.closed and view._links[(TP, 0)] is fetch_lane and TP in view._replicas
    assert asyncio.run(view.fetch(*TP, FetchRequest(0, 1024, 1, 0))).records == b""


def test_a_replica_whose_actor_is_gone_is_forgotten_with_every_lane():
    view, fetch_lane, share_lane = view_with_lanes(RayActorError())
    share_fetch_fails(view)
    assert share_lane.closed and fetch_lane.closed and not view._links and TP not in view._replicas
