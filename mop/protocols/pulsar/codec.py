"""Protocol Buffers (proto2) wire format for the Pulsar command schema, driven by tables.

`@message` turns a class whose fields are declared with `pb(number, kind)` into a frozen dataclass
and registers the tables that `encode_message` and `decode_message` walk.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from enum import Enum, IntEnum
from typing import Any, Final, TypeVar, dataclass_transform

from mop.protocols.pulsar.errors import LocalProtocolError, MalformedFrame

Buffer = bytes | bytearray
_T = TypeVar("_T")

_M32: Final = (1 << 32) - 1
_M64: Final = (1 << 64) - 1
_WIRE_VARINT: Final = 0
_WIRE_FIXED64: Final = 1
_WIRE_LEN: Final = 2
_WIRE_FIXED32: Final = 5


class Scalar(Enum):
    """The scalar field types the schema uses (enums and messages are given by their class)."""

    UINT64 = "uint64"
    UINT32 = "uint32"
    INT64 = "int64"
    INT32 = "int32"
    BOOL = "bool"
    STRING = "string"
    BYTES = "bytes"
    DOUBLE = "double"


UINT64: Final = Scalar.UINT64
UINT32: Final = Scalar.UINT32
INT64: Final = Scalar.INT64
INT32: Final = Scalar.INT32
BOOL: Final = Scalar.BOOL
STRING: Final = Scalar.STRING
BYTES: Final = Scalar.BYTES
DOUBLE: Final = Scalar.DOUBLE

Kind = Scalar | type


# --- varints -------------------------------------------------------------------------------------


def write_varint(out: bytearray, value: int) -> None:
    """Append `value` as a varint; negative values take ten bytes (two's complement, 64 bits)."""
    if 0 <= value < 0x80:
        out.append(value)
        return
    if value < 0:
        value += 1 << 64
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """Decode the varint at `pos` (which must end before `end`); returns (value, next pos)."""
    if pos >= end:
        raise MalformedFrame("truncated varint")
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise MalformedFrame("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise MalformedFrame("varint longer than 10 bytes")


def _read_length(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """Read a length prefix; returns (start, stop) of the bytes it announces."""
    if pos < end and buf[pos] < 0x80:
        size = buf[pos]
        pos += 1
    else:
        size, pos = read_varint(buf, pos, end)
    stop = pos + size
    if stop > end:
        raise MalformedFrame(f"length-delimited field of {size} bytes overruns its message")
    return pos, stop


# --- per-kind readers and writers ----------------------------------------------------------------

_Reader = Callable[[Buffer, int, int], tuple[Any, int]]
_Writer = Callable[[bytearray, Any], None]

_new: Final = object.__new__
# A reader returns this for an enum value it does not know; proto2 then treats the field as unknown.
_UNKNOWN: Final = object()


# Each reader takes the one-byte varint fast path itself: most values on this path are small.


def _read_uint64(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
    if pos < end and buf[pos] < 0x80:
        return buf[pos], pos + 1
    value, pos = read_varint(buf, pos, end)
    return value & _M64, pos


def _read_uint32(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
    if pos < end and buf[pos] < 0x80:
        return buf[pos], pos + 1
    value, pos = read_varint(buf, pos, end)
    return value & _M32, pos


def _read_int64(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
    if pos < end and buf[pos] < 0x80:
        return buf[pos], pos + 1
    value, pos = read_varint(buf, pos, end)
    value &= _M64
    return (value - (1 << 64) if value >> 63 else value), pos


def _read_int32(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
    if pos < end and buf[pos] < 0x80:
        return buf[pos], pos + 1
    value, pos = read_varint(buf, pos, end)
    value &= _M32
    return (value - (1 << 32) if value >> 31 else value), pos


def _read_bool(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
    if pos < end and buf[pos] < 0x80:
        return buf[pos] != 0, pos + 1
    value, pos = read_varint(buf, pos, end)
    return value != 0, pos


def _read_string(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
    if pos < end and buf[pos] < 0x80:
        start = pos + 1
        stop = start + buf[pos]
        if stop > end:
            raise MalformedFrame("string field overruns its message")
    else:
        start, stop = _read_length(buf, pos, end)
    try:
        return buf[start:stop].decode(), stop
    except UnicodeDecodeError:
        raise MalformedFrame("string field is not valid UTF-8") from None


def _read_bytes(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
    start, stop = _read_length(buf, pos, end)
    return bytes(buf[start:stop]), stop


_DOUBLE: Final = struct.Struct("<d")


def _read_double(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
    stop = pos + 8
    if stop > end:
        raise MalformedFrame("double field overruns its message")
    return _DOUBLE.unpack_from(buf, pos)[0], stop


def _write_double(out: bytearray, value: float) -> None:
    out += _DOUBLE.pack(value)


def _checked_writer(low: int, high: int, name: str) -> _Writer:
    def write(out: bytearray, value: int) -> None:
        if not low <= value <= high:
            raise LocalProtocolError(f"{value!r} is out of range for {name}")
        write_varint(out, value)

    return write


def _write_bool(out: bytearray, value: bool) -> None:
    out.append(1 if value else 0)


def _write_string(out: bytearray, value: str) -> None:
    data = value.encode()
    write_varint(out, len(data))
    out += data


def _write_bytes(out: bytearray, value: bytes) -> None:
    write_varint(out, len(value))
    out += value


_SCALARS: Final[dict[Scalar, tuple[int, _Reader, _Writer]]] = {
    UINT64: (_WIRE_VARINT, _read_uint64, _checked_writer(0, _M64, "uint64")),
    UINT32: (_WIRE_VARINT, _read_uint32, _checked_writer(0, _M32, "uint32")),
    INT64: (_WIRE_VARINT, _read_int64, _checked_writer(-(1 << 63), (1 << 63) - 1, "int64")),
    INT32: (_WIRE_VARINT, _read_int32, _checked_writer(-(1 << 31), (1 << 31) - 1, "int32")),
    BOOL: (_WIRE_VARINT, _read_bool, _write_bool),
    STRING: (_WIRE_LEN, _read_string, _write_string),
    BYTES: (_WIRE_LEN, _read_bytes, _write_bytes),
    DOUBLE: (_WIRE_FIXED64, _read_double, _write_double),
}


def _enum_reader(enum: type[IntEnum]) -> _Reader:
    known = {member.value: member for member in enum}

    def read(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
        value, pos = _read_int32(buf, pos, end)
        return known.get(value, _UNKNOWN), pos

    return read


def _message_reader(cls: type) -> _Reader:
    def read(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
        start, stop = _read_length(buf, pos, end)
        return decode_message(cls, buf, start, stop), stop

    return read


def _message_writer(cls: type) -> _Writer:
    def write(out: bytearray, value: Any) -> None:
        if type(value) is not cls:
            raise LocalProtocolError(f"expected {cls.__name__}, got {type(value).__name__}")
        body = bytearray()
        encode_message(value, body)
        write_varint(out, len(body))
        out += body

    return write


# --- schema tables -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a message: its number, its kind, and how it repeats or defaults."""

    number: int
    kind: Kind
    repeated: bool
    required: bool


# Decoding modes of a tag: a single value, one more element, or a packed run of elements.
_SINGLE: Final = 0
_APPEND: Final = 1
_EXTEND: Final = 2


@dataclasses.dataclass(frozen=True, slots=True)
class _Schema:
    # tag (field number << 3 | wire type) -> (attribute, reader, mode)
    by_tag: dict[int, tuple[str, _Reader, int]]
    # (attribute, tag bytes, writer, default, required, repeated) in field-number order
    encoders: tuple[tuple[str, bytes, _Writer, Any, bool, bool], ...]
    repeated: tuple[str, ...]
    required: frozenset[str]


_SCHEMAS: dict[type, _Schema] = {}


def pb(
    number: int, kind: Kind, *, repeated: bool = False, default: Any = dataclasses.MISSING
) -> Any:
    """Declare a message field: `producer_id: int = pb(1, UINT64)`.

    A field without `default` is proto2 `required`. A repeated field holds a tuple and is declared
    with `default=()`. An optional field equal to its default is not written, which is what a
    proto2 reader reads back for the absent field.
    """
    if repeated and default != ():
        raise TypeError("declare repeated fields with default=()")
    spec = FieldSpec(number, kind, repeated, default is dataclasses.MISSING)
    return dataclasses.field(default=default, metadata={"pb": spec})


def _kind_codec(kind: Kind) -> tuple[int, _Reader, _Writer]:
    if isinstance(kind, Scalar):
        return _SCALARS[kind]
    if issubclass(kind, IntEnum):
        return _WIRE_VARINT, _enum_reader(kind), _checked_writer(-(1 << 31), (1 << 31) - 1, "enum")
    if kind not in _SCHEMAS:
        raise TypeError(f"{kind.__name__} is not a @message class")
    return _WIRE_LEN, _message_reader(kind), _message_writer(kind)


def _tag_bytes(number: int, wire: int) -> bytes:
    out = bytearray()
    write_varint(out, number << 3 | wire)
    return bytes(out)


def _build_schema(cls: type) -> _Schema:
    by_tag: dict[int, tuple[str, _Reader, int]] = {}
    encoders = []
    repeated = []
    specs = [(f, f.metadata["pb"]) for f in dataclasses.fields(cls) if "pb" in f.metadata]
    numbers = [spec.number for _, spec in specs]
    if len(set(numbers)) != len(numbers) or min(numbers, default=1) < 1:
        raise TypeError(f"{cls.__name__} has a repeated or invalid field number: {numbers}")
    for field, spec in sorted(specs, key=lambda item: item[1].number):
        wire, reader, writer = _kind_codec(spec.kind)
        mode = _APPEND if spec.repeated else _SINGLE
        by_tag[spec.number << 3 | wire] = (field.name, reader, mode)
        if spec.repeated:
            repeated.append(field.name)
            if wire == _WIRE_VARINT:
                by_tag[spec.number << 3 | _WIRE_LEN] = (field.name, _packed_reader(reader), _EXTEND)
        tag = _tag_bytes(spec.number, wire)
        encoders.append((field.name, tag, writer, field.default, spec.required, spec.repeated))
    required = frozenset(name for name, _, _, _, is_required, _ in encoders if is_required)
    return _Schema(by_tag, tuple(encoders), tuple(repeated), required)


def _packed_reader(element: _Reader) -> _Reader:
    def read(buf: Buffer, pos: int, end: int) -> tuple[Any, int]:
        start, stop = _read_length(buf, pos, end)
        values = []
        while start < stop:
            value, start = element(buf, start, stop)
            if value is not _UNKNOWN:
                values.append(value)
        return values, stop

    return read


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(pb,))
def message(cls: type[_T]) -> type[_T]:
    """Make `cls` a frozen, keyword-only dataclass encoded as a protobuf message.

    No `__slots__`: the decoder fills an instance's `__dict__` in one step, and absent optional
    fields read their defaults from the class, which makes decoding several times faster.
    """
    made = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    _SCHEMAS[made] = _build_schema(made)
    return made


def is_message(cls: type) -> bool:
    return cls in _SCHEMAS


# --- encoding and decoding -----------------------------------------------------------------------


def encode_message(msg: object, out: bytearray) -> None:
    """Append the fields of `msg` (a @message instance) to `out`."""
    schema = _SCHEMAS.get(type(msg))
    if schema is None:
        raise LocalProtocolError(f"{type(msg).__name__} is not a protobuf message")
    for name, tag, writer, default, required, repeated in schema.encoders:
        value = getattr(msg, name)
        if repeated:
            for item in value:
                out += tag
                writer(out, item)
        elif required:
            if value is None:
                raise LocalProtocolError(f"{type(msg).__name__}.{name} is required")
            out += tag
            writer(out, value)
        elif value is not None and value != default:
            out += tag
            writer(out, value)


def message_bytes(msg: object) -> bytes:
    out = bytearray()
    encode_message(msg, out)
    return bytes(out)


def decode_message(
    cls: type[_T], buf: Buffer, pos: int = 0, end: int | None = None, **extra: Any
) -> _T:
    """Decode `buf[pos:end]` as a `cls` message; `extra` sets attributes that are not on the wire.

    Unknown fields are skipped. Raises MalformedFrame when the bytes do not parse or a required
    field is missing.
    """
    if end is None:
        end = len(buf)
    schema = _SCHEMAS[cls]
    by_tag = schema.by_tag
    values: dict[str, Any] = extra
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = read_varint(buf, pos, end)
        entry = by_tag.get(tag)
        if entry is None:
            pos = _skip_field(buf, pos, end, tag)
            continue
        name, read, mode = entry
        value, pos = read(buf, pos, end)
        if value is _UNKNOWN:
            continue
        if mode == _SINGLE:
            values[name] = value
        elif name in values:
            if mode == _APPEND:
                values[name].append(value)
            else:
                values[name].extend(value)
        else:
            values[name] = [value] if mode == _APPEND else value
    if pos != end:
        raise MalformedFrame(f"{cls.__name__} overruns its length")
    for name in schema.repeated:
        if name in values:
            values[name] = tuple(values[name])
    if not schema.required <= values.keys():
        missing = sorted(schema.required - values.keys())
        raise MalformedFrame(f"{cls.__name__} lacks required field(s) {', '.join(missing)}")
    # The dataclass __init__ would only copy `values` attribute by attribute; fields left out
    # read the class-level defaults.
    msg = _new(cls)
    msg.__dict__.update(values)
    return msg


def _skip_field(buf: Buffer, pos: int, end: int, tag: int) -> int:
    wire = tag & 7
    if tag >> 3 == 0:
        raise MalformedFrame("field number 0")
    if wire == _WIRE_VARINT:
        return read_varint(buf, pos, end)[1]
    if wire == _WIRE_LEN:
        return _read_length(buf, pos, end)[1]
    size = 8 if wire == _WIRE_FIXED64 else 4 if wire == _WIRE_FIXED32 else 0
    if not size:
        raise MalformedFrame(f"unsupported wire type {wire}")
    if pos + size > end:
        raise MalformedFrame("truncated fixed-size field")
    return pos + size


__all__ = [
    "BOOL",
    "BYTES",
    "DOUBLE",
    "INT32",
    "INT64",
    "STRING",
    "UINT32",
    "UINT64",
    "Buffer",
    "FieldSpec",
    "Scalar",
    "decode_message",
    "encode_message",
    "is_message",
    "message",
    "message_bytes",
    "pb",
    "read_varint",
    "write_varint",
]
