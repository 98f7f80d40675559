"""BrokerListener alone, with stand-in listener actors: a listener that died comes back on
the ports it had (retried with backoff while they are taken, any free port only after
PORT_ATTEMPTS attempts), its address is published, and its process's CPU time is what
tells the supervisor it runs."""

from __future__ import annotations

import asyncio
import itertools
import os
import types

import pytest

from rayk.actors.supervision import ProcessProgress
from rayk.config import BrokerConfig
from rayk.errors import InvalidConfigurationError
from rayk.server import broker_listener
from rayk.server.broker_listener import LISTENER, PORT_ATTEMPTS, BrokerListener

FREE_PORTS = itertools.count(40_000)


class FakeListener:
    """A SocketServer stand-in: `start(ports)` binds the ports asked for unless `taken`,
    else free ones."""

    def __init__(self, taken: set[int]) -> None:
        self.taken, self.asked = taken, None
        for name in ("start", "bound_ports", "pid", "stop"):
            setattr(self, name, types.SimpleNamespace(remote=getattr(self, f"_{name}")))

    async def _start(self, ports):
        self.asked = ports
        port = (ports or {}).get("PLAINTEXT") or next(FREE_PORTS)
        if port in self.taken:
            raise InvalidConfigurationError(f"cannot listen on {port}")
        self.port = port
        return {"PLAINTEXT": ("127.0.0.1", port)}

    async def _bound_ports(self):
        return {"PLAINTEXT": self.port}

    async def _pid(self):
        return os.getpid()

    async def _stop(self):
        pass


class Supervisor:
    def __init__(self) -> None:
        self.watched, self.seen_running = [], []

    def watch(self, key, handle):
        self.watched.append(handle)

    def forget(self, key):
        pass

    def ran(self, key, handle, at_s):
        self.seen_running.append((key, at_s))


def run(monkeypatch, taken_for: int) -> tuple[list, list, list]:
    """A listener started, killed, restarted while its port stays taken for `taken_for`
    attempts; the listeners made, the delays slept and the endpoints published."""
    monkeypatch.setattr(broker_listener.ray, "kill", lambda handle: None)
    made, slept, published = [], [], []
    taken: set[int] = set()

    def factory(broker_id, controller, config, node_id):
        made.append(FakeListener(taken if len(made) <= taken_for else set()))
        return made[-1]

    async def sleep(delay_s):
        slept.append(round(delay_s, 1))

    async def main():
        monkeypatch.setattr(broker_listener.asyncio, "sleep", sleep)
        listener = BrokerListener(0, factory, None, BrokerConfig(), "node", Supervisor())
        await listener.start()
        taken.add(made[0].port)  # the dead process's port is not free yet

        async def publish():
            published.append(listener.endpoints)

        await listener.restart(publish)

    asyncio.run(main())
    return made, slept, published


def test_a_restarted_listener_comes_back_on_its_port_once_it_is_free(monkeypatch):
    made, slept, published = run(monkeypatch, taken_for=3)
    port = made[0].port
    assert [m.asked for m in made] == [None] + [{"PLAINTEXT": port}] * 4
    assert published == [{"PLAINTEXT": ("127.0.0.1", port)}]
    assert len(slept) == 3 and all(0.25 <= d <= 0.5 * 2 ** i for i, d in enumerate(slept)), "backing off"


def test_a_port_taken_for_good_gives_way_to_a_free_one_after_the_attempts(monkeypatch):
    made, slept, published = run(monkeypatch, taken_for=PORT_ATTEMPTS + 5)
    assert [m.asked for m in made[1:]] == [{"PLAINTEXT": made[0].port}] * PORT_ATTEMPTS + [None]
    assert published[0]["PLAINTEXT"][1] != made[0].port


def test_it_runs_while_its_process_spends_cpu(monkeypatch):
    supervisor = Supervisor()
    listener = BrokerListener(0, None, None, BrokerConfig(), "node", supervisor)
    listener.handle, listener._process = object(), ProcessProgress(os.getpid())
    listener.probe(1.0)  # the first reading
    sum(range(3_000_000))  # this process spends CPU
    listener.probe(2.0)
    listener._process = ProcessProgress(999_999_999)  # gone
    listener.probe(3.0)
    listener.probe(4.0)
    assert supervisor.seen_running == [(LISTENER, 2.0)]
