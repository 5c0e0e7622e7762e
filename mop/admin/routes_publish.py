"""Publishing a message as an MQTT client would: same topic rules (no wildcards, nothing under
`$SYS` or the deployment's own topics), retained messages retained."""

from __future__ import annotations

import base64
import re
from typing import Any, Final

from mop.admin.context import AdminContext
from mop.admin.http import HttpError, Request, Response, Router, json_response
from mop.admin.routes_retained import refused
from mop.processor import BackendError
from mop.protocols.introspection import BadTopic, PublishRequest, TooLarge

_FIELDS = frozenset({"topic", "payload", "payload_encoding", "qos", "retain", "properties"})
# Base64 as openapi.yaml has it: padded, nothing else (b64decode lets a few more through).
_BASE64: Final = re.compile(r"([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def publish_request(body: Any) -> PublishRequest:
    """The request a `POST /api/v1/publish` body describes; HttpError 400 when it is not one."""
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise HttpError(400, f"unknown fields: {', '.join(unknown)}")
    topic = body.get("topic")
    if not isinstance(topic, str):
        raise HttpError(400, "topic must be a string")
    payload = body.get("payload", "")
    encoding = body.get("payload_encoding", "utf-8")
    if not isinstance(payload, str):
        raise HttpError(400, "payload must be a string")
    if encoding == "utf-8":
        data = payload.encode("utf-8", "surrogatepass")
    elif encoding == "base64":
        if not _BASE64.fullmatch(payload):
            raise HttpError(400, "payload is not base64 (padded, without line breaks)")
        data = base64.b64decode(payload)
    else:
        raise HttpError(400, 'payload_encoding must be "utf-8" or "base64"')
    qos = body.get("qos", 0)
    if type(qos) is not int or qos not in (0, 1):
        raise HttpError(400, "qos must be 0 or 1")
    retain = body.get("retain", False)
    if not isinstance(retain, bool):
        raise HttpError(400, "retain must be true or false")
    properties = body.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(value, str) for value in properties.values()
    ):
        raise HttpError(400, "properties must be an object of strings (MQTT user properties)")
    return PublishRequest(topic, data, qos, retain, tuple(properties.items()))


def add_publish_routes(router: Router, context: AdminContext) -> None:
    async def publish(request: Request) -> Response:
        message = publish_request(request.json())
        publishers = [
            view.publisher for view in context.views().values() if view.publisher is not None
        ]
        if not publishers:
            raise HttpError(404, "this node takes no messages to publish (mqtt is not enabled)")
        try:
            message_id = await publishers[0].publish(message)
        except BadTopic as exc:
            raise refused(exc) from None
        except TooLarge as exc:
            raise HttpError(413, str(exc)) from None
        except ValueError as exc:
            raise HttpError(400, str(exc)) from None
        except BackendError as exc:
            raise HttpError(503, f"not published: {exc}") from None
        return json_response({"topic": message.topic, "message_id": message_id})

    router.add("POST", "/api/v1/publish", publish)
