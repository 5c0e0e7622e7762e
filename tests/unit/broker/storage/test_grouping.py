"""WriteGrouping: a write waits a turn for other publishers only while they join it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from mop.broker.storage.durable import DurableStorage, open_durable_storage
from mop.broker.storage.grouping import WriteGrouping
from mop.message import Message
from tests.unit.broker.storage.conftest import small_settings


def _waits(grouping: WriteGrouping, writes: int, callers: int) -> int:
    """Make `writes` writes, each asked for by `callers` tasks; how many of them waited."""
    waited = 0
    for _ in range(writes):
        wait = grouping.should_wait()
        waited += wait
        grouping.written(callers, waited=wait)
    return waited


def test_waits_while_others_join_the_writes() -> None:
    grouping = WriteGrouping(quiet=4, probe=16)
    assert _waits(grouping, 100, callers=3) == 100
    assert grouping.grouping


def test_stops_waiting_after_quiet_writes_that_nobody_joined_and_probes_now_and_then() -> None:
    grouping = WriteGrouping(quiet=4, probe=16)
    assert _waits(grouping, 4, callers=1) == 4  # waited, alone each time
    assert not grouping.grouping
    # From now on one write in `probe` waits, to see whether company came back.
    assert _waits(grouping, 160, callers=1) == 10


def test_company_at_a_probe_brings_the_waits_back() -> None:
    grouping = WriteGrouping(quiet=2, probe=5)
    _waits(grouping, 2, callers=1)
    assert not grouping.grouping
    assert _waits(grouping, 4, callers=1) == 0
    assert grouping.should_wait()  # the probe
    grouping.written(7, waited=True)
    assert grouping.grouping
    assert _waits(grouping, 10, callers=7) == 10


def test_company_without_a_wait_counts_too() -> None:
    grouping = WriteGrouping(quiet=1, probe=1000)
    _waits(grouping, 1, callers=1)
    assert not grouping.grouping
    grouping.written(2, waited=False)  # another caller's records were queued already
    assert grouping.grouping


def test_a_write_without_a_wait_that_nobody_joined_says_nothing() -> None:
    grouping = WriteGrouping(quiet=2, probe=1000)
    grouping.written(1, waited=True)
    grouping.written(1, waited=False)
    assert grouping.grouping  # one quiet wait so far, not two
    grouping.written(1, waited=True)
    assert not grouping.grouping


async def _burst(store: DurableStorage, publishers: int) -> None:
    """`publishers` tasks, ready in the same turn, each append a message and sync it."""

    async def publish(i: int) -> None:
        store.append("t", [Message(b"%d" % i)])
        await store.sync()

    async with trio.open_nursery() as nursery:
        for i in range(publishers):
            nursery.start_soon(publish, i)


async def test_a_store_shares_writes_among_ready_publishers_and_not_with_a_lone_one(
    tmp_path: Path,
) -> None:
    store = await open_durable_storage(tmp_path, small_settings(fsync="never"))
    writes = 0
    real = store.files.write_now

    def counting(*args: Any) -> bool:
        nonlocal writes
        writes += 1
        return real(*args)

    store.files.write_now = counting  # type: ignore[method-assign]
    await _burst(store, 20)
    assert writes == 1  # they all joined the first one's write
    # A lone publisher: after a few writes that nobody joined, no more waiting.
    for _ in range(10):
        await _burst(store, 1)
    assert not store._grouping.grouping
    # Publishers come back: a probe sees them, and their writes are shared again.
    bursts = store._grouping.probe + 1
    for _ in range(bursts):
        await _burst(store, 10)
    assert store._grouping.grouping
    writes = 0
    await _burst(store, 10)
    assert writes == 1
    await store.aclose()
    # Nothing was lost whichever way it was written.
    store = await open_durable_storage(tmp_path, small_settings())
    messages = await store.read("t", None, 10_000)
    assert len(messages) == 20 + 10 + 10 * bursts + 10
    await store.aclose()
