"""A merged node's tables are compacted topics of its broker, the same topics a separated
proxy reads as tables: what a Pulsar client writes to them through the node's Pulsar port (a
proxy's table, the reference pulsar-client) changes the node's table and is reported to its
watchers, and what the node writes is read by those clients."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable

import pulsar
import pytest
import trio

from mop.backends.cluster.table_client import open_tables
from mop.message import TOMBSTONE_PROPERTY
from mop.node import Node, open_node
from mop.settings import PulsarSettings
from mop.testing.node import node_settings
from mop.topic_names import table_topic
from tests.e2e.pulsar_support import TIMEOUT_MS

pytestmark = pytest.mark.e2e

DEADLINE = 10.0
POLL = 0.01


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    settings = dataclasses.replace(
        node_settings(), protocols=("mqtt", "pulsar"), pulsar=PulsarSettings(port=0)
    )
    async with open_node(settings) as running:
        yield running


def service_url(node: Node) -> str:
    return f"pulsar://127.0.0.1:{node.address('pulsar', 'tcp')[1]}"


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    with trio.move_on_after(DEADLINE):
        for _ in range(int(DEADLINE / POLL) + 1):
            if condition():
                break
            await trio.sleep(POLL)
    assert condition(), f"not within {DEADLINE}s: {what}"


async def test_a_proxy_tables_writes_reach_the_nodes_table_and_its_watchers(node: Node) -> None:
    table = node.processor.table("shared")
    reported: list[tuple[str, bytes | None]] = []
    table.watch(lambda key, value: reported.append((key, value)))
    async with open_tables(service_url(node), ["shared"]) as tables:
        remote = tables["shared"]
        await remote.put("k", b"v1")
        await remote.put("k", b"v2")
        await remote.put("k", None)
        await remote.put("other", b"x")
        # `put` returns once the node has stored the write, and so changed its table.
        assert reported == [("k", b"v1"), ("k", b"v2"), ("k", None), ("other", b"x")]
        assert list(table.items()) == [("other", b"x")]
        # The other way: the node's own writes reach the proxy's table (and are not
        # reported to the node's own watchers).
        await table.put("from-node", b"n")
        await wait_until(lambda: remote.get("from-node") == b"n", "the node's write is read")
        assert reported[-1] == ("other", b"x")


async def test_tables_loaded_later_see_what_the_node_wrote(node: Node) -> None:
    table = node.processor.table("later")
    await table.put("a", b"1")
    await table.put("b", b"2")
    await table.put("a", None)
    async with open_tables(service_url(node), ["later"]) as tables:
        assert dict(tables["later"].items()) == {"b": b"2"}
    # The catch-up markers the proxy's table wrote are no entries of the node's table.
    assert list(table.items()) == [("b", b"2")]


async def test_the_reference_client_writes_and_reads_the_nodes_table(node: Node) -> None:
    table = node.processor.table("ref")
    reported: list[tuple[str, bytes | None]] = []
    table.watch(lambda key, value: reported.append((key, value)))
    await table.put("mine", b"m")
    topic = table_topic(node.settings.default_tenant, node.settings.default_namespace, "ref")

    def with_pulsar_client() -> list[tuple[str, bytes]]:
        client = pulsar.Client(
            service_url(node),
            operation_timeout_seconds=10,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        try:
            producer = client.create_producer(topic, batching_enabled=False)
            producer.send(b"theirs", partition_key="k")
            producer.send(b"", partition_key="mine", properties={TOMBSTONE_PROPERTY: "1"})
            reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
            seen = []
            while reader.has_message_available():
                message = reader.read_next(timeout_millis=TIMEOUT_MS)
                seen.append((message.partition_key(), message.data()))
            return seen
        finally:
            client.close()

    seen = await trio.to_thread.run_sync(with_pulsar_client)
    assert seen == [("k", b"theirs")]
    await wait_until(lambda: len(reported) == 2, "both writes are reported")
    assert reported == [("k", b"theirs"), ("mine", None)]
    assert list(table.items()) == [("k", b"theirs")]
