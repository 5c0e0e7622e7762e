"""The backend of separated mode: remote brokers (mop or Apache Pulsar) through the Pulsar protocol.

`backend` is the `ClusterBackend`; the other modules are its parts, which share a
`ClusterContext` (`context`) and never import `backend`.
"""

from mop.backends.cluster.admin import get_topics
from mop.backends.cluster.backend import ClusterBackend, open_cluster_backend
from mop.backends.cluster.consumers import ClusterConsumer
from mop.backends.cluster.fanout_consumer import FanOutConsumer
from mop.backends.cluster.leases import ClusterLease
from mop.backends.cluster.options import ConsumerOptions, ProducerOptions
from mop.backends.cluster.roles import ClusterRole
from mop.backends.cluster.tables import ClusterTable

__all__ = [
    "ClusterBackend",
    "ClusterConsumer",
    "ClusterLease",
    "ClusterRole",
    "ClusterTable",
    "ConsumerOptions",
    "FanOutConsumer",
    "ProducerOptions",
    "get_topics",
    "open_cluster_backend",
]
