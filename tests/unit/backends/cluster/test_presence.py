"""Client ids across proxies (`mop.backends.cluster.leases`): the presence table that every
proxy follows, against an in-process mop node speaking the Pulsar protocol (two "proxies":
two clients, each with its own view of the table)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from mop.backends.cluster.context import ClusterContext
from mop.backends.cluster.leases import (
    CLEAN_UP_DELAY,
    PRESENCE_TABLE,
    PROXY_PREFIX,
    Frontier,
    Presence,
    parse_release,
    release_value,
)
from mop.backends.cluster.tables import ClusterTable, Position
from mop.messaging import BackendError
from tests.unit.backends.cluster.test_system_topics import namespace, proxy, url

__all__ = ["url"]  # the module's node, shared with the tables' tests


class Tables:
    """Stands for a proxy's session tables in step 4 of a claim: says where its own writes
    are (`written`), and records how far it was asked to read."""

    def __init__(self, written: Frontier | None = None) -> None:
        self.own: dict[str, Position] | None = dict(written or {})
        self.caught_up = 0
        self.read: list[Frontier] = []
        self.fail: BackendError | None = None  # what `read_through` raises

    async def catch_up(self) -> None:
        self.caught_up += 1
        await trio.lowlevel.checkpoint()

    def written(self) -> Frontier | None:
        return self.own

    async def read_through(self, frontier: Frontier) -> None:
        self.read.append(dict(frontier))
        await trio.lowlevel.checkpoint()
        if self.fail is not None:
            raise self.fail


def make_presence(context: ClusterContext, table: ClusterTable, tables: Tables) -> Presence:
    return Presence(
        context,
        table,
        catch_up=tables.catch_up,
        written=tables.written,
        read_through=tables.read_through,
    )


@asynccontextmanager
async def presence_of(
    context: ClusterContext, tables: Tables | None = None
) -> AsyncIterator[tuple[Presence, ClusterTable]]:
    table = ClusterTable(PRESENCE_TABLE, tenant=context.tenant, namespace=context.namespace)
    presence = make_presence(context, table, tables or Tables())
    async with trio.open_nursery() as nursery:
        await nursery.start(table.serve, context)
        await nursery.start(presence.serve)
        try:
            yield presence, table
        finally:
            await presence.aclose()
            await table.aclose()
            nursery.cancel_scope.cancel()


def claims(table: ClusterTable) -> dict[str, bytes]:
    return {k: v for k, v in table.items() if not k.startswith(PROXY_PREFIX)}


async def test_a_takeover_waits_for_the_holder_to_let_go(url: str) -> None:
    ns = namespace()
    async with (
        proxy(url, ns) as one,
        proxy(url, ns) as two,
        presence_of(one) as (first_proxy, first_table),
        presence_of(two) as (second_proxy, table),
    ):
        with trio.fail_after(5):
            first = await first_proxy.claim("c1")
        assert first.holding and not first.fenced
        let_go_at: list[float] = []

        async def let_go() -> None:
            await first.wait_fenced()
            await trio.sleep(0.3)  # the old connection saves its session meanwhile
            let_go_at.append(trio.current_time())
            await first.release()

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(let_go)
                second = await second_proxy.claim("c1")
                taken_at = trio.current_time()
        assert first.fenced and not second.fenced and second.holding
        assert let_go_at and taken_at >= let_go_at[0]
        await second.release()
        with trio.fail_after(5):  # each proxy reads the release in its own time
            await first_table.catch_up()
            await table.catch_up()
        assert not first_proxy._owners and not second_proxy._owners
        # The key is deleted once nothing claimed it for a while: nothing is left per client id.
        with trio.fail_after(CLEAN_UP_DELAY + 5):
            while claims(table):
                await table.catch_up()
                await trio.sleep(0.2)


async def test_a_reconnect_on_the_same_proxy_fences_the_old_connection(url: str) -> None:
    async with proxy(url, namespace()) as one, presence_of(one) as (presence, table):
        with trio.fail_after(5):
            first = await presence.claim("c1")
            async with trio.open_nursery() as nursery:

                async def let_go() -> None:
                    await first.wait_fenced()
                    await first.release()

                nursery.start_soon(let_go)
                second = await presence.claim("c1")
        assert first.fenced and second.holding
        assert list(claims(table)) == ["c1"]
        assert presence._owners["c1"][1] == second.nonce
        await second.release()


async def test_the_clients_of_a_proxy_that_said_goodbye_are_not_waited_for(url: str) -> None:
    ns = namespace()
    async with proxy(url, ns) as one, proxy(url, ns) as two, presence_of(two) as (second, _):
        async with presence_of(one) as (first, _):
            with trio.fail_after(5):
                held = await first.claim("c1")
        # The first proxy stopped without releasing (its process ended, say).
        assert held.fenced
        with trio.fail_after(2):  # well under the fence timeout (3 s here)
            taken = await second.claim("c1")
        assert taken.holding


async def test_a_silent_proxy_is_not_waited_for_past_its_liveness(url: str) -> None:
    ns = namespace()
    tables = Tables()
    async with (
        proxy(url, ns) as one,
        proxy(url, ns) as two,
        presence_of(two, tables) as (second, _),
    ):
        table = ClusterTable(PRESENCE_TABLE, tenant=one.tenant, namespace=one.namespace)
        dead = make_presence(one, table, Tables())
        async with trio.open_nursery() as nursery:
            await nursery.start(table.serve, one)
            # A claim with no heartbeat ever after: a proxy that died at once.
            await table.put("c9", f"{dead.proxy_id} abc".encode())
            started = trio.current_time()
            with trio.fail_after(5):
                taken = await second.claim("c9")
            assert taken.holding
            assert trio.current_time() - started < 2
            # What the dead holder wrote last is unknown: the tables are read to their end.
            assert tables.caught_up == 1 and not tables.read
            await table.aclose()
            nursery.cancel_scope.cancel()


async def test_the_next_holder_reads_as_far_as_the_previous_one_wrote(url: str) -> None:
    ns = namespace()
    writer = Tables({"mqtt-sessions": (12, 7), "mqtt-qos2-flows": (3, 0)})
    reader = Tables()
    async with (
        proxy(url, ns) as one,
        proxy(url, ns) as two,
        presence_of(one, writer) as (first_proxy, _),
        presence_of(two, reader) as (second_proxy, _),
    ):
        with trio.fail_after(5):
            first = await first_proxy.claim("c1")
            await first.release()
            second = await second_proxy.claim("c1")
        assert second.holding
        # Up to the first proxy's writes, from its release: no marker round trip.
        assert reader.read == [{"mqtt-sessions": (12, 7), "mqtt-qos2-flows": (3, 0)}]
        assert reader.caught_up == 0
        # An id with no holder in view: as far as every release read so far.
        assert writer.own is not None
        writer.own["mqtt-sessions"] = (12, 9)
        await second.release()
        with trio.fail_after(5):
            third = await first_proxy.claim("c2")
        assert third.holding and writer.caught_up == 0
        assert writer.read[-1] == {"mqtt-sessions": (12, 7), "mqtt-qos2-flows": (3, 0)}
        await third.release()


def test_a_release_carries_its_frontier() -> None:
    frontier = {"mqtt-sessions": (12, 7), "a table with spaces": (0, 0)}
    value = release_value("abc", frontier).decode()
    assert parse_release(value) == ("abc", frontier)
    assert parse_release(release_value("abc", {}).decode()) == ("abc", {})
    # Written without one (an earlier version), or unreadable: unknown, so read to the end.
    assert parse_release("-abc") == ("abc", None)
    assert parse_release("-abc\nnot a position\n") == ("abc", None)


async def test_a_holder_whose_writes_landed_where_it_cannot_tell_makes_the_next_read_all(
    url: str,
) -> None:
    ns = namespace()
    writer = Tables()
    writer.own = None  # a write failed or its receipt was lost: its position is unknown
    reader = Tables()
    async with (
        proxy(url, ns) as one,
        proxy(url, ns) as two,
        presence_of(one, writer) as (first_proxy, _),
        presence_of(two, reader) as (second_proxy, table),
    ):
        with trio.fail_after(5):
            first = await first_proxy.claim("c1")
            await first.release()
            await table.catch_up()  # the second proxy has read the release
            # An id with no holder in view catches up once after such a release (the id of
            # that release may have been deleted since).
            other = await second_proxy.claim("c2")
            assert reader.caught_up == 1 and not reader.read
            third = await second_proxy.claim("c3")
            assert reader.caught_up == 1 and len(reader.read) == 1
            # A takeover from a holder whose release has no frontier reads all.
            held = await first_proxy.claim("c4")
            async with trio.open_nursery() as nursery:

                async def let_go() -> None:
                    await held.wait_fenced()
                    await held.release()

                nursery.start_soon(let_go)
                taken = await second_proxy.claim("c4")
            assert reader.caught_up == 2
        for lease in (other, third, taken):
            await lease.release()


async def test_a_claim_that_fails_after_it_was_written_lets_go_of_the_id(url: str) -> None:
    ns = namespace()
    failing = Tables()
    failing.fail = BackendError("the tables cannot be read", reason="unavailable")
    async with (
        proxy(url, ns) as one,
        proxy(url, ns) as two,
        presence_of(one, failing) as (first_proxy, _),
        presence_of(two) as (second_proxy, _),
    ):
        with trio.fail_after(5):
            with pytest.raises(BackendError, match="cannot be read"):
                await first_proxy.claim("c1")
            assert "c1" not in first_proxy._leases
            # Its release is in: the next holder does not wait for it (3 s fence timeout).
            started = trio.current_time()
            taken = await second_proxy.claim("c1")
        assert taken.holding and trio.current_time() - started < 1
        await taken.release()
