"""Helpers for tests of separated mode: a `ClusterBackend` against running brokers, and
settings for a broker node (Pulsar adapter only) on free loopback ports.

    async with open_cluster_backend("pulsar://127.0.0.1:6650") as backend:
        await backend.publish(topic, message)
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mop.backends.cluster import ClusterBackend
from mop.backends.cluster import open_cluster_backend as _open
from mop.settings import PulsarSettings, Settings
from mop.testing.node import as_proxy, node_settings

__all__ = ["broker_settings", "open_cluster_backend", "proxy_settings"]

# Shorter than production defaults, so a test that goes wrong fails in seconds, not minutes.
TEST_OPTIONS: dict[str, Any] = {"operation_timeout": 10.0, "fence_timeout": 5.0}


@asynccontextmanager
async def open_cluster_backend(service_url: str, **options: Any) -> AsyncIterator[ClusterBackend]:
    """A started `ClusterBackend` (keyword arguments as for ClusterBackend, with test
    timeouts unless given), closed when the block ends."""
    async with _open(service_url, **{**TEST_OPTIONS, **options}) as backend:
        yield backend


def broker_settings(**overrides: Any) -> Settings:
    """A throw-away broker node: the Pulsar adapter alone, on a free port (see
    `mop.testing.node.node_settings` for the data directory)."""
    settings = node_settings()
    return dataclasses.replace(
        settings, protocols=("pulsar",), pulsar=PulsarSettings(port=0), **overrides
    )


def proxy_settings(service_url: str, **mqtt: Any) -> Settings:
    """A separated-mode proxy (MQTT only) in front of the brokers at `service_url`."""
    return as_proxy(node_settings(**mqtt), service_url)
