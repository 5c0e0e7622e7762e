"""One client connection of the gRPC server: a reader feeding the state machine
(`mop.protocols.grpc.connection`), a writer sending what it queues, a keepalive timer, and
one task per call running its method handler.

A call ends on its own: its handler returns (OK) or raises (GrpcError: that status; anything
else: INTERNAL, logged), or its deadline passes (DEADLINE_EXCEEDED). A call whose stream the
client resets, or whose connection goes, is cancelled. Nothing a call or the client does
raises out of the connection.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Final

import h2.errors
import trio

from mop.counters import ProtocolStats
from mop.exception_groups import leaves
from mop.protocols.grpc.connection import (
    CallAborted,
    CallStarted,
    ClientHalfClosed,
    ConnectionEnded,
    Event,
    GrpcServerConnection,
    MessageReceived,
    PingAnswered,
    WindowOpened,
)
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.server_call import ServerCall
from mop.protocols.grpc.status import GrpcError, StatusCode
from mop.settings import GrpcSettings
from mop.transport.linger import end_and_drain

__all__ = ["ServedConnection"]

log = logging.getLogger("mop.grpc")

_READ_SIZE: Final = 65536
# How long the last frames (trailers, GOAWAY) may take to go out once the connection ends.
_FLUSH_TIMEOUT: Final = 2.0


def _status_of(exc: BaseException) -> GrpcError | None:
    """The GrpcError a handler raised, also from inside an exception group (a handler that
    runs a nursery)."""
    for leaf in leaves(exc):
        if isinstance(leaf, GrpcError):
            return leaf
    return None


class ServedConnection:
    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        peer: str,
        peer_certificate: bytes | None,
        state: GrpcServerConnection,
        methods: Mapping[str, MethodHandler],
        settings: GrpcSettings,
        stats: ProtocolStats,
    ) -> None:
        self._stream = stream
        self.peer = peer
        self._peer_certificate = peer_certificate
        self._state = state
        self._methods = methods
        self._settings = settings
        self._stats = stats
        self.calls: dict[int, ServerCall] = {}
        self.connected_at = time.time()
        self._wake_writer = trio.Event()
        # Woken when the client's windows open, for sends that wait for them.
        self._window = trio.lowlevel.ParkingLot()
        self._last_heard = trio.current_time()
        self._ping_answered = trio.Event()
        self._calls_done = trio.Event()
        self._calls_done.set()
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self._writer_done = trio.Event()
        # The reader's, which the writer ends when nothing more can be written.
        self._reading = trio.CancelScope()

    # --- the connection's life -----------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until the client goes, breaks the protocol, or the node closes
        it (`drain` / cancellation)."""
        self._state.initiate()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._write_loop)
                if self._settings.keepalive_interval > 0:
                    nursery.start_soon(self._keepalive)
                with self._reading:
                    await self._read_loop()
                # The client is gone or the connection ended: its calls with it.
                self._abort_calls(StatusCode.CANCELLED, "the connection closed")
                await self._calls_done.wait()
                self._closing = True
                self._kick()
                with trio.move_on_after(_FLUSH_TIMEOUT):
                    await self._writer_done.wait()
                if self._state.ended:
                    # The node sent GOAWAY: the client is to read it rather than a reset,
                    # which closing with its later bytes unread would send.
                    await end_and_drain(self._stream)
                nursery.cancel_scope.cancel()
        finally:
            self._abort_calls(StatusCode.CANCELLED, "the connection closed")

    async def drain(self, grace: float) -> None:
        """Take no more calls (GOAWAY), give the running ones `grace` seconds, end those left
        with UNAVAILABLE, then close the connection."""
        self._state.drain()
        self._kick()
        with trio.move_on_after(grace):
            await self._calls_done.wait()
        self._abort_calls(StatusCode.UNAVAILABLE, "the node is closing")
        await self._calls_done.wait()
        self._state.close()
        self._closing = True
        self._kick()
        with trio.move_on_after(_FLUSH_TIMEOUT):
            await self._writer_done.wait()

    def _abort_calls(self, code: StatusCode, why: str) -> None:
        for call in list(self.calls.values()):
            call.abort(code, why)

    async def _read_loop(self) -> None:
        while not self._state.ended:
            try:
                data = await self._stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            self._last_heard = trio.current_time()
            self._stats.record_received_bytes(len(data))
            for event in self._state.receive_data(bytes(data)):
                self._on_event(event)
            self._kick()

    async def _write_loop(self) -> None:
        try:
            while True:
                self._wake_writer = trio.Event()
                data = self._state.data_to_send()
                if data:
                    self._stats.bytes_sent += len(data)
                    await self._stream.send_all(data)
                    continue
                if self._closing or self._state.ended:
                    break
                await self._wake_writer.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._writer_done.set()
        # Nothing more can be written: the connection is over.
        self._reading.cancel()

    def _kick(self) -> None:
        self._wake_writer.set()

    async def _keepalive(self) -> None:
        """PING a connection silent for keepalive_interval; close it when the answer does not
        come within keepalive_timeout (the client or the network is gone)."""
        interval = self._settings.keepalive_interval
        while True:
            await trio.sleep_until(self._last_heard + interval)
            if trio.current_time() < self._last_heard + interval:
                continue
            self._ping_answered = trio.Event()
            self._state.ping(os.urandom(8))
            self._kick()
            with trio.move_on_after(self._settings.keepalive_timeout):
                await self._ping_answered.wait()
                continue
            log.info(
                "%s: no answer to PING within %gs, closing",
                self.peer,
                self._settings.keepalive_timeout,
            )
            self._state.close(h2.errors.ErrorCodes.NO_ERROR)
            self._closing = True
            self._kick()
            return

    # --- events ----------------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        match event:
            case MessageReceived(stream_id, message, flow_length):
                call = self.calls.get(stream_id)
                if call is None:
                    self._state.taken(stream_id, flow_length)
                else:
                    self._stats.requests += 1
                    call.deliver(message, flow_length)
            case CallStarted():
                self._start_call(event)
            case ClientHalfClosed(stream_id):
                if (call := self.calls.get(stream_id)) is not None:
                    call.half_close()
            case CallAborted(stream_id, code, why):
                if (call := self.calls.get(stream_id)) is not None:
                    call.abort(code, why)
            case WindowOpened():
                self._window.unpark_all()
            case PingAnswered():
                self._ping_answered.set()
            case ConnectionEnded(error_code, reason):
                if error_code:
                    log.info("%s: %s", self.peer, reason)
                self._closing = True

    def _start_call(self, event: CallStarted) -> None:
        handler = self._methods[event.request.method]
        call = ServerCall(self, event.stream_id, event.request, self.peer, self._peer_certificate)
        self.calls[event.stream_id] = call
        self._calls_done = trio.Event()
        assert self._nursery is not None
        self._nursery.start_soon(self._run_call, call, handler)

    async def _run_call(self, call: ServerCall, handler: MethodHandler) -> None:
        code, message = StatusCode.OK, ""
        try:
            with call.cancel_scope:
                if call.timeout is not None:
                    call.cancel_scope.deadline = call.started_at + call.timeout
                try:
                    await handler(call)
                except Exception as exc:
                    code, message = self._status(call, exc)
        except BaseException:
            # Cancelled from outside the call: the node closes the listeners' connection tasks
            # while `drain` waits for this connection's calls. The call ends all the same, or
            # the drain would wait for it forever.
            self._finish(call, StatusCode.UNAVAILABLE, "the node is closing")
            raise
        if call.aborted is not None:
            code, message = call.aborted
        elif call.cancel_scope.cancelled_caught:
            code, message = StatusCode.DEADLINE_EXCEEDED, "deadline exceeded"
        self._finish(call, code, message)

    def _status(self, call: ServerCall, exc: Exception) -> tuple[StatusCode, str]:
        found = _status_of(exc)
        if found is not None:
            return found.code, found.message
        log.error(
            "%s: %s failed", self.peer, call.method, exc_info=(type(exc), exc, exc.__traceback__)
        )
        return StatusCode.INTERNAL, "internal error"

    def _finish(self, call: ServerCall, code: StatusCode, message: str) -> None:
        del self.calls[call.stream_id]
        call.release()
        self._state.end_call(call.stream_id, code, message)
        self._kick()
        if not self.calls:
            self._calls_done.set()

    # --- what calls use ------------------------------------------------------------------------

    def taken(self, stream_id: int, flow_length: int) -> None:
        """A call's handler took a request message (see `GrpcServerConnection.taken`)."""
        self._state.taken(stream_id, flow_length)
        self._kick()

    async def send_message(self, stream_id: int, message: bytes) -> None:
        """Queue one response message and wait until the client's window has taken it all."""
        self._state.send_message(stream_id, message)
        self._kick()
        while self._state.pending(stream_id):
            await self._window.park()
        await trio.lowlevel.checkpoint_if_cancelled()

    @property
    def keepalive_interval(self) -> float:
        return self._settings.keepalive_interval

    @property
    def admin_id(self) -> str:
        """How the admin API names the connection (gRPC clients name none)."""
        return f"grpc:{self.peer}"

    def kick(self) -> None:
        """Close the connection from outside (the admin API): its calls end with
        UNAVAILABLE, then a GOAWAY."""
        log.info("%s: closing the connection on request", self.peer)
        self._abort_calls(StatusCode.UNAVAILABLE, "closed by the node's administrator")
        if self._nursery is not None:
            self._nursery.start_soon(self._close_when_calls_end)

    async def _close_when_calls_end(self) -> None:
        await self._calls_done.wait()
        self._state.close()
        self._closing = True
        self._kick()
