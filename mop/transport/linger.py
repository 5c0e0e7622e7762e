"""Closing a connection so that the peer reads the last answer: end our side, drain theirs.

A socket closed with bytes unread (what the peer sent after the packet that ended the
connection) makes the system send a reset instead of a FIN, and a peer that gets it may lose
the answer before reading it: a write of its own fails first ("broken pipe"), or its system
drops what it had received.
"""

from __future__ import annotations

import contextlib
from typing import Final

import trio

# How long, and how much of what the peer still sends is read (and dropped) at most.
LINGER_SECONDS: Final = 1.0
LINGER_BYTES: Final = 1 << 20
# How long at most on a stream that cannot end its side (TLS, WebSocket): the peer sees no
# end, so a well-behaved one does not close until it has read the answer itself; only what it
# sent meanwhile needs reading, and waiting the full second would hold the connection's socket
# and task after every refusal.
UNENDED_LINGER_SECONDS: Final = 0.2


async def end_and_drain(
    stream: trio.abc.Stream, *, seconds: float = LINGER_SECONDS, max_bytes: int = LINGER_BYTES
) -> None:
    """End our side of `stream` (a FIN after what was sent, where it can half-close) and read,
    and drop, what the peer still sends until it closes: `seconds` (`UNENDED_LINGER_SECONDS`
    at most where the stream cannot half-close) and `max_bytes` at most. The caller then
    closes the stream as usual. Never raises for a broken connection."""
    if not isinstance(stream, trio.abc.HalfCloseableStream):
        seconds = min(seconds, UNENDED_LINGER_SECONDS)
    with (
        trio.move_on_after(seconds),
        contextlib.suppress(
            trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError, OSError
        ),
    ):
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await stream.send_eof()
        drained = 0
        while drained < max_bytes:
            data = await stream.receive_some(65536)
            if not data:
                break
            drained += len(data)
