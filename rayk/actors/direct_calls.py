"""Calls an actor makes to its own methods, without Ray's tracing wrappers.

`ray.remote` turns a class into an actor by subclassing it and replacing every method of
the subclass with a wrapper that looks for a `_ray_trace_ctx` keyword (Ray's
`_inject_tracing_into_class`, applied again when a worker loads the class). Remote calls
need it when tracing is on. But the wrappers are on the class, so they also sit between
every `self._method()` call the actor makes to itself. Those calls never carry a trace
context, so the wrapper does nothing but add a call with `*args, **kwargs` (and a second
coroutine for an async method). On a partition leader that was ~5% of its CPU (py-spy,
`benchmarks/latency_cpu_bench.py`).

`call_methods_directly(self)`, run in an actor's `__init__`, binds each wrapped method on
the instance to the function the wrapper wraps. Ray runs remote calls through the methods
it collected from the class when it loaded it, never through the instance, so they keep
their wrappers and tracing. A class that Ray did not wrap (a test's instance) is left as
it is.
"""

from __future__ import annotations

from typing import Any

_RAY_TRACING_MARK = "__ray_tracing_wrapped__"  # set on each wrapper by ray/util/tracing/tracing_helper.py


def call_methods_directly(instance: Any) -> int:
    """Binds the instance's methods that Ray wrapped to the methods they wrap; returns how many."""
    ray_class = type(instance)
    bound = 0
    for name, value in vars(ray_class).items():
        if getattr(value, _RAY_TRACING_MARK, False) and not name.startswith("__"):
            # The wrapped method: the same name looked up past Ray's subclass.
            setattr(instance, name, getattr(super(ray_class, instance), name))
            bound += 1
    return bound
