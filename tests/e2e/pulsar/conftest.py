"""Fixtures of the Pulsar end-to-end tests: one node with the Pulsar adapter per module, a
pulsar-client connected to it and a topic of its own for each test; `deployment` for tests
that run merged and separated."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pulsar
import pytest

from mop.testing.cluster import broker_settings, proxy_settings
from mop.testing.node import RunningNode, running_node
from tests.e2e.pulsar_support import (
    Deployment,
    pulsar_client,
    pulsar_node,
    service_url,
    topic_for,
)


@pytest.fixture(scope="module")
def node() -> Iterator[RunningNode]:
    """A merged node serving MQTT and Pulsar, shared by the tests of one module."""
    with pulsar_node() as running:
        yield running


@pytest.fixture
def client(node: RunningNode) -> Iterator[pulsar.Client]:
    with pulsar_client(node) as connected:
        yield connected


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return topic_for(request.node.name)


@pytest.fixture(scope="module", params=["merged", "separated"])
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """Merged: one node for both protocols. Separated: Pulsar clients on a broker node, MQTT
    clients on a proxy in front of it (the Pulsar adapter runs on brokers only)."""
    if request.param == "merged":
        with pulsar_node() as node:
            yield Deployment(node, node, separated=False)
        return
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(running_node(broker_settings()))
        proxy = stack.enter_context(running_node(proxy_settings(service_url(broker))))
        yield Deployment(broker, proxy, separated=True)
