"""NamedActor: an actor handed on by its name, looked up once per process when first called."""

from __future__ import annotations

import asyncio
import pickle

import pytest
import ray
from ray.exceptions import RayError

from rayk.actors.named_actor import NamedActor, handle_of
from tests.cluster_helpers import shared_local_ray


@ray.remote(num_cpus=0)
class Echo:
    def echo(self, value):
        return value


@pytest.fixture(scope="module")
def echo():
    shared_local_ray()
    actor = Echo.options(name="named-actor-echo", namespace="named-actor-test").remote()
    yield actor
    ray.kill(actor)


def test_it_pickles_as_its_name_and_calls_the_actor_of_that_name(echo):
    named = pickle.loads(pickle.dumps(NamedActor("named-actor-echo", "named-actor-test")))
    assert len(pickle.dumps(named)) < 200, "two strings, not a handle"

    async def call_twice():
        first = await handle_of(named)
        second = await handle_of(named)
        return first is second, await first.echo.remote(7)

    assert asyncio.run(call_twice()) == (True, 7), "looked up once, then the same handle"


def test_a_name_no_actor_has_is_a_ray_error_as_a_dead_actor_s_call_is():
    shared_local_ray()
    for missing in (NamedActor("no-such-actor", "named-actor-test"), NamedActor("named-actor-echo", "other-namespace")):
        with pytest.raises(RayError, match="no actor is named"):
            asyncio.run(handle_of(missing))


def test_a_handle_or_a_stand_in_is_used_as_it_is():
    stand_in = object()
    assert asyncio.run(handle_of(stand_in)) is stand_in
    assert asyncio.run(handle_of(None)) is None
    with pytest.raises(AssertionError):
        NamedActor("", "namespace")
