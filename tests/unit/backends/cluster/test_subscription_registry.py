"""The registry of durable subscription members (`SubscriptionRegistry`): what one proxy
records, every proxy finds by subscription name without reading the whole table, against an
in-process mop node speaking the Pulsar protocol (two "proxies": two clients)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from mop.backends.cluster.context import ClusterContext
from mop.backends.cluster.tables import REGISTRY_TABLE, ClusterTable, SubscriptionRegistry
from mop.processor.backend import SubscriptionKind, SubscriptionSpec
from tests.unit.backends.cluster.test_system_topics import namespace, proxy, url

__all__ = ["url"]  # the module's node


@asynccontextmanager
async def registry_of(context: ClusterContext) -> AsyncIterator[SubscriptionRegistry]:
    table = ClusterTable(REGISTRY_TABLE, tenant=context.tenant, namespace=context.namespace)
    await context.nursery.start(table.serve, context)
    try:
        yield SubscriptionRegistry(table)
    finally:
        await table.aclose()


def durable(name: str, selector: str) -> SubscriptionSpec:
    return SubscriptionSpec(name=name, selectors=frozenset({selector}), durable=True)


def shared(name: str, member: str) -> SubscriptionSpec:
    return SubscriptionSpec(
        name=name, selectors=frozenset({"t/s"}), kind=SubscriptionKind.SHARED, member=member
    )


async def test_members_are_found_by_name_on_every_proxy(url: str) -> None:
    ns = namespace()
    async with proxy(url, ns) as one, proxy(url, ns) as two, registry_of(one) as first:
        await first.record(durable("c1", "t/1"), {"t/1": 10})
        await first.record(durable("c2", "t/2"), {"t/2": 20})
        assert first.members("c1") == {
            "": {"since": {"t/1": 10}, "kind": "exclusive", "durable": True, "member": ""}
        }
        # Loaded by another proxy: indexed from what the table holds.
        async with registry_of(two) as second:
            assert set(second.members("c2")) == {""}
            # Followed afterwards: a member recorded by one proxy, then left.
            await first.record(shared("$share/g/t/s", "m1"), {"t/s": 5})
            await first.record(shared("$share/g/t/s", "m2"), {"t/s": 6})
            await second.table.catch_up()
            assert set(second.members("$share/g/t/s")) == {"m1", "m2"}
            assert second.since(shared("$share/g/t/s", "m3")) == {"t/s": 5}
            assert await first.leave_member("$share/g/t/s", "m1")
            await second.table.catch_up()
            assert set(second.members("$share/g/t/s")) == {"m2"}
            assert not await second.leave_member("$share/g/t/s", "m2")
            await first.table.catch_up()
            assert first.members("$share/g/t/s") == {}
            assert second.members("nobody") == {}


async def test_a_lookup_reads_only_the_members_of_its_subscription(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with proxy(url, namespace()) as one, registry_of(one) as registry:
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(registry.record, durable(f"c{i}", f"t/{i}"), {f"t/{i}": i})
        read: list[str] = []
        get = registry.table.get

        def counting_get(key: str) -> bytes | None:
            read.append(key)
            return get(key)

        def no_scan() -> None:
            raise AssertionError("members() must not scan the table")

        monkeypatch.setattr(registry.table, "get", counting_get)
        monkeypatch.setattr(registry.table, "items", no_scan)
        assert set(registry.members("c7")) == {""}
        assert len(read) == 1
        # A key deleted and written again while its delete is read back stays indexed.
        monkeypatch.undo()
        assert not await registry.leave_member("c7", "")
        await registry.record(durable("c7", "t/7"), {"t/7": 70})
        await registry.table.catch_up()
        assert registry.members("c7")[""]["since"] == {"t/7": 70}
