"""CONNECT negotiation as a pure function: what the server accepts of a CONNECT, or why not.

`negotiate_connect` decides (client id, session expiry, keep alive, will, CONNACK properties);
the trio side carries the decision out (the client lease, taking and attaching the session).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from mop.protocols.mqtt.packets import NO_PROPERTIES, Connect, Properties, Will
from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.settings import MqttSettings
from mop.topics import TopicError, validate_topic_name


@dataclass(frozen=True, slots=True)
class ConnectPolicy:
    """What the server offers and allows a connecting client (from `MqttSettings`)."""

    max_session_expiry: int
    # The expiry of an MQTT 3.1.1 persistent session, which carries none of its own.
    default_session_expiry: int
    max_keep_alive: int
    receive_maximum: int
    max_packet_size: int
    topic_alias_maximum: int
    retain_available: bool
    max_topic_length: int
    max_topic_levels: int
    # MQTT 5 enhanced authentication methods offered (`JWT_METHOD` when tokens are checked).
    auth_methods: frozenset[str] = frozenset()

    @classmethod
    def from_settings(
        cls, settings: MqttSettings, *, auth_methods: frozenset[str] = frozenset()
    ) -> ConnectPolicy:
        return cls(
            max_session_expiry=settings.max_session_expiry,
            default_session_expiry=settings.default_session_expiry,
            max_keep_alive=settings.max_keep_alive,
            receive_maximum=settings.max_inflight,
            max_packet_size=settings.max_packet_size,
            topic_alias_maximum=settings.topic_alias_maximum,
            retain_available=settings.retain_available,
            max_topic_length=settings.max_topic_length,
            max_topic_levels=settings.max_topic_levels,
            auth_methods=auth_methods,
        )


# The enhanced authentication method mop offers: the client's JWT as Authentication Data, in
# CONNECT and again in an AUTH packet (Re-authenticate) before it expires.
JWT_METHOD = "JWT"


@dataclass(frozen=True, slots=True)
class ConnectRefusal:
    """The CONNECT is refused: answered with `reason_code` (an MQTT 5 CONNACK reason code,
    mapped to a 3.1.1 return code for older clients); `why` goes into the log and, when the
    client asked for problem information, the CONNACK."""

    reason_code: ReasonCode
    why: str
    # False: no CONNACK at all, the connection is closed (a 3.1.1 CONNECT that does not
    # conform to the spec, [MQTT-3.1.4-1]).
    answered: bool = True


@dataclass(frozen=True, slots=True)
class ConnectDecision:
    """The CONNECT is accepted with these terms, once the session can be taken and stored."""

    client_id: str
    session_expiry: int  # seconds the session outlives the connection
    keep_alive: int  # seconds; 0: no keep-alive check
    will: Will | None
    # The enhanced authentication method the client uses (one of the policy's), if any.
    auth_method: str | None
    # The properties of the CONNACK (NO_PROPERTIES below MQTT 5): the assigned client id,
    # the expiry and keep alive where the server changed them, and the server's limits.
    connack_properties: Properties


def new_client_id() -> str:
    """A client id for a client that connects without one."""
    return f"mop-{uuid.uuid4().hex}"


def negotiate_connect(
    connect: Connect,
    policy: ConnectPolicy,
    *,
    assign_client_id: Callable[[], str] = new_client_id,
) -> ConnectDecision | ConnectRefusal:
    """Decide what the server accepts of `connect` under `policy`, or why it refuses it.

    The refusals come in the order of the checks: an empty client id in MQTT 3.1 or on a
    persistent MQTT 3.1.1 session, an authentication method not offered, an invalid will topic.
    """
    v5 = connect.protocol_level == 5
    client_id = connect.client_id
    assigned = None
    if not client_id:
        if connect.protocol_level == 3:
            return ConnectRefusal(
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 requires a client id"
            )
        if not v5 and not connect.clean_start:
            return ConnectRefusal(
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "an empty client id needs a clean session"
            )
        client_id = assigned = assign_client_id()
    method = connect.properties.authentication_method
    if method is not None and method not in policy.auth_methods:
        return ConnectRefusal(
            ReasonCode.BAD_AUTHENTICATION_METHOD,
            f"authentication method {method!r} is not supported",
        )
    if connect.will is not None:
        problem = _topic_problem(connect.will.topic, policy)
        if problem is not None:
            # Below MQTT 5 no return code says it; a will topic that is no topic name at all
            # (empty, wildcards) makes the CONNECT non-conforming: closed without a CONNACK.
            return ConnectRefusal(
                ReasonCode.TOPIC_NAME_INVALID,
                f"will topic: {problem}",
                answered=v5 or _is_topic_name(connect.will.topic),
            )
    if v5:
        requested = connect.properties.session_expiry_interval or 0
    else:
        requested = 0 if connect.clean_start else policy.default_session_expiry
    expiry = min(requested, policy.max_session_expiry)
    keep_alive = connect.keep_alive
    server_keep_alive = None
    if keep_alive > policy.max_keep_alive or (
        keep_alive == 0 and v5 and policy.max_keep_alive < 65535
    ):
        keep_alive = server_keep_alive = policy.max_keep_alive
    props = NO_PROPERTIES
    if v5:
        props = Properties(
            session_expiry_interval=expiry if expiry != requested else None,
            assigned_client_identifier=assigned,
            server_keep_alive=server_keep_alive,
            receive_maximum=policy.receive_maximum,
            maximum_packet_size=policy.max_packet_size,
            topic_alias_maximum=policy.topic_alias_maximum,
            retain_available=None if policy.retain_available else 0,
            response_information=(
                f"response/{client_id}" if connect.properties.request_response_information else None
            ),
            authentication_method=method,
        )
    return ConnectDecision(
        client_id=client_id,
        session_expiry=expiry,
        keep_alive=keep_alive,
        will=connect.will,
        auth_method=method,
        connack_properties=props,
    )


def _is_topic_name(topic: str) -> bool:
    """Whether `topic` is a topic name as the spec defines one, whatever the server's limits
    of length and levels."""
    try:
        validate_topic_name(topic, max_length=65535, max_levels=65536)
    except TopicError:
        return False
    return True


def _topic_problem(topic: str, policy: ConnectPolicy) -> str | None:
    try:
        validate_topic_name(
            topic, max_length=policy.max_topic_length, max_levels=policy.max_topic_levels
        )
    except TopicError as exc:
        return str(exc)
    return None
