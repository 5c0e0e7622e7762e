"""Pulsar framing: `[totalSize][commandSize][BaseCommand]`, plus checksummed SEND/MESSAGE payloads.

`FrameDecoder` turns a byte stream into commands one at a time (NEED_DATA until one is complete);
`encode_command` turns a command into a frame. Also batch payloads and batch-index ack sets.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from crc32c import crc32c as _crc32c

from mop.protocols.pulsar.codec import (
    Buffer,
    decode_message,
    encode_message,
    message_bytes,
    read_varint,
    write_varint,
)
from mop.protocols.pulsar.commands import COMMAND_CLASSES, Command, Message, Send
from mop.protocols.pulsar.errors import (
    FrameTooLarge,
    LocalProtocolError,
    MalformedFrame,
    RemoteProtocolError,
)
from mop.protocols.pulsar.metadata import (
    BatchEntry,
    MessageMetadata,
    Payload,
    SingleMessageMetadata,
)
from mop.protocols.receive_buffer import ReceiveBuffer

MAGIC_CRC32C: Final = 0x0E01
MAGIC_BROKER_ENTRY_METADATA: Final = 0x0E02
# What CONNECTED advertises by default, and the slack frames get above it: chunk frames of a
# message at the limit carry a little more (reference §1: the Java broker pads by 10 KiB too).
DEFAULT_MAX_MESSAGE_SIZE: Final = 5 * 1024 * 1024
FRAME_SIZE_PADDING: Final = 10 * 1024

_U32: Final = struct.Struct(">I")
_U16: Final = struct.Struct(">H")
_HEADER: Final = struct.Struct(">II")  # totalSize, commandSize
_CRC_BLOCK: Final = struct.Struct(">HI")  # magic, checksum


def crc32c_of(data: Buffer) -> int:
    """CRC32C (Castagnoli) of `data`: the checksum of a payload frame (hardware accelerated)."""
    return _crc32c(data)


class NeedData:
    """Type of `NEED_DATA`, returned by `FrameDecoder.next_frame` until a frame is complete."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()


@dataclass(frozen=True, slots=True)
class UnknownCommand:
    """A well-framed command of a type mop does not implement (transactions, schemas, ...)."""

    type: int


@dataclass(frozen=True, slots=True)
class ChecksumMismatch:
    """A SEND or MESSAGE whose CRC32C does not cover its metadata and payload.

    The frame was well delimited, so the stream goes on; the broker answers a SEND with SEND_ERROR
    ChecksumError. `command` is the decoded command, without its payload.
    """

    command: Send | Message
    received: int
    computed: int


Frame = Command | UnknownCommand | ChecksumMismatch


# --- decoding ------------------------------------------------------------------------------------


class FrameDecoder(ReceiveBuffer):
    """Incremental decoder: `feed` bytes as they arrive, then call `next_frame` until NEED_DATA.

    A frame above `max_frame_size` bytes (length prefix included) is refused as soon as its length
    is read. Once a RemoteProtocolError is raised the decoder stays failed: every later call raises
    it again, because the stream can no longer be framed.
    """

    __slots__ = ("max_frame_size",)

    def __init__(
        self, *, max_frame_size: int = DEFAULT_MAX_MESSAGE_SIZE + FRAME_SIZE_PADDING
    ) -> None:
        self.max_frame_size = max_frame_size
        super().__init__()

    def next_frame(self) -> Frame | NeedData:
        """Decode and return the next complete frame, or NEED_DATA."""
        if self._error is not None:
            raise self._error
        try:
            return self._next_frame()
        except RemoteProtocolError as exc:
            self._fail(exc)
            raise
        except (IndexError, ValueError, TypeError, OverflowError, struct.error) as exc:
            # Every check is explicit; this keeps the promise that a peer's bytes raise nothing but
            # RemoteProtocolError should one be missing.
            error = MalformedFrame(f"undecodable frame ({type(exc).__name__}: {exc})")
            self._fail(error)
            raise error from None

    def _next_frame(self) -> Frame | NeedData:
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 4:
            return NEED_DATA
        (total,) = _U32.unpack_from(buf, pos)
        if total + 4 > self.max_frame_size:
            raise FrameTooLarge(
                f"frame of {total + 4} bytes exceeds the maximum of {self.max_frame_size}"
            )
        end = pos + 4 + total
        if len(buf) < end:
            return NEED_DATA
        if total < 4:
            raise MalformedFrame(f"frame of {total} bytes has no command size")
        frame = decode_frame(buf, pos + 4, end)
        self._pos = end
        return frame


def decode_frame(buf: Buffer, pos: int, end: int) -> Frame:
    """Decode one frame body (what follows totalSize) held in `buf[pos:end]`."""
    (size,) = _U32.unpack_from(buf, pos)
    start = pos + 4
    stop = start + size
    if stop > end:
        raise MalformedFrame(f"command of {size} bytes overruns its frame of {end - pos}")
    type_, body_start, body_stop = _read_base_command(buf, start, stop)
    cls = COMMAND_CLASSES.get(type_)
    if cls is None:
        return UnknownCommand(type_)
    if cls is Send or cls is Message:
        if stop == end:
            raise MalformedFrame(f"{cls.TYPE.name} without metadata and payload")
        raw, received = _read_checksummed(buf, stop, end, entry_metadata=cls is Message)
        checksum = _crc32c(raw)
        if received is not None and received != checksum:
            # Checked before the metadata is parsed: corrupt metadata is a checksum error too.
            command = decode_message(cls, buf, body_start, body_stop)
            return ChecksumMismatch(command, received, checksum)
        payload = _payload(raw, checksum)
        return decode_message(cls, buf, body_start, body_stop, payload=payload)
    if stop != end:
        raise MalformedFrame(f"{end - stop} bytes after a {cls.TYPE.name} command")
    return decode_message(cls, buf, body_start, body_stop)


def _read_base_command(buf: Buffer, pos: int, end: int) -> tuple[int, int, int]:
    """BaseCommand: field 1 is the type; the field numbered like the type holds the command."""
    type_: int | None = None
    fields: dict[int, tuple[int, int]] = {}
    while pos < end:
        tag, pos = read_varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise MalformedFrame("field number 0 in BaseCommand")
        if wire == 0:
            value, pos = read_varint(buf, pos, end)
            if number == 1:
                type_ = value
        elif wire == 2:
            length, pos = read_varint(buf, pos, end)
            if pos + length > end:
                raise MalformedFrame("BaseCommand field overruns the command")
            fields[number] = (pos, pos + length)
            pos += length
        elif wire in (1, 5) and pos + (8 if wire == 1 else 4) <= end:
            pos += 8 if wire == 1 else 4
        else:
            raise MalformedFrame(f"BaseCommand field with wire type {wire}")
    if type_ is None:
        raise MalformedFrame("BaseCommand without a type")
    body_start, body_stop = fields.get(type_, (end, end))
    return type_, body_start, body_stop


def _read_checksummed(
    buf: Buffer, pos: int, end: int, *, entry_metadata: bool
) -> tuple[bytes, int | None]:
    """Split `[0x0e02 block][0x0e01 crc] raw`; returns raw and the checksum received, if any."""
    if (
        entry_metadata
        and end - pos >= 6
        and _U16.unpack_from(buf, pos)[0] == (MAGIC_BROKER_ENTRY_METADATA)
    ):
        (size,) = _U32.unpack_from(buf, pos + 2)
        pos += 6 + size
    received: int | None = None
    if end - pos >= 6 and _U16.unpack_from(buf, pos)[0] == MAGIC_CRC32C:
        (received,) = _U32.unpack_from(buf, pos + 2)
        pos += 6
    if end - pos < 4:
        raise MalformedFrame("payload section without a metadata size")
    return bytes(buf[pos:end]), received


def _payload(raw: bytes, checksum: int) -> Payload:
    """Parse raw = `metaSize | MessageMetadata | payload`."""
    (meta_size,) = _U32.unpack_from(raw, 0)
    if 4 + meta_size > len(raw):
        raise MalformedFrame(f"metadata of {meta_size} bytes overruns its frame")
    metadata = decode_message(MessageMetadata, raw, 4, 4 + meta_size)
    return Payload(metadata, raw[4 + meta_size :], raw, checksum)


# --- encoding ------------------------------------------------------------------------------------


def _base_prefix(type_: int) -> bytes:
    out = bytearray(b"\x08")
    write_varint(out, type_)
    write_varint(out, type_ << 3 | 2)
    return bytes(out)


# `type` field, then the tag of the field that holds the command: both fixed per type.
_PREFIXES: Final = {type_: _base_prefix(type_) for type_ in COMMAND_CLASSES}


def _base_command(command: Command) -> bytearray:
    body = bytearray()
    encode_message(command, body)
    out = bytearray(_PREFIXES[command.TYPE])
    write_varint(out, len(body))
    out += body
    return out


def encode_command(command: Command) -> bytes:
    """The frame of `command`; SEND and MESSAGE take their `payload` (raw bytes and checksum)."""
    base = _base_command(command)
    if isinstance(command, Send | Message):
        payload = command.payload
        if payload is None:
            raise LocalProtocolError(f"{command.TYPE.name} needs a payload")
        return _payload_frame(base, payload.raw, payload.checksum)
    return _HEADER.pack(4 + len(base), len(base)) + base


def _payload_frame(base: Buffer, raw: Buffer, checksum: int) -> bytes:
    size = len(base)
    return b"".join(
        (
            _HEADER.pack(4 + size + 6 + len(raw), size),
            base,
            _CRC_BLOCK.pack(MAGIC_CRC32C, checksum),
            raw,
        )
    )


def make_payload(metadata: MessageMetadata, data: bytes) -> Payload:
    """A payload for SEND/MESSAGE from its metadata and (already batched/compressed) data."""
    meta = message_bytes(metadata)
    raw = b"".join((_U32.pack(len(meta)), meta, data))
    return Payload(metadata, data, raw, _crc32c(raw))


def encode_message_frame(
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    raw: Buffer,
    checksum: int | None = None,
    *,
    redelivery_count: int = 0,
    ack_set: Iterable[int] = (),
) -> bytes:
    """MESSAGE for a stored entry: the delivery fast path.

    `raw` is the entry as stored (`Payload.raw`: metaSize | metadata | payload) and `checksum` its
    CRC32C when known. Gives the same bytes as `encode_command(Message(...))` for such a message.
    """
    mid = bytearray(b"\x08")
    write_varint(mid, ledger_id)
    mid.append(0x10)
    write_varint(mid, entry_id)
    body = bytearray(b"\x08")
    write_varint(body, consumer_id)
    body.append(0x12)
    write_varint(body, len(mid))
    body += mid
    if redelivery_count:
        body.append(0x18)
        write_varint(body, redelivery_count)
    for word in ack_set:
        body.append(0x20)
        write_varint(body, word)
    base = bytearray(b"\x08\x09\x4a")  # type MESSAGE, then field 9 (length-delimited)
    write_varint(base, len(body))
    base += body
    if checksum is None:
        checksum = _crc32c(raw)
    return _payload_frame(base, raw, checksum)


def encode_send_receipt(
    producer_id: int, sequence_id: int, ledger_id: int, entry_id: int, highest_sequence_id: int = 0
) -> bytes:
    """SEND_RECEIPT for a persisted message: the publish fast path.

    Gives the same bytes as `encode_command(SendReceipt(...))` with a plain (ledger, entry) id.
    """
    mid = bytearray(b"\x08")
    write_varint(mid, ledger_id)
    mid.append(0x10)
    write_varint(mid, entry_id)
    body = bytearray(b"\x08")
    write_varint(body, producer_id)
    body.append(0x10)
    write_varint(body, sequence_id)
    body.append(0x1A)
    write_varint(body, len(mid))
    body += mid
    if highest_sequence_id:
        body.append(0x20)
        write_varint(body, highest_sequence_id)
    base = bytearray(b"\x08\x07\x3a")  # type SEND_RECEIPT, then field 7 (length-delimited)
    write_varint(base, len(body))
    base += body
    return _HEADER.pack(4 + len(base), len(base)) + base


# --- batches -------------------------------------------------------------------------------------


def decode_batch(data: Buffer, count: int) -> list[BatchEntry]:
    """Split an (uncompressed) batch payload of `count` messages into its entries."""
    entries = []
    pos = 0
    end = len(data)
    try:
        for _ in range(count):
            (size,) = _U32.unpack_from(data, pos)
            meta_end = pos + 4 + size
            if meta_end > end:
                raise MalformedFrame("batch entry metadata overruns the payload")
            meta = decode_message(SingleMessageMetadata, data, pos + 4, meta_end)
            pos = meta_end + meta.payload_size
            if meta.payload_size < 0 or pos > end:
                raise MalformedFrame("batch entry payload overruns the payload")
            entries.append(BatchEntry(meta, bytes(data[meta_end:pos])))
    except struct.error:
        raise MalformedFrame("batch payload ends inside an entry header") from None
    if pos != end:
        raise MalformedFrame(f"{end - pos} bytes after the {count} entries of a batch")
    return entries


def encode_batch(entries: Iterable[BatchEntry]) -> bytes:
    """The batch payload for `entries` (each metadata's payload_size must match its payload)."""
    out = bytearray()
    for entry in entries:
        if entry.metadata.payload_size != len(entry.payload):
            raise LocalProtocolError(
                f"payload_size {entry.metadata.payload_size} for a payload of {len(entry.payload)}"
            )
        meta = message_bytes(entry.metadata)
        out += _U32.pack(len(meta))
        out += meta
        out += entry.payload
    return bytes(out)


def ack_set_of(unacked: Iterable[int]) -> tuple[int, ...]:
    """The ack_set words (Java BitSet longs, signed) with a bit set for each unacked batch index."""
    bits = 0
    for index in unacked:
        if index < 0:
            raise LocalProtocolError(f"negative batch index {index}")
        bits |= 1 << index
    words = []
    while bits:
        word = bits & 0xFFFF_FFFF_FFFF_FFFF
        words.append(word - (1 << 64) if word >> 63 else word)
        bits >>= 64
    return tuple(words)


def unacked_indexes(ack_set: Iterable[int], batch_size: int) -> list[int]:
    """The batch indexes below `batch_size` whose bit is set in `ack_set`."""
    bits = 0
    for shift, word in enumerate(ack_set):
        bits |= (word & 0xFFFF_FFFF_FFFF_FFFF) << (64 * shift)
    return [index for index in range(batch_size) if bits >> index & 1]


__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "FRAME_SIZE_PADDING",
    "MAGIC_BROKER_ENTRY_METADATA",
    "MAGIC_CRC32C",
    "NEED_DATA",
    "ChecksumMismatch",
    "Frame",
    "FrameDecoder",
    "NeedData",
    "UnknownCommand",
    "ack_set_of",
    "crc32c_of",
    "decode_batch",
    "decode_frame",
    "encode_batch",
    "encode_command",
    "encode_message_frame",
    "encode_send_receipt",
    "make_payload",
    "unacked_indexes",
]
