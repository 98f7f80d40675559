"""IncrementalAlterConfigs' operations on a resource's own configs (config_apis.apply_incremental),
as Kafka's ConfigurationControlManager applies them."""

from __future__ import annotations

import pytest

from rayk.config import BrokerConfig, topic_config_defaults
from rayk.errors import InvalidConfigurationError, InvalidRequestError
from rayk.net.config_apis import APPEND, DELETE, SET, SUBTRACT, apply_incremental

DEFAULTS = topic_config_defaults(BrokerConfig())


def test_set_and_delete_change_only_the_configs_named():
    explicit = {"retention.ms": "1000", "segment.bytes": "4096"}
    out = apply_incremental(explicit, [("retention.ms", DELETE, None), ("min.insync.replicas", SET, "2")], DEFAULTS)
    assert out == {"segment.bytes": "4096", "min.insync.replicas": "2"}
    assert explicit == {"retention.ms": "1000", "segment.bytes": "4096"}, "the input is left as it was"


def test_append_and_subtract_start_from_the_default_and_keep_each_item_once():
    assert apply_incremental({}, [("cleanup.policy", APPEND, "compact,delete")], DEFAULTS) == {"cleanup.policy": "delete,compact"}
    assert apply_incremental({"cleanup.policy": "compact"}, [("cleanup.policy", SUBTRACT, "compact")], DEFAULTS) == {
        "cleanup.policy": ""}  # then refused as INVALID_CONFIG by validate_topic_configs


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
