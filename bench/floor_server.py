"""The floor of an MQTT connection on trio: a server that accepts, reads CONNECT and answers
CONNACK, then holds the connection (answering PINGREQ) until the client goes, and nothing else:
no authentication, no session, no client id. What the bench measures of it in the connection
scenarios (connects/s, resident memory per idle connection) is the least any trio broker on
this machine could reach, next to which mop's numbers are read.

    python bench/floor_server.py PORT

It stops on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import signal
import sys
from functools import partial

import trio

CONNECT, PINGREQ, DISCONNECT = 1, 12, 14
CONNACK = b"\x20\x02\x00\x00"  # session not present, accepted
PINGRESP = b"\xd0\x00"
READ_SIZE = 4096
# A remaining length takes at most 4 bytes after the first byte of the fixed header.
MAX_HEADER = 5


class Malformed(Exception):
    """The peer sent something that is not MQTT framing."""


def next_packet(data: bytes) -> tuple[int, int] | None:
    """(packet type, length of the whole packet) of the packet at the start of `data`, None
    when it has not all arrived yet."""
    length = shift = 0
    for index in range(1, min(len(data), MAX_HEADER)):
        byte = data[index]
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            end = index + 1 + length
            return (data[0] >> 4, end) if len(data) >= end else None
        shift += 7
    if len(data) >= MAX_HEADER:
        raise Malformed("remaining length longer than 4 bytes")
    return None


async def serve_client(stream: trio.SocketStream) -> None:
    pending = b""
    try:
        while data := await stream.receive_some(READ_SIZE):
            pending += data
            while (packet := next_packet(pending)) is not None:
                kind, end = packet
                pending = pending[end:]
                if kind == CONNECT:
                    await stream.send_all(CONNACK)
                elif kind == PINGREQ:
                    await stream.send_all(PINGRESP)
                elif kind == DISCONNECT:
                    return
    except (trio.BrokenResourceError, trio.ClosedResourceError, Malformed):
        return


async def main(port: int) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, serve_client, port, host="127.0.0.1"))
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    trio.run(main, int(sys.argv[1]))
