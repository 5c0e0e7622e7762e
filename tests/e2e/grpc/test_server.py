"""The gRPC server with the reference client (grpcio) over loopback: unary and streaming calls,
statuses, deadlines, cancellation, message limits, compression, many calls on one connection.
The methods are the test's own (raw bytes), so these tests see the server alone."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import trio

from mop.protocols.grpc.serving.calls import Call, MethodHandler
from mop.protocols.grpc.status import GrpcError, StatusCode
from mop.settings import GrpcSettings
from tests.e2e.grpc.server_support import (
    ServerUnderTest,
    serving,
    stream_stream,
    unary,
    unary_stream,
)

pytestmark = pytest.mark.e2e

_MAX_MESSAGE = 256 * 1024


class Methods:
    """The test service; `cancelled` records the calls whose handler was cancelled."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.ended = threading.Event()

    def table(self) -> dict[str, MethodHandler]:
        return {
            "/test.Echo/unary": self.unary,
            "/test.Echo/bidi": self.bidi,
            "/test.Echo/fail": self.fail,
            "/test.Echo/refuse": self.refuse,
            "/test.Echo/hang": self.hang,
            "/test.Echo/large": self.large,
            "/test.Echo/count": self.count,
        }

    async def unary(self, call: Call) -> None:
        message = await call.receive()
        assert message is not None
        await call.send(message)

    async def bidi(self, call: Call) -> None:
        while (message := await call.receive()) is not None:
            await call.send(message)

    async def fail(self, call: Call) -> None:
        raise ValueError("a bug in a handler")

    async def refuse(self, call: Call) -> None:
        raise GrpcError(StatusCode.NOT_FOUND, "no such topic: bäume 100% gone")

    async def hang(self, call: Call) -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled.append(call.method)
            self.ended.set()
            raise

    async def large(self, call: Call) -> None:
        request = await call.receive()
        assert request is not None
        await call.send(b"x" * int(request))

    async def count(self, call: Call) -> None:
        total = 0
        while (message := await call.receive()) is not None:
            total += len(message)
        await call.send(str(total).encode())


@pytest.fixture(scope="module")
def methods() -> Methods:
    return Methods()


@pytest.fixture(scope="module")
def server(methods: Methods) -> Iterator[ServerUnderTest]:
    with serving(methods.table(), GrpcSettings(port=0, max_message_bytes=_MAX_MESSAGE)) as running:
        yield running


@pytest.fixture
def channel(server: ServerUnderTest) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as opened:
        yield opened


def test_a_unary_call_answers(channel: grpc.Channel) -> None:
    assert unary(channel, "/test.Echo/unary")(b"hello", timeout=5) == b"hello"
    assert unary(channel, "/test.Echo/unary")(b"", timeout=5) == b""


def test_a_bidirectional_stream_echoes_every_message_in_order(channel: grpc.Channel) -> None:
    sent = [f"message {n}".encode() for n in range(200)]
    assert list(stream_stream(channel, "/test.Echo/bidi")(iter(sent), timeout=10)) == sent


def test_a_client_stream_is_read_to_its_end(channel: grpc.Channel) -> None:
    chunks = [b"a" * 1000] * 300  # more than a window's worth
    answer = channel.stream_unary(
        "/test.Echo/count", request_serializer=bytes, response_deserializer=bytes
    )(iter(chunks), timeout=10)
    assert answer == b"300000"


def test_a_response_larger_than_the_window_arrives_whole(channel: grpc.Channel) -> None:
    assert unary(channel, "/test.Echo/large")(b"200000", timeout=10) == b"x" * 200_000


def test_an_unknown_method_is_unimplemented(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        unary(channel, "/test.Echo/nothing")(b"", timeout=5)
    assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "/test.Echo/nothing" in failed.value.details()


def test_a_grpc_error_ends_the_call_with_its_status_and_message(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        unary(channel, "/test.Echo/refuse")(b"", timeout=5)
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    # Percent-encoded on the wire, whole again at the client.
    assert failed.value.details() == "no such topic: bäume 100% gone"


def test_a_handler_bug_is_internal_and_logged_once(
    channel: grpc.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="mop.grpc"), pytest.raises(grpc.RpcError) as failed:
        unary(channel, "/test.Echo/fail")(b"", timeout=5)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    # The client learns nothing of the server's internals.
    assert "a bug" not in failed.value.details()
    logged = [r for r in caplog.records if r.name == "mop.grpc" and r.exc_info]
    assert len(logged) == 1
    assert "/test.Echo/fail" in logged[0].getMessage()
    # The connection goes on.
    assert unary(channel, "/test.Echo/unary")(b"after", timeout=5) == b"after"


def test_the_deadline_ends_the_call_and_cancels_its_handler(
    channel: grpc.Channel, methods: Methods
) -> None:
    methods.ended.clear()
    with pytest.raises(grpc.RpcError) as failed:
        unary(channel, "/test.Echo/hang")(b"", timeout=0.3)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert methods.ended.wait(5)


def test_a_call_the_client_cancels_cancels_its_handler(
    channel: grpc.Channel, methods: Methods
) -> None:
    methods.ended.clear()
    future = unary(channel, "/test.Echo/hang").future(b"", timeout=30)
    # The handler runs before the client gives up.
    threading.Event().wait(0.3)
    future.cancel()
    assert methods.ended.wait(5)


def test_a_request_over_the_message_limit_is_resource_exhausted(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        unary(channel, "/test.Echo/unary")(b"y" * (_MAX_MESSAGE + 1), timeout=5)
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_response_over_the_message_limit_is_resource_exhausted(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        unary(channel, "/test.Echo/large")(str(_MAX_MESSAGE + 1).encode(), timeout=5)
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_gzip_compressed_requests_are_read(channel: grpc.Channel) -> None:
    message = b"compressible " * 1000
    answer = unary(channel, "/test.Echo/unary")(
        message, timeout=5, compression=grpc.Compression.Gzip
    )
    assert answer == message


def test_many_concurrent_streams_share_one_connection(channel: grpc.Channel) -> None:
    def one(n: int) -> list[bytes]:
        sent = [f"{n}:{i}".encode() for i in range(20)]
        return list(stream_stream(channel, "/test.Echo/bidi")(iter(sent), timeout=20))

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(one, range(50)))
    assert results == [[f"{n}:{i}".encode() for i in range(20)] for n in range(50)]


def test_one_failing_stream_leaves_the_others_alone(channel: grpc.Channel) -> None:
    requests: list[bytes] = [b"first"]
    more = threading.Event()

    def feed() -> Iterator[bytes]:
        yield requests[0]
        more.wait(5)
        yield b"second"

    answers = stream_stream(channel, "/test.Echo/bidi")(feed(), timeout=10)
    assert next(answers) == b"first"
    # On the same connection: a framing violation (too large), a bug, an unknown method.
    for path, payload in (
        ("/test.Echo/unary", b"z" * (_MAX_MESSAGE + 10)),
        ("/test.Echo/fail", b""),
        ("/test.Echo/missing", b""),
    ):
        with pytest.raises(grpc.RpcError):
            unary(channel, path)(payload, timeout=5)
    more.set()
    assert list(answers) == [b"second"]


def test_a_server_stream_reaches_the_client(channel: grpc.Channel) -> None:
    # A handler that sends several messages for one request (as Watch does).
    assert list(unary_stream(channel, "/test.Echo/unary")(b"one", timeout=5)) == [b"one"]
