"""Reading and writing a connection's bytes with as little in between as possible.

`receiver(stream)` and `sender(stream)` are `stream.receive_some` and `stream.send_all` with
the same contracts, except for plain TCP, where they use the socket directly: one system call
when the socket is ready, one wait when it is not. trio's general path stacks several frames,
a context manager and a trip through the scheduler on every call, and an idle connection keeps
that stack alive while it waits.

A direct call passes through the scheduler only when it has to wait, or (a read) when bytes
were there at once, so that a connection that always has bytes still lets others run. Each is
a cancellation point before it does anything and never after, so bytes once read are returned.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from functools import partial

import trio

Receive = Callable[[int], Awaitable[bytes | bytearray]]
Send = Callable[[bytes | bytearray | memoryview], Awaitable[None]]


def receiver(stream: trio.abc.ReceiveStream) -> Receive:
    """A function that reads up to `max_bytes` from `stream` like `receive_some(max_bytes)`:
    b"" at the end of the stream, BrokenResourceError when the connection fails and
    ClosedResourceError once the stream is closed."""
    if type(stream) is not trio.SocketStream:
        return stream.receive_some
    return partial(_receive, stream.socket)


def sender(stream: trio.abc.SendStream) -> Send:
    """A function that writes all of `data` to `stream` like `send_all(data)`. Unlike
    `send_all` it does not guard against two tasks sending at once: the caller must."""
    if type(stream) is not trio.SocketStream:
        return stream.send_all
    return partial(_send, stream.socket)


def _descriptor(sock: trio.socket.SocketType) -> int:
    # Looked up on every call: -1 once the socket is closed, so a number that a newer
    # connection reuses is never read or written.
    fd = sock.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the connection was closed")
    return fd


async def _receive(sock: trio.socket.SocketType, max_bytes: int) -> bytes:
    await trio.lowlevel.checkpoint_if_cancelled()
    waited = False
    while True:
        try:
            data = os.read(_descriptor(sock), max_bytes)
        except BlockingIOError:
            data = None  # wait outside the handler: it would keep the exception alive
        except OSError as exc:
            raise trio.BrokenResourceError(f"receiving failed: {exc}") from exc
        if data is None:
            await trio.lowlevel.wait_readable(sock)
            waited = True
            continue
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data


async def _send(sock: trio.socket.SocketType, data: bytes | bytearray | memoryview) -> None:
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
