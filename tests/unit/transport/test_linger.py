"""`end_and_drain`: our side ends (the peer sees the end of the stream after what was sent),
what the peer still sends is read and dropped, and the wait is bounded."""

from __future__ import annotations

import trio
import trio.testing

from mop.transport.linger import end_and_drain


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
