"""rayk: a Kafka-style replicated log broker that runs as Ray actors.

    cluster = rayk.start(brokers=3, data_dir="./rayk-data")   # or rayk.connect()

The entry points load lazily, so `rayk.storage` stays usable without importing Ray.
"""

from typing import Any

__all__ = ["Cluster", "connect", "start"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import rayk.client

        return getattr(rayk.client, name)
    raise AttributeError(f"module 'rayk' has no attribute {name!r}")
