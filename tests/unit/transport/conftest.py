"""Fixtures shared by the transport tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from mop.testing import TestCertificates, make_test_certificates


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> TestCertificates:
    # Key generation is cheap with EC keys, but one set per session is plenty.
    directory: Path = tmp_path_factory.mktemp("certs")
    return make_test_certificates(directory)
