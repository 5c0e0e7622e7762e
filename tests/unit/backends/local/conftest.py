"""A running `LocalBackend` over memory storage, for the tests of its parts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mop.backends.local import open_local_backend
from mop.broker.storage import MemoryStorage
from mop.processor.backend import Backend


@pytest.fixture
def storage() -> MemoryStorage:
    return MemoryStorage()


@pytest.fixture
async def backend(storage: MemoryStorage) -> AsyncIterator[Backend]:
    async with open_local_backend(storage, fence_timeout=5.0, trim_interval=0.5) as running:
        yield running
