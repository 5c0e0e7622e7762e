"""The gRPC server's connection state machine, driven by an h2 client object with no network:
call events, trailers and trailers-only answers, flow control both ways, limits, protocol
errors, draining."""

from __future__ import annotations

import struct

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mop.protocols.grpc.connection import (
    CallAborted,
    CallStarted,
    ClientHalfClosed,
    ConnectionEnded,
    ConnectionLimits,
    Event,
    GrpcServerConnection,
    MessageReceived,
    PingAnswered,
    WindowOpened,
)
from mop.protocols.grpc.framing import encode_message
from mop.protocols.grpc.status import GrpcError, StatusCode

METHOD = "/pkg.Service/Method"


def request_headers(path: str = METHOD, **extra: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra.items(),
    ]


class Pair:
    """A client (h2) and the server state machine, with the bytes between them carried by
    hand."""

    def __init__(self, limits: ConnectionLimits | None = None, **client_settings: int) -> None:
        self.server = GrpcServerConnection(limits or ConnectionLimits(), {METHOD})
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.client.initiate_connection()
        if client_settings:
            self.client.update_settings(
                {
                    getattr(h2.settings.SettingCodes, k.upper()): v
                    for k, v in client_settings.items()
                }
            )
        self.server.initiate()
        self.client_events: list[h2.events.Event] = []
        self.to_server()
        self.to_client()

    def to_server(self) -> list[Event]:
        return self.server.receive_data(self.client.data_to_send())

    def to_client(self) -> list[h2.events.Event]:
        events = self.client.receive_data(self.server.data_to_send())
        self.client_events.extend(events)
        # The client's answers (SETTINGS ack, WINDOW_UPDATE) go back at once.
        return events

    def open(self, end: bool = False, **extra: str) -> int:
        stream_id = self.client.get_next_available_stream_id()
        self.client.send_headers(stream_id, request_headers(**extra), end_stream=end)
        return stream_id

    def send(self, stream_id: int, data: bytes, end: bool = False) -> None:
        """Send `data` in frames the server takes."""
        for start in range(0, len(data), 16384):
            self.client.send_data(stream_id, data[start : start + 16384])
        if end:
            self.client.end_stream(stream_id)

    def client_headers(self, stream_id: int) -> list[list[tuple[str, str]]]:
        found = []
        for event in self.client_events:
            if (
                isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived)
                and event.stream_id == stream_id
            ):
                found.append([(k.decode(), v.decode()) for k, v in event.headers])
        return found

    def client_data(self, stream_id: int) -> bytes:
        return b"".join(
            event.data
            for event in self.client_events
            if isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id
        )


def _status(headers: list[tuple[str, str]]) -> str:
    return dict(headers)["grpc-status"]


def test_a_unary_call_from_request_to_trailers() -> None:
    pair = Pair()
    stream_id = pair.open(**{"grpc-timeout": "2S", "x-user": "ann"})
    pair.client.send_data(stream_id, encode_message(b"ping"), end_stream=True)
    events = pair.to_server()
    started, received, closed = events
    assert isinstance(started, CallStarted)
    assert started.request.timeout == 2
    assert started.request.metadata == (("x-user", "ann"),)
    assert isinstance(received, MessageReceived) and received.message == b"ping"
    assert closed == ClientHalfClosed(stream_id)
    pair.server.send_message(stream_id, b"pong")
    pair.server.end_call(stream_id, StatusCode.OK)
    pair.to_client()
    response, trailer = pair.client_headers(stream_id)
    assert dict(response)[":status"] == "200"
    assert dict(response)["content-type"] == "application/grpc"
    assert _status(trailer) == "0"
    assert pair.client_data(stream_id) == encode_message(b"pong")
    assert pair.server.open_calls == 0


def test_a_call_ended_before_any_message_is_trailers_only() -> None:
    pair = Pair()
    stream_id = pair.open(end=True)
    pair.to_server()
    pair.server.end_call(stream_id, StatusCode.PERMISSION_DENIED, "no")
    pair.to_client()
    (only,) = pair.client_headers(stream_id)
    assert dict(only)[":status"] == "200"
    assert _status(only) == "7"
    assert dict(only)["grpc-message"] == "no"


def test_an_unknown_method_is_answered_without_a_call() -> None:
    pair = Pair()
    stream_id = pair.open(end=True, path="/pkg.Service/Other")
    assert pair.to_server() == []
    pair.to_client()
    (only,) = pair.client_headers(stream_id)
    assert _status(only) == str(int(StatusCode.UNIMPLEMENTED))


def test_a_content_type_that_is_not_grpc_is_415() -> None:
    pair = Pair()
    stream_id = pair.client.get_next_available_stream_id()
    headers = [(k, "text/plain" if k == "content-type" else v) for k, v in request_headers()]
    pair.client.send_headers(stream_id, headers, end_stream=True)
    assert pair.to_server() == []
    pair.to_client()
    (only,) = pair.client_headers(stream_id)
    assert dict(only)[":status"] == "415"


def test_the_window_of_a_message_comes_back_only_when_it_is_taken() -> None:
    pair = Pair(ConnectionLimits(stream_window=65535))
    stream_id = pair.open()
    message = encode_message(b"m" * 30000)
    pair.send(stream_id, message + message)
    events = pair.to_server()
    pair.to_client()
    flows = [e.flow_length for e in events if isinstance(e, MessageReceived)]
    assert sum(flows) == 2 * len(message)
    window = pair.client.local_flow_control_window(stream_id)
    # Nothing taken: the client's window for the stream stays used up by both messages.
    assert window == 65535 - 2 * len(message)
    for flow in flows:
        pair.server.taken(stream_id, flow)
    pair.to_client()
    assert pair.client.local_flow_control_window(stream_id) == 65535


def test_a_stalled_call_does_not_stall_the_others() -> None:
    # The connection's window leaves each stream its own share.
    pair = Pair(ConnectionLimits(stream_window=65535, max_concurrent_streams=4))
    stalled = pair.open()
    pair.send(stalled, encode_message(b"s" * 65000))
    pair.to_server()
    pair.to_client()
    other = pair.open()
    assert pair.client.local_flow_control_window(other) == 65535
    pair.send(other, encode_message(b"o" * 65000))
    events = pair.to_server()
    assert [type(e) for e in events] == [CallStarted, MessageReceived]


def test_a_partial_message_is_acknowledged_at_once() -> None:
    # A message larger than the stream's window can still arrive.
    pair = Pair(ConnectionLimits(stream_window=65535, max_message_bytes=1_000_000))
    stream_id = pair.open()
    big = encode_message(b"b" * 200_000)
    sent = 0
    received: list[Event] = []
    while sent < len(big):
        size = min(pair.client.local_flow_control_window(stream_id), 16384, len(big) - sent)
        assert size > 0, "the client's window stayed closed"
        pair.client.send_data(stream_id, big[sent : sent + size])
        sent += size
        received.extend(pair.to_server())
        pair.to_client()
    messages = [e for e in received if isinstance(e, MessageReceived)]
    assert [len(m.message) for m in messages] == [200_000]


def test_responses_wait_for_the_clients_window() -> None:
    pair = Pair(initial_window_size=1000)
    stream_id = pair.open()
    pair.to_server()
    pair.to_client()
    pair.server.send_message(stream_id, b"r" * 5000)
    assert pair.server.pending(stream_id) == 5005 - 1000
    pair.to_client()
    assert len(pair.client_data(stream_id)) == 1000
    # The client reads and opens its window: the rest goes.
    pair.client.acknowledge_received_data(1000, stream_id)
    pair.client.increment_flow_control_window(10_000, stream_id)
    assert WindowOpened() in pair.to_server()
    assert pair.server.pending(stream_id) == 0
    pair.server.end_call(stream_id, StatusCode.OK)
    pair.to_client()
    assert pair.client_data(stream_id) == encode_message(b"r" * 5000)
    assert _status(pair.client_headers(stream_id)[-1]) == "0"


def test_the_trailers_wait_for_the_queued_messages() -> None:
    pair = Pair(initial_window_size=10)
    stream_id = pair.open()
    pair.to_server()
    pair.server.send_message(stream_id, b"0123456789abcdef")
    pair.server.end_call(stream_id, StatusCode.OK)
    pair.to_client()
    assert len(pair.client_headers(stream_id)) == 1  # the response headers only
    pair.client.increment_flow_control_window(100, stream_id)
    pair.to_server()
    pair.to_client()
    assert _status(pair.client_headers(stream_id)[-1]) == "0"


def test_a_message_over_the_limit_aborts_the_call_alone() -> None:
    pair = Pair(ConnectionLimits(max_message_bytes=100))
    good = pair.open()
    bad = pair.open()
    pair.client.send_data(bad, struct.pack(">BI", 0, 101))
    pair.client.send_data(good, encode_message(b"fine"))
    events = pair.to_server()
    aborted = [e for e in events if isinstance(e, CallAborted)]
    assert [(e.stream_id, e.code) for e in aborted] == [(bad, StatusCode.RESOURCE_EXHAUSTED)]
    assert MessageReceived(good, b"fine", len(encode_message(b"fine"))) in events
    pair.to_client()
    assert _status(pair.client_headers(bad)[-1]) == str(int(StatusCode.RESOURCE_EXHAUSTED))
    # The client is asked to stop sending on the aborted call.
    assert any(
        isinstance(e, h2.events.StreamReset) and e.stream_id == bad for e in pair.client_events
    )


def test_a_response_over_the_limit_is_refused() -> None:
    pair = Pair(ConnectionLimits(max_message_bytes=10))
    stream_id = pair.open()
    pair.to_server()
    with pytest.raises(GrpcError) as refused:
        pair.server.send_message(stream_id, b"x" * 11)
    assert refused.value.code == StatusCode.RESOURCE_EXHAUSTED


def test_a_truncated_last_message_is_internal() -> None:
    pair = Pair()
    stream_id = pair.open()
    pair.client.send_data(stream_id, encode_message(b"abc")[:-1], end_stream=True)
    events = pair.to_server()
    assert (
        CallAborted(stream_id, StatusCode.INTERNAL, "the last request message is truncated")
        in events
    )


def test_a_reset_by_the_client_aborts_the_call() -> None:
    pair = Pair()
    stream_id = pair.open()
    pair.to_server()
    pair.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
    (event,) = pair.to_server()
    assert isinstance(event, CallAborted) and event.code == StatusCode.CANCELLED
    # What the handler does afterwards goes nowhere.
    pair.server.send_message(stream_id, b"late")
    pair.server.end_call(stream_id, StatusCode.OK)
    assert pair.server.open_calls == 0


def test_ping_and_its_answer() -> None:
    pair = Pair()
    pair.server.ping(b"12345678")
    pair.to_client()
    assert pair.to_server() == [PingAnswered()]


def test_a_protocol_error_ends_the_connection_with_a_goaway() -> None:
    pair = Pair()
    # DATA on stream 0 is a connection error (PROTOCOL_ERROR).
    events = pair.server.receive_data(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")
    (ended,) = events
    assert isinstance(ended, ConnectionEnded)
    assert ended.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    pair.to_client()
    terminated = [e for e in pair.client_events if isinstance(e, h2.events.ConnectionTerminated)]
    assert terminated[0].error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert pair.server.receive_data(b"anything") == []


def test_garbage_instead_of_the_preface_is_a_protocol_error() -> None:
    server = GrpcServerConnection(ConnectionLimits(), {METHOD})
    server.initiate()
    (ended,) = server.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(ended, ConnectionEnded) and ended.error_code != 0
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    events = client.receive_data(server.data_to_send())
    assert any(isinstance(e, h2.events.ConnectionTerminated) for e in events)


def test_a_header_list_over_the_limit_ends_the_connection() -> None:
    pair = Pair(ConnectionLimits(max_header_list_size=1024))
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_headers(stream_id, request_headers(**{"x-big": "v" * 4000}))
    events = pair.to_server()
    assert [type(e) for e in events] == [ConnectionEnded]


def test_the_settings_announce_the_limits() -> None:
    pair = Pair(ConnectionLimits(max_concurrent_streams=7, stream_window=100_000))
    remote = pair.client.remote_settings
    assert remote.max_concurrent_streams == 7
    assert remote.initial_window_size == 100_000
    assert pair.client.outbound_flow_control_window >= 7 * 100_000


def test_draining_lets_running_calls_finish_and_refuses_new_ones() -> None:
    pair = Pair()
    running = pair.open()
    pair.to_server()
    pair.server.drain()
    pair.to_client()
    goaway = [e for e in pair.client_events if isinstance(e, h2.events.ConnectionTerminated)]
    assert goaway[0].error_code == 0 and goaway[0].last_stream_id == running
    # The running call still answers.
    pair.server.send_message(running, b"done")
    pair.server.end_call(running, StatusCode.OK)
    data = pair.server.data_to_send()
    assert encode_message(b"done") in data
    pair.server.close()
    assert pair.server.ended


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=200_000), min_size=1, max_size=40))
def test_a_handler_that_stops_reading_bounds_what_its_call_buffers(sizes: list[int]) -> None:
    window, largest = 65535, 200_000
    pair = Pair(ConnectionLimits(stream_window=window, max_message_bytes=largest))
    stream_id = pair.open()
    pending = b"".join(encode_message(b"p" * size) for size in sizes)
    buffered = 0
    while pending:
        size = min(pair.client.local_flow_control_window(stream_id), 16384, len(pending))
        if size == 0:
            break  # back-pressured: the client cannot send more
        pair.client.send_data(stream_id, pending[:size])
        pending = pending[size:]
        for event in pair.to_server():
            assert not isinstance(event, CallAborted)
            if isinstance(event, MessageReceived):
                buffered += len(event.message)  # never taken by the handler
        pair.to_client()
    assert buffered <= window + largest


def test_a_large_message_waits_until_the_handler_took_the_ones_before() -> None:
    pair = Pair(ConnectionLimits(stream_window=65535, max_message_bytes=1_000_000))
    stream_id = pair.open()
    pair.send(stream_id, encode_message(b"small"))
    (_, first) = pair.to_server()
    assert isinstance(first, MessageReceived)
    big = encode_message(b"b" * 200_000)
    sent = 0

    def push() -> list[Event]:
        nonlocal sent
        events: list[Event] = []
        while size := min(pair.client.local_flow_control_window(stream_id), 16384, len(big) - sent):
            pair.client.send_data(stream_id, big[sent : sent + size])
            sent += size
            events.extend(pair.to_server())
            pair.to_client()
        return events

    assert push() == []
    assert sent < len(big)  # back-pressured while "small" is not taken
    pair.server.taken(stream_id, first.flow_length)
    pair.to_client()
    (arrived,) = push()
    assert isinstance(arrived, MessageReceived) and len(arrived.message) == 200_000


def test_large_messages_share_a_budget_of_two_on_a_connection() -> None:
    window, largest = 65535, 200_000
    pair = Pair(ConnectionLimits(stream_window=window, max_message_bytes=largest))
    streams = [pair.open() for _ in range(3)]
    big = encode_message(b"L" * largest)
    sent = dict.fromkeys(streams, 0)
    arrived: dict[int, MessageReceived] = {}

    def push() -> None:
        moving = True
        while moving:
            moving = False
            for stream_id in streams:
                size = min(
                    pair.client.local_flow_control_window(stream_id),
                    16384,
                    len(big) - sent[stream_id],
                )
                if size > 0:
                    pair.client.send_data(stream_id, big[sent[stream_id] : sent[stream_id] + size])
                    sent[stream_id] += size
                    moving = True
            for event in pair.to_server():
                if isinstance(event, MessageReceived):
                    arrived[event.stream_id] = event
            pair.to_client()

    push()
    # Two arrive whole; the third waits within its window for the budget.
    assert len(arrived) == 2
    (waiting,) = set(streams) - set(arrived)
    assert sent[waiting] < len(big)
    first = next(iter(arrived.values()))
    pair.server.taken(first.stream_id, first.flow_length)
    pair.to_client()
    push()
    assert waiting in arrived and len(arrived[waiting].message) == largest
