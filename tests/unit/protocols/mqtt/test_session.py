"""Session state serialization and packet identifier allocation."""

from __future__ import annotations

from mop.message import MessageId
from mop.protocols.mqtt.packets import Properties, Will
from mop.protocols.mqtt.session import (
    Outbound,
    SessionState,
    SubscriptionOptions,
    outbound_from_bytes,
    outbound_to_bytes,
)


def test_round_trip_keeps_everything_that_must_survive() -> None:
    state = SessionState(client_id="c", expiry_interval=60, disconnected_at=123, last_packet_id=7)
    state.subscriptions["a/#"] = SubscriptionOptions(2, no_local=True, identifier=5)
    state.subscriptions["$share/g/b"] = SubscriptionOptions(1, retain_handling=2)
    state.inbound_qos2 = frozenset({3, 9})
    state.outbound[4] = Outbound(
        4, 2, "persistent://public/default/a", MessageId(1, 2), released=True
    )
    state.outbound[5] = Outbound(5, 1, "persistent://public/default/r", None)  # retained: not kept
    state.will = Will(
        "w",
        b"\x00bye",
        1,
        True,
        Properties(will_delay_interval=5, correlation_data=b"\x01", user_properties=(("k", "v"),)),
    )
    back = SessionState.from_bytes(state.to_bytes())
    assert back.subscriptions == state.subscriptions
    assert back.inbound_qos2 == {3, 9}
    assert back.outbound == {}  # QoS 2 flows are stored one record each, not in the session
    state.outbound[6] = Outbound(6, 1, "persistent://public/default/b", MessageId(3, 4))
    back = SessionState.from_bytes(state.to_bytes())
    assert list(back.outbound) == [6] and back.outbound[6].message_id == MessageId(3, 4)
    assert back.will == state.will
    assert (back.disconnected_at, back.last_packet_id, back.expiry_interval) == (123, 7, 60)
    assert back.expires_at == 123 + 60_000


def test_qos2_flow_record_round_trip() -> None:
    entry = Outbound(4, 2, "persistent://public/default/a", MessageId(1, 2), released=True)
    back = outbound_from_bytes(4, outbound_to_bytes(entry))
    assert (back.packet_id, back.qos, back.topic, back.message_id, back.released) == (
        4,
        2,
        "persistent://public/default/a",
        MessageId(1, 2),
        True,
    )


def test_packet_ids_skip_those_in_flight_and_wrap() -> None:
    state = SessionState(client_id="c", last_packet_id=65534)
    state.outbound[65535] = Outbound(65535, 1, "t", None)
    state.outbound[1] = Outbound(1, 1, "t", None)
    assert state.allocate_packet_id() == 2


def test_no_packet_id_when_all_are_in_flight() -> None:
    state = SessionState(client_id="c")
    for pid in range(1, 65536):
        state.outbound[pid] = Outbound(pid, 1, "t", None)
    assert state.allocate_packet_id() is None


def test_inbound_qos2_becomes_the_sessions_own_set_on_its_first_change() -> None:
    first, second = SessionState("a"), SessionState("b")
    assert first.inbound_qos2 is second.inbound_qos2  # shared while empty
    first.inbound_qos2_mutable().add(7)
    first.inbound_qos2_mutable().add(8)
    assert first.inbound_qos2 == {7, 8}
    assert not second.inbound_qos2
    back = SessionState.from_bytes(first.to_bytes())
    back.inbound_qos2_mutable().discard(7)
    assert back.inbound_qos2 == {8}
    assert first.inbound_qos2 == {7, 8}
