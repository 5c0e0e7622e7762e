"""The message fields Pulsar needs (deliver_at, batches, the producing protocol's wire bytes) in
storage: record round trips, plain records unchanged, and both stores across a reopen."""

from __future__ import annotations

import dataclasses

import pytest

from mop.broker.storage.memory import MemoryStorage
from mop.broker.storage.records import decode_message, encode_message
from mop.broker.topic import payload_size
from mop.message import Message, MessageId, PackedBatch

from .conftest import Harness

BATCHED = Message(
    b"",
    (("outer", "1"),),
    key="k",
    producer="p",
    publish_time=5,
    deliver_at=1_700_000_000_000,
    batch=(
        Message(b"one", (("i", "0"),), producer="p", wire_format="pulsar", wire=b"\x18\x03"),
        Message(b"two", key="k2", producer="p", event_time=9),
    ),
    wire_format="pulsar",
    wire=b"\x0a\x01p\x10\x00",
)


def test_records_round_trip_the_new_fields() -> None:
    body = encode_message(3, 4, 5, BATCHED)
    assert decode_message(body) == (MessageId(3, 4), BATCHED)


def test_records_keep_the_count_of_a_batch_kept_packed() -> None:
    opaque = Message(b"sealed", producer="p", wire_format="pulsar", wire=b"\x01", opaque_count=7)
    assert decode_message(encode_message(3, 4, 5, opaque))[1].count == 7


def _packed(unpacked: list[int]) -> Message:
    members = BATCHED.batch
    assert isinstance(members, tuple)

    def unpack() -> tuple[Message, ...]:
        unpacked.append(1)
        return members

    batch = PackedBatch(len(members), "pulsar", b"as sent", 6, unpack)
    return dataclasses.replace(BATCHED, batch=batch)


def test_a_packed_batch_reads_back_packed_and_unpacks_its_members_when_asked() -> None:
    unpacked: list[int] = []
    message = _packed(unpacked)
    body = encode_message(3, 4, 5, message)
    assert unpacked == [1]  # writing a record encodes the members
    message_id, read = decode_message(body)
    batch = read.batch
    assert message_id == MessageId(3, 4) and isinstance(batch, PackedBatch)
    assert (len(batch), batch.packed_as("pulsar"), batch.packed_as("mqtt")) == (2, b"as sent", None)
    assert batch.payload_bytes == 6 and payload_size(read) == 6
    assert read == BATCHED and read == message  # the members, decoded now
    assert batch[1] == BATCHED.batch[1] and list(batch) == list(BATCHED.batch)
    assert hash(read) == hash(BATCHED)


def test_a_packed_batch_whose_members_do_not_decode_fails_when_they_are_asked_for() -> None:
    body = encode_message(3, 4, 5, _packed([]))
    _, read = decode_message(body[:-1])  # the last member's record lost a byte
    with pytest.raises(ValueError):
        list(read.batch)


def test_a_plain_message_record_is_unchanged() -> None:
    plain = Message(b"x", (("a", "b"),), key="k", producer="p", publish_time=1, qos=2)
    body = encode_message(1, 2, 3, plain)
    # The fixed header, producer, key, one property and the payload: nothing after it.
    assert body.endswith(b"x") and decode_message(body)[1] == plain


def test_a_record_with_an_unknown_extension_version_is_refused() -> None:
    body = bytearray(encode_message(1, 2, 3, Message(b"x", deliver_at=1)))
    body[body.index(b"x") + 1] = 99  # the extension's version byte
    with pytest.raises(ValueError):
        decode_message(bytes(body))


def test_memory_storage_counts_batch_bytes() -> None:
    storage = MemoryStorage(max_bytes=10)
    with pytest.raises(Exception, match="limit"):
        storage.append("t", [Message(b"", batch=(Message(b"0123456789ab"),))])


async def test_both_stores_keep_the_new_fields_across_a_reopen(harness: Harness) -> None:
    store = harness.store
    [message_id] = store.append("t", [BATCHED])
    await store.sync()
    store = await harness.reopen()
    assert await store.read("t", None, 10) == [(message_id, BATCHED)]


async def test_both_stores_keep_a_packed_batch_packed(harness: Harness) -> None:
    store = harness.store
    [message_id] = store.append("t", [_packed([])])
    await store.sync()
    store = await harness.reopen()
    [(read_id, read)] = await store.read("t", None, 10)
    assert read_id == message_id and read == BATCHED
    assert isinstance(read.batch, PackedBatch) and read.batch.packed == b"as sent"
