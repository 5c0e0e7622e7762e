"""Tests of the MoP-compatible MQTT <-> Pulsar topic mapping and of Pulsar topic-name parsing."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mop.topic_names import PulsarTopicName, mqtt_to_pulsar, namespace_of, pulsar_to_mqtt
from mop.topics import TOPIC_NAME_INVALID, TopicError, validate_topic_name

PREFIX = "persistent://public/default/"


def java_url_encode(text: str) -> str:
    """`URLEncoder.encode(text, "UTF-8")` restated character by character."""
    out = []
    for char in text:
        if char.isascii() and (char.isalnum() or char in ".-*_"):
            out.append(char)
        elif char == " ":
            out.append("+")
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(out)


@pytest.mark.parametrize(
    ("mqtt_topic", "pulsar_topic"),
    [
        ("a/b/c", PREFIX + "a%2Fb%2Fc"),
        ("a/b c", PREFIX + "a%2Fb+c"),
        ("é", PREFIX + "%C3%A9"),
        ("sensors/temp", PREFIX + "sensors%2Ftemp"),
        ("Az09.-*_", PREFIX + "Az09.-*_"),
        ("~!'()", PREFIX + "%7E%21%27%28%29"),
        ("a%b=", PREFIX + "a%25b%3D"),
        ("/", PREFIX + "%2F"),
        ("$SYS/x", PREFIX + "%24SYS%2Fx"),
        ("日本", PREFIX + "%E6%97%A5%E6%9C%AC"),
        ("\U0001f600", PREFIX + "%F0%9F%98%80"),
        ("persistent://t/n/x", "persistent://t/n/x"),
        ("non-persistent://t/n/x", "non-persistent://t/n/x"),
    ],
)
def test_known_vectors(mqtt_topic: str, pulsar_topic: str) -> None:
    assert mqtt_to_pulsar(mqtt_topic) == pulsar_topic
    assert pulsar_to_mqtt(pulsar_topic) == mqtt_topic


def test_tenant_and_namespace() -> None:
    name = mqtt_to_pulsar("a/b", tenant="acme", namespace="iot")
    assert name == "persistent://acme/iot/a%2Fb"
    assert pulsar_to_mqtt(name, tenant="acme", namespace="iot") == "a/b"
    # Seen from another namespace, the name is foreign and kept whole.
    assert pulsar_to_mqtt(name) == name


def test_lone_surrogate_is_refused() -> None:
    with pytest.raises(TopicError) as info:
        mqtt_to_pulsar("a\ud800")
    assert info.value.reason_code == TOPIC_NAME_INVALID


@pytest.mark.parametrize(
    "pulsar_topic",
    [
        "persistent://other/default/a%2Fb",
        "persistent://public/other/a%2Fb",
        "non-persistent://public/default/a%2Fb",
        "persistent://public/default/",  # empty local name
        "persistent://public/default/a%2fb",  # lowercase hex is not what the encoder writes
        "persistent://public/default/a~b",  # the encoder writes %7E
        "persistent://public/default/100%",  # a stray percent sign
        "persistent://public/default/%FF",  # not UTF-8
        "persistent://public/default/a%2B",  # decodes to a wildcard
        "persistent://public/default/%23",
        "persistent://public/default/%00",
        "persistent://public/default/persistent%3A%2F%2Fx%2Fy%2Fz",  # decodes to a full name
    ],
)
def test_foreign_or_non_canonical_names_are_kept(pulsar_topic: str) -> None:
    assert pulsar_to_mqtt(pulsar_topic) == pulsar_topic
    assert mqtt_to_pulsar(pulsar_to_mqtt(pulsar_topic)) == pulsar_topic


def test_plain_pulsar_names_decode_to_themselves() -> None:
    assert pulsar_to_mqtt(PREFIX + "my-topic") == "my-topic"
    assert pulsar_to_mqtt(PREFIX + "a+b") == "a b"


mqtt_names = (
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40)
    .filter(lambda t: "+" not in t and "#" not in t and "\x00" not in t)
    .filter(lambda t: not t.startswith(("persistent://", "non-persistent://")))
)


@given(mqtt_names)
def test_round_trip(mqtt_topic: str) -> None:
    validate_topic_name(mqtt_topic)
    pulsar_topic = mqtt_to_pulsar(mqtt_topic)
    assert pulsar_topic == PREFIX + java_url_encode(mqtt_topic)
    assert pulsar_to_mqtt(pulsar_topic) == mqtt_topic
    other = mqtt_to_pulsar(mqtt_topic, tenant="t1", namespace="ns-1")
    assert pulsar_to_mqtt(other, tenant="t1", namespace="ns-1") == mqtt_topic
    assert PulsarTopicName.parse(pulsar_topic).local_name == java_url_encode(mqtt_topic)


@given(st.text(st.sampled_from("%+~*/aF2B0é3#\x00"), max_size=12))
def test_pulsar_names_map_back_to_themselves(local_name: str) -> None:
    pulsar_topic = PREFIX + local_name
    mqtt_topic = pulsar_to_mqtt(pulsar_topic)
    assert mqtt_to_pulsar(mqtt_topic) == pulsar_topic
    if mqtt_topic != pulsar_topic:
        validate_topic_name(mqtt_topic, max_length=1 << 20, max_levels=1 << 20)


# --- PulsarTopicName ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("my-topic", PulsarTopicName("persistent", "public", "default", "my-topic")),
        ("a%2Fb", PulsarTopicName("persistent", "public", "default", "a%2Fb")),
        ("acme/iot/t1", PulsarTopicName("persistent", "acme", "iot", "t1")),
        ("persistent://acme/iot/t1", PulsarTopicName("persistent", "acme", "iot", "t1")),
        (
            "non-persistent://public/default/x",
            PulsarTopicName("non-persistent", "public", "default", "x"),
        ),
        (
            "persistent://a.b-c_d/n=1:2/x y",
            PulsarTopicName("persistent", "a.b-c_d", "n=1:2", "x y"),
        ),
    ],
)
def test_parse(name: str, expected: PulsarTopicName) -> None:
    parsed = PulsarTopicName.parse(name)
    assert parsed == expected
    assert PulsarTopicName.parse(str(parsed)) == parsed
    if "://" in name:
        assert str(parsed) == name


def test_str_is_the_full_name() -> None:
    assert str(PulsarTopicName.parse("my-topic")) == "persistent://public/default/my-topic"
    assert str(PulsarTopicName.parse("a/b/c")) == "persistent://a/b/c"


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "empty"),
        ("a/b", "short name"),
        ("a/b/c/d", "short name"),
        ("http://a/b/c", "domain 'http'"),
        ("persistent://a/b", "expected persistent://<tenant>/<namespace>/<topic>"),
        ("persistent://", "expected"),
        ("persistent://a/b/c/d", "contains '/'"),
        ("persistent://a/b/", "local topic name is empty"),
        ("persistent:///b/c", "tenant ''"),
        ("persistent://a//c", "namespace ''"),
        ("persistent://a b/n/c", "tenant 'a b'"),
        ("persistent://t/é/c", "namespace 'é'"),
        ("t//x", "namespace ''"),
    ],
)
def test_parse_rejects(name: str, fragment: str) -> None:
    with pytest.raises(TopicError, match=re.escape(fragment)) as info:
        PulsarTopicName.parse(name)
    assert info.value.reason_code == TOPIC_NAME_INVALID


def test_construction_checks_fields() -> None:
    with pytest.raises(TopicError, match="domain"):
        PulsarTopicName("persistant", "public", "default", "x")


def test_namespace_of_a_full_name() -> None:
    assert namespace_of("persistent://t/n/x") == "t/n"
    assert namespace_of("non-persistent://t/n/x-partition-2") == "t/n"
    # Local names may hold encoded slashes and more slashes: only the first two parts count.
    assert namespace_of("persistent://t/n/a%2Fb/c") == "t/n"
