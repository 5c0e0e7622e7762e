"""Listeners: accept TCP connections, add TLS and WebSocket layers as configured, and hand each
protocol adapter a plain ``trio.abc.Stream`` plus a ``ConnectionInfo`` describing the peer.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, NoReturn

import trio

from mop.log_limit import LimitedLog
from mop.overload.buckets import Rate, TokenBucket
from mop.transport.direct import read_ready
from mop.transport.linger import end_and_drain
from mop.transport.tls import peer_certificate_info
from mop.transport.websocket import WebSocketHandshakeError, accept_websocket

__all__ = [
    "BoundListener",
    "ConnectionInfo",
    "Handler",
    "ListenerSpec",
    "OpenListeners",
    "open_listeners",
    "serve_listener",
    "serve_listeners",
    "serve_open_listeners",
]

logger = logging.getLogger("mop.transport")

# Which layers each kind of listener puts on top of TCP.
_TLS_KINDS = frozenset({"tls", "wss"})
_WEBSOCKET_KINDS = frozenset({"ws", "wss"})
KINDS = frozenset({"tcp"}) | _TLS_KINDS | _WEBSOCKET_KINDS

# Closing is polite (TLS close_notify, WebSocket close frame) but must not let a peer that
# stopped reading pin a finished connection's task.
_CLOSE_TIMEOUT = 2.0
# How long a connection refused for the listener's connection rate may take to send its first
# bytes (from which `ListenerSpec.refusal` makes the answer) and to take that answer.
_REFUSAL_TIMEOUT = 0.5
# The most of those first bytes read.
_REFUSAL_READ = 4096
# What accept() fails with when the process or the system is out of file descriptors or
# memory: the listener keeps going, trying again after `_ACCEPT_PAUSE` seconds.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_PAUSE = 0.1
_accept_failures = LimitedLog(logger)


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """What the transport knows about an accepted connection.

    ``peer_certificate`` is the verified client certificate in ``getpeercert()`` form when the
    listener asks for client certificates and the client sent one; ``ws_subprotocol`` is the
    negotiated WebSocket subprotocol (None on plain TCP/TLS or when none was negotiated).
    """

    transport: str
    local: tuple[str, int]
    peer: tuple[str, int]
    peer_certificate: dict[str, Any] | None = None
    ws_subprotocol: str | None = None


Handler = Callable[[trio.abc.Stream, ConnectionInfo], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """One listening endpoint. ``kind`` is "tcp", "tls", "ws" or "wss"; port 0 picks a free port.

    ``ssl_context`` is required for "tls" and "wss". ``ws_path`` None accepts any path.
    ``ws_subprotocols`` is in order of preference, e.g. ``("mqtt", "mqttv3.1")``.
    ``handshake_timeout`` bounds the TLS handshake and WebSocket upgrade together.

    ``connection_rate`` new connections a second (0: no limit), in bursts of up to
    ``connection_burst`` (0: one second's worth), are served; the others are refused before
    any handshake or protocol work. On plain TCP a refused connection is sent what
    ``refusal`` makes of the first bytes it sends (waited for half a second at most): the
    protocol's "come back later", or b"" to say nothing; after an answer the connection is
    closed with a FIN once the client closes its side (a second at most), so that the client
    reads the answer. TLS and WebSocket ones are closed.
    """

    name: str
    kind: str
    host: str
    port: int
    ssl_context: ssl.SSLContext | None = None
    ws_path: str | None = None
    ws_subprotocols: tuple[str, ...] = ()
    handshake_timeout: float = 10.0
    backlog: int = 1024
    connection_rate: float = 0.0
    connection_burst: int = 0
    refusal: Callable[[bytes], bytes] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"listener {self.name!r}: kind must be one of {sorted(KINDS)}")
        if self.kind in _TLS_KINDS and self.ssl_context is None:
            raise ValueError(f"listener {self.name!r}: kind {self.kind!r} needs an ssl_context")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"listener {self.name!r}: port {self.port} is out of range")
        if not self.handshake_timeout > 0:
            raise ValueError(f"listener {self.name!r}: handshake_timeout must be positive")
        if self.connection_rate < 0 or self.connection_burst < 0:
            raise ValueError(f"listener {self.name!r}: connection_rate and burst must be >= 0")


@dataclass(frozen=True, slots=True)
class BoundListener:
    """A socket that is listening: ``port`` is the real port, also when the spec said 0.

    A spec whose host resolves to several addresses (e.g. "localhost" on IPv4 and IPv6)
    yields one BoundListener per address, all on the same port.
    """

    spec: ListenerSpec
    host: str
    port: int


class OpenListeners:
    """Sockets bound for some specs, not listening yet (`open_listeners`).

    A node binds its listeners before it starts anything else, so that a port in use stops it
    before it writes anything. They listen only once `serve_open_listeners` serves them: until
    the node is ready a connection is refused, rather than completing its handshake and
    waiting in a backlog (a readiness probe would see the node up, and a CONNECT whose client
    gave up meanwhile would still be taken, its session and will with it). `aclose` closes
    what was never served.
    """

    def __init__(self, opened: list[tuple[ListenerSpec, list[trio.socket.SocketType]]]) -> None:
        self._opened = opened

    @property
    def sockets(self) -> list[tuple[ListenerSpec, list[trio.socket.SocketType]]]:
        """Each spec with its bound sockets (one per address its host resolves to)."""
        return self._opened

    @property
    def bound(self) -> list[BoundListener]:
        """Where each socket is bound (the real port, also when the spec said 0)."""
        return [
            BoundListener(spec, *_address(sock.getsockname()))
            for spec, sockets in self._opened
            for sock in sockets
        ]

    def listen(self) -> list[tuple[ListenerSpec, list[trio.SocketListener]]]:
        """Start listening on every socket (each with its spec's backlog)."""
        listening = []
        for spec, sockets in self._opened:
            for sock in sockets:
                sock.listen(spec.backlog)
            listening.append((spec, [trio.SocketListener(sock) for sock in sockets]))
        return listening

    async def aclose(self) -> None:
        for _, sockets in self._opened:
            for sock in sockets:
                sock.close()
        await trio.lowlevel.checkpoint()


async def open_listeners(specs: Sequence[ListenerSpec]) -> OpenListeners:
    """Bind every spec, without listening yet; a failure (e.g. a port in use) raises
    ``OSError`` naming the listener and address, and leaves nothing open."""
    opened: list[tuple[ListenerSpec, list[trio.socket.SocketType]]] = []
    try:
        for spec in specs:
            opened.append((spec, await _open_sockets(spec)))
    except BaseException:
        await OpenListeners(opened).aclose()
        raise
    return OpenListeners(opened)


async def serve_listeners(
    specs: Sequence[ListenerSpec],
    handler: Handler,
    *,
    on_refused: Callable[[ListenerSpec], None] | None = None,
    task_status: trio.TaskStatus[list[BoundListener]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Listen on every spec and run ``await handler(stream, info)`` for each connection.

    All sockets are bound before anything is reported: a failure (e.g. a port in use) raises
    ``OSError`` naming the listener and address, and nothing is left open. Then
    ``task_status.started(bound)`` reports the bound addresses and connections are served until
    cancelled (see ``serve_open_listeners``).
    """
    listeners = await open_listeners(specs)
    await serve_open_listeners(listeners, handler, on_refused=on_refused, task_status=task_status)


async def serve_open_listeners(
    listeners: OpenListeners,
    handler: Handler,
    *,
    on_refused: Callable[[ListenerSpec], None] | None = None,
    task_status: trio.TaskStatus[list[BoundListener]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Listen and accept connections on `listeners` (which this closes when it ends) and run
    ``await handler(stream, info)`` for each; ``task_status.started(bound)`` reports the bound
    addresses at once.

    Each connection has its own task, in which the TLS handshake and WebSocket upgrade run
    under ``handshake_timeout``, so slow or hostile clients never delay others. The transport
    closes the stream once the handler returns. Errors of one connection (failed handshakes,
    broken connections, exceptions from the handler) are logged to ``mop.transport`` and never
    reach the listener or other connections. A connection refused for its listener's
    ``connection_rate`` is reported to ``on_refused``.
    """
    bound = listeners.bound
    try:
        listening = listeners.listen()
    except BaseException:
        await listeners.aclose()
        raise
    async with trio.open_nursery() as nursery:
        for spec, sockets in listening:
            gate = _Gate(spec, on_refused) if spec.connection_rate > 0 else None
            serve = partial(_serve_connection, spec, handler, gate)
            for listener in sockets:
                nursery.start_soon(_accept, listener, serve, nursery)
        for entry in bound:
            # The node announces its listeners itself; this is for transport-level debugging.
            logger.debug(
                "%s: listening on %s %s:%d",
                entry.spec.name,
                entry.spec.kind,
                entry.host,
                entry.port,
            )
        task_status.started(bound)
        # Also with no specs at all: serving nothing still runs until cancelled.
        await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


async def serve_listener(
    spec: ListenerSpec,
    handler: Handler,
    *,
    task_status: trio.TaskStatus[list[BoundListener]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """``serve_listeners`` for a single spec."""
    await serve_listeners([spec], handler, task_status=task_status)


async def _open_sockets(spec: ListenerSpec) -> list[trio.socket.SocketType]:
    """Bind (not listen on) every address ``spec.host`` resolves to, all on one port even
    when it is 0."""
    try:
        infos = await trio.socket.getaddrinfo(
            spec.host or None,
            spec.port,
            type=trio.socket.SOCK_STREAM,
            flags=trio.socket.AI_PASSIVE,
        )
    except OSError as exc:
        raise _bind_error(spec, spec.port, exc) from exc
    by_address = {str(info[4][0]): info for info in infos}
    sockets: list[trio.socket.SocketType] = []
    port = spec.port
    try:
        for address, (family, kind, proto, _, sockaddr) in by_address.items():
            try:
                sockets.append(
                    await _bound_socket(family, kind, proto, (address, port, *sockaddr[2:]))
                )
            except OSError as exc:
                raise _bind_error(spec, port, exc, address) from exc
            # Each address would get its own random port; keep them together instead.
            port = port or _address(sockets[0].getsockname())[1]
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


async def _bound_socket(
    family: int, kind: int, proto: int, sockaddr: tuple[Any, ...]
) -> trio.socket.SocketType:
    sock = trio.socket.socket(family, kind, proto)
    try:
        # A restarted node binds its port again while old connections are in TIME_WAIT.
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
        if family == trio.socket.AF_INET6:
            # "::" must not take the IPv4 port as well: "0.0.0.0" may be bound beside it.
            sock.setsockopt(trio.socket.IPPROTO_IPV6, trio.socket.IPV6_V6ONLY, 1)
        await sock.bind(sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


def _bind_error(spec: ListenerSpec, port: int, exc: OSError, address: str | None = None) -> OSError:
    where = f"{address or spec.host}:{port}"
    return OSError(
        exc.errno,
        f"listener {spec.name!r} ({spec.kind}) cannot listen on {where}: {exc.strerror or exc}",
    )


def _address(sockaddr: Any) -> tuple[str, int]:
    # IPv6 socket addresses carry flow info and scope id too; callers want host and port.
    # The host is interned: every connection to a listener keeps its local address, and
    # those of one client host its peer address, for as long as it lasts; one string each
    # then serves them all instead of one per connection.
    return sys.intern(str(sockaddr[0])), int(sockaddr[1])


@lru_cache(maxsize=256)
def _local_address(sockaddr: Any) -> tuple[str, int]:
    """`_address` of the local end of a connection: every connection to a listener has the
    same one (one per interface for a wildcard host), so they all share one tuple."""
    return _address(sockaddr)


@dataclass(slots=True)
class _Layers:
    """The stream of a connection being opened; ``stream`` is always the outermost layer so
    that closing it closes everything built so far."""

    stream: trio.abc.Stream
    peer_certificate: dict[str, Any] | None = None
    ws_subprotocol: str | None = None


class _Gate:
    """The connection rate of one listener (all its sockets): a token per connection."""

    __slots__ = ("_bucket", "_on_refused", "_spec")

    def __init__(
        self, spec: ListenerSpec, on_refused: Callable[[ListenerSpec], None] | None
    ) -> None:
        rate = Rate(spec.connection_rate, spec.connection_burst)
        self._bucket: TokenBucket = rate.bucket(trio.current_time())
        self._spec = spec
        self._on_refused = on_refused

    def admit(self) -> bool:
        if self._bucket.take(trio.current_time()):
            return True
        if self._on_refused is not None:
            self._on_refused(self._spec)
        return False


async def _accept(
    listener: trio.abc.Listener[trio.SocketStream],
    serve: Callable[[trio.SocketStream], Awaitable[None]],
    nursery: trio.Nursery,
) -> NoReturn:
    """Accept connections on `listener` (closed when this ends) and start `serve(stream)` for
    each in `nursery`: the connection's task is that call itself, with no wrapper frame that
    every idle connection would keep. Running out of file descriptors or memory does not
    stop the listener: it tries again a moment later."""
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise
                reason = errno.errorcode.get(exc.errno, str(exc.errno))
                # Ten times a second while it lasts: one line per kind per interval.
                _accept_failures.error(
                    reason,
                    "accepting a connection failed (%s), trying again in %gs",
                    reason,
                    _ACCEPT_PAUSE,
                )
                await trio.sleep(_ACCEPT_PAUSE)
            else:
                nursery.start_soon(serve, stream)


async def _refuse(spec: ListenerSpec, tcp: trio.SocketStream) -> None:
    """Answer a connection over the listener's rate without a handshake: on plain TCP, what
    `spec.refusal` makes of the first bytes it sends.

    A socket closed with bytes unread (the rest of a large CONNECT, what a client sent
    after it without waiting) makes the system send a reset instead of a FIN, and a client
    that gets it may lose the answer: a write of its own fails first, or its system drops
    what it had received. So once the answer is out the node ends its side of the stream
    and drains the client's (`end_and_drain`)."""
    if spec.refusal is None or spec.kind != "tcp":
        return
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        answered = False
        with trio.move_on_after(_REFUSAL_TIMEOUT):
            first = read_ready(tcp, _REFUSAL_READ)
            if first is None:
                first = await tcp.receive_some(_REFUSAL_READ)
            answer = spec.refusal(bytes(first))
            if answer:
                await tcp.send_all(answer)
                answered = True
        if answered:
            await end_and_drain(tcp)


async def _serve_connection(
    spec: ListenerSpec, handler: Handler, gate: _Gate | None, tcp: trio.SocketStream
) -> None:
    layers = _Layers(tcp)
    try:
        if gate is not None and not gate.admit():
            await _refuse(spec, tcp)
            return
        info = await _open_connection(spec, tcp, layers)
        if info is not None:
            peer = info.peer
            serving = handler(layers.stream, info)
            del info  # what the handler keeps of it is its own business
            try:
                await serving
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                # Peers vanish all the time; this is not a handler bug.
                logger.info("%s: connection from %s:%d lost: %s", spec.name, *peer, _describe(exc))
    except Exception:
        # The handler's own bugs: keep the traceback, keep the listener.
        logger.exception("%s: connection handler failed", spec.name)
    finally:
        if layers.stream is not tcp:
            with trio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                with contextlib.suppress(
                    trio.BrokenResourceError, trio.ClosedResourceError, OSError
                ):
                    await layers.stream.aclose()
        # A plain TCP stream closes at once (so does what is left of the others).
        await trio.aclose_forcefully(tcp)


async def _open_connection(
    spec: ListenerSpec, tcp: trio.SocketStream, layers: _Layers
) -> ConnectionInfo | None:
    """Look at the peer and run the TLS and WebSocket handshakes (None: the connection is
    gone or refused). Apart from `_serve_connection` so that its frame is not kept while the
    connection is served."""
    # TCP_NODELAY, which MQTT's small packets depend on, is set by trio.SocketStream itself.
    try:
        local = _local_address(tcp.socket.getsockname())
        peer = _address(tcp.socket.getpeername())
    except OSError as exc:
        # The client reset the connection before we looked at it.
        logger.info("%s: connection lost before it could be served: %s", spec.name, exc)
        return None
    try:
        if spec.kind != "tcp":  # plain TCP has no handshake to bound
            with trio.fail_after(spec.handshake_timeout):
                await _open_layers(spec, layers)
    except trio.TooSlowError:
        logger.info(
            "%s: dropped %s:%d, handshake not finished within %g s",
            spec.name,
            *peer,
            spec.handshake_timeout,
        )
        return None
    except (trio.BrokenResourceError, WebSocketHandshakeError, OSError) as exc:
        logger.info("%s: handshake with %s:%d failed: %s", spec.name, *peer, _describe(exc))
        return None
    return ConnectionInfo(spec.kind, local, peer, layers.peer_certificate, layers.ws_subprotocol)


async def _open_layers(spec: ListenerSpec, layers: _Layers) -> None:
    if spec.kind in _TLS_KINDS:
        assert spec.ssl_context is not None  # checked by ListenerSpec
        # https_compatible: a peer that drops TCP without close_notify reads as EOF, like on
        # plain TCP; MQTT and Pulsar frames are length-prefixed, so truncation stays visible.
        tls = trio.SSLStream(
            layers.stream, spec.ssl_context, server_side=True, https_compatible=True
        )
        layers.stream = tls
        await tls.do_handshake()
        layers.peer_certificate = peer_certificate_info(tls)
    if spec.kind in _WEBSOCKET_KINDS:
        websocket = await accept_websocket(
            layers.stream, path=spec.ws_path, subprotocols=spec.ws_subprotocols
        )
        layers.stream = websocket
        layers.ws_subprotocol = websocket.subprotocol


def _describe(exc: BaseException) -> str:
    # trio wraps ssl and socket errors in BrokenResourceError; the cause is the useful part.
    text = str(exc) or type(exc).__name__
    cause = exc.__cause__
    return f"{text}: {cause!r}" if cause is not None else text
