"""The processor's counters as OpenTelemetry instruments.

The hot path only adds to plain integers (`ProcessorStats`); these observable instruments read
them when a scrape or an export asks, so recording costs no more with metrics served than
without.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from mop.processor import MessagingProcessor


def register_processor_metrics(meter: Meter, processor: MessagingProcessor) -> None:
    stats = processor.stats

    def connections(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.connections)

    def connections_opened(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.connections_total)

    def messages(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.messages_received, {"direction": "in"})
        yield Observation(stats.messages_sent, {"direction": "out"})

    def dropped(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.messages_dropped)

    def transferred(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.bytes_received, {"direction": "in"})
        yield Observation(stats.bytes_sent, {"direction": "out"})

    def uptime(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.uptime)

    meter.create_observable_up_down_counter(
        "mop.connections.active",
        [connections],
        unit="{connection}",
        description="Client connections open now, every protocol",
    )
    meter.create_observable_counter(
        "mop.connections.opened",
        [connections_opened],
        unit="{connection}",
        description="Client connections admitted since the node started",
    )
    meter.create_observable_counter(
        "mop.messages",
        [messages],
        unit="{message}",
        description="Messages received from clients (in) and delivered to clients (out)",
    )
    meter.create_observable_counter(
        "mop.messages.dropped",
        [dropped],
        unit="{message}",
        description="Messages the node could not publish or deliver",
    )
    meter.create_observable_counter(
        "mop.bytes",
        [transferred],
        unit="By",
        description="Payload bytes received from clients (in) and sent to clients (out)",
    )
    meter.create_observable_gauge(
        "mop.uptime", [uptime], unit="s", description="Seconds since the node started"
    )
