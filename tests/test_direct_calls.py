"""call_methods_directly: an actor's calls to its own methods skip Ray's tracing wrappers,
its remote calls keep them, and an override in a subclass stays the one that runs."""

from __future__ import annotations

import pytest
import ray

from rayk.actors.direct_calls import call_methods_directly
from tests.cluster_helpers import shared_local_ray


class Base:
    def __init__(self, direct: bool) -> None:
        self.bound = call_methods_directly(self) if direct else 0

    def _helper(self) -> str:
        return "base"

    async def _async_helper(self) -> str:
        return "base async"

    def callee_of_helper(self) -> str:
        """What `self._helper` runs: Ray's wrapper (its code is `_resume_span`), or the method."""
        return self._helper.__func__.__code__.co_name

    async def both(self) -> tuple[str, str]:
        return self._helper(), await self._async_helper()

    def bound_count(self) -> int:
        return self.bound


class Override(Base):
    def _helper(self) -> str:
        return "override"


@pytest.fixture(scope="module")
def ray_address():
    return shared_local_ray()


@pytest.fixture
def actors(ray_address):
    made = []

    def make(cls, direct: bool):
        made.append(ray.remote(num_cpus=0)(cls).remote(direct))
        return made[-1]

    yield make
    for handle in made:
        ray.kill(handle)


def test_a_ray_actors_own_calls_reach_its_methods_without_rays_wrapper(actors):
    wrapped, direct = actors(Base, False), actors(Base, True)
    assert ray.get(wrapped.callee_of_helper.remote()) == "_resume_span"  # what Ray does to every method
    assert ray.get(direct.callee_of_helper.remote()) == "_helper"
    assert ray.get(direct.bound_count.remote()) >= 5  # every method of the class, public ones too
    assert ray.get(direct.both.remote()) == ray.get(wrapped.both.remote()) == ("base", "base async")


def test_the_override_of_a_subclass_is_what_runs(actors):
    direct = actors(Override, True)
    assert ray.get(direct.both.remote()) == ("override", "base async")
    assert ray.get(direct.callee_of_helper.remote()) == "_helper"


def test_an_instance_ray_did_not_make_is_left_as_it_is():
    plain = Override(True)
    assert plain.bound == 0 and "_helper" not in vars(plain)
    assert plain._helper() == "override"
