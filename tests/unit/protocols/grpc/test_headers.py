"""A call's request headers read and checked, its trailers written (grpc-timeout, -bin
metadata, percent-encoded grpc-message)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mop.protocols.grpc.headers import (
    RequestRefused,
    decode_grpc_message,
    encode_grpc_message,
    parse_timeout,
    read_request,
    refusal_headers,
    trailers,
)
from mop.protocols.grpc.status import StatusCode

_BASE = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/pkg.Service/Method"),
    (":authority", "localhost"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def _with(*extra: tuple[str, str], without: str = "") -> list[tuple[str, str]]:
    return [(k, v) for k, v in _BASE if k != without] + list(extra)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1H", 3600),
        ("2M", 120),
        ("5S", 5),
        ("100m", 0.1),
        ("250u", 250e-6),
        ("7n", 7e-9),
        ("99999999S", 99999999),
    ],
)
def test_timeouts(value: str, seconds: float) -> None:
    assert math.isclose(parse_timeout(value), seconds)


@pytest.mark.parametrize("value", ["", "S", "1", "1s", "123456789S", "-1S", "1.5S", " 1S"])
def test_malformed_timeouts(value: str) -> None:
    with pytest.raises(ValueError):
        parse_timeout(value)


def test_a_request_is_read() -> None:
    request = read_request(
        _with(
            ("grpc-timeout", "10S"),
            ("grpc-encoding", "gzip"),
            ("grpc-accept-encoding", "gzip"),
            ("user-agent", "grpc-python/1.85"),
            ("pulsar-topic", "t"),
            ("trace-bin", "AAEC"),  # unpadded base64 is allowed
            ("pulsar-topic", "u"),
        )
    )
    assert request.method == "/pkg.Service/Method"
    assert request.timeout == 10
    assert request.encoding == "gzip"
    # The protocol's own headers are not the call's metadata; the order and repeats are kept.
    assert request.metadata == (
        ("pulsar-topic", "t"),
        ("trace-bin", "\x00\x01\x02"),
        ("pulsar-topic", "u"),
    )


@pytest.mark.parametrize("content_type", ["application/grpc+proto", "application/grpc;x=y"])
def test_grpc_content_types_with_a_suffix_are_taken(content_type: str) -> None:
    headers = [(k, content_type if k == "content-type" else v) for k, v in _BASE]
    assert read_request(headers).method == "/pkg.Service/Method"


@pytest.mark.parametrize(
    ("headers", "code", "http_status"),
    [
        ([(k, "GET" if k == ":method" else v) for k, v in _BASE], StatusCode.INTERNAL, 405),
        (
            [(k, "application/json" if k == "content-type" else v) for k, v in _BASE],
            StatusCode.INTERNAL,
            415,
        ),
        (_with(without="content-type"), StatusCode.INTERNAL, 415),
        (_with(without="te"), StatusCode.INTERNAL, 200),
        (_with(("grpc-timeout", "soon")), StatusCode.INTERNAL, 200),
        (_with(("grpc-encoding", "br")), StatusCode.UNIMPLEMENTED, 200),
        (_with(("x-bin", "not base64!")), StatusCode.INTERNAL, 200),
    ],
)
def test_requests_that_open_no_call(
    headers: list[tuple[str, str]], code: StatusCode, http_status: int
) -> None:
    with pytest.raises(RequestRefused) as refused:
        read_request(headers)
    assert (refused.value.code, refused.value.http_status) == (code, http_status)
    answer = dict(refusal_headers(refused.value))
    assert answer[":status"] == str(http_status)
    assert answer["grpc-status"] == str(int(code))


def test_trailers_and_trailers_only() -> None:
    assert trailers(StatusCode.OK) == [("grpc-status", "0")]
    only = trailers(StatusCode.NOT_FOUND, "gone", trailers_only=True)
    assert only[0] == (":status", "200")
    assert ("content-type", "application/grpc") in only
    assert only[-2:] == [("grpc-status", "5"), ("grpc-message", "gone")]


def test_grpc_message_is_percent_encoded_utf8() -> None:
    assert encode_grpc_message("a b") == "a b"
    assert encode_grpc_message("100%") == "100%25"
    assert encode_grpc_message("é\n") == "%C3%A9%0A"


@given(st.text())
def test_grpc_message_round_trips(text: str) -> None:
    encoded = encode_grpc_message(text)
    assert all(0x20 <= ord(c) < 0x7F for c in encoded)
    assert decode_grpc_message(encoded) == text


def test_a_malformed_escape_is_kept() -> None:
    assert decode_grpc_message("50%zz%4") == "50%zz%4"
