"""The Pulsar adapter as the admin API sees it (`mop.protocols.introspection`): its client
connections. A Pulsar client names no connection, so a connection is listed as
"pulsar:{address}:{port}"; its consumers are its subscriptions."""

from __future__ import annotations

from mop.protocols.introspection import ClientInfo, SubscriptionInfo
from mop.protocols.pulsar.serving.handler import PulsarConnection
from mop.protocols.pulsar.serving.server import PulsarServer


class PulsarAdminView:
    """What `PulsarProtocol.admin_view()` returns. Pulsar keeps no sessions or retained
    messages of its own, and publishing goes through the MQTT view."""

    sessions = None
    retained = None
    publisher = None

    def __init__(self, server: PulsarServer) -> None:
        self._server = server

    def connected(self) -> int:
        return len(self._server.connections)

    def clients(self) -> list[ClientInfo]:
        return [connection.describe() for connection in list(self._server.connections)]

    def _find(self, client_id: str) -> PulsarConnection | None:
        for connection in self._server.connections:
            if connection.admin_id == client_id:
                return connection
        return None

    def client(self, client_id: str) -> ClientInfo | None:
        connection = self._find(client_id)
        return connection.describe() if connection is not None else None

    def subscriptions(self, client_id: str) -> list[SubscriptionInfo] | None:
        connection = self._find(client_id)
        return connection.subscriptions() if connection is not None else None

    def kick(self, client_id: str) -> bool:
        connection = self._find(client_id)
        if connection is None:
            return False
        connection.close()
        return True
