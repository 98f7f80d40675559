"""ProducerIdControlManager alone: blocks of ids handed out once, across restarts."""

from __future__ import annotations

import pytest

from rayk.errors import InvalidRequestError
from rayk.metadata.producer_id_control import MAX_PRODUCER_IDS_PER_ALLOCATION, ProducerIdControlManager
from tests.metadata_helpers import replay_into


def test_blocks_follow_one_another_and_the_image_keeps_the_next_one():
    ids = ProducerIdControlManager()
    assert ids.image_records() == []
    records, first = ids.plan_allocate(1000)
    assert first == 0
    replay_into(ids, records)
    records, first = ids.plan_allocate(5)
    assert first == 1000
    replay_into(ids, records, 1)
    again = ProducerIdControlManager()
    replay_into(again, ids.image_records())
    assert again.plan_allocate(1)[1] == 1005, "a restarted Controller never hands out an id twice"


@pytest.mark.parametrize("count", [0, -1, MAX_PRODUCER_IDS_PER_ALLOCATION + 1])
def test_an_allocation_outside_its_bounds_is_invalid_request(count):
    with pytest.raises(InvalidRequestError):
        ProducerIdControlManager().plan_allocate(count)


def test_replay_refuses_a_block_that_goes_backwards():
    ids = ProducerIdControlManager()
    replay_into(ids, ids.plan_allocate(10)[0])
    with pytest.raises(AssertionError):
        replay_into(ids, ProducerIdControlManager().plan_allocate(5)[0], 1)
