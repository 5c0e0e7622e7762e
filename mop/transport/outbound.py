"""A per-connection write buffer with one writer task: batched socket writes and a bound.

Shared by the protocol adapters (MQTT, Pulsar): they write encoded packets here and never call
the stream's `send_all` themselves.

Everything a connection sends is appended here and leaves in as few `send_all` calls as
possible. Producers of optional traffic (message deliveries) wait for space, so a slow reader
makes the broker keep messages in the subscription's bounded backlog instead of in memory here.
"""

from __future__ import annotations

import trio


class OutboundBuffer:
    def __init__(self, stream: trio.abc.SendStream, *, high_water: int = 256 * 1024) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._high_water = high_water
        self._data_ready = trio.Event()
        self._drained = trio.Event()
        self._sending = False
        self.bytes_sent = 0

    def write(self, data: bytes) -> None:
        self._buffer += data
        self._data_ready.set()

    def take(self) -> bytes:
        """Remove and return what is buffered (to send it some other way at shutdown)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    @property
    def has_space(self) -> bool:
        return len(self._buffer) < self._high_water

    async def wait_space(self) -> None:
        while len(self._buffer) >= self._high_water:
            await self._wait_drained()

    async def flush(self) -> None:
        """Wait until everything written so far has been handed to the transport."""
        while self._buffer or self._sending:
            await self._wait_drained()

    async def _wait_drained(self) -> None:
        if self._drained.is_set():
            self._drained = trio.Event()
        await self._drained.wait()

    async def run(self) -> None:
        """The writer task: send whatever has accumulated, forever."""
        while True:
            if not self._buffer:
                self._data_ready = trio.Event()
                await self._data_ready.wait()
            chunk = bytes(self._buffer)
            self._buffer.clear()
            self._sending = True
            try:
                await self._stream.send_all(chunk)
            finally:
                self._sending = False
            self.bytes_sent += len(chunk)
            self._drained.set()
