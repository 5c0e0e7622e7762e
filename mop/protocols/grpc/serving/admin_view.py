"""The gRPC adapter as the admin API sees it (`mop.protocols.introspection`): its client
connections, each named "grpc:{address}:{port}", with their calls; a consume call is shown as
a subscription (its topic and subscription name from the call's metadata)."""

from __future__ import annotations

from mop.protocols.grpc.serving.pulsar_service import CONSUME
from mop.protocols.grpc.serving.served_connection import ServedConnection
from mop.protocols.grpc.serving.server import GrpcServer
from mop.protocols.introspection import ClientInfo, SubscriptionInfo

__all__ = ["GrpcAdminView"]


def _describe(connection: ServedConnection) -> ClientInfo:
    calls = list(connection.calls.values())
    return ClientInfo(
        client_id=connection.admin_id,
        protocol="grpc",
        username=None,
        peer=connection.peer,
        connected_at=connection.connected_at,
        protocol_version="grpc",
        keep_alive=int(connection.keepalive_interval),
        clean_start=True,
        subscriptions=sum(1 for call in calls if call.method == CONSUME),
        inflight=len(calls),
        queued=sum(call.queued for call in calls),
        messages_in=sum(call.messages_in for call in calls),
        messages_out=sum(call.messages_out for call in calls),
    )


class GrpcAdminView:
    """What `GrpcProtocol.admin_view()` returns. gRPC keeps no sessions or retained messages,
    and publishing goes through the MQTT view. `inflight` of a client is its running calls,
    `queued` the request messages its handlers have not taken yet."""

    sessions = None
    retained = None
    publisher = None

    def __init__(self, server: GrpcServer) -> None:
        self._server = server

    def connected(self) -> int:
        return len(self._server.connections)

    def clients(self) -> list[ClientInfo]:
        return [_describe(connection) for connection in list(self._server.connections)]

    def _find(self, client_id: str) -> ServedConnection | None:
        for connection in self._server.connections:
            if connection.admin_id == client_id:
                return connection
        return None

    def client(self, client_id: str) -> ClientInfo | None:
        connection = self._find(client_id)
        return _describe(connection) if connection is not None else None

    def subscriptions(self, client_id: str) -> list[SubscriptionInfo] | None:
        connection = self._find(client_id)
        if connection is None:
            return None
        found = []
        for call in list(connection.calls.values()):
            if call.method != CONSUME:
                continue
            metadata = dict(call.metadata)
            found.append(
                SubscriptionInfo(
                    client_id,
                    metadata.get("pulsar-topic", ""),
                    1,
                    metadata.get("pulsar-subscription"),
                )
            )
        return found

    def kick(self, client_id: str) -> bool:
        connection = self._find(client_id)
        if connection is None:
            return False
        connection.kick()
        return True
