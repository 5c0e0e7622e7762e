"""Spans of messages, recorded with OpenTelemetry: `NodeTracing` is what the adapters reach as
`MessagingProcessor.tracing` (the `MessageTracing` interface of `mop.processor.tracing`).

A message that carries a W3C `traceparent` is traced as a child of it (when it says sampled;
the sampler of `mop.observability.telemetry` follows the parent); one without gets a trace of
its own if the sample ratio picks it, and the adapter adds its `traceparent` to the message.
The W3C format is read and written by OpenTelemetry's TraceContext propagator.
"""

from __future__ import annotations

from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from mop.processor import ClientContext
from mop.processor.tracing import TRACEPARENT, TRACESTATE, Properties, trace_context
from mop.version import VERSION

__all__ = ["TRACER_NAME", "NodeTracing"]

TRACER_NAME: Final = "mop"
# No parent: an explicit empty context, never the task's ambient one.
_ROOT: Final = Context()
_PROPAGATOR: Final = TraceContextTextMapPropagator()


def _fail(span: Span, error: BaseException) -> None:
    span.set_status(Status(StatusCode.ERROR, str(error) or type(error).__name__))
    span.set_attribute("error.type", type(error).__name__)


class _PublishTrace:
    """`PublishTrace`: the "publish" span of a received message and its "store" child."""

    __slots__ = ("_ended", "_span", "_store", "_tracer", "carrier")

    def __init__(self, tracer: trace.Tracer, span: Span, carrier: Properties) -> None:
        self._tracer = tracer
        self._span = span
        self._store: Span | None = None
        self._ended = False
        self.carrier = carrier

    def storing(self) -> None:
        if self._store is None and not self._ended:
            self._store = self._tracer.start_span(
                "store", context=trace.set_span_in_context(self._span), kind=SpanKind.INTERNAL
            )

    def stored(self, error: BaseException | None = None) -> None:
        store = self._store
        if store is None:
            return
        self._store = None
        if error is not None:
            _fail(store, error)
        store.end()

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self.stored(error)
        self._ended = True
        if error is not None:
            _fail(self._span, error)
        self._span.end()


class _DeliveryTrace:
    """`DeliveryTrace`: one "deliver" span."""

    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def sent(self) -> None:
        self._span.end()


class NodeTracing:
    """A node's message tracing over its own TracerProvider (see `open_telemetry`)."""

    def __init__(self, provider: TracerProvider) -> None:
        self._tracer = provider.get_tracer(TRACER_NAME, VERSION)

    def received(
        self, ctx: ClientContext, topic: str, qos: int, properties: Properties
    ) -> _PublishTrace | None:
        parent, state = trace_context(properties)
        context = _ROOT if parent is None else _extract(parent, state)
        span = self._tracer.start_span("publish", context=context, kind=SpanKind.SERVER)
        if not span.is_recording():  # not sampled
            return None
        span.set_attributes(_attributes(ctx, topic, qos))
        # A message that names its trace keeps it as it is (even one mop cannot read): it
        # belongs to the client.
        carrier = _inject(span) if parent is None else ()
        return _PublishTrace(self._tracer, span, carrier)

    def delivering(
        self, ctx: ClientContext, topic: str, qos: int, properties: Properties
    ) -> _DeliveryTrace | None:
        parent, state = trace_context(properties)
        if parent is None:
            return None
        context = _extract(parent, state)
        if not trace.get_current_span(context).get_span_context().is_valid:
            return None  # not a trace context: no trace to continue
        span = self._tracer.start_span("deliver", context=context, kind=SpanKind.PRODUCER)
        if not span.is_recording():
            return None
        span.set_attributes(_attributes(ctx, topic, qos))
        return _DeliveryTrace(span)


def _attributes(ctx: ClientContext, topic: str, qos: int) -> dict[str, str | int]:
    return {
        "messaging.system": "mop",
        "mop.protocol": ctx.protocol,
        "messaging.destination.name": topic,
        "messaging.client.id": ctx.client_id,
        "mop.qos": qos,
    }


def _extract(parent: str, state: str) -> Context:
    """The context of the remote span `traceparent` names (an empty one when it does not
    parse)."""
    carrier = {TRACEPARENT: parent, TRACESTATE: state} if state else {TRACEPARENT: parent}
    return _PROPAGATOR.extract(carrier, context=_ROOT)


def _inject(span: Span) -> Properties:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span, _ROOT))
    return tuple(carrier.items())
