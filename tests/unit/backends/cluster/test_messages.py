"""Message <-> Pulsar message fields: every field mop needs survives the trip, also through a
property map that sorts its names and keeps one value per name, as pulsar-client's does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mop.backends.cluster.messages import (
    EXPIRES_AT,
    PRODUCER,
    PROPERTIES,
    QOS,
    incoming,
    outgoing,
)
from mop.message import ENCRYPTED, Message

NAMES = st.sampled_from(["a", "b", "user", "mqtt.content_type", "mop.qos", "mop.x", "é"])
PAIRS = st.lists(st.tuples(NAMES, st.text(max_size=5)), max_size=5).map(tuple)


def through_pulsar(message: Message, *, publish_time: int = 1234) -> Message:
    out = outgoing(message)
    # A Pulsar consumer (pulsar-client) keeps properties in a sorted map.
    properties = tuple(sorted(dict(out.properties).items()))
    return incoming(
        out.payload,
        properties,
        partition_key=out.partition_key or "",
        publish_time=publish_time,
        event_time=out.event_time,
        producer_name="pulsar-producer-1",
    )


@given(
    payload=st.binary(max_size=20),
    properties=PAIRS,
    key=st.none() | st.text(min_size=1, max_size=5),
    producer=st.text(max_size=5),
    event_time=st.integers(0, 2**40),
    qos=st.integers(0, 2),
    expires_at=st.integers(0, 2**42),
)
def test_fields_survive(
    payload: bytes,
    properties: tuple[tuple[str, str], ...],
    key: str | None,
    producer: str,
    event_time: int,
    qos: int,
    expires_at: int,
) -> None:
    message = Message(
        payload=payload,
        properties=properties,
        key=key,
        producer=producer,
        publish_time=1234,
        event_time=event_time,
        qos=qos,
        expires_at=expires_at,
    )
    assert through_pulsar(message) == message


def test_simple_properties_travel_as_they_are() -> None:
    out = outgoing(Message(b"x", properties=(("a", "1"), ("b", "2")), producer="c1"))
    assert out.properties == (("a", "1"), ("b", "2"), (PRODUCER, "c1"))


def test_order_and_repeats_travel_whole() -> None:
    pairs = (("z", "1"), ("a", "2"), ("z", "3"))
    out = outgoing(Message(b"x", properties=pairs))
    assert dict(out.properties)["z"] == "3"  # what a Pulsar consumer sees: the last value
    assert PROPERTIES in dict(out.properties)
    assert through_pulsar(Message(b"x", properties=pairs)).properties == pairs


def test_reserved_fields_only_when_needed() -> None:
    out = outgoing(Message(b"x", qos=1))
    assert QOS not in dict(out.properties) and EXPIRES_AT not in dict(out.properties)
    out = outgoing(Message(b"x", qos=0, expires_at=99, deliver_at=7, event_time=5, key="k"))
    assert dict(out.properties)[QOS] == "0" and dict(out.properties)[EXPIRES_AT] == "99"
    assert (out.deliver_at, out.event_time, out.partition_key) == (7, 5, "k")


def test_a_plain_pulsar_message() -> None:
    message = incoming(
        b"data",
        (("b", "2"), ("a", "1")),
        partition_key="",
        publish_time=10,
        event_time=0,
        producer_name="their-producer",
    )
    assert message == Message(
        b"data", properties=(("a", "1"), ("b", "2")), producer="their-producer", publish_time=10
    )


def test_an_encrypted_pulsar_message_is_marked_and_no_one_else_can_claim_it() -> None:
    fields = {"partition_key": "", "publish_time": 0, "event_time": 0, "producer_name": "p"}
    encrypted = incoming(b"cipher", (("a", "1"),), encrypted=True, **fields)  # type: ignore[arg-type]
    assert encrypted.properties == (("a", "1"), ENCRYPTED)
    # The mark is in mop's reserved names: a producer's own property of that name is not it.
    claimed = incoming(b"plain", (ENCRYPTED, ("a", "1")), **fields)  # type: ignore[arg-type]
    assert claimed.properties == (("a", "1"),)
    # Nor is one written into the JSON of all properties that mop's proxies send.
    whole = ((PROPERTIES, '[["a","1"],["mop.encrypted","1"]]'),)
    spoofed = incoming(b"plain", whole, **fields)  # type: ignore[arg-type]
    assert spoofed.properties == (("a", "1"),)


def test_malformed_reserved_values_fall_back() -> None:
    message = incoming(
        b"",
        ((QOS, "x"), (EXPIRES_AT, "-5"), (PROPERTIES, "not json"), ("a", "1")),
        partition_key="",
        publish_time=0,
        event_time=0,
        producer_name="p",
    )
    assert (message.qos, message.expires_at, message.properties) == (1, 0, (("a", "1"),))


def test_a_user_property_under_a_reserved_name_is_not_read_as_ours() -> None:
    message = Message(b"x", properties=(("mop.qos", "0"), ("mop.producer", "me")), qos=1)
    back = through_pulsar(message)
    assert back.qos == 1 and back.properties == message.properties
