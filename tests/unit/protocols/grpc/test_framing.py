"""gRPC message framing: the 5-byte prefix, gzip, the size limit, fed in any pieces."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mop.protocols.grpc.framing import PREFIX_SIZE, MessageDecoder, check_encoding, encode_message
from mop.protocols.grpc.status import GrpcError, StatusCode


def _gzip(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def test_a_message_is_its_flag_and_length_then_its_bytes() -> None:
    assert encode_message(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert encode_message(b"") == b"\x00\x00\x00\x00\x00"


@given(
    messages=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
    compress=st.booleans(),
)
def test_messages_come_back_whole_however_the_bytes_are_cut(
    messages: list[bytes], cuts: list[int], compress: bool
) -> None:
    stream = b"".join(encode_message(m, compress=compress) for m in messages)
    decoder = MessageDecoder(1000, "gzip" if compress else "identity")
    received: list[bytes] = []
    start = 0
    for cut in [*sorted(c for c in cuts if c <= len(stream)), len(stream)]:
        received.extend(decoder.feed(stream[start:cut]))
        start = cut
    assert received == messages
    assert decoder.buffered == 0


def test_every_strict_prefix_is_need_more_data() -> None:
    stream = encode_message(b"hello")
    for end in range(len(stream)):
        decoder = MessageDecoder(100)
        assert decoder.feed(stream[:end]) == []
        assert decoder.buffered == end


def test_a_message_over_the_limit_is_refused_from_its_prefix() -> None:
    decoder = MessageDecoder(10)
    with pytest.raises(GrpcError) as refused:
        # Only the prefix: the message's bytes are never waited for nor buffered.
        decoder.feed(struct.pack(">BI", 0, 11))
    assert refused.value.code == StatusCode.RESOURCE_EXHAUSTED


def test_a_compression_bomb_is_refused_without_inflating_it() -> None:
    bomb = _gzip(b"\0" * 10_000_000)
    decoder = MessageDecoder(1000, "gzip")
    with pytest.raises(GrpcError) as refused:
        decoder.feed(struct.pack(">BI", 1, len(bomb)) + bomb)
    assert refused.value.code == StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    ("encoding", "frame"),
    [
        # Flagged compressed on a call without an encoding.
        ("identity", struct.pack(">BI", 1, 3) + b"abc"),
        # Not gzip at all.
        ("gzip", struct.pack(">BI", 1, 3) + b"abc"),
        # A flag that is neither 0 nor 1.
        ("identity", struct.pack(">BI", 2, 0)),
        # A gzip stream cut short.
        ("gzip", struct.pack(">BI", 1, 10) + _gzip(b"hello world")[:10]),
    ],
)
def test_broken_framing_is_internal(encoding: str, frame: bytes) -> None:
    with pytest.raises(GrpcError) as refused:
        MessageDecoder(1000, encoding).feed(frame)
    assert refused.value.code == StatusCode.INTERNAL


def test_an_unknown_encoding_is_unimplemented_and_names_the_known_ones() -> None:
    assert check_encoding("gzip") == "gzip"
    with pytest.raises(GrpcError) as refused:
        check_encoding("snappy")
    assert refused.value.code == StatusCode.UNIMPLEMENTED
    assert "identity,gzip" in refused.value.message


def test_the_prefix_is_five_bytes() -> None:
    assert PREFIX_SIZE == 5
