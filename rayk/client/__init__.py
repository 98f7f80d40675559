"""rayk's Python front door: deploy or attach to a cluster and use it through actor handles."""

from rayk.client.cluster import Cluster, connect, start

__all__ = ["Cluster", "connect", "start"]
