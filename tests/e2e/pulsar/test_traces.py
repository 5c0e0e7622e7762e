"""Traces across protocols: a W3C `traceparent` in MQTT 5 user properties or Pulsar message
properties is continued by the node (spans publish -> store -> deliver in that trace) and
reaches consumers of the other protocol; a message without one gets one when sampled; a
separated proxy and its broker continue the same trace. Real clients (paho-mqtt, pulsar-client);
the spans are read from an in-memory exporter attached to each node's telemetry."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pulsar
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mop.settings import Settings, TelemetrySettings
from mop.testing.cluster import broker_settings, proxy_settings
from mop.testing.node import RunningNode, running_node
from tests.e2e.clients import Client, props
from tests.e2e.pulsar_support import (
    TIMEOUT_MS,
    pulsar_client,
    pulsar_node,
    pulsar_settings,
    receive_all,
    service_url,
)

pytestmark = pytest.mark.e2e

TRACING = TelemetrySettings(trace_sample_ratio=1.0)
DEADLINE = 10.0


def traced(settings: Settings) -> Settings:
    return dataclasses.replace(settings, telemetry=TRACING)


@contextmanager
def traced_node(settings: Settings) -> Iterator[tuple[RunningNode, InMemorySpanExporter]]:
    """A node that traces every message, its spans going to an in-memory exporter."""
    exporter = InMemorySpanExporter()
    with running_node(traced(settings)) as node:
        node.call(lambda: node.node.telemetry.export_spans_to(exporter))
        yield node, exporter


@pytest.fixture(scope="module")
def traced_merged() -> Iterator[tuple[RunningNode, InMemorySpanExporter]]:
    with traced_node(pulsar_settings()) as running:
        yield running


@pytest.fixture
def node(traced_merged: tuple[RunningNode, InMemorySpanExporter]) -> RunningNode:
    return traced_merged[0]


@pytest.fixture
def spans(traced_merged: tuple[RunningNode, InMemorySpanExporter]) -> InMemorySpanExporter:
    return traced_merged[1]


def pulsar_topic(mqtt_topic: str) -> str:
    return "persistent://public/default/" + mqtt_topic.replace("/", "%2F")


def new_parent() -> tuple[str, str, str]:
    """A sampled `traceparent` of a client's span: (header, trace id, span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def trace_id_of(traceparent: str) -> str:
    return traceparent.split("-")[1]


def spans_of(
    exporter: InMemorySpanExporter, trace_id: str, wanted: dict[str, int]
) -> list[ReadableSpan]:
    """The spans of trace `trace_id`, once there are (at least) `wanted[name]` of each name."""
    deadline = time.monotonic() + DEADLINE
    while True:
        found = [
            span
            for span in exporter.get_finished_spans()
            if span.context is not None and format(span.context.trace_id, "032x") == trace_id
        ]
        names = [span.name for span in found]
        if all(names.count(name) >= count for name, count in wanted.items()):
            return found
        assert time.monotonic() < deadline, f"spans of {trace_id}: {names}, wanted {wanted}"
        time.sleep(0.02)


def one(spans: list[ReadableSpan], name: str, **attributes: object) -> ReadableSpan:
    matching = [
        span
        for span in spans
        if span.name == name
        and span.attributes is not None
        and all(span.attributes.get(key) == value for key, value in attributes.items())
    ]
    assert len(matching) == 1, (name, attributes, [(s.name, s.attributes) for s in spans])
    return matching[0]


def attribute(span: ReadableSpan, key: str) -> object:
    assert span.attributes is not None
    return span.attributes.get(key)


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else format(span.parent.span_id, "016x")


def span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.span_id, "016x")


def user_properties(received: object) -> list[tuple[str, str]]:
    return list(getattr(getattr(received, "properties", None), "UserProperty", []))


# --- merged -------------------------------------------------------------------------------------


def test_an_mqtt5_publisher_s_trace_reaches_a_pulsar_consumer(
    node: RunningNode, client: pulsar.Client, spans: InMemorySpanExporter
) -> None:
    consumer = client.subscribe(pulsar_topic("traces/m2p"), "s")
    traceparent, trace_id, client_span = new_parent()
    publisher = Client(node.mqtt_port, "traced-publisher")
    user = [("colour", "red"), ("traceparent", traceparent)]
    publisher.publish("traces/m2p", b"x", 1, properties=props(UserProperty=user))
    message = consumer.receive(timeout_millis=TIMEOUT_MS)
    consumer.acknowledge(message)
    assert message.properties() == {"colour": "red", "traceparent": traceparent}

    found = spans_of(spans, trace_id, {"publish": 1, "store": 1, "deliver": 1})
    publish = one(found, "publish", **{"mop.protocol": "mqtt"})
    assert parent_id(publish) == client_span  # a child of the publisher's span
    assert attribute(publish, "messaging.client.id") == "traced-publisher"
    assert attribute(publish, "messaging.destination.name") == "traces/m2p"
    assert attribute(publish, "mop.qos") == 1
    assert parent_id(one(found, "store")) == span_id(publish)
    deliver = one(found, "deliver", **{"mop.protocol": "pulsar"})
    assert attribute(deliver, "messaging.destination.name") == pulsar_topic("traces/m2p")


def test_a_pulsar_producer_s_trace_reaches_an_mqtt5_subscriber(
    node: RunningNode, client: pulsar.Client, spans: InMemorySpanExporter
) -> None:
    subscriber = Client(node.mqtt_port, "traced-subscriber")
    subscriber.subscribe("traces/p2m", 1)
    traceparent, trace_id, client_span = new_parent()
    producer = client.create_producer(pulsar_topic("traces/p2m"))
    producer.send(b"x", properties={"traceparent": traceparent, "tracestate": "vendor=1"})
    [received] = subscriber.expect(1)
    assert sorted(user_properties(received)) == [
        ("traceparent", traceparent),
        ("tracestate", "vendor=1"),
    ]

    found = spans_of(spans, trace_id, {"publish": 1, "store": 1, "deliver": 1})
    publish = one(found, "publish", **{"mop.protocol": "pulsar"})
    assert parent_id(publish) == client_span
    assert attribute(publish, "messaging.destination.name") == pulsar_topic("traces/p2m")
    assert parent_id(one(found, "store")) == span_id(publish)
    deliver = one(found, "deliver", **{"mop.protocol": "mqtt"})
    assert attribute(deliver, "messaging.client.id") == "traced-subscriber"
    assert attribute(deliver, "messaging.destination.name") == "traces/p2m"
    assert parent_id(deliver) == client_span


def test_a_message_without_a_trace_gets_one_that_every_consumer_continues(
    node: RunningNode, client: pulsar.Client, spans: InMemorySpanExporter
) -> None:
    consumer = client.subscribe(pulsar_topic("traces/new"), "s")
    v5 = Client(node.mqtt_port, "new-v5")
    v5.subscribe("traces/new", 1)
    v311 = Client(node.mqtt_port, "new-v311", version=4)
    v311.subscribe("traces/new", 1)
    Client(node.mqtt_port, "new-publisher").publish("traces/new", b"x", 1)

    message = consumer.receive(timeout_millis=TIMEOUT_MS)
    traceparent = message.properties()["traceparent"]
    [received] = v5.expect(1)
    assert user_properties(received) == [("traceparent", traceparent)]
    [plain] = v311.expect(1)
    assert plain.payload == b"x"  # MQTT 3.1.1 has no properties to show it in

    found = spans_of(spans, trace_id_of(traceparent), {"publish": 1, "store": 1, "deliver": 3})
    publish = one(found, "publish")
    assert parent_id(publish) is None  # the trace begins here
    assert traceparent.split("-")[2] == span_id(publish)
    clients = {attribute(span, "messaging.client.id") for span in found if span.name == "deliver"}
    assert {"new-v5", "new-v311"} <= clients
    assert all(parent_id(s) == span_id(publish) for s in found if s.name == "deliver")


def test_each_message_of_a_pulsar_batch_has_its_own_trace(
    node: RunningNode, client: pulsar.Client, spans: InMemorySpanExporter
) -> None:
    topic = pulsar_topic("traces/batch")
    consumer = client.subscribe(topic, "s")
    subscriber = Client(node.mqtt_port, "batch-subscriber")
    subscriber.subscribe("traces/batch", 1)
    traceparent, _, _ = new_parent()
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=3, batching_max_publish_delay_ms=1000
    )
    producer.send_async(b"b0", None, properties={"i": "0"})
    producer.send_async(b"b1", None, properties={"i": "1", "traceparent": traceparent})
    producer.send_async(b"b2", None)
    producer.flush()

    parents = [m.properties().get("traceparent") for m in receive_all(consumer, 3)]
    assert parents[1] == traceparent
    assert parents[0] is not None and parents[2] is not None
    assert len({trace_id_of(p) for p in parents}) == 3
    mqtt = [dict(user_properties(m)).get("traceparent") for m in subscriber.expect(3)]
    assert mqtt == parents
    for parent in parents:
        spans_of(spans, trace_id_of(parent), {"publish": 1, "store": 1, "deliver": 2})


def test_retained_messages_keep_their_trace(node: RunningNode, spans: InMemorySpanExporter) -> None:
    traceparent, trace_id, _ = new_parent()
    publisher = Client(node.mqtt_port, "retainer")
    user = [("traceparent", traceparent)]
    publisher.publish("traces/kept", b"k", 1, retain=True, properties=props(UserProperty=user))
    late = Client(node.mqtt_port, "late")
    late.subscribe("traces/kept", 1)
    [received] = late.expect(1)
    assert received.retain and user_properties(received) == user
    found = spans_of(spans, trace_id, {"publish": 1, "deliver": 1})
    assert attribute(one(found, "deliver"), "messaging.client.id") == "late"


def test_a_node_with_ratio_zero_traces_nothing_and_adds_nothing() -> None:
    with pulsar_node() as node, pulsar_client(node) as client:
        assert node.node.telemetry.tracing is None
        assert node.node.processor.tracing is None
        consumer = client.subscribe(pulsar_topic("traces/off"), "s")
        subscriber = Client(node.mqtt_port, "off-subscriber")
        subscriber.subscribe("traces/off", 1)
        traceparent, _, _ = new_parent()
        publisher = Client(node.mqtt_port, "off-publisher")
        publisher.publish("traces/off", b"plain", 1)
        user = [("traceparent", traceparent)]
        publisher.publish("traces/off", b"given", 1, properties=props(UserProperty=user))
        first, second = receive_all(consumer, 2)
        assert first.properties() == {}
        assert second.properties() == {"traceparent": traceparent}  # passed on untouched
        assert [user_properties(m) for m in subscriber.expect(2)] == [[], user]


# --- separated ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Separated:
    broker: RunningNode
    broker_spans: InMemorySpanExporter
    proxy: RunningNode
    proxy_spans: InMemorySpanExporter


@pytest.fixture(scope="module")
def separated() -> Iterator[Separated]:
    """A broker node (Pulsar only) and a proxy in front of it, both tracing."""
    with contextlib.ExitStack() as stack:
        broker, broker_spans = stack.enter_context(traced_node(broker_settings()))
        proxy, proxy_spans = stack.enter_context(traced_node(proxy_settings(service_url(broker))))
        yield Separated(broker, broker_spans, proxy, proxy_spans)


def test_a_trace_goes_from_mqtt_through_a_proxy_and_its_broker(separated: Separated) -> None:
    with pulsar_client(separated.broker) as client:
        consumer = client.subscribe(pulsar_topic("traces/sep-m2p"), "s")
        subscriber = Client(separated.proxy.mqtt_port, "sep-subscriber")
        subscriber.subscribe("traces/sep-m2p", 1)
        traceparent, trace_id, client_span = new_parent()
        publisher = Client(separated.proxy.mqtt_port, "sep-publisher")
        user = [("traceparent", traceparent)]
        publisher.publish("traces/sep-m2p", b"x", 1, properties=props(UserProperty=user))

        message = consumer.receive(timeout_millis=TIMEOUT_MS)
        assert message.properties()["traceparent"] == traceparent
        [received] = subscriber.expect(1)
        assert user_properties(received) == user

    wanted = {"publish": 1, "store": 1, "deliver": 1}
    on_proxy = spans_of(separated.proxy_spans, trace_id, wanted)
    publish = one(on_proxy, "publish", **{"mop.protocol": "mqtt"})
    assert parent_id(publish) == client_span
    assert attribute(one(on_proxy, "deliver"), "messaging.client.id") == "sep-subscriber"
    # The broker got the message from the proxy over the Pulsar protocol, and sent it to the
    # proxy's consumer and to the Pulsar client's.
    wanted = {"publish": 1, "store": 1, "deliver": 2}
    on_broker = spans_of(separated.broker_spans, trace_id, wanted)
    assert attribute(one(on_broker, "publish"), "mop.protocol") == "pulsar"


def test_a_trace_goes_from_pulsar_through_a_broker_and_a_proxy(separated: Separated) -> None:
    subscriber = Client(separated.proxy.mqtt_port, "sep-p2m-subscriber")
    subscriber.subscribe("traces/sep-p2m", 1)
    traceparent, trace_id, client_span = new_parent()
    with pulsar_client(separated.broker) as client:
        producer = client.create_producer(pulsar_topic("traces/sep-p2m"))
        producer.send(b"y", properties={"traceparent": traceparent})
        [received] = subscriber.expect(1)
    assert user_properties(received) == [("traceparent", traceparent)]
    deliver = one(spans_of(separated.proxy_spans, trace_id, {"deliver": 1}), "deliver")
    assert attribute(deliver, "mop.protocol") == "mqtt"
    assert parent_id(deliver) == client_span
    spans_of(separated.broker_spans, trace_id, {"publish": 1, "store": 1, "deliver": 1})
