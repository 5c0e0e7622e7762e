"""Appending several messages in one call: the same records as one call each, across segment
rolls and restarts, and reads served from the recently written bytes the log tail keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from mop.broker.storage.durable import open_durable_storage
from mop.broker.storage.records import Scanner, encode_message, frame, frame_messages
from mop.message import Message, MessageId
from tests.unit.broker.storage.conftest import small_settings

_MIXED = [
    Message(b"plain", producer="c1", publish_time=7, qos=0),
    Message(b"same producer", producer="c1", publish_time=8, qos=1),
    Message(b"keyed", producer="c2", key="k", expires_at=99),
    Message(b"props", properties=(("a", "1"), ("a", "2")), producer="c2"),
    Message(b"wire", wire_format="pulsar", wire=b"\x01\x02", deliver_at=5),
    Message(b"", batch=(Message(b"m0"), Message(b"m1", key="k1")), producer="\u00e9"),
    Message(b"plain again", producer="c1", event_time=3),
]


def test_framed_batch_is_the_records_of_single_appends() -> None:
    data, sizes = frame_messages(7, 40, 123, _MIXED)
    single = [frame(encode_message(7, 40 + n, 123, m)) for n, m in enumerate(_MIXED)]
    assert data == b"".join(single)
    assert sizes == [len(record) for record in single]


def test_a_message_that_cannot_be_encoded_fails_the_whole_batch() -> None:
    with pytest.raises(UnicodeEncodeError):
        frame_messages(1, 0, 0, [Message(b"ok"), Message(b"bad", producer="\ud800")])


async def test_one_call_across_segment_rolls_gives_consecutive_ids(tmp_path: Path) -> None:
    settings = small_settings(segment_bytes=1024)
    store = await open_durable_storage(tmp_path, settings)
    batch = [Message(f"message {n:03}".encode() * 8, qos=n % 2) for n in range(40)]
    ids = store.append("t", batch)
    assert store.segment_count() > 2  # the batch did not fit one segment
    assert [i.entry for i in ids] == list(range(ids[0].entry, ids[0].entry + 40))
    assert len({i.ledger for i in ids}) == 1
    more = store.append("t", batch[:3])
    assert more[0].entry == ids[-1].entry + 1
    await store.sync()
    await store.aclose()
    store = await open_durable_storage(tmp_path, settings)
    try:
        page = await store.read("t", None, 100)
        assert [i for i, _ in page] == ids + more
        assert [m for _, m in page] == batch + batch[:3]
        assert store.last_id("t") == more[-1]
    finally:
        await store.aclose()


async def test_batches_and_single_appends_write_the_same_log(tmp_path: Path) -> None:
    batched = await open_durable_storage(tmp_path / "a", small_settings())
    single = await open_durable_storage(tmp_path / "b", small_settings())
    try:
        batched.append("t", _MIXED)
        for message in _MIXED:
            single.append("t", [message])
        a = [body.tobytes() for _, body in Scanner(batched.tail.pending, 0)]
        b = [body.tobytes() for _, body in Scanner(single.tail.pending, 0)]
        # The records differ only in the append time they carry.
        assert len(a) == len(b)
        assert [x[0] for x in a] == [y[0] for y in b]
        assert [x[25:] for x in a] == [y[25:] for y in b]
    finally:
        await batched.aclose()
        await single.aclose()


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20])
async def test_recently_written_records_are_read_from_memory(
    tmp_path: Path, cache_bytes: int
) -> None:
    store = await open_durable_storage(tmp_path, small_settings(), cache_bytes=cache_bytes)
    try:
        ids = store.append("t", [Message(b"one"), Message(b"two")])
        await store.sync()
        assert store.tail.written == store.tail.end  # nothing is pending any more
        topic = store.index.topics["t"]
        slots = topic.locate(None, 10)
        kept = [store.tail.find(position, size) for _, _, position, size in slots]
        if cache_bytes:
            assert all(raw is not None for raw in kept)
        else:
            assert kept == [None, None]
        page = await store.read("t", None, 10)
        assert page == [(ids[0], Message(b"one")), (ids[1], Message(b"two"))]
    finally:
        await store.aclose()


async def test_kept_bytes_stay_within_their_bound(tmp_path: Path) -> None:
    store = await open_durable_storage(
        tmp_path, small_settings(segment_bytes=1 << 16), cache_bytes=2048
    )
    try:
        first = store.append("t", [Message(b"x" * 500)])[0]
        for _ in range(10):
            store.append("t", [Message(b"y" * 500)])
            await store.sync()
        # The oldest record is no longer kept, and is read back from its file.
        slot = store.index.topics["t"].locate(None, 1)[0]
        assert store.tail.find(slot[2], slot[3]) is None
        page = await store.read("t", None, 1)
        assert page == [(first, Message(b"x" * 500))]
        assert page[0][0] == MessageId(first.ledger, first.entry)
    finally:
        await store.aclose()
