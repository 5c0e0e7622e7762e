"""A gRPC call's HTTP/2 headers: the request's checked and read (path, timeout, encoding,
custom metadata), the response's and the trailers' written (the gRPC over HTTP/2 spec).

Pure functions over header lists; `RequestRefused` says how to answer a request that is not
a gRPC call the server can take (an HTTP status and a gRPC status).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from mop.protocols.grpc.framing import ACCEPT_ENCODING, check_encoding
from mop.protocols.grpc.status import GrpcError, StatusCode

__all__ = [
    "Request",
    "RequestRefused",
    "encode_grpc_message",
    "decode_grpc_message",
    "parse_timeout",
    "read_request",
    "response_headers",
    "trailers",
]

Headers = list[tuple[str, str]]

# grpc-timeout: at most 8 digits and a unit.
_TIMEOUT: Final = re.compile(r"([0-9]{1,8})([HMSmun])")
_TIMEOUT_UNITS: Final = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# Headers of the protocol itself, not the call's metadata.
_PROTOCOL_HEADERS: Final = frozenset(
    {"content-type", "te", "user-agent", "content-length", "connection", "host"}
)
# The bytes a grpc-message may carry as they are (printable ASCII but "%").
_UNRESERVED: Final = frozenset(range(0x20, 0x7F)) - {ord("%")}
_CONTENT_TYPE: Final = "application/grpc"


class RequestRefused(Exception):
    """A request the server answers without starting a call: with HTTP `http_status` and, in
    the same (trailers-only) response, `code` and `message`."""

    def __init__(self, code: StatusCode, message: str, http_status: int = 200) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status


@dataclass(frozen=True, slots=True)
class Request:
    """What the server needs of a call's request headers."""

    method: str
    # Seconds the client gives the call (grpc-timeout), None for no deadline.
    timeout: float | None
    # The request messages' grpc-encoding.
    encoding: str
    metadata: tuple[tuple[str, str], ...]


def parse_timeout(value: str) -> float:
    """Seconds from a grpc-timeout value ("100m", "5S"...), or ValueError."""
    match = _TIMEOUT.fullmatch(value)
    if match is None:
        raise ValueError(f"invalid grpc-timeout {value!r}")
    return int(match[1]) * _TIMEOUT_UNITS[match[2]]


def read_request(headers: Iterable[tuple[str, str]]) -> Request:
    """The call a request's headers open, or RequestRefused (415 for a content type that is
    not gRPC's, 405 for a method other than POST, INTERNAL for malformed gRPC headers,
    UNIMPLEMENTED for an unknown message encoding)."""
    pseudo: dict[str, str] = {}
    regular: Headers = []
    for name, value in headers:
        if name.startswith(":"):
            pseudo[name] = value
        else:
            regular.append((name, value))
    if pseudo.get(":method") != "POST":
        raise RequestRefused(StatusCode.INTERNAL, "gRPC calls use POST", http_status=405)
    content_type = _first(regular, "content-type")
    if content_type is None or not _is_grpc(content_type):
        raise RequestRefused(
            StatusCode.INTERNAL,
            f"content-type {content_type!r} is not application/grpc",
            http_status=415,
        )
    if _first(regular, "te") != "trailers":
        raise RequestRefused(StatusCode.INTERNAL, 'a gRPC request needs "te: trailers"')
    timeout_value = _first(regular, "grpc-timeout")
    try:
        timeout = None if timeout_value is None else parse_timeout(timeout_value)
    except ValueError as exc:
        raise RequestRefused(StatusCode.INTERNAL, str(exc)) from None
    try:
        encoding = check_encoding(_first(regular, "grpc-encoding") or "identity")
    except GrpcError as exc:
        raise RequestRefused(exc.code, exc.message) from None
    return Request(
        method=pseudo.get(":path", ""),
        timeout=timeout,
        encoding=encoding,
        metadata=_metadata(regular),
    )


def _is_grpc(content_type: str) -> bool:
    # "application/grpc", "application/grpc+proto", "application/grpc;charset=..."
    return content_type == _CONTENT_TYPE or content_type.startswith(
        (_CONTENT_TYPE + "+", _CONTENT_TYPE + ";")
    )


def _first(headers: Headers, name: str) -> str | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def _metadata(headers: Headers) -> tuple[tuple[str, str], ...]:
    metadata: list[tuple[str, str]] = []
    for name, value in headers:
        if name in _PROTOCOL_HEADERS or name.startswith("grpc-"):
            continue
        if name.endswith("-bin"):
            value = _decode_binary(name, value)
        metadata.append((name, value))
    return tuple(metadata)


def _decode_binary(name: str, value: str) -> str:
    """A binary metadata value: base64, padded or not (both are allowed), as latin-1 text.
    Several values of one key may arrive joined with commas."""
    try:
        parts = [
            base64.b64decode(part + "=" * (-len(part) % 4), validate=True)
            for part in value.replace(" ", "").split(",")
        ]
    except (binascii.Error, ValueError):
        raise RequestRefused(
            StatusCode.INTERNAL, f"metadata {name!r} is not valid base64"
        ) from None
    return ",".join(part.decode("latin-1") for part in parts)


def response_headers() -> Headers:
    """The headers that open a response (before its first message)."""
    return [
        (":status", "200"),
        ("content-type", _CONTENT_TYPE),
        ("grpc-accept-encoding", ACCEPT_ENCODING),
    ]


def trailers(code: StatusCode, message: str = "", *, trailers_only: bool = False) -> Headers:
    """The trailers that end a call; `trailers_only` for a call that ends before its response
    headers, whose single HEADERS frame is both (it starts with the HTTP status)."""
    headers: Headers = response_headers() if trailers_only else []
    headers.append(("grpc-status", str(int(code))))
    if message:
        headers.append(("grpc-message", encode_grpc_message(message)))
    return headers


def refusal_headers(refused: RequestRefused) -> Headers:
    """The single response to a request that opens no call."""
    headers = trailers(refused.code, refused.message, trailers_only=True)
    headers[0] = (":status", str(refused.http_status))
    return headers


def encode_grpc_message(message: str) -> str:
    """`message` as grpc-message carries it: UTF-8, percent-encoded except printable ASCII."""
    return "".join(
        chr(byte) if byte in _UNRESERVED else f"%{byte:02X}"
        for byte in message.encode("utf-8", "replace")
    )


def decode_grpc_message(value: str) -> str:
    """The text of a grpc-message value (a malformed escape is kept as it is, as the spec asks)."""
    out = bytearray()
    raw = value.encode("latin-1", "replace")
    index = 0
    while index < len(raw):
        escape = raw[index + 1 : index + 3]
        if raw[index] == ord("%") and len(escape) == 2 and _is_hex(escape):
            out.append(int(escape, 16))
            index += 3
        else:
            out.append(raw[index])
            index += 1
    return out.decode("utf-8", "replace")


def _is_hex(pair: bytes) -> bool:
    return all(c in b"0123456789abcdefABCDEF" for c in pair)
