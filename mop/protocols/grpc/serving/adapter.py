"""The gRPC protocol handler (Apache Pulsar PIP-59): gRPC over HTTP/2 on TCP (grpc://) and TLS
(grpc+tls://, ALPN "h2"; mTLS when it has a CA for client certificates), serving mop's Pulsar
service, the health service and server reflection."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Final

import trio

from mop.protocols.base import NodeServices
from mop.protocols.grpc.overload import rate_refusal
from mop.protocols.grpc.serving.admin_view import GrpcAdminView
from mop.protocols.grpc.serving.methods import grpc_methods
from mop.protocols.grpc.serving.server import GrpcServer
from mop.protocols.introspection import AdminView
from mop.settings import GrpcSettings, Settings
from mop.transport import ConnectionInfo, Handler, ListenerSpec, listener_ssl_context

__all__ = ["GrpcProtocol"]

# gRPC runs on HTTP/2 only; TLS clients must negotiate it.
_ALPN: Final = ["h2"]


class GrpcProtocol:
    name = "grpc"
    tables: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._server: GrpcServer | None = None

    @property
    def grpc(self) -> GrpcSettings:
        assert self._settings is not None, "initialize() first"
        return self._settings.grpc

    def initialize(self, settings: Settings) -> None:
        self._settings = settings

    def advertised_data(self) -> dict[str, str]:
        grpc = self.grpc
        urls = {"grpc": f"grpc://{_url_host(grpc.host)}:{grpc.port}"}
        if grpc.tls.enabled:
            urls["grpc+tls"] = f"grpc+tls://{_url_host(grpc.host)}:{grpc.tls_port}"
        return urls

    async def start(self, services: NodeServices) -> None:
        assert self._settings is not None, "initialize() first"
        processor = services.processor
        server: GrpcServer | None = None

        def serving() -> bool:
            # What /readyz says: the backend answers and the node is not over its memory mark.
            return (
                server is not None
                and not server.closing
                and not processor.not_ready()
                and not processor.overload.not_ready()
            )

        methods = grpc_methods(processor, self._settings, serving)
        server = GrpcServer(
            self.grpc,
            methods,
            processor.stats.protocol(self.name),
            max_connections=self._settings.limits.max_connections,
        )
        self._server = server

    @property
    def server(self) -> GrpcServer:
        assert self._server is not None, "start() first"
        return self._server

    def handle_connection(self, stream: trio.abc.Stream, info: ConnectionInfo) -> Awaitable[None]:
        """Serve one client, once started (the node binds the listeners before that)."""
        return self.server.handle_connection(stream, info)

    def listeners(self) -> list[tuple[ListenerSpec, Handler]]:
        grpc = self.grpc
        specs = [
            ListenerSpec(
                name="grpc", kind="tcp", host=grpc.host, port=grpc.port, refusal=rate_refusal
            )
        ]
        context = listener_ssl_context(grpc.tls)
        if context is not None:
            context.set_alpn_protocols(_ALPN)
            specs.append(
                ListenerSpec(
                    name="grpc",
                    kind="tls",
                    host=grpc.host,
                    port=grpc.tls_port,
                    ssl_context=context,
                )
            )
        return [(spec, self.handle_connection) for spec in specs]

    def admin_view(self) -> AdminView:
        return GrpcAdminView(self.server)

    async def close(self) -> None:
        """Drain the connections: a GOAWAY, a short grace for running calls, UNAVAILABLE for
        the rest."""
        if self._server is not None:
            await self._server.close()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
