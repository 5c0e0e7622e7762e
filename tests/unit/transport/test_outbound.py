"""`OutboundBuffer`: writes leave in order through one writer at a time, either the `run` task
or writer tasks started on demand (none while nothing is to be sent), and space is bounded."""

from __future__ import annotations

import trio
import trio.testing

from mop.transport import OutboundBuffer


async def read_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    data = b""
    with trio.fail_after(5):
        while len(data) < size:
            chunk = await stream.receive_some(size - len(data))
            assert chunk, "the stream closed early"
            data += chunk
    return data


async def test_on_demand_writer_sends_in_order_and_then_ends() -> None:
    sending, receiving = trio.testing.memory_stream_pair()
    out = OutboundBuffer(sending)
    out.write(b"before ")  # buffered until there is a nursery to write from
    async with trio.open_nursery() as nursery:
        out.write_from(nursery)
        out.write(b"one ")
        out.write(b"two")
        assert await read_exactly(receiving, 14) == b"before one two"
        await trio.testing.wait_all_tasks_blocked()
        assert nursery.child_tasks == set()  # idle: no writer task is left
        out.write(b"!")
        assert await read_exactly(receiving, 1) == b"!"
    assert out.bytes_sent == 15


async def test_flush_sends_from_the_caller_when_no_writer_runs() -> None:
    sending, receiving = trio.testing.memory_stream_pair()
    out = OutboundBuffer(sending)
    out.write(b"connack")
    await out.flush()
    assert await read_exactly(receiving, 7) == b"connack"
    assert out.bytes_sent == 7


async def test_flush_and_space_with_the_run_task() -> None:
    sending, receiving = trio.testing.memory_stream_pair()
    out = OutboundBuffer(sending, high_water=4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(out.run)
        out.write(b"12345")
        assert not out.has_space
        async with trio.open_nursery() as readers:
            readers.start_soon(read_exactly, receiving, 5)
            await out.wait_space()
            await out.flush()
        assert out.has_space and out.bytes_sent == 5
        nursery.cancel_scope.cancel()


class _HalfSender(trio.abc.SendStream):
    """Writes the first half of what it is given, then waits for room that never comes."""

    def __init__(self) -> None:
        self.written = b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        self.written += bytes(data[: len(data) // 2])
        await trio.sleep_forever()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_a_send_broken_off_halfway_leaves_the_stream_unframed() -> None:
    stream = _HalfSender()
    out = OutboundBuffer(stream)
    out.write(b"0123456789")
    assert not out.unframed
    with trio.move_on_after(0.1):
        await out.flush()
    assert stream.written == b"01234"
    assert out.unframed  # nothing else may follow the half packet


async def test_a_send_cancelled_before_its_first_byte_keeps_the_stream_framed() -> None:
    stream = _HalfSender()
    out = OutboundBuffer(stream)
    out.write(b"0123456789")
    with trio.CancelScope() as scope:
        scope.cancel()
        await out.flush()
    assert stream.written == b""
    assert not out.unframed
