"""rayk: a Kafka-style replicated log broker that runs as Ray actors.

    cluster = rayk.start(brokers=3, data_dir="./rayk-data")   # or rayk.connect()

The entry points load lazily, so `rayk.storage` stays usable without importing Ray.
"""

from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["Cluster", "__version__", "connect", "start"]

try:
    __version__ = version("rayk")  # pyproject.toml's, as installed
except PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    if name in ("Cluster", "connect", "start"):
        import rayk.client

        return getattr(rayk.client, name)
    raise AttributeError(f"module 'rayk' has no attribute {name!r}")
