"""Topics in the admin API: `/api/v1/topics` (a page of the default namespace's topics with
their numbers), `/api/v1/topics/{topic}` (one topic's stats with its subscriptions) and
`DELETE /api/v1/topics/{topic}`. `{topic}` is an MQTT name, percent-encoded (`a%2Fb`), or a full
Pulsar name (`persistent://tenant/ns/x`).

Every node answers from its backend: a merged node from its broker (a member of a mop broker
cluster for the topics it holds), a separated proxy by asking the brokers' HTTP admin
(`cluster.admin_url`). A Pulsar subscription is shown under its Pulsar name. Deleting a topic
leaves MQTT retained messages alone: they live in the retained table, not in the topic
(`/api/v1/retained/{topic}`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

from mop.admin.context import AdminContext
from mop.admin.http import HttpError, Request, Response, Router, json_response
from mop.processor import BackendError, ClientContext, TopicStats
from mop.protocols.pulsar.mapping import pulsar_subscription
from mop.topic_names import (
    FULL_NAME_SCHEMES,
    PulsarTopicName,
    is_system_topic,
    mqtt_to_pulsar,
    pulsar_to_mqtt,
)
from mop.topics import TopicError

__all__ = ["add_topic_routes", "backend_error"]

ADMIN_CONTEXT: Final = ClientContext(client_id="$admin", protocol="admin", internal=True)
DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000
# Stats asked at once for one page (a separated proxy asks the brokers over HTTP for each).
_CONCURRENT_STATS: Final = 16

# The HTTP status for a backend's refusal, by its reason.
_STATUS_BY_REASON: Final = {
    "topic_busy": 409,
    "invalid_topic": 400,
    "not_configured": 501,
    "unavailable": 503,
    "closed": 503,
    "not_authorized": 502,
    "bad_answer": 502,
}


def backend_error(exc: BackendError) -> HttpError:
    """The answer to a request the backend could not carry out."""
    return HttpError(_STATUS_BY_REASON.get(exc.reason, 500), str(exc))


def add_topic_routes(router: Router, context: AdminContext) -> None:
    settings = context.settings
    tenant, namespace = settings.default_tenant, settings.default_namespace
    processor = context.processor

    def full_name(topic: str) -> str:
        """The Pulsar name of a `{topic}` parameter; HttpError 400 when it names no topic."""
        try:
            if topic.startswith(FULL_NAME_SCHEMES):
                return str(PulsarTopicName.parse(topic))
            if not topic or "+" in topic or "#" in topic:
                raise HttpError(400, f"{topic!r} is not an MQTT topic name (no wildcards)")
            return mqtt_to_pulsar(topic, tenant=tenant, namespace=namespace)
        except TopicError as exc:
            raise HttpError(400, str(exc)) from None

    def mqtt_name(topic: str) -> str:
        return pulsar_to_mqtt(topic, tenant=tenant, namespace=namespace)

    async def stats_of(topic: str) -> TopicStats | None:
        try:
            return await processor.topic_stats(topic)
        except BackendError as exc:
            raise backend_error(exc) from None

    async def list_topics(request: Request) -> Response:
        prefix = request.arg("prefix", "") or ""
        offset = request.int_arg("offset", 0)
        limit = request.int_arg("limit", DEFAULT_LIMIT, high=MAX_LIMIT)
        try:
            names = await processor.topics(ADMIN_CONTEXT, f"{tenant}/{namespace}")
        except BackendError as exc:
            raise backend_error(exc) from None
        named = sorted(
            (mqtt, name)
            for mqtt, name in ((mqtt_name(name), name) for name in names)
            if mqtt.startswith(prefix) or name.startswith(prefix)
        )
        page = named[offset : offset + limit]
        found = await _page_stats([name for _, name in page], stats_of)
        items = [_summary(mqtt, name, found.get(name)) for mqtt, name in page]
        page_info = {"total": len(named), "offset": offset, "limit": limit}
        return json_response({"items": items, **page_info})

    async def get_topic(request: Request) -> Response:
        topic = full_name(request.params["topic"])
        stats = await stats_of(topic)
        if stats is None:
            raise HttpError(404, f"no topic {topic}")
        return json_response(_detail(mqtt_name(topic), stats))

    async def delete_topic(request: Request) -> Response:
        topic = full_name(request.params["topic"])
        force = _flag(request, "force")
        if is_system_topic(topic, tenant):
            raise HttpError(403, f"{topic} holds the deployment's own state; it is not deleted")
        try:
            deleted = await processor.delete_topic(topic, force=force)
        except BackendError as exc:
            raise backend_error(exc) from None
        if not deleted:
            raise HttpError(404, f"no topic {topic}")
        return Response(204, content_type="text/plain")

    router.add("GET", "/api/v1/topics", list_topics)
    router.add("GET", "/api/v1/topics/{topic}", get_topic)
    router.add("DELETE", "/api/v1/topics/{topic}", delete_topic)


def _flag(request: Request, name: str) -> bool:
    raw = request.arg(name)
    value = "false" if raw is None else raw.lower()
    if value not in ("true", "false", "1", "0"):
        raise HttpError(400, f"{name} must be true or false")
    return value in ("true", "1")


async def _page_stats(
    names: list[str], stats_of: Callable[[str], Awaitable[TopicStats | None]]
) -> dict[str, TopicStats | None]:
    """The stats of each topic of a page, asked a few at a time. A node that cannot ask for
    stats at all (a proxy without `cluster.admin_url`) gets none: the page still lists the
    names, with null numbers. Any other failure fails the page."""
    found: dict[str, TopicStats | None] = {}
    failures: list[HttpError] = []
    limiter = trio.CapacityLimiter(_CONCURRENT_STATS)

    async def one(name: str) -> None:
        async with limiter:
            if failures:
                return
            try:
                found[name] = await stats_of(name)
            except HttpError as exc:
                found[name] = None
                if exc.status != 501:
                    failures.append(exc)

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(one, name)
    if failures:
        raise failures[0]
    return found


def _summary(mqtt: str, topic: str, stats: TopicStats | None) -> dict[str, Any]:
    if stats is None:
        numbers: dict[str, Any] = dict.fromkeys(
            ("messages_in", "bytes_in", "storage_size", "subscriptions", "backlog")
        )
    else:
        numbers = {
            "messages_in": stats.inbound.messages,
            "bytes_in": stats.inbound.bytes,
            "storage_size": stats.storage_size,
            "subscriptions": len(stats.subscriptions),
            "backlog": stats.backlog,
        }
    return {"topic": mqtt, "pulsar_topic": topic, **numbers}


def _detail(mqtt: str, stats: TopicStats) -> dict[str, Any]:
    return {
        **_summary(mqtt, stats.topic, stats),
        "messages_out": stats.outbound.messages,
        "bytes_out": stats.outbound.bytes,
        "message_rate_in": stats.inbound.message_rate,
        "message_rate_out": stats.outbound.message_rate,
        "producers": len(stats.producers),
        "consumers": stats.consumers,
        "subscriptions_detail": [
            {
                "name": pulsar_subscription(stats.topic, sub.name),
                "type": None if sub.kind is None else sub.kind.value,
                "backlog": sub.backlog,
                "consumers": len(sub.consumers),
            }
            for sub in stats.subscriptions
        ],
    }
