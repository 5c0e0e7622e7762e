"""Whatever a client sends, the server's connection state machine answers with events (at
worst the connection's end and a GOAWAY), never an exception."""

from __future__ import annotations

import struct

import h2.config
import h2.connection
from hypothesis import given, settings
from hypothesis import strategies as st

from mop.protocols.grpc.connection import (
    CallStarted,
    ConnectionEnded,
    ConnectionLimits,
    GrpcServerConnection,
    MessageReceived,
)
from mop.protocols.grpc.status import StatusCode

METHOD = "/pkg.Service/Method"
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _client_start() -> bytes:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    stream_id = client.get_next_available_stream_id()
    client.send_headers(
        stream_id,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", METHOD),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ],
    )
    return client.data_to_send()


# A frame: length, type (the defined ones and a few unknown), flags, stream id, payload.
frames = st.builds(
    lambda kind, flags, stream, payload: (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    ),
    st.integers(min_value=0, max_value=12),
    st.integers(min_value=0, max_value=255),
    st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1]),
    st.binary(max_size=64),
)


def _drive(server: GrpcServerConnection, chunks: list[bytes]) -> None:
    ended = False
    for chunk in chunks:
        events = server.receive_data(chunk)
        if ended:
            assert events == []
        for event in events:
            ended = ended or isinstance(event, ConnectionEnded)
            # What a handler would do with the events it gets.
            if isinstance(event, CallStarted):
                server.send_message(event.stream_id, b"answer")
            elif isinstance(event, MessageReceived):
                server.taken(event.stream_id, event.flow_length)
                server.end_call(event.stream_id, StatusCode.OK)
        server.data_to_send()


@settings(max_examples=300, deadline=None)
@given(st.lists(frames, max_size=12))
def test_random_frames_after_a_valid_start(sent: list[bytes]) -> None:
    server = GrpcServerConnection(ConnectionLimits(max_message_bytes=100), {METHOD})
    server.initiate()
    _drive(server, [_client_start(), *sent])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=100), max_size=6))
def test_random_bytes_after_the_preface(sent: list[bytes]) -> None:
    server = GrpcServerConnection(ConnectionLimits(), {METHOD})
    server.initiate()
    _drive(server, [_PREFACE, *sent])
