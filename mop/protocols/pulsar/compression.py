"""Pulsar payload compression (`MessageMetadata.compression`): one pure function that the
client's consumers and the broker both decompress with.

Pulsar's LZ4 is the raw LZ4 block format (its size comes from `uncompressed_size`), SNAPPY is
raw snappy (not framed), ZSTD is standard zstd frames and ZLIB is zlib's format. cramjam
supplies the first three (one compiled wheel, no system library).
"""

from __future__ import annotations

import zlib
from typing import Final

import cramjam

from mop.protocols.pulsar.errors import PulsarError
from mop.protocols.pulsar.metadata import CompressionType

__all__ = ["MAX_UNCOMPRESSED_SIZE", "UndecodablePayload", "decompress"]

# The most a payload may decompress to: a producer's announced size or a small bomb must not
# make the broker or a client allocate without bound.
MAX_UNCOMPRESSED_SIZE: Final = 64 * 1024 * 1024


class UndecodablePayload(PulsarError):
    """A payload that does not decompress with the codec its metadata names."""


def decompress(data: bytes, compression: CompressionType, uncompressed_size: int | None) -> bytes:
    """`data` as the producer wrote it before compressing it with `compression`."""
    if compression is CompressionType.NONE:
        return data
    if uncompressed_size is not None and uncompressed_size > MAX_UNCOMPRESSED_SIZE:
        raise UndecodablePayload(f"{compression.name} payload of {uncompressed_size} bytes")
    try:
        if compression is CompressionType.ZLIB:
            inflater = zlib.decompressobj()
            out = inflater.decompress(data, MAX_UNCOMPRESSED_SIZE + 1)
        elif compression is CompressionType.LZ4:
            if uncompressed_size is None:
                raise UndecodablePayload("an LZ4 payload without its uncompressed size")
            # Into a buffer of the announced size: the count written tells a short block.
            buffer = bytearray(uncompressed_size)
            written = cramjam.lz4.decompress_block_into(data, buffer)
            out = bytes(buffer) if written == uncompressed_size else bytes(buffer[:written])
        elif compression is CompressionType.ZSTD:
            out = bytes(cramjam.zstd.decompress(data))
        elif compression is CompressionType.SNAPPY:
            if cramjam.snappy.decompress_raw_len(data) > MAX_UNCOMPRESSED_SIZE:
                raise UndecodablePayload("a SNAPPY payload above the size limit")
            out = bytes(cramjam.snappy.decompress_raw(data))
        else:  # a codec number from a newer protocol
            raise UndecodablePayload(f"compression {compression!r} is not supported")
    except (zlib.error, cramjam.DecompressionError) as exc:
        raise UndecodablePayload(f"{compression.name} payload: {exc}") from None
    if len(out) > MAX_UNCOMPRESSED_SIZE:
        raise UndecodablePayload(f"a {compression.name} payload above the size limit")
    if uncompressed_size is not None and len(out) != uncompressed_size:
        raise UndecodablePayload(
            f"{compression.name} payload of {len(out)} bytes, {uncompressed_size} announced"
        )
    return out
