"""Tables (retained messages, MQTT session state): a durable key -> value map that survives a
restart of the backend and that every backend of a deployment sees.

A node names the tables its adapters read when it starts its backend (`tables`), so they can
be read at once; any other table can be written at once and read after a write."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from tests.conformance.harness import DEADLINE, QUIET, Deployment, Names, open_peer

POLL = 0.02


async def test_put_get_items_and_delete(deployment: Deployment, names: Names) -> None:
    name, other = names.sub("table"), names.sub("other")
    async with deployment.open_backend(tables=[name, other]) as backend:
        table = backend.table(name)
        assert table.name == name
        assert table.get("a") is None
        assert list(table.items()) == []
        await table.put("a/b", b"1")
        await table.put("c", b"2")
        await table.put("c", b"3")  # the latest value wins
        await table.put("gone", b"x")
        await table.put("gone", None)
        await table.put("never", None)  # deleting a missing key is fine
        assert (table.get("a/b"), table.get("c"), table.get("gone")) == (b"1", b"3", None)
        assert sorted(table.items()) == [("a/b", b"1"), ("c", b"3")]
        # Two tables do not share keys.
        assert backend.table(other).get("a/b") is None


async def test_a_table_not_named_at_start_reads_its_own_writes(
    deployment: Deployment, names: Names
) -> None:
    async with deployment.open_backend() as backend:
        table = backend.table(names.sub("late"))
        await table.put("k", b"v")
        assert table.get("k") == b"v"
        assert list(table.items()) == [("k", b"v")]


async def test_a_table_survives_a_restart(deployment: Deployment, names: Names) -> None:
    name = names.sub("table")
    async with deployment.open_backend(tables=[name]) as backend:
        table = backend.table(name)
        await table.put("kept", b"\x00\x01")
        await table.put("changed", b"old")
        await table.put("changed", b"new")
        await table.put("deleted", b"x")
        await table.put("deleted", None)
    async with deployment.open_backend(tables=[name]) as backend:
        # Read at once, as the MQTT layer does when it starts (retained messages, sessions).
        table = backend.table(name)
        assert sorted(table.items()) == [("changed", b"new"), ("kept", b"\x00\x01")]
        assert table.get("deleted") is None


async def test_a_table_is_seen_by_every_backend(deployment: Deployment, names: Names) -> None:
    name = names.sub("table")
    async with (
        deployment.open_backend(tables=[name]) as backend,
        open_peer(deployment, backend, tables=[name]) as peer,
    ):
        mine, theirs = backend.table(name), peer.table(name)
        await mine.put("k", b"v1")
        await wait_for_value(theirs.get, "k", b"v1")
        await theirs.put("k", b"v2")
        await wait_for_value(mine.get, "k", b"v2")
        await mine.put("k", None)
        await wait_for_value(theirs.get, "k", None)


async def wait_for_value(get: Callable[[str], bytes | None], key: str, value: bytes | None) -> None:
    """Poll until `get(key)` is `value`: another backend learns of a change a little later."""
    with trio.move_on_after(DEADLINE):
        for _ in range(int(DEADLINE / POLL) + 1):
            if get(key) == value:
                break
            await trio.sleep(POLL)
    assert get(key) == value, f"{key!r} is {get(key)!r}, not {value!r}, after {DEADLINE}s"


async def test_own_writes_are_not_reported_to_watchers(
    deployment: Deployment, names: Names
) -> None:
    name = names.sub("table")
    async with deployment.open_backend(tables=[name]) as backend:
        table = backend.table(name)
        reported: list[tuple[str, bytes | None]] = []
        table.watch(lambda key, value: reported.append((key, value)))
        for n in range(30):
            await table.put(f"k{n % 3}", f"{n}".encode())
            await table.put(f"k{n % 3}", None)
        await trio.sleep(QUIET)  # a report of our own write would come in this while
        assert reported == []


@pytest.mark.backends("cluster", reason="one node owns local storage: nobody else writes to it")
async def test_writes_elsewhere_are_reported_to_watchers(
    deployment: Deployment, names: Names
) -> None:
    name = names.sub("table")
    async with (
        deployment.open_backend(tables=[name]) as backend,
        open_peer(deployment, backend, tables=[name]) as peer,
    ):
        reported: list[tuple[str, bytes | None]] = []
        changed = trio.Event()

        def watcher(key: str, value: bytes | None) -> None:
            reported.append((key, value))
            changed.set()

        backend.table(name).watch(watcher)
        await peer.table(name).put("k", b"v")
        with trio.fail_after(DEADLINE):
            await changed.wait()
        await peer.table(name).put("k", None)
        with trio.fail_after(DEADLINE):
            while len(reported) < 2:
                changed = trio.Event()
                await changed.wait()
        assert reported == [("k", b"v"), ("k", None)]
        assert backend.table(name).get("k") is None
