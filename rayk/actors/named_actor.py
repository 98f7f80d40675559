"""NamedActor: a named actor, handed to another actor by its name, whose handle the
receiving process looks up the first time it calls it.

Ray builds an actor handle's method table from the actor's class, so a process that
receives a handle loads that class, and every module the class's module imports, while
it deserializes the handle. A partition replica handed its broker's (ReplicaManager) and
the Controller's handles at creation imported both their modules before its own
`__init__` ran, for calls it makes rarely (an ISR change, a transaction's verification, a
share group's state) and many replicas never. Measured (2026-12-03, 2 cores): `import ray`
and the replica's module take 0.80 CPU-s, with the two modules 1.14 s and ~10 MiB more
(min of 8 runs); 9 replicas created at once were ready at a median 1.02 CPU-s each instead
of 1.17. A NamedActor pickles as two strings; the lookup, once per process, runs off the
event loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError

_handles: dict[NamedActor, Any] = {}  # this process's lookups


@dataclass(frozen=True, slots=True)
class NamedActor:
    """An actor by its name and Ray namespace (see the module docstring)."""

    name: str
    namespace: str  # the one it was named in (not always its creator's job's)

    def __post_init__(self) -> None:
        assert self.name, "an actor handed on by its name has one"

    async def handle(self) -> Any:
        """Its handle; ActorUnavailableError (a RayError, as a call to a dead actor raises)
        while no actor has the name."""
        handle = _handles.get(self)
        if handle is None:
            try:
                handle = await asyncio.to_thread(ray.get_actor, self.name, namespace=self.namespace)
            except ValueError:
                missing = f"no actor is named {self.name!r} in namespace {self.namespace!r}"
                raise ActorUnavailableError(missing, None) from None
            _handles[self] = handle
        return handle


async def handle_of(actor: Any) -> Any:
    """The handle `actor` stands for: a NamedActor's, or `actor` itself (a handle, or a
    test's stand-in)."""
    return await actor.handle() if isinstance(actor, NamedActor) else actor
