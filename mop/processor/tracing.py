"""How adapters record the trace of a message: publish -> store -> deliver.

A small interface, implemented with OpenTelemetry by `mop.observability.tracing`; the adapters
see only this. A node that does not trace has none (`MessagingProcessor.tracing is None`), so
the hot paths pay one None check. The W3C trace context travels with the message as two
properties, `traceparent` and `tracestate` (MQTT 5 user properties, Pulsar message properties),
so a trace follows a message from any protocol to any other, and through separated proxies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from mop.processor.processor import ClientContext

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "DeliveryTrace",
    "MessageTracing",
    "PublishTrace",
    "Properties",
    "trace_context",
]

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"

Properties = tuple[tuple[str, str], ...]


class PublishTrace(Protocol):
    """The spans of one message received from a client: "publish" from its receipt, and
    "store" (its child) from `storing` until `stored`. `end` closes "publish"."""

    @property
    def carrier(self) -> Properties:
        """Properties the adapter adds to the message so that later hops continue the trace:
        `traceparent` (and `tracestate`) of a trace started here, () when the message
        carried its trace context already."""
        ...

    def storing(self) -> None:
        """The message goes to the backend now."""
        ...

    def stored(self, error: BaseException | None = None) -> None:
        """The backend answered: durable, or `error`."""
        ...

    def end(self, error: BaseException | None = None) -> None:
        """The adapter is done with the message (after `stored`)."""
        ...


class DeliveryTrace(Protocol):
    """A "deliver" span: from when an adapter takes a message for a client until it is
    written to (or queued for) the client's connection."""

    def sent(self) -> None: ...


class MessageTracing(Protocol):
    def received(
        self, ctx: ClientContext, topic: str, qos: int, properties: Properties
    ) -> PublishTrace | None:
        """Start the trace of a message `ctx`'s client published (its `properties` as
        received): a child of the trace it carries, or a new one if sampled. None when the
        message is not traced."""
        ...

    def delivering(
        self, ctx: ClientContext, topic: str, qos: int, properties: Properties
    ) -> DeliveryTrace | None:
        """A "deliver" span for a message going to `ctx`'s client, in the trace its
        `properties` carry; None when they carry no sampled one."""
        ...


def trace_context(properties: Properties) -> tuple[str | None, str]:
    """The `traceparent` (the first one; None without one) and the `tracestate` (all of
    them joined, as W3C joins repeated headers) that `properties` carry."""
    parent: str | None = None
    states: list[str] = []
    for name, value in properties:
        if name == TRACEPARENT:
            if parent is None:
                parent = value
        elif name == TRACESTATE:
            states.append(value)
    return parent, ",".join(states)
