"""Whatever a peer sends, the WebSocket layer answers with its own errors, never with a crash."""

from __future__ import annotations

import contextlib

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto.frame_protocol import FrameProtocol

from mop.transport import WebSocketHandshakeError, accept_websocket

UPGRADE = (
    b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: mqtt\r\n\r\n"
)


def header_lines() -> st.SearchStrategy[bytes]:
    names = st.sampled_from(
        [b"Host", b"Upgrade", b"Connection", b"Sec-WebSocket-Key", b"Sec-WebSocket-Version",
         b"Sec-WebSocket-Protocol", b"Sec-WebSocket-Extensions", b"X-Other"]
    )  # fmt: skip
    values = st.binary(max_size=40).map(lambda v: v.replace(b"\r", b"").replace(b"\n", b""))
    return st.tuples(names, values).map(lambda pair: pair[0] + b": " + pair[1])


@settings(max_examples=300, deadline=None)
@given(
    target=st.sampled_from([b"/mqtt", b"/", b"*", b"http://h/mqtt", b"/mqtt?x=\xff"]),
    headers=st.lists(header_lines(), max_size=8),
    tail=st.binary(max_size=20),
)
def test_any_request_is_accepted_or_refused(
    target: bytes, headers: list[bytes], tail: bytes
) -> None:
    request = b"GET " + target + b" HTTP/1.1\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + tail

    async def main() -> None:
        client, server = trio.testing.memory_stream_pair()
        await client.send_all(request)
        await client.send_eof()
        with contextlib.suppress(WebSocketHandshakeError):
            await accept_websocket(server, path="/mqtt", subprotocols=("mqtt",))

    trio.run(main)


def client_frames() -> st.SearchStrategy[bytes]:
    """Well-formed masked client frames of every kind, and some noise."""
    kinds = st.sampled_from(["binary", "binary-part", "text", "ping", "pong", "close", "noise"])
    return st.tuples(kinds, st.binary(max_size=200)).map(lambda pair: _frame(*pair))


def _frame(kind: str, payload: bytes) -> bytes:
    frames = FrameProtocol(client=True, extensions=[])
    if kind == "binary":
        return bytes(frames.send_data(payload, fin=True))
    if kind == "binary-part":
        return bytes(frames.send_data(payload, fin=False))
    if kind == "text":
        return bytes(frames.send_data(payload.decode("latin-1"), fin=True))
    if kind == "ping":
        return bytes(frames.ping(payload[:125]))
    if kind == "pong":
        return bytes(frames.pong(payload[:125]))
    if kind == "close":
        return bytes(frames.close(1000, None))
    return payload


@settings(max_examples=300, deadline=None)
@given(st.lists(client_frames(), max_size=8), st.integers(min_value=1, max_value=50))
def test_any_frames_read_as_data_eof_or_broken(frames: list[bytes], piece: int) -> None:
    wire = b"".join(frames)

    async def main() -> None:
        client, server = trio.testing.memory_stream_pair()
        await client.send_all(UPGRADE)
        websocket = await accept_websocket(server, path="/mqtt", subprotocols=("mqtt",))
        for start in range(0, len(wire), piece):
            await client.send_all(wire[start : start + piece])
        await client.send_eof()
        try:
            while await websocket.receive_some():
                pass
        except trio.BrokenResourceError:
            pass
        await websocket.aclose()

    trio.run(main)
