"""Recovery of `DurableStorage`: torn tails, corrupt records, crashes, and logs written by hand
to pin down how records are replayed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from mop.broker.storage import CursorState
from mop.broker.storage.durable import DurableStorage, open_durable_storage
from mop.broker.storage.records import (
    HEADER_SIZE,
    SegmentHeader,
    TopicRecord,
    encode_cursor,
    encode_epoch,
    encode_message,
    encode_topic,
    encode_topic_delete,
    encode_trim,
    frame,
)
from mop.message import Message, MessageId
from tests.unit.broker.storage.conftest import small_settings


def _messages(*payloads: str) -> list[Message]:
    return [Message(p.encode()) for p in payloads]


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


async def _payloads(store: DurableStorage, topic: str) -> list[bytes]:
    return [m.payload for _, m in await store.read(topic, None, 100_000)]


async def _write_and_close(directory: Path, count: int, **settings: object) -> list[MessageId]:
    store = await open_durable_storage(directory, small_settings(**settings))
    ids = store.append("t", _messages(*(f"m{n}" for n in range(count))))
    await store.aclose()
    return ids


@pytest.mark.parametrize("cut", [1, 7, 8, 9, 20])
async def test_torn_tail_is_cut(tmp_path: Path, cut: int) -> None:
    ids = await _write_and_close(tmp_path, 10)
    last = _segments(tmp_path)[-1]
    size = last.stat().st_size
    with last.open("r+b") as file:
        file.truncate(size - cut)
    store = await open_durable_storage(tmp_path, small_settings())
    # The last record was m9 (the epoch record of the reopen comes after it).
    assert store.recovery.truncated > 0
    assert await _payloads(store, "t") == [f"m{n}".encode() for n in range(9)]
    assert store.append("t", _messages("next"))[0] > ids[-1]
    await store.aclose()
    store = await open_durable_storage(tmp_path, small_settings())
    assert store.recovery.truncated == 0
    assert (await _payloads(store, "t"))[-1] == b"next"
    await store.aclose()


async def test_garbage_after_the_tail_is_cut(tmp_path: Path) -> None:
    await _write_and_close(tmp_path, 3)
    last = _segments(tmp_path)[-1]
    size = last.stat().st_size
    with last.open("ab") as file:
        file.write(b"\x00" * 100 + b"\xff" * 3)
    store = await open_durable_storage(tmp_path, small_settings())
    assert store.recovery.truncated == 103
    assert await _payloads(store, "t") == [b"m0", b"m1", b"m2"]
    await store.aclose()
    assert last.stat().st_size > size  # the reopen appended its epoch record after the cut


async def test_bad_checksum_in_the_last_segment_cuts_there(tmp_path: Path) -> None:
    store = await open_durable_storage(tmp_path, small_settings())
    store.append("t", _messages("a", "b"))
    await store.sync()
    middle = store.tail.end
    store.append("t", _messages("c", "d"))
    await store.aclose()
    last = _segments(tmp_path)[-1]
    offset = middle - int(last.stem) + 12  # inside the body of "c"
    data = bytearray(last.read_bytes())
    data[offset] ^= 0x40
    last.write_bytes(bytes(data))
    store = await open_durable_storage(tmp_path, small_settings())
    assert await _payloads(store, "t") == [b"a", b"b"]
    assert store.recovery.truncated == len(data) - (middle - int(last.stem))
    await store.aclose()


async def test_corrupt_record_in_an_older_segment_skips_the_rest_of_it(tmp_path: Path) -> None:
    ids = await _write_and_close(tmp_path, 200)
    files = _segments(tmp_path)
    assert len(files) >= 4
    damaged = files[1]
    data = bytearray(damaged.read_bytes())
    data[HEADER_SIZE + 300] ^= 0x01
    damaged.write_bytes(bytes(data))
    store = await open_durable_storage(tmp_path, small_settings())
    report = store.recovery
    assert report.skipped > 0 and report.truncated == 0
    assert "SKIPPED" in str(report)
    kept = [i for i, _ in await store.read("t", None, 1000)]
    assert kept[0] == ids[0] and kept[-1] == ids[-1]
    # Only the records of the damaged segment after the bad one are lost (about 50 fit in one).
    assert 0 < len(ids) - len(kept) < 60
    assert damaged.read_bytes() == bytes(data)  # left as it was, for inspection
    assert store.append("t", _messages("next"))[0] > ids[-1]
    await store.aclose()


async def test_torn_header_of_a_new_segment_is_removed(tmp_path: Path) -> None:
    await _write_and_close(tmp_path, 3)
    base = int(_segments(tmp_path)[-1].stem) + _segments(tmp_path)[-1].stat().st_size
    torn = tmp_path / f"{base:020d}.log"
    torn.write_bytes(SegmentHeader(base, 9).encode()[:10])
    store = await open_durable_storage(tmp_path, small_settings())
    assert store.recovery.truncated == 10
    assert not torn.exists()
    assert await _payloads(store, "t") == [b"m0", b"m1", b"m2"]
    await store.aclose()


async def test_crash_loses_only_what_was_not_synced(tmp_path: Path) -> None:
    store = await open_durable_storage(tmp_path, small_settings())
    synced = store.append("t", _messages("a"))
    store.save_cursors({("t", "s"): CursorState(synced[0])})
    await store.sync()
    lost = store.append("t", _messages("b"))
    store.save_cursors({("t", "s"): CursorState(lost[0])})
    store.table_put("r", "k", b"v")
    store.abandon()
    store = await open_durable_storage(tmp_path, small_settings())
    assert await _payloads(store, "t") == [b"a"]
    assert store.load_cursors() == {("t", "s"): CursorState(synced[0])}
    assert list(store.table_items("r")) == []
    # Ids handed out for lost messages are never handed out again.
    assert store.append("t", _messages("c"))[0] > lost[0]
    await store.aclose()


async def test_ids_keep_increasing_across_reopen_and_delete(tmp_path: Path) -> None:
    store = await open_durable_storage(tmp_path, small_settings())
    seen = store.append("t", _messages("a"))
    for _ in range(3):
        store.delete_topic("t")
        seen += store.append("t", _messages("b"))
        await store.aclose()
        store = await open_durable_storage(tmp_path, small_settings())
        seen += store.append("t", _messages("c"))
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    await store.aclose()


async def test_empty_directory(tmp_path: Path) -> None:
    store = await open_durable_storage(tmp_path / "new", small_settings())
    assert store.recovery.topics == 0 and store.topics() == []
    await store.aclose()
    store = await open_durable_storage(tmp_path / "new", small_settings())
    assert store.stats().messages == 0
    await store.aclose()


async def test_a_second_process_is_locked_out(tmp_path: Path) -> None:
    store = await open_durable_storage(tmp_path, small_settings())
    script = (
        "import sys, trio\n"
        "from mop.broker.storage.durable import open_durable_storage\n"
        "from mop.settings import StorageSettings\n"
        "from mop.broker.storage import StorageError\n"
        "try:\n"
        f"    trio.run(open_durable_storage, {str(tmp_path)!r}, StorageSettings())\n"
        "except StorageError:\n"
        "    sys.exit(3)\n"
    )
    result = await trio.run_process([sys.executable, "-c", script], check=False)
    assert result.returncode == 3
    await store.aclose()


# -- logs written by hand --------------------------------------------------------------------------


def _write_log(directory: Path, bodies: list[bytes]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    data = SegmentHeader(0, 0).encode() + b"".join(frame(body) for body in bodies)
    (directory / f"{0:020d}.log").write_bytes(data)


def _message(ledger: int, entry: int, payload: str) -> bytes:
    return encode_message(ledger, entry, 0, Message(payload.encode()))


async def test_replay_binds_messages_to_a_later_topic_record(tmp_path: Path) -> None:
    # What a reclaim leaves: the first topic record is gone, a rewritten one follows the
    # messages, one message was copied forward (twice, after a crash mid-reclaim).
    _write_log(
        tmp_path,
        [
            encode_epoch(0),
            _message(5, 1, "one"),
            _message(5, 2, "two"),
            _message(5, 0, "zero"),
            _message(5, 0, "zero"),
            encode_topic(TopicRecord("t", (5,), None, None)),
            encode_cursor("t", "s", CursorState(MessageId(5, 0))),
            _message(9, 0, "orphan"),
        ],
    )
    store = await open_durable_storage(tmp_path, small_settings())
    assert await _payloads(store, "t") == [b"zero", b"one", b"two"]
    assert store.last_id("t") == MessageId(5, 2)
    assert store.load_cursors() == {("t", "s"): CursorState(MessageId(5, 0))}
    assert store.topics() == ["t"]
    assert store.append("t", _messages("three"))[0] > MessageId(5, 2)
    await store.aclose()


async def test_replay_applies_trims_deletes_and_gaps(tmp_path: Path) -> None:
    _write_log(
        tmp_path,
        [
            encode_topic(TopicRecord("gone", (1,), None, None)),
            _message(1, 0, "deleted"),
            encode_cursor("gone", "s", CursorState(None)),
            encode_topic_delete("gone"),
            encode_topic(TopicRecord("t", (2,), None, None)),
            *[_message(2, n, f"m{n}") for n in range(3)],
            *[_message(2, n, f"m{n}") for n in range(5, 7)],  # 3 and 4 lost to corruption
            encode_trim("t", MessageId(2, 1)),
            encode_trim("t", MessageId(2, 0)),  # stale: the larger trim wins
            encode_topic(TopicRecord("empty", (3,), MessageId(3, 41), MessageId(3, 41))),
        ],
    )
    store = await open_durable_storage(tmp_path, small_settings())
    assert sorted(store.topics()) == ["empty", "t"]
    assert [str(i) for i, _ in await store.read("t", None, 10)] == ["2:2", "2:5", "2:6"]
    assert [str(i) for i, _ in await store.read("t", MessageId(2, 2), 10)] == ["2:5", "2:6"]
    assert store.load_cursors() == {}
    assert store.last_id("empty") == MessageId(3, 41)
    assert store.stats().messages == 3
    store.trim("t", MessageId(2, 5))
    assert [str(i) for i, _ in await store.read("t", None, 10)] == ["2:6"]
    await store.aclose()
    store = await open_durable_storage(tmp_path, small_settings())
    assert [str(i) for i, _ in await store.read("t", None, 10)] == ["2:6"]
    await store.aclose()
