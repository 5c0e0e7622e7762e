"""On a node with its own broker (and on a separated proxy with `cluster.admin_url`, which asks
its brokers): Pulsar's admin REST API for namespace retention policies and
backlog quotas, so `pulsar-admin namespaces get-retention/set-retention/remove-retention`,
`get-backlog-quotas/set-backlog-quota/remove-backlog-quota` and scripts written for Pulsar work
against mop.

- `GET /admin/v2/namespaces/{tenant}/{namespace}/retention`: the policy in force (a run-time
  override, the namespace's entry in settings, or the default), as
  `{"retentionTimeInMinutes": ..., "retentionSizeInMB": ...}`;
- `POST` the same JSON: override it at run time (kept across restarts); 204;
- `DELETE`: back to the policy of the settings; 204.
- `GET .../backlogQuotaMap`: the backlog quotas in force, by backlogQuotaType;
- `POST .../backlogQuota?backlogQuotaType=destination_storage|message_age` with
  `{"limitSize": ..., "limitTime": ..., "policy": ...}`: override one at run time; 204;
- `DELETE .../backlogQuota?backlogQuotaType=...`: back to the settings; 204.

As in Pulsar, a size quota must stay below the namespace's retention size (when that is a
positive limit): a POST that breaks this is refused with 412 ("Retention Quota must exceed
configured backlog quota" / "Backlog Quota exceeds configured retention quota"), and so are
changes to the system namespace (`{tenant}/__mop`), whose policies are fixed. Errors are
Pulsar's `{"reason": "..."}`.
"""

from __future__ import annotations

from collections.abc import Mapping

from mop.admin.http import HttpError, Request, Response, Router, json_response
from mop.backlog_quota import BacklogQuota, BacklogQuotaControl, QuotaKind
from mop.processor import BackendError
from mop.protocols.pulsar.admin_rest import (
    ADMIN_PREFIX,
    backlog_quota_from_document,
    backlog_quota_map,
    retention_document,
    retention_from_document,
)
from mop.retention import RetentionControl, RetentionPolicy
from mop.topic_names import SYSTEM_NAMESPACE, PulsarTopicName
from mop.topics import TopicError

__all__ = ["add_backlog_quota_routes", "add_retention_routes"]


def _reason(status: int, reason: str) -> Response:
    return json_response({"reason": reason}, status)


def namespace_of(request: Request) -> str | Response:
    """ "tenant/namespace" of the path, or the answer refusing it."""
    tenant, namespace = request.params["tenant"], request.params["namespace"]
    try:
        # The names are checked as those of a topic's are (any local name will do).
        PulsarTopicName("persistent", tenant, namespace, "-")
    except TopicError as exc:
        return _reason(412, str(exc))
    return f"{tenant}/{namespace}"


def writable_namespace_of(request: Request) -> str | Response:
    """As `namespace_of`, refusing the system namespace, whose policies are fixed."""
    namespace = namespace_of(request)
    if isinstance(namespace, str) and namespace.partition("/")[2] == SYSTEM_NAMESPACE:
        return _reason(412, f"the policies of the system namespace {namespace} are fixed")
    return namespace


def quota_fits(quotas: Mapping[QuotaKind, BacklogQuota], retention: RetentionPolicy) -> bool:
    """Pulsar's rule: a size quota must stay below a positive retention size."""
    size = quotas.get(QuotaKind.SIZE)
    return retention.size_bytes <= 0 or size is None or size.limit < retention.size_bytes


def add_retention_routes(
    router: Router, control: RetentionControl, quotas: BacklogQuotaControl | None = None
) -> None:
    async def get_retention(request: Request) -> Response:
        namespace = namespace_of(request)
        if isinstance(namespace, Response):
            return namespace
        try:
            policy = await control.retention(namespace)
        except BackendError as exc:
            return _reason(503, str(exc))
        return json_response(retention_document(policy))

    async def set_retention(request: Request) -> Response:
        namespace = writable_namespace_of(request)
        if isinstance(namespace, Response):
            return namespace
        try:
            policy = retention_from_document(request.json())
        except HttpError as exc:
            return _reason(400, exc.message)
        except ValueError as exc:
            return _reason(400, str(exc))
        try:
            if quotas is not None and not quota_fits(
                await quotas.backlog_quotas(namespace), policy
            ):
                return _reason(
                    412, "Retention Quota must exceed configured backlog quota for namespace."
                )
            await control.set_retention(namespace, policy)
        except BackendError as exc:
            return _reason(503, str(exc))
        return Response(204, content_type="text/plain")

    async def remove_retention(request: Request) -> Response:
        namespace = writable_namespace_of(request)
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


def add_backlog_quota_routes(
    router: Router, control: BacklogQuotaControl, retention: RetentionControl | None = None
) -> None:
    def kind_of(request: Request) -> QuotaKind | Response:
        raw = request.arg("backlogQuotaType")
        try:
            return QuotaKind.SIZE if raw is None else QuotaKind(raw)
        except ValueError:
            return _reason(400, "backlogQuotaType must be destination_storage or message_age")

    async def get_quotas(request: Request) -> Response:
        namespace = namespace_of(request)
        if isinstance(namespace, Response):
            return namespace
        try:
            quotas = await control.backlog_quotas(namespace)
        except BackendError as exc:
            return _reason(503, str(exc))
        return json_response(backlog_quota_map(quotas))

    async def set_quota(request: Request) -> Response:
        namespace, kind = writable_namespace_of(request), kind_of(request)
        if isinstance(namespace, Response):
            return namespace
        if isinstance(kind, Response):
            return kind
        try:
            quota = backlog_quota_from_document(kind, request.json())
        except HttpError as exc:
            return _reason(400, exc.message)
        except ValueError as exc:
            return _reason(400, str(exc))
        try:
            if retention is not None and not quota_fits(
                {kind: quota}, await retention.retention(namespace)
            ):
                return _reason(
                    412,
                    "Backlog Quota exceeds configured retention quota for namespace."
                    " Please increase retention quota and retry",
                )
            await control.set_backlog_quota(namespace, kind, quota)
        except BackendError as exc:
            return _reason(503, str(exc))
        return Response(204, content_type="text/plain")

    async def remove_quota(request: Request) -> Response:
        namespace, kind = writable_namespace_of(request), kind_of(request)
        if isinstance(namespace, Response):
            return namespace
        if isinstance(kind, Response):
            return kind
        try:
            await control.set_backlog_quota(namespace, kind, None)
        except BackendError as exc:
            return _reason(503, str(exc))
        return Response(204, content_type="text/plain")

    base = f"{ADMIN_PREFIX}/namespaces/{{tenant}}/{{namespace}}"
    router.add("GET", f"{base}/backlogQuotaMap", get_quotas)
    router.add("POST", f"{base}/backlogQuota", set_quota)
    router.add("DELETE", f"{base}/backlogQuota", remove_quota)
