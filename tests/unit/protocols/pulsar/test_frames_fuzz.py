"""Pulsar codec properties: round trips of every command, any chunking, and fuzzing.

Strategies are built from the field tables themselves, so a field added to the schema is covered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import struct
from enum import IntEnum
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mop.protocols.pulsar.codec import FieldSpec, Scalar, is_message
from mop.protocols.pulsar.commands import COMMAND_CLASSES, Command, Message, Send, SendReceipt
from mop.protocols.pulsar.connection import ConnectionLimits, ConnectionState, ServerConnection
from mop.protocols.pulsar.errors import RemoteProtocolError
from mop.protocols.pulsar.frames import (
    NEED_DATA,
    Frame,
    FrameDecoder,
    NeedData,
    decode_batch,
    encode_command,
    encode_message_frame,
    encode_send_receipt,
    make_payload,
)
from mop.protocols.pulsar.metadata import MessageIdData, MessageMetadata, Payload

_SCALARS: dict[Scalar, st.SearchStrategy[Any]] = {
    Scalar.UINT64: st.integers(0, (1 << 64) - 1),
    Scalar.UINT32: st.integers(0, (1 << 32) - 1),
    Scalar.INT64: st.integers(-(1 << 63), (1 << 63) - 1),
    Scalar.INT32: st.integers(-(1 << 31), (1 << 31) - 1),
    Scalar.BOOL: st.booleans(),
    Scalar.STRING: st.text(max_size=8),
    Scalar.BYTES: st.binary(max_size=8),
    Scalar.DOUBLE: st.floats(allow_nan=False),  # NaN is not equal to itself
}


def _kind(kind: Scalar | type) -> st.SearchStrategy[Any]:
    if isinstance(kind, Scalar):
        return _SCALARS[kind]
    if issubclass(kind, IntEnum):
        return st.sampled_from(list(kind))
    return messages(kind)


def messages(cls: type) -> st.SearchStrategy[Any]:
    """Any instance of the @message class `cls`, drawn from its field table."""
    assert is_message(cls)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in dataclasses.fields(cls):
        spec: FieldSpec | None = field.metadata.get("pb")
        if spec is None:
            continue
        value = _kind(spec.kind)
        if spec.repeated:
            value = st.lists(value, max_size=3).map(tuple)
        elif field.default is None:
            value = st.none() | value
        fields[field.name] = value
    return st.builds(cls, **fields)


payloads = st.builds(make_payload, messages(MessageMetadata), st.binary(max_size=64))


def commands() -> st.SearchStrategy[Command]:
    def with_payload(cls: type[Send] | type[Message]) -> st.SearchStrategy[Command]:
        return st.tuples(messages(cls), payloads).map(
            lambda pair: dataclasses.replace(pair[0], payload=pair[1])
        )

    return st.one_of(
        [
            with_payload(cls) if cls is Send or cls is Message else messages(cls)
            for cls in COMMAND_CLASSES.values()
        ]
    )


def drain(decoder: FrameDecoder) -> list[Frame]:
    frames = []
    while not isinstance(frame := decoder.next_frame(), NeedData):
        frames.append(frame)
    return frames


@given(commands())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_every_command_round_trips(command: Command) -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_command(command))
    assert drain(decoder) == [command]
    assert decoder.buffered == 0


@given(st.lists(commands(), min_size=1, max_size=5), st.data())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_any_chunking_gives_the_same_frames(cmds: list[Command], data: st.DataObject) -> None:
    stream = b"".join(encode_command(c) for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = FrameDecoder()
    frames = []
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoder.feed(stream[start:stop])
        frames += drain(decoder)
    assert frames == cmds


def _only_protocol_errors(data: bytes, max_frame_size: int = 1 << 20) -> None:
    decoder = FrameDecoder(max_frame_size=max_frame_size)
    decoder.feed(data)
    with contextlib.suppress(RemoteProtocolError):
        drain(decoder)


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_protocol_errors(data: bytes) -> None:
    _only_protocol_errors(data)


@given(st.binary(max_size=120), st.binary(max_size=120))
def test_random_bodies_raise_only_protocol_errors(command: bytes, rest: bytes) -> None:
    body = struct.pack(">I", len(command)) + command + rest
    _only_protocol_errors(struct.pack(">I", len(body)) + body)


@given(st.sampled_from(sorted(COMMAND_CLASSES)), st.binary(max_size=80), st.binary(max_size=80))
def test_random_command_bodies_raise_only_protocol_errors(
    type_: int, sub: bytes, rest: bytes
) -> None:
    # A valid type and a sub-message field of random bytes reaches each command's field parser.
    base = bytes([0x08, type_]) + bytes([(type_ << 3 | 2) & 0x7F | 0x80, (type_ << 3 | 2) >> 7])
    base += bytes([len(sub)]) + sub
    body = struct.pack(">I", len(base)) + base + rest
    _only_protocol_errors(struct.pack(">I", len(body)) + body)


@given(commands(), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_frames_raise_only_protocol_errors(
    command: Command, edits: list[tuple[int, int]]
) -> None:
    frame = bytearray(encode_command(command))
    for position, value in edits:
        frame[position % len(frame)] = value
    _only_protocol_errors(bytes(frame))


@given(st.binary(max_size=200))
def test_random_bytes_on_a_connection_raise_only_protocol_errors(data: bytes) -> None:
    conn = ServerConnection(ConnectionLimits(max_connect_frame_size=1 << 16))
    conn.receive_data(data)
    with contextlib.suppress(RemoteProtocolError):
        while conn.next_event() is not NEED_DATA:
            if conn.state is ConnectionState.CONNECTING:
                conn.connected()


@given(st.binary(max_size=200), st.integers(0, 5))
def test_random_batches_raise_only_protocol_errors(data: bytes, count: int) -> None:
    with contextlib.suppress(RemoteProtocolError):
        decode_batch(data, count)


@given(
    st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 32) - 1),
    st.lists(_SCALARS[Scalar.INT64], max_size=3),
    payloads,
)
def test_message_fast_path_is_the_generic_encoding(
    consumer_id: int,
    ledger: int,
    entry: int,
    redelivery: int,
    ack_set: list[int],
    payload: Payload,
) -> None:
    generic = encode_command(
        Message(
            consumer_id=consumer_id,
            message_id=MessageIdData(ledger_id=ledger, entry_id=entry),
            redelivery_count=redelivery,
            ack_set=tuple(ack_set),
            payload=payload,
        )
    )
    fast = encode_message_frame(
        consumer_id, ledger, entry, payload.raw, redelivery_count=redelivery, ack_set=ack_set
    )
    assert fast == generic


@given(*[st.integers(0, (1 << 64) - 1)] * 5)
def test_receipt_fast_path_is_the_generic_encoding(
    producer_id: int, sequence_id: int, ledger: int, entry: int, highest: int
) -> None:
    receipt = SendReceipt(
        producer_id=producer_id,
        sequence_id=sequence_id,
        highest_sequence_id=highest,
        message_id=MessageIdData(ledger_id=ledger, entry_id=entry),
    )
    assert encode_send_receipt(producer_id, sequence_id, ledger, entry, highest) == (
        encode_command(receipt)
    )
