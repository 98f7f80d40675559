"""IncrementalAlterConfigs' operations on a resource's own configs (config_apis.apply_incremental),
as Kafka's ConfigurationControlManager applies them, and a topic's configs altered through
the handler (incremental_alter_configs) against a fake Controller."""

from __future__ import annotations

import asyncio

import pytest

from rayk.config import BrokerConfig, topic_config_defaults
from rayk.errors import InvalidConfigurationError, InvalidRequestError
from rayk.net.api_versions import INCREMENTAL_ALTER_CONFIGS
from rayk.net.codec import Request, RequestHead, request_class
from rayk.net.config_apis import APPEND, DELETE, SET, SUBTRACT, TOPIC_RESOURCE, apply_incremental, incremental_alter_configs
from rayk.net.entities import build

DEFAULTS = topic_config_defaults(BrokerConfig())


def test_set_and_delete_change_only_the_configs_named():
    explicit = {"retention.ms": "1000", "segment.bytes": "4096"}
    out = apply_incremental(explicit, [("retention.ms", DELETE, None), ("min.insync.replicas", SET, "2")], DEFAULTS)
    assert out == {"segment.bytes": "4096", "min.insync.replicas": "2"}
    assert explicit == {"retention.ms": "1000", "segment.bytes": "4096"}, "the input is left as it was"


def test_append_and_subtract_start_from_the_default_and_keep_each_item_once():
    assert apply_incremental({}, [("cleanup.policy", APPEND, "compact,delete")], DEFAULTS) == {"cleanup.policy": "delete,compact"}
    assert apply_incremental({"cleanup.policy": "compact"}, [("cleanup.policy", SUBTRACT, "compact")], DEFAULTS) == {
        "cleanup.policy": ""}  # the empty list: neither delete nor compact, as Kafka allows


@pytest.mark.parametrize(
    "ops, error",
    [
        ([("retention.ms", APPEND, "1")], InvalidConfigurationError),  # not a list config
        ([("retention.ms", SUBTRACT, "1")], InvalidConfigurationError),
        ([("retention.ms", SET, None)], InvalidRequestError),
        ([("retention.ms", 4, "1")], InvalidRequestError),
        ([("retention.ms", SET, "1"), ("retention.ms", SET, "2")], InvalidRequestError),
    ],
)
def test_malformed_operations_are_refused_with_kafkas_codes(ops, error):
    with pytest.raises(error):
        apply_incremental({}, ops, DEFAULTS)


def test_every_described_default_is_a_value_a_topic_may_be_set_to():
    from rayk.config import validate_topic_configs

    assert None not in DEFAULTS.values()
    assert DEFAULTS["flush.messages"] == DEFAULTS["flush.ms"] == str(2**63 - 1)
    assert validate_topic_configs(DEFAULTS) == DEFAULTS


class OneTopicView:
    """A BrokerView whose Controller holds one topic's configs, as `_alter_topic` asks for them."""

    def __init__(self, configs: dict[str, str]) -> None:
        self.config, self.broker_id, self.configs = BrokerConfig(), 0, configs

    def authorized(self, *_: object) -> bool:
        return True

    async def ask_controller(self, method: str, *args: object, timeout_ms: int) -> object:
        if method == "alter_topic_configs":
            self.configs = dict(args[1])
        return dict(self.configs)


def incremental(view: OneTopicView, op: int, value: str) -> dict:
    body = build(request_class(INCREMENTAL_ALTER_CONFIGS, 1), {"validate_only": False, "resources": [{
        "resource_type": TOPIC_RESOURCE, "resource_name": "t",
        "configs": [{"name": "cleanup.policy", "config_operation": op, "value": value}]}]})
    request = Request(RequestHead(INCREMENTAL_ALTER_CONFIGS, 1, 1), "t", body)
    (answer,) = asyncio.run(incremental_alter_configs(view, request))["responses"]
    return answer


def test_append_then_subtract_of_compact_round_trips_through_the_empty_list():
    """As Kafka's clients' tests do: a compacted topic's SUBTRACT compact leaves the empty
    list (neither delete nor compact), which is a value, and APPEND compact gives it back."""
    view = OneTopicView({"cleanup.policy": "compact"})
    assert incremental(view, SUBTRACT, "compact")["error_code"] == 0
    assert view.configs == {"cleanup.policy": ""}
    assert incremental(view, APPEND, "compact")["error_code"] == 0
    assert view.configs == {"cleanup.policy": "compact"}
    assert incremental(view, APPEND, "shred")["error_code"] == InvalidConfigurationError.code
    assert view.configs == {"cleanup.policy": "compact"}
