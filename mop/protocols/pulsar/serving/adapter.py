"""The Pulsar protocol handler: the Pulsar binary protocol over TCP (pulsar://) and TLS
(pulsar+ssl://, mTLS when it has a CA for client certificates) for pulsar-client apps."""

from __future__ import annotations

from collections.abc import Awaitable

import trio

from mop.protocols.base import NodeServices
from mop.protocols.introspection import AdminView
from mop.protocols.pulsar.overload import rate_refusal
from mop.protocols.pulsar.serving.admin_view import PulsarAdminView
from mop.protocols.pulsar.serving.server import PulsarServer, Timers
from mop.settings import PulsarSettings, Settings
from mop.transport import ConnectionInfo, Handler, ListenerSpec, listener_ssl_context


class PulsarProtocol:
    name = "pulsar"
    tables: tuple[str, ...] = ()

    def __init__(self, timers: Timers | None = None) -> None:
        self._settings: Settings | None = None
        self._server: PulsarServer | None = None
        self._timers = timers

    @property
    def pulsar(self) -> PulsarSettings:
        assert self._settings is not None, "initialize() first"
        return self._settings.pulsar

    def initialize(self, settings: Settings) -> None:
        self._settings = settings

    def advertised_data(self) -> dict[str, str]:
        assert self._settings is not None, "initialize() first"
        url = self._settings.cluster.advertised_url
        urls = {"pulsar": url or f"pulsar://{self.pulsar.host}:{self.pulsar.port}"}
        if self.pulsar.tls.enabled:
            urls["pulsar+ssl"] = f"pulsar+ssl://{self.pulsar.host}:{self.pulsar.tls_port}"
        return urls

    async def start(self, services: NodeServices) -> None:
        assert self._settings is not None, "initialize() first"
        self._server = PulsarServer(
            self._settings,
            services.processor,
            self._timers,
            membership=services.membership,
            broker_auth=services.broker_auth,
        )
        await services.nursery.start(self._server.serve)

    @property
    def server(self) -> PulsarServer:
        assert self._server is not None, "start() first"
        return self._server

    def handle_connection(self, stream: trio.abc.Stream, info: ConnectionInfo) -> Awaitable[None]:
        """Serve one client, once started (the node binds the listeners before that)."""
        return self.server.handle_connection(stream, info)

    def listeners(self) -> list[tuple[ListenerSpec, Handler]]:
        pulsar = self.pulsar
        specs = [
            ListenerSpec(
                name="pulsar",
                kind="tcp",
                host=pulsar.host,
                port=pulsar.port,
                refusal=rate_refusal,
            )
        ]
        context = listener_ssl_context(pulsar.tls)
        if context is not None:
            specs.append(
                ListenerSpec(
                    name="pulsar",
                    kind="tls",
                    host=pulsar.host,
                    port=pulsar.tls_port,
                    ssl_context=context,
                )
            )
        return [(spec, self.handle_connection) for spec in specs]

    def admin_view(self) -> AdminView:
        return PulsarAdminView(self.server)

    async def close(self) -> None:
        """Nothing to finish: connections close through the node's cancellation."""
