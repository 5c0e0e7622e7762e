"""Pulsar payload compression (`mop.protocols.pulsar.compression`) and how the broker stores a
compressed SEND (`mapping.message_from_payload`): decompressed, batches split."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zlib
from collections.abc import Callable

import cramjam
import pytest

from mop.protocols.pulsar import mapping
from mop.protocols.pulsar.batching import single_header
from mop.protocols.pulsar.codec import decode_message
from mop.protocols.pulsar.compression import UndecodablePayload, decompress
from mop.protocols.pulsar.frames import make_payload
from mop.protocols.pulsar.mapping import message_from_payload
from mop.protocols.pulsar.metadata import CompressionType, MessageMetadata

# The codecs as Pulsar clients write them: LZ4 blocks without a size, raw snappy, zstd frames.
COMPRESSORS: dict[CompressionType, Callable[[bytes], bytes]] = {
    CompressionType.LZ4: lambda data: bytes(cramjam.lz4.compress_block(data, store_size=False)),
    CompressionType.ZLIB: zlib.compress,
    CompressionType.ZSTD: lambda data: bytes(cramjam.zstd.compress(data)),
    CompressionType.SNAPPY: lambda data: bytes(cramjam.snappy.compress_raw(data)),
}
PLAIN = b"the same words again and again, " * 40


@pytest.mark.parametrize("kind", list(COMPRESSORS))
def test_each_codec_gives_back_what_was_compressed(kind: CompressionType) -> None:
    packed = COMPRESSORS[kind](PLAIN)
    assert len(packed) < len(PLAIN)
    assert decompress(packed, kind, len(PLAIN)) == PLAIN
    with pytest.raises(UndecodablePayload, match="announced"):
        decompress(packed, kind, len(PLAIN) + 1)


@pytest.mark.parametrize("kind", list(COMPRESSORS))
def test_nothing_decompresses_to_more_than_the_limit(kind: CompressionType) -> None:
    packed = COMPRESSORS[kind](PLAIN)
    assert decompress(packed, kind, len(PLAIN), limit=len(PLAIN)) == PLAIN
    with pytest.raises(UndecodablePayload, match="above"):
        decompress(packed, kind, len(PLAIN), limit=len(PLAIN) - 1)
    if kind is not CompressionType.LZ4:  # the only codec that needs the size
        assert decompress(packed, kind, None, limit=len(PLAIN)) == PLAIN
        with pytest.raises(UndecodablePayload, match="above"):
            decompress(packed, kind, None, limit=len(PLAIN) - 1)
    with pytest.raises(UndecodablePayload):
        decompress(packed, kind, len(PLAIN) - 1)  # announced smaller than it is


@pytest.mark.parametrize("size", [len(PLAIN), None])
def test_a_truncated_zlib_stream_is_refused(size: int | None) -> None:
    # Without its checksum: zlib gives back every byte, only the end of the stream is missing.
    cut = zlib.compress(PLAIN)[:-4]
    with pytest.raises(UndecodablePayload, match="truncated"):
        decompress(cut, CompressionType.ZLIB, size)


def zstd_zeros(blocks: int) -> bytes:
    """A zstd frame of `blocks` run-length blocks of 128 KiB of zeros each: 4 bytes a block,
    and no content size in its header."""
    frame = bytearray(b"\x28\xb5\x2f\xfd\x00\x38")  # magic; no size; a 128 KiB window
    for i in range(blocks):
        header = (128 * 1024) << 3 | 1 << 1 | (i == blocks - 1)  # size, RLE, last
        frame += header.to_bytes(3, "little") + b"\0"
    return bytes(frame)


@pytest.mark.parametrize("announced", [10, None])
def test_a_zstd_bomb_is_refused_without_being_decompressed(announced: int | None) -> None:
    """9.6 KB that decompress to 300 MB: refused in a process whose address space has room for
    only a fraction of that (it would die trying to decompress it whole)."""
    bomb = zstd_zeros(2400)
    assert len(bomb) < 10_000
    code = textwrap.dedent(
        f"""
        import resource, sys
        from mop.protocols.pulsar.compression import UndecodablePayload, decompress
        from mop.protocols.pulsar.metadata import CompressionType
        bomb = sys.stdin.buffer.read()
        with open("/proc/self/status") as status:
            vm = next(int(line.split()[1]) for line in status if line.startswith("VmSize"))
        cap = vm * 1024 + 100 * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        try:
            decompress(bomb, CompressionType.ZSTD, {announced})
        except UndecodablePayload:
            print("refused")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], input=bomb, capture_output=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, b"refused"), done.stderr[-500:]


@pytest.mark.parametrize("kind", list(COMPRESSORS))
def test_garbage_is_an_undecodable_payload(kind: CompressionType) -> None:
    with pytest.raises(UndecodablePayload):
        decompress(b"\xff" * 64, kind, 1000)


def test_no_compression_is_the_data_itself() -> None:
    assert decompress(PLAIN, CompressionType.NONE, None) is PLAIN


@pytest.mark.parametrize("kind", list(COMPRESSORS))
def test_the_broker_stores_a_compressed_batch_split_and_decompressed(
    kind: CompressionType,
) -> None:
    body = b"".join(
        single_header((("i", str(i)),), None, 2, 0) + f"m{i}".encode() for i in range(3)
    )
    meta = MessageMetadata(
        producer_name="p",
        sequence_id=0,
        publish_time=5,
        num_messages_in_batch=3,
        compression=kind,
        uncompressed_size=len(body),
    )
    message = message_from_payload(make_payload(meta, COMPRESSORS[kind](body)))
    assert [m.payload for m in message.batch] == [b"m0", b"m1", b"m2"]
    assert message.batch[2].properties == (("i", "2"),)
    stored = decode_message(MessageMetadata, message.wire, 0, len(message.wire))
    assert stored.compression is CompressionType.NONE and stored.uncompressed_size is None


def test_the_broker_keeps_what_it_cannot_decompress_as_sent() -> None:
    meta = MessageMetadata(
        producer_name="p",
        sequence_id=0,
        publish_time=5,
        compression=CompressionType.LZ4,
        uncompressed_size=100,
    )
    message = message_from_payload(make_payload(meta, b"\xff" * 20))
    assert message.payload == b"\xff" * 20
    stored = decode_message(MessageMetadata, message.wire, 0, len(message.wire))
    assert stored.compression is CompressionType.LZ4


def test_the_broker_keeps_what_decompresses_above_its_limit_as_sent() -> None:
    """No consumer could take it decompressed in one frame: it is stored as the producer sent
    it, compressed."""
    packed = zlib.compress(PLAIN)
    meta = MessageMetadata(
        producer_name="p",
        sequence_id=0,
        publish_time=5,
        compression=CompressionType.ZLIB,
        uncompressed_size=len(PLAIN),
    )
    payload = make_payload(meta, packed)
    assert message_from_payload(payload, limit=len(PLAIN)).payload == PLAIN
    message = message_from_payload(payload, limit=len(PLAIN) - 1)
    assert message.payload == packed
    stored = decode_message(MessageMetadata, message.wire, 0, len(message.wire))
    assert stored.compression is CompressionType.ZLIB and stored.uncompressed_size == len(PLAIN)


def test_the_broker_does_not_try_to_decompress_a_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk is part of a compressed message, which it announces the whole size of (LZ4
    would allocate that for every chunk): it is stored as sent, without trying."""
    tried: list[CompressionType] = []

    def spy(data: bytes, kind: CompressionType, size: int | None, limit: int) -> bytes:
        tried.append(kind)
        return decompress(data, kind, size, limit)

    monkeypatch.setattr(mapping, "decompress", spy)
    packed = COMPRESSORS[CompressionType.LZ4](PLAIN)
    meta = MessageMetadata(
        producer_name="p",
        sequence_id=0,
        publish_time=5,
        compression=CompressionType.LZ4,
        uncompressed_size=len(PLAIN),
        uuid="p-0",
        num_chunks_from_msg=2,
        total_chunk_msg_size=len(packed),
        chunk_id=0,
    )
    message = message_from_payload(make_payload(meta, packed[:10]))
    assert message.payload == packed[:10] and not tried
    stored = decode_message(MessageMetadata, message.wire, 0, len(message.wire))
    assert stored.compression is CompressionType.LZ4 and stored.chunk_id == 0
