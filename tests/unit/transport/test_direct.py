"""`receiver`: the direct read of plain TCP connections keeps `receive_some`'s contract."""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from mop.transport import read_ready, receiver


@pytest.fixture
async def tcp_pair() -> AsyncIterator[tuple[trio.SocketStream, trio.SocketStream]]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    assert isinstance(server, trio.SocketStream)
    yield server, client
    for resource in (client, server, *listeners):
        await resource.aclose()


async def test_reads_what_arrives_and_the_end(
    tcp_pair: tuple[trio.SocketStream, trio.SocketStream],
) -> None:
    server, client = tcp_pair
    receive = receiver(server)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send_all, b"hello")
        with trio.fail_after(5):
            assert await receive(100) == b"hello"
    await client.send_eof()
    with trio.fail_after(5):
        assert await receive(100) == b""


async def test_a_cancelled_wait_loses_nothing(
    tcp_pair: tuple[trio.SocketStream, trio.SocketStream],
) -> None:
    server, client = tcp_pair
    receive = receiver(server)
    with trio.move_on_after(0.05) as waited:
        await receive(100)
    assert waited.cancelled_caught
    await client.send_all(b"later")
    with trio.fail_after(5):
        assert await receive(100) == b"later"


async def test_a_reset_is_a_broken_resource(
    tcp_pair: tuple[trio.SocketStream, trio.SocketStream],
) -> None:
    server, client = tcp_pair
    # Linger 0: closing sends a reset instead of the end of the stream.
    client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await client.aclose()
    with pytest.raises(trio.BrokenResourceError), trio.fail_after(5):
        await receiver(server)(100)


async def test_a_closed_stream_is_a_closed_resource(
    tcp_pair: tuple[trio.SocketStream, trio.SocketStream],
) -> None:
    server, _ = tcp_pair
    receive = receiver(server)
    async with trio.open_nursery() as nursery:

        async def close_soon() -> None:
            await trio.testing.wait_all_tasks_blocked()
            await server.aclose()

        nursery.start_soon(close_soon)
        with pytest.raises(trio.ClosedResourceError), trio.fail_after(5):
            await receive(100)  # waiting when the stream closes
    with pytest.raises(trio.ClosedResourceError):
        await receive(100)  # and once it is closed


async def test_other_streams_read_as_they_do() -> None:
    sending, receiving = trio.testing.memory_stream_pair()
    receive = receiver(receiving)
    await sending.send_all(b"x")
    assert await receive(10) == b"x"


async def test_a_read_that_fills_the_buffer_leaves_the_rest_for_the_next(
    tcp_pair: tuple[trio.SocketStream, trio.SocketStream],
) -> None:
    server, client = tcp_pair
    receive = receiver(server)
    await client.send_all(b"a" * 150)
    await client.send_eof()
    received = b""
    with trio.fail_after(5):
        while chunk := await receive(100):
            assert len(chunk) <= 100
            received += chunk
    assert received == b"a" * 150


async def test_a_cancelled_read_after_a_full_one_loses_nothing(
    tcp_pair: tuple[trio.SocketStream, trio.SocketStream],
) -> None:
    server, client = tcp_pair
    receive = receiver(server)
    await client.send_all(b"b" * 100)
    with trio.fail_after(5):
        while (data := await receive(100)) and len(data) < 100:
            pass  # until one read fills the buffer: the next one tries at once
    with trio.CancelScope() as scope:
        scope.cancel()
        await receive(100)
    assert scope.cancelled_caught
    await client.send_all(b"rest")
    with trio.fail_after(5):
        assert await receive(100) == b"rest"


async def test_read_ready_takes_only_what_is_there(
    tcp_pair: tuple[trio.SocketStream, trio.SocketStream],
) -> None:
    server, client = tcp_pair
    assert read_ready(server, 100) is None
    await client.send_all(b"now")
    with trio.fail_after(5):
        await trio.lowlevel.wait_readable(server.socket)
    assert read_ready(server, 100) == b"now"
    await client.send_eof()
    with trio.fail_after(5):
        await trio.lowlevel.wait_readable(server.socket)
    assert read_ready(server, 100) == b""
    await server.aclose()
    with pytest.raises(trio.ClosedResourceError):
        read_ready(server, 100)


async def test_read_ready_leaves_other_streams_to_their_reads() -> None:
    sending, receiving = trio.testing.memory_stream_pair()
    await sending.send_all(b"x")
    assert read_ready(receiving, 10) is None
    assert await receiver(receiving)(10) == b"x"
