"""`MemoryStorage` against the rules of the `Storage` interface."""

from __future__ import annotations

import pytest

from mop.broker.storage import (
    CursorState,
    IdRanges,
    MemoryStorage,
    Storage,
    StorageError,
    StorageFull,
)
from mop.message import Message, MessageId


def _messages(*payloads: str) -> list[Message]:
    return [Message(p.encode()) for p in payloads]


def _as_storage(storage: MemoryStorage) -> Storage:
    return storage


async def test_ids_increase_per_topic_and_survive_trimming() -> None:
    storage = _as_storage(MemoryStorage())
    ids = storage.append("t", _messages("a", "b"))
    assert ids == [MessageId(0, 0), MessageId(0, 1)]
    assert storage.append("u", _messages("x")) == [MessageId(0, 0)]
    storage.trim("t", ids[1])
    assert await storage.read("t", None, 10) == []
    assert storage.last_id("t") == ids[1]
    assert storage.append("t", _messages("c")) == [MessageId(0, 2)]
    assert sorted(storage.topics()) == ["t", "u"]


async def test_read_pages_after_an_id() -> None:
    storage = MemoryStorage()
    ids = storage.append("t", _messages(*"abcde"))
    page = await storage.read("t", None, 2)
    assert [m.payload for _, m in page] == [b"a", b"b"]
    page = await storage.read("t", page[-1][0], 10)
    assert [i for i, _ in page] == ids[2:]
    assert await storage.read("missing", None, 10) == []
    storage.trim("t", ids[2])
    assert [m.payload for _, m in await storage.read("t", None, 10)] == [b"d", b"e"]
    assert storage.stats().messages == 2


async def test_trimming_many_compacts_the_log() -> None:
    storage = MemoryStorage()
    ids = storage.append("t", _messages(*(str(n) for n in range(3000))))
    for message_id in ids[:2500]:
        storage.trim("t", message_id)
    assert [m.payload for _, m in await storage.read("t", ids[2600], 2)] == [b"2601", b"2602"]
    assert storage.stats().messages == 500


async def test_cursors_and_tables() -> None:
    storage = MemoryStorage()
    state = CursorState(MessageId(0, 3), IdRanges.of([MessageId(0, 5)]))
    storage.save_cursors({("t", "s"): state, ("t", "s2"): CursorState(None)})
    storage.save_cursors({("t", "s2"): None})
    assert storage.load_cursors() == {("t", "s"): state}
    storage.table_put("retained", "a", b"1")
    storage.table_put("retained", "b", b"2")
    storage.table_put("retained", "a", None)
    assert list(storage.table_items("retained")) == [("b", b"2")]
    assert list(storage.table_items("other")) == []
    storage.append("t", _messages("x"))
    storage.delete_topic("t")
    assert storage.load_cursors() == {}
    assert storage.last_id("t") is None


async def test_full_storage_and_closed_storage_refuse_writes() -> None:
    storage = MemoryStorage(max_bytes=4)
    storage.append("t", _messages("abc"))
    with pytest.raises(StorageFull):
        storage.append("t", _messages("de"))
    storage.trim("t", MessageId(0, 0))
    storage.append("t", _messages("de"))
    await storage.aclose()
    with pytest.raises(StorageError):
        storage.append("t", _messages("x"))
    with pytest.raises(StorageError):
        await storage.sync()
    storage.reopen()
    await storage.sync()
