"""Running listeners inside a test and the handlers the tests serve with."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from mop.transport import BoundListener, ConnectionInfo, Handler, ListenerSpec, serve_listeners


@asynccontextmanager
async def running(
    specs: Sequence[ListenerSpec], handler: Handler
) -> AsyncIterator[list[BoundListener]]:
    """Serve ``specs`` for the duration of the block and stop afterwards."""
    async with trio.open_nursery() as nursery:
        bound: list[BoundListener] = await nursery.start(serve_listeners, specs, handler)
        yield bound
        nursery.cancel_scope.cancel()


class Recorder:
    """An echo handler that remembers the ConnectionInfo of every connection it served."""

    def __init__(self) -> None:
        self.infos: list[ConnectionInfo] = []

    async def __call__(self, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        self.infos.append(info)
        while data := await stream.receive_some():
            await stream.send_all(data)


async def exchange(stream: trio.abc.Stream, payload: bytes) -> bytes:
    """Send ``payload`` and read until as many bytes came back (or EOF)."""
    await stream.send_all(payload)
    received = bytearray()
    while len(received) < len(payload):
        data = await stream.receive_some()
        if not data:
            break
        received += data
    return bytes(received)
