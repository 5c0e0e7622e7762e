"""The gRPC adapter as the admin API sees it (`mop.protocols.introspection`): its client
connections, each named "grpc:{address}:{port}", with their calls; a consume call is shown as
a subscription (its topic and subscription name from the call's metadata)."""

from __future__ import annotations

from collections.abc import Iterable

from mop.protocols.grpc.serving.pulsar_service import CONSUME
from mop.protocols.grpc.serving.served_connection import ServedConnection
from mop.protocols.grpc.serving.server import GrpcServer
from mop.protocols.introspection import ClientInfo, ConnectionsView, SubscriptionInfo

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


class GrpcAdminView(ConnectionsView[ServedConnection]):
    """What `GrpcProtocol.admin_view()` returns. gRPC keeps no sessions or retained messages,
    and publishing goes through the MQTT view. `inflight` of a client is its running calls,
    `queued` the request messages its handlers have not taken yet."""

    def __init__(self, server: GrpcServer) -> None:
        self._server = server

    def connected(self) -> int:
        return len(self._server.connections)

    def _connections(self) -> Iterable[ServedConnection]:
        return self._server.connections

    def _describe(self, connection: ServedConnection) -> ClientInfo:
        return _describe(connection)

    def _subscriptions_of(self, connection: ServedConnection) -> list[SubscriptionInfo]:
        found = []
        for call in list(connection.calls.values()):
            if call.method != CONSUME:
                continue
            metadata = dict(call.metadata)
            found.append(
                SubscriptionInfo(
                    connection.admin_id,
                    metadata.get("pulsar-topic", ""),
                    1,
                    metadata.get("pulsar-subscription"),
                )
            )
        return found

    def _close(self, connection: ServedConnection) -> None:
        connection.kick()
