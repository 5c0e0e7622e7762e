"""MQTT PUBLISH -> protocol-neutral Message (`mop.protocols.mqtt.mapping`): reserved names."""

from __future__ import annotations

from mop.message import ENCRYPTED
from mop.protocols.mqtt.mapping import publish_to_message
from mop.protocols.mqtt.packets import Properties, Publish


def test_a_client_cannot_claim_the_encrypted_mark() -> None:
    # MQTT subscribers skip messages with it: a publisher must not hide its message that way.
    user = (ENCRYPTED, ("a", "1"), ENCRYPTED)
    publish = Publish("t", b"x", 1, packet_id=1, properties=Properties(user_properties=user))
    message = publish_to_message(publish, client_id="c", now_ms=1)
    assert message.properties == (("a", "1"),)
