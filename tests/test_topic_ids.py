"""BrokerView.topic_names: how the listener names the topics a Fetch v13+ gives by id."""

from __future__ import annotations

import asyncio
import uuid

from rayk.config import BrokerConfig
from rayk.errors import RequestTimedOutError, UnknownTopicIdError
from rayk.net import broker_view
from rayk.net.broker_view import BrokerView
from rayk.net.entities import topic_id_text

ORDERS, CLICKS = uuid.uuid4(), uuid.uuid4()


class FakeController:
    """Answers client_metadata like the Controller, counting calls; `delay_s` stalls it."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls, self.delay_s = 0, delay_s
        outer = self

        class Method:
            def remote(self, topics):
                outer.calls += 1
                return outer._answer()

        self.client_metadata = Method()

    async def _answer(self) -> dict:
        await asyncio.sleep(self.delay_s)
        return {"topics": {"orders": {"topic_id": topic_id_text(ORDERS)}, "clicks": {"topic_id": topic_id_text(CLICKS)}}}


def test_ids_are_named_in_one_controller_call_and_then_from_the_cache():
    controller = FakeController()
    view = BrokerView(0, controller, BrokerConfig())

    async def run():
        first = await view.topic_names({ORDERS, CLICKS})
        again = await view.topic_names({ORDERS})
        return first, again

    first, again = asyncio.run(run())
    assert first == {ORDERS: "orders", CLICKS: "clicks"} and again == {ORDERS: "orders"}
    assert controller.calls == 1


def test_an_unknown_id_is_unknown_topic_id_and_not_looked_up_again_at_once():
    controller = FakeController()
    view = BrokerView(0, controller, BrokerConfig())
    stranger = uuid.uuid4()

    async def run():
        return [await view.topic_names({stranger, ORDERS}) for _ in range(3)]

    answers = asyncio.run(run())
    assert all(isinstance(a[stranger], UnknownTopicIdError) and a[ORDERS] == "orders" for a in answers)
    assert controller.calls == 1, "within UNKNOWN_TOPIC_ID_RETRY_MS the miss is remembered"


def test_a_controller_that_does_not_answer_gives_each_id_its_error(monkeypatch):
    monkeypatch.setattr(broker_view, "TOPIC_ID_LOOKUP_TIMEOUT_MS", 50)
    view = BrokerView(0, FakeController(delay_s=1.0), BrokerConfig())
    answer = asyncio.run(view.topic_names({ORDERS}))
    assert isinstance(answer[ORDERS], RequestTimedOutError)
