"""Sessions that outlive connections (MQTT's), of the whole deployment: list, look at one,
end one."""

from __future__ import annotations

from typing import Any

from mop.admin.context import AdminContext
from mop.admin.http import HttpError, Request, Response, Router, json_response
from mop.admin.paging import paged
from mop.protocols.introspection import SessionBusy, SessionInfo, SessionsView


def session_doc(session: SessionInfo) -> dict[str, Any]:
    return {
        "client_id": session.client_id,
        "connected": session.connected,
        "expiry_interval": session.expiry_interval,
        "disconnected_at": session.disconnected_at,
        "expires_at": session.expires_at,
        "subscriptions": len(session.subscriptions),
        "inflight": session.inflight,
        "will": session.will,
    }


def _connected_arg(request: Request) -> bool | None:
    value = request.arg("connected")
    if value is None:
        return None
    if value not in ("true", "false"):
        raise HttpError(400, "connected must be true or false")
    return value == "true"


def add_sessions_routes(router: Router, context: AdminContext) -> None:
    def views() -> list[SessionsView]:
        return [view.sessions for view in context.views().values() if view.sessions is not None]

    async def list_sessions(request: Request) -> Response:
        connected = _connected_arg(request)
        q = (request.arg("q") or "").lower()
        found = [
            session
            for sessions in views()
            for session in sessions.sessions()
            if (connected is None or session.connected == connected)
            and q in session.client_id.lower()
        ]
        found.sort(key=lambda session: session.client_id)
        return paged(request, found, session_doc)

    async def get_session(request: Request) -> Response:
        client_id = request.params["client_id"]
        for sessions in views():
            session = sessions.session(client_id)
            if session is not None:
                doc = session_doc(session)
                doc["subscriptions_detail"] = [
                    {"filter": s.filter, "qos": s.qos, "group": s.group}
                    for s in session.subscriptions
                ]
                return json_response(doc)
        raise HttpError(404, f"no session of {client_id!r}")

    async def delete_session(request: Request) -> Response:
        client_id = request.params["client_id"]
        for sessions in views():
            try:
                if await sessions.delete(client_id):
                    return Response(204)
            except SessionBusy as exc:
                raise HttpError(409, str(exc)) from None
        raise HttpError(404, f"no session of {client_id!r}")

    router.add("GET", "/api/v1/sessions", list_sessions)
    router.add("GET", "/api/v1/sessions/{client_id}", get_session)
    router.add("DELETE", "/api/v1/sessions/{client_id}", delete_session)
