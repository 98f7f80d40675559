"""Client quotas without a cluster: the entity model and Kafka's eight levels of precedence
(rayk/quotas.py), the sampled rate and its throttle time (rayk/net/sampled_rate.py), what
and what a listener records and answers per client (rayk/net/client_quotas.py). The
Controller's records of them: test_quota_control.py."""

from __future__ import annotations

import asyncio
import pickle
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayk.errors import InvalidRequestError
from rayk.net.client_quotas import MAX_THROTTLE_MS, ClientQuotas, ThreadTimed, measure_child_tasks
from rayk.net.request_context import RequestContext
from rayk.net.sampled_rate import SampledRate
from rayk.quotas import (
    CLIENT_ID, CONSUMER_BYTE_RATE, DEFAULT, MATCH_ANY, MATCH_DEFAULT, MATCH_EXACT, PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE, USER, QuotaConfig, QuotaEntity, QuotaFilterComponent, QuotaKey, check_quota_value,
    filter_entities,
)

P = PRODUCER_BYTE_RATE
LEVELS = [  # Kafka's precedence, most specific first, for user alice and client id app
    QuotaEntity("alice", "app"), QuotaEntity("alice", DEFAULT), QuotaEntity("alice"),
    QuotaEntity(DEFAULT, "app"), QuotaEntity(DEFAULT, DEFAULT), QuotaEntity(DEFAULT),
    QuotaEntity(client_id="app"), QuotaEntity(client_id=DEFAULT),
]


def context(user: str = "alice") -> RequestContext:
    return RequestContext("EXTERNAL", "SASL_SSL", f"User:{user}", "10.0.0.1")


# ---------------------------------------------------------------------------- the model


def test_each_level_of_precedence_wins_over_every_level_after_it():
    for i, winner in enumerate(LEVELS):
        config = QuotaConfig({e: {P: float(j + 1)} for j, e in enumerate(LEVELS) if j >= i})
        limit, _ = config.resolve("alice", "app", P)
        assert limit == i + 1, f"{winner} should apply"


def test_who_shares_a_limit_is_the_matched_entity_with_defaults_made_the_clients_own():
    shared = QuotaConfig({QuotaEntity("alice"): {P: 10}, QuotaEntity(DEFAULT): {P: 5}})
    assert shared.resolve("alice", "a", P) == (10, QuotaKey("alice", ""))
    assert shared.resolve("alice", "b", P) == (10, QuotaKey("alice", "")), "alice's clients share her quota"
    assert shared.resolve("bob", "a", P) == (5, QuotaKey("bob", "")), "a default quota is each user's own"
    assert shared.resolve("carol", "a", P) == (5, QuotaKey("carol", ""))
    clients = QuotaConfig({QuotaEntity(client_id=DEFAULT): {P: 7}})
    assert clients.resolve("alice", "a", P) == (7, QuotaKey("", "a"))
    assert clients.resolve("bob", "a", P) == (7, QuotaKey("", "a")), "a client id's quota is shared across users"


def test_no_quota_of_a_key_means_no_limit_and_other_keys_do_not_leak():
    config = QuotaConfig({QuotaEntity("alice"): {CONSUMER_BYTE_RATE: 10}})
    assert config.resolve("alice", "app", P) is None
    assert config.resolve("bob", "app", CONSUMER_BYTE_RATE) is None
    assert QuotaConfig().resolve("alice", "app", P) is None


@given(st.sampled_from(LEVELS), st.sampled_from(LEVELS))
def test_entities_survive_the_wire_the_metadata_log_and_pickle(entity, other):
    assert QuotaEntity.from_wire(entity.to_wire()) == entity
    assert QuotaEntity.from_record(entity.to_record()) == entity
    assert pickle.loads(pickle.dumps(entity)) == entity
    assert (entity == other) == (entity.to_wire() == other.to_wire())


def test_bad_entities_keys_and_values_are_invalid_requests():
    for parts in ([], [(USER, "a"), (USER, "b")], [("ip", "1.2.3.4")], [("group", "g")], [(USER, "")]):
        with pytest.raises(InvalidRequestError):
            QuotaEntity.from_wire(parts)
    for key, value in ((P, 0), (P, -1), (P, 1.5), (P, float("inf")), (P, float("nan")), ("controller_mutation_rate", 1),
                       ("nope", 1), (REQUEST_PERCENTAGE, True)):
        with pytest.raises(InvalidRequestError):
            check_quota_value(key, value)
    check_quota_value(REQUEST_PERCENTAGE, 0.5)
    check_quota_value(P, 1024.0)


def test_filters_match_exactly_by_default_or_any_and_strictly():
    entities = [QuotaEntity("alice"), QuotaEntity("alice", "app"), QuotaEntity(DEFAULT), QuotaEntity(client_id="app")]
    user = lambda match_type, match=None: QuotaFilterComponent(USER, match_type, match)  # noqa: E731
    assert filter_entities(entities, [user(MATCH_EXACT, "alice")], False) == entities[:2]
    assert filter_entities(entities, [user(MATCH_EXACT, "alice")], True) == entities[:1]
    assert filter_entities(entities, [user(MATCH_DEFAULT)], False) == [entities[2]]
    assert filter_entities(entities, [user(MATCH_ANY)], False) == entities[:3]
    assert filter_entities(entities, [], False) == entities
    assert filter_entities(entities, [], True) == []
    assert filter_entities(entities, [QuotaFilterComponent(CLIENT_ID, MATCH_EXACT, "app")], True) == [entities[3]]
    for bad in ([user(MATCH_EXACT)], [user(MATCH_DEFAULT, "x")], [user(7)], [QuotaFilterComponent("ip", MATCH_ANY)],
                [user(MATCH_ANY), user(MATCH_DEFAULT)]):
        with pytest.raises(InvalidRequestError):
            filter_entities(entities, bad, False)


# ---------------------------------------------------------------------------- the rate


def test_a_first_burst_is_measured_over_the_whole_window_not_the_moment_it_took():
    rate = SampledRate(samples=11, sample_ms=1000)
    rate.record(10_000, now_ms=0)
    assert rate.window_ms(0) == 10_000
    assert rate.rate_per_s(0) == 1_000
    assert rate.throttle_ms(1_000, 0) == 0
    rate.record(10_000, now_ms=0)
    assert rate.throttle_ms(1_000, 0) == 10_000, "twice the quota over the window: wait one more window"


def test_samples_older_than_the_window_are_forgotten():
    rate = SampledRate(samples=3, sample_ms=100)
    rate.record(50, now_ms=0)
    rate.record(50, now_ms=150)
    assert rate.total(250) == 100
    assert rate.total(300) == 50, "the first sample is 3 samples old"
    assert not rate.idle(300)
    assert rate.idle(450)


@settings(deadline=None, max_examples=50)
@example(limit=100, request_share=0.26678536406339753, gap_ms=9)  # rounds to 0 ms once, just over
@given(st.integers(100, 100_000), st.floats(0.05, 2.0), st.integers(1, 50))
def test_a_client_that_waits_out_its_throttle_times_gets_its_quota_and_no_more(limit, request_share, gap_ms):
    """Over a minute, a client that sends whenever it is not throttled sends about its
    quota: the window's first burst, then within 15% of the quota. (Kafka's throttle time
    is an estimate: the rate only falls when a whole sample leaves the window, so a client
    sends a little more after each one does.)"""
    rate, now, sent, size = SampledRate(samples=11, sample_ms=1000), 0, 0.0, limit * request_share
    while now < 60_000:
        rate.record(size, now)
        sent += size
        throttle_ms = rate.throttle_ms(limit, now)
        # A throttle only over the limit (just over it, it may round to 0 ms, as Kafka's does).
        assert throttle_ms >= 0 and (throttle_ms == 0 or rate.rate_per_s(now) > limit)
        now += max(throttle_ms, gap_ms)
    assert sent <= limit * (1.15 * now / 1000 + 10) + size, "the quota, its first window's burst and one request"
    own_pace_per_s = size * 1000 / gap_ms
    assert sent >= 0.8 * min(limit, own_pace_per_s) * now / 1000, "throttles are no longer than the quota needs"


# ---------------------------------------------------------------------------- a listener's quotas


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000.0

    def __call__(self) -> float:
        return self.ms


def quotas(entries: dict, window_num: int = 11) -> tuple[ClientQuotas, Clock]:
    clock = Clock()
    q = ClientQuotas(window_num, 1000, clock)
    q.update(0, entries)
    return q, clock


def test_produce_bytes_are_throttled_per_client_and_others_are_not():
    q, clock = quotas({QuotaEntity(client_id="slow"): {P: 1_000}})
    assert q.produce_throttle_ms(context(), "slow", 10_000) == 0, "ten seconds of quota at once"
    assert q.produce_throttle_ms(context(), "slow", 10_000) == 10_000
    assert q.produce_throttle_ms(context(), "fast", 10**9) == 0, "no quota: never throttled"
    clock.ms += 11_000
    assert q.produce_throttle_ms(context(), "slow", 0) == 0, "the burst has left the window"


def test_a_fetch_may_not_ask_for_more_than_its_quota_allows_over_the_window():
    q, _ = quotas({QuotaEntity(DEFAULT): {CONSUMER_BYTE_RATE: 1_000}})
    assert q.fetch_max_bytes(context(), "app") == 10_000
    assert q.fetch_max_bytes(context(), None) == 10_000
    assert quotas({})[0].fetch_max_bytes(context(), "app") is None
    assert q.fetch_throttle_ms(context(), "app") == 0, "asking alone records nothing"
    assert q.fetch_throttle_ms(context(), "app", 20_000) == 10_000
    assert q.fetch_throttle_ms(context("bob"), "app") == 0, "bob has his own default quota"


def test_request_time_throttles_are_capped_at_one_sample():
    q, _ = quotas({QuotaEntity(client_id="spammer"): {REQUEST_PERCENTAGE: 1}})
    assert q.measures_request_time
    assert q.request_throttle_ms(context(), "spammer", 5 * 10**9) == 1_000
    q.record_request_time(context(), "spammer", 10**9)  # counted, but decides nothing now
    assert not quotas({QuotaEntity(client_id="x"): {P: 1}})[0].measures_request_time


def test_a_throttle_fits_the_wires_int32():
    q, _ = quotas({QuotaEntity(client_id="tiny"): {P: 1}})
    assert q.produce_throttle_ms(context(), "tiny", 3 * 10**6) == MAX_THROTTLE_MS == 2**31 - 1


def test_clients_that_went_quiet_are_forgotten():
    q, clock = quotas({QuotaEntity(client_id=DEFAULT): {P: 1_000}})
    for i in range(100):
        q.produce_throttle_ms(context(), f"client-{i}", 10)
    assert q.rate_count() == 100
    clock.ms += 11_000
    q.prune()
    assert q.rate_count() == 0


def test_a_new_limit_applies_to_what_a_client_already_sent():
    q, _ = quotas({QuotaEntity("alice"): {P: 1_000}})
    assert q.produce_throttle_ms(context(), "app", 10_000) == 0
    q.update(1, {QuotaEntity("alice"): {P: 500}})
    assert q.produce_throttle_ms(context(), "app", 0) == 10_000


def test_thread_time_counts_the_steps_and_not_the_waits_and_cancellation_goes_through():
    async def work() -> str:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        await asyncio.sleep(0.2)
        return "done"

    async def main() -> None:
        timed = ThreadTimed(work())
        assert await timed == "done"
        assert 0.04e9 < timed.ns < 0.15e9, timed.ns
        cancelled = asyncio.ensure_future(ThreadTimed(asyncio.sleep(10)))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled

    asyncio.run(main())


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_thread_time_counts_the_tasks_a_request_starts_and_no_one_elses():
    async def busy(seconds: float) -> None:
        await asyncio.sleep(0)
        spin(seconds)

    async def handler() -> None:
        await asyncio.gather(busy(0.03), busy(0.03))  # gather runs each in a task of its own

    async def main() -> None:
        measure_child_tasks(asyncio.get_running_loop())
        measure_child_tasks(asyncio.get_running_loop())  # a listener started again: still counted once
        unrelated = asyncio.ensure_future(busy(0.05))  # started outside any request
        timed = ThreadTimed(handler())
        await timed
        await unrelated
        assert 0.055e9 < timed.ns < 0.1e9, timed.ns

    asyncio.run(main())
