"""Retained values a node keeps for itself (`$SYS`): in memory on that node, never in the
shared table, and no other node's write replaces them; values of such topics that the shared
table holds from earlier versions are cleared."""

from __future__ import annotations

from mop.message import Message
from mop.protocols.mqtt.serving.retained import RetainedStore, encode_message
from tests.unit.protocols.mqtt.serving.shared_table import SharedTable


def payloads(store: RetainedStore, topic_filter: str) -> dict[str, bytes]:
    return {r.topic: r.message.payload for r in store.match(topic_filter)}


async def test_local_values_stay_on_their_node() -> None:
    data: dict[str, bytes] = {}
    views: list[SharedTable] = []
    first = RetainedStore(SharedTable("retained", data, views))
    second = RetainedStore(SharedTable("retained", data, views))
    first.keep_local("$SYS/broker/uptime", Message(b"1 seconds"))
    second.keep_local("$SYS/broker/uptime", Message(b"9 seconds"))
    await first.set("a/b", Message(b"shared"))
    assert payloads(first, "#") == {"a/b": b"shared"}  # `#` never matches `$` topics
    assert payloads(first, "$SYS/#") == {"$SYS/broker/uptime": b"1 seconds"}
    assert payloads(second, "$SYS/#") == {"$SYS/broker/uptime": b"9 seconds"}
    assert "$SYS/broker/uptime" not in data
    assert len(first) == len(second) == 2


async def test_another_nodes_write_does_not_replace_a_local_value() -> None:
    data: dict[str, bytes] = {}
    views: list[SharedTable] = []
    mine = RetainedStore(SharedTable("retained", data, views))
    older = SharedTable("retained", data, views)
    mine.keep_local("$SYS/broker/version", Message(b"mine"))
    # A proxy of an earlier version still writes $SYS to the shared table.
    await older.put("$SYS/broker/version", encode_message(Message(b"theirs")))
    assert payloads(mine, "$SYS/broker/version") == {"$SYS/broker/version": b"mine"}


async def test_clearing_shared_values_of_local_topics() -> None:
    data = {
        "$SYS/broker/version": encode_message(Message(b"old")),
        "$SYS/broker/gone": encode_message(Message(b"old")),
        "a": encode_message(Message(b"kept")),
    }
    store = RetainedStore(SharedTable("retained", data, []))
    store.keep_local("$SYS/broker/version", Message(b"new"))
    await store.clear_shared("$SYS/#")
    assert sorted(data) == ["$SYS/broker/version", "a"]  # the local value was never shared
    assert payloads(store, "$SYS/#") == {"$SYS/broker/version": b"new"}
    assert payloads(store, "a") == {"a": b"kept"}


async def test_the_count_of_retained_messages_leaves_out_the_nodes_own() -> None:
    store = RetainedStore(SharedTable("retained", {}, []))
    store.keep_local("$SYS/broker/uptime", Message(b"1 seconds"))
    store.keep_local("$SYS/broker/version", None)
    await store.set("a/b", Message(b"shared"))
    await store.set("a/c", Message(b"shared"))
    assert store.shared == 2
    await store.set("a/c", None)
    assert store.shared == 1
