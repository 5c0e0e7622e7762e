"""A sync whose caller is cancelled (a client that disconnects while its publish waits) must
still write what it took from the queue: the records queued after it are written at later
positions, so a batch given up half way would leave a hole that every later record is cut
off behind at recovery."""

from __future__ import annotations

from pathlib import Path

import trio

from mop.broker.storage.durable import open_durable_storage
from mop.message import Message
from tests.unit.broker.storage.conftest import small_settings


async def test_a_cancelled_sync_leaves_no_hole_in_the_log(tmp_path: Path) -> None:
    settings = small_settings(fsync="always")  # every write goes through a worker thread
    store = await open_durable_storage(tmp_path, settings)
    first = store.append("t", [Message(b"from a client that went away", qos=1)])
    with trio.CancelScope() as scope:
        scope.cancel()
        await store.sync()
    second = store.append("t", [Message(b"from a client that stayed", qos=1)])
    await store.sync()
    page = await store.read("t", None, 10)
    assert [i for i, _ in page] == first + second
    await store.aclose()

    store = await open_durable_storage(tmp_path, settings)
    try:
        page = await store.read("t", None, 10)
        assert [m.payload for _, m in page] == [
            b"from a client that went away",
            b"from a client that stayed",
        ]
    finally:
        await store.aclose()
