"""`DurableStorage`: the `Storage` contract (shared with `MemoryStorage`), records, segments,
reclaim, retention, group commit and write errors. A sync whose caller is cancelled (a client
that disconnects while its publish waits) must still write what it took from the queue, or the
hole it leaves would cut off every later record at recovery."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from mop.broker.storage import CursorState, IdRanges, StorageError, StorageFull
from mop.broker.storage import durable as durable_module
from mop.broker.storage import segments as segments_module
from mop.broker.storage.durable import DurableStorage, open_durable_storage
from mop.broker.storage.records import (
    CursorRecord,
    EpochRecord,
    Scanner,
    SegmentHeader,
    TableRecord,
    TopicDeleteRecord,
    TopicRecord,
    TrimRecord,
    decode_message,
    decode_record,
    encode_cursor,
    encode_epoch,
    encode_message,
    encode_table,
    encode_topic,
    encode_topic_delete,
    encode_trim,
    frame,
)
from mop.message import Message, MessageId
from tests.unit.broker.storage.conftest import Harness, small_settings


def _messages(*payloads: str) -> list[Message]:
    return [Message(p.encode()) for p in payloads]


def _payloads(page: list[tuple[MessageId, Message]]) -> list[bytes]:
    return [message.payload for _, message in page]


def _segment_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".log")


# -- the contract, against both implementations -------------------------------------------------


async def test_ids_increase_and_reads_page(harness: Harness) -> None:
    store = harness.store
    ids = store.append("t", _messages(*"abcde"))
    assert ids == sorted(ids) and len(set(ids)) == 5
    more = store.append("t", _messages("f"))
    assert more[0] > ids[-1]
    page = await store.read("t", None, 2)
    assert _payloads(page) == [b"a", b"b"]
    page = await store.read("t", page[-1][0], 10)
    assert [i for i, _ in page] == [*ids[2:], *more]
    assert await store.read("missing", None, 10) == []
    assert store.last_id("t") == more[0]
    assert store.last_id("missing") is None


async def test_reads_page_by_bytes_too(harness: Harness) -> None:
    store = harness.store
    store.append("t", _messages(*(chr(65 + n) * 1000 for n in range(10))))
    await store.sync()  # read from the files, not only the written tail
    page = await store.read("t", None, 10, 3500)
    assert 2 <= len(page) <= 3  # about 3500 bytes as stored, whatever a record adds
    assert len(await store.read("t", None, 10, 1)) == 1  # one at least
    assert len(await store.read("t", None, 10, None)) == 10


async def test_trim_keeps_last_id_and_topic(harness: Harness) -> None:
    store = harness.store
    ids = store.append("t", _messages("a", "b", "c"))
    store.trim("t", ids[1])
    assert _payloads(await store.read("t", None, 10)) == [b"c"]
    assert _payloads(await store.read("t", ids[0], 10)) == [b"c"]
    store.trim("t", MessageId(ids[-1].ledger, ids[-1].entry + 100))
    assert await store.read("t", None, 10) == []
    assert store.last_id("t") == ids[-1]
    assert store.topics() == ["t"]
    assert store.append("t", _messages("d"))[0] > ids[-1]
    assert store.stats().messages == 1
    store.trim("missing", ids[0])


async def test_delete_topic_forgets_messages_and_cursors(harness: Harness) -> None:
    store = harness.store
    ids = store.append("t", _messages("a", "b"))
    store.append("u", _messages("x"))
    store.save_cursors({("t", "s"): CursorState(ids[0]), ("u", "s"): CursorState(None)})
    store.delete_topic("t")
    assert store.topics() == ["u"]
    assert store.last_id("t") is None
    assert await store.read("t", None, 10) == []
    assert store.load_cursors() == {("u", "s"): CursorState(None)}
    store.append("t", _messages("c"))
    assert _payloads(await store.read("t", None, 10)) == [b"c"]
    store.delete_topic("never-existed")


async def test_cursors_and_tables(harness: Harness) -> None:
    store = harness.store
    ids = store.append("t", _messages("a", "b", "c"))
    state = CursorState(ids[0], IdRanges.of([ids[2]]))
    store.save_cursors({("t", "s"): state, ("t", "s2"): CursorState(None)})
    store.save_cursors({("t", "s2"): None, ("t", "gone"): None})
    assert store.load_cursors() == {("t", "s"): state}
    store.table_put("retained", "a", b"1")
    store.table_put("retained", "b", b"2")
    snapshot = store.table_items("retained")
    store.table_put("retained", "a", None)
    store.table_put("retained", "zzz", None)
    assert dict(snapshot) == {"a": b"1", "b": b"2"}
    assert dict(store.table_items("retained")) == {"b": b"2"}
    assert list(store.table_items("other")) == []


async def test_stats_count_kept_messages(harness: Harness) -> None:
    store = harness.store
    ids = store.append("t", _messages("a", "b"))
    store.append("u", _messages("c"))
    stats = store.stats()
    assert (stats.topics, stats.messages) == (2, 3)
    assert stats.bytes > 0
    store.trim("t", ids[0])
    assert store.stats().messages == 2
    assert store.stats().bytes < stats.bytes


async def test_reopen_sees_everything(harness: Harness) -> None:
    store = harness.store
    ids = store.append("t", _messages("a", "b", "c"))
    store.trim("t", ids[0])
    store.append("u", [Message(b"x", properties=(("k", "v"), ("k", "w")), key="key", qos=2)])
    store.save_cursors({("t", "s"): CursorState(ids[1], IdRanges.of([ids[2]]))})
    store.table_put("retained", "a", b"1")
    await store.sync()
    store = await harness.reopen()
    assert sorted(store.topics()) == ["t", "u"]
    assert _payloads(await store.read("t", None, 10)) == [b"b", b"c"]
    [(_, message)] = await store.read("u", None, 10)
    assert message == Message(b"x", properties=(("k", "v"), ("k", "w")), key="key", qos=2)
    assert store.last_id("t") == ids[-1]
    assert store.load_cursors() == {("t", "s"): CursorState(ids[1], IdRanges.of([ids[2]]))}
    assert dict(store.table_items("retained")) == {"a": b"1"}
    assert store.append("t", _messages("d"))[0] > ids[-1]


async def test_closed_store_refuses_work(harness: Harness) -> None:
    store = harness.store
    await store.aclose()
    with pytest.raises(StorageError):
        store.append("t", _messages("a"))
    with pytest.raises(StorageError):
        await store.sync()
    with pytest.raises(StorageError):
        await store.read("t", None, 1)
    await store.aclose()


# -- records ------------------------------------------------------------------------------------


def test_message_record_round_trip() -> None:
    message = Message(
        payload=b"\x00payload\xff",
        properties=(("a", "1"), ("a", "2"), ("ü", "")),
        key="k",
        producer="p",
        publish_time=-5,
        event_time=7,
        qos=0,
        expires_at=99,
    )
    body = encode_message(3, 4, 5, message)
    assert decode_message(body) == (MessageId(3, 4), message)
    assert decode_message(encode_message(1, 2, 3, Message(b"")))[1] == Message(b"")
    with pytest.raises(ValueError):
        decode_message(body + b"x")


def test_state_record_round_trip() -> None:
    state = CursorState(MessageId(1, 2), IdRanges.of([MessageId(1, 4), MessageId(2, 0)]))
    cases = [
        (
            encode_topic(TopicRecord("t", (1, 2), MessageId(2, 3), None)),
            TopicRecord("t", (1, 2), MessageId(2, 3), None),
        ),
        (encode_trim("t", MessageId(1, 1)), TrimRecord("t", MessageId(1, 1))),
        (encode_topic_delete("t"), TopicDeleteRecord("t")),
        (encode_cursor("t", "s", state), CursorRecord("t", "s", state)),
        (encode_cursor("t", "s", CursorState(None)), CursorRecord("t", "s", CursorState(None))),
        (encode_cursor("t", "s", None), CursorRecord("t", "s", None)),
        (encode_table("r", "k", b"v"), TableRecord("r", "k", b"v")),
        (encode_table("r", "k", None), TableRecord("r", "k", None)),
        (encode_epoch(7), EpochRecord(7)),
    ]
    for body, expected in cases:
        assert decode_record(body) == expected
        with pytest.raises(ValueError):
            decode_record(body[:-1])
    with pytest.raises(ValueError):
        decode_record(b"\xee")


def test_scanner_stops_at_a_bad_record() -> None:
    header = SegmentHeader(0, 1).encode()
    assert SegmentHeader.decode(header) == SegmentHeader(0, 1)
    assert SegmentHeader.decode(header[:-1]) is None
    good = frame(encode_epoch(1)) + frame(encode_epoch(2))
    bad = bytearray(frame(encode_epoch(3)))
    bad[-1] ^= 1
    scanner = Scanner(header + good + bytes(bad) + frame(encode_epoch(4)))
    assert [decode_record(body) for _, body in scanner] == [EpochRecord(1), EpochRecord(2)]
    assert (scanner.end, scanner.error) == (len(header + good), "checksum mismatch")
    for cut in range(1, len(frame(encode_epoch(2)))):
        torn = Scanner(header + good[:-cut])
        assert len(list(torn)) == 1
        assert torn.error is not None and torn.end == len(header) + len(frame(encode_epoch(1)))


# -- segments, reclaim and retention cuts ------------------------------------------------------


async def test_trimmed_segments_are_deleted(durable: DurableStorage) -> None:
    payload = "x" * 200
    for _ in range(10):
        ids = durable.append("t", _messages(*[payload] * 20))
        await durable.sync()
        durable.trim("t", ids[-1])
    await durable.sync()
    assert durable.segment_count() == 1
    assert len(_segment_files(durable.directory)) == 1
    assert durable.last_id("t") == ids[-1]


async def test_disk_stays_bounded_under_publish_and_trim(durable: DurableStorage) -> None:
    durable.save_cursors({("t", "s"): CursorState(None)})
    durable.table_put("retained", "k", b"v")
    for _ in range(200):
        ids = durable.append("t", _messages(*["y" * 100] * 5))
        durable.save_cursors({("t", "s"): CursorState(ids[-1])})
        durable.trim("t", ids[-1])
        await durable.sync()
        assert durable.disk_bytes() <= 3 * durable.settings.segment_bytes
    assert durable.reclaimed_segments > 10
    store = durable
    await store.aclose()
    store = await open_durable_storage(store.directory, store.settings)
    assert store.load_cursors() == {("t", "s"): CursorState(ids[-1])}
    assert dict(store.table_items("retained")) == {"k": b"v"}
    assert store.last_id("t") == ids[-1]
    await store.aclose()


async def test_live_messages_of_a_slow_topic_are_copied_forward(
    durable: DurableStorage,
) -> None:
    slow = durable.append("slow", _messages("old-1", "old-2"))
    for n in range(300):
        ids = durable.append("fast", _messages(*[f"{n}" * 100] * 3))
        durable.trim("fast", ids[-1])
        await durable.sync()
    # Bounded by about twice the live size plus two segments, not by the slow topic's age.
    assert durable.disk_bytes() <= 4 * durable.settings.segment_bytes
    assert _payloads(await durable.read("slow", None, 10)) == [b"old-1", b"old-2"]
    await durable.aclose()
    store = await open_durable_storage(durable.directory, durable.settings)
    assert [i for i, _ in await store.read("slow", None, 10)] == slow
    assert store.stats().messages == 2
    await store.aclose()


async def test_large_live_state_is_moved_not_churned(durable: DurableStorage) -> None:
    # Table values larger than two segments: live state must count as live, or the log would
    # look like garbage forever and reclaim would rewrite it in a loop.
    for n in range(12):
        durable.table_put("retained", f"k{n}", bytes([n]) * 900)
    await durable.sync()
    with trio.fail_after(20):
        for _ in range(100):
            ids = durable.append("t", _messages(*["w" * 100] * 5))
            durable.trim("t", ids[-1])
            await durable.sync()
    assert durable.disk_bytes() <= 2 * 12 * 1000 + 3 * durable.settings.segment_bytes
    await durable.aclose()
    store = await open_durable_storage(durable.directory, durable.settings)
    assert dict(store.table_items("retained")) == {f"k{n}": bytes([n]) * 900 for n in range(12)}
    await store.aclose()


async def test_retention_cut_by_size_and_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store only says how far the limits reach; the broker trims (acknowledged data only).
    store = await open_durable_storage(tmp_path, small_settings())
    past = SimpleNamespace(time_ns=lambda: time.time_ns() - 120 * 10**9, monotonic=time.monotonic)
    monkeypatch.setattr(durable_module, "time", past)
    old = store.append("t", _messages("old-1", "old-2"))
    monkeypatch.undo()
    recent = store.append("t", _messages(*[f"{n:03d}" + "z" * 97 for n in range(10)]))
    now = int(time.time())
    assert store.retention_cut("t", appended_before=now - 60, keep_bytes=None) == old[-1]
    assert store.retention_cut("t", appended_before=now - 600, keep_bytes=None) is None
    size = store.topic_size("t")
    assert store.retention_cut("t", appended_before=None, keep_bytes=size) is None
    keep = size // 2
    # The size cut reaches past the age cut (the old messages are small): the larger wins.
    cut = store.retention_cut("t", appended_before=now - 60, keep_bytes=keep)
    assert cut is not None and old[-1] < cut < recent[-1]
    assert store.retention_cut("unknown", appended_before=now, keep_bytes=0) is None
    oldest = store.oldest_append_time("t")
    assert oldest is not None and now - 125 <= oldest <= now - 115
    assert store.oldest_append_time("unknown") is None
    store.trim("t", cut)
    assert store.oldest_append_time("t") in (now - 1, now, now + 1)
    await store.sync()
    assert store.topic_size("t") <= keep
    kept = await store.read("t", None, 100)
    assert [i for i, _ in kept] == [i for i in recent if i > cut]
    # One message more would have gone over the size.
    assert store.topic_size("t") + size // 12 > keep
    await store.aclose()


async def test_reads_come_from_disk_when_not_cached(tmp_path: Path) -> None:
    store = await open_durable_storage(tmp_path, small_settings(), cache_bytes=0)
    ids = store.append("t", _messages(*(f"m{n}" for n in range(50))))
    # Nothing written yet: served from the queued bytes.
    assert len(await store.read("t", None, 100)) == 50
    await store.sync()
    page = await store.read("t", ids[9], 5)
    assert _payloads(page) == [b"m10", b"m11", b"m12", b"m13", b"m14"]
    assert [i for i, _ in await store.read("t", None, 100)] == ids
    await store.aclose()


async def test_a_read_retries_when_a_reclaim_moved_its_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await open_durable_storage(tmp_path, small_settings(), cache_bytes=0)
    store.append("t", _messages("a", "b"))
    await store.sync()
    real = segments_module.read_spans
    calls = []

    def moved_once(directory: Path, spans: list[tuple[int, int, int]]) -> list[bytes]:
        calls.append(spans)
        if len(calls) == 1:
            raise FileNotFoundError("reclaimed")
        return real(directory, spans)

    monkeypatch.setattr("mop.broker.storage.reads.read_spans", moved_once)
    assert _payloads(await store.read("t", None, 10)) == [b"a", b"b"]
    assert len(calls) == 2
    await store.aclose()


# -- group commit and fsync policies ---------------------------------------------------------------


async def test_concurrent_syncs_share_writes(durable: DurableStorage) -> None:
    writes = []
    real = durable.files.write

    def counting(*args: object, **kwargs: object) -> None:
        writes.append(1)
        real(*args, **kwargs)  # type: ignore[arg-type]

    durable.files.write = counting  # type: ignore[method-assign]

    async def publisher(n: int) -> None:
        for k in range(5):
            durable.append(f"t{n % 3}", _messages(f"{n}-{k}"))
            await durable.sync()

    async with trio.open_nursery() as nursery:
        for n in range(50):
            nursery.start_soon(publisher, n)
    assert durable.stats().messages == 250
    assert len(writes) < 125


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
async def test_small_writes_without_fsync_stay_on_the_event_loop(
    tmp_path: Path, policy: str
) -> None:
    store = await open_durable_storage(tmp_path, small_settings(fsync=policy, fsync_interval=60))
    calls: list[str] = []
    real_write, real_now = store.files.write, store.files.write_now

    def write(*args: object) -> None:
        calls.append("thread")
        real_write(*args)  # type: ignore[arg-type]

    def write_now(*args: object) -> bool:
        done = real_now(*args)  # type: ignore[arg-type]
        calls.append("inline" if done else "declined")
        return done

    store.files.write = write  # type: ignore[method-assign]
    store.files.write_now = write_now  # type: ignore[method-assign]
    store.append("t", _messages("a"))
    await store.sync()
    store.append("t", [Message(b"z" * 300_000)])  # too large to write inline
    await store.sync()
    inline = ["inline", "thread"] if policy != "always" else ["thread", "thread"]
    assert calls == inline
    await store.aclose()
    store = await open_durable_storage(tmp_path, small_settings())
    assert _payloads(await store.read("t", None, 10))[0] == b"a"
    await store.aclose()


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
async def test_fsync_policies(tmp_path: Path, fsyncs: list[tuple[int, str]], policy: str) -> None:
    settings = small_settings(fsync=policy, fsync_interval=0.05)
    store = await open_durable_storage(tmp_path, settings)
    fsyncs.clear()  # opening the store fsynced its epoch
    store.append("t", _messages("a"))
    await store.sync()
    assert bool(fsyncs) == (policy == "always")
    if policy == "interval":
        async with trio.open_nursery() as nursery:
            await nursery.start(store.serve)
            store.append("t", _messages("b"))
            await store.sync()
            await trio.sleep(0.2)
            assert fsyncs
            nursery.cancel_scope.cancel()
    fsyncs.clear()
    store.append("t", _messages("c"))
    await store.aclose()
    assert fsyncs  # closing always makes the log durable


async def test_interval_fsyncs_on_its_timer_not_on_every_background_write(
    tmp_path: Path, fsyncs: list[tuple[int, str]]
) -> None:
    # Segments large enough that no write seals one (which fsyncs it).
    settings = small_settings(fsync="interval", fsync_interval=60, segment_bytes=64 << 20)
    store = await open_durable_storage(tmp_path, settings)
    fsyncs.clear()  # opening the store fsynced its epoch
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        for _ in range(3):  # each over the background flush size: `serve` writes it
            store.append("t", [Message(b"q" * 1000)] * 1100)
            for _ in range(500):
                if store.tail.written == store.tail.end:
                    break
                await trio.sleep(0.01)
            assert store.tail.written == store.tail.end
        assert not fsyncs  # the interval has not passed
        nursery.cancel_scope.cancel()
    await store.aclose()
    assert fsyncs


async def test_sync_does_not_wait_for_the_interval_fsync(tmp_path: Path) -> None:
    store = await open_durable_storage(
        tmp_path, small_settings(fsync="interval", fsync_interval=0.01)
    )
    started, release = threading.Event(), threading.Event()
    real = store.files.fsync_written

    def slow_fsync() -> None:
        started.set()
        release.wait(10)
        real()

    store.files.fsync_written = slow_fsync  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        store.append("t", _messages("a"))
        await store.sync()
        await trio.to_thread.run_sync(started.wait, 5)
        assert started.is_set()
        # The disk is busy with the interval's fsync; later records are written meanwhile.
        store.append("t", _messages("b"))
        with trio.fail_after(5):
            await store.sync()
        assert store.tail.written == store.tail.end
        release.set()
        nursery.cancel_scope.cancel()
    await store.aclose()
    store = await open_durable_storage(tmp_path, small_settings())
    assert _payloads(await store.read("t", None, 10)) == [b"a", b"b"]
    await store.aclose()


async def test_serve_writes_queued_records_and_stops_on_close(durable: DurableStorage) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(durable.serve)
        durable.append("t", [Message(b"q" * 1000)] * 1200)  # over the background flush size
        for _ in range(500):
            if durable.tail.written == durable.tail.end:
                break
            await trio.sleep(0.01)
        assert durable.tail.written == durable.tail.end
        await durable.aclose()


# -- write errors ---------------------------------------------------------------------------------


def _log_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.log"))


def _failing_pwrite(code: int, partial: bool) -> object:
    real = os.pwrite

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if partial and len(data) > 1:
            real(fd, data[: len(data) // 2], offset)
        raise OSError(code, os.strerror(code))

    return pwrite


@pytest.mark.parametrize("fsync", ["always", "never"])  # a worker thread's write, an inline one
@pytest.mark.parametrize("partial", [False, True])
async def test_disk_full_refuses_the_batch_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partial: bool, fsync: str
) -> None:
    monkeypatch.setattr(durable_module, "_FULL_BACKOFF", 0.2)
    store = await open_durable_storage(tmp_path, small_settings(fsync=fsync))
    store.append("t", _messages("durable"))
    await store.sync()
    size = _log_bytes(tmp_path)
    monkeypatch.setattr(os, "pwrite", _failing_pwrite(errno.ENOSPC, partial))
    refused = store.append("t", _messages("refused", "with it"))
    store.table_put("x", "k", b"queued with the refused messages")
    outcomes: list[bool] = []
    store.when_written(outcomes.append)
    failures = []

    async def waiter() -> None:
        try:
            await store.sync()
        except StorageFull as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(waiter)
    assert len(failures) == 5
    assert outcomes == [False]
    assert _log_bytes(tmp_path) == size  # the failed write's partial bytes are gone
    # Refused means refused: the messages are gone from the store at once...
    assert _payloads(await store.read("t", None, 10)) == [b"durable"]
    assert store.stats().messages == 1
    with pytest.raises(StorageFull):
        store.append("t", _messages("refused while full"))
    monkeypatch.undo()
    await trio.sleep(0.25)
    ids = store.append("t", _messages("after"))
    store.when_written(outcomes.append)
    await store.sync()
    assert outcomes == [False, True]
    assert ids[0] > refused[-1]  # the refused ids are never given out again
    await store.aclose()
    store = await open_durable_storage(tmp_path, small_settings(fsync=fsync))
    assert store.recovery.truncated == 0
    # ...and the later write that stored what was queued with them did not store them.
    assert _payloads(await store.read("t", None, 10)) == [b"durable", b"after"]
    assert dict(store.table_items("x")) == {"k": b"queued with the refused messages"}
    assert store.last_id("t") == ids[0]
    await store.aclose()


async def test_messages_queued_during_a_refused_write_are_written_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(durable_module, "_FULL_BACKOFF", 0.0)
    store = await open_durable_storage(tmp_path, small_settings(fsync="never"))  # inline write
    outcomes: list[tuple[str, bool]] = []
    kept: list[MessageId] = []
    real = os.pwrite

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        # While the write is in flight a publisher queues more, in the same topic.
        monkeypatch.setattr(os, "pwrite", real)
        kept.extend(store.append("t", _messages("queued during the write")))
        store.when_written(lambda ok: outcomes.append(("kept", ok)))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    store.append("t", _messages("refused"))
    store.when_written(lambda ok: outcomes.append(("refused", ok)))
    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(StorageFull):
        await store.sync()
    assert outcomes == [("refused", False)]
    await store.sync()
    assert outcomes == [("refused", False), ("kept", True)]
    expected = [(kept[0], Message(b"queued during the write"))]
    assert await store.read("t", None, 10) == expected
    assert store.stats().messages == 1
    # The topic's runs stay usable around the gap: trimming and appending go on.
    store.trim("t", kept[0])
    later = store.append("t", _messages("later"))
    assert later[0] > kept[0]
    assert await store.read("t", None, 10) == [(later[0], Message(b"later"))]
    assert store.stats().messages == 1
    await store.aclose()
    store = await open_durable_storage(tmp_path, small_settings(fsync="never"))
    assert await store.read("t", None, 10) == [(later[0], Message(b"later"))]
    await store.aclose()


async def test_other_write_errors_refuse_the_batch_too(
    durable: DurableStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "pwrite", _failing_pwrite(errno.EIO, False))
    durable.append("t", _messages("a"))
    with pytest.raises(StorageError) as caught:
        await durable.sync()
    assert not isinstance(caught.value, StorageFull)
    monkeypatch.undo()
    durable.append("t", _messages("b"))
    await durable.sync()
    assert _payloads(await durable.read("t", None, 10)) == [b"b"]


async def test_open_logs_a_summary(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = await open_durable_storage(tmp_path, small_settings())
    store.append("t", _messages("a"))
    store.table_put("x", "k", b"v")
    await store.aclose()
    with caplog.at_level(logging.INFO, logger="mop.storage"):
        store = await open_durable_storage(tmp_path, small_settings())
    assert "1 topics, 1 messages, 0 cursors and 1 table keys" in caplog.text
    assert str(store.recovery) in caplog.text
    await store.aclose()


async def test_a_cancelled_sync_leaves_no_hole_in_the_log(tmp_path: Path) -> None:
    settings = small_settings(fsync="always")  # every write goes through a worker thread
    store = await open_durable_storage(tmp_path, settings)
    first = store.append("t", [Message(b"from a client that went away", qos=1)])
    with trio.CancelScope() as scope:
        scope.cancel()
        await store.sync()
    second = store.append("t", [Message(b"from a client that stayed", qos=1)])
    await store.sync()
    page = await store.read("t", None, 10)
    assert [i for i, _ in page] == first + second
    await store.aclose()

    store = await open_durable_storage(tmp_path, settings)
    try:
        page = await store.read("t", None, 10)
        assert [m.payload for _, m in page] == [
            b"from a client that went away",
            b"from a client that stayed",
        ]
    finally:
        await store.aclose()


def _failing_fsync(error: int) -> Callable[[int], None]:
    def fsync(fd: int) -> None:
        raise OSError(error, os.strerror(error))

    return fsync


async def test_a_failed_fsync_stops_the_log_taking_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an fsync error Linux may have dropped what it could not write: a later fsync
    would succeed without it, so the log refuses every write rather than claim them safe."""
    store = await open_durable_storage(tmp_path, small_settings(fsync="always"))
    store.append("t", _messages("safe"))
    await store.sync()
    monkeypatch.setattr(os, "fsync", _failing_fsync(errno.EIO))
    store.append("t", _messages("refused"))
    with pytest.raises(StorageError):
        await store.sync()
    monkeypatch.undo()  # the disk answers again: still refused
    store.append("t", _messages("after"))
    with pytest.raises(StorageError, match="fsync failed"):
        await store.sync()
    store.abandon()
    store = await open_durable_storage(tmp_path, small_settings())
    assert _payloads(await store.read("t", None, 10)) == [b"safe"]
    await store.aclose()


async def test_a_full_disk_at_fsync_is_a_full_disk_not_a_damaged_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(durable_module, "_FULL_BACKOFF", 0.0)
    store = await open_durable_storage(tmp_path, small_settings(fsync="always"))
    monkeypatch.setattr(os, "fsync", _failing_fsync(errno.ENOSPC))
    store.append("t", _messages("refused"))
    with pytest.raises(StorageFull):
        await store.sync()
    monkeypatch.undo()  # space again: writes go on
    store.append("t", _messages("kept"))
    await store.sync()
    assert _payloads(await store.read("t", None, 10)) == [b"kept"]
    await store.aclose()
