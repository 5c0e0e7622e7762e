"""Retained messages (shared by every node of the deployment): list by filter, look at one,
clear one."""

from __future__ import annotations

import base64
from typing import Any

from mop.admin.context import AdminContext
from mop.admin.http import HttpError, Request, Response, Router, json_response
from mop.admin.paging import paged
from mop.protocols.introspection import BadTopic, RetainedInfo, RetainedView


def payload_doc(payload: bytes) -> dict[str, str]:
    """A payload as JSON: UTF-8 text as it is, anything else in base64."""
    try:
        return {"payload": payload.decode("utf-8"), "payload_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"payload": base64.b64encode(payload).decode(), "payload_encoding": "base64"}


def retained_doc(retained: RetainedInfo) -> dict[str, Any]:
    return {
        "topic": retained.topic,
        **payload_doc(retained.payload),
        "qos": retained.qos,
        "published_at": retained.published_at,
        "size": len(retained.payload),
    }


def refused(exc: BadTopic) -> HttpError:
    return HttpError(403 if exc.reserved else 400, str(exc))


def add_retained_routes(router: Router, context: AdminContext) -> None:
    def views() -> list[RetainedView]:
        return [view.retained for view in context.views().values() if view.retained is not None]

    async def list_retained(request: Request) -> Response:
        topic_filter = request.arg("filter") or "#"
        try:
            found = [item for retained in views() for item in retained.matching(topic_filter)]
        except BadTopic as exc:
            raise refused(exc) from None
        found.sort(key=lambda item: item.topic)
        return paged(request, found, retained_doc)

    async def get_retained(request: Request) -> Response:
        topic = request.params["topic"]
        for retained in views():
            item = retained.get(topic)
            if item is not None:
                return json_response(retained_doc(item))
        raise HttpError(404, f"no retained message on {topic!r}")

    async def delete_retained(request: Request) -> Response:
        topic = request.params["topic"]
        for retained in views():
            try:
                if await retained.delete(topic):
                    return Response(204)
            except BadTopic as exc:
                raise refused(exc) from None
        raise HttpError(404, f"no retained message on {topic!r}")

    router.add("GET", "/api/v1/retained", list_retained)
    router.add("GET", "/api/v1/retained/{topic}", get_retained)
    router.add("DELETE", "/api/v1/retained/{topic}", delete_retained)
