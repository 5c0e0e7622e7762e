"""Protobuf wire format of the command schema: varints, field rules, and hand-written vectors."""

from __future__ import annotations

import dataclasses
import re

import pytest

from mop.protocols.pulsar.codec import (
    INT32,
    STRING,
    UINT64,
    decode_message,
    encode_message,
    message,
    message_bytes,
    pb,
    read_varint,
    write_varint,
)
from mop.protocols.pulsar.commands import (
    Ack,
    AckType,
    Connect,
    FeatureFlags,
    Message,
    Producer,
    ProducerAccessMode,
    Subscribe,
    SubType,
)
from mop.protocols.pulsar.errors import LocalProtocolError, MalformedFrame
from mop.protocols.pulsar.metadata import KeyValue, MessageIdData, MessageMetadata


def varint(value: int) -> bytes:
    out = bytearray()
    write_varint(out, value)
    return bytes(out)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        ((1 << 63) - 1, "ffffffffffffffff7f"),
        ((1 << 64) - 1, "ffffffffffffffffff01"),
        (-1, "ffffffffffffffffff01"),  # negative int32/int64 take ten bytes
    ],
)
def test_varints(value: int, encoded: str) -> None:
    assert varint(value).hex() == encoded
    decoded, pos = read_varint(bytes.fromhex(encoded), 0, len(encoded) // 2)
    assert decoded == value & ((1 << 64) - 1)
    assert pos == len(encoded) // 2


def test_varint_errors() -> None:
    with pytest.raises(MalformedFrame, match="truncated"):
        read_varint(b"\x80\x80", 0, 2)
    with pytest.raises(MalformedFrame, match="truncated"):
        read_varint(b"\x80\x01", 0, 1)  # the end of the message comes before the varint's end
    with pytest.raises(MalformedFrame, match="longer than 10"):
        read_varint(b"\xff" * 11, 0, 11)


def test_message_id_vector() -> None:
    # ledgerId=1 (field 1), entryId=300 (field 2); partition and batch_index at -1 are left out.
    mid = MessageIdData(ledger_id=1, entry_id=300)
    assert message_bytes(mid).hex() == "080110ac02"
    assert decode_message(MessageIdData, bytes.fromhex("080110ac02")) == mid
    with_index = MessageIdData(ledger_id=1, entry_id=2, batch_index=3, ack_set=(1018,))
    assert message_bytes(with_index).hex() == "08011002200328fa07"


def test_connect_vector() -> None:
    encoded = bytes.fromhex(
        "0a"
        "11"
        + b"Pulsar-CPP-v4.2.0".hex()  # 1 client_version
        + "20"
        "14"  # 4 protocol_version 20
         + "2a"
        "04"
        + b"none".hex()  # 5 auth_method_name
        + "52"
        "04"
        "0801"
        "1001"  # 10 feature_flags {1: true, 2: true}
    )
    connect = decode_message(Connect, encoded)
    assert connect == Connect(
        client_version="Pulsar-CPP-v4.2.0",
        protocol_version=20,
        auth_method_name="none",
        feature_flags=FeatureFlags(supports_auth_refresh=True, supports_broker_entry_metadata=True),
    )
    assert message_bytes(connect) == encoded


def test_defaults_are_not_written_and_read_back() -> None:
    producer = Producer(topic="t", producer_id=0, request_id=1)
    assert message_bytes(producer).hex() == "0a017410001801"
    decoded = decode_message(Producer, message_bytes(producer))
    assert decoded.user_provided_producer_name is True
    assert decoded.producer_access_mode is ProducerAccessMode.Shared
    assert decoded.metadata == ()
    # A default written explicitly (as the C++ client does for some fields) reads the same.
    explicit = bytes.fromhex("0a01741000180148005000")
    assert decode_message(Producer, explicit) == dataclasses.replace(
        producer, user_provided_producer_name=False
    )


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    known = message_bytes(MessageIdData(ledger_id=7, entry_id=8))
    unknown = (
        "f801"
        "05"  # field 31 varint
        "f901"
        "0102030405060708"  # field 31 fixed64
        "fa01"
        "03"
        "616263"  # field 31 length-delimited
        "fd01"
        "01020304"  # field 31 fixed32
    )
    data = known + bytes.fromhex(unknown)
    assert decode_message(MessageIdData, data) == MessageIdData(ledger_id=7, entry_id=8)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ("080110020b", "wire type 3"),  # a group start
        ("0801", "lacks required field"),
        ("080110", "truncated varint"),
        ("080110022a0501", "overruns"),
        ("080110020001", "field number 0"),
        ("08011002390102", "truncated fixed-size"),
    ],
)
def test_malformed_messages(data: str, match: str) -> None:
    with pytest.raises(MalformedFrame, match=match):
        decode_message(MessageIdData, bytes.fromhex(data))


def test_invalid_utf8_is_malformed() -> None:
    with pytest.raises(MalformedFrame, match="UTF-8"):
        decode_message(KeyValue, bytes.fromhex("0a01ff120161"))


def test_packed_and_unpacked_repeated_scalars_both_decode() -> None:
    unpacked = bytes.fromhex("080112040801100020012002")
    packed = bytes.fromhex("080112040801100022020102")
    expected = Message(
        consumer_id=1, message_id=MessageIdData(ledger_id=1, entry_id=0), ack_set=(1, 2)
    )
    assert decode_message(Message, unpacked) == expected
    assert decode_message(Message, packed) == expected
    assert message_bytes(expected) == unpacked  # proto2 repeated scalars are not packed


def test_repeated_messages_keep_their_order() -> None:
    ack = Ack(
        consumer_id=3,
        ack_type=AckType.Cumulative,
        message_id=tuple(MessageIdData(ledger_id=1, entry_id=i) for i in range(5)),
    )
    assert decode_message(Ack, message_bytes(ack)) == ack


def test_unknown_enum_value_is_an_unknown_field() -> None:
    # subType 9 is not a SubType: proto2 readers treat the field as unknown, so the required
    # field is missing.
    data = message_bytes(
        Subscribe(topic="t", subscription="s", sub_type=SubType.Shared, consumer_id=0, request_id=0)
    ).replace(b"\x18\x01", b"\x18\x09")
    with pytest.raises(MalformedFrame, match="sub_type"):
        decode_message(Subscribe, data)


def test_negative_values_round_trip() -> None:
    meta = MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=0, deliver_at_time=-5, marker_type=-1
    )
    assert decode_message(MessageMetadata, message_bytes(meta)) == meta


@pytest.mark.parametrize(
    "bad",
    [
        MessageIdData(ledger_id=-1, entry_id=0),
        MessageIdData(ledger_id=1 << 64, entry_id=0),
        MessageIdData(ledger_id=0, entry_id=0, partition=1 << 31),
    ],
)
def test_out_of_range_values_are_our_mistake(bad: MessageIdData) -> None:
    with pytest.raises(LocalProtocolError, match="out of range"):
        message_bytes(bad)


def test_required_none_and_wrong_message_type_are_our_mistake() -> None:
    with pytest.raises(LocalProtocolError, match="required"):
        message_bytes(KeyValue(key="k", value=None))  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="expected MessageIdData"):
        message_bytes(Message(consumer_id=0, message_id=KeyValue(key="k", value="v")))  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="not a protobuf message"):
        encode_message(object(), bytearray())


def test_messages_are_frozen_and_keyword_only() -> None:
    mid = MessageIdData(ledger_id=1, entry_id=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mid.entry_id = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        MessageIdData(1, 2)  # type: ignore[call-arg]
    decoded = decode_message(MessageIdData, message_bytes(mid))
    assert decoded == mid
    assert hash(decoded) == hash(mid)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.entry_id = 3  # type: ignore[misc]


def test_schema_declaration_rules() -> None:
    with pytest.raises(TypeError, match=re.escape("default=()")):
        pb(1, STRING, repeated=True)

    @message
    class Sample:
        number: int = pb(2, UINT64)
        small: int = pb(1, INT32, default=-1)

    # Encoded in field-number order whatever the declaration order.
    assert message_bytes(Sample(number=5, small=3)).hex() == "08031005"

    with pytest.raises(TypeError, match="field number"):

        @message
        class Twice:
            one: int = pb(1, UINT64)
            two: int = pb(1, UINT64)
