"""`BanStore` over the local backend's table: it loads the bans the table holds, follows
writes made through the broker (a Pulsar client's, another node's), writes its own, and
removes the bans that are over."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from functools import partial

import pytest
import trio
import trio.testing

from mop.backends.local import LocalBackend, open_local_backend
from mop.broker.storage import MemoryStorage
from mop.message import TOMBSTONE_PROPERTY, Message
from mop.processor.backend import BackendError
from mop.security.abuse import BANS_TABLE, Ban, ban_key, decode_ban, encode_ban
from mop.security.ban_store import BanStore


class Clock:
    """Seconds since the epoch, as the test sets them."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with open_local_backend(MemoryStorage()) as running:
        yield running


@pytest.fixture
def clock() -> Clock:
    return Clock()


def stored(backend: LocalBackend) -> dict[str, Ban]:
    """The bans the table holds, read back from it."""
    return {key: decode_ban(key, value) for key, value in backend.table(BANS_TABLE).items()}


async def write_elsewhere(backend: LocalBackend, key: str, value: bytes | None) -> None:
    """A write of the table's topic that does not come through the store: a Pulsar client's
    (`mop ban` on another host, a proxy), through the broker."""
    topic = backend.table(BANS_TABLE).topic
    properties = ((TOMBSTONE_PROPERTY, "1"),) if value is None else ()
    await backend.publish(topic, Message(value or b"", properties, key=key))


def match(store: BanStore, client_id: str = "x", address: str = "") -> Ban | None:
    return store.match(client_id=client_id, username=None, address=address)


async def test_the_store_loads_the_bans_of_the_table(backend: LocalBackend, clock: Clock) -> None:
    table = backend.table(BANS_TABLE)
    ban = Ban("clientid", "c", None, "manual", 1.0)
    await table.put("clientid:c", encode_ban(ban))
    await table.put("clientid:junk", b"not a ban")
    store = BanStore(table, clock=clock)
    assert match(store, "c") == ban
    assert len(store.bans) == 1


async def test_add_writes_the_ban_normalised(backend: LocalBackend, clock: Clock) -> None:
    store = BanStore(backend.table(BANS_TABLE), clock=clock)
    ban = await store.add(Ban("address", "::ffff:10.1.2.3/104", None, "manual", clock.now))
    assert ban.value == "10.0.0.0/8"
    assert stored(backend) == {"address:10.0.0.0/8": ban}
    assert match(store, address="10.200.0.1") == ban
    with pytest.raises(ValueError):
        await store.add(Ban("address", "nowhere", None))
    with pytest.raises(ValueError):  # nobody could read it back
        await store.add(Ban("clientid", "c", None, "r" * 2000))
    assert len(stored(backend)) == 1


async def test_remove_lifts_a_ban_from_the_table(backend: LocalBackend, clock: Clock) -> None:
    store = BanStore(backend.table(BANS_TABLE), clock=clock)
    await store.add(Ban("username", "u", None))
    assert await store.remove("username", "u")
    assert stored(backend) == {}
    assert store.match(client_id="x", username="u", address="") is None
    assert not await store.remove("username", "u")


async def test_writes_through_the_broker_are_followed(backend: LocalBackend, clock: Clock) -> None:
    store = BanStore(backend.table(BANS_TABLE), clock=clock)
    ban = Ban("clientid", "c", clock.now + 60, "manual", clock.now)
    await write_elsewhere(backend, ban_key("clientid", "c"), encode_ban(ban))
    assert match(store, "c") == ban
    await write_elsewhere(backend, ban_key("clientid", "c"), None)
    assert match(store, "c") is None
    # One that was there before: removing it elsewhere is followed too.
    await store.add(ban)
    await write_elsewhere(backend, ban_key("clientid", "c"), None)
    assert match(store, "c") is None


async def test_a_ban_stops_applying_at_its_end_and_is_removed_after(
    backend: LocalBackend, clock: Clock
) -> None:
    store = BanStore(backend.table(BANS_TABLE), clock=clock)
    await store.add(Ban("clientid", "short", clock.now + 10, "manual", clock.now))
    await store.add(Ban("clientid", "long", clock.now + 100, "manual", clock.now))
    await store.add(Ban("clientid", "forever", None, "manual", clock.now))
    assert await store.remove_expired() == 0
    clock.now += 10
    assert match(store, "short") is None  # at once, before any removal
    assert match(store, "long") is not None
    assert await store.remove_expired() == 1
    assert sorted(stored(backend)) == ["clientid:forever", "clientid:long"]


async def test_a_ban_set_again_for_longer_is_not_removed(
    backend: LocalBackend, clock: Clock
) -> None:
    store = BanStore(backend.table(BANS_TABLE), clock=clock)
    await store.add(Ban("clientid", "c", clock.now + 10, "manual", clock.now))
    clock.now += 20
    # Set again by someone whose write the store has not followed yet (a table that lags).
    longer = Ban("clientid", "c", clock.now + 100, "manual", clock.now)
    await backend.table(BANS_TABLE).put("clientid:c", encode_ban(longer))
    assert await store.remove_expired() == 0
    assert stored(backend) == {"clientid:c": longer}
    assert match(store, "c") == longer


async def test_serve_expiry_removes_bans_that_are_over(
    backend: LocalBackend, clock: Clock, autojump_clock: trio.testing.MockClock
) -> None:
    store = BanStore(backend.table(BANS_TABLE), clock=clock)
    await store.add(Ban("clientid", "c", clock.now + 10, "manual", clock.now))
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(store.serve_expiry, interval=5.0))
        await trio.sleep(12)
        assert "clientid:c" in stored(backend)
        clock.now += 10
        await trio.sleep(6)
        assert stored(backend) == {}
        nursery.cancel_scope.cancel()


class FailingTable:
    """A table whose deletes fail `failures` times, then go to `table`."""

    def __init__(self, table: object, failures: int) -> None:
        self._table = table
        self.failures = failures
        self.name = BANS_TABLE

    def __getattr__(self, name: str) -> object:
        return getattr(self._table, name)

    async def put(self, key: str, value: bytes | None) -> None:
        if value is None and self.failures:
            self.failures -= 1
            raise BackendError("broker unreachable", reason="unavailable")
        await self._table.put(key, value)  # type: ignore[attr-defined]


async def test_serve_expiry_carries_on_after_a_failed_removal(
    backend: LocalBackend,
    clock: Clock,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    table = FailingTable(backend.table(BANS_TABLE), failures=1)
    store = BanStore(table, clock=clock)  # type: ignore[arg-type]
    await store.add(Ban("clientid", "c", clock.now + 1, "manual", clock.now))
    clock.now += 2
    caplog.set_level(logging.WARNING, "mop.security")
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(store.serve_expiry, interval=5.0))
        await trio.sleep(1)
        assert "broker unreachable" in caplog.text
        assert "clientid:c" in stored(backend)
        await trio.sleep(5)
        assert stored(backend) == {}
        nursery.cancel_scope.cancel()
