"""On a broker node (a merged node serving the Pulsar protocol): the part of Apache Pulsar's
admin REST API v2 that separated proxies ask (`mop.backends.cluster.topic_admin`), and that
Pulsar's own tools can use too.

- `GET /admin/v2/{domain}/{tenant}/{namespace}`: the topics of the namespace this broker holds;
- `GET /admin/v2/{domain}/{tenant}/{namespace}/{topic}/stats`: Pulsar's TopicStats JSON;
- `DELETE /admin/v2/{domain}/{tenant}/{namespace}/{topic}?force=true`: 204, or 412 while the
  topic has connected consumers or producers and `force` is not set.

`{topic}` is the local name percent-encoded (`a%252Fb` for the local name `a%2Fb`, the MQTT topic
`a/b`). Errors are Pulsar's `{"reason": "..."}`. In a cluster of several brokers a member
answers for the topics it owns; for another member's topic it answers 421 Misdirected Request
(naming the owner), and a proxy asks the next broker of its `cluster.admin_url`.
"""

from __future__ import annotations

from typing import Any, Final

from mop.admin.context import AdminContext
from mop.admin.http import Request, Response, Router, json_response
from mop.admin.routes_topics import ADMIN_CONTEXT
from mop.membership import Membership
from mop.processor import BackendError
from mop.protocols.pulsar.admin_rest import ADMIN_PREFIX, DOMAINS, stats_document
from mop.topic_names import PulsarTopicName
from mop.topics import TopicError

__all__ = [
    "NOT_OWNER",
    "add_pulsar_admin_routes",
    "force_of",
    "namespace_of_path",
    "owned_topic",
    "reason_response",
]

NOT_OWNER: Final = 421
# Pulsar's answer to a delete of a topic that has connected clients.
_BUSY: Final = 412
_STATUS_BY_REASON: Final = {"topic_busy": _BUSY, "invalid_topic": 400, "closed": 503}


def reason_response(status: int, reason: str) -> Response:
    """An error as Pulsar's admin answers it: {"reason": ...}."""
    return json_response({"reason": reason}, status)


def namespace_of_path(request: Request) -> str | Response:
    """ "tenant/namespace" of the path, or the answer refusing it."""
    tenant, namespace = request.params["tenant"], request.params["namespace"]
    try:
        # The names are checked as those of a topic's are (any local name will do).
        PulsarTopicName("persistent", tenant, namespace, "-")
    except TopicError as exc:
        return reason_response(412, str(exc))
    return f"{tenant}/{namespace}"


def force_of(request: Request) -> bool | Response:
    """The `force` argument of a delete (false when absent), or the answer refusing it."""
    raw = request.arg("force")
    force = "false" if raw is None else raw.lower()
    if force not in ("true", "false"):
        return reason_response(400, "force must be true or false")
    return force == "true"


def owned_topic(request: Request, broker: Membership) -> str | Response:
    """The full name the path names, or the answer refusing it (421 when another member of
    the cluster owns it)."""
    params = request.params
    domain = params["domain"]
    if domain not in DOMAINS:
        return reason_response(404, f"no such domain: {domain}")
    name = f"{domain}://{params['tenant']}/{params['namespace']}/{params['topic']}"
    try:
        topic = str(PulsarTopicName.parse(name))
    except TopicError as exc:
        return reason_response(412, str(exc))
    if not broker.owns(topic):
        return reason_response(
            NOT_OWNER, f"{topic} is owned by {broker.owner(topic)}, not by {broker.url}"
        )
    return topic


def add_pulsar_admin_routes(router: Router, context: AdminContext, broker: Membership) -> None:
    processor = context.processor

    def topic_of(request: Request) -> str | Response:
        return owned_topic(request, broker)

    def refused(exc: BackendError) -> Response:
        return reason_response(_STATUS_BY_REASON.get(exc.reason, 500), str(exc))

    async def namespace_topics(request: Request) -> Response:
        params = request.params
        domain = params["domain"]
        if domain not in DOMAINS:
            return reason_response(404, f"no such domain: {domain}")
        namespace = namespace_of_path(request)
        if isinstance(namespace, Response):
            return namespace
        try:
            names = await processor.topics(ADMIN_CONTEXT, namespace)
        except BackendError as exc:
            return refused(exc)
        return json_response(sorted(name for name in names if name.startswith(f"{domain}://")))

    async def topic_stats(request: Request) -> Response:
        topic = topic_of(request)
        if isinstance(topic, Response):
            return topic
        try:
            stats = await processor.topic_stats(topic)
        except BackendError as exc:
            return refused(exc)
        if stats is None:
            return reason_response(404, "Topic not found")
        document: dict[str, Any] = stats_document(stats)
        return json_response(document)

    async def delete_topic(request: Request) -> Response:
        topic = topic_of(request)
        if isinstance(topic, Response):
            return topic
        force = force_of(request)
        if isinstance(force, Response):
            return force
        try:
            deleted = await processor.delete_topic(topic, force=force)
        except BackendError as exc:
            return refused(exc)
        if not deleted:
            return reason_response(404, "Topic not found")
        return Response(204, content_type="text/plain")

    base = f"{ADMIN_PREFIX}/{{domain}}/{{tenant}}/{{namespace}}"
    router.add("GET", base, namespace_topics)
    router.add("GET", f"{base}/{{topic}}/stats", topic_stats)
    router.add("DELETE", f"{base}/{{topic}}", delete_topic)
