"""A listener's lookups of the ACLs and client quotas (SocketServer._refresh) alone: a long
poll held open at the Controller, asked again at once after a change, and never in a tight
loop when a lookup takes nothing or fails. Pure asyncio: the lookups are stand-ins."""

from __future__ import annotations

import asyncio
import logging

from rayk.net import socket_server
from rayk.net.socket_server import CHANGE_WAIT_MS, SocketServer


def lookups_made(answer, run_s: float = 0.3) -> list[int]:
    """The `wait_ms` of each lookup `_refresh` made in `run_s` with `answer` as the lookup."""
    calls: list[int] = []

    async def lookup(wait_ms: int) -> bool:
        calls.append(wait_ms)
        return await answer()

    async def main() -> None:
        server = SocketServer.__new__(SocketServer)  # only _refresh and its broker id are used
        server.broker_id = 0
        refreshing = asyncio.ensure_future(server._refresh("client quotas", lookup))
        await asyncio.sleep(run_s)
        refreshing.cancel()

    asyncio.run(main())
    return calls


def test_a_lookup_is_one_call_held_open_at_the_controller():
    async def held() -> bool:
        await asyncio.sleep(60)
        return False

    assert lookups_made(held) == [CHANGE_WAIT_MS]


def test_after_a_change_it_asks_again_at_once_and_after_nothing_it_waits():
    async def changed() -> bool:
        await asyncio.sleep(0.01)
        return True

    async def nothing_newer() -> bool:  # e.g. a Controller whose version went back
        return False

    assert len(lookups_made(changed)) >= 10
    assert lookups_made(nothing_newer) == [CHANGE_WAIT_MS], f"the next one after {socket_server.REFRESH_RETRY_S} s"


def test_a_failing_lookup_is_retried_after_a_pause_and_logged_once(caplog):
    async def failing() -> bool:
        raise ConnectionError("the Controller is restarting")

    with caplog.at_level(logging.WARNING, logger=socket_server.__name__):
        calls = lookups_made(failing, run_s=socket_server.REFRESH_RETRY_S * 2.5)
    assert len(calls) == 3
    assert len([r for r in caplog.records if "could not be read" in r.getMessage()]) == 1
