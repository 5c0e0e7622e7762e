"""Fixtures of the Pulsar end-to-end tests: one node with the Pulsar adapter per module, a
pulsar-client connected to it and a topic of its own for each test."""

from __future__ import annotations

from collections.abc import Iterator

import pulsar
import pytest

from mop.testing.node import RunningNode
from tests.e2e.pulsar_support import pulsar_client, pulsar_node, topic_for


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
