"""MQTT session state: subscriptions, packet identifiers in flight, QoS 2 receipts, the will.

Pure data with a compact JSON form, so a session can be stored in a processor table and resumed
by any node or proxy. Live connection objects hang off it but are never serialized.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mop.message import Delivery, Message, MessageId
from mop.protocols.mqtt.packets import Properties, Will

if TYPE_CHECKING:
    from mop.processor.backend import Consumer


# A session expiry interval of 0xFFFFFFFF means the session never expires (MQTT 5 3.1.2.11.2).
NEVER_EXPIRES = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int | None = None


@dataclass(slots=True)
class Outbound:
    """A QoS 1/2 PUBLISH sent to the client and not yet completed."""

    packet_id: int
    qos: int
    topic: str  # canonical topic name
    message_id: MessageId | None  # None for messages not taken from a consumer (retained)
    released: bool = False  # PUBREC received, PUBREL sent: only PUBCOMP is missing
    delivery: Delivery | None = None  # the live delivery to acknowledge; not persisted
    message: Message | None = None  # kept for resending when there is no delivery
    consumer: Consumer | None = None  # who gets the acknowledgement; not persisted


@dataclass(slots=True)
class SessionState:
    """One client's session. Its JSON form holds everything but the QoS 2 flows in progress,
    which are stored one record per packet id (see `outbound_to_bytes`)."""

    client_id: str
    expiry_interval: int = 0
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)
    will: Will | None = None
    # Packet ids of QoS 2 messages received and not yet released (PUBREL). Most sessions
    # never have one, and share the empty frozenset; one that does gets a set of its own on
    # the first change (`inbound_qos2_mutable`), changed in place from then on (a QoS 2
    # message changes it twice).
    inbound_qos2: frozenset[int] | set[int] = frozenset()
    outbound: dict[int, Outbound] = field(default_factory=dict)
    # When the last connection ended (ms since epoch); None while a client is connected.
    disconnected_at: int | None = None
    last_packet_id: int = 0
    # The node the client is connected through, while it is (see `node_liveness`).
    node: str | None = None

    @property
    def expires_at(self) -> int | None:
        """When an offline session ends (ms since epoch); None while connected or never."""
        if self.disconnected_at is None or self.expiry_interval == NEVER_EXPIRES:
            return None
        return self.disconnected_at + self.expiry_interval * 1000

    def expired(self, now: int) -> bool:
        """Whether an offline session has ended by `now` (ms since epoch). The deadline
        decides, whether or not a timer has acted on it yet."""
        expires_at = self.expires_at
        return expires_at is not None and expires_at <= now

    def allocate_packet_id(self) -> int | None:
        """The next free packet identifier, or None when all 65535 are in flight."""
        if len(self.outbound) >= 65535:
            return None
        pid = self.last_packet_id
        while True:
            pid = pid % 65535 + 1
            if pid not in self.outbound:
                self.last_packet_id = pid
                return pid

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "v": 1,
            "client_id": self.client_id,
            "expiry": self.expiry_interval,
            "subs": {f: _options_doc(o) for f, o in self.subscriptions.items()},
            "qos2_in": sorted(self.inbound_qos2),
            "disconnected_at": self.disconnected_at,
            "last_pid": self.last_packet_id,
            # QoS 1 messages in flight, so that a resumed session resends them with their packet
            # ids even after a restart (QoS 2 flows have records of their own).
            "out": [
                [e.packet_id, e.topic, str(e.message_id)]
                for e in self.outbound.values()
                if e.qos == 1 and e.message_id is not None
            ],
        }
        if self.will is not None:
            doc["will"] = _will_doc(self.will)
        if self.node is not None and self.disconnected_at is None:
            doc["node"] = self.node
        return json.dumps(doc, separators=(",", ":")).encode()

    def inbound_qos2_mutable(self) -> set[int]:
        """`inbound_qos2`, as a set of this session's own to change in place."""
        ids = self.inbound_qos2
        if type(ids) is not set:
            ids = self.inbound_qos2 = set(ids)
        return ids

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionState:
        doc = json.loads(data)
        state = cls(
            client_id=doc["client_id"],
            expiry_interval=doc["expiry"],
            subscriptions={f: SubscriptionOptions(**o) for f, o in doc["subs"].items()},
            inbound_qos2=frozenset(doc["qos2_in"]),
            disconnected_at=doc["disconnected_at"],
            last_packet_id=doc["last_pid"],
            node=doc.get("node"),
        )
        for packet_id, topic, message_id in doc["out"]:
            state.outbound[packet_id] = Outbound(packet_id, 1, topic, MessageId.parse(message_id))
        if "will" in doc:
            state.will = _will_from_doc(doc["will"])
        return state


def _options_doc(o: SubscriptionOptions) -> dict[str, Any]:
    return {
        "qos": o.qos,
        "no_local": o.no_local,
        "retain_as_published": o.retain_as_published,
        "retain_handling": o.retain_handling,
        "identifier": o.identifier,
    }


def outbound_to_bytes(entry: Outbound) -> bytes:
    """A QoS 2 flow in progress, stored on its own so each step writes a few bytes."""
    doc = {"topic": entry.topic, "mid": str(entry.message_id), "rel": entry.released}
    return json.dumps(doc, separators=(",", ":")).encode()


def outbound_from_bytes(packet_id: int, data: bytes) -> Outbound:
    doc = json.loads(data)
    return Outbound(
        packet_id=packet_id,
        qos=2,
        topic=doc["topic"],
        message_id=MessageId.parse(doc["mid"]),
        released=doc["rel"],
    )


# Will properties worth keeping across a restart; everything else a will can carry is derived.
_WILL_PROPS = (
    "will_delay_interval",
    "message_expiry_interval",
    "content_type",
    "response_topic",
    "payload_format_indicator",
)


def _will_doc(will: Will) -> dict[str, Any]:
    p = will.properties
    return {
        "topic": will.topic,
        "payload": base64.b64encode(will.payload).decode(),
        "qos": will.qos,
        "retain": will.retain,
        "props": {name: getattr(p, name) for name in _WILL_PROPS if getattr(p, name) is not None},
        "corr": base64.b64encode(p.correlation_data).decode() if p.correlation_data else None,
        "user": [list(pair) for pair in p.user_properties],
    }


def _will_from_doc(doc: dict[str, Any]) -> Will:
    corr = base64.b64decode(doc["corr"]) if doc["corr"] else None
    props = Properties(
        correlation_data=corr,
        user_properties=tuple((k, v) for k, v in doc["user"]),
        **doc["props"],
    )
    return Will(
        topic=doc["topic"],
        payload=base64.b64decode(doc["payload"]),
        qos=doc["qos"],
        retain=doc["retain"],
        properties=props,
    )
