"""WebSocket as a byte stream (MQTT over WebSocket): wsproto drives the protocol, this module
moves its bytes over an inner trio stream and hides message boundaries from the layer above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from http import HTTPStatus
from types import TracebackType
from typing import NoReturn
from urllib.parse import urlsplit

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

__all__ = ["WebSocketHandshakeError", "WebSocketStream", "accept_websocket"]

# Handshake reads are small: the whole request must fit in h11's 16 KiB header limit anyway.
_HANDSHAKE_READ_SIZE = 4096
# Upper bound on one read from the inner stream, and therefore on what this stream buffers:
# the buffer is refilled only when empty and frames are never reassembled into messages.
DEFAULT_RECEIVE_SIZE = 65536
# A close frame is a courtesy; a peer that does not read must not hold up aclose().
_CLOSE_FRAME_TIMEOUT = 1.0


class WebSocketHandshakeError(Exception):
    """The peer's opening handshake was refused (``status`` is the HTTP answer sent) or broke
    off (``status`` is None)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _OneTaskAtATime:
    """Raise ``trio.BusyResourceError`` when two tasks use the same direction at once, as every
    trio stream does."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._busy = False

    def __enter__(self) -> None:
        if self._busy:
            raise trio.BusyResourceError(f"another task is already {self._what} this WebSocket")
        self._busy = True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._busy = False


class WebSocketStream(trio.abc.Stream):
    """A byte stream carried in binary WebSocket messages over ``transport_stream``.

    ``send_all`` sends one binary message. ``receive_some`` returns the payload bytes of binary
    messages in order, with no regard for message or frame boundaries (an MQTT packet may span
    frames, a frame may hold several packets). Pings are answered while receiving. A close
    frame from the peer, or the peer dropping the connection, reads as end of stream (``b""``).
    A text frame or a malformed frame is a protocol error: the WebSocket is closed with the
    matching close code and ``receive_some`` raises ``trio.BrokenResourceError``.

    Memory stays bounded whatever the peer sends: the inner stream is read only when the
    buffer is empty, ``receive_size`` bytes at a time, and frames are never reassembled.

    Half-closing is not supported (a WebSocket close ends both directions), so this is a
    ``Stream`` and not a ``HalfCloseableStream``. Build one with :func:`accept_websocket`.
    """

    def __init__(
        self,
        transport_stream: trio.abc.Stream,
        connection: WSConnection,
        *,
        subprotocol: str | None,
        path: str,
        receive_size: int = DEFAULT_RECEIVE_SIZE,
    ) -> None:
        if connection.state is not ConnectionState.OPEN:
            raise ValueError("the WebSocket connection must have completed its handshake")
        if receive_size < 1:
            raise ValueError("receive_size must be at least 1")
        self.transport_stream = transport_stream
        self.subprotocol = subprotocol
        self.path = path
        self._ws = connection
        self._receive_size = receive_size
        self._buffer = bytearray()
        self._eof = False
        self._failure: str | None = None
        self._closed = False
        # Pongs and close replies are sent from the receiving task while another task may be in
        # send_all; one lock keeps whole frames from interleaving on the wire.
        self._send_lock = trio.StrictFIFOLock()
        self._send_guard = _OneTaskAtATime("sending on")
        self._receive_guard = _OneTaskAtATime("receiving from")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with self._send_guard:
            if self._closed:
                raise trio.ClosedResourceError("this WebSocket was closed")
            if not data:
                await trio.lowlevel.checkpoint()
                return
            async with self._send_lock:
                if self._ws.state is not ConnectionState.OPEN:
                    raise trio.BrokenResourceError(f"the WebSocket is {self._ws.state.name}")
                await self.transport_stream.send_all(self._ws.send(BytesMessage(data=bytes(data))))

    async def wait_send_all_might_not_block(self) -> None:
        with self._send_guard:
            if self._closed:
                raise trio.ClosedResourceError("this WebSocket was closed")
            # The inner stream allows one sender at a time, pongs included.
            async with self._send_lock:
                await self.transport_stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        with self._receive_guard:
            if self._closed:
                raise trio.ClosedResourceError("this WebSocket was closed")
            if self._buffer or self._eof or self._failure is not None:
                await trio.lowlevel.checkpoint()
            else:
                await self._fill_buffer()
            if self._failure is not None:
                raise trio.BrokenResourceError(self._failure)
            size = len(self._buffer) if max_bytes is None else min(max_bytes, len(self._buffer))
            chunk = bytes(self._buffer[:size])
            del self._buffer[:size]
            return chunk

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            # While another task is mid-frame the wire cannot take a close frame; skip it.
            if not self._send_lock.locked():
                with trio.move_on_after(_CLOSE_FRAME_TIMEOUT):
                    await self._send_event(CloseConnection(code=CloseReason.NORMAL_CLOSURE))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await self.transport_stream.aclose()

    async def _fill_buffer(self) -> None:
        while not self._buffer and not self._eof and self._failure is None:
            data = await self.transport_stream.receive_some(self._receive_size)
            if not data:
                # Dropped without a close frame (code 1006); to the layer above that is EOF.
                self._eof = True
                return
            self._ws.receive_data(bytes(data))
            # Parse the whole chunk before awaiting anything (a pong), so that the sending task
            # never finds wsproto halfway through a parse.
            for event in list(self._ws.events()):
                await self._handle_event(event)
                if self._eof or self._failure is not None:
                    return

    async def _handle_event(self, event: Event) -> None:
        if isinstance(event, BytesMessage):
            self._buffer += event.data
        elif isinstance(event, Ping):
            await self._send_event(event.response())
        elif isinstance(event, TextMessage):
            self._failure = "the peer sent a text frame; only binary frames carry the stream"
            await self._send_close_quietly(CloseConnection(code=CloseReason.UNSUPPORTED_DATA))
        elif isinstance(event, CloseConnection):
            self._eof = True
            if self._ws.state is ConnectionState.OPEN:
                # wsproto reports a frame it could not parse as a close event while the
                # connection is still open; the code says what was wrong.
                self._failure = f"WebSocket protocol error: {event.reason} ({event.code})"
                await self._send_close_quietly(CloseConnection(event.code, event.reason))
            elif self._ws.state is ConnectionState.REMOTE_CLOSING:
                await self._send_close_quietly(event.response())
        # Pong needs no answer; wsproto never yields the remaining event types after the handshake.

    async def _send_event(self, event: Event) -> None:
        async with self._send_lock:
            try:
                data = self._ws.send(event)
            except LocalProtocolError:
                # The state moved on (for example our close went out first); nothing to send.
                return
            await self.transport_stream.send_all(data)

    async def _send_close_quietly(self, event: CloseConnection) -> None:
        # The peer may be gone already; the receiving side reports what matters.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self._send_event(event)


async def accept_websocket(
    stream: trio.abc.Stream,
    *,
    path: str | None = None,
    subprotocols: Sequence[str] = (),
    receive_size: int = DEFAULT_RECEIVE_SIZE,
) -> WebSocketStream:
    """Run the server side of the opening handshake on ``stream`` and return the WebSocket.

    ``path`` None accepts any request path, otherwise other paths get HTTP 404 (the query
    string is ignored). The server chooses the first of ``subprotocols`` that the client
    offers; a client offering only others gets HTTP 400, a client offering none is accepted
    without a subprotocol (lenient towards MQTT clients that omit it), and so is everyone
    when ``subprotocols`` is empty. Extensions such as permessage-deflate are never accepted.

    The handshake waits for the client as long as it takes: bound it with ``trio.fail_after``.
    Raises ``WebSocketHandshakeError`` when the request is refused or malformed (the HTTP
    answer has been sent). On failure the caller still owns ``stream`` and must close it.
    """
    connection = WSConnection(ConnectionType.SERVER)
    request = await _receive_request(stream, connection)
    request_path = urlsplit(request.target).path
    if path is not None and request_path != path:
        await _refuse(stream, HTTPStatus.NOT_FOUND, f"no WebSocket endpoint at {request_path}")
    subprotocol = _choose_subprotocol(request.subprotocols, subprotocols)
    if subprotocol is None and request.subprotocols and subprotocols:
        await _refuse(
            stream,
            HTTPStatus.BAD_REQUEST,
            f"none of the offered subprotocols is supported; use one of {list(subprotocols)}",
        )
    await stream.send_all(connection.send(AcceptConnection(subprotocol=subprotocol)))
    return WebSocketStream(
        stream, connection, subprotocol=subprotocol, path=request_path, receive_size=receive_size
    )


async def _receive_request(stream: trio.abc.Stream, connection: WSConnection) -> Request:
    while True:
        data = await stream.receive_some(_HANDSHAKE_READ_SIZE)
        if not data:
            raise WebSocketHandshakeError("the peer closed the connection during the handshake")
        try:
            connection.receive_data(bytes(data))
            for event in connection.events():
                if isinstance(event, Request):
                    return event
        except RemoteProtocolError as exc:
            # wsproto suggests the answer, e.g. 426 with the supported version.
            hint = exc.event_hint
            if isinstance(hint, RejectConnection):
                await _refuse(stream, HTTPStatus(hint.status_code), str(exc), hint.headers)
            await _refuse(stream, HTTPStatus.BAD_REQUEST, str(exc))
        except UnicodeError as exc:
            # wsproto decodes some headers (Host as IDNA, others as ASCII) without checking.
            await _refuse(stream, HTTPStatus.BAD_REQUEST, f"undecodable header: {exc}")


def _choose_subprotocol(offered: Sequence[str], supported: Sequence[str]) -> str | None:
    return next((name for name in supported if name in offered), None)


async def _refuse(
    stream: trio.abc.Stream,
    status: HTTPStatus,
    reason: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> NoReturn:
    """Answer a refused upgrade with a plain HTTP response and raise.

    The response is written directly rather than through wsproto because after a malformed
    request its HTTP state machine may no longer allow a response.
    """
    body = f"{reason}\n".encode()
    head = [
        f"HTTP/1.1 {status.value} {status.phrase}".encode(),
        b"Content-Type: text/plain; charset=utf-8",
        b"Content-Length: " + str(len(body)).encode(),
        b"Connection: close",
        *(name + b": " + value for name, value in headers),
    ]
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(b"\r\n".join(head) + b"\r\n\r\n" + body)
    raise WebSocketHandshakeError(f"refused with HTTP {status.value}: {reason}", status=status)
