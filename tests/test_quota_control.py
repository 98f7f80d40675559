"""ClientQuotaControlManager alone: AlterClientQuotas planned as records, replayed, imaged."""

from __future__ import annotations

from rayk.errors import InvalidRequestError
from rayk.metadata.quota_control import ClientQuotaControlManager
from rayk.quotas import (
    CONSUMER_BYTE_RATE, DEFAULT, MATCH_EXACT, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, USER, QuotaEntity,
    QuotaFilterComponent,
)
from tests.metadata_helpers import replay_into

P = PRODUCER_BYTE_RATE


def test_quota_changes_are_records_that_replay_to_the_same_quotas():
    quotas = ClientQuotaControlManager()
    alice, default_client = QuotaEntity("alice"), QuotaEntity(client_id=DEFAULT)
    records, results = quotas.plan_alter([
        (alice, [(P, 1024), (REQUEST_PERCENTAGE, 50.0)]),
        (default_client, [(CONSUMER_BYTE_RATE, 2048)]),
        (QuotaEntity("bob"), [(P, 1.5)]),
        (InvalidRequestError("bad entity"), [(P, 1)]),
        (QuotaEntity("carol"), [(P, 1), (P, 2)]),
    ])
    assert results[:2] == [None, None]
    assert all(isinstance(e, InvalidRequestError) for e in results[2:])
    offset = replay_into(quotas, records)
    assert quotas.quotas == {alice: {P: 1024, REQUEST_PERCENTAGE: 50}, default_client: {CONSUMER_BYTE_RATE: 2048}}
    version = quotas.version
    records, results = quotas.plan_alter([(alice, [(P, None), (REQUEST_PERCENTAGE, None)]),
                                          (QuotaEntity("dave"), [(P, None)])])
    assert results == [None, None], "removing what is not set is no error"
    replay_into(quotas, records, offset)
    assert quotas.quotas == {default_client: {CONSUMER_BYTE_RATE: 2048}}, "an entity without quotas is gone"
    assert quotas.version > version


def test_describe_selects_by_filter_and_the_image_rebuilds_every_value():
    quotas = ClientQuotaControlManager()
    replay_into(quotas, quotas.plan_alter([(QuotaEntity("alice"), [(P, 10.0), (CONSUMER_BYTE_RATE, 20.0)]),
                                           (QuotaEntity("bob", "app"), [(P, 5.0)])])[0])
    assert quotas.describe([QuotaFilterComponent(USER, MATCH_EXACT, "alice")], strict=True) == [
        (QuotaEntity("alice"), {P: 10.0, CONSUMER_BYTE_RATE: 20.0})
    ]
    again = ClientQuotaControlManager()
    replay_into(again, quotas.image_records())
    assert again.quotas == quotas.quotas
