"""Clients connected to this node (of every protocol) and the deployment's subscriptions:
list, look at one, disconnect one."""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from mop.admin.context import AdminContext
from mop.admin.http import HttpError, Request, Response, Router, json_response
from mop.admin.paging import paged
from mop.protocols.introspection import ClientInfo, SubscriptionInfo


def client_doc(client: ClientInfo) -> dict[str, Any]:
    return dataclasses.asdict(client)


def subscription_doc(subscription: SubscriptionInfo) -> dict[str, Any]:
    return {
        "client_id": subscription.client_id,
        "filter": subscription.filter,
        "qos": subscription.qos,
        "group": subscription.group,
    }


def _matches(client: ClientInfo, q: str, protocol: str | None, username: str | None) -> bool:
    if protocol is not None and client.protocol != protocol:
        return False
    if username is not None and client.username != username:
        return False
    if not q:
        return True
    return any(
        q in (text or "").lower() for text in (client.client_id, client.username, client.peer)
    )


# The protocols a client may be listed under (openapi.yaml's), whether enabled here or not.
PROTOCOLS: Final = ("mqtt", "pulsar", "grpc")


def add_clients_routes(router: Router, context: AdminContext) -> None:
    async def list_clients(request: Request) -> Response:
        q = (request.arg("q") or "").lower()
        protocol, username = request.arg("protocol"), request.arg("username")
        if protocol is not None and protocol not in (*PROTOCOLS, *context.protocols):
            raise HttpError(400, f"protocol must be one of {', '.join(PROTOCOLS)}")
        found = [
            client
            for view in context.views().values()
            for client in view.clients()
            if _matches(client, q, protocol, username)
        ]
        found.sort(key=lambda client: (client.client_id, client.protocol))
        return paged(request, found, client_doc)

    async def get_client(request: Request) -> Response:
        client_id = request.params["client_id"]
        for view in context.views().values():
            client = view.client(client_id)
            subscriptions = view.subscriptions(client_id)
            if client is not None and subscriptions is not None:
                doc = client_doc(client)
                doc["subscriptions_detail"] = [
                    {"filter": s.filter, "qos": s.qos, "group": s.group} for s in subscriptions
                ]
                return json_response(doc)
        raise HttpError(404, f"client {client_id!r} is not connected to this node")

    async def kick_client(request: Request) -> Response:
        client_id = request.params["client_id"]
        if not any(view.kick(client_id) for view in context.views().values()):
            raise HttpError(404, f"client {client_id!r} is not connected to this node")
        return Response(204)

    async def list_subscriptions(request: Request) -> Response:
        client_id, topic_filter = request.arg("client_id"), request.arg("filter")
        found = [
            subscription
            for subscription in _subscriptions(context)
            if (client_id is None or subscription.client_id == client_id)
            and (topic_filter is None or subscription.filter == topic_filter)
        ]
        found.sort(key=lambda s: (s.client_id, s.filter, s.group or ""))
        return paged(request, found, subscription_doc)

    router.add("GET", "/api/v1/clients", list_clients)
    router.add("GET", "/api/v1/clients/{client_id}", get_client)
    router.add("DELETE", "/api/v1/clients/{client_id}", kick_client)
    router.add("GET", "/api/v1/subscriptions", list_subscriptions)


def _subscriptions(context: AdminContext) -> list[SubscriptionInfo]:
    """Every session's subscriptions (those of the whole deployment, where the protocol keeps
    sessions in shared tables), and those of the other protocols' clients connected here."""
    found: list[SubscriptionInfo] = []
    for view in context.views().values():
        if view.sessions is not None:
            for session in view.sessions.sessions():
                found.extend(session.subscriptions)
            continue
        for client in view.clients():
            found.extend(view.subscriptions(client.client_id) or ())
    return found
