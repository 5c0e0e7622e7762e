"""The server side of one MQTT connection as a pure state machine (no I/O).

Feed it bytes with `receive_data`, take packets with `next_event`, turn packets into bytes with
`send`. It enforces what is per connection: packet order (CONNECT first and once), topic aliases
in both directions, the server's Receive Maximum, the client's Maximum Packet Size, and the
Request Problem Information choice. Session semantics live above it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any, cast

from mop.protocols.mqtt.codec import NEED_DATA, NeedData, PacketDecoder, encode, encode_publish
from mop.protocols.mqtt.errors import (
    LocalProtocolError,
    MalformedPacket,
    PacketTooLarge,
    ProtocolViolation,
    RemoteProtocolError,
)
from mop.protocols.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
)
from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.topics import TopicError, validate_topic_name

# Packets a client may send once connected; anything else is a protocol error.
# A client sends them as it pleases once connected; nothing to check beyond their decoding.
_FLOW_ACKS: frozenset[type] = frozenset((Puback, Pubrec, Pubrel, Pubcomp))
_CLIENT_PACKETS = (
    Publish,
    Puback,
    Pubrec,
    Pubrel,
    Pubcomp,
    Subscribe,
    Unsubscribe,
    Pingreq,
    Disconnect,
    Auth,
)


class ConnectionState(Enum):
    AWAITING_CONNECT = "awaiting_connect"
    CONNECTED = "connected"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_packet_size: int = 1_048_576
    receive_maximum: int = 32
    topic_alias_maximum: int = 10
    max_topic_length: int = 65535
    max_topic_levels: int = 128


@lru_cache(maxsize=4096)
def _topic_problem(topic: str, max_length: int, max_levels: int) -> tuple[str, int] | None:
    """Why `topic` may not be published to, with the reason code, or None. Remembered: the
    same names come back in message after message."""
    try:
        validate_topic_name(topic, max_length=max_length, max_levels=max_levels)
    except TopicError as exc:
        return str(exc), exc.reason_code
    return None


# The inbound flows of a client below MQTT 5: never added to (see `_inbound_publish`).
_UNCOUNTED: set[int] = set()


class ServerConnection:
    __slots__ = (
        "_aliases_in",
        "_aliases_out",
        "_decoder",
        "_inbound_unacked",
        "_last_topic",
        "auth_method",
        "client_max_packet_size",
        "client_receive_maximum",
        "client_topic_alias_maximum",
        "limits",
        "problem_information",
        "protocol_level",
        "state",
    )

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.state = ConnectionState.AWAITING_CONNECT
        self.protocol_level = 4
        self._decoder = PacketDecoder(
            protocol_level=5, max_packet_size=limits.max_packet_size, expect_connect=True
        )
        # What the client told us in CONNECT.
        self.client_receive_maximum = 65535
        self.client_max_packet_size: int | None = None
        self.client_topic_alias_maximum = 0
        self.problem_information = True
        self.auth_method: str | None = None
        # Topic aliases each way, made when the first one is (most clients use none).
        self._aliases_in: dict[int, str] | None = None
        self._aliases_out: dict[str, int] | None = None
        # Inbound QoS 1/2 packet ids not yet answered with PUBACK / PUBCOMP (Receive Maximum),
        # counted for MQTT 5 clients only: the others share one set that stays empty.
        self._inbound_unacked: set[int] = _UNCOUNTED
        # The topic name of the last PUBLISH received, known to be valid.
        self._last_topic: str | None = None

    # -- receiving -------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> None:
        self._decoder.feed(bytes(data) if isinstance(data, bytearray) else data)

    def next_event(self) -> Packet | NeedData:
        """The next complete packet from the client, checked against the connection state.

        Raises RemoteProtocolError (with the reason code to answer) when the client misbehaves.
        """
        if self.state is ConnectionState.CLOSED:
            return NEED_DATA
        packet = self._decoder.next_packet()
        if self.state is ConnectionState.CONNECTED:
            # By far the most common cases first: a message, and the acks of its flow.
            if type(packet) is Publish:
                return self._inbound_publish(packet)
            if type(packet) in _FLOW_ACKS:
                return packet
        if isinstance(packet, NeedData):
            return packet
        if self.state is ConnectionState.AWAITING_CONNECT:
            if not isinstance(packet, Connect):
                raise ProtocolViolation(f"expected CONNECT, got {type(packet).__name__.upper()}")
            self._accept_connect(packet)
            return packet
        if not isinstance(packet, _CLIENT_PACKETS):
            raise ProtocolViolation(f"{type(packet).__name__.upper()} is not sent by clients")
        if isinstance(packet, Publish):
            return self._inbound_publish(packet)
        if isinstance(packet, Auth) and self.auth_method is None:
            raise ProtocolViolation("AUTH without an authentication method in CONNECT")
        return packet

    def _accept_connect(self, connect: Connect) -> None:
        self.protocol_level = connect.protocol_level
        self._decoder.protocol_level = connect.protocol_level
        if connect.protocol_level == 5:
            self._inbound_unacked = set()
        self._decoder.expect_connect = False
        self.state = ConnectionState.CONNECTED
        props = connect.properties
        if props.receive_maximum is not None:
            self.client_receive_maximum = props.receive_maximum
        self.client_max_packet_size = props.maximum_packet_size
        self.client_topic_alias_maximum = props.topic_alias_maximum or 0
        self.problem_information = props.request_problem_information != 0
        self.auth_method = props.authentication_method

    def _inbound_publish(self, publish: Publish) -> Publish:
        props = publish.properties
        if props.subscription_identifiers:
            # Only the server sends them [MQTT-3.3.4-6].
            raise MalformedPacket("PUBLISH from a client with a subscription identifier")
        alias = props.topic_alias
        topic = publish.topic
        if alias is not None:
            if alias > self.limits.topic_alias_maximum:
                raise RemoteProtocolError(
                    f"topic alias {alias} above the maximum {self.limits.topic_alias_maximum}",
                    reason_code=ReasonCode.TOPIC_ALIAS_INVALID,
                )
            if topic:
                if self._aliases_in is None:
                    self._aliases_in = {}
                self._aliases_in[alias] = topic
            else:
                known = None if self._aliases_in is None else self._aliases_in.get(alias)
                if known is None:
                    raise ProtocolViolation(f"topic alias {alias} was never set")
                topic = known
            publish = dataclasses.replace(
                publish,
                topic=topic,
                properties=dataclasses.replace(publish.properties, topic_alias=None),
            )
        if topic != self._last_topic:  # a client mostly publishes to the topic it just did
            limits = self.limits
            problem = _topic_problem(topic, limits.max_topic_length, limits.max_topic_levels)
            if problem is not None:
                raise RemoteProtocolError(problem[0], reason_code=problem[1])
            self._last_topic = topic
        # Only MQTT 5 clients learn our Receive Maximum (in CONNACK); 3.1/3.1.1 clients are
        # bounded by their 65535 packet identifiers alone, so only MQTT 5 flows are counted.
        if publish.qos and self.protocol_level == 5 and publish.packet_id is not None:
            pid = publish.packet_id
            if pid not in self._inbound_unacked:
                if len(self._inbound_unacked) >= self.limits.receive_maximum:
                    raise RemoteProtocolError(
                        f"more than {self.limits.receive_maximum} QoS 1/2 messages in flight",
                        reason_code=ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                    )
                self._inbound_unacked.add(pid)
        return publish

    @property
    def inbound_full(self) -> bool:
        """Whether the next QoS 1/2 PUBLISH would exceed our Receive Maximum unless some
        of those received are answered first."""
        return len(self._inbound_unacked) >= self.limits.receive_maximum

    # -- sending ---------------------------------------------------------------------------

    def send(self, packet: Packet) -> bytes:
        """Encode a packet for this client (at its protocol level)."""
        if isinstance(packet, Publish):
            raise LocalProtocolError("use send_publish for PUBLISH")
        if isinstance(packet, Puback | Pubcomp) or (
            isinstance(packet, Pubrec) and packet.reason_code >= 0x80
        ):
            self._inbound_unacked.discard(packet.packet_id)
        elif isinstance(packet, Disconnect | Connack) and (
            isinstance(packet, Disconnect) or packet.reason_code >= 0x80
        ):
            self.state = ConnectionState.CLOSED
        if (
            not self.problem_information
            and self.protocol_level == 5
            and not isinstance(packet, Connack | Disconnect)
        ):
            packet = _without_problem_information(packet)
        data = encode(packet, self.protocol_level)
        limit = self.client_max_packet_size
        if limit is not None and len(data) > limit:
            return self._fitted(packet, limit)
        return data

    def fits(self, packet: Packet) -> bool:
        """Whether `send` can send `packet` within the client's Maximum Packet Size (once
        stripped of what it may go without)."""
        limit = self.client_max_packet_size
        if limit is None:
            return True
        stripped = _without_problem_information(packet)
        return len(encode(stripped, self.protocol_level)) <= limit

    def _fitted(self, packet: Packet, limit: int) -> bytes:
        """`packet` within the client's Maximum Packet Size [MQTT-3.1.2-24]: without its
        reason string and user properties, which a packet may go without (MQTT 5 sections
        3.1.2.11.4, 3.4.2.2.2...). A DISCONNECT that does not fit even so is not sent (the
        connection closes all the same); any other packet raises PacketTooLarge, and the
        connection is to be closed (0x95)."""
        data = encode(_without_problem_information(packet), self.protocol_level)
        if len(data) <= limit:
            return data
        if isinstance(packet, Disconnect):
            return b""
        self.state = ConnectionState.CLOSED
        raise PacketTooLarge(
            f"{type(packet).__name__.upper()} of {len(data)} bytes exceeds the client's "
            f"Maximum Packet Size ({limit})"
        )

    def send_puback(self, packet_id: int, reason: int = 0) -> bytes:
        """`send(Puback(packet_id, reason))` without building the packet: the ack of every
        QoS 1 message. `reason` must be a PUBACK reason code; it is left out below MQTT 5."""
        self._inbound_unacked.discard(packet_id)
        if reason and self.protocol_level == 5:
            return bytes((0x40, 3, packet_id >> 8, packet_id & 0xFF, reason))
        return bytes((0x40, 2, packet_id >> 8, packet_id & 0xFF))

    # `send` of the acks of a QoS 2 flow without properties, without building the packet:
    # three of them for every QoS 2 message. `reason` must be valid for the packet; it is
    # left out below MQTT 5, and when 0.

    def send_pubrec(self, packet_id: int, reason: int = 0) -> bytes:
        if reason >= 0x80:
            self._inbound_unacked.discard(packet_id)
        return self._flow_ack(0x50, packet_id, reason)

    def send_pubrel(self, packet_id: int, reason: int = 0) -> bytes:
        return self._flow_ack(0x62, packet_id, reason)

    def send_pubcomp(self, packet_id: int, reason: int = 0) -> bytes:
        self._inbound_unacked.discard(packet_id)
        return self._flow_ack(0x70, packet_id, reason)

    def _flow_ack(self, first_byte: int, packet_id: int, reason: int) -> bytes:
        if reason and self.protocol_level == 5:
            return bytes((first_byte, 3, packet_id >> 8, packet_id & 0xFF, reason))
        return bytes((first_byte, 2, packet_id >> 8, packet_id & 0xFF))

    def send_publish(self, publish: Publish) -> bytes | None:
        """Encode an outbound PUBLISH, using a topic alias when the client allows them.

        Returns None when the packet exceeds the client's Maximum Packet Size: the message is
        then dropped for this client (MQTT 5 section 3.1.2.25), never sent truncated.
        """
        return self.publish_bytes(
            publish.topic,
            publish.payload,
            publish.qos,
            publish.retain,
            publish.dup,
            publish.packet_id,
            publish.properties,
        )

    def publish_bytes(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        properties: Properties,
    ) -> bytes | None:
        """`send_publish` from the fields, without building a `Publish` (the delivery path)."""
        props = properties
        alias_topic = topic
        assigned = False
        if self.client_topic_alias_maximum:
            aliases = self._aliases_out
            if aliases is None:
                aliases = self._aliases_out = {}
            alias = aliases.get(topic)
            if alias is not None:
                alias_topic = ""
                props = dataclasses.replace(props, topic_alias=alias)
            elif len(aliases) < self.client_topic_alias_maximum:
                alias = len(aliases) + 1
                aliases[topic] = alias
                props = dataclasses.replace(props, topic_alias=alias)
                assigned = True
        data = encode_publish(
            alias_topic,
            payload,
            qos=qos,
            retain=retain,
            dup=dup,
            packet_id=packet_id,
            properties=props,
            protocol_level=self.protocol_level,
        )
        limit = self.client_max_packet_size
        if limit is not None and len(data) > limit:
            if assigned and self._aliases_out is not None:
                # The client never learns an alias from a packet that is not sent.
                del self._aliases_out[topic]
            return None
        return data


def _without_problem_information(packet: Packet) -> Packet:
    """Drop reason strings and user properties (the client set Request Problem Information
    to 0, MQTT 5 section 3.1.2.11.7)."""
    props: Properties | None = getattr(packet, "properties", None)
    if props is None or (props.reason_string is None and not props.user_properties):
        return packet
    stripped = dataclasses.replace(props, reason_string=None, user_properties=())
    return cast(Packet, dataclasses.replace(cast(Any, packet), properties=stripped))
