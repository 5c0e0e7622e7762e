"""On a node with its own broker: Pulsar's admin REST API for namespace retention policies, so
`pulsar-admin namespaces get-retention/set-retention/remove-retention` and scripts written for
Pulsar work against mop.

- `GET /admin/v2/namespaces/{tenant}/{namespace}/retention`: the policy in force (a run-time
  override, the namespace's entry in settings, or the default), as
  `{"retentionTimeInMinutes": ..., "retentionSizeInMB": ...}`;
- `POST` the same JSON: override it at run time (kept across restarts); 204;
- `DELETE`: back to the policy of the settings; 204.

Errors are Pulsar's `{"reason": "..."}`.
"""

from __future__ import annotations

from mop.admin.http import HttpError, Request, Response, Router, json_response
from mop.processor import BackendError
from mop.protocols.pulsar.admin_rest import (
    ADMIN_PREFIX,
    retention_document,
    retention_from_document,
)
from mop.retention import RetentionControl
from mop.topic_names import PulsarTopicName
from mop.topics import TopicError

__all__ = ["add_retention_routes"]


def _reason(status: int, reason: str) -> Response:
    return json_response({"reason": reason}, status)


def add_retention_routes(router: Router, control: RetentionControl) -> None:
    def namespace_of(request: Request) -> str | Response:
        tenant, namespace = request.params["tenant"], request.params["namespace"]
        try:
            # The names are checked as those of a topic's are (any local name will do).
            PulsarTopicName("persistent", tenant, namespace, "-")
        except TopicError as exc:
            return _reason(412, str(exc))
        return f"{tenant}/{namespace}"

    async def get_retention(request: Request) -> Response:
        namespace = namespace_of(request)
        if isinstance(namespace, Response):
            return namespace
        return json_response(retention_document(control.retention(namespace)))

    async def set_retention(request: Request) -> Response:
        namespace = namespace_of(request)
        if isinstance(namespace, Response):
            return namespace
        try:
            policy = retention_from_document(request.json())
        except HttpError as exc:
            return _reason(400, exc.message)
        except ValueError as exc:
            return _reason(400, str(exc))
        try:
            await control.set_retention(namespace, policy)
        except BackendError as exc:
            return _reason(503, str(exc))
        return Response(204, content_type="text/plain")

    async def remove_retention(request: Request) -> Response:
        namespace = namespace_of(request)
        if isinstance(namespace, Response):
            return namespace
        try:
            await control.set_retention(namespace, None)
        except BackendError as exc:
            return _reason(503, str(exc))
        return Response(204, content_type="text/plain")

    path = f"{ADMIN_PREFIX}/namespaces/{{tenant}}/{{namespace}}/retention"
    router.add("GET", path, get_retention)
    router.add("POST", path, set_retention)
    router.add("DELETE", path, remove_retention)
