"""MQTT PUBLISH <-> protocol-neutral Message, with documented Pulsar property names.

MQTT 5 user properties travel unchanged as message properties (order and duplicates kept); the
MQTT-specific fields use the reserved names below so Pulsar applications can read them too.
"""

from __future__ import annotations

import base64
import dataclasses
import math

from mop.message import ENCRYPTED, RETAINED, Message
from mop.protocols.mqtt.packets import NO_PROPERTIES, Properties, Publish

CONTENT_TYPE = "mqtt.content_type"
RESPONSE_TOPIC = "mqtt.response_topic"
CORRELATION_DATA = "mqtt.correlation_data"  # base64, as properties are strings
PAYLOAD_FORMAT = "mqtt.payload_format"
RETAIN = RETAINED[0]
RESERVED_PREFIX = "mqtt."


def publish_to_message(publish: Publish, *, client_id: str, now_ms: int) -> Message:
    """Build the stored message for an incoming PUBLISH (topic is carried separately)."""
    props = publish.properties
    if props is NO_PROPERTIES and not publish.retain:
        return Message(
            payload=publish.payload, producer=client_id, publish_time=now_ms, qos=publish.qos
        )
    pairs: list[tuple[str, str]] = []
    if props.content_type is not None:
        pairs.append((CONTENT_TYPE, props.content_type))
    if props.response_topic is not None:
        pairs.append((RESPONSE_TOPIC, props.response_topic))
    if props.correlation_data is not None:
        pairs.append((CORRELATION_DATA, base64.b64encode(props.correlation_data).decode()))
    if props.payload_format_indicator is not None:
        pairs.append((PAYLOAD_FORMAT, str(props.payload_format_indicator)))
    if publish.retain:
        pairs.append(RETAINED)
    pairs.extend(props.user_properties)
    if ENCRYPTED in props.user_properties:  # mop's own mark: no client may claim it
        pairs = [pair for pair in pairs if pair != ENCRYPTED]
    expiry = props.message_expiry_interval
    return Message(
        payload=publish.payload,
        properties=tuple(pairs),
        producer=client_id,
        publish_time=now_ms,
        qos=publish.qos,
        expires_at=now_ms + expiry * 1000 if expiry is not None else 0,
    )


def with_properties(message: Message, extra: tuple[tuple[str, str], ...]) -> Message:
    """`message` with the properties `extra` added after its own (e.g. a trace context)."""
    return dataclasses.replace(message, properties=message.properties + extra)


def was_retained(message: Message) -> bool:
    return RETAINED in message.properties


def message_properties(
    message: Message, *, now_ms: int, subscription_identifiers: tuple[int, ...] = ()
) -> Properties:
    """MQTT 5 PUBLISH properties for delivering `message` now (expiry counts down)."""
    if not message.properties and not message.expires_at and not subscription_identifiers:
        return NO_PROPERTIES
    content_type = response_topic = None
    correlation: bytes | None = None
    payload_format: int | None = None
    user: list[tuple[str, str]] = []
    for name, value in message.properties:
        if not name.startswith(RESERVED_PREFIX):
            user.append((name, value))
        elif name == CONTENT_TYPE:
            content_type = value
        elif name == RESPONSE_TOPIC:
            response_topic = value
        elif name == CORRELATION_DATA:
            correlation = _b64(value)
        elif name == PAYLOAD_FORMAT:
            payload_format = 1 if value == "1" else 0
    expiry = None
    if message.expires_at:
        expiry = max(1, math.ceil((message.expires_at - now_ms) / 1000))
    return Properties(
        payload_format_indicator=payload_format,
        message_expiry_interval=expiry,
        content_type=content_type,
        response_topic=response_topic,
        correlation_data=correlation,
        subscription_identifiers=subscription_identifiers,
        user_properties=tuple(user),
    )


def _b64(value: str) -> bytes | None:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        return None  # written by a non-MQTT producer in another form: drop, don't fail delivery
