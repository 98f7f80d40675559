"""ReplicaManager's start against a stub Controller: a broker whose session lapsed while
its Kafka listener started (no heartbeat goes before it is up) registers again instead of
failing its start; one replaced by another registration does not."""

from __future__ import annotations

import asyncio
import types

import pytest

from rayk.server.replica_manager import ReplicaManager
from rayk.errors import StaleBrokerEpochError


class StubController:
    """The Controller's answers for a broker with `epoch` (fenced or not) as Ray handles give them."""

    def __init__(self, epoch: int, fenced: bool) -> None:
        self.epoch, self.fenced, self.endpoints = epoch, fenced, None
        self.update_endpoints = self._method(self._update_endpoints)
        self.heartbeat = self._method(self._heartbeat)

    @staticmethod
    def _method(fn):
        async def call(*args):
            return fn(*args)

        return types.SimpleNamespace(remote=call)

    def _update_endpoints(self, broker_id, epoch, endpoints):
        if self.fenced or epoch != self.epoch:
            raise StaleBrokerEpochError(f"broker {broker_id} epoch {epoch} is fenced or not current")
        self.endpoints = endpoints

    def _heartbeat(self, broker_id, epoch):
        return "reregister" if self.fenced else "ok" if epoch == self.epoch else "stale"


def broker(controller: StubController, epoch: int):
    listener = types.SimpleNamespace(endpoints={"PLAINTEXT": ("127.0.0.1", 9092)})
    manager = types.SimpleNamespace(_controller=controller, broker_id=1, _broker_epoch=epoch, _listener=listener,
                                    registrations=0)  # fmt: skip

    async def register():  # as the Controller would: a new epoch, unfenced, with the endpoints
        manager.registrations += 1
        controller.epoch, controller.fenced, controller.endpoints = controller.epoch + 1, False, listener.endpoints
        manager._broker_epoch = controller.epoch

    manager._register_again = register
    return manager


def test_a_broker_fenced_while_its_listener_started_registers_again_with_its_address():
    controller = StubController(epoch=5, fenced=True)
    manager = broker(controller, epoch=5)
    asyncio.run(ReplicaManager._publish_endpoints(manager))
    assert (manager.registrations, manager._broker_epoch, controller.fenced) == (1, 6, False)
    assert controller.endpoints == {"PLAINTEXT": ("127.0.0.1", 9092)}


def test_a_broker_with_a_current_epoch_publishes_its_address_and_a_replaced_one_fails():
    controller = StubController(epoch=5, fenced=False)
    current = broker(controller, epoch=5)
    asyncio.run(ReplicaManager._publish_endpoints(current))
    assert (current.registrations, controller.endpoints) == (0, {"PLAINTEXT": ("127.0.0.1", 9092)})
    replaced = broker(controller, epoch=4)
    with pytest.raises(StaleBrokerEpochError):
        asyncio.run(ReplicaManager._publish_endpoints(replaced))
    assert replaced.registrations == 0
