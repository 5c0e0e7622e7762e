"""Message traces (`mop.observability.tracing`, `mop.processor.tracing`): which messages are
traced, the spans they get, and the W3C trace context they carry on."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, StatusCode

from mop.message import Message
from mop.observability.telemetry import TelemetryError, open_telemetry
from mop.observability.tracing import NodeTracing
from mop.processor import ClientContext
from mop.processor.tracing import trace_context
from mop.protocols.mqtt.mapping import message_properties, with_properties
from mop.settings import TelemetrySettings

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE_ID}-{SPAN_ID}-01"
NOT_SAMPLED = f"00-{TRACE_ID}-{SPAN_ID}-00"
PUBLISHER = ClientContext(client_id="pub", protocol="mqtt")
SUBSCRIBER = ClientContext(client_id="sub", protocol="pulsar")


def _tracing(ratio: float) -> tuple[NodeTracing, InMemorySpanExporter]:
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return NodeTracing(provider), exporter


@pytest.fixture
def always() -> Iterator[tuple[NodeTracing, InMemorySpanExporter]]:
    yield _tracing(1.0)


def _by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exporter.get_finished_spans()}


def test_trace_context_reads_the_first_traceparent_and_every_tracestate() -> None:
    properties = (("a", "1"), ("traceparent", "one"), ("tracestate", "x=1"), ("tracestate", "y=2"))
    assert trace_context((*properties, ("traceparent", "two"))) == ("one", "x=1,y=2")
    assert trace_context((("a", "1"),)) == (None, "")


def test_a_message_with_a_sampled_traceparent_continues_its_trace(
    always: tuple[NodeTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = always
    trace = tracing.received(PUBLISHER, "a/b", 1, (("traceparent", SAMPLED),))
    assert trace is not None
    assert trace.carrier == ()  # the message keeps the trace context it came with
    trace.storing()
    trace.stored()
    trace.end()
    spans = _by_name(exporter)
    publish, store = spans["publish"], spans["store"]
    assert publish.context is not None and store.context is not None
    assert format(publish.context.trace_id, "032x") == TRACE_ID
    assert publish.parent is not None and format(publish.parent.span_id, "016x") == SPAN_ID
    assert store.parent is not None and store.parent.span_id == publish.context.span_id
    assert publish.kind is SpanKind.SERVER
    assert publish.attributes == {
        "messaging.system": "mop",
        "mop.protocol": "mqtt",
        "messaging.destination.name": "a/b",
        "messaging.client.id": "pub",
        "mop.qos": 1,
    }


def test_a_sampled_parent_is_followed_whatever_the_ratio() -> None:
    tracing, exporter = _tracing(1e-12)
    assert tracing.received(PUBLISHER, "t", 0, ()) is None  # a new trace: practically never
    trace = tracing.received(PUBLISHER, "t", 0, (("traceparent", SAMPLED),))
    assert trace is not None
    trace.end()
    assert [span.name for span in exporter.get_finished_spans()] == ["publish"]


def test_a_parent_that_is_not_sampled_is_not_traced(
    always: tuple[NodeTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = always
    assert tracing.received(PUBLISHER, "t", 1, (("traceparent", NOT_SAMPLED),)) is None
    assert tracing.delivering(SUBSCRIBER, "t", 1, (("traceparent", NOT_SAMPLED),)) is None
    assert exporter.get_finished_spans() == ()


def test_a_new_trace_gives_the_message_its_traceparent(
    always: tuple[NodeTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = always
    trace = tracing.received(PUBLISHER, "t", 1, (("colour", "red"),))
    assert trace is not None
    [(name, value)] = trace.carrier
    trace.end()
    [publish] = exporter.get_finished_spans()
    assert publish.context is not None and publish.parent is None
    assert name == "traceparent"
    version, trace_id, span_id, flags = value.split("-")
    assert (version, trace_id) == ("00", f"{publish.context.trace_id:032x}")
    assert span_id == f"{publish.context.span_id:016x}"
    assert int(flags, 16) & 1  # sampled
    # Delivered later (anywhere), the message's "deliver" span is a child of "publish".
    delivery = tracing.delivering(SUBSCRIBER, "t", 0, (("colour", "red"), trace.carrier[0]))
    assert delivery is not None
    delivery.sent()
    deliver = _by_name(exporter)["deliver"]
    assert deliver.parent is not None and deliver.parent.span_id == publish.context.span_id
    assert deliver.attributes is not None and deliver.attributes["mop.protocol"] == "pulsar"
    assert deliver.attributes["messaging.client.id"] == "sub"


def test_a_traceparent_that_does_not_parse_is_kept_and_not_continued(
    always: tuple[NodeTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = always
    trace = tracing.received(PUBLISHER, "t", 1, (("traceparent", "garbage"),))
    assert trace is not None and trace.carrier == ()
    trace.end()
    [publish] = exporter.get_finished_spans()
    assert publish.parent is None
    assert tracing.delivering(SUBSCRIBER, "t", 1, (("traceparent", "garbage"),)) is None


def test_messages_without_a_trace_get_no_deliver_span(
    always: tuple[NodeTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = always
    assert tracing.delivering(SUBSCRIBER, "t", 1, (("colour", "red"),)) is None
    assert exporter.get_finished_spans() == ()


def test_a_failed_store_marks_both_spans(
    always: tuple[NodeTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = always
    trace = tracing.received(PUBLISHER, "t", 1, ())
    assert trace is not None
    trace.storing()
    trace.stored(OSError("disk full"))
    trace.end(OSError("disk full"))
    trace.end()  # once only
    spans = exporter.get_finished_spans()
    assert sorted(span.name for span in spans) == ["publish", "store"]
    assert {span.status.status_code for span in spans} == {StatusCode.ERROR}
    assert {span.status.description for span in spans} == {"disk full"}


def test_the_trace_context_reaches_mqtt5_subscribers_as_user_properties() -> None:
    message = with_properties(Message(b"x", (("a", "1"),)), (("traceparent", SAMPLED),))
    props = message_properties(message, now_ms=0)
    assert props.user_properties == (("a", "1"), ("traceparent", SAMPLED))


def test_tracing_is_off_at_ratio_zero() -> None:
    telemetry = open_telemetry(TelemetrySettings(), mode="merged", node_name="n")
    try:
        assert telemetry.tracing is None
        with pytest.raises(TelemetryError, match="tracing is off"):
            telemetry.export_spans_to(InMemorySpanExporter())
    finally:
        telemetry.shutdown()


def test_a_node_that_traces_has_a_provider_of_its_own() -> None:
    settings = TelemetrySettings(trace_sample_ratio=1.0)
    first = open_telemetry(settings, mode="merged", node_name="a")
    second = open_telemetry(settings, mode="merged", node_name="b")
    try:
        exporter = InMemorySpanExporter()
        first.export_spans_to(exporter)
        assert first.tracing is not None and second.tracing is not None
        for tracing in (first.tracing, second.tracing):
            trace = tracing.received(PUBLISHER, "t", 0, ())
            assert trace is not None
            trace.end()
        [span] = exporter.get_finished_spans()
        assert span.resource.attributes["service.instance.id"] == "a"
    finally:
        first.shutdown()
        second.shutdown()


def test_otlp_traces_without_the_exporter_installed_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    settings = TelemetrySettings(
        trace_sample_ratio=0.5, otlp_traces_endpoint="http://127.0.0.1:9/v1/traces"
    )
    with pytest.raises(TelemetryError, match=r"mop\[otlp\]"):
        open_telemetry(settings, mode="merged", node_name="n")


def test_otlp_traces_export_in_batches() -> None:
    settings = TelemetrySettings(
        trace_sample_ratio=1.0, otlp_traces_endpoint="http://127.0.0.1:9/v1/traces"
    )
    telemetry = open_telemetry(settings, mode="merged", node_name="n")
    telemetry.shutdown()  # nothing recorded: nothing to send
