"""Pulsar framing: byte vectors written from the reference, checksums, limits and batches."""

from __future__ import annotations

import struct

import pytest

from mop.protocols.pulsar.commands import (
    AuthChallenge,
    AuthData,
    AuthResponse,
    Connected,
    Flow,
    Message,
    Ping,
    Send,
    SendReceipt,
    Success,
)
from mop.protocols.pulsar.errors import (
    FrameTooLarge,
    LocalProtocolError,
    MalformedFrame,
    RemoteProtocolError,
    ServerError,
)
from mop.protocols.pulsar.frames import (
    NEED_DATA,
    ChecksumMismatch,
    Frame,
    FrameDecoder,
    NeedData,
    UnknownCommand,
    ack_set_of,
    crc32c_of,
    decode_batch,
    encode_batch,
    encode_command,
    encode_message_frame,
    encode_send_receipt,
    make_payload,
    unacked_indexes,
)
from mop.protocols.pulsar.metadata import (
    BatchEntry,
    KeyValue,
    MessageIdData,
    MessageMetadata,
    SingleMessageMetadata,
)

META = MessageMetadata(
    producer_name="p",
    sequence_id=1,
    publish_time=1_700_000_000_000,
    properties=(KeyValue(key="k", value="v"),),
)


def decode_all(data: bytes, decoder: FrameDecoder | None = None) -> list[Frame]:
    decoder = decoder or FrameDecoder()
    decoder.feed(data)
    frames: list[Frame] = []
    while not isinstance(frame := decoder.next_frame(), NeedData):
        frames.append(frame)
    return frames


def test_crc32c_check_value() -> None:
    assert crc32c_of(b"123456789") == 0xE3069283  # the CRC-32C (Castagnoli) check value


def test_ping_vector() -> None:
    # type=18 (field 1), then field 18 (tag 0x92 0x01) holding an empty CommandPing.
    frame = bytes.fromhex("00000009000000050812920100")
    assert encode_command(Ping()) == frame
    assert decode_all(frame) == [Ping()]


def test_ping_without_its_empty_sub_message_decodes() -> None:
    assert decode_all(bytes.fromhex("00000006000000020812")) == [Ping()]


def test_flow_vector() -> None:
    # FLOW = 11: field 11 has tag 0x5a; consumer_id 0, permits 1000 (0xe8 0x07).
    frame = bytes.fromhex("0000000d00000009080b5a05080010e807")
    assert encode_command(Flow(consumer_id=0, message_permits=1000)) == frame
    assert decode_all(frame) == [Flow(consumer_id=0, message_permits=1000)]


def test_connected_vector() -> None:
    connected = Connected(server_version="mop", protocol_version=20, max_message_size=5242880)
    body = "08031a0c0a03" + b"mop".hex() + "1014188080c002"
    assert encode_command(connected).hex() == f"{len(body) // 2 + 4:08x}{len(body) // 2:08x}{body}"


def test_auth_challenge_vector() -> None:
    # AUTH_CHALLENGE = 36 (0x24): field 36 has tag 0xa2 0x02; challenge (2) holds AuthData
    # {method (1) "token", data (2) "PulsarAuthRefresh"}, then protocol_version (3) 20.
    data = b"PulsarAuthRefresh"
    auth_data = "0a05" + b"token".hex() + f"12{len(data):02x}" + data.hex()
    body = f"12{len(auth_data) // 2:02x}{auth_data}1814"
    command = f"0824a202{len(body) // 2:02x}{body}"
    frame = bytes.fromhex(f"{len(command) // 2 + 4:08x}{len(command) // 2:08x}{command}")
    challenge = AuthChallenge(
        challenge=AuthData(auth_method_name="token", auth_data=data), protocol_version=20
    )
    assert encode_command(challenge) == frame
    assert decode_all(frame) == [challenge]


def test_auth_response_vector() -> None:
    # AUTH_RESPONSE = 37 (0x25): field 37 has tag 0xaa 0x02; client_version (1) "c",
    # response (2) AuthData {method (1) "token", data (2) "t.k.n"}, protocol_version (3) 21.
    auth_data = "0a05" + b"token".hex() + "1205" + b"t.k.n".hex()
    body = "0a0163" + f"12{len(auth_data) // 2:02x}{auth_data}1815"
    command = f"0825aa02{len(body) // 2:02x}{body}"
    frame = bytes.fromhex(f"{len(command) // 2 + 4:08x}{len(command) // 2:08x}{command}")
    response = AuthResponse(
        client_version="c",
        response=AuthData(auth_method_name="token", auth_data=b"t.k.n"),
        protocol_version=21,
    )
    assert encode_command(response) == frame
    assert decode_all(frame) == [response]
    # Every field is optional: an empty answer decodes too (the handler refuses it).
    assert decode_all(bytes.fromhex("00000009000000050825aa0200")) == [AuthResponse()]


def test_send_vector_with_checksum() -> None:
    metadata = bytes.fromhex("0a017010011802")  # producer_name "p", sequence 1, time 2
    raw = struct.pack(">I", len(metadata)) + metadata + b"hi"
    command = bytes.fromhex("0806320408011001")  # SEND {producer_id 1, sequence_id 1}
    frame = (
        struct.pack(">II", 4 + len(command) + 6 + len(raw), len(command))
        + command
        + b"\x0e\x01"
        + struct.pack(">I", crc32c_of(raw))
        + raw
    )
    [send] = decode_all(frame)
    assert isinstance(send, Send)
    assert (send.producer_id, send.sequence_id) == (1, 1)
    assert send.payload is not None
    assert send.payload.data == b"hi"
    assert send.payload.raw == raw
    assert send.payload.checksum == crc32c_of(raw)
    assert send.payload.metadata == MessageMetadata(
        producer_name="p", sequence_id=1, publish_time=2
    )
    assert encode_command(send) == frame


def test_payload_without_checksum_is_accepted() -> None:
    # Clients below protocol v6 send no magic/crc block: metaSize follows the command directly.
    payload = make_payload(META, b"data")
    command = bytes.fromhex("0806320408011001")
    frame = struct.pack(">II", 4 + len(command) + len(payload.raw), len(command))
    [send] = decode_all(frame + command + payload.raw)
    assert isinstance(send, Send)
    assert send.payload == payload


def test_checksum_mismatch_is_reported_and_the_stream_goes_on() -> None:
    frame = bytearray(
        encode_command(Send(producer_id=4, sequence_id=9, payload=make_payload(META, b"payload")))
    )
    frame[-1] ^= 0x01  # one flipped payload bit
    decoder = FrameDecoder()
    [mismatch, ping] = decode_all(bytes(frame) + encode_command(Ping()), decoder)
    assert isinstance(mismatch, ChecksumMismatch)
    assert mismatch.command == Send(producer_id=4, sequence_id=9)
    assert mismatch.received != mismatch.computed
    assert ping == Ping()


def test_corrupt_metadata_is_a_checksum_mismatch_too() -> None:
    payload = make_payload(META, b"payload")
    frame = bytearray(encode_command(Send(producer_id=4, sequence_id=9, payload=payload)))
    frame[len(frame) - len(payload.raw) + 4] = 0xFF  # the first metadata byte: no valid tag
    [mismatch] = decode_all(bytes(frame))
    assert isinstance(mismatch, ChecksumMismatch)
    # Without a checksum the same bytes cannot be parsed at all.
    command_size = struct.unpack_from(">I", frame, 4)[0]
    body = frame[4 : 8 + command_size] + frame[8 + command_size + 6 :]
    with pytest.raises(MalformedFrame):
        decode_all(struct.pack(">I", len(body)) + body)


def test_message_with_broker_entry_metadata() -> None:
    payload = make_payload(META, b"x")
    plain = encode_message_frame(2, 3, 4, payload.raw, payload.checksum)
    cmd_size = struct.unpack_from(">I", plain, 4)[0]
    entry_metadata = b"\x0e\x02" + struct.pack(">I", 3) + b"\x08\x01\x10"
    body = plain[4 : 8 + cmd_size] + entry_metadata + plain[8 + cmd_size :]
    [message] = decode_all(struct.pack(">I", len(body)) + body)
    assert isinstance(message, Message)
    assert message.payload == payload


def test_fast_paths_match_the_generic_encoder() -> None:
    payload = make_payload(META, b"body")
    for redelivery, ack_set in [(0, ()), (3, (1018,)), (1, (-1, 5))]:
        generic = encode_command(
            Message(
                consumer_id=7,
                message_id=MessageIdData(ledger_id=1 << 40, entry_id=300),
                redelivery_count=redelivery,
                ack_set=ack_set,
                payload=payload,
            )
        )
        fast = encode_message_frame(
            7, 1 << 40, 300, payload.raw, redelivery_count=redelivery, ack_set=ack_set
        )
        assert fast == generic
    receipt = SendReceipt(
        producer_id=1,
        sequence_id=2,
        message_id=MessageIdData(ledger_id=3, entry_id=4),
        highest_sequence_id=9,
    )
    assert encode_send_receipt(1, 2, 3, 4, 9) == encode_command(receipt)


def test_every_strict_prefix_needs_more_data() -> None:
    stream = b"".join(
        [
            encode_command(Ping()),
            encode_command(Send(producer_id=1, sequence_id=2, payload=make_payload(META, b"abc"))),
            encode_command(Success(request_id=5)),
        ]
    )
    expected = decode_all(stream)
    assert len(expected) == 3
    for cut in range(len(stream)):
        decoder = FrameDecoder()
        decoder.feed(stream[:cut])
        got = []
        while (frame := decoder.next_frame()) is not NEED_DATA:
            got.append(frame)
        assert got == expected[: len(got)]
        decoder.feed(stream[cut:])
        while (frame := decoder.next_frame()) is not NEED_DATA:
            got.append(frame)
        assert got == expected
        assert decoder.buffered == 0


def test_byte_by_byte_feeding() -> None:
    stream = encode_command(Flow(consumer_id=1, message_permits=5)) * 3
    decoder = FrameDecoder()
    frames = []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        while (frame := decoder.next_frame()) is not NEED_DATA:
            frames.append(frame)
    assert frames == [Flow(consumer_id=1, message_permits=5)] * 3


def test_oversize_frame_is_refused_from_its_length() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    decoder.feed(struct.pack(">I", 1021))  # 1025 bytes with the length prefix
    with pytest.raises(FrameTooLarge) as info:
        decoder.next_frame()
    assert info.value.server_error is ServerError.NotAllowedError
    # The decoder stays failed.
    decoder.feed(encode_command(Ping()))
    with pytest.raises(FrameTooLarge):
        decoder.next_frame()
    exact = FrameDecoder(max_frame_size=len(encode_command(Ping())))
    assert decode_all(encode_command(Ping()), exact) == [Ping()]


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        ("000000020000", "no command size"),
        ("00000006000000090812", "overruns its frame"),
        ("0000000700000003920100", "without a type"),
        ("0000000a000000050812920100ff", "after a PING"),
        ("000000080000000408063200", "without metadata"),
        ("0000000e00000004080632000e0100000000", "without a metadata size"),
        ("000000080000000408120b00", "wire type 3"),
        ("00000008000000040d010812", "wire type 5"),
    ],
)
def test_malformed_frames(frame: str, match: str) -> None:
    decoder = FrameDecoder()
    decoder.feed(bytes.fromhex(frame))
    with pytest.raises(MalformedFrame, match=match):
        decoder.next_frame()


def test_required_field_missing_in_a_command() -> None:
    with pytest.raises(MalformedFrame, match="message_permits"):
        decode_all(bytes.fromhex("0000000a00000006080b5a020800"))


def test_unknown_command_type_is_an_event() -> None:
    # Type 50 (a transaction command) with some body: framed fine, just not implemented.
    assert decode_all(bytes.fromhex("0000000b0000000708329203020801")) == [UnknownCommand(50)]


def test_send_without_payload_is_our_mistake() -> None:
    with pytest.raises(LocalProtocolError, match="SEND needs a payload"):
        encode_command(Send(producer_id=1, sequence_id=1))


def test_batch_round_trip() -> None:
    entries = [
        BatchEntry(
            SingleMessageMetadata(
                payload_size=len(data), sequence_id=i, properties=(KeyValue(key="i", value=str(i)),)
            ),
            data,
        )
        for i, data in enumerate([b"a", b"", b"ccc" * 100])
    ]
    data = encode_batch(entries)
    assert decode_batch(data, 3) == entries
    with pytest.raises(MalformedFrame):
        decode_batch(data, 4)
    with pytest.raises(MalformedFrame):
        decode_batch(data, 2)
    with pytest.raises(MalformedFrame):
        decode_batch(data[:-1], 3)
    with pytest.raises(LocalProtocolError, match="payload_size"):
        encode_batch([BatchEntry(SingleMessageMetadata(payload_size=2), b"x")])


def test_batch_with_a_null_value_and_zero_entries() -> None:
    entry = BatchEntry(SingleMessageMetadata(payload_size=0, null_value=True), b"")
    assert decode_batch(encode_batch([entry]), 1) == [entry]
    assert decode_batch(b"", 0) == []


def test_ack_sets() -> None:
    # Reference §12.12: acking indexes 0 and 2 of a 10-message batch leaves ack_set [1018].
    assert ack_set_of(i for i in range(10) if i not in (0, 2)) == (1018,)
    assert unacked_indexes((1018,), 10) == [1, 3, 4, 5, 6, 7, 8, 9]
    # Index 63 sets the sign bit of the first word (Java longs are signed).
    assert ack_set_of([63, 64]) == (-(1 << 63), 1)
    assert unacked_indexes((-(1 << 63), 1), 100) == [63, 64]
    assert ack_set_of([]) == ()
    with pytest.raises(LocalProtocolError):
        ack_set_of([-1])


def test_errors_carry_their_answer() -> None:
    error = MalformedFrame("bad")
    assert isinstance(error, RemoteProtocolError)
    assert error.server_error is ServerError.UnknownError
    assert "UnknownError" in repr(error)
    assert RemoteProtocolError("x", server_error=ServerError.ChecksumError).server_error is (
        ServerError.ChecksumError
    )
