"""The gRPC server's connections: keepalive PINGs, HTTP/2 protocol errors, the drain at close,
the connection rate refusal; with raw HTTP/2 clients (h2 over a socket) where grpcio would
behave too well."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterator

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
import trio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mop.protocols.grpc.serving.calls import Call, MethodHandler
from mop.settings import GrpcSettings, LimitsSettings
from mop.testing.metrics import scrape_metrics
from mop.testing.node import running_node
from tests.e2e.grpc.server_support import ServerUnderTest, grpc_node_settings, serving, unary

pytestmark = pytest.mark.e2e


async def _slow(call: Call) -> None:
    await call.receive()
    await trio.sleep(0.3)
    await call.send(b"done")


async def _hang(call: Call) -> None:
    await trio.sleep_forever()


METHODS: dict[str, MethodHandler] = {"/test.Conn/slow": _slow, "/test.Conn/hang": _hang}


@pytest.fixture
def server() -> Iterator[ServerUnderTest]:
    settings = GrpcSettings(port=0, keepalive_interval=0.2, keepalive_timeout=0.2)
    with serving(METHODS, settings) as running:
        yield running


def _read_until_closed(sock: socket.socket, client: h2.connection.H2Connection) -> list[object]:
    """The client's events until the server closes the connection (5 s at most)."""
    events: list[object] = []
    sock.settimeout(5)
    while data := sock.recv(65536):
        events.extend(client.receive_data(data))
    return events


def _raw_client(port: int) -> tuple[socket.socket, h2.connection.H2Connection]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    sock.sendall(client.data_to_send())
    return sock, client


def test_a_client_that_does_not_answer_pings_is_closed(server: ServerUnderTest) -> None:
    sock, client = _raw_client(server.port)
    with sock:
        # Read what comes without ever writing the answers h2 makes (PING ACK).
        started = time.monotonic()
        events = _read_until_closed(sock, client)
        took = time.monotonic() - started
    assert any(isinstance(e, h2.events.PingReceived) for e in events)
    assert any(isinstance(e, h2.events.ConnectionTerminated) for e in events)
    assert 0.3 < took < 3


def test_a_client_that_answers_pings_stays(server: ServerUnderTest) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        assert unary(channel, "/test.Conn/slow")(b"", timeout=5) == b"done"
        time.sleep(1.0)  # several keepalive intervals, idle
        assert server.call(lambda: len(server.server.connections)) == 1
        assert unary(channel, "/test.Conn/slow")(b"", timeout=5) == b"done"


def test_a_protocol_error_is_answered_with_goaway_and_others_go_on(
    server: ServerUnderTest,
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        future = unary(channel, "/test.Conn/slow").future(b"", timeout=5)
        sock, client = _raw_client(server.port)
        with sock:
            # A DATA frame on stream 0: a connection error.
            sock.sendall(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")
            events = _read_until_closed(sock, client)
        (goaway,) = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        assert goaway.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
        assert future.result() == b"done"


def test_http1_is_answered_with_goaway() -> None:
    with serving(METHODS) as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        events = _read_until_closed(sock, client)
        assert any(isinstance(e, h2.events.ConnectionTerminated) for e in events)


def test_closing_lets_a_running_call_finish_and_ends_the_rest_unavailable(
    server: ServerUnderTest,
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        slow = unary(channel, "/test.Conn/slow").future(b"", timeout=10)
        hanging = unary(channel, "/test.Conn/hang").future(b"", timeout=10)
        time.sleep(0.1)
        started = time.monotonic()
        server.run(server.server.close)
        assert time.monotonic() - started < 3
        assert slow.result() == b"done"
        assert hanging.exception() is not None
        assert hanging.exception().code() == grpc.StatusCode.UNAVAILABLE


def test_connections_over_the_rate_are_refused_and_counted() -> None:
    settings = dataclasses.replace(
        grpc_node_settings(), limits=LimitsSettings(connection_rate=0.01, connection_burst=1)
    )
    with running_node(settings) as node:
        _, port = node.node.address("grpc")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as first:
            health_pb2_grpc.HealthStub(first).Check(health_pb2.HealthCheckRequest(), timeout=5)
            sock, client = _raw_client(port)
            with sock:
                events = _read_until_closed(sock, client)
        (goaway,) = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert b"connection rate" in (goaway.additional_data or b"")
        stats = node.call(lambda: node.node.processor.stats.protocol("grpc"))
        assert stats.refused.get("rate_limited") == 1


def test_connections_over_the_limit_are_refused_and_counted() -> None:
    settings = dataclasses.replace(grpc_node_settings(), limits=LimitsSettings(max_connections=1))
    with running_node(settings) as node:
        _, port = node.node.address("grpc")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as first:
            stub = health_pb2_grpc.HealthStub(first)
            stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            sock, client = _raw_client(port)
            with sock:
                events = _read_until_closed(sock, client)
            (goaway,) = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
            assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
            assert b"limits.max_connections" in (goaway.additional_data or b"")
            # The connection served goes on.
            stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        stats = node.call(lambda: node.node.processor.stats.protocol("grpc"))
        assert stats.refused.get("limit_reached") == 1
        # And the metrics show it, with the gRPC connections' bytes.
        page = scrape_metrics(*node.node.address("admin"))
        labels = {"protocol": "grpc", "reason": "limit_reached"}
        assert page.value("mop_connections_rejected_total", **labels) == 1
        assert page.value("mop_bytes_total", protocol="grpc", direction="in") > 0
        assert page.value("mop_bytes_total", protocol="grpc", direction="out") > 0


def test_calls_over_max_concurrent_streams_wait_at_the_client() -> None:
    # The limit is announced in SETTINGS: grpcio holds the extra calls until others end.
    running_at_once: list[int] = []
    open_calls = [0]

    async def counted(call: Call) -> None:
        open_calls[0] += 1
        running_at_once.append(open_calls[0])
        await trio.sleep(0.05)
        open_calls[0] -= 1
        await call.send(b"ok")

    with (
        serving(
            {"/test.Conn/counted": counted}, GrpcSettings(port=0, max_concurrent_streams=3)
        ) as server,
        grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        call = unary(channel, "/test.Conn/counted")
        futures = [call.future(b"", timeout=20) for _ in range(12)]
        assert [future.result() for future in futures] == [b"ok"] * 12
    assert max(running_at_once) <= 3


def _request(client: h2.connection.H2Connection, path: str) -> int:
    stream_id: int = client.get_next_available_stream_id()
    client.send_headers(
        stream_id,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ],
    )
    client.send_data(stream_id, b"\x00\x00\x00\x00\x00", end_stream=True)
    return stream_id


def test_a_call_the_client_does_not_read_leaves_the_others_alone() -> None:
    async def flood(call: Call) -> None:
        await call.receive()
        while True:
            await call.send(b"f" * 16000)

    methods: dict[str, MethodHandler] = {**METHODS, "/test.Conn/flood": flood}
    with serving(methods) as server:
        sock, client = _raw_client(server.port)
        with sock:
            flooded = _request(client, "/test.Conn/flood")
            sock.sendall(client.data_to_send())
            # The flood fills the stream's window (65535), which the client never opens; the
            # connection's it does (as clients do for what they have buffered).
            received = 0

            def take(event: h2.events.DataReceived) -> None:
                nonlocal received
                received += len(event.data)
                client.increment_flow_control_window(event.flow_controlled_length)

            while received < 65535 - 16005:
                for event in client.receive_data(sock.recv(65536)):
                    if isinstance(event, h2.events.DataReceived):
                        take(event)
            sock.sendall(client.data_to_send())
            answered = _request(client, "/test.Conn/slow")
            sock.sendall(client.data_to_send())
            trailers: list[tuple[bytes, bytes]] = []
            while not trailers:
                for event in client.receive_data(sock.recv(65536)):
                    if isinstance(event, h2.events.TrailersReceived):
                        assert event.stream_id == answered
                        trailers = list(event.headers)
                    elif isinstance(event, h2.events.DataReceived) and event.stream_id == flooded:
                        take(event)
                sock.sendall(client.data_to_send())
            assert (b"grpc-status", b"0") in trailers
            # The flood stopped at its window, and is still running.
            assert received <= 65535
            assert flooded in server.call(lambda: next(iter(server.server.connections)).calls)
