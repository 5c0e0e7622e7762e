"""`ClusterContext`: what the parts of the separated-mode backend share, made by
`ClusterBackend.serve` once the client runs and handed to each part instead of the backend.

A part that must tell the backend something (a consumer that is gone, say) gets a callback of
its own for it; no part sees the `ClusterBackend`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio

from mop.backends.cluster.discovery import NamespaceDiscovery
from mop.backends.cluster.options import ConsumerOptions
from mop.backends.cluster.producers import ProducerCache
from mop.backends.cluster.timing import Delays
from mop.backends.node_local import LocalTopics
from mop.protocols.pulsar.driver import PulsarClient

__all__ = ["ClusterContext"]


@dataclass(frozen=True, slots=True)
class ClusterContext:
    """The running backend's settings and shared services."""

    # The default tenant and namespace: MQTT names map into them, system topics are kept
    # per namespace (`mop.topic_names.system_topic`).
    tenant: str
    namespace: str
    # How long a request to the brokers may take, and a takeover may wait for the previous
    # holder of a client id.
    operation_timeout: float
    fence_timeout: float
    consumer_options: ConsumerOptions
    # The backend's Pulsar client; raises BackendError once the backend has closed it.
    client: Callable[[], PulsarClient]
    # A new client with the backend's settings, for connections of its own (roles): run it
    # with `await nursery.start(client.serve)` and close it with `aclose()`.
    new_client: Callable[[], PulsarClient]
    # The backend's nursery, for background work of the parts (it runs until `aclose`).
    nursery: trio.Nursery
    delays: Delays
    producers: ProducerCache
    local: LocalTopics
    discovery: NamespaceDiscovery
