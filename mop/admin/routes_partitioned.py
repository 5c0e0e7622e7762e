"""Apache Pulsar's admin REST API v2 for partitioned topics, which Pulsar's own tools use. A
broker node keeps the metadata; a separated proxy serves the same routes by asking its brokers
(`mop.backends.cluster.partitioned`, through `cluster.admin_url`).

- `PUT .../{topic}/partitions` (body: the count): 204; 409 when it exists (or an ordinary topic
  of that name does), 406 for a count out of 1..4096 (`mop.partitioned.MAX_PARTITIONS`);
- `POST .../{topic}/partitions` (body: the new count): 204; 404 when not partitioned, 422 for a
  count that is not more than there are (partitions are never taken away);
- `GET .../{topic}/partitions`: `{"partitions": N}`, 0 for a topic that is not partitioned;
- `DELETE .../{topic}/partitions?force=true`: deletes the partitions, then the metadata: 204,
  404 when not partitioned, 412 while a partition has clients and `force` is not set;
- `GET /admin/v2/{persistent|non-persistent}/{tenant}/{namespace}/partitioned`: the
  partitioned topics of that domain.

In a cluster of several brokers the member that owns a partitioned topic's name keeps its
metadata (the others answer 421, as for every topic); its partitions are spread over the
members like any topics. A delete at the owner deletes the other members' partitions too,
through their admin (`cluster.admin_url` on the brokers), after checking they are idle.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Final

from mop.admin.context import AdminContext
from mop.admin.http import HttpError, Request, Response, Router, json_response
from mop.admin.routes_pulsar import force_of, namespace_of_path, owned_topic, reason_response
from mop.membership import Membership
from mop.partitioned import PartitionedTopics
from mop.processor import BackendError
from mop.protocols.pulsar.admin_rest import ADMIN_PREFIX

__all__ = ["add_partitioned_routes"]

_STATUS_BY_REASON: Final = {
    "already_exists": 409,
    "invalid_partitions": 406,
    "fewer_partitions": 422,
    "not_found": 404,
    "partition_name": 412,
    "topic_busy": 412,
    "invalid_topic": 400,
    "not_authorized": 403,
    "unavailable": 503,
    "closed": 503,
}


def _refused(exc: BackendError) -> Response:
    return reason_response(_STATUS_BY_REASON.get(exc.reason, 500), str(exc))


def _count(request: Request) -> int | Response:
    """The body: a JSON integer (Pulsar's admin client sends the count alone), or the answer
    refusing it."""
    try:
        value = request.json()
    except HttpError as exc:
        return reason_response(400, exc.message)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 3.0 is the integer 3 in JSON
    if isinstance(value, bool) or not isinstance(value, int):
        return reason_response(400, "the body must be the number of partitions (a JSON integer)")
    return value


def add_partitioned_routes(router: Router, context: AdminContext, broker: Membership) -> None:
    processor = context.processor

    def partitioned() -> PartitionedTopics:
        return processor.partitioned

    async def change_count(
        request: Request, change: Callable[[str, int], Awaitable[None]]
    ) -> Response:
        """Creating and growing: the topic of the path and the count of the body."""
        topic = owned_topic(request, broker)
        if isinstance(topic, Response):
            return topic
        count = _count(request)
        if isinstance(count, Response):
            return count
        try:
            await change(topic, count)
        except BackendError as exc:
            return _refused(exc)
        return Response(204, content_type="text/plain")

    async def create(request: Request) -> Response:
        return await change_count(request, partitioned().create)

    async def grow(request: Request) -> Response:
        return await change_count(request, partitioned().grow)

    async def metadata(request: Request) -> Response:
        topic = owned_topic(request, broker)
        if isinstance(topic, Response):
            return topic
        try:
            count = await partitioned().partitions(topic)
        except BackendError as exc:
            return _refused(exc)
        return json_response({"partitions": count})

    async def delete(request: Request) -> Response:
        topic = owned_topic(request, broker)
        if isinstance(topic, Response):
            return topic
        force = force_of(request)
        if isinstance(force, Response):
            return force
        try:
            deleted = await partitioned().delete(topic, force=force)
        except BackendError as exc:
            return _refused(exc)
        if not deleted:
            return reason_response(404, "Partitioned topic does not exist")
        return Response(204, content_type="text/plain")

    async def listing(request: Request, *, domain: str) -> Response:
        namespace = namespace_of_path(request)
        if isinstance(namespace, Response):
            return namespace
        try:
            names = await partitioned().names(namespace, domain)
        except BackendError as exc:
            return _refused(exc)
        return json_response(names)

    topic_path = f"{ADMIN_PREFIX}/{{domain}}/{{tenant}}/{{namespace}}/{{topic}}/partitions"
    router.add("PUT", topic_path, create)
    router.add("POST", topic_path, grow)
    router.add("GET", topic_path, metadata)
    router.add("DELETE", topic_path, delete)
    for domain in ("persistent", "non-persistent"):
        path = f"{ADMIN_PREFIX}/{domain}/{{tenant}}/{{namespace}}/partitioned"
        router.add("GET", path, functools.partial(listing, domain=domain))
