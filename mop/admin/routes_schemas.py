"""Schemas in Apache Pulsar's admin REST API v2, on every node (a separated proxy asks its
brokers): Pulsar's own tools and scripts can use them as they are.

- `GET /admin/v2/schemas/{tenant}/{namespace}/{topic}/schema[/{version}]`: the latest (or that)
  version of the topic's schema, as Pulsar's GetSchemaResponse JSON; 404 when it has none;
- `DELETE` of the same path: forget every version (as Pulsar's admin API does); Pulsar's
  DeleteSchemaResponse `{"version": N}` (the latest version it had), 404 when it has none;
- `GET /admin/v2/namespaces/{tenant}/{namespace}/schemaCompatibilityStrategy`: the namespace's
  rule, a JSON string such as `"FULL"`;
- `PUT` of the same path with a JSON string sets it; `"UNDEFINED"` puts the namespace back on
  the node's default (`pulsar.schema_compatibility`). 204.

Errors are Pulsar's `{"reason": "..."}`.
"""

from __future__ import annotations

import re
from typing import Any, Final

from mop.admin.context import AdminContext
from mop.admin.http import Request, Response, Router, json_response
from mop.admin.routes_pulsar import NOT_OWNER, namespace_of_path, reason_response
from mop.processor import BackendError
from mop.protocols.pulsar.admin_rest import ADMIN_PREFIX
from mop.schemas import Compatibility, StoredSchema, schema_name
from mop.topic_names import PulsarTopicName
from mop.topics import TopicError

__all__ = ["add_schema_routes", "schema_document"]

# The value that puts a namespace back on the default rule (Pulsar's name for "not set").
UNDEFINED: Final = "UNDEFINED"
_VERSION: Final = re.compile(r"[0-9]+")
# Versions are Pulsar's signed 64-bit longs: a larger number names none.
_VERSION_LIMIT: Final = 2**63
_STATUS_BY_REASON: Final = {
    "invalid_topic": 412,
    "not_found": 404,
    "closed": 503,
    "unavailable": 503,
    "not_configured": 501,
}


def schema_document(stored: StoredSchema) -> dict[str, Any]:
    """Pulsar's GetSchemaResponse JSON for one version of a schema."""
    info = stored.info
    return {
        "version": stored.version,
        "type": info.kind.value,
        "timestamp": stored.timestamp,
        "data": info.data.decode("utf-8", "replace"),
        "properties": dict(info.properties),
    }


def add_schema_routes(router: Router, context: AdminContext) -> None:
    processor = context.processor

    def refused(exc: BackendError) -> Response:
        return reason_response(_STATUS_BY_REASON.get(exc.reason, 500), str(exc))

    def schema_topic(request: Request) -> str | Response:
        """The topic the path names, or the answer when this node cannot serve its schema."""
        params = request.params
        name = f"persistent://{params['tenant']}/{params['namespace']}/{params['topic']}"
        try:
            topic = str(PulsarTopicName.parse(name))
        except TopicError as exc:
            return reason_response(412, str(exc))
        broker = context.broker
        # The partitions of a topic share one schema, kept by the owner of the topic's name.
        keeper = f"persistent://{schema_name(topic)}"
        if broker is not None and not broker.owns(keeper):
            # A member of a mop broker cluster keeps the schemas of the names it owns.
            return reason_response(
                NOT_OWNER,
                f"the schema of {topic} is kept by {broker.owner(keeper)}, not by {broker.url}",
            )
        return topic

    async def get_schema(request: Request) -> Response:
        topic = schema_topic(request)
        if isinstance(topic, Response):
            return topic
        params = request.params
        version = None
        if "version" in params:
            if not _VERSION.fullmatch(params["version"]):
                return reason_response(400, "the schema version must be a number (0, 1, ...)")
            version = int(params["version"])
            if version >= _VERSION_LIMIT:
                return reason_response(404, "Schema not found")
        try:
            stored = await processor.schema(topic, version)
        except BackendError as exc:
            return refused(exc)
        if stored is None:
            return reason_response(404, "Schema not found")
        return json_response(schema_document(stored))

    async def delete_schema(request: Request) -> Response:
        topic = schema_topic(request)
        if isinstance(topic, Response):
            return topic
        try:
            version = await processor.delete_schema(topic)
        except BackendError as exc:
            return refused(exc)
        if version is None:
            return reason_response(404, "Schema not found")
        return json_response({"version": version})

    async def get_compatibility(request: Request) -> Response:
        namespace = namespace_of_path(request)
        if isinstance(namespace, Response):
            return namespace
        try:
            rule = await processor.schema_compatibility(namespace)
        except BackendError as exc:
            return refused(exc)
        return json_response(rule.value)

    async def set_compatibility(request: Request) -> Response:
        namespace = namespace_of_path(request)
        if isinstance(namespace, Response):
            return namespace
        value = request.json()
        choices = [UNDEFINED, *(rule.value for rule in Compatibility)]
        if value not in choices:
            return reason_response(
                400, "the body must be one of " + ", ".join(f'"{c}"' for c in choices)
            )
        rule = None if value == UNDEFINED else Compatibility(value)
        try:
            await processor.set_schema_compatibility(namespace, rule)
        except BackendError as exc:
            return refused(exc)
        return Response(204, content_type="text/plain")

    schema = f"{ADMIN_PREFIX}/schemas/{{tenant}}/{{namespace}}/{{topic}}/schema"
    router.add("GET", schema, get_schema)
    router.add("DELETE", schema, delete_schema)
    router.add("GET", f"{schema}/{{version}}", get_schema)
    strategy = f"{ADMIN_PREFIX}/namespaces/{{tenant}}/{{namespace}}/schemaCompatibilityStrategy"
    router.add("GET", strategy, get_compatibility)
    router.add("PUT", strategy, set_compatibility)
