"""The processor's and the adapters' counters as they appear on the Prometheus page: names,
labels, and values read when the page is asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mop.backends.local import open_local_backend
from mop.broker.storage import MemoryStorage
from mop.counters import Closing, Drop, Refusal
from mop.observability import Telemetry, open_telemetry
from mop.observability.processor_metrics import register_processor_metrics
from mop.processor import AdapterCounts, MessagingProcessor
from mop.settings import TelemetrySettings
from mop.testing.metrics import MetricsPage

Labels = tuple[tuple[str, str], ...]


def page(telemetry: Telemetry) -> dict[tuple[str, Labels], float]:
    """The samples on the Prometheus page: (name, sorted labels) -> value."""
    scraped = MetricsPage(telemetry.prometheus().body.decode())
    return {
        (name, tuple(sorted(labels))): value for (name, labels), value in scraped.samples.items()
    }


@pytest.fixture
async def processor() -> AsyncIterator[MessagingProcessor]:
    async with open_local_backend(MemoryStorage()) as backend:
        yield MessagingProcessor(backend)


async def test_counters_are_read_by_protocol_and_reason(processor: MessagingProcessor) -> None:
    telemetry = open_telemetry(TelemetrySettings(), mode="merged", node_name="test")
    register_processor_metrics(
        telemetry, processor, backend_drops=lambda: {Drop.EXPIRED: 4, Drop.NO_SUBSCRIBERS: 6}
    )
    stats = processor.stats
    mqtt, pulsar = stats.protocol("mqtt"), stats.protocol("pulsar")
    mqtt.connections, mqtt.opened = 2, 5
    mqtt.close(Closing.TAKEOVER)
    mqtt.refuse(Refusal.BAD_CREDENTIALS)
    mqtt.requests = 7
    mqtt.record_sent(3, 30)
    pulsar.messages_received, pulsar.bytes_received = 11, 110
    processor.record_dropped(Drop.DENIED)
    stats.adapters["mqtt"] = lambda: AdapterCounts(
        sessions=2, offline_sessions=1, subscriptions=3, shared_subscriptions=1, retained=9
    )
    found = page(telemetry)
    assert found[("mop_connections_active", (("protocol", "mqtt"),))] == 1
    assert found[("mop_connections_opened_total", (("protocol", "mqtt"),))] == 5
    mqtt_takeover = (("protocol", "mqtt"), ("reason", "takeover"))
    assert found[("mop_connections_closed_total", mqtt_takeover)] == 1
    mqtt_bad = (("protocol", "mqtt"), ("reason", "bad_credentials"))
    assert found[("mop_connections_rejected_total", mqtt_bad)] == 1
    assert found[("mop_requests_total", (("protocol", "mqtt"),))] == 7
    assert found[("mop_messages_total", (("direction", "out"), ("protocol", "mqtt")))] == 3
    assert found[("mop_messages_total", (("direction", "in"), ("protocol", "pulsar")))] == 11
    assert found[("mop_bytes_total", (("direction", "in"), ("protocol", "pulsar")))] == 110
    for reason, count in (("denied", 1), ("no_subscribers", 6), ("expired", 4)):
        assert found[("mop_messages_dropped_total", (("reason", reason),))] == count
    assert found[("mop_sessions", (("protocol", "mqtt"), ("state", "connected")))] == 2
    assert found[("mop_sessions", (("protocol", "mqtt"), ("state", "offline")))] == 1
    assert found[("mop_subscriptions", (("kind", "shared"), ("protocol", "mqtt")))] == 1
    assert found[("mop_retained_messages", (("protocol", "mqtt"),))] == 9
    assert found[("mop_publish_duration_seconds_count", ())] == 0
    assert ("mop_delivery_latency_seconds_count", (("protocol", "pulsar"),)) in found


async def test_each_scrape_reads_what_adapters_hold_once_and_afresh(
    processor: MessagingProcessor,
) -> None:
    telemetry = open_telemetry(TelemetrySettings(), mode="merged", node_name="test")
    register_processor_metrics(telemetry, processor)
    reads = []

    def counts() -> AdapterCounts:
        reads.append(1)
        return AdapterCounts(sessions=len(reads), retained=len(reads))

    processor.stats.adapters["mqtt"] = counts
    connected = ("mop_sessions", (("protocol", "mqtt"), ("state", "connected")))
    retained = ("mop_retained_messages", (("protocol", "mqtt"),))
    first = page(telemetry)
    assert (first[connected], first[retained], len(reads)) == (1, 1, 1)
    second = page(telemetry)  # at once: not the value of the scrape before
    assert (second[connected], second[retained], len(reads)) == (2, 2, 2)


async def test_known_reasons_are_on_the_page_at_zero_from_the_start(
    processor: MessagingProcessor,
) -> None:
    telemetry = open_telemetry(TelemetrySettings(), mode="merged", node_name="test")
    register_processor_metrics(telemetry, processor)
    processor.stats.protocol("mqtt")
    found = page(telemetry)
    for reason in Closing:
        assert (
            found[("mop_connections_closed_total", (("protocol", "mqtt"), ("reason", reason)))] == 0
        )
    for reason in Refusal:
        labels = (("protocol", "mqtt"), ("reason", str(reason)))
        assert found[("mop_connections_rejected_total", labels)] == 0
    for reason in Drop:
        assert found[("mop_messages_dropped_total", (("reason", str(reason)),))] == 0
