"""The on-disk record format of the durable log: framing with a CRC32, segment headers, and the
encoding of each record type. Pure functions over bytes; no files, no trio.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum, unique
from functools import partial
from itertools import chain
from typing import TypeAlias

from mop.broker.storage.api import CursorState
from mop.broker.storage.ranges import IdRanges
from mop.message import Message, MessageId, PackedBatch

__all__ = [
    "FRAME",
    "HEADER_SIZE",
    "MAX_RECORD",
    "MESSAGE_KEY",
    "MESSAGE_MIN",
    "CursorRecord",
    "EpochRecord",
    "Kind",
    "Record",
    "Scanner",
    "SegmentHeader",
    "TableRecord",
    "TopicDeleteRecord",
    "TopicRecord",
    "TrimRecord",
    "VoidRecord",
    "decode_message",
    "decode_record",
    "encode_cursor",
    "encode_epoch",
    "encode_message",
    "encode_table",
    "encode_topic",
    "encode_topic_delete",
    "encode_trim",
    "frame",
    "frame_messages",
    "framed_void",
    "message_key",
]

# The log is a sequence of segment files named after the log position of their first byte. Each
# starts with a header (magic, version, base position, epoch, CRC32) and holds records framed as
# u32 body length, u32 CRC32 (zlib.crc32) of the body, body; all integers little-endian. The first
# body byte is the record `Kind`; strings and blobs are u32 length + bytes, an id is u64 ledger +
# u64 entry (ledger 2**64-1 for "none"). Message records carry ledger, entry and append time, and
# their topic is bound through the topic record that declares the ledger.
FRAME = struct.Struct("<II")
# A length above this cannot come from the encoder, so recovery treats it as corruption.
MAX_RECORD = 1 << 30

_MAGIC = b"MOPLOG"
_VERSION = 1
# magic, version, segment base position, epoch, CRC32 of the preceding fields
_HEADER = struct.Struct("<6sHQQI")
HEADER_SIZE = _HEADER.size


@unique  # two kinds with one number would decode as one another
class Kind(IntEnum):
    MESSAGE = 1
    TOPIC = 2
    TRIM = 3
    TOPIC_DELETE = 4
    CURSOR = 5
    CURSOR_DELETE = 6
    TABLE_PUT = 7
    TABLE_DELETE = 8
    EPOCH = 9
    # A cursor whose individually acknowledged ids are runs (`CURSOR` lists every id; it is
    # still read, from logs written before runs, and no longer written).
    CURSOR_RUNS = 10
    VOID = 11  # the place of messages whose write was refused: read past, never replayed


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    base: int
    epoch: int

    def encode(self) -> bytes:
        head = _HEADER.pack(_MAGIC, _VERSION, self.base, self.epoch, 0)[:-4]
        return head + struct.pack("<I", zlib.crc32(head))

    @classmethod
    def decode(cls, data: bytes | memoryview) -> SegmentHeader | None:
        """The header at the start of `data`, or None if it is missing, torn or foreign."""
        if len(data) < HEADER_SIZE:
            return None
        magic, version, base, epoch, crc = _HEADER.unpack_from(data)
        if magic != _MAGIC or version != _VERSION:
            return None
        if zlib.crc32(bytes(data[: HEADER_SIZE - 4])) != crc:
            return None
        return cls(base, epoch)


def frame(body: bytes) -> bytes:
    return FRAME.pack(len(body), zlib.crc32(body)) + body


# -- strings and ids ---------------------------------------------------------------------------

_U32 = struct.Struct("<I")
_ID = struct.Struct("<QQ")
_NO_ID = 0xFFFFFFFFFFFFFFFF  # ledger value that stands for "no id"
_NO_KEY = 0xFFFFFFFF  # key length that stands for "no key"


def _str(text: str) -> bytes:
    raw = text.encode()
    return _U32.pack(len(raw)) + raw


def _blob(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def _opt_id(message_id: MessageId | None) -> bytes:
    if message_id is None:
        return _ID.pack(_NO_ID, 0)
    return _ID.pack(message_id.ledger, message_id.entry)


class _Reader:
    """Sequential decoding of one record body; raises ValueError past its end."""

    __slots__ = ("data", "offset")

    def __init__(self, data: bytes | memoryview, offset: int) -> None:
        self.data = data
        self.offset = offset

    def take(self, size: int) -> bytes:
        end = self.offset + size
        if end > len(self.data):
            raise ValueError("record body too short")
        chunk = bytes(self.data[self.offset : end])
        self.offset = end
        return chunk

    def u32(self) -> int:
        value: int = _U32.unpack(self.take(4))[0]
        return value

    def blob(self) -> bytes:
        return self.take(self.u32())

    def str(self) -> str:
        return self.blob().decode()

    def opt_id(self) -> MessageId | None:
        ledger, entry = _ID.unpack(self.take(16))
        return None if ledger == _NO_ID else MessageId(ledger, entry)

    def ids(self) -> list[MessageId]:
        return [MessageId(*_ID.unpack(self.take(16))) for _ in range(self.u32())]


# -- messages ----------------------------------------------------------------------------------

# kind, ledger, entry, append time (ms), publish_time, event_time, expires_at, qos,
# producer length, key length (_NO_KEY: None), property count, payload length
_MESSAGE = struct.Struct("<BQQQqqqBIIII")
MESSAGE_KEY = struct.Struct("<QQQ")  # ledger, entry, append time: what recovery reads
MESSAGE_MIN = _MESSAGE.size
_PAIR = struct.Struct("<II")


def _is_plain(message: Message) -> bool:
    """Whether a message has the common record: no key, properties or later fields (an MQTT
    publish without properties)."""
    return message.key is None and not (
        message.properties
        or message.deliver_at
        or message.wire_format
        or message.wire
        or message.batch
        or message.opaque_count
    )


def _plain_body(
    ledger: int, entry: int, append_ms: int, message: Message, producer: bytes
) -> bytes:
    """The record body of a plain message (`producer` is its name, encoded): the same bytes as
    the general case of `encode_message`, without its list."""
    return (
        _MESSAGE.pack(
            Kind.MESSAGE,
            ledger,
            entry,
            append_ms,
            message.publish_time,
            message.event_time,
            message.expires_at,
            message.qos,
            len(producer),
            _NO_KEY,
            0,
            len(message.payload),
        )
        + producer
        + message.payload
    )


def encode_message(ledger: int, entry: int, append_ms: int, message: Message) -> bytes:
    producer = message.producer.encode()
    if _is_plain(message):
        return _plain_body(ledger, entry, append_ms, message, producer)
    key = b"" if message.key is None else message.key.encode()
    parts = [
        _MESSAGE.pack(
            Kind.MESSAGE,
            ledger,
            entry,
            append_ms,
            message.publish_time,
            message.event_time,
            message.expires_at,
            message.qos,
            len(producer),
            _NO_KEY if message.key is None else len(key),
            len(message.properties),
            len(message.payload),
        ),
        producer,
        key,
    ]
    for name, value in message.properties:
        raw_name, raw_value = name.encode(), value.encode()
        parts += (_PAIR.pack(len(raw_name), len(raw_value)), raw_name, raw_value)
    parts.append(message.payload)
    if (
        message.deliver_at
        or message.wire_format
        or message.wire
        or message.batch
        or message.opaque_count
    ):
        parts.append(_extension(message))
    return b"".join(parts)


def frame_messages(
    ledger: int, first: int, append_ms: int, messages: Sequence[Message]
) -> tuple[bytes, list[int]]:
    """The framed records of messages with consecutive entries from `first`, as one piece of
    log, and the framed size of each: the same bytes as `frame(encode_message(...))` for each
    in turn, with the producer name of a run of plain messages encoded once."""
    frame_pack, crc32 = FRAME.pack, zlib.crc32
    header = FRAME.size
    parts: list[bytes] = []
    sizes: list[int] = []
    producer_name, producer = "", b""
    for entry, message in enumerate(messages, first):
        if not _is_plain(message):
            body = encode_message(ledger, entry, append_ms, message)
            parts += (frame_pack(len(body), crc32(body)), body)
            sizes.append(header + len(body))
            continue
        if message.producer != producer_name:
            producer_name, producer = message.producer, message.producer.encode()
        body = _plain_body(ledger, entry, append_ms, message, producer)
        # One checksum call over the whole body: each call costs more than its bytes.
        parts.append(frame_pack(len(body), crc32(body)))
        parts.append(body)
        sizes.append(header + len(body))
    return b"".join(parts), sizes


# Written after the payload only when a message uses one of the later fields (so records of
# plain messages are unchanged): version, deliver_at, wire format and wire bytes, and the
# messages of a batch, each encoded like a message record of its own. Version 2, for a
# `PackedBatch`, puts its packed format, packed bytes and payload size before the members:
# a read hands the packed bytes on and leaves the members encoded until they are asked for.
# An entry whose messages are packed unreadably (encrypted) has no member records: the count
# has `_OPAQUE` set instead.
_EXTENSION = struct.Struct("<Bq")
_EXTENSION_VERSION = 1
_PACKED_VERSION = 2
_OPAQUE = 1 << 31
_U64 = struct.Struct("<Q")


def _extension(message: Message) -> bytes:
    batch = message.batch
    packed = isinstance(batch, PackedBatch)
    parts = [
        _EXTENSION.pack(_PACKED_VERSION if packed else _EXTENSION_VERSION, message.deliver_at),
        _str(message.wire_format),
        _blob(message.wire),
        _U32.pack(len(batch) or (_OPAQUE | message.opaque_count if message.opaque_count else 0)),
    ]
    if isinstance(batch, PackedBatch):
        parts += (_str(batch.packed_format), _blob(batch.packed), _U64.pack(batch.payload_bytes))
    parts += [_blob(encode_message(0, 0, 0, member)) for member in batch]
    return b"".join(parts)


def _unpack_members(data: bytes, count: int) -> tuple[Message, ...]:
    """The `count` member records `data` holds, one after another."""
    reader = _Reader(data, 0)
    members = tuple(decode_message(reader.blob())[1] for _ in range(count))
    if reader.offset != len(data):
        raise ValueError("trailing bytes after the members of a batch")
    return members


def message_key(body: bytes | memoryview) -> tuple[int, int, int]:
    """(ledger, entry, append time in ms) of an encoded message body."""
    key: tuple[int, int, int] = MESSAGE_KEY.unpack_from(body, 1)
    return key


def decode_message(body: bytes | memoryview) -> tuple[MessageId, Message]:
    (_, ledger, entry, _, publish, event, expires, qos, n_producer, n_key, n_props, n_payload) = (
        _MESSAGE.unpack_from(body)
    )
    reader = _Reader(body, _MESSAGE.size)
    producer = reader.take(n_producer).decode()
    key = None if n_key == _NO_KEY else reader.take(n_key).decode()
    properties = []
    for _ in range(n_props):
        n_name, n_value = _PAIR.unpack(reader.take(_PAIR.size))
        properties.append((reader.take(n_name).decode(), reader.take(n_value).decode()))
    payload = reader.take(n_payload)
    deliver_at, wire_format, wire, opaque_count = 0, "", b"", 0
    batch: Sequence[Message] = ()
    if reader.offset != len(body):
        version, deliver_at = _EXTENSION.unpack(reader.take(_EXTENSION.size))
        if version not in (_EXTENSION_VERSION, _PACKED_VERSION):
            raise ValueError(f"unknown message extension version {version}")
        wire_format = reader.str()
        wire = reader.blob()
        count = reader.u32()
        if count & _OPAQUE:
            opaque_count = count & ~_OPAQUE
        elif version == _PACKED_VERSION:
            packed_format, packed = reader.str(), reader.blob()
            (payload_bytes,) = _U64.unpack(reader.take(_U64.size))
            members = reader.take(len(body) - reader.offset)
            batch = PackedBatch(
                count,
                packed_format,
                packed,
                payload_bytes,
                partial(_unpack_members, members, count),
            )
        else:
            batch = tuple(decode_message(reader.blob())[1] for _ in range(count))
    if reader.offset != len(body):
        raise ValueError("trailing bytes after message")
    message = Message(
        payload=payload,
        properties=tuple(properties),
        key=key,
        producer=producer,
        publish_time=publish,
        event_time=event,
        qos=qos,
        expires_at=expires,
        deliver_at=deliver_at,
        batch=batch,
        wire_format=wire_format,
        wire=wire,
        opaque_count=opaque_count,
    )
    return MessageId(ledger, entry), message


# -- state records -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic's whole state apart from its messages: written when it opens a ledger and
    rewritten forward when the segment holding the previous one is reclaimed."""

    name: str
    ledgers: tuple[int, ...]
    last_id: MessageId | None
    trimmed: MessageId | None


@dataclass(frozen=True, slots=True)
class TrimRecord:
    name: str
    through: MessageId


@dataclass(frozen=True, slots=True)
class TopicDeleteRecord:
    name: str


@dataclass(frozen=True, slots=True)
class CursorRecord:
    topic: str
    subscription: str
    state: CursorState | None  # None: deleted


@dataclass(frozen=True, slots=True)
class TableRecord:
    table: str
    key: str
    value: bytes | None  # None: deleted


@dataclass(frozen=True, slots=True)
class EpochRecord:
    epoch: int


@dataclass(frozen=True, slots=True)
class VoidRecord:
    """Filler that took the place of refused message records, so the records queued after
    them keep their log positions."""


Record: TypeAlias = (
    TopicRecord
    | TrimRecord
    | TopicDeleteRecord
    | CursorRecord
    | TableRecord
    | EpochRecord
    | VoidRecord
)


def encode_topic(record: TopicRecord) -> bytes:
    ledgers = b"".join(struct.pack("<Q", ledger) for ledger in record.ledgers)
    return b"".join(
        (
            bytes((Kind.TOPIC,)),
            _str(record.name),
            _opt_id(record.last_id),
            _opt_id(record.trimmed),
            _U32.pack(len(record.ledgers)),
            ledgers,
        )
    )


def encode_trim(name: str, through: MessageId) -> bytes:
    return bytes((Kind.TRIM,)) + _str(name) + _opt_id(through)


def encode_topic_delete(name: str) -> bytes:
    return bytes((Kind.TOPIC_DELETE,)) + _str(name)


def encode_cursor(topic: str, subscription: str, state: CursorState | None) -> bytes:
    """A `CURSOR_RUNS` record: mark_delete, then u32 run count and per run u64 ledger, first
    and last entry; its size grows with the runs, never with the ids they hold."""
    if state is None:
        return bytes((Kind.CURSOR_DELETE,)) + _str(topic) + _str(subscription)
    runs = state.acked.runs
    return b"".join(
        (
            bytes((Kind.CURSOR_RUNS,)),
            _str(topic),
            _str(subscription),
            _opt_id(state.mark_delete),
            _U32.pack(len(runs)),
            struct.pack(f"<{3 * len(runs)}Q", *chain.from_iterable(runs)),
        )
    )


def encode_table(table: str, key: str, value: bytes | None) -> bytes:
    if value is None:
        return bytes((Kind.TABLE_DELETE,)) + _str(table) + _str(key)
    return bytes((Kind.TABLE_PUT,)) + _str(table) + _str(key) + _blob(value)


def encode_epoch(epoch: int) -> bytes:
    return bytes((Kind.EPOCH,)) + struct.pack("<Q", epoch)


def framed_void(size: int) -> bytes:
    """A framed void record of exactly `size` bytes (at least `FRAME.size + 1`)."""
    body = bytes((Kind.VOID,)) + bytes(size - FRAME.size - 1)
    return FRAME.pack(len(body), zlib.crc32(body)) + body


def _decode_topic(reader: _Reader) -> Record:
    name = reader.str()
    last_id, trimmed = reader.opt_id(), reader.opt_id()
    count = reader.u32()
    ledgers = struct.unpack(f"<{count}Q", reader.take(8 * count))
    return TopicRecord(name, ledgers, last_id, trimmed)


def _decode_trim(reader: _Reader) -> Record:
    name = reader.str()
    through = reader.opt_id()
    if through is None:
        raise ValueError("trim without an id")
    return TrimRecord(name, through)


def _decode_cursor(reader: _Reader) -> Record:
    """The record of logs written before `CURSOR_RUNS`: every acknowledged id listed."""
    topic, subscription = reader.str(), reader.str()
    mark_delete = reader.opt_id()
    return CursorRecord(topic, subscription, CursorState(mark_delete, IdRanges.of(reader.ids())))


def _decode_cursor_runs(reader: _Reader) -> Record:
    topic, subscription = reader.str(), reader.str()
    mark_delete = reader.opt_id()
    count = reader.u32()
    values = struct.unpack(f"<{3 * count}Q", reader.take(24 * count))
    runs = tuple(zip(values[0::3], values[1::3], values[2::3], strict=True))
    return CursorRecord(topic, subscription, CursorState(mark_delete, IdRanges.checked(runs)))


def _decode_topic_delete(reader: _Reader) -> Record:
    return TopicDeleteRecord(reader.str())


def _decode_cursor_delete(reader: _Reader) -> Record:
    return CursorRecord(reader.str(), reader.str(), None)


def _decode_table_put(reader: _Reader) -> Record:
    return TableRecord(reader.str(), reader.str(), reader.blob())


def _decode_table_delete(reader: _Reader) -> Record:
    return TableRecord(reader.str(), reader.str(), None)


def _decode_epoch(reader: _Reader) -> Record:
    epoch: int = struct.unpack("<Q", reader.take(8))[0]
    return EpochRecord(epoch)


def _decode_void(reader: _Reader) -> Record:
    reader.offset = len(reader.data)  # filler: its bytes mean nothing
    return VoidRecord()


_DECODERS: dict[Kind, Callable[[_Reader], Record]] = {
    Kind.TOPIC: _decode_topic,
    Kind.TRIM: _decode_trim,
    Kind.TOPIC_DELETE: _decode_topic_delete,
    Kind.CURSOR: _decode_cursor,
    Kind.CURSOR_RUNS: _decode_cursor_runs,
    Kind.CURSOR_DELETE: _decode_cursor_delete,
    Kind.TABLE_PUT: _decode_table_put,
    Kind.TABLE_DELETE: _decode_table_delete,
    Kind.EPOCH: _decode_epoch,
    Kind.VOID: _decode_void,
}


def decode_record(body: bytes | memoryview) -> Record:
    """Decode any record body but a message; ValueError if it is malformed."""
    try:
        decoder = _DECODERS[Kind(body[0])]
    except (ValueError, KeyError, IndexError):
        raise ValueError("unknown record kind") from None
    reader = _Reader(body, 1)
    try:
        record = decoder(reader)
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None
    if reader.offset != len(body):
        raise ValueError("trailing bytes after record")
    return record


class Scanner:
    """Iterates the records of one segment's bytes from `offset`, verifying each frame.

    Iteration stops at the end of the data or at the first record that is torn or fails its
    checksum; `end` is then the offset just past the last good record and `error` says why it
    stopped early (None at a clean end).
    """

    __slots__ = ("data", "end", "error")

    def __init__(self, data: bytes | memoryview, offset: int = HEADER_SIZE) -> None:
        self.data = memoryview(data)
        self.end = offset
        self.error: str | None = None

    def __iter__(self) -> Iterator[tuple[int, memoryview]]:
        data, offset, limit = self.data, self.end, len(self.data)
        unpack, crc32, header = FRAME.unpack_from, zlib.crc32, FRAME.size
        while offset < limit:
            if limit - offset < header:
                self.error = "torn record header"
                return
            length, crc = unpack(data, offset)
            start = offset + header
            if length == 0 or length > MAX_RECORD or start + length > limit:
                self.error = "bad record length" if length == 0 else "torn record"
                return
            body = data[start : start + length]
            if crc32(body) != crc:
                self.error = "checksum mismatch"
                return
            yield offset, body
            offset = self.end = start + length
