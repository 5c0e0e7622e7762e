"""Pulsar messages <-> neutral messages (`mop.protocols.pulsar.mapping`): SEND payloads become
entries that go back out byte for byte, batches split into their messages, messages of other
protocols get Pulsar metadata, special ids; the batch splitter is fuzzed."""

from __future__ import annotations

import struct
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from mop.message import ENCRYPTED, Message, MessageId, PackedBatch
from mop.protocols.pulsar.batching import single_header
from mop.protocols.pulsar.codec import decode_message
from mop.protocols.pulsar.frames import decode_batch, encode_batch, make_payload
from mop.protocols.pulsar.mapping import (
    EARLIEST,
    LATEST,
    entry_bytes,
    from_id_data,
    message_from_payload,
    split_batch,
    to_id_data,
    with_member_properties,
    with_properties,
)
from mop.protocols.pulsar.metadata import (
    EARLIEST_ID,
    LATEST_ID,
    BatchEntry,
    CompressionType,
    EncryptionKeys,
    KeyValue,
    MessageIdData,
    MessageMetadata,
    SingleMessageMetadata,
)


def _metadata(**fields: object) -> MessageMetadata:
    base: dict[str, object] = {"producer_name": "p", "sequence_id": 7, "publish_time": 1000}
    base.update(fields)
    return MessageMetadata(**base)  # type: ignore[arg-type]


def _raw_metadata(raw: bytes) -> MessageMetadata:
    (size,) = struct.unpack_from(">I", raw)
    return decode_message(MessageMetadata, raw, 4, 4 + size)


def test_a_single_message_keeps_its_fields_and_its_bytes() -> None:
    meta = _metadata(
        properties=(KeyValue(key="a", value="1"), KeyValue(key="a", value="2")),
        partition_key="k",
        event_time=5,
        deliver_at_time=2000,
    )
    payload = make_payload(meta, b"data")
    message = message_from_payload(payload)
    assert (message.payload, message.key, message.producer) == (b"data", "k", "p")
    assert message.properties == (("a", "1"), ("a", "2"))
    assert (message.publish_time, message.event_time, message.deliver_at) == (1000, 5, 2000)
    assert entry_bytes(message, MessageId(1, 2)) == payload.raw


def test_the_ordering_key_is_the_dispatch_key() -> None:
    payload = make_payload(_metadata(partition_key="p", ordering_key=b"o"), b"x")
    assert message_from_payload(payload).key == "o"


def test_a_null_value_has_no_payload_for_other_protocols() -> None:
    payload = make_payload(_metadata(null_value=True), b"")
    message = message_from_payload(payload)
    assert message.payload == b""
    assert entry_bytes(message, MessageId(0, 0)) == payload.raw


def test_a_batch_splits_into_messages_and_goes_back_whole() -> None:
    entries = [
        BatchEntry(
            SingleMessageMetadata(
                payload_size=len(data),
                properties=(KeyValue(key="i", value=str(i)),),
                partition_key=f"k{i}",
                sequence_id=i,
            ),
            data,
        )
        for i, data in enumerate([b"zero", b"", b"two"])
    ]
    payload = make_payload(_metadata(num_messages_in_batch=3), encode_batch(entries))
    message = message_from_payload(payload)
    assert message.payload == b"" and message.count == 3
    assert [m.payload for m in message.batch] == [b"zero", b"", b"two"]
    assert [m.properties for m in message.batch] == [(("i", str(i)),) for i in range(3)]
    assert [m.key for m in message.batch] == ["k0", "k1", "k2"]
    assert {m.producer for m in message.batch} == {"p"}
    assert entry_bytes(message, MessageId(1, 2)) == payload.raw


def test_a_batch_is_delivered_from_the_bytes_it_was_sent_in() -> None:
    # A member with a null value still has its payload bytes in the batch as sent.
    entries = [
        BatchEntry(SingleMessageMetadata(payload_size=3, null_value=True), b"abc"),
        BatchEntry(SingleMessageMetadata(payload_size=1), b"d"),
    ]
    payload = make_payload(_metadata(num_messages_in_batch=2), encode_batch(entries))
    message = message_from_payload(payload)
    assert isinstance(message.batch, PackedBatch)
    assert [m.payload for m in message.batch] == [b"", b"d"]
    assert entry_bytes(message, MessageId(1, 2)) == payload.raw


def test_a_batch_packed_by_another_protocol_is_packed_again() -> None:
    members = (Message(b"a"), Message(b"bc"))
    batch = PackedBatch.of(members, "other", b"not pulsar")
    raw = entry_bytes(Message(b"", batch=batch), MessageId(0, 0))
    assert raw == entry_bytes(Message(b"", batch=members), MessageId(0, 0))


def test_a_compressed_batch_stays_whole() -> None:
    payload = make_payload(
        _metadata(num_messages_in_batch=2, compression=CompressionType.LZ4), b"\x01\x02\x03"
    )
    message = message_from_payload(payload)
    assert message.batch == () and message.payload == b"\x01\x02\x03"
    assert entry_bytes(message, MessageId(1, 2)) == payload.raw


def test_messages_of_other_protocols_get_metadata() -> None:
    message = Message(
        b"hi", (("colour", "red"),), key="k", producer="mqtt-client", publish_time=99, event_time=3
    )
    raw = entry_bytes(message, MessageId(4, 5))
    meta = _raw_metadata(raw)
    assert (meta.producer_name, meta.publish_time, meta.partition_key) == ("mqtt-client", 99, "k")
    assert meta.properties == (KeyValue(key="colour", value="red"),)
    assert meta.event_time == 3 and meta.num_messages_in_batch is None
    assert raw.endswith(b"hi")


def test_neutral_batches_are_encoded_as_pulsar_batches() -> None:
    message = Message(b"", batch=(Message(b"a", key="x"), Message(b"bc")), producer="n")
    raw = entry_bytes(message, MessageId(0, 0))
    meta = _raw_metadata(raw)
    assert meta.num_messages_in_batch == 2
    (size,) = struct.unpack_from(">I", raw)
    entries = decode_batch(raw[4 + size :], 2)
    assert [e.payload for e in entries] == [b"a", b"bc"]
    assert entries[0].metadata.partition_key == "x"


def test_special_ids() -> None:
    earliest = MessageIdData(ledger_id=EARLIEST_ID, entry_id=EARLIEST_ID)
    latest = MessageIdData(ledger_id=LATEST_ID, entry_id=LATEST_ID)
    assert from_id_data(earliest) == EARLIEST
    assert from_id_data(latest) == LATEST
    assert from_id_data(MessageIdData(ledger_id=3, entry_id=4, batch_index=2)) == MessageId(3, 4, 2)
    none = to_id_data(None)
    assert (none.ledger_id, none.entry_id) == (EARLIEST_ID, EARLIEST_ID)
    assert to_id_data(MessageId(3, 4), batch_index=1).batch_index == 1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=1, max_value=5))
def test_splitting_any_bytes_never_raises(data: bytes, count: int) -> None:
    members = split_batch(data, count, "p", 0)
    assert members == () or len(members) == count


def test_the_mqtt_qos_a_message_carries_decides_whether_the_broker_holds_it() -> None:
    """A proxy's QoS 0 message (`mop.qos` = 0) is routed before it is written; any other one,
    and a batch with any other member, is held until written (qos >= 1)."""

    def sent(*properties: tuple[tuple[str, str], ...]) -> Message:
        if len(properties) == 1:
            meta = MessageMetadata(
                producer_name="p",
                sequence_id=0,
                publish_time=5,
                properties=tuple(KeyValue(key=k, value=v) for k, v in properties[0]),
            )
            return message_from_payload(make_payload(meta, b"x"))
        body = b"".join(single_header(p, None, 1, 0) + b"x" for p in properties)
        meta = MessageMetadata(
            producer_name="p", sequence_id=0, publish_time=5, num_messages_in_batch=len(properties)
        )
        return message_from_payload(make_payload(meta, body))

    qos0 = (("mop.qos", "0"), ("mop.producer", "c"))
    assert sent(qos0).qos == 0
    assert sent(()).qos == 1  # a Pulsar client's own message
    assert sent((("mop.qos", "2"),)).qos == 2
    assert sent((("mop.qos", "zero"),)).qos == 1  # not ours to read: held
    batch = sent(qos0, qos0)
    assert batch.qos == 0 and [m.qos for m in batch.batch] == [0, 0]
    assert sent(qos0, ()).qos == 1


def test_properties_added_on_the_way_reach_pulsar_consumers_too() -> None:
    payload = make_payload(_metadata(properties=(KeyValue(key="a", value="1"),)), b"data")
    message = with_properties(message_from_payload(payload), (("traceparent", "00-x"),))
    assert message.properties == (("a", "1"), ("traceparent", "00-x"))
    meta = _raw_metadata(entry_bytes(message, MessageId(1, 2)))
    assert meta.properties == (
        KeyValue(key="a", value="1"),
        KeyValue(key="traceparent", value="00-x"),
    )
    assert (meta.producer_name, meta.sequence_id) == ("p", 7)


def test_properties_are_not_added_to_a_chunk() -> None:
    payload = make_payload(_metadata(chunk_id=0, num_chunks_from_msg=2), b"part")
    message = message_from_payload(payload)
    assert with_properties(message, (("traceparent", "00-x"),)) is message


def test_properties_added_to_members_of_a_batch() -> None:
    entries = [
        BatchEntry(SingleMessageMetadata(payload_size=len(data), sequence_id=i), data)
        for i, data in enumerate([b"zero", b"one"])
    ]
    payload = make_payload(_metadata(num_messages_in_batch=2), encode_batch(entries))
    message = with_member_properties(
        message_from_payload(payload), ((), (("traceparent", "00-y"),))
    )
    assert [m.properties for m in message.batch] == [(), (("traceparent", "00-y"),)]
    raw = entry_bytes(message, MessageId(1, 2))
    (size,) = struct.unpack_from(">I", raw)
    members = decode_batch(raw[4 + size :], 2)
    assert [m.payload for m in members] == [b"zero", b"one"]
    assert [m.metadata.properties for m in members] == [
        (),
        (KeyValue(key="traceparent", value="00-y"),),
    ]
    assert members[1].metadata.sequence_id == 1


def test_properties_added_to_a_message_of_another_protocol() -> None:
    message = with_properties(Message(b"hi", (("a", "1"),)), (("traceparent", "00-z"),))
    meta = _raw_metadata(entry_bytes(message, MessageId(0, 0)))
    assert meta.properties[-1] == KeyValue(key="traceparent", value="00-z")


# --- end-to-end encryption -----------------------------------------------------------------------

_KEYS = (EncryptionKeys(key="k1", value=b"\x01" * 32, metadata=(KeyValue(key="v", value="1"),)),)


def _encrypted(data: bytes, **fields: object) -> Message:
    meta = _metadata(
        encryption_keys=_KEYS, encryption_algo="RSA", encryption_param=b"iv" * 6, **fields
    )
    payload = make_payload(meta, data)
    message = message_from_payload(payload)
    assert entry_bytes(message, MessageId(1, 2)) == payload.raw  # byte for byte
    assert _raw_metadata(payload.raw).encryption_keys == _KEYS
    return message


def test_an_encrypted_message_is_kept_as_sent_and_marked() -> None:
    message = _encrypted(b"ciphertext", properties=(KeyValue(key="a", value="1"),))
    assert message.payload == b"ciphertext"
    assert message.properties == (("a", "1"), ENCRYPTED)


def test_an_encrypted_payload_is_neither_decompressed_nor_split() -> None:
    # Even when it would decompress (here: really zlib data), it is the producer's to undo.
    data = zlib.compress(b"looks compressed")
    message = _encrypted(data, compression=CompressionType.ZLIB, uncompressed_size=16)
    assert message.payload == data and message.batch == ()
    batch = _encrypted(b"\x00\x00\x00\x02\x18\x01x", num_messages_in_batch=1)
    assert batch.batch == () and ENCRYPTED in batch.properties


def test_properties_are_not_added_to_an_encrypted_message() -> None:
    message = _encrypted(b"ciphertext")
    assert with_properties(message, (("traceparent", "00-x"),)) is message


def test_a_plain_message_cannot_claim_the_encrypted_mark() -> None:
    claimed = (KeyValue(key=ENCRYPTED[0], value=ENCRYPTED[1]), KeyValue(key="b", value="2"))
    message = message_from_payload(make_payload(_metadata(properties=claimed), b"plain"))
    assert message.properties == (("b", "2"),)
