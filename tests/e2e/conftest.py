"""Fixtures for end-to-end tests: a real node on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import close_all
from tests.e2e.raw import OPEN_RAW_CLIENTS


@pytest.fixture
def node() -> Iterator[RunningNode]:
    with running_node(node_settings()) as running:
        yield running


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    """Close every test client after each test, so no socket outlives its test."""
    yield
    close_all()
    while OPEN_RAW_CLIENTS:
        OPEN_RAW_CLIENTS.pop().close()
