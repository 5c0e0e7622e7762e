"""The Pulsar adapter as the admin API sees it (`mop.protocols.introspection`): its client
connections. A Pulsar client names no connection, so a connection is listed as
"pulsar:{address}:{port}"; its consumers are its subscriptions."""

from __future__ import annotations

from collections.abc import Iterable

from mop.protocols.introspection import ClientInfo, ConnectionsView, SubscriptionInfo
from mop.protocols.pulsar.serving.handler import PulsarConnection
from mop.protocols.pulsar.serving.server import PulsarServer


class PulsarAdminView(ConnectionsView[PulsarConnection]):
    """What `PulsarProtocol.admin_view()` returns. Pulsar keeps no sessions or retained
    messages of its own, and publishing goes through the MQTT view."""

    def __init__(self, server: PulsarServer) -> None:
        self._server = server

    def connected(self) -> int:
        return len(self._server.connections)

    def _connections(self) -> Iterable[PulsarConnection]:
        return self._server.connections

    def _describe(self, connection: PulsarConnection) -> ClientInfo:
        return connection.describe()

    def _subscriptions_of(self, connection: PulsarConnection) -> list[SubscriptionInfo]:
        return connection.subscriptions()

    def _close(self, connection: PulsarConnection) -> None:
        connection.close()
