"""The processor's and the adapters' counters as OpenTelemetry instruments.

The hot path only adds to plain integers (`ProcessorStats`, a `ProtocolStats` per protocol) and
bucket arrays; these observable instruments read them when a scrape or an export asks, so
recording costs no more with metrics served than without. What an adapter holds (sessions,
subscriptions, retained messages, deliveries in flight) is counted at that moment too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from mop.counters import Closing, Drop, Refusal
from mop.observability.histograms import HistogramReading
from mop.observability.telemetry import Telemetry
from mop.processor import AdapterCounts, MessagingProcessor, ProcessorStats

__all__ = ["register_processor_metrics"]

Callback = Callable[[CallbackOptions], Iterable[Observation]]


def register_processor_metrics(
    telemetry: Telemetry,
    processor: MessagingProcessor,
    *,
    backend_drops: Callable[[], Mapping[str, int]] | None = None,
) -> None:
    """Instruments over `processor.stats`; `backend_drops` adds drops the backend counts
    itself (the colocated broker's messages without subscribers and expired ones), by
    reason."""
    stats = processor.stats
    meter = telemetry.meter
    _connections(meter, stats)
    _traffic(meter, stats, backend_drops)
    _adapters(telemetry, stats)
    meter.create_observable_gauge(
        "mop.uptime",
        [_one(lambda: stats.uptime)],
        unit="s",
        description="Seconds since the node started",
    )
    telemetry.histograms.add(
        "mop.publish.duration",
        lambda: [({}, stats.publish_latency)],
        description="From the processor receiving a publish to its result: stored and routed,"
        " durable as storage.fsync says (one publish call in telemetry.latency_sampling)",
    )

    def delivery() -> Iterable[HistogramReading]:
        for name, protocol in list(stats.protocols.items()):
            yield {"protocol": name}, protocol.delivery_latency

    telemetry.histograms.add(
        "mop.delivery.latency",
        delivery,
        description="From a message's publish time to its delivery to a client (one message"
        " in telemetry.latency_sampling; millisecond clock)",
    )


def _one(read: Callable[[], float]) -> Callback:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(read())

    return callback


def _connections(meter: Meter, stats: ProcessorStats) -> None:
    def active(_options: CallbackOptions) -> Iterable[Observation]:
        for name, protocol in list(stats.protocols.items()):
            yield Observation(protocol.connections, {"protocol": name})

    def opened(_options: CallbackOptions) -> Iterable[Observation]:
        for name, protocol in list(stats.protocols.items()):
            yield Observation(protocol.opened, {"protocol": name})

    # Every known reason from the start (at 0), so that a rate sees the first one counted.
    def closed(_options: CallbackOptions) -> Iterable[Observation]:
        for name, protocol in list(stats.protocols.items()):
            counts: dict[str, int] = {**dict.fromkeys(Closing, 0), **protocol.closed}
            for reason, count in counts.items():
                yield Observation(count, {"protocol": name, "reason": str(reason)})

    def rejected(_options: CallbackOptions) -> Iterable[Observation]:
        for name, protocol in list(stats.protocols.items()):
            counts: dict[str, int] = {**dict.fromkeys(Refusal, 0), **protocol.refused}
            for reason, count in counts.items():
                yield Observation(count, {"protocol": name, "reason": str(reason)})

    meter.create_observable_up_down_counter(
        "mop.connections.active",
        [active],
        unit="{connection}",
        description="Client connections open now, by protocol",
    )
    meter.create_observable_counter(
        "mop.connections.opened",
        [opened],
        unit="{connection}",
        description="Client connections admitted since the node started, by protocol",
    )
    meter.create_observable_counter(
        "mop.connections.closed",
        [closed],
        unit="{connection}",
        description="Admitted client connections that ended, by protocol and reason",
    )
    meter.create_observable_counter(
        "mop.connections.rejected",
        [rejected],
        unit="{connection}",
        description="Client connections refused before they were admitted, by protocol and reason",
    )


def _traffic(
    meter: Meter, stats: ProcessorStats, backend_drops: Callable[[], Mapping[str, int]] | None
) -> None:
    def requests(_options: CallbackOptions) -> Iterable[Observation]:
        for name, protocol in list(stats.protocols.items()):
            yield Observation(protocol.requests, {"protocol": name})

    def messages(_options: CallbackOptions) -> Iterable[Observation]:
        for name, protocol in list(stats.protocols.items()):
            yield Observation(protocol.messages_received, {"protocol": name, "direction": "in"})
            yield Observation(protocol.messages_sent, {"protocol": name, "direction": "out"})

    def transferred(_options: CallbackOptions) -> Iterable[Observation]:
        for name, protocol in list(stats.protocols.items()):
            yield Observation(protocol.bytes_received, {"protocol": name, "direction": "in"})
            yield Observation(protocol.bytes_sent, {"protocol": name, "direction": "out"})

    def dropped(_options: CallbackOptions) -> Iterable[Observation]:
        reasons: dict[str, int] = {**dict.fromkeys(Drop, 0), **stats.dropped}
        if backend_drops is not None:
            for reason, count in backend_drops().items():
                reasons[reason] = reasons.get(reason, 0) + count
        for reason, count in reasons.items():
            yield Observation(count, {"reason": str(reason)})

    meter.create_observable_counter(
        "mop.requests",
        [requests],
        unit="{request}",
        description="Packets (MQTT) and commands (Pulsar) received from clients, by protocol",
    )
    meter.create_observable_counter(
        "mop.messages",
        [messages],
        unit="{message}",
        description="Messages received from clients (in) and delivered to clients (out), by"
        " protocol",
    )
    meter.create_observable_counter(
        "mop.messages.dropped",
        [dropped],
        unit="{message}",
        description="Messages not published or not delivered, by reason",
    )
    meter.create_observable_counter(
        "mop.bytes",
        [transferred],
        unit="By",
        description="Bytes read from (in) and written to (out) client connections, by protocol",
    )


def _adapters(telemetry: Telemetry, stats: ProcessorStats) -> None:
    meter = telemetry.meter

    def read() -> dict[str, AdapterCounts]:
        return {name: counts() for name, counts in list(stats.adapters.items())}

    counts = telemetry.per_collection(read)

    def sessions(_options: CallbackOptions) -> Iterable[Observation]:
        for name, held in counts().items():
            yield Observation(held.sessions, {"protocol": name, "state": "connected"})
            yield Observation(held.offline_sessions, {"protocol": name, "state": "offline"})

    def subscriptions(_options: CallbackOptions) -> Iterable[Observation]:
        for name, held in counts().items():
            yield Observation(held.subscriptions, {"protocol": name, "kind": "normal"})
            yield Observation(held.shared_subscriptions, {"protocol": name, "kind": "shared"})

    def field(pick: Callable[[AdapterCounts], int]) -> Callback:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            for name, held in counts().items():
                yield Observation(pick(held), {"protocol": name})

        return callback

    meter.create_observable_up_down_counter(
        "mop.sessions",
        [sessions],
        unit="{session}",
        description="Sessions held by this node: connected through it, or offline with their"
        " timers here",
    )
    meter.create_observable_up_down_counter(
        "mop.subscriptions",
        [subscriptions],
        unit="{subscription}",
        description="Subscriptions of the sessions this node holds; shared ones apart",
    )
    meter.create_observable_up_down_counter(
        "mop.retained.messages",
        [field(lambda held: held.retained)],
        unit="{message}",
        description="Retained messages",
    )
    meter.create_observable_up_down_counter(
        "mop.messages.inflight",
        [field(lambda held: held.inflight)],
        unit="{message}",
        description="Deliveries sent to clients of this node and not yet acknowledged by them",
    )
    meter.create_observable_up_down_counter(
        "mop.messages.queued",
        [field(lambda held: held.queued)],
        unit="{message}",
        description="Deliveries waiting for room in their client's window on this node",
    )
