"""Every conformance test runs once per backend: `local` (merged mode) and `cluster` (separated
mode, against a real mop broker process started once for the session).

A test that applies to some backends only says so, with the reason, by
`@pytest.mark.backends("local", reason="...")`; the others report it as skipped with that reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from mop.processor.backend import Backend
from tests.conformance.harness import (
    ClusterDeployment,
    Deployment,
    LocalDeployment,
    Names,
    open_peer,
)
from tests.e2e.nodeproc import NodeProcess, broker_process

BACKENDS = ("local", "cluster")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "backends(*kinds, reason): a conformance test that applies only to these backends",
    )


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One mop broker process (Pulsar protocol only) for every cluster test of the session:
    it takes a second or more to start. Tests keep apart by their names (see `Names`)."""
    with broker_process(tmp_path_factory.mktemp("broker") / "data").serving() as process:
        yield process


@pytest.fixture(params=BACKENDS)
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Deployment:
    kind: str = request.param
    marker = request.node.get_closest_marker("backends")
    if marker is not None and kind not in marker.args:
        pytest.skip(f"{kind}: {marker.kwargs['reason']}")
    if kind == "local":
        return LocalDeployment(tmp_path_factory.mktemp("local") / "broker")
    broker: NodeProcess = request.getfixturevalue("broker")
    return ClusterDeployment(broker.service_url)


@pytest.fixture
async def backend(deployment: Deployment) -> AsyncIterator[Backend]:
    async with deployment.open_backend() as running:
        yield running


@pytest.fixture
async def peer(deployment: Deployment, backend: Backend) -> AsyncIterator[Backend]:
    """Another backend beside `backend` (see `open_peer`)."""
    async with open_peer(deployment, backend) as running:
        yield running


@pytest.fixture
def names() -> Names:
    return Names()
