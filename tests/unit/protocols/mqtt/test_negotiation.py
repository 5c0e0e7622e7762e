"""CONNECT negotiation, pure: client ids, session expiry, keep alive, will and CONNACK terms."""

from __future__ import annotations

import dataclasses

import pytest

from mop.protocols.mqtt.negotiation import (
    ConnectDecision,
    ConnectPolicy,
    ConnectRefusal,
    negotiate_connect,
)
from mop.protocols.mqtt.packets import NO_PROPERTIES, Connect, Properties, Will
from mop.protocols.mqtt.reason_codes import ConnectReturnCode, ReasonCode, v3_connack_code
from mop.settings import MqttSettings

POLICY = ConnectPolicy.from_settings(MqttSettings())


def accepted(connect: Connect, policy: ConnectPolicy = POLICY) -> ConnectDecision:
    decision = negotiate_connect(connect, policy, assign_client_id=lambda: "assigned-1")
    assert isinstance(decision, ConnectDecision), decision
    return decision


def refused(connect: Connect, policy: ConnectPolicy = POLICY) -> ConnectRefusal:
    decision = negotiate_connect(connect, policy, assign_client_id=lambda: "assigned-1")
    assert isinstance(decision, ConnectRefusal), decision
    return decision


def v5(**properties: object) -> Connect:
    return Connect("c", protocol_level=5, properties=Properties(**properties))  # type: ignore[arg-type]


# -- client ids ------------------------------------------------------------------------------


def test_an_empty_client_id_on_a_persistent_311_session_is_refused() -> None:
    refusal = refused(Connect("", protocol_level=4, clean_start=False))
    assert refusal.reason_code is ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
    assert v3_connack_code(refusal.reason_code) == ConnectReturnCode.IDENTIFIER_REJECTED


@pytest.mark.parametrize("clean", [True, False])
def test_an_empty_client_id_in_mqtt_31_is_refused(clean: bool) -> None:
    # MQTT 3.1 client ids are 1 to 23 characters: the server assigns none.
    refusal = refused(Connect("", protocol_level=3, clean_start=clean))
    assert v3_connack_code(refusal.reason_code) == ConnectReturnCode.IDENTIFIER_REJECTED


def test_an_empty_client_id_on_a_clean_311_session_is_assigned_without_telling() -> None:
    decision = accepted(Connect("", protocol_level=4, clean_start=True))
    assert decision.client_id == "assigned-1"
    assert decision.connack_properties is NO_PROPERTIES


def test_an_mqtt5_client_is_told_the_client_id_it_was_assigned() -> None:
    decision = accepted(Connect("", protocol_level=5, clean_start=False))
    assert decision.client_id == "assigned-1"
    assert decision.connack_properties.assigned_client_identifier == "assigned-1"


def test_a_client_id_of_its_own_is_kept_and_not_echoed() -> None:
    decision = accepted(v5())
    assert decision.client_id == "c"
    assert decision.connack_properties.assigned_client_identifier is None


def test_assigned_client_ids_differ() -> None:
    ids = set()
    for _ in range(3):
        decision = negotiate_connect(Connect("", protocol_level=5), POLICY)
        assert isinstance(decision, ConnectDecision)
        ids.add(decision.client_id)
    assert len(ids) == 3


# -- session expiry --------------------------------------------------------------------------


def test_an_mqtt5_expiry_within_the_maximum_is_granted_silently() -> None:
    decision = accepted(v5(session_expiry_interval=300))
    assert decision.session_expiry == 300
    assert decision.connack_properties.session_expiry_interval is None


def test_an_mqtt5_expiry_above_the_maximum_is_lowered_and_said() -> None:
    policy = dataclasses.replace(POLICY, max_session_expiry=60)
    decision = accepted(v5(session_expiry_interval=300), policy)
    assert decision.session_expiry == 60
    assert decision.connack_properties.session_expiry_interval == 60


def test_an_mqtt5_session_without_expiry_ends_with_the_connection() -> None:
    assert accepted(v5()).session_expiry == 0


@pytest.mark.parametrize(("clean", "expiry"), [(True, 0), (False, 86_400)])
def test_a_311_session_expires_by_the_default_unless_clean(clean: bool, expiry: int) -> None:
    policy = dataclasses.replace(POLICY, default_session_expiry=86_400)
    assert accepted(Connect("c", protocol_level=4, clean_start=clean), policy).session_expiry == (
        expiry
    )


def test_the_311_default_expiry_is_capped_by_the_maximum() -> None:
    policy = dataclasses.replace(POLICY, default_session_expiry=86_400, max_session_expiry=10)
    decision = accepted(Connect("c", protocol_level=4, clean_start=False), policy)
    assert decision.session_expiry == 10


# -- keep alive ------------------------------------------------------------------------------


def test_a_keep_alive_within_the_maximum_is_kept() -> None:
    decision = accepted(Connect("c", protocol_level=5, keep_alive=30))
    assert decision.keep_alive == 30
    assert decision.connack_properties.server_keep_alive is None


def test_a_keep_alive_above_the_maximum_is_lowered_and_said_in_mqtt5() -> None:
    policy = dataclasses.replace(POLICY, max_keep_alive=20)
    decision = accepted(Connect("c", protocol_level=5, keep_alive=30), policy)
    assert decision.keep_alive == 20
    assert decision.connack_properties.server_keep_alive == 20


def test_a_311_keep_alive_above_the_maximum_is_lowered_silently() -> None:
    policy = dataclasses.replace(POLICY, max_keep_alive=20)
    decision = accepted(Connect("c", protocol_level=4, keep_alive=30), policy)
    assert decision.keep_alive == 20
    assert decision.connack_properties is NO_PROPERTIES


def test_no_keep_alive_gets_the_server_keep_alive_when_one_is_set() -> None:
    policy = dataclasses.replace(POLICY, max_keep_alive=20)
    decision = accepted(Connect("c", protocol_level=5, keep_alive=0), policy)
    assert decision.keep_alive == 20
    assert decision.connack_properties.server_keep_alive == 20
    # Below MQTT 5 there is no Server Keep Alive to say it with: none stays none.
    assert accepted(Connect("c", protocol_level=4, keep_alive=0), policy).keep_alive == 0


def test_no_keep_alive_stays_none_when_the_server_sets_no_maximum() -> None:
    decision = accepted(Connect("c", protocol_level=5, keep_alive=0))
    assert decision.keep_alive == 0
    assert decision.connack_properties.server_keep_alive is None


# -- will and authentication -----------------------------------------------------------------


@pytest.mark.parametrize("topic", ["a/+/b", "a/#", ""])
@pytest.mark.parametrize("level", [3, 4, 5])
def test_a_will_with_an_invalid_topic_is_refused(topic: str, level: int) -> None:
    refusal = refused(Connect("c", protocol_level=level, will=Will(topic, b"bye")))
    assert refusal.reason_code is ReasonCode.TOPIC_NAME_INVALID
    assert refusal.why.startswith("will topic: ")
    # Below MQTT 5 such a CONNECT does not conform: no CONNACK [MQTT-3.1.4-1].
    assert refusal.answered is (level == 5)


def test_a_will_topic_beyond_the_configured_levels_is_refused() -> None:
    policy = dataclasses.replace(POLICY, max_topic_levels=2)
    refusal = refused(Connect("c", protocol_level=4, will=Will("a/b/c", b"bye")), policy)
    assert refusal.reason_code is ReasonCode.TOPIC_NAME_INVALID
    assert refusal.answered  # a topic name all the same: the server's limit says no


def test_a_valid_will_is_kept_for_the_session() -> None:
    will = Will("last/words", b"bye", qos=1)
    assert accepted(Connect("c", protocol_level=5, will=will)).will == will


def test_an_authentication_method_is_refused_as_none_is_offered() -> None:
    refusal = refused(v5(authentication_method="SCRAM-SHA-1"))
    assert refusal.reason_code is ReasonCode.BAD_AUTHENTICATION_METHOD


def test_the_first_failed_check_is_the_refusal() -> None:
    connect = Connect("", protocol_level=4, clean_start=False, will=Will("a/#", b""))
    assert refused(connect).reason_code is ReasonCode.CLIENT_IDENTIFIER_NOT_VALID


# -- CONNACK terms ---------------------------------------------------------------------------


def test_an_mqtt5_connack_states_the_server_limits() -> None:
    policy = dataclasses.replace(
        POLICY,
        receive_maximum=7,
        max_packet_size=4096,
        topic_alias_maximum=3,
        retain_available=False,
    )
    props = accepted(v5(), policy).connack_properties
    assert props.receive_maximum == 7
    assert props.maximum_packet_size == 4096
    assert props.topic_alias_maximum == 3
    assert props.retain_available == 0
    assert accepted(v5()).connack_properties.retain_available is None


def test_response_information_is_given_when_asked_for() -> None:
    props = accepted(v5(request_response_information=1)).connack_properties
    assert props.response_information == "response/c"
    assert accepted(v5()).connack_properties.response_information is None
