"""`LocalTable` is its table's compacted topic in the broker: what a Pulsar client writes to
that topic (here: a publish to it, as the Pulsar adapter makes) changes the table and is
reported to watchers, and the table's own writes are keyed messages of the topic."""

from __future__ import annotations

import pytest
import trio

from mop.backends.local import LocalBackend, open_local_backend
from mop.backends.local.table import LocalTable
from mop.broker.storage import MemoryStorage
from mop.message import CATCH_UP_KEY, TOMBSTONE_PROPERTY, Message
from mop.processor.backend import BackendError, StartPosition, SubscriptionSpec
from mop.topic_names import table_topic

TOMBSTONE = ((TOMBSTONE_PROPERTY, "1"),)


def write(key: str, value: bytes | None) -> Message:
    """A table write as a Pulsar client sends it: keyed, a tombstone for a delete."""
    if value is None:
        return Message(b"", TOMBSTONE, key=key)
    return Message(value, key=key)


def test_the_table_is_the_topic_a_separated_proxy_reads() -> None:
    backend = LocalBackend(MemoryStorage(), tenant="t", namespace="ns")
    table = backend.table("mop.bans")
    assert table.topic == table_topic("t", "ns", "mop.bans")
    assert table.topic == "persistent://t/__mop/ns%2Ftable%2Fmop.bans"


async def test_writes_through_the_broker_change_the_table_and_are_reported(
    backend: LocalBackend,
) -> None:
    table = backend.table("bans")
    reported: list[tuple[str, bytes | None]] = []
    table.watch(lambda key, value: reported.append((key, value)))
    await backend.publish(table.topic, write("a", b"1"))
    await backend.publish(table.topic, write("b", b"2"))
    await backend.publish(table.topic, write("a", b"3"))
    await backend.publish(table.topic, write("a", b"3"))  # no change: not reported
    await backend.publish(table.topic, write("b", None))
    await backend.publish(table.topic, write("gone", None))  # nothing to delete
    await backend.publish(table.topic, Message(b"no key"))  # no entry of a table
    assert reported == [("a", b"1"), ("b", b"2"), ("a", b"3"), ("b", None)]
    assert (table.get("a"), table.get("b")) == (b"3", None)
    assert list(table.items()) == [("a", b"3")]
    # Another table's topic is no change of this one.
    await backend.publish(backend.table("other").topic, write("a", b"x"))
    assert table.get("a") == b"3" and len(reported) == 4


async def test_own_writes_are_not_reported_but_others_in_between_are(
    backend: LocalBackend,
) -> None:
    table = backend.table("t")
    reported: list[tuple[str, bytes | None]] = []
    table.watch(lambda key, value: reported.append((key, value)))
    await table.put("mine", b"1")
    await backend.publish(table.topic, write("theirs", b"2"))
    await table.put("mine", None)
    assert reported == [("theirs", b"2")]
    assert list(table.items()) == [("theirs", b"2")]


async def test_a_failing_watcher_does_not_stop_the_others(
    backend: LocalBackend, caplog: pytest.LogCaptureFixture
) -> None:
    table = backend.table("t")
    reported: list[str] = []

    def failing(key: str, value: bytes | None) -> None:
        raise RuntimeError("watcher bug")

    table.watch(failing)
    table.watch(lambda key, value: reported.append(key))
    await backend.publish(table.topic, write("k", b"v"))
    assert reported == ["k"]
    assert "a watcher of table 't' failed" in caplog.text


async def test_the_markers_of_separated_proxies_are_no_entries(backend: LocalBackend) -> None:
    table = backend.table("t")
    reported: list[str] = []
    table.watch(lambda key, value: reported.append(key))
    await backend.publish(table.topic, Message(b"", key=CATCH_UP_KEY))
    assert table.get(CATCH_UP_KEY) is None
    assert list(table.items()) == []
    assert reported == []


async def test_the_tables_writes_are_keyed_messages_of_its_topic(backend: LocalBackend) -> None:
    table = backend.table("t")
    await table.put("k", b"v")
    await table.put("k", None)
    last = backend.storage.last_id(table.topic)
    await table.put("never", None)  # nothing to delete: no message
    assert backend.storage.last_id(table.topic) == last
    reader = await backend.subscribe(
        SubscriptionSpec(
            name="reader",
            selectors=frozenset([table.topic]),
            durable=False,
            start=StartPosition.EARLIEST,
        )
    )
    # A reader from the earliest reads the compacted topic: the deleted key has no message
    # left, so the first it gets is the write made after it subscribed.
    await table.put("k", b"again")
    with trio.fail_after(5):
        (delivery,) = await reader.receive(10)
    assert (delivery.message.key, delivery.message.payload) == ("k", b"again")
    await table.put("k", None)
    with trio.fail_after(5):
        (delivery,) = await reader.receive(10)
    assert (delivery.message.key, delivery.message.properties) == ("k", TOMBSTONE)
    await reader.close()


async def test_a_write_before_the_backend_runs_is_refused() -> None:
    backend = LocalBackend(MemoryStorage())
    with pytest.raises(BackendError, match="not running"):
        await backend.table("t").put("k", b"v")


async def test_rows_of_an_earlier_storage_table_move_into_the_topic_once() -> None:
    storage = MemoryStorage()
    storage.table_put("retained", "a/b", b"kept")
    storage.table_put("retained", "c", b"also kept")
    async with open_local_backend(storage) as backend:
        table = backend.table("retained")
        assert sorted(table.items()) == [("a/b", b"kept"), ("c", b"also kept")]
        assert list(storage.table_items("retained")) == []
        await table.put("a/b", b"newer")
        # Rows an interrupted move left behind never overwrite what the topic has.
        storage.table_put("retained", "a/b", b"stale")
        again = LocalTable(backend.broker, "retained", check_running=lambda: None)
        assert again.get("a/b") == b"newer"
        assert list(storage.table_items("retained")) == []
