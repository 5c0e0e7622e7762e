"""Routing: exact topics, MQTT wildcards (and `$` topics), topics made after the subscription,
one delivery per message for overlapping selectors, order per topic, every message field the
MQTT layer reads coming back as it was published, and the node's own `$SYS` topics."""

from __future__ import annotations

import time

import pytest
import trio

from mop.message import Message
from mop.processor import ClientContext, MessagingProcessor
from mop.processor.backend import Backend, PublishResult, SubscriptionSpec
from mop.topic_names import mqtt_to_pulsar
from tests.conformance.harness import Names, expect_nothing, payloads, receive


def spec(name: str, *selectors: str, durable: bool = False) -> SubscriptionSpec:
    return SubscriptionSpec(name=name, selectors=frozenset(selectors), durable=durable)


async def create(backend: Backend, *topics: str) -> None:
    """Make the topics exist, with a message no LATEST subscription will see."""
    for topic in topics:
        await backend.publish(topic, Message(b"before", qos=1))
    # Separated mode tells a subscription's first messages by publish time, in milliseconds: a
    # message of the very millisecond it starts is delivered (better twice than lost).
    await trio.sleep(0.002)


async def test_publish_reaches_an_exact_topic_subscriber(backend: Backend, names: Names) -> None:
    await create(backend, names.topic("t"))
    consumer = await backend.subscribe(spec(names.sub("s"), names.mqtt("t")))
    result = await backend.publish(names.topic("t"), Message(b"hello", qos=1))
    [delivery] = await receive(consumer, 1)
    assert (delivery.topic, delivery.message.payload) == (names.topic("t"), b"hello")
    assert delivery.message_id == result.message_id
    consumer.ack([delivery])
    await expect_nothing(consumer)


async def test_wildcard_selectors(backend: Backend, names: Names) -> None:
    topics = {name: names.topic(name) for name in ("k/temp", "k/hum", "h", "h/x/y", "k/temp/x")}
    await create(backend, *topics.values())
    consumer = await backend.subscribe(
        spec(names.sub("s"), names.mqtt("+/temp"), names.mqtt("h/#"))
    )
    for name, topic in topics.items():
        await backend.publish(topic, Message(name.encode(), qos=1))
    got = await receive(consumer, 3)
    # `h/#` matches its parent `h` too (MQTT 4.7.1.2).
    assert sorted(payloads(got)) == [b"h", b"h/x/y", b"k/temp"]
    assert {d.topic for d in got} == {topics["h"], topics["h/x/y"], topics["k/temp"]}
    await expect_nothing(consumer)


async def test_dollar_topics_are_not_matched_by_leading_wildcards(
    backend: Backend, names: Names
) -> None:
    # A first level of its own that starts with "$", like `$SYS`.
    dollar_filter = f"${names.prefix}/#"
    dollar_topic = mqtt_to_pulsar(f"${names.prefix}/x")
    await create(backend, names.topic("x"), dollar_topic)
    wild = await backend.subscribe(spec(names.sub("wild"), "#", "+/x"))
    named = await backend.subscribe(spec(names.sub("named"), dollar_filter))
    await backend.publish(dollar_topic, Message(b"dollar", qos=1))
    await backend.publish(names.topic("x"), Message(b"plain", qos=1))
    # The `$` topic is routed (an explicit `$...` filter gets it), only not by a leading
    # wildcard; `#` and `+/x` both match the plain topic, which comes once.
    assert payloads(await receive(named, 1)) == [b"dollar"]
    assert payloads(await receive(wild, 1)) == [b"plain"]
    await expect_nothing(wild)


async def test_sys_topics_are_the_nodes_own_and_leave_no_topic(
    backend: Backend, names: Names
) -> None:
    """`$SYS` topics (client events name one per client id) reach the node's consumers that
    follow them, by filter or by name in either form, and are kept nowhere: no topic, no
    storage."""
    events = f"$SYS/brokers/{names.prefix}/clients"
    wild = await backend.subscribe(spec(names.sub("wild"), f"{events}/+/+"))
    exact = await backend.subscribe(spec(names.sub("exact"), mqtt_to_pulsar(f"{events}/a/left")))
    other = await backend.subscribe(spec(names.sub("other"), names.mqtt("#")))
    for client in ("a", "b"):
        for kind in ("joined", "left"):
            result = await backend.publish(
                mqtt_to_pulsar(f"{events}/{client}/{kind}"), Message(client.encode(), qos=0)
            )
            assert result.subscriptions == (2 if (client, kind) == ("a", "left") else 1)
    got = await receive(wild, 4)
    assert [d.topic for d in got] == [
        mqtt_to_pulsar(f"{events}/{client}/{kind}")
        for client in ("a", "b")
        for kind in ("joined", "left")
    ]
    wild.ack(got)
    [left] = await receive(exact, 1)
    assert left.message.payload == b"a"
    exact.ack([left])
    await expect_nothing(other)
    assert not [t for t in await backend.topics("public/default") if "%24SYS" in t]
    await wild.close()
    await exact.close()
    await other.close()


async def test_a_topic_made_after_an_exact_subscription_is_delivered(
    backend: Backend, names: Names
) -> None:
    consumer = await backend.subscribe(spec(names.sub("s"), names.mqtt("later")))
    await backend.publish(names.topic("later"), Message(b"first ever", qos=1))
    assert payloads(await receive(consumer, 1)) == [b"first ever"]


async def test_a_topic_made_after_a_wildcard_subscription_is_delivered(
    backend: Backend, names: Names
) -> None:
    consumer = await backend.subscribe(spec(names.sub("s"), names.mqtt("+/new")))
    await backend.publish(names.topic("a/new"), Message(b"first ever", qos=1))
    [delivery] = await receive(consumer, 1)
    assert (delivery.topic, delivery.message.payload) == (names.topic("a/new"), b"first ever")
    # And one made after the first was picked up.
    await backend.publish(names.topic("b/new"), Message(b"second", qos=0))
    [delivery] = await receive(consumer, 1)
    assert (delivery.topic, delivery.message.payload) == (names.topic("b/new"), b"second")


async def test_overlapping_selectors_deliver_each_message_once(
    backend: Backend, names: Names
) -> None:
    await create(backend, names.topic("a"))
    consumer = await backend.subscribe(
        spec(names.sub("s"), names.mqtt("a"), names.mqtt("+"), names.mqtt("#"))
    )
    for n in range(3):
        await backend.publish(names.topic("a"), Message(str(n).encode(), qos=1))
    assert payloads(await receive(consumer, 3)) == [b"0", b"1", b"2"]
    await expect_nothing(consumer)


async def test_order_is_kept_per_topic(backend: Backend, names: Names) -> None:
    one, two = names.topic("one"), names.topic("two")
    await create(backend, one, two)
    consumer = await backend.subscribe(spec(names.sub("s"), names.mqtt("+")))
    count = 30
    for n in range(count):
        # QoS 0 and 1 interleaved: MQTT subscribers see them in publish order.
        await backend.publish(one, Message(f"{n}".encode(), qos=n % 2))
        await backend.publish(two, Message(f"{n}".encode(), qos=(n + 1) % 2))
    got = await receive(consumer, 2 * count)
    expected = [f"{n}".encode() for n in range(count)]
    assert payloads([d for d in got if d.topic == one]) == expected
    assert payloads([d for d in got if d.topic == two]) == expected


@pytest.mark.parametrize("qos", [0, 1, 2])
async def test_message_fields_come_back_as_published(
    backend: Backend, names: Names, qos: int
) -> None:
    await create(backend, names.topic("t"))
    consumer = await backend.subscribe(spec(names.sub("s"), names.mqtt("t")))
    now = int(time.time() * 1000)
    sent = Message(
        payload=b"\x00payload\xff",
        # Ordered pairs with a repeated name, and the reserved names of MQTT fields.
        properties=(("a", "1"), ("a", "2"), ("mqtt.retain", "1"), ("b", "")),
        key="key-1",
        producer="client-7",
        publish_time=now,
        event_time=1_234_567,
        qos=qos,
        expires_at=now + 600_000,
    )
    await backend.publish(names.topic("t"), sent)
    [delivery] = await receive(consumer, 1)
    got = delivery.message
    assert (got.payload, got.properties, got.key, got.producer) == (
        sent.payload,
        sent.properties,
        sent.key,
        sent.producer,
    )
    assert (got.event_time, got.qos, got.expires_at) == (sent.event_time, qos, sent.expires_at)
    assert delivery.redelivery_count == 0


async def test_a_message_without_optional_fields_comes_back_without_them(
    backend: Backend, names: Names
) -> None:
    await create(backend, names.topic("t"))
    consumer = await backend.subscribe(spec(names.sub("s"), names.mqtt("t")))
    await backend.publish(names.topic("t"), Message(b"", qos=1))
    [delivery] = await receive(consumer, 1)
    got = delivery.message
    assert (got.payload, got.properties, got.key) == (b"", (), None)
    assert (got.event_time, got.qos, got.expires_at) == (0, 1, 0)


async def test_a_batch_is_published_in_order(backend: Backend, names: Names) -> None:
    # MQTT hands the processor the PUBLISH packets of one read at once.
    one, two = names.topic("one"), names.topic("two")
    await create(backend, one, two)
    consumer = await backend.subscribe(spec(names.sub("s"), names.mqtt("+")))
    processor = MessagingProcessor(backend)
    items = [
        (one if n % 3 else two, Message(f"{n}".encode(), qos=n % 3, producer="batcher"))
        for n in range(12)
    ]
    results = await processor.publish_batch(ClientContext("batcher", "mqtt"), items)
    assert all(isinstance(result, PublishResult) for result in results), results
    got = await receive(consumer, len(items))
    for topic in (one, two):
        sent = [message.payload for t, message in items if t == topic]
        assert payloads([d for d in got if d.topic == topic]) == sent
    by_payload = {d.message.payload: d for d in got}
    for (topic, message), result in zip(items, results, strict=True):
        assert isinstance(result, PublishResult)
        delivery = by_payload[message.payload]
        assert (delivery.topic, delivery.message.qos) == (topic, message.qos)
        if message.qos:  # see the next test for QoS 0
            assert delivery.message_id == result.message_id


@pytest.mark.backends(
    "local", reason="a QoS 0 publish through a proxy does not wait for the id the broker gives"
)
async def test_a_qos0_publish_returns_the_message_id(backend: Backend, names: Names) -> None:
    await create(backend, names.topic("t"))
    consumer = await backend.subscribe(spec(names.sub("s"), names.mqtt("t")))
    result = await backend.publish(names.topic("t"), Message(b"at most once", qos=0))
    [delivery] = await receive(consumer, 1)
    assert delivery.message_id == result.message_id


# MQTT topic names may hold any UTF-8 but the wildcards: spaces (`$SYS/broker/retained
# messages/count`), "%", non-ASCII letters, empty levels, a leading "/".
UNUSUAL_NAMES = ["with space/x", "100%/x", "grüße/x", "a//x", "/x", "quote'\"/x", "tab\t/x"]


@pytest.mark.parametrize("name", UNUSUAL_NAMES)
async def test_unusual_topic_names(backend: Backend, names: Names, name: str) -> None:
    exact = await backend.subscribe(spec(names.sub("exact"), names.mqtt(name)))
    wild = await backend.subscribe(spec(names.sub("wild"), names.mqtt("#")))
    await backend.publish(names.topic(name), Message(b"odd", qos=1))
    for consumer in (exact, wild):
        [delivery] = await receive(consumer, 1)
        assert (delivery.topic, delivery.message.payload) == (names.topic(name), b"odd")
