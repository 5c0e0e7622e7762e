"""GrpcServer.close while the node cancels its listeners' connection tasks (as a closing node
does): the drain ends even when a connection's calls are cancelled with it, mid-handler."""

from __future__ import annotations

import h2.config
import h2.connection
import trio
import trio.testing

from mop.counters import ProtocolStats
from mop.protocols.grpc.serving.calls import Call
from mop.protocols.grpc.serving.server import GrpcServer
from mop.settings import GrpcSettings
from mop.transport import ConnectionInfo

PATH = "/t.S/hang"
HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", PATH),
    (":authority", "127.0.0.1"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


async def _hang(call: Call) -> None:
    await trio.sleep_forever()


async def test_close_ends_when_the_connection_is_cancelled_under_a_running_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = GrpcServer(GrpcSettings(), {PATH: _hang}, ProtocolStats("grpc"))
    client_stream, server_stream = trio.testing.memory_stream_pair()
    info = ConnectionInfo("tcp", ("127.0.0.1", 50051), ("127.0.0.1", 40000))
    closed = trio.Event()

    async def close() -> None:
        await server.close()
        closed.set()

    async with trio.open_nursery() as nursery:
        listeners = trio.CancelScope()

        async def serve() -> None:
            with listeners:
                await server.handle_connection(server_stream, info)

        nursery.start_soon(serve)
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        client.send_headers(1, HEADERS)
        await client_stream.send_all(client.data_to_send())
        await trio.testing.wait_all_tasks_blocked()
        assert server.connections and next(iter(server.connections)).calls

        nursery.start_soon(close)  # drains: waits for the running call
        await trio.testing.wait_all_tasks_blocked()
        listeners.cancel()  # the node cancels its listeners' connection tasks meanwhile
        with trio.move_on_after(30) as waited:
            await closed.wait()
        assert not waited.cancelled_caught, "the drain waited for a call that had gone"
        nursery.cancel_scope.cancel()
