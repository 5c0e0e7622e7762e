"""Fixtures for end-to-end tests: a real node on free loopback ports, in either deployment mode.

Modules marked `pytestmark = pytest.mark.both_modes` (the MQTT ones) run every test in both
modes, so a feature cannot work in one mode only:
- `merged`: one in-process node with its own broker and storage;
- `separated`: an in-process proxy node (`mode = "separated"`, MQTT only) in front of a mop
  broker process (Pulsar only), one broker per test module because it is slow to start. Each
  test's proxies get a namespace of their own on that broker, so tests do not see each
  other's topics, subscriptions or tables.
A node a test starts itself with `running_node(settings)` runs in the test's mode too: in
separated mode the module's `running_node` is replaced, for that test, by one that turns the
settings into a proxy's. A test of what a proxy cannot do (or of merged-mode internals) says
so with `@pytest.mark.merged_only(reason="...")`; its separated run is skipped with the reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import pytest

from mop.settings import Settings
from mop.testing.node import RunningNode, as_proxy, node_settings, running_node
from tests.e2e.clients import close_all
from tests.e2e.nodeproc import NodeProcess, broker_process
from tests.e2e.raw import OPEN_RAW_CLIENTS

# Which modes the `both_modes` tests run in; both by default, so a feature cannot work in one
# mode only.
# `E2E_MODES=merged pytest tests/e2e` narrows a local run to one.
MODES = tuple(os.environ.get("E2E_MODES", "merged,separated").split(","))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked `both_modes` (usually through its module's `pytestmark`) runs once per mode
    of MODES, whether or not it asks for `node`: the autouse `topology` depends on `mode`."""
    if metafunc.definition.get_closest_marker("both_modes") is not None:
        metafunc.parametrize("mode", MODES, indirect=True)


@dataclass(frozen=True, slots=True)
class Topology:
    """How the nodes of one test are deployed: merged, or proxies in front of `service_url`
    in their own `namespace`."""

    mode: str
    service_url: str = ""
    namespace: str = ""

    def settings(self, settings: Settings | None = None) -> Settings:
        settings = settings or node_settings()
        if self.mode == "merged":
            return settings
        return as_proxy(settings, self.service_url, namespace=self.namespace)

    def running_node(
        self, settings: Settings | None = None, *, timeout: float = 30
    ) -> AbstractContextManager[RunningNode]:
        return running_node(self.settings(settings), timeout=timeout)


@pytest.fixture
def mode(request: pytest.FixtureRequest) -> str:
    """The deployment mode of the test (`both_modes` tests run in each; the others are merged)."""
    mode: str = getattr(request, "param", "merged")
    marker = request.node.get_closest_marker("merged_only")
    if mode == "separated" and marker is not None:
        pytest.skip(f"separated: {marker.kwargs['reason']}")
    return mode


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """The broker process of the separated-mode tests of one module."""
    with broker_process(tmp_path_factory.mktemp("broker") / "data").serving() as process:
        yield process


@pytest.fixture(autouse=True)
def topology(
    mode: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Topology:
    if mode == "merged":
        return Topology(mode)
    broker: NodeProcess = request.getfixturevalue("broker")
    topology = Topology(mode, broker.service_url, f"t-{uuid.uuid4().hex[:12]}")
    if hasattr(request.module, "running_node"):
        monkeypatch.setattr(request.module, "running_node", topology.running_node)
    return topology


@pytest.fixture
def node(topology: Topology) -> Iterator[RunningNode]:
    with topology.running_node() as running:
        yield running


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    """Close every test client after each test, so no socket outlives its test."""
    yield
    close_all()
    while OPEN_RAW_CLIENTS:
        OPEN_RAW_CLIENTS.pop().close()
