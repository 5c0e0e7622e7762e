"""Fixtures of the MQTT end-to-end tests (the node itself comes from tests/e2e/conftest.py, in
the test's mode); plain helpers on raw clients are in tests/e2e/raw.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from mop.testing.certs import TestCertificates, make_test_certificates
from tests.e2e.raw import RawClient


@pytest.fixture
def raws() -> Iterator[Callable[..., RawClient]]:
    """Open RawClients that are closed after the test."""
    opened: list[RawClient] = []

    def open_raw(port: int, level: int = 5) -> RawClient:
        raw = RawClient(port, level=level)
        opened.append(raw)
        return raw

    yield open_raw
    for raw in opened:
        raw.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TestCertificates:
    """A CA with server and client certificates, made once per module."""
    return make_test_certificates(tmp_path_factory.mktemp("certs"))
