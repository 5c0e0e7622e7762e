"""The gRPC server: HTTP/2 connections (h2, sans-IO) served under trio, each call given to the
method handler registered for its path.

`handle_connection` serves one client connection (the node's listeners call it); `close`
drains them all when the node closes: a GOAWAY, a short grace for running calls, then
UNAVAILABLE for the calls left (clients retry those elsewhere).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Final

import trio

from mop.counters import ProtocolStats, Refusal
from mop.protocols.grpc.connection import ConnectionLimits, GrpcServerConnection
from mop.protocols.grpc.overload import LIMIT_REFUSAL
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.served_connection import ServedConnection
from mop.settings import GrpcSettings
from mop.transport import ConnectionInfo
from mop.transport.linger import end_and_drain

__all__ = ["GrpcServer"]

log = logging.getLogger("mop.grpc")

# How long running calls may go on once the node closes, before they end with UNAVAILABLE.
_DRAIN_GRACE: Final = 1.0
# How long a refused connection may take to read its GOAWAY.
_REFUSAL_TIMEOUT: Final = 1.0


def _host_port(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    def __init__(
        self,
        settings: GrpcSettings,
        methods: Mapping[str, MethodHandler],
        stats: ProtocolStats,
        *,
        max_connections: int = 0,
    ) -> None:
        self.settings = settings
        self.methods = methods
        # This protocol's counters (bytes, requests, refusals), which the connections add to.
        self.stats = stats
        # The most gRPC connections served at once (0: no limit); each call of a connection
        # is also a client of the processor, held to the same limit there.
        self.max_connections = max_connections
        self.limits = ConnectionLimits(
            max_concurrent_streams=settings.max_concurrent_streams,
            max_message_bytes=settings.max_message_bytes,
        )
        self.connections: set[ServedConnection] = set()
        self.closing = False

    async def handle_connection(self, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        """Serve one client connection until it ends."""
        if self.closing:
            return
        if self.max_connections and len(self.connections) >= self.max_connections:
            self.stats.refuse(Refusal.LIMIT_REACHED)
            log.info(
                "%s: refused, %d connections already", _host_port(info.peer), len(self.connections)
            )
            with (
                trio.move_on_after(_REFUSAL_TIMEOUT),
                contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
            ):
                await stream.send_all(LIMIT_REFUSAL)
            # So that the client reads the GOAWAY rather than a reset.
            await end_and_drain(stream)
            return
        connection = ServedConnection(
            stream,
            peer=_host_port(info.peer),
            peer_certificate=_peer_certificate(stream),
            state=GrpcServerConnection(self.limits, self.methods),
            methods=self.methods,
            settings=self.settings,
            stats=self.stats,
        )
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)

    async def close(self) -> None:
        """Drain every connection (see the module's docstring)."""
        self.closing = True
        async with trio.open_nursery() as nursery:
            for connection in list(self.connections):
                nursery.start_soon(connection.drain, _DRAIN_GRACE)


def _peer_certificate(stream: trio.abc.Stream) -> bytes | None:
    """The client's certificate (DER) on a TLS connection that asked for one."""
    if isinstance(stream, trio.SSLStream):
        der: bytes | None = stream.getpeercert(binary_form=True)
        return der or None
    return None
