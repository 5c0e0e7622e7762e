"""gRPC's length-prefixed messages: a compressed flag byte and a big-endian uint32 length before
each message's bytes, inside the HTTP/2 DATA frames of a call (the gRPC over HTTP/2 spec).

`encode_message` frames one message; `MessageDecoder` takes DATA bytes as they come and gives
back whole messages, decompressed, refusing ones larger than the call's limit before buffering
them. Compression is "identity" or "gzip" (the two every gRPC implementation knows).
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from mop.protocols.grpc.status import GrpcError, StatusCode

__all__ = [
    "ACCEPT_ENCODING",
    "ENCODINGS",
    "PREFIX_SIZE",
    "MessageDecoder",
    "check_encoding",
    "encode_message",
]

PREFIX_SIZE: Final = 5
_PREFIX: Final = struct.Struct(">BI")
# The message encodings this server reads and may write, for `grpc-accept-encoding`.
ENCODINGS: Final = ("identity", "gzip")
ACCEPT_ENCODING: Final = ",".join(ENCODINGS)
# wbits for zlib that reads and writes the gzip container (RFC 1952).
_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS


def check_encoding(name: str) -> str:
    """`name` when the server can read messages compressed with it, else UNIMPLEMENTED (which
    the spec asks for, with the encodings the server accepts)."""
    if name in ENCODINGS:
        return name
    raise GrpcError(
        StatusCode.UNIMPLEMENTED,
        f"message encoding {name!r} is not supported (supported: {ACCEPT_ENCODING})",
    )


def encode_message(message: bytes, *, compress: bool = False) -> bytes:
    """One message with its prefix; `compress` gzips it (the call's `grpc-encoding` must then
    say "gzip")."""
    if compress:
        compressor = zlib.compressobj(wbits=_GZIP_WBITS)
        message = compressor.compress(message) + compressor.flush()
    return _PREFIX.pack(1 if compress else 0, len(message)) + message


class MessageDecoder:
    """The messages of one direction of one call, from its DATA bytes.

    `encoding` is the call's `grpc-encoding` (messages flagged compressed are decompressed with
    it); `max_message_bytes` bounds a message before and after decompression. A message over the
    limit raises RESOURCE_EXHAUSTED as soon as its prefix is read; a compressed flag under
    "identity" or bytes that do not decompress raise INTERNAL (the spec's answer to a peer that
    broke the framing).
    """

    __slots__ = ("_buffer", "_encoding", "_max")

    def __init__(self, max_message_bytes: int, encoding: str = "identity") -> None:
        self._buffer = bytearray()
        self._encoding = check_encoding(encoding)
        self._max = max_message_bytes

    @property
    def buffered(self) -> int:
        """Bytes of a message not complete yet (0 between messages)."""
        return len(self._buffer)

    @property
    def message_size(self) -> int | None:
        """The size, prefix included, of the message not complete yet; None before its
        prefix is complete."""
        if len(self._buffer) < PREFIX_SIZE:
            return None
        length: int = _PREFIX.unpack_from(self._buffer)[1]
        return PREFIX_SIZE + length

    def feed(self, data: bytes) -> list[bytes]:
        """The messages that `data` completes, in order."""
        self._buffer += data
        messages: list[bytes] = []
        while len(self._buffer) >= PREFIX_SIZE:
            flag, length = _PREFIX.unpack_from(self._buffer)
            if length > self._max:
                raise GrpcError(
                    StatusCode.RESOURCE_EXHAUSTED,
                    f"message of {length} bytes is larger than the limit of {self._max} bytes",
                )
            if flag > 1:
                raise GrpcError(StatusCode.INTERNAL, f"invalid compressed flag {flag}")
            end = PREFIX_SIZE + length
            if len(self._buffer) < end:
                break
            payload = bytes(self._buffer[PREFIX_SIZE:end])
            del self._buffer[:end]
            messages.append(self._decompress(payload) if flag else payload)
        return messages

    def _decompress(self, payload: bytes) -> bytes:
        if self._encoding == "identity":
            raise GrpcError(
                StatusCode.INTERNAL, "compressed message on a call without grpc-encoding"
            )
        decompressor = zlib.decompressobj(wbits=_GZIP_WBITS)
        try:
            # At most one byte over the limit: enough to know the message is too large,
            # without inflating a compression bomb.
            message = decompressor.decompress(payload, self._max + 1)
        except zlib.error as exc:
            raise GrpcError(StatusCode.INTERNAL, f"cannot decompress message: {exc}") from None
        if len(message) > self._max:
            raise GrpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"decompressed message is larger than the limit of {self._max} bytes",
            )
        if not decompressor.eof:
            raise GrpcError(StatusCode.INTERNAL, "compressed message is truncated")
        return message
