"""`end_and_drain`: our side ends (the peer sees the end of the stream after what was sent),
what the peer still sends is read and dropped, and the wait is bounded."""

from __future__ import annotations

import trio
import trio.testing

from mop.transport.linger import UNENDED_LINGER_SECONDS, end_and_drain


async def test_the_peer_reads_everything_then_the_end_while_it_still_sends() -> None:
    server, client = trio.testing.memory_stream_pair()
    await server.send_all(b"DISCONNECT")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(end_and_drain, server)
        for _ in range(5):  # a client still writing is read from, not cut off
            await client.send_all(b"x" * 1000)
        assert await client.receive_some(100) == b"DISCONNECT"
        assert await client.receive_some(100) == b""  # our side has ended
        await client.aclose()  # the drain ends with the client's close


async def test_a_peer_that_never_closes_is_waited_for_a_bounded_time() -> None:
    server, _client = trio.testing.memory_stream_pair()
    with trio.fail_after(1):
        await end_and_drain(server, seconds=0.1)


async def test_at_most_max_bytes_are_drained() -> None:
    server, client = trio.testing.memory_stream_pair()
    await client.send_all(b"x" * 100)
    with trio.fail_after(0.5):  # not the 1 s a peer that stays gets
        await end_and_drain(server, max_bytes=50)


async def test_a_broken_connection_is_no_error() -> None:
    server, client = trio.testing.memory_stream_pair()
    await server.aclose()
    await end_and_drain(server)
    await client.aclose()


class _Unended(trio.abc.Stream):
    """A stream that cannot half-close (as TLS and WebSocket streams), over another."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_stream_that_cannot_half_close_lingers_briefly() -> None:
    server, client = trio.testing.memory_stream_pair()
    await client.send_all(b"sent meanwhile")
    started = trio.current_time()
    await end_and_drain(_Unended(server))
    assert trio.current_time() - started < UNENDED_LINGER_SECONDS + 0.3
    await server.send_all(b"still open")  # no end was sent: it cannot be
    assert await client.receive_some(100) == b"still open"


async def test_a_tcp_client_still_writing_reads_the_reason_then_the_end() -> None:
    async with trio.open_nursery() as nursery:
        accepted: list[trio.SocketStream] = []
        done = trio.Event()

        async def serve(stream: trio.SocketStream) -> None:
            accepted.append(stream)
            await stream.receive_some(10)  # the client's first packet
            await stream.send_all(b"DISCONNECT")
            await end_and_drain(stream)
            done.set()

        listeners = await nursery.start(trio.serve_tcp, serve, 0)
        port = listeners[0].socket.getsockname()[1]
        with trio.fail_after(5):
            async with await trio.open_tcp_stream("127.0.0.1", port) as client:
                await client.send_all(b"CONNECT")
                for _ in range(50):  # more the server never reads as packets
                    await client.send_all(b"x" * 10_000)
                received = b""
                while chunk := await client.receive_some(100):
                    received += chunk
                assert received == b"DISCONNECT"
            await done.wait()
        nursery.cancel_scope.cancel()
