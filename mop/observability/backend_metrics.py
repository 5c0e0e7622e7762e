"""What the backend below the processor counts, as OpenTelemetry instruments: the colocated
broker and its storage (merged mode, broker nodes), or the links to the brokers (separated
mode). Read when a scrape or an export asks, like the processor's counters.

The node hands over small readers (`BrokerReadings`, a `LinkStats`), never the backend itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from opentelemetry.metrics import CallbackOptions, Observation

from mop.counters import LatencyHistogram
from mop.observability.histograms import HistogramReading
from mop.observability.telemetry import Telemetry

if TYPE_CHECKING:
    from mop.protocols.pulsar.driver.stats import LinkStats

__all__ = ["BrokerCounts", "BrokerReadings", "register_broker_metrics", "register_link_metrics"]


class BrokerCounts(Protocol):
    """What the broker's `stats()` tells (its `BrokerStats`)."""

    @property
    def topics(self) -> int: ...
    @property
    def subscriptions(self) -> int: ...
    @property
    def consumers(self) -> int: ...
    @property
    def messages_stored(self) -> int: ...
    @property
    def messages_backlog(self) -> int: ...
    @property
    def messages_unacked(self) -> int: ...


@dataclass(frozen=True, slots=True)
class BrokerReadings:
    """The colocated broker as the metrics see it."""

    # The broker's counts (a walk over its subscriptions: cache it for one collection).
    stats: Callable[[], BrokerCounts]
    # (subscription, topic, messages waiting) of the N largest backlogs, largest first.
    largest_backlogs: Callable[[int], list[tuple[str, str, int]]]
    # How long durable writes take (None: storage that does not fsync, in tests).
    sync_latency: LatencyHistogram | None = None


def register_broker_metrics(telemetry: Telemetry, broker: BrokerReadings, *, top: int) -> None:
    """Instruments over the broker's counts, its `top` largest backlogs (one series per
    subscription and topic among them: never one per client) and its storage."""
    meter = telemetry.meter
    stats = broker.stats

    def gauge(name: str, pick: Callable[[BrokerCounts], int], unit: str, description: str) -> None:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            yield Observation(pick(stats()))

        meter.create_observable_up_down_counter(
            name, [callback], unit=unit, description=description
        )

    gauge("mop.broker.topics", lambda s: s.topics, "{topic}", "Topics of the broker")
    gauge(
        "mop.broker.subscriptions",
        lambda s: s.subscriptions,
        "{subscription}",
        "Subscriptions of the broker (durable or not, with or without consumers)",
    )
    gauge("mop.broker.consumers", lambda s: s.consumers, "{consumer}", "Consumers attached now")
    gauge(
        "mop.broker.messages.stored",
        lambda s: s.messages_stored,
        "{entry}",
        "Entries in storage: a message, or a Pulsar batch of messages as one entry",
    )
    gauge(
        "mop.broker.backlog",
        lambda s: s.messages_backlog,
        "{message}",
        "Messages waiting for a consumer, every subscription (delayed ones included; a"
        " Pulsar batch counts its messages)",
    )
    gauge(
        "mop.broker.unacked",
        lambda s: s.messages_unacked,
        "{message}",
        "Messages dispatched to consumers and not yet acknowledged",
    )

    def backlogs(_options: CallbackOptions) -> Iterable[Observation]:
        for subscription, topic, size in broker.largest_backlogs(top):
            yield Observation(size, {"subscription": subscription, "topic": topic})

    meter.create_observable_gauge(
        "mop.subscription.backlog",
        [backlogs],
        unit="{message}",
        description=f"Messages waiting for a consumer, for the {top} largest backlogs only"
        " (by subscription and topic; telemetry.backlog_top)",
    )
    sync = broker.sync_latency
    if sync is not None:
        telemetry.histograms.add(
            "mop.storage.sync.duration",
            lambda: [({}, sync)],
            description="Durable writes of the storage: from handing the records to a worker"
            " thread until they are written and fsynced",
        )


def register_link_metrics(telemetry: Telemetry, links: LinkStats) -> None:
    """Instruments over a separated proxy's links to the brokers, by broker address."""
    meter = telemetry.meter

    def lookups(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(links.lookups)

    def connections(_options: CallbackOptions) -> Iterable[Observation]:
        for address, link in list(links.links.items()):
            yield Observation(link.connections, {"broker": address})

    def commands(_options: CallbackOptions) -> Iterable[Observation]:
        for address, link in list(links.links.items()):
            yield Observation(link.commands, {"broker": address})

    def transferred(_options: CallbackOptions) -> Iterable[Observation]:
        for address, link in list(links.links.items()):
            yield Observation(link.bytes_received, {"broker": address, "direction": "in"})
            yield Observation(link.bytes_sent, {"broker": address, "direction": "out"})

    def sends() -> Iterable[HistogramReading]:
        for address, link in list(links.links.items()):
            yield {"broker": address}, link.send_latency

    def receives() -> Iterable[HistogramReading]:
        for address, link in list(links.links.items()):
            yield {"broker": address}, link.receive_latency

    meter.create_observable_counter(
        "mop.broker_link.lookups",
        [lookups],
        unit="{lookup}",
        description="Topic lookups sent to the brokers (a redirect makes two)",
    )
    meter.create_observable_up_down_counter(
        "mop.broker_link.connections",
        [connections],
        unit="{connection}",
        description="Connections open to each broker",
    )
    meter.create_observable_counter(
        "mop.broker_link.commands",
        [commands],
        unit="{command}",
        description="Commands sent to each broker (a SEND carries a batch of messages)",
    )
    meter.create_observable_counter(
        "mop.broker_link.bytes",
        [transferred],
        unit="By",
        description="Bytes read from (in) and written to (out) each broker",
    )
    telemetry.histograms.add(
        "mop.broker_link.send.duration",
        sends,
        description="From sending a batch of messages to a broker to its receipt (one"
        " message in telemetry.latency_sampling)",
    )
    telemetry.histograms.add(
        "mop.broker_link.receive.delay",
        receives,
        description="From a message's publish time, set by the proxy that sent it, to its"
        " arrival from the broker here (sampled; millisecond clocks of both hosts)",
    )
