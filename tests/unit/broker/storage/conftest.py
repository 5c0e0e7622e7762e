"""Fixtures for the storage tests: one harness per `Storage` implementation, so the behaviour
they share is written once and run against each."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mop.broker.storage import MemoryStorage, Storage
from mop.broker.storage.durable import DurableStorage, open_durable_storage
from mop.settings import StorageSettings


class Harness:
    """Opens a store of one kind and reopens it the way a restart would."""

    def __init__(self, kind: str, directory: Path, settings: StorageSettings) -> None:
        self.kind = kind
        self.directory = directory
        self.settings = settings
        self.store: Storage = MemoryStorage()

    @property
    def durable(self) -> bool:
        return self.kind == "durable"

    async def open(self) -> Storage:
        if self.durable:
            self.store = await open_durable_storage(self.directory, self.settings)
        return self.store

    async def reopen(self) -> Storage:
        await self.store.aclose()
        if isinstance(self.store, MemoryStorage):
            self.store.reopen()
            return self.store
        return await self.open()

    async def close(self) -> None:
        if isinstance(self.store, DurableStorage) and self.store.closed:
            return
        await self.store.aclose()


def small_settings(**overrides: object) -> StorageSettings:
    fields: dict[str, object] = {"segment_bytes": 4096, "fsync": "always"}
    fields.update(overrides)
    return StorageSettings(**fields)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "durable"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(request.param, tmp_path / "log", small_settings())
    await harness.open()
    yield harness
    await harness.close()


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Every fsync made from now on (each still done): its descriptor and the name of the
    thread that made it."""
    made: list[tuple[int, str]] = []
    real = os.fsync

    def recording_fsync(fd: int) -> None:
        made.append((fd, threading.current_thread().name))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return made


@pytest.fixture
async def durable(tmp_path: Path) -> AsyncIterator[DurableStorage]:
    store = await open_durable_storage(tmp_path / "log", small_settings())
    yield store
    if not store.closed:
        await store.aclose()
