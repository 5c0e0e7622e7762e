"""A TCP relay in front of a Pulsar-protocol broker that counts the commands clients send and
can inject faults between the two sides.

Tests and benchmarks put it between clients and a broker to see what reaches the broker (how
many topic listings a proxy makes, say) without the broker knowing:

    async with open_counting_relay("127.0.0.1", broker_port) as relay:
        ... connect clients to relay.service_url ...
        relay.counts[CommandType.GET_TOPICS_OF_NAMESPACE]

Only what goes to the relay's address is counted: a broker's lookup answers name its own
address, so the producers and consumers of pulsar-client go to the broker directly, while its
lookups and topic listings (sent to the service URL) pass here. With `advertise_self`, the
relay rewrites the broker URL of lookup answers to its own, and every connection passes here.

Faults work frame by frame, per direction (`TO_BROKER`, `TO_CLIENT`), on every connection the
relay carries: `drop` a frame, `delay` frames (order is kept: what follows a delayed frame
waits behind it), `cut` the connection after a frame, `stall` a direction until the fault is
released. Each fault matches frames of one command type (or all), lets the first `skip` of
them through and acts on the next `times`; `Fault.triggered` is set when it first acts, so a
test can wait for the fault to have happened. Frames are forwarded as the original bytes.
"""

from __future__ import annotations

import enum
import struct
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Final

import trio

from mop.protocols.pulsar.commands import CommandType, LookupResponse, LookupType, Subscribe
from mop.protocols.pulsar.errors import RemoteProtocolError
from mop.protocols.pulsar.frames import (
    ChecksumMismatch,
    Frame,
    UnknownCommand,
    decode_frame,
    encode_command,
)

__all__ = [
    "TO_BROKER",
    "TO_CLIENT",
    "CountingRelay",
    "Direction",
    "Fault",
    "FaultKind",
    "PulsarRelay",
    "open_counting_relay",
    "open_relay",
]

_CHUNK: Final = 65536
_U32: Final = struct.Struct(">I")


class Direction(enum.Enum):
    TO_BROKER = "to the broker"
    TO_CLIENT = "to the client"


TO_BROKER: Final = Direction.TO_BROKER
TO_CLIENT: Final = Direction.TO_CLIENT


class FaultKind(enum.Enum):
    DROP = "drop"
    DELAY = "delay"
    CUT = "cut"
    STALL = "stall"


class Fault:
    """One fault: see the module docstring. Made by the relay's `drop`, `delay`, `cut` and
    `stall`; `seen` counts the frames it matched, `hits` those it acted on."""

    def __init__(
        self,
        kind: FaultKind,
        direction: Direction,
        command: CommandType | None,
        *,
        skip: int = 0,
        times: int | None = 1,
        seconds: float = 0.0,
        forward: bool = True,
    ) -> None:
        self.kind = kind
        self.direction = direction
        self.command = command
        self.skip = skip
        self.times = times
        self.seconds = seconds
        self.forward = forward
        self.seen = 0
        self.hits = 0
        self.triggered = trio.Event()
        self._released = trio.Event()

    def __repr__(self) -> str:
        what = self.command.name if self.command is not None else "any frame"
        return f"<Fault {self.kind.value} {what} {self.direction.value}, {self.hits} hits>"

    def release(self) -> None:
        """Let a stalled direction go on (and stop the fault acting on later frames)."""
        self.times = self.hits
        self._released.set()

    def _takes(self, direction: Direction, kind: int) -> bool:
        """Whether this fault acts on a frame of `kind` going `direction` (counts it)."""
        if direction is not self.direction:
            return False
        if self.command is not None and kind != self.command:
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.hits >= self.times):
            return False
        self.hits += 1
        self.triggered.set()
        return True


class _Outgoing:
    """A frame on its way out of the relay, with what holds it back."""

    __slots__ = ("at", "cut", "data", "gate")

    def __init__(self, data: bytes, at: float, gate: trio.Event | None, cut: bool) -> None:
        self.data = data
        self.at = at  # not written before this time (trio clock)
        self.gate = gate  # nor before this event is set (a stall)
        self.cut = cut  # the connection ends once it is written (or dropped)


class PulsarRelay:
    """See the module docstring. Run it with `await nursery.start(relay.serve)` (or use
    `open_relay`); `port` may be set after the relay listens, before clients connect."""

    def __init__(self, host: str, port: int, *, advertise_self: bool = False) -> None:
        self.host = host
        self.port = port
        self.advertise_self = advertise_self
        # Commands by type number: those clients sent, and those the broker sent.
        self.counts: Counter[int] = Counter()
        self.broker_counts: Counter[int] = Counter()
        # SUBSCRIBE commands by (topic, subscription name): who follows what at the broker.
        self.subscriptions: Counter[tuple[str, str]] = Counter()
        self.faults: list[Fault] = []
        self.connections = 0  # accepted so far
        self.listen_port = 0
        self._scopes: set[trio.CancelScope] = set()

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.listen_port}"

    # -- faults ----------------------------------------------------------------------------

    def drop(
        self, command: CommandType, *, to: Direction, skip: int = 0, times: int | None = 1
    ) -> Fault:
        """Do not forward frames of `command` (after `skip` of them; `times` of them)."""
        return self._add(Fault(FaultKind.DROP, to, command, skip=skip, times=times))

    def delay(
        self,
        seconds: float,
        command: CommandType | None = None,
        *,
        to: Direction,
        skip: int = 0,
        times: int | None = None,
    ) -> Fault:
        """Forward frames of `command` (any, by default) `seconds` late; later frames wait."""
        fault = Fault(FaultKind.DELAY, to, command, skip=skip, times=times, seconds=seconds)
        return self._add(fault)

    def cut(
        self, command: CommandType, *, to: Direction, skip: int = 0, forward: bool = True
    ) -> Fault:
        """End the connection after a frame of `command` (forwarded first when `forward`)."""
        return self._add(Fault(FaultKind.CUT, to, command, skip=skip, forward=forward))

    def stall(self, command: CommandType | None = None, *, to: Direction, skip: int = 0) -> Fault:
        """Hold a frame of `command` (the next frame, by default) and all that follows it in
        that direction until `release()`; the connection stays open."""
        return self._add(Fault(FaultKind.STALL, to, command, skip=skip))

    def clear(self) -> None:
        """Remove every fault (stalled directions go on)."""
        for fault in self.faults:
            fault.release()
        self.faults.clear()

    def cut_all(self) -> None:
        """End every connection the relay carries now."""
        for scope in self._scopes:
            scope.cancel()

    def _add(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault

    # -- relaying --------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.listen_port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, client: trio.SocketStream) -> None:
        self.connections += 1
        async with client:
            try:
                broker = await trio.open_tcp_stream(self.host, self.port)
            except OSError:
                return
            async with broker, trio.open_nursery() as nursery:
                self._scopes.add(nursery.cancel_scope)
                try:
                    for source, sink, direction in (
                        (client, broker, TO_BROKER),
                        (broker, client, TO_CLIENT),
                    ):
                        out: deque[_Outgoing] = deque()
                        wake = trio.Semaphore(0)
                        nursery.start_soon(self._read, source, direction, out, wake, nursery)
                        nursery.start_soon(self._write, sink, out, wake, nursery)
                finally:
                    self._scopes.discard(nursery.cancel_scope)

    async def _read(
        self,
        source: trio.SocketStream,
        direction: Direction,
        out: deque[_Outgoing],
        wake: trio.Semaphore,
        nursery: trio.Nursery,
    ) -> None:
        buf = bytearray()
        framed = True  # until the bytes stop reading as frames: then relayed as they come
        try:
            while data := await source.receive_some(_CHUNK):
                if not framed:
                    self._queue(out, wake, _Outgoing(data, 0.0, None, False))
                    continue
                buf += data
                try:
                    for raw in _split(buf):
                        item = self._apply(direction, raw)
                        if item is not None:
                            self._queue(out, wake, item)
                except RemoteProtocolError:
                    framed = False
                    self._queue(out, wake, _Outgoing(bytes(buf), 0.0, None, False))
                    buf.clear()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            nursery.cancel_scope.cancel()  # one side gone: the connection is over

    @staticmethod
    def _queue(out: deque[_Outgoing], wake: trio.Semaphore, item: _Outgoing) -> None:
        out.append(item)
        wake.release()

    async def _write(
        self,
        sink: trio.SocketStream,
        out: deque[_Outgoing],
        wake: trio.Semaphore,
        nursery: trio.Nursery,
    ) -> None:
        try:
            while True:
                await wake.acquire()
                item = out[0]
                if item.gate is not None:
                    await item.gate.wait()
                await trio.sleep_until(item.at)
                out.popleft()
                if item.data:
                    await sink.send_all(item.data)
                if item.cut:
                    nursery.cancel_scope.cancel()
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            nursery.cancel_scope.cancel()

    def _apply(self, direction: Direction, raw: bytes) -> _Outgoing | None:
        """The frame `raw` as it leaves the relay: counted, rewritten, held back or dropped."""
        try:
            frame = decode_frame(raw, 4, len(raw))
        except (ValueError, IndexError, struct.error) as exc:
            raise RemoteProtocolError(str(exc)) from None
        kind = _kind(frame)
        if direction is TO_BROKER:
            self.counts[kind] += 1
            if isinstance(frame, Subscribe):
                self.subscriptions[(frame.topic, frame.subscription)] += 1
        else:
            self.broker_counts[kind] += 1
            if self.advertise_self and isinstance(frame, LookupResponse):
                raw = self._advertised(frame, raw)
        now = trio.current_time()
        item = _Outgoing(raw, now, None, False)
        for fault in self.faults:
            if not fault._takes(direction, kind):
                continue
            if fault.kind is FaultKind.DROP:
                item.data = b""
            elif fault.kind is FaultKind.DELAY:
                item.at = now + fault.seconds
            elif fault.kind is FaultKind.STALL:
                item.gate = fault._released
            else:
                item.cut = True
                if not fault.forward:
                    item.data = b""
        if not item.data and not item.cut:
            return None
        return item

    def _advertised(self, answer: LookupResponse, raw: bytes) -> bytes:
        if answer.response is LookupType.Failed or not answer.broker_service_url:
            return raw
        return encode_command(replace(answer, broker_service_url=self.service_url))


def _split(buf: bytearray) -> list[bytes]:
    """The complete frames at the front of `buf` (removed from it), each as sent."""
    frames = []
    pos = 0
    while len(buf) - pos >= 4:
        (total,) = _U32.unpack_from(buf, pos)
        if total < 4:
            raise RemoteProtocolError(f"frame of {total} bytes has no command size")
        end = pos + 4 + total
        if len(buf) < end:
            break
        frames.append(bytes(buf[pos:end]))
        pos = end
    del buf[:pos]
    return frames


def _kind(frame: Frame) -> int:
    if isinstance(frame, UnknownCommand):
        return frame.type
    if isinstance(frame, ChecksumMismatch):
        return int(frame.command.TYPE)
    return int(frame.TYPE)


# The name it had when it only counted; its users keep it.
CountingRelay = PulsarRelay


@asynccontextmanager
async def open_relay(
    host: str, port: int, *, advertise_self: bool = False
) -> AsyncIterator[PulsarRelay]:
    """A relay to the broker at (`host`, `port`) for the duration of the block."""
    relay = PulsarRelay(host, port, advertise_self=advertise_self)
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.serve)
        try:
            yield relay
        finally:
            relay.clear()
            nursery.cancel_scope.cancel()


open_counting_relay = open_relay
