"""The MQTT protocol handler (the PIP-41 lifecycle): MQTT 3.1, 3.1.1 and 5.0 over TCP, TLS and
WebSocket, serving every connection with one `MqttServer`."""

from __future__ import annotations

from collections.abc import Awaitable

import trio

from mop.protocols.base import NodeServices
from mop.protocols.introspection import AdminView
from mop.protocols.mqtt.overload import rate_refusal
from mop.protocols.mqtt.serving import retained, session_registry
from mop.protocols.mqtt.serving.admin_view import MqttAdminView
from mop.protocols.mqtt.serving.handler import ClientHandler
from mop.protocols.mqtt.serving.node_liveness import NODES_TABLE
from mop.protocols.mqtt.serving.server import MqttServer
from mop.settings import MqttSettings, Settings
from mop.transport import ConnectionInfo, Handler, ListenerSpec, listener_ssl_context

WS_SUBPROTOCOLS = ("mqtt", "mqttv3.1")


class MqttProtocol:
    name = "mqtt"
    tables = (
        retained.TABLE,
        session_registry.TABLE,
        session_registry.FLOWS_TABLE,
        NODES_TABLE,
    )

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._server: MqttServer | None = None
        self._admin_view: MqttAdminView | None = None

    @property
    def mqtt(self) -> MqttSettings:
        assert self._settings is not None, "initialize() first"
        return self._settings.mqtt

    def initialize(self, settings: Settings) -> None:
        self._settings = settings

    def advertised_data(self) -> dict[str, str]:
        urls = {"mqtt": f"mqtt://{self.mqtt.host}:{self.mqtt.port}"}
        if self.mqtt.tls.enabled:
            urls["mqtts"] = f"mqtts://{self.mqtt.host}:{self.mqtt.tls_port}"
        if self.mqtt.ws_enabled:
            urls["ws"] = f"ws://{self.mqtt.host}:{self.mqtt.ws_port}{self.mqtt.ws_path}"
        return urls

    async def start(self, services: NodeServices) -> None:
        assert self._settings is not None, "initialize() first"
        self._server = MqttServer(self._settings, services.processor)
        await services.nursery.start(self._server.serve)

    @property
    def server(self) -> MqttServer:
        assert self._server is not None, "start() first"
        return self._server

    def handle_connection(self, stream: trio.abc.Stream, info: ConnectionInfo) -> Awaitable[None]:
        """Serve one client (the transport awaits what this returns). Not a coroutine
        function itself, so that an idle connection keeps one frame less."""
        return ClientHandler(self.server, stream, info).run()

    def listeners(self) -> list[tuple[ListenerSpec, Handler]]:
        mqtt = self.mqtt
        handler = self.handle_connection
        specs = [
            ListenerSpec(
                name="mqtt", kind="tcp", host=mqtt.host, port=mqtt.port, refusal=rate_refusal
            )
        ]
        context = listener_ssl_context(mqtt.tls)
        if context is not None:
            specs.append(
                ListenerSpec(
                    name="mqtt",
                    kind="tls",
                    host=mqtt.host,
                    port=mqtt.tls_port,
                    ssl_context=context,
                )
            )
        if mqtt.ws_enabled:
            # WebSocket, and WebSocket over TLS (wss://) where TLS is configured.
            for kind, port, ssl_context in (
                ("ws", mqtt.ws_port, None),
                ("wss", mqtt.wss_port, context),
            ):
                if kind == "wss" and ssl_context is None:
                    continue
                specs.append(
                    ListenerSpec(
                        name="mqtt",
                        kind=kind,
                        host=mqtt.host,
                        port=port,
                        ssl_context=ssl_context,
                        ws_path=mqtt.ws_path,
                        ws_subprotocols=WS_SUBPROTOCOLS,
                    )
                )
        return [(spec, handler) for spec in specs]

    def admin_view(self) -> AdminView:
        if self._admin_view is None:
            self._admin_view = MqttAdminView(self.server)
        return self._admin_view

    async def close(self) -> None:
        """Nothing to finish: connections close through the node's cancellation."""
