"""A running `LocalBackend` over memory storage, for the tests of its parts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from mop.backends.local import open_local_backend
from mop.broker.storage import MemoryStorage
from mop.processor.backend import Backend


@pytest.fixture
def storage() -> MemoryStorage:
    return MemoryStorage()


@pytest.fixture
def backend_options() -> dict[str, Any]:
    """Options of `open_local_backend` for the `backend` fixture; a module may override it."""
    return {"fence_timeout": 5.0, "trim_interval": 0.5}


@pytest.fixture
async def backend(
    storage: MemoryStorage, backend_options: dict[str, Any]
) -> AsyncIterator[Backend]:
    async with open_local_backend(storage, **backend_options) as running:
        yield running
