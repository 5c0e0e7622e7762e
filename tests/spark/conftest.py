"""Fixtures for the Spark data source tests: one local Spark session and one mop node (MQTT and
Pulsar on free loopback ports) for the whole run; each test uses topics of its own.

Spark needs pyspark, pyarrow and a Java runtime. Without them these tests are not collected
and the run says why; with REQUIRE_SPARK_TESTS=1 (as tox sets) that is an error instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from mop.testing.node import RunningNode
from tests.e2e.clients import close_all
from tests.e2e.pulsar_support import pulsar_client, pulsar_node
from tests.e2e.pulsar_support import service_url as url_of


def _missing() -> str | None:
    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (java on PATH or JAVA_HOME)"
    return None


MISSING = _missing()
if MISSING is not None:
    if os.environ.get("REQUIRE_SPARK_TESTS") == "1":
        raise RuntimeError(f"REQUIRE_SPARK_TESTS=1 but the Spark tests cannot run: {MISSING}")
    collect_ignore_glob = ["test_*.py"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MISSING is not None:
        terminalreporter.write_line(f"tests/spark not collected: {MISSING}", yellow=True)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import mop.spark  # needs pyspark, which may be missing (see above)

    session = mop.spark.local_session("mop-tests", work_dir=tmp_path_factory.mktemp("spark"))
    mop.spark.register(session)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture(scope="session")
def node() -> Iterator[RunningNode]:
    with pulsar_node() as running:
        yield running


@pytest.fixture(scope="session")
def service_url(node: RunningNode) -> str:
    return url_of(node)


@pytest.fixture
def client(node: RunningNode) -> Iterator[pulsar.Client]:
    with pulsar_client(node) as running:
        yield running


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """An MQTT topic name of this test's own."""
    local = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)
    return f"spark/{local}"


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoint")


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    """Close every MQTT test client after each test."""
    yield
    close_all()
