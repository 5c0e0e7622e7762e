"""Batch payloads on the fast path: what a client sends and reads per message, without a
dataclass per field.

A producer that batches writes one `SingleMessageMetadata` header per message (`single_header`)
and, once per batch, one SEND frame (`send_frame`). A consumer splits a MESSAGE's batch into its
members with `read_members`. Both give the same bytes and values as the table-driven codec
(`mop.protocols.pulsar.codec`, `frames.encode_batch` / `frames.decode_batch`), which stays the
reference and handles every field; these functions know only the fields a message carries.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

from crc32c import crc32c

from mop.protocols.pulsar.codec import Buffer, read_varint, write_varint
from mop.protocols.pulsar.errors import MalformedFrame

__all__ = ["Columns", "Member", "read_columns", "read_members", "send_frame", "single_header"]

_U32: Final = struct.Struct(">I")
_HEADER: Final = struct.Struct(">II")  # totalSize, commandSize
_CRC_BLOCK: Final = struct.Struct(">HI")
_MAGIC_CRC32C: Final = 0x0E01
_M64: Final = (1 << 64) - 1


def _string(out: bytearray, tag: int, value: str) -> None:
    data = value.encode()
    out.append(tag)
    write_varint(out, len(data))
    out += data


# Consecutive messages mostly carry the same properties: their encoding (by the properties)
# and their decoding (by the bytes) are kept, up to this many of each, then forgotten at once.
_CACHE_SIZE: Final = 4096
_encoded: dict[tuple[tuple[str, str], ...], bytes] = {}
_decoded: dict[bytes, tuple[tuple[str, str], ...]] = {}
# Whole member headers, decoded (properties, routing key, payload size, event time, null value).
_Header = tuple[tuple[tuple[str, str], ...], str | None, int, int, bool]
_headers: dict[bytes, _Header] = {}
# Only short encodings (of properties or headers) are kept, so that the caches stay small
# whatever the properties: 4096 of messages' size would be gigabytes.
_CACHED_BYTES: Final = 256


def _encode_properties(properties: tuple[tuple[str, str], ...]) -> bytes:
    out = bytearray()
    for name, value in properties:
        pair = bytearray()
        _string(pair, 0x0A, name)
        _string(pair, 0x12, value)
        out.append(0x0A)
        write_varint(out, len(pair))
        out += pair
    return bytes(out)


def single_header(
    properties: tuple[tuple[str, str], ...],
    partition_key: str | None,
    payload_size: int,
    event_time: int,
) -> bytes:
    """`metaSize | SingleMessageMetadata` of one batch member (fields 1, 2, 3 and 5)."""
    encoded = _encoded.get(properties)
    if encoded is None:
        encoded = _encode_properties(properties)
        if len(encoded) <= _CACHED_BYTES:
            if len(_encoded) >= _CACHE_SIZE:
                _encoded.clear()
            _encoded[properties] = encoded
    out = bytearray(encoded)
    if partition_key is not None:
        _string(out, 0x12, partition_key)
    out.append(0x18)
    write_varint(out, payload_size)
    if event_time:
        out.append(0x28)
        write_varint(out, event_time)
    return _U32.pack(len(out)) + out


def send_frame(
    producer_id: int,
    sequence_id: int,
    producer_name: str,
    publish_time: int,
    parts: Sequence[bytes],
    count: int,
) -> bytes:
    """The SEND frame of a batch of `count` messages: `parts` are the `single_header` and the
    payload of each, in order; their sequence ids run from `sequence_id` to
    `sequence_id + count - 1`."""
    highest = sequence_id + count - 1
    meta = bytearray()
    _string(meta, 0x0A, producer_name)
    meta.append(0x10)
    write_varint(meta, sequence_id)
    meta.append(0x18)
    write_varint(meta, publish_time)
    meta.append(0x58)  # num_messages_in_batch (11)
    write_varint(meta, count)
    if count > 1:
        meta += b"\xc0\x01"  # highest_sequence_id (24)
        write_varint(meta, highest)
    raw = b"".join((_U32.pack(len(meta)), meta, *parts))
    body = bytearray(b"\x08")
    write_varint(body, producer_id)
    body.append(0x10)
    write_varint(body, sequence_id)
    body.append(0x18)
    write_varint(body, count)
    if count > 1:
        body.append(0x30)
        write_varint(body, highest)
    base = bytearray(b"\x08\x06\x32")  # type SEND, then field 6 (length-delimited)
    write_varint(base, len(body))
    base += body
    return b"".join(
        (
            _HEADER.pack(4 + len(base) + 6 + len(raw), len(base)),
            base,
            _CRC_BLOCK.pack(_MAGIC_CRC32C, crc32c(raw)),
            raw,
        )
    )


class Member(NamedTuple):
    """One message of a batch as a consumer needs it."""

    payload: bytes
    properties: tuple[tuple[str, str], ...]
    partition_key: str | None  # the ordering key when there is one (Key_Shared hashes it)
    event_time: int
    null_value: bool
    header: bytes  # its SingleMessageMetadata as sent (what a broker forwards)


def _text(buf: Buffer, pos: int, end: int) -> tuple[str, int]:
    length, pos = read_varint(buf, pos, end)
    stop = pos + length
    if stop > end:
        raise MalformedFrame("string overruns its message")
    try:
        return bytes(buf[pos:stop]).decode(), stop
    except UnicodeDecodeError:
        raise MalformedFrame("string is not UTF-8") from None


def _pair(buf: Buffer, pos: int, end: int) -> tuple[str, str]:
    key = value = ""
    while pos < end:
        tag, pos = read_varint(buf, pos, end)
        if tag == 0x0A:
            key, pos = _text(buf, pos, end)
        elif tag == 0x12:
            value, pos = _text(buf, pos, end)
        else:
            pos = _skip(buf, pos, end, tag)
    return key, value


def _skip(buf: Buffer, pos: int, end: int, tag: int) -> int:
    wire = tag & 7
    if wire == 0:
        return read_varint(buf, pos, end)[1]
    if wire == 2:
        length, pos = read_varint(buf, pos, end)
        pos += length
    elif wire == 1:
        pos += 8
    elif wire == 5:
        pos += 4
    else:
        raise MalformedFrame(f"wire type {wire} in a batch header")
    if pos > end:
        raise MalformedFrame("field overruns a batch header")
    return pos


def _properties(data: Buffer, pos: int, end: int) -> tuple[int, tuple[tuple[str, str], ...]]:
    """The run of properties (field 1) that starts at `pos` (its first tag), and where it
    ends: decoded once per distinct run of bytes."""
    start = pos
    while pos < end and data[pos] == 0x0A:
        length, pos = read_varint(data, pos + 1, end)
        pos += length
    if pos > end:
        raise MalformedFrame("property overruns a batch header")
    raw = bytes(data[start:pos])
    known = _decoded.get(raw)
    if known is None:
        pairs = []
        at = 1
        while at < len(raw):
            length, at = read_varint(raw, at, len(raw))
            pairs.append(_pair(raw, at, at + length))
            at += length + 1
        known = tuple(pairs)
        if len(raw) <= _CACHED_BYTES:
            if len(_decoded) >= _CACHE_SIZE:
                _decoded.clear()
            _decoded[raw] = known
    return pos, known


def read_members(data: Buffer, count: int) -> list[Member]:
    """The `count` messages of an uncompressed batch payload; MalformedFrame when it does not
    parse as exactly that many."""
    data = data if isinstance(data, bytes) else bytes(data)
    return [
        Member(
            b"" if null_value else data[start : start + size],
            properties,
            routing,
            event_time,
            null_value,
            data[at:header_end],
        )
        for at, header_end, start, size, (properties, routing, _, event_time, null_value) in (
            _walk(data, count)
        )
    ]


class Columns(NamedTuple):
    """The messages of a batch, field by field (see `read_columns`)."""

    payloads: list[bytes]
    properties: list[tuple[tuple[str, str], ...]]
    keys: list[str | None]  # the ordering key when there is one, as `Member.partition_key`
    event_times: list[int]


def read_columns(data: bytes, count: int) -> Columns:
    """`read_members` as columns, without an object per message (for readers that build
    columns, e.g. the Spark source); MalformedFrame likewise."""
    payloads: list[bytes] = []
    properties: list[tuple[tuple[str, str], ...]] = []
    keys: list[str | None] = []
    event_times: list[int] = []
    for _, _, start, size, parsed in _walk(data, count):
        payloads.append(b"" if parsed[4] else data[start : start + size])
        properties.append(parsed[0])
        keys.append(parsed[1])
        event_times.append(parsed[3])
    return Columns(payloads, properties, keys, event_times)


def _walk(data: bytes, count: int) -> list[tuple[int, int, int, int, _Header]]:
    """Per message of a batch payload: where its header starts and ends, where its payload
    starts, its payload size, and its header's values."""
    found = []
    pos = 0
    end = len(data)
    # Members of a stream mostly repeat their header (same properties, same size) but for a
    # sequence id at its end: `known` is the last header read, `prefix` its bytes before that.
    known: _Header | None = None
    prefix = b""
    try:
        for _ in range(count):
            (size,) = _U32.unpack_from(data, pos)
            at = pos + 4
            stop = at + size
            if stop > end:
                raise MalformedFrame("batch entry metadata overruns the payload")
            tail = at + len(prefix)
            if (
                known is not None
                and tail + 1 < stop
                and data[tail] == 0x40
                and data.startswith(prefix, at)
                and _one_varint(data, tail + 1, stop)
            ):
                parsed = known
            else:
                parsed, found_prefix = _header_of(data[at:stop])
                known, prefix = (parsed, found_prefix) if found_prefix is not None else (None, b"")
            payload_size = parsed[2]
            pos = stop + payload_size
            if pos > end:
                raise MalformedFrame("batch entry payload overruns the payload")
            found.append((at, stop, stop, payload_size, parsed))
    except struct.error:
        raise MalformedFrame("batch payload ends inside an entry header") from None
    if pos != end:
        raise MalformedFrame(f"{end - pos} bytes after the {count} entries of a batch")
    return found


def _one_varint(data: bytes, start: int, stop: int) -> bool:
    """Whether `data[start:stop]` is exactly one varint (a sequence id: 1 to 3 bytes, mostly)."""
    if data[stop - 1] & 0x80:
        return False
    return all(data[index] & 0x80 for index in range(start, stop - 1))


def _header_of(header: bytes) -> tuple[_Header, bytes | None]:
    """The values of a member header, cached by its bytes and, when its last field is a
    sequence id (clients write fields in order, so the sequence id, field 8, is last unless a
    null value or key follows), by its bytes before that field, which are returned too.

    A prefix is cached (and returned) only once a full parse found that it ends where a final
    sequence id begins, so a header made of that prefix, a sequence id tag and one varint
    parses to the same values."""
    parsed = _headers.get(header)
    prefix = _before_sequence_id(header)
    if parsed is None and prefix is not None:
        parsed = _headers.get(prefix)
        if parsed is not None:
            return parsed, prefix
    if parsed is not None:
        return parsed, prefix if prefix is not None and prefix in _headers else None
    parsed, last_field = _parse_header(header)
    if prefix is not None and last_field != len(prefix):
        prefix = None
    if len(header) <= _CACHED_BYTES:
        if len(_headers) >= _CACHE_SIZE:
            _headers.clear()
        _headers[header] = parsed
        if prefix is not None:
            _headers[prefix] = parsed
    return parsed, prefix


def _before_sequence_id(header: bytes) -> bytes | None:
    """`header` without what looks like a final sequence id field (tag 0x40, then one
    varint up to the end); None when its end does not look like one."""
    at = len(header) - 1
    if at < 1 or header[at] & 0x80:
        return None
    at -= 1
    while at >= 0 and header[at] & 0x80:
        at -= 1
    if at < 0 or header[at] != 0x40:
        return None
    return header[:at]


def _parse_header(header: bytes) -> tuple[_Header, int]:
    """(properties, routing key, payload size, event time, null value) of a member header,
    and where its last field begins."""
    properties: tuple[tuple[str, str], ...] = ()
    key: str | None = None
    ordering: str | None = None
    payload_size = -1
    event_time = 0
    null_value = null_key = False
    pos = last_field = 0
    stop = len(header)
    while pos < stop:
        last_field = pos
        tag, pos = read_varint(header, pos, stop)
        if tag == 0x0A:
            pos, run = _properties(header, pos - 1, stop)
            properties = properties + run if properties else run
        elif tag == 0x12:
            key, pos = _text(header, pos, stop)
        elif tag == 0x18:
            payload_size, pos = read_varint(header, pos, stop)
        elif tag == 0x28:
            event_time, pos = read_varint(header, pos, stop)
        elif tag == 0x3A:
            length, pos = read_varint(header, pos, stop)
            ordering = header[pos : pos + length].decode("utf-8", "surrogateescape")
            pos += length
        elif tag == 0x48:
            flag, pos = read_varint(header, pos, stop)
            null_value = bool(flag)
        elif tag == 0x50:
            flag, pos = read_varint(header, pos, stop)
            null_key = bool(flag)
        else:
            pos = _skip(header, pos, stop, tag)
    if pos != stop:
        raise MalformedFrame("batch entry metadata overruns its size")
    if payload_size < 0:
        raise MalformedFrame("batch entry without a payload size")
    routing = None if null_key else (ordering if ordering is not None else key)
    return (properties, routing, payload_size, event_time & _M64, null_value), last_field
