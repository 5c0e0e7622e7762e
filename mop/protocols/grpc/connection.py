"""The server side of one gRPC connection as a pure state machine over h2's `H2Connection`.

`receive_data(bytes)` turns what the client sent into call events (a call started, a message,
the client's half-close, a call that is gone, windows that opened, the connection's end);
`taken`, `send_message`, `end_call`, `ping` and `drain` do the sending, and
`data_to_send()` gives the bytes to write. Nothing here does I/O or knows the time: the trio
server (`serving.server`) carries out the calls and the timers.

Flow control: the bytes of a request message are given back to the client's window only when
the handler takes the message (`taken`), so a handler that stops reading back-pressures its
client. A message larger than half the stream's window could never arrive that way: once the
handler has taken every message before it, the bytes of one are given back as they come, out of
a budget of two messages of the largest size for the whole connection (repaid as the handlers
take them). A connection therefore buffers at most its streams' windows plus that budget, and
the connection's window leaves each stream its own share so that one stalled call never
starves the others. Response messages are split to the
client's window and the largest frame it takes; the rest waits for a WINDOW_UPDATE
(`WindowOpened`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any, Final

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from mop.protocols.grpc.framing import PREFIX_SIZE, MessageDecoder, encode_message
from mop.protocols.grpc.headers import (
    Request,
    RequestRefused,
    read_request,
    refusal_headers,
    response_headers,
    trailers,
)
from mop.protocols.grpc.status import GrpcError, StatusCode

__all__ = [
    "CallAborted",
    "CallStarted",
    "ClientHalfClosed",
    "ConnectionEnded",
    "ConnectionLimits",
    "Event",
    "GrpcServerConnection",
    "MessageReceived",
    "PingAnswered",
    "WindowOpened",
]

_MAX_STREAM_ID: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What the server announces in its SETTINGS and enforces."""

    max_concurrent_streams: int = 100
    # Each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE): what a call may buffer in
    # whole messages its handler has not taken yet. HTTP/2's default: a connection whose
    # calls all stop reading holds about this times max_concurrent_streams (6.5 MB at 100),
    # and at most one message too large for the window per call.
    stream_window: int = 65535
    max_frame_size: int = 16384
    # The largest header block (HPACK-decoded) a request may carry.
    max_header_list_size: int = 16384
    max_message_bytes: int = 5 * 1024 * 1024


# --- events ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallStarted:
    stream_id: int
    request: Request


@dataclass(frozen=True, slots=True)
class MessageReceived:
    stream_id: int
    message: bytes
    # What to pass to `taken` once the handler has taken the message.
    flow_length: int


@dataclass(frozen=True, slots=True)
class ClientHalfClosed:
    """The client sent all its messages."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class CallAborted:
    """The call is over before its handler ended it: the client reset the stream (CANCELLED),
    or it broke the framing and the server has already answered with `code`."""

    stream_id: int
    code: StatusCode
    message: str


@dataclass(frozen=True, slots=True)
class WindowOpened:
    """The client opened its windows (or the settings changed): sends waiting may go on."""


@dataclass(frozen=True, slots=True)
class PingAnswered:
    """The answer to the server's `ping`."""


@dataclass(frozen=True, slots=True)
class ConnectionEnded:
    """No more calls: the client sent GOAWAY, or it broke HTTP/2 and the server sent one
    with `error_code` (to be written before closing)."""

    error_code: int
    reason: str


Event = (
    CallStarted
    | MessageReceived
    | ClientHalfClosed
    | CallAborted
    | WindowOpened
    | PingAnswered
    | ConnectionEnded
)


@dataclass(slots=True)
class _Stream:
    decoder: MessageDecoder | None
    # Framed response bytes not handed to h2 yet (waiting for the window).
    outbound: bytearray = field(default_factory=bytearray)
    headers_sent: bool = False
    # The trailers to send once `outbound` is out; set by `end_call`.
    trailers: list[tuple[str, str]] | None = None
    # The server has ended the call (trailers sent or queued).
    ended: bool = False
    client_closed: bool = False
    # Received bytes of the message not complete yet that have not gone back to the window.
    partial_flow: int = 0
    # Messages received and not taken by the handler yet.
    untaken: int = 0
    # The budget held for the message being received (all of it, from its prefix), the part
    # of it already given back early (`_lend`), and what was given back early for received
    # messages not taken yet; it all returns to the connection's budget once taken.
    reserved: int = 0
    lent_partial: int = 0
    lent_queued: int = 0


class GrpcServerConnection:
    """One client connection's HTTP/2 and gRPC state (server side)."""

    def __init__(self, limits: ConnectionLimits, methods: Container[str]) -> None:
        self._limits = limits
        self._methods = methods
        self._h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=False,
                # Metadata values may be any octets; latin-1 decodes every one of them.
                header_encoding="latin-1",
            )
        )
        self._streams: dict[int, _Stream] = {}
        # What may be given back early, on all the calls together, for messages too large for
        # a stream's window (two of the largest: one arriving while one waits to be taken).
        self._lendable = 2 * (PREFIX_SIZE + limits.max_message_bytes)
        self._draining = False
        self._ended = False
        # Bytes the server frames itself (the first GOAWAY of a drain), after h2's.
        self._extra = b""

    # --- setup and input -----------------------------------------------------------------------

    def initiate(self) -> None:
        """Queue the server's connection preface (its SETTINGS) and widen the connection's
        receive window so that each stream may fill its own."""
        limits = self._limits
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: limits.max_frame_size,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
                h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL: 0,
            },
        )
        # Values given at construction count as acknowledged, so h2 does not apply them to
        # what it reads itself: the header list limit (what fuzzers try first) and the frame
        # size are set here.
        self._h2.decoder.max_header_list_size = limits.max_header_list_size
        self._h2.max_inbound_frame_size = limits.max_frame_size
        self._h2.initiate_connection()
        # The connection window starts at 65535 whatever the settings say.
        shared = limits.stream_window * limits.max_concurrent_streams
        self._h2.increment_flow_control_window(min(shared, _MAX_STREAM_ID - 65535))

    def receive_data(self, data: bytes) -> list[Event]:
        """The call events in `data`. After `ConnectionEnded` there are no more."""
        if self._ended:
            return []
        try:
            h2_events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._ended = True
            code = int(getattr(exc, "error_code", h2.errors.ErrorCodes.PROTOCOL_ERROR))
            # h2 queues a GOAWAY for errors in frames, not for a connection that does not
            # start with the HTTP/2 preface (an HTTP/1.1 request, say).
            if self._h2.state_machine.state != h2.connection.ConnectionState.CLOSED:
                self._h2.close_connection(error_code=code)
            return [ConnectionEnded(code, f"HTTP/2 protocol error: {exc}")]
        events: list[Event] = []
        for h2_event in h2_events:
            events.extend(self._on_event(h2_event))
        return events

    def data_to_send(self) -> bytes:
        data = self._h2.data_to_send() + self._extra
        self._extra = b""
        return data

    # --- the calls -----------------------------------------------------------------------------

    def send_message(self, stream_id: int, message: bytes) -> None:
        """Queue a response message (after the response headers, sent once); it goes out as
        the client's windows allow (`pending`)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.ended or self._ended:
            return
        if len(message) > self._limits.max_message_bytes:
            raise GrpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"response message of {len(message)} bytes is larger than the limit of"
                f" {self._limits.max_message_bytes} bytes",
            )
        stream.outbound += encode_message(message)
        self._flush(stream_id, stream)

    def pending(self, stream_id: int) -> int:
        """Response bytes of the call still waiting for the client's window (0 when the call
        is gone)."""
        stream = self._streams.get(stream_id)
        return 0 if stream is None else len(stream.outbound)

    def end_call(self, stream_id: int, code: StatusCode, message: str = "") -> None:
        """End the call with its status: trailers after the queued messages, or a
        trailers-only response when it sent none. A client still sending is asked to stop
        (RST_STREAM NO_ERROR) once the trailers are out."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.ended or self._ended:
            return
        stream.ended = True
        # The rest of a message no one will read.
        self._give_back(stream_id, stream.partial_flow)
        stream.partial_flow = 0
        self._repay(stream)
        stream.trailers = trailers(code, message, trailers_only=not stream.headers_sent)
        self._flush(stream_id, stream)

    def taken(self, stream_id: int, flow_length: int) -> None:
        """The handler took one message (`MessageReceived`) of the call, or will never take
        it (the call is over): its bytes go back to the client's windows."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.untaken -= 1
            if stream.untaken <= 0 and stream.lent_queued:
                self._lendable += stream.lent_queued
                stream.lent_queued = 0
                self._lend_where_waiting()
            # The large message the client is sending may arrive now.
            flow_length += self._lend(stream)
        self._give_back(stream_id, flow_length)

    def _lend(self, stream: _Stream) -> int:
        """The bytes of the message being received that go back now, though the handler has
        not taken it: it is too large to arrive within the window, the handler has taken every
        message before it, and the connection's budget has them. 0 otherwise."""
        lent = stream.partial_flow
        if stream.untaken > 0 or lent <= self._limits.stream_window // 2:
            return 0
        if not stream.reserved:
            # The whole message at once: budgets handed out by the piece could leave every
            # large message part-way, and none able to finish.
            size = stream.decoder.message_size if stream.decoder is not None else None
            if size is None or size > self._lendable:
                return 0
            self._lendable -= size
            stream.reserved = size
        stream.lent_partial += lent
        stream.partial_flow = 0
        return lent

    def _repay(self, stream: _Stream) -> None:
        """Return to the budget what a call that is over had been lent."""
        if stream.reserved or stream.lent_queued:
            self._lendable += stream.reserved + stream.lent_queued
            stream.reserved = stream.lent_partial = stream.lent_queued = 0
            self._lend_where_waiting()

    def _lend_where_waiting(self) -> None:
        """Lend to the calls whose large message waited for the budget."""
        for stream_id, stream in list(self._streams.items()):
            if not stream.ended:
                self._give_back(stream_id, self._lend(stream))

    def _give_back(self, stream_id: int, flow_length: int) -> None:
        if flow_length > 0 and not self._ended:
            self._h2.acknowledge_received_data(flow_length, stream_id)

    @property
    def open_calls(self) -> int:
        return len(self._streams)

    # --- the connection ------------------------------------------------------------------------

    def ping(self, payload: bytes) -> None:
        """Send a PING (8 bytes); its answer is `PingAnswered`."""
        if not self._ended:
            self._h2.ping(payload)

    def drain(self) -> None:
        """Take no more calls: a GOAWAY (NO_ERROR) names the last call the server takes; the
        calls up to it go on. Calls the client opens meanwhile are refused (REFUSED_STREAM,
        which clients retry elsewhere)."""
        if self._draining or self._ended:
            return
        self._draining = True
        goaway = GoAwayFrame(0)
        goaway.last_stream_id = self._h2.highest_inbound_stream_id
        goaway.error_code = h2.errors.ErrorCodes.NO_ERROR
        # h2 would take no more frames of the running calls after its own GOAWAY, so the
        # first one is framed here; `close` sends h2's final one.
        self._h2_flush_then(goaway.serialize())

    def close(self, error_code: int = h2.errors.ErrorCodes.NO_ERROR) -> None:
        """End the connection with a GOAWAY (once)."""
        if self._ended:
            return
        self._ended = True
        self._h2.close_connection(error_code=error_code)

    @property
    def ended(self) -> bool:
        return self._ended

    # --- internals -----------------------------------------------------------------------------

    def _h2_flush_then(self, frame: bytes) -> None:
        self._extra = self._h2.data_to_send() + self._extra + frame

    def _on_event(self, event: h2.events.Event) -> list[Event]:
        handler = _H2_EVENTS.get(type(event))
        # Settings acknowledged, PINGs h2 answers itself, priority, trailers of a request
        # (gRPC requests have none worth reading): nothing for the calls.
        return [] if handler is None else handler(self, event)

    def _on_window(self, event: h2.events.Event) -> list[Event]:
        for stream_id, stream in list(self._streams.items()):
            self._flush(stream_id, stream)
        return [WindowOpened()]

    def _on_ping_ack(self, event: h2.events.Event) -> list[Event]:
        return [PingAnswered()]

    def _on_goaway(self, event: h2.events.ConnectionTerminated) -> list[Event]:
        self._ended = True
        code = int(event.error_code or 0)
        return [ConnectionEnded(code, f"the client sent GOAWAY ({code})")]

    def _on_request(self, event: h2.events.RequestReceived) -> list[Event]:
        stream_id = event.stream_id
        if self._draining:
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return []
        try:
            request = read_request((str(name), str(value)) for name, value in event.headers or ())
        except RequestRefused as refused:
            self._refuse(stream_id, refusal_headers(refused))
            return []
        if request.method not in self._methods:
            self._refuse(
                stream_id,
                trailers(
                    StatusCode.UNIMPLEMENTED,
                    f"unknown method {request.method}",
                    trailers_only=True,
                ),
            )
            return []
        decoder = MessageDecoder(self._limits.max_message_bytes, request.encoding)
        self._streams[stream_id] = _Stream(decoder)
        return [CallStarted(stream_id, request)]

    def _refuse(self, stream_id: int, headers: list[tuple[str, str]]) -> None:
        stream = _Stream(None, headers_sent=True, ended=True, trailers=headers)
        self._streams[stream_id] = stream
        self._flush(stream_id, stream)

    def _on_data(self, event: h2.events.DataReceived) -> list[Event]:
        stream_id = event.stream_id
        data = event.data or b""
        flow = event.flow_controlled_length or 0
        stream = self._streams.get(stream_id)
        if stream is None or stream.ended or stream.decoder is None:
            self._give_back(stream_id, flow)
            return []
        try:
            messages = stream.decoder.feed(data)
        except GrpcError as exc:
            self._give_back(stream_id, flow + stream.partial_flow)
            stream.partial_flow = 0
            return self._abort(stream_id, stream, exc.code, exc.message)
        # Padding goes back at once. The bytes of this frame that complete messages go back
        # with the last of them, as the handler takes it; those that begin the next message
        # wait for it, unless `_lend` lets them go back early.
        tail = min(stream.decoder.buffered, len(data))
        padding = flow - len(data)
        events: list[Event] = []
        if messages:
            held = stream.partial_flow + len(data) - tail
            stream.partial_flow = 0
            for message in messages[:-1]:
                events.append(MessageReceived(stream_id, message, 0))
            events.append(MessageReceived(stream_id, messages[-1], held))
            stream.untaken += len(messages)
            # The message lent to is complete: what of its budget was not used goes back.
            self._lendable += stream.reserved - stream.lent_partial
            stream.lent_queued += stream.lent_partial
            stream.reserved = stream.lent_partial = 0
        stream.partial_flow += tail
        self._give_back(stream_id, padding + self._lend(stream))
        return events

    def _on_stream_ended(self, event: h2.events.StreamEnded) -> list[Event]:
        stream_id = event.stream_id
        stream = self._streams.get(stream_id)
        if stream is None:
            return []
        stream.client_closed = True
        if stream.ended:
            self._forget_if_done(stream_id, stream)
            return []
        if stream.decoder is not None and stream.decoder.buffered:
            return self._abort(
                stream_id, stream, StatusCode.INTERNAL, "the last request message is truncated"
            )
        return [ClientHalfClosed(stream_id)]

    def _on_reset(self, event: h2.events.StreamReset) -> list[Event]:
        stream = self._streams.pop(event.stream_id, None)
        if stream is None:
            return []
        self._give_back(event.stream_id, stream.partial_flow)
        self._repay(stream)
        if stream.ended:
            return []
        code = int(event.error_code or 0)
        return [CallAborted(event.stream_id, StatusCode.CANCELLED, f"reset by the client ({code})")]

    def _abort(
        self, stream_id: int, stream: _Stream, code: StatusCode, message: str
    ) -> list[Event]:
        self.end_call(stream_id, code, message)
        return [CallAborted(stream_id, code, message)]

    def _flush(self, stream_id: int, stream: _Stream) -> None:
        """Hand h2 what the windows allow of the stream's messages (after the response
        headers, once), then its trailers."""
        if self._ended:
            return
        try:
            self._send_ready(stream_id, stream)
        except h2.exceptions.StreamClosedError:
            # h2 closed the stream (the client reset it): nothing more goes out on it.
            self._streams.pop(stream_id, None)

    def _send_ready(self, stream_id: int, stream: _Stream) -> None:
        if stream.outbound and not stream.headers_sent:
            self._h2.send_headers(stream_id, response_headers())
            stream.headers_sent = True
        while stream.outbound:
            window = self._h2.local_flow_control_window(stream_id)
            size = min(window, self._h2.max_outbound_frame_size, len(stream.outbound))
            if size <= 0:
                return
            self._h2.send_data(stream_id, bytes(stream.outbound[:size]))
            del stream.outbound[:size]
        if stream.trailers is not None:
            self._h2.send_headers(stream_id, stream.trailers, end_stream=True)
            stream.trailers = None
            if not stream.client_closed:
                # The call is over; the client need not send the rest of its messages.
                stream.client_closed = True
                # h2 may know already that the client has sent all (its END_STREAM is in the
                # data being read): then the stream is closed and there is nothing to reset.
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
            self._forget_if_done(stream_id, stream)

    def _forget_if_done(self, stream_id: int, stream: _Stream) -> None:
        if stream.ended and stream.client_closed and stream.trailers is None:
            self._streams.pop(stream_id, None)


# What each h2 event means for the calls (`GrpcServerConnection._on_event`).
_H2_EVENTS: Final[
    dict[type[h2.events.Event], Callable[[GrpcServerConnection, Any], list[Event]]]
] = {
    h2.events.RequestReceived: GrpcServerConnection._on_request,
    h2.events.DataReceived: GrpcServerConnection._on_data,
    h2.events.StreamEnded: GrpcServerConnection._on_stream_ended,
    h2.events.StreamReset: GrpcServerConnection._on_reset,
    h2.events.WindowUpdated: GrpcServerConnection._on_window,
    h2.events.RemoteSettingsChanged: GrpcServerConnection._on_window,
    h2.events.PingAckReceived: GrpcServerConnection._on_ping_ack,
    h2.events.ConnectionTerminated: GrpcServerConnection._on_goaway,
}
