"""MQTT control packets as plain frozen dataclasses, one class per packet type.

These are the events of the sans-IO codec: `codec.py` turns bytes into these objects and back.
They carry no behaviour beyond their fields, so every layer can construct and compare them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from mop.message import value


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


@dataclass(frozen=True, slots=True)
class Properties:
    """MQTT 5 properties; `None` means absent. Levels 3 and 4 always carry the empty default."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None


NO_PROPERTIES = Properties()


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    protocol_name: str = "MQTT"
    protocol_level: int = 4  # 3 = MQTT 3.1, 4 = 3.1.1, 5 = 5.0
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    bridge: bool = False  # high bit of the protocol level byte, set by mosquitto bridges
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connack:
    session_present: bool = False
    reason_code: int = 0  # for levels 3/4 this is the connect return code (0..5)
    properties: Properties = NO_PROPERTIES


# One is made for every message received: a cheaper value class (see `mop.message.value`).
@value
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # present iff qos > 0
    properties: Properties = NO_PROPERTIES


# The acks of QoS 1/2 flows: one or more made for every such message (value classes too).
@value
class Puback:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@value
class Pubrec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@value
class Pubrel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@value
class Pubcomp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class SubscriptionRequest:
    """One topic filter of a SUBSCRIBE with its options (MQTT 5 subscription options byte)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[SubscriptionRequest, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Suback:
    packet_id: int
    reason_codes: tuple[int, ...]  # granted QoS 0/1/2 or a failure code (0x80 for level 3/4)
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsuback:
    packet_id: int
    reason_codes: tuple[int, ...] = ()  # MQTT 5 only; levels 3/4 encode no payload
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pingreq:
    pass


@dataclass(frozen=True, slots=True)
class Pingresp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)

__all__ = [
    "Auth",
    "Connack",
    "Connect",
    "Disconnect",
    "NO_PROPERTIES",
    "Packet",
    "PacketType",
    "Pingreq",
    "Pingresp",
    "Properties",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "Suback",
    "Subscribe",
    "SubscriptionRequest",
    "Unsuback",
    "Unsubscribe",
    "Will",
]
