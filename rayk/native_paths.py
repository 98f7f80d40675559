"""Which of the native per-request paths (rayk._native, built from native/) a process uses.

RAYK_NATIVE, read each time a path is chosen (a process takes its environment from the one
that started it: the Ray cluster's, for actors):
- unset, "1" or "all": every path that is built;
- "0" or "none": none (the Python paths; as on a machine without cargo);
- a comma-separated list of path names: those only, e.g. "listener,client";
- "-name" entries: every path but those, e.g. "-parked_fetch,-parked_produce".

The paths, each of which can be measured against the Python one alone:
- "listener": the listener's Produce (rayk/net/native_produce.py);
- "kafka_conns": a PLAINTEXT listener's client connections read and written natively, their
  plain Produce requests served without Python (rayk/net/native_client.py; needs "listener");
- "endpoint": a replica endpoint's plain connections (rayk/dataplane/native_endpoint.py);
- "client": every plain Connection to an endpoint (rayk/dataplane/native_connection.py);
- "parked_fetch": a leader answering its followers' and the listeners' consumer fetches
  without a task (LeaderFetch.fetch_or_park);
- "parked_produce": a leader answering produce calls without a task, its acks=-1 ones once
  replicated (LeaderProduce.produce_or_park, delayed_produce.py);
- "follower": a follower's copy loop on a thread of its own, which writes what it fetches
  to the log before Python takes it in (rayk/replication/native_copy.py).
The two parked paths are Python, not native code, but they serve the requests the native
endpoint hands over, so they need "endpoint"; "kafka_conns" submits to the listener's
native produce path, so it needs "listener".

A value naming a path that does not exist is InvalidConfigurationError, naming the ones
that do: a misspelt switch would otherwise measure something else than was asked for.
`rayk.start` checks the driver's value before it deploys anything (where the Ray cluster
it starts takes it from). A process that meets one anyway (its Ray cluster was started
with another environment) logs it once as an error and uses the Python paths: its data
plane keeps serving.
"""

from __future__ import annotations

import logging
import os

from rayk.errors import InvalidConfigurationError

try:
    import rayk._native as _native
except ImportError:  # built without cargo: every path is Python's
    _native = None

logger = logging.getLogger(__name__)

ENV = "RAYK_NATIVE"
PATHS = ("listener", "kafka_conns", "endpoint", "client", "parked_fetch", "parked_produce", "follower")
_ALL, _NONE = ("", "1", "all"), ("0", "none")
_reported: set[str] = set()  # the invalid values logged already


def built() -> bool:
    """Whether rayk._native was built (setup.py, where cargo is installed)."""
    return _native is not None


def chosen(value: str) -> frozenset[str]:
    """The paths a value of RAYK_NATIVE turns on (before asking whether they are built)."""
    value = value.strip().lower()
    if value in _ALL:
        return frozenset(PATHS)
    if value in _NONE:
        return frozenset()
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = sorted({name.lstrip("-") for name in names} - set(PATHS))
    if unknown:
        raise InvalidConfigurationError(f"{ENV}={value!r} names no native path {', '.join(unknown)}: the paths are "
                         f"{', '.join(PATHS)} (or 1/all, 0/none)")
    excluded = {name[1:] for name in names if name.startswith("-")}
    included = {name for name in names if not name.startswith("-")}
    if included and excluded:
        raise InvalidConfigurationError(f"{ENV}={value!r} both names paths and excludes some: give one or the other")
    return frozenset(included) if included else frozenset(PATHS) - excluded


def failure(e: BaseException) -> bool:
    """Whether an exception out of a native call is its failure (a bug), which ends that
    path in its process: an Exception, or PyO3's PanicException (a BaseException, so that
    a panic is not caught as an ordinary error); not a cancellation or an interrupt."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"


def enabled(path: str) -> bool:
    """Whether `path` (one of PATHS) runs natively in this process: built, and chosen."""
    assert path in PATHS, path
    if _native is None:
        return False
    value = os.environ.get(ENV, "")
    try:
        on = chosen(value)
    except InvalidConfigurationError as e:
        if value not in _reported:
            _reported.add(value)
            logger.error("%s; this process uses the Python paths", e)
        return False
    needs = "endpoint" if path.startswith("parked_") else "listener" if path == "kafka_conns" else None
    return path in on and (needs is None or needs in on)
