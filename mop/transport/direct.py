"""Reading and writing a connection's bytes with as little in between as possible.

`receiver(stream)` and `sender(stream)` are `stream.receive_some` and `stream.send_all` with
the same contracts, except for plain TCP, where they use the socket directly: one system call
when the socket is ready, one wait when it is not. trio's general path stacks several frames,
a context manager and a trip through the scheduler on every call, and an idle connection keeps
that stack alive while it waits.

A read waits for the socket to be readable and then makes one read, so that an idle or
lightly loaded connection never pays for a read that finds nothing; only after a read that
filled the whole buffer (more is likely waiting) does the next one try at once, and then it
still passes through the scheduler so that a connection that always has bytes lets others
run. A write tries at once and waits only when the socket is full. Each is a cancellation
point before it does anything and never after, so bytes once read are returned.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import trio

Receive = Callable[[int], Awaitable[bytes | bytearray]]
Send = Callable[[bytes | bytearray | memoryview], Awaitable[None]]


def receiver(stream: trio.abc.ReceiveStream) -> Receive:
    """A function that reads up to `max_bytes` from `stream` like `receive_some(max_bytes)`:
    b"" at the end of the stream, BrokenResourceError when the connection fails and
    ClosedResourceError once the stream is closed."""
    if type(stream) is not trio.SocketStream:
        return stream.receive_some
    return _SocketReceiver(stream.socket)


def read_ready(stream: trio.abc.ReceiveStream, max_bytes: int) -> bytes | None:
    """What plain TCP `stream` has received already (up to `max_bytes`), without waiting:
    None when nothing is there yet or `stream` is not plain TCP (TLS and WebSocket decode
    only as they are read), b"" at the end of the stream. Raises like `receiver`'s reads.
    Not a checkpoint: for a first look before waiting in the usual way."""
    if type(stream) is not trio.SocketStream:
        return None
    return _read(stream.socket, max_bytes)


def sender(stream: trio.abc.SendStream) -> Send:
    """A function that writes all of `data` to `stream` like `send_all(data)`. Unlike
    `send_all` it does not guard against two tasks sending at once: the caller must."""
    if type(stream) is not trio.SocketStream:
        return stream.send_all
    return _SocketSender(stream.socket)


def _descriptor(sock: trio.socket.SocketType) -> int:
    # Looked up on every call: -1 once the socket is closed, so a number that a newer
    # connection reuses is never read or written.
    fd = sock.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the connection was closed")
    return fd


class _SocketReceiver:
    """`receive_some` of one plain TCP socket (see the module's docstring)."""

    __slots__ = ("_filled", "_sock")

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self._sock = sock
        self._filled = False  # the last read filled the caller's buffer

    async def __call__(self, max_bytes: int) -> bytes:
        sock = self._sock
        if self._filled:
            await trio.lowlevel.checkpoint_if_cancelled()
            data = _read(sock, max_bytes)
            if data is not None:
                await trio.lowlevel.cancel_shielded_checkpoint()
                self._filled = len(data) == max_bytes
                return data
        while True:
            # Also a cancellation point when the socket is readable at once.
            await trio.lowlevel.wait_readable(_descriptor(sock))
            data = _read(sock, max_bytes)
            if data is not None:  # None: woken, but another reader was first
                self._filled = len(data) == max_bytes
                return data


def _read(sock: trio.socket.SocketType, max_bytes: int) -> bytes | None:
    """One read: None when nothing is there."""
    try:
        return os.read(_descriptor(sock), max_bytes)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise trio.BrokenResourceError(f"receiving failed: {exc}") from exc


class _SocketSender:
    """`send_all` of one plain TCP socket (see the module's docstring). A slotted object
    rather than a `partial`, which with its arguments tuple costs an idle connection
    three times the memory."""

    __slots__ = ("_sock",)

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self._sock = sock

    async def __call__(self, data: bytes | bytearray | memoryview) -> None:
        sock = self._sock
        await trio.lowlevel.checkpoint_if_cancelled()
        with memoryview(data) as view:
            sent, total = 0, len(view)
            while sent < total:
                try:
                    written: int | None = os.write(_descriptor(sock), view[sent:])
                except BlockingIOError:
                    written = None
                except OSError as exc:
                    raise trio.BrokenResourceError(f"sending failed: {exc}") from exc
                if written is None:
                    await trio.lowlevel.wait_writable(sock)
                    continue
                sent += written
