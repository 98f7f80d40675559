"""A listener's share sessions (KIP-932) and ShareFetch's acknowledgement batches, without
a cluster: epoch 0 opens (replacing the member's session, whose partitions are released),
the next epochs continue it in order, -1 closes it; an unknown session or a wrong epoch is
refused; the least recently used session is evicted past the limit; acknowledgement
batches give one type or one per offset, GAP settles like ACCEPT, and malformed batches
are INVALID_REQUEST. On the wire: tests/test_share_consumer.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rayk.errors import InvalidRequestError, InvalidShareSessionEpochError, ShareSessionNotFoundError
from rayk.net.share_group_apis import acknowledgements
from rayk.net.share_sessions import Ended, ShareSessions


def test_a_session_opens_continues_in_order_and_closes():
    sessions = ShareSessions()
    session, ended = sessions.request("g", "m", 0, [("t", 0)], topic_ids={"t": "id"})
    assert ended == [] and list(session.partitions) == [("t", 0)] and session.topic_ids == {"t": "id"}
    session, _ = sessions.request("g", "m", 1, [("t", 1)], [("t", 0)])
    assert list(session.partitions) == [("t", 1)]
    with pytest.raises(InvalidShareSessionEpochError):
        sessions.request("g", "m", 1)  # epoch 2 is next
    assert sessions.request("g", "m", 2)[0] is session
    closed, ended = sessions.request("g", "m", -1)
    assert closed is None and ended == [Ended("g", "m", (("t", 1),))]
    with pytest.raises(ShareSessionNotFoundError):
        sessions.request("g", "m", 3)


def test_opening_again_replaces_the_member_s_session_and_the_oldest_is_evicted_past_the_limit():
    sessions = ShareSessions(max_sessions=2)
    sessions.request("g", "a", 0, [("t", 0)])
    _, ended = sessions.request("g", "a", 0, [("t", 1)])
    assert ended == [Ended("g", "a", (("t", 0),))]
    sessions.request("g", "b", 0, [("t", 0)])
    sessions.request("g", "a", 1)  # a is used again: b is now the least recently used
    _, ended = sessions.request("g", "c", 0)
    assert ended == [Ended("g", "b", (("t", 0),))] and len(sessions) == 2


def batch(first: int, last: int, *types: int) -> SimpleNamespace:
    return SimpleNamespace(first_offset=first, last_offset=last, acknowledge_types=types)


def test_acknowledgement_batches_give_one_type_or_one_per_offset_and_a_gap_settles_as_accept():
    assert acknowledgements([batch(0, 9, 1)]) == [(0, 9, 1)]
    assert acknowledgements([batch(0, 4, 1, 1, 0, 2, 2), batch(7, 7, 3)]) == [(0, 2, 1), (3, 4, 2), (7, 7, 3)]
    for malformed in ([batch(0, 4, 1, 2)], [batch(5, 4, 1)], [batch(3, 4, 1), batch(4, 5, 1)], [batch(-1, 0, 1)]):
        with pytest.raises(InvalidRequestError):
            acknowledgements(malformed)
