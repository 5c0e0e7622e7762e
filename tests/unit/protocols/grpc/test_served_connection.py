"""The trio side of a gRPC connection over an in-memory stream, on a virtual clock: keepalive
PINGs and the close after a missed answer, deadlines, and the default settings' timings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h2.config
import h2.connection
import h2.events
import pytest
import trio
import trio.testing
from hyperframe.frame import GoAwayFrame

from mop.counters import ProtocolStats
from mop.protocols.grpc.connection import GrpcServerConnection
from mop.protocols.grpc.framing import encode_message
from mop.protocols.grpc.serving.calls import Call
from mop.protocols.grpc.serving.served_connection import ServedConnection
from mop.protocols.grpc.serving.server import GrpcServer
from mop.settings import GrpcSettings
from mop.transport import ConnectionInfo


async def _hang(call: Call) -> None:
    await trio.sleep_forever()


async def _slow_echo(call: Call) -> None:
    message = await call.receive()
    await trio.sleep(1)
    await call.send(message or b"")


class Client:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()

    async def flush(self) -> None:
        await self.stream.send_all(self.h2.data_to_send())

    async def call(self, path: str, body: bytes, *headers: tuple[str, str]) -> int:
        """Send a whole unary call to `path` (its request headers, then `headers`); its
        stream id."""
        stream_id: int = self.h2.get_next_available_stream_id()
        self.h2.send_headers(
            stream_id,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "x"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *headers,
            ],
        )
        self.h2.send_data(stream_id, encode_message(body), end_stream=True)
        await self.flush()
        return stream_id

    async def events(self) -> list[h2.events.Event]:
        data = await self.stream.receive_some(65536)
        if not data:
            return [h2.events.ConnectionTerminated()]
        return list(self.h2.receive_data(data))


@asynccontextmanager
async def connected(settings: GrpcSettings) -> AsyncIterator[Client]:
    server = GrpcServer(
        settings, {"/t.S/hang": _hang, "/t.S/echo": _slow_echo}, ProtocolStats("grpc")
    )
    client_stream, server_stream = trio.testing.memory_stream_pair()
    info = ConnectionInfo("tcp", ("127.0.0.1", 50051), ("127.0.0.1", 40000))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.handle_connection, server_stream, info)
        client = Client(client_stream)
        await client.flush()
        yield client
        nursery.cancel_scope.cancel()


async def test_a_silent_client_is_pinged_then_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = GrpcSettings(keepalive_interval=60, keepalive_timeout=20)
    async with connected(settings) as client:
        start = trio.current_time()
        pinged_at = closed_at = None
        while closed_at is None:
            for event in await client.events():
                if isinstance(event, h2.events.PingReceived) and pinged_at is None:
                    pinged_at = trio.current_time() - start
                if isinstance(event, h2.events.ConnectionTerminated):
                    closed_at = trio.current_time() - start
        # (The client never sends the PING ACK h2 prepared.)
        assert pinged_at == pytest.approx(60, abs=0.1)
        assert closed_at == pytest.approx(80, abs=0.1)


async def test_a_client_that_answers_is_pinged_again_and_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(GrpcSettings(keepalive_interval=60, keepalive_timeout=20)) as client:
        pings = 0
        with trio.move_on_after(200):
            while True:
                for event in await client.events():
                    assert not isinstance(event, h2.events.ConnectionTerminated)
                    if isinstance(event, h2.events.PingReceived):
                        pings += 1
                await client.flush()  # the PING ACKs
        assert pings == 3  # at 60, 120 and 180 s


async def test_the_deadline_ends_a_hanging_call(autojump_clock: trio.testing.MockClock) -> None:
    async with connected(GrpcSettings(keepalive_interval=0)) as client:
        await client.call("/t.S/hang", b"", ("grpc-timeout", "5S"))
        start = trio.current_time()
        while True:
            ended = [
                event
                for event in await client.events()
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived)
            ]
            if ended:
                break
        (response,) = ended
        headers = dict(response.headers or ())
        assert headers[b"grpc-status"] == b"4"  # DEADLINE_EXCEEDED, trailers-only
        assert trio.current_time() - start == pytest.approx(5, abs=0.1)


async def test_a_client_that_floods_and_never_reads_is_not_read_either(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 200k PINGs queue 3.4 MB of answers: the server stops reading at about 1 MiB queued, and
    # the client meets the back-pressure (the lockstep stream writes only what is read).
    client_stream, server_stream = trio.testing.lockstep_stream_pair()
    server = GrpcServer(GrpcSettings(), {"/t.S/hang": _hang}, ProtocolStats("grpc"))
    state = GrpcServerConnection(server.limits, server.methods)
    connection = ServedConnection(
        server_stream,
        peer="127.0.0.1:40000",
        peer_certificate=None,
        state=state,
        methods=server.methods,
        settings=server.settings,
        stats=server.stats,
    )
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    for _ in range(200_000):
        client.ping(b"12345678")
    flood = client.data_to_send()
    closed = trio.Event()

    async def serve() -> None:
        await connection.run()
        closed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        with trio.move_on_after(10):
            await client_stream.send_all(flood)
        assert state.unsent_bytes <= 1024 * 1024 + 65536
        # Not read since, so silent: it is PINGed, and closed when no answer comes.
        with trio.move_on_after(200):
            await closed.wait()
        assert closed.is_set()
        nursery.cancel_scope.cancel()


async def test_a_clients_graceful_goaway_lets_its_calls_finish_then_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(GrpcSettings(keepalive_interval=0)) as client:
        stream_id = await client.call("/t.S/echo", b"hi")
        # GOAWAY NO_ERROR framed by hand: the client's h2 would read nothing after its own.
        goaway = GoAwayFrame(0)
        goaway.last_stream_id = stream_id
        await client.stream.send_all(goaway.serialize())
        data = b""
        status = None
        terminated = False
        while not terminated:
            for event in await client.events():
                if isinstance(event, h2.events.DataReceived):
                    data += event.data or b""
                if isinstance(event, h2.events.TrailersReceived):
                    status = dict(event.headers or ())[b"grpc-status"]
                terminated = terminated or isinstance(event, h2.events.ConnectionTerminated)
        assert (data, status) == (encode_message(b"hi"), b"0")
