"""Fixtures of the separated-deployment tests. A module whose backends connect somewhere else
than its `broker` process overrides `open_backend`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from mop.backends.cluster import ClusterBackend
from mop.testing.cluster import open_cluster_backend
from tests.e2e.cluster.support import OpenBackend, proxy_process
from tests.e2e.nodeproc import NodeProcess


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    """A name of the test's own for its topics, subscriptions, tables and client ids: the
    module's name, so that modules never collide, and a random part for the test."""
    module = request.module.__name__.rpartition(".")[2].removeprefix("test_")
    return f"{module}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def open_backend(broker: NodeProcess) -> OpenBackend:
    """How the module's tests open a `ClusterBackend`: on the module's broker process."""
    return lambda: open_cluster_backend(broker.service_url)


@pytest.fixture
async def backend(open_backend: OpenBackend) -> AsyncIterator[ClusterBackend]:
    async with open_backend() as running:
        yield running


@pytest.fixture
async def peer(open_backend: OpenBackend) -> AsyncIterator[ClusterBackend]:
    """A second backend on the same broker: another proxy."""
    async with open_backend() as running:
        yield running


@pytest.fixture
def proxy_processes(broker: NodeProcess, tmp_path: Path) -> Iterator[list[NodeProcess]]:
    """Two `mop run` proxies in front of the module's broker process, stopped at the end."""
    started = [proxy_process(tmp_path / name, broker.service_url) for name in ("a", "b")]
    try:
        for proxy in started:
            proxy.start()
        yield started
    finally:
        for proxy in started:
            if proxy.running:
                proxy.stop()
            proxy.close()
