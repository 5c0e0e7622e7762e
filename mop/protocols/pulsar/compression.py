"""Pulsar payload compression (`MessageMetadata.compression`): one pure function that the
client's consumers and the broker both decompress with.

Pulsar's LZ4 is the raw LZ4 block format (its size comes from `uncompressed_size`), SNAPPY is
raw snappy (not framed), ZSTD is standard zstd frames and ZLIB is zlib's format. cramjam
supplies the first three (one compiled wheel, no system library).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TypeAlias

import cramjam

from mop.protocols.pulsar.errors import PulsarError
from mop.protocols.pulsar.frames import DEFAULT_MAX_MESSAGE_SIZE
from mop.protocols.pulsar.metadata import CompressionType

__all__ = ["UndecodablePayload", "decompress"]

# A codec's `..._into(data, buffer) -> bytes written`.
_Into: TypeAlias = Callable[[bytes, bytearray], int]


class UndecodablePayload(PulsarError):
    """A payload that does not decompress with the codec its metadata names, or that would
    decompress to more than the limit."""


def decompress(
    data: bytes,
    compression: CompressionType,
    uncompressed_size: int | None,
    limit: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> bytes:
    """`data` as the producer wrote it before compressing it with `compression`, if that is at
    most `limit` bytes (and `uncompressed_size` bytes, when announced).

    No codec writes more than that: a producer's announced size or a small bomb must not make
    the broker or a client allocate without bound (a 10 KB zstd payload can hold 300 MB)."""
    if compression is CompressionType.NONE:
        return data
    if uncompressed_size is not None and uncompressed_size > limit:
        raise UndecodablePayload(
            f"{compression.name} payload of {uncompressed_size} bytes, above {limit}"
        )
    # The most the output may hold: the announced size, else the limit.
    room = limit if uncompressed_size is None else uncompressed_size
    try:
        if compression is CompressionType.ZLIB:
            out = _inflate(data, room)
        elif compression is CompressionType.LZ4:
            if uncompressed_size is None:
                raise UndecodablePayload("an LZ4 payload without its uncompressed size")
            out = _into(cramjam.lz4.decompress_block_into, data, room)
        elif compression is CompressionType.ZSTD:
            # One byte more than allowed: a frame that fills it is too large. zstd writes
            # into the buffer and fails when it is full (its own size hint is not trusted).
            out = _into(cramjam.zstd.decompress_into, data, room + 1)
        elif compression is CompressionType.SNAPPY:
            # Raw snappy starts with the size it decompresses to: checked before allocating.
            if cramjam.snappy.decompress_raw_len(data) > room:
                raise UndecodablePayload(f"a SNAPPY payload above {room} bytes")
            out = bytes(cramjam.snappy.decompress_raw(data))
        else:  # a codec number from a newer protocol
            raise UndecodablePayload(f"compression {compression!r} is not supported")
    except (zlib.error, cramjam.DecompressionError) as exc:
        raise UndecodablePayload(f"{compression.name} payload: {exc}") from None
    if len(out) > room:
        raise UndecodablePayload(f"a {compression.name} payload above {room} bytes")
    if uncompressed_size is not None and len(out) != uncompressed_size:
        raise UndecodablePayload(
            f"{compression.name} payload of {len(out)} bytes, {uncompressed_size} announced"
        )
    return out


def _inflate(data: bytes, room: int) -> bytes:
    """A whole zlib stream, up to `room` + 1 bytes of it (one more tells it is too large)."""
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, room + 1)
    if len(out) <= room and not inflater.eof:
        # A stream cut short gives what it has without an error: its end (and checksum) counts.
        raise UndecodablePayload("ZLIB payload: the stream is truncated")
    return out


def _into(codec: _Into, data: bytes, size: int) -> bytes:
    """What `codec` writes into a buffer of `size` bytes (it fails when that is too small)."""
    buffer = bytearray(size)
    written = codec(data, buffer)
    return bytes(buffer) if written == size else bytes(memoryview(buffer)[:written])
