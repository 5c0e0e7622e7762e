"""A per-connection write buffer: batched socket writes and a bound.

Shared by the protocol adapters (MQTT, Pulsar): they write encoded packets here and never call
the stream's `send_all` themselves.

Everything a connection sends is appended here and leaves in as few `send_all` calls as
possible, from one writer at a time: a task the owner runs for the life of the connection
(`run`); or, after `write_from(tasks)`, a task started whenever there is something to send
and ending once all is sent, so that an idle connection holds no writer task at all; or the
task that `add`s bytes and then `push`es them itself, which saves starting one.
Producers of optional traffic (message deliveries) wait for space, so a slow reader makes the
broker keep messages in the subscription's bounded backlog instead of in memory here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from mop.transport.direct import sender


class TaskStarter(Protocol):
    """Where on-demand writers run: a nursery, or a connection's `ConnectionTasks`."""

    def start_soon(self, async_fn: Callable[[], Awaitable[object]], /) -> None: ...


class OutboundBuffer:
    __slots__ = (
        "_broken",
        "_buffer",
        "_data_ready",
        "_drained",
        "_high_water",
        "_nursery",
        "_send",
        "_sending",
        "_stream",
        "_writer",
        "bytes_sent",
    )

    def __init__(self, stream: trio.abc.SendStream, *, high_water: int = 256 * 1024) -> None:
        self._stream = stream
        self._send = sender(stream)  # only ever called by the one writer of the moment
        self._buffer = bytearray()
        self._high_water = high_water
        # Made when first needed: most connections never wait for either.
        self._data_ready: trio.Event | None = None  # `run` waits on it for data
        self._drained: trio.Event | None = None  # set after each send
        self._sending = False  # a `send_all` is in progress
        # A `send_all` was broken off (cancelled, or failed) once it may have begun to write:
        # the stream may end inside a packet.
        self._broken = False
        self._writer = False  # a writer is alive: the `run` task, or an on-demand one
        self._nursery: TaskStarter | None = None
        self.bytes_sent = 0

    def write(self, data: bytes) -> None:
        self._buffer += data
        if self._nursery is not None:
            if not self._writer:
                self._writer = True
                self._nursery.start_soon(self._write_out)
        elif self._data_ready is not None:
            self._data_ready.set()

    def add(self, data: bytes) -> None:
        """`write` for a caller that calls `push` before it next waits for anything: the
        bytes then leave from its own task, without starting a writer."""
        self._buffer += data

    async def push(self) -> None:
        """Send what is buffered from this task, unless a send is under way already (which
        takes it along): returns at once, or once this task's sends are done."""
        if self._writer or self._sending or not self._buffer:
            return
        self._writer = True
        try:
            while self._buffer:
                await self._send_buffered()
        finally:
            self._writer = False

    def write_from(self, nursery: TaskStarter | None) -> None:
        """Send from tasks started in `nursery` (or any `TaskStarter`) when there is data
        (instead of `run`); None when it closes (what is written later waits for `flush`)."""
        self._nursery = nursery
        if nursery is not None and self._buffer and not self._writer:
            self._writer = True
            nursery.start_soon(self._write_out)

    def take(self) -> bytes:
        """Remove and return what is buffered (to send it some other way at shutdown)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    @property
    def unframed(self) -> bool:
        """Whether the stream may end inside a packet: a send is under way, or one was broken
        off. Nothing else may be sent on it then (a DISCONNECT at shutdown, say)."""
        return self._sending or self._broken

    @property
    def has_space(self) -> bool:
        return len(self._buffer) < self._high_water

    async def wait_space(self) -> None:
        while len(self._buffer) >= self._high_water:
            await self._wait_drained()

    async def flush(self) -> None:
        """Wait until everything written so far has been handed to the transport (sending it
        from this task when no writer is there)."""
        while self._buffer or self._sending:
            if self._writer or self._sending:
                await self._wait_drained()
            else:
                await self.push()

    async def _wait_drained(self) -> None:
        if self._drained is None or self._drained.is_set():
            self._drained = trio.Event()
        await self._drained.wait()

    async def _send_buffered(self) -> None:
        # A cancellation that is there already ends the send before its first byte (and the
        # bytes stay buffered); nothing suspends between this and the sender's own check, so
        # a send that raises after it may have written part of the chunk.
        await trio.lowlevel.checkpoint_if_cancelled()
        chunk = bytes(self._buffer)
        self._buffer.clear()
        self._sending = True
        try:
            await self._send(chunk)
        except BaseException:
            self._broken = True
            raise
        finally:
            self._sending = False
        self.bytes_sent += len(chunk)
        if self._drained is not None:
            self._drained.set()

    async def _write_out(self) -> None:
        """An on-demand writer: send until nothing is left (looking once more after a
        checkpoint, as a burst of writes often continues), then end."""
        try:
            while True:
                while self._buffer:
                    await self._send_buffered()
                await trio.lowlevel.checkpoint()
                if not self._buffer:
                    return
        finally:
            self._writer = False

    async def run(self) -> None:
        """The writer task: send whatever has accumulated, forever."""
        self._writer = True
        try:
            while True:
                if not self._buffer:
                    self._data_ready = trio.Event()
                    await self._data_ready.wait()
                await self._send_buffered()
        finally:
            self._writer = False
