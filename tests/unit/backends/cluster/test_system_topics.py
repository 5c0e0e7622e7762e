"""Tables and roles of the separated-mode backend on mop's own Pulsar client, against
an in-process mop node speaking the Pulsar protocol (two "proxies": two clients)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

from mop.backends.cluster.context import ClusterContext
from mop.backends.cluster.options import ProducerOptions
from mop.backends.cluster.producers import ProducerCache
from mop.backends.cluster.roles import ClusterRoles
from mop.backends.cluster.tables import ClusterTable
from mop.backends.cluster.timing import Delays
from mop.protocols.pulsar.driver import ClientOptions, PulsarClient
from mop.settings import PulsarSettings
from mop.testing.node import RunningNode, node_settings, running_node


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    settings = dataclasses.replace(
        node_settings(), protocols=("mqtt", "pulsar"), pulsar=PulsarSettings(port=0)
    )
    node: RunningNode
    with running_node(settings) as node:
        yield f"pulsar://127.0.0.1:{node.node.address('pulsar', 'tcp')[1]}"


@asynccontextmanager
async def proxy(url: str, namespace: str) -> AsyncIterator[ClusterContext]:
    def make() -> PulsarClient:
        return PulsarClient(url, ClientOptions("test", operation_timeout=3))

    client = make()
    delays = Delays()
    async with trio.open_nursery() as nursery:
        await nursery.start(client.serve)
        nursery.start_soon(delays.serve)
        producers = ProducerCache(client, ProducerOptions())
        context = SimpleNamespace(
            tenant="public",
            namespace=namespace,
            operation_timeout=3.0,
            fence_timeout=3.0,
            client=lambda: client,
            new_client=make,
            nursery=nursery,
            delays=delays,
            producers=producers,
        )
        try:
            yield cast(ClusterContext, context)
        finally:
            await producers.aclose()
            await client.aclose()
            nursery.cancel_scope.cancel()


def namespace() -> str:
    return "ns" + uuid.uuid4().hex[:8]


async def test_a_table_is_read_and_followed(url: str) -> None:
    ns = namespace()
    async with proxy(url, ns) as one, proxy(url, ns) as two:
        first = ClusterTable("t", tenant="public", namespace=ns)
        await one.nursery.start(first.serve, one)
        await first.put("a", b"1")
        await first.put("b", b"2")
        await first.put("b", None)
        assert first.get("a") == b"1"
        second = ClusterTable("t", tenant="public", namespace=ns)
        seen: list[tuple[str, bytes | None]] = []
        second.watch(lambda key, value: seen.append((key, value)))
        await two.nursery.start(second.serve, two)
        assert dict(second.items()) == {"a": b"1"}
        await first.put("c", b"3")
        await first.put("a", None)
        await second.catch_up()
        assert dict(second.items()) == {"c": b"3"}
        assert seen == [("c", b"3"), ("a", None)]
        await first.aclose()
        await second.aclose()
        await second.catch_up()  # stopped: returns at once


async def test_callers_of_one_moment_share_a_catch_up(url: str) -> None:
    ns = namespace()
    async with proxy(url, ns) as one, proxy(url, ns) as two:
        writer = ClusterTable("t", tenant="public", namespace=ns)
        reader = ClusterTable("t", tenant="public", namespace=ns)
        await one.nursery.start(writer.serve, one)
        await two.nursery.start(reader.serve, two)
        markers: list[str] = []
        send = two.producers.send

        async def counting(topic: str, *args: Any, **kwargs: Any) -> Any:
            markers.append(topic)
            return await send(topic, *args, **kwargs)

        two.producers.send = counting  # type: ignore[method-assign]
        await writer.put("k", b"v")
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(reader.catch_up)
        assert reader.get("k") == b"v"
        assert 1 <= len(markers) <= 2  # not one per caller
        await writer.aclose()
        await reader.aclose()


async def test_one_proxy_holds_a_role_at_a_time(url: str) -> None:
    ns = namespace()

    async def nothing() -> None:
        await trio.lowlevel.checkpoint()

    async with proxy(url, ns) as one, proxy(url, ns) as two:
        roles_one = ClusterRoles(one, catch_up=nothing)
        roles_two = ClusterRoles(two, catch_up=nothing)
        first = await roles_one.hold("r")
        with trio.fail_after(5):
            assert await first.changed()
        assert first.held
        second = await roles_two.hold("r")
        await trio.sleep(1.2)
        assert not second.held
        await first.release()
        with trio.fail_after(5):
            assert await second.changed()
        assert second.held
        # The holder's connection ends: the role is lost at once.
        client = await roles_two.client()
        for connection in list(client._connections.values()):
            connection.close()
        with trio.fail_after(5):
            assert not await second.changed()
        with trio.fail_after(5):
            assert await second.changed()  # and asked for again
        await roles_one.aclose()
        await roles_two.aclose()
